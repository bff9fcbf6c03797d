"""The API key check: an aiohttp middleware in front of every route (docs/security.md,
"API keys").

With keys configured, a request needs `Authorization: Bearer KEY` with one of them; a
missing, malformed or wrong one is a 401 in OpenAI's shape (code "invalid_api_key") with
`WWW-Authenticate: Bearer`, whatever the path, so that an unknown route tells a stranger
nothing either. /health and /metrics stay open unless --protect-metrics. The admitted
key's short hash is stored in the request (identity.py): the per-user bounds count per
key and the step log records it.
"""
from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from frontend.http.api_keys import ApiKeys, short_hash
from frontend.http.errors import ApiError
from frontend.http.identity import KEY_HASH

OPEN_PATHS = frozenset({"/health", "/metrics"})
_SCHEME = "bearer"   # RFC 7235: the scheme is case-insensitive
INVALID_KEY = "invalid_api_key"


@dataclass(frozen=True)
class Guard:
    keys: ApiKeys
    protect_metrics: bool = False

    def needs_key(self, path: str) -> bool:
        return bool(self.keys) and (self.protect_metrics or path not in OPEN_PATHS)


GUARD = web.AppKey("guard", Guard)


def presented_key(header: str | None) -> str:
    """The key of an `Authorization: Bearer KEY` header; ApiError 401 when there is none."""
    if header is None:
        raise refusal("no API key: send the header `Authorization: Bearer KEY`")
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() != _SCHEME or not key.strip():
        raise refusal("the Authorization header must be `Bearer KEY`")
    return key.strip()


def refusal(message: str) -> ApiError:
    return ApiError(401, message, code=INVALID_KEY)


@web.middleware
async def require_key(request: web.Request, handler):
    guard = request.app.get(GUARD)
    if guard is None or not guard.needs_key(request.path):
        return await handler(request)
    key = presented_key(request.headers.get("Authorization"))
    if not guard.keys.admits(key):
        raise refusal("incorrect API key provided")
    request[KEY_HASH] = short_hash(key)
    return await handler(request)
