"""The frontend's digest of a request's salts (frontend/cache_salt.py, docs/security.md
"Prefix cache isolation"): which requests get equal digests under each scope."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from core.ipc.protocol import Generate
from frontend.cache_salt import DIGEST_CHARS, SCOPES, salt_digest


def msg(cache_salt=None, user=None) -> SimpleNamespace:
    """A Generate's salt fields (the identity is salt_digest's own argument)."""
    return SimpleNamespace(cache_salt=cache_salt, user=user)


@pytest.mark.parametrize("scope", SCOPES)
def test_no_salt_is_unsalted_in_every_scope(scope):
    assert salt_digest(msg(), scope, None) is None
    assert salt_digest(Generate("r", "p"), scope, None) is None


def test_global_ignores_user_and_identity():
    assert salt_digest(msg(user="u"), "global", "key:abc") is None
    assert salt_digest(msg("s", user="u"), "global", "key:a") == salt_digest(msg("s"), "global", None)


def test_key_salts_by_the_identity_alone():
    a, b = (salt_digest(msg(user="same"), "key", who) for who in ("key:a1", "key:b2"))
    assert a is not None and b is not None and a != b
    assert salt_digest(msg(user="other"), "key", "key:a1") == a   # user plays no part
    assert salt_digest(msg("s"), "key", "key:a1") not in (a, b, salt_digest(msg("s"), "key", None))


def test_user_subdivides_the_identity():
    """Two keys that send the same `user` never share; one key's users are apart too."""
    alice_a = salt_digest(msg(user="alice"), "user", "key:a1")
    assert alice_a != salt_digest(msg(user="alice"), "user", "key:b2")
    assert alice_a != salt_digest(msg(user="bob"), "user", "key:a1")
    assert alice_a != salt_digest(msg(user="alice"), "user", None)
    assert alice_a == salt_digest(msg(user="alice"), "user", "key:a1")   # deterministic
    assert salt_digest(msg(), "user", "key:a1") != salt_digest(msg(), "user", "key:b2")
    # anonymous callers: the user field alone, as nothing proves who they are
    assert salt_digest(msg(user="alice"), "user", None) != salt_digest(msg(user="bob"), "user", None)


def test_a_digest_is_short_hex_and_names_its_parts():
    d = salt_digest(msg("secret"), "global", None)
    assert len(d) == DIGEST_CHARS and int(d, 16) >= 0 and "secret" not in d
    # the same text as a salt, as a user, as an identity, or split differently differs
    assert len({salt_digest(msg("alice"), "user", None),
                salt_digest(msg(user="alice"), "user", None),
                salt_digest(msg(), "user", "alice"),
                salt_digest(msg("al", user="ice"), "user", None),
                salt_digest(msg("ali", user="ce"), "user", None)}) == 5


def test_an_anonymous_generate_is_unsalted_under_key():
    assert salt_digest(Generate("r", "p", user="u"), "key", None) is None
