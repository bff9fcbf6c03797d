"""The frontend's digest of a request's salts (frontend/cache_salt.py, docs/security.md
"Prefix cache isolation"): which requests get equal digests under each scope."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from core.ipc.protocol import Generate
from frontend.cache_salt import DIGEST_CHARS, SCOPES, salt_digest


def msg(cache_salt=None, user=None, key_hash=None) -> SimpleNamespace:
    """A Generate's salt fields; key_hash is the gateway's (absent from a plain Generate)."""
    return SimpleNamespace(cache_salt=cache_salt, user=user, key_hash=key_hash)


@pytest.mark.parametrize("scope", SCOPES)
def test_no_salt_is_unsalted_in_every_scope(scope):
    assert salt_digest(msg(), scope) is None
    assert salt_digest(Generate("r", "p"), scope) is None


def test_global_ignores_user_and_key():
    assert salt_digest(msg(user="u", key_hash="k"), "global") is None
    assert salt_digest(msg("s", user="u"), "global") == salt_digest(msg("s"), "global")


@pytest.mark.parametrize("scope, field", [("user", "user"), ("key", "key_hash")])
def test_the_scope_salts_by_its_field(scope, field):
    a, b = (salt_digest(msg(**{field: v}), scope) for v in ("alice", "mallory"))
    assert a is not None and b is not None and a != b
    assert salt_digest(msg(**{field: "alice"}), scope) == a   # deterministic
    assert salt_digest(msg("s", **{field: "alice"}), scope) not in (a, b, salt_digest(msg("s"), scope))


def test_a_digest_is_short_hex_and_names_its_parts():
    d = salt_digest(msg("secret"), "global")
    assert len(d) == DIGEST_CHARS and int(d, 16) >= 0 and "secret" not in d
    # the same text as a salt, as a user, or split differently gives different digests
    assert len({salt_digest(msg("alice"), "user"), salt_digest(msg(user="alice"), "user"),
                salt_digest(msg("al", user="ice"), "user"),
                salt_digest(msg("ali", user="ce"), "user")}) == 4


def test_a_generate_without_key_hash_is_unsalted_under_key():
    assert salt_digest(Generate("r", "p", user="u"), "key") is None
