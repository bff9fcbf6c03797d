"""The gateway's API keys: where they come from (--api-key, TL_API_KEY, --api-key-file) and
whether a presented one is among them (docs/security.md, "API keys").

No aiohttp here: scripts/serve reads the keys with these functions too, before any process
starts, and hands them to the gateway in its environment (never on a command line, which
`ps` shows to every user of the machine).

A key is never printed: a refusal names the flag, the variable or the file's line instead.
"""
from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

ENV = "TL_API_KEY"   # one key, or several one per line (how serve passes them on)
MAX_KEY_CHARS = 1024
# RFC 6750's token: what a `Bearer` credential may hold, so every key can be sent
_KEY = re.compile(rf"[A-Za-z0-9\-._~+/]+=*")
SHORT_HASH_CHARS = 12


class KeyProblem(ValueError):
    """The keys cannot be read: the gateway (or serve) refuses to start with this reason."""


@dataclass(frozen=True)
class ApiKeys:
    """The keys' SHA-256 digests: each presented key is hashed to the same length, so that
    comparing it reveals neither a key's length nor how much of it matched."""
    digests: tuple[bytes, ...]

    def __bool__(self) -> bool:
        return bool(self.digests)

    def admits(self, presented: str) -> bool:
        given = _digest(presented)
        found = False
        for d in self.digests:   # every key, no early exit: the time is the same for all
            found |= hmac.compare_digest(d, given)
        return found


def short_hash(key: str) -> str:
    """The key's name in the step log and the per-user bounds: 12 hex digits of SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:SHORT_HASH_CHARS]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def check_key(key: str, where: str) -> str:
    if len(key) > MAX_KEY_CHARS or not _KEY.fullmatch(key):
        raise KeyProblem(f"{where} is not a usable API key (1 to {MAX_KEY_CHARS} characters"
                         " of letters, digits and -._~+/, then any '=')")
    return key


def file_keys(path: str) -> list[str]:
    """One key per line; blank lines and lines starting with # are skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise KeyProblem(f"cannot read --api-key-file {path}: "
                         f"{getattr(e, 'strerror', None) or type(e).__name__}") from None
    keys = [check_key(line.strip(), f"line {n} of {path}")
            for n, line in enumerate(lines, 1)
            if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise KeyProblem(f"--api-key-file {path} holds no key")
    return keys


def env_keys(value: str | None) -> list[str]:
    """TL_API_KEY's keys; unset or blank: none."""
    return [check_key(line.strip(), f"line {n} of ${ENV}")
            for n, line in enumerate((value or "").splitlines(), 1) if line.strip()]


def collect(flags: list[str] | None, env: str | None, path: str | None,
            protect_metrics: bool = False) -> list[str]:
    """Every configured key, deduplicated, in the order given; raises KeyProblem."""
    keys = [check_key(k, f"--api-key number {n}") for n, k in enumerate(flags or (), 1)]
    keys += env_keys(env)
    if path is not None:
        keys += file_keys(path)
    if protect_metrics and not keys:
        raise KeyProblem("--protect-metrics needs an API key")
    return list(dict.fromkeys(keys))


def api_keys(keys: list[str]) -> ApiKeys:
    return ApiKeys(tuple(_digest(k) for k in keys))


def add_key_args(group) -> None:
    """The flags, for the gateway's parser and serve's "security" group alike."""
    group.add_argument("--api-key", action="append", default=None, metavar="KEY",
                       help="a key clients must send as `Authorization: Bearer KEY` (repeatable;"
                            f" ${ENV} and --api-key-file add more; a flag shows in `ps`, the"
                            " other two do not)")
    group.add_argument("--api-key-file", default=None, metavar="PATH",
                       help="API keys, one per line (blank lines and # lines skipped)")
    group.add_argument("--protect-metrics", action="store_true",
                       help="/health and /metrics need an API key too")
