"""--allowed-origins: the browser origins CORS allows (cors.py), parsed without aiohttp so
that scripts/serve can check the flag before it starts anything."""
from __future__ import annotations

import re

ANY = "*"
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s,]+")


def parse_origins(text: str | None) -> frozenset[str]:
    """"https://a.example,https://b.example" (or "*": any origin) as a set; a trailing
    slash is dropped, as browsers send none. ValueError for an origin that is not
    scheme://host[:port]."""
    origins = frozenset(o.strip().rstrip("/") for o in (text or "").split(",") if o.strip())
    for o in origins:
        if o != ANY and not _ORIGIN.fullmatch(o):
            raise ValueError(f"--allowed-origins: {o[:80]!r} is not an origin "
                             "(scheme://host[:port]) or *")
    return origins


def allows(origins: frozenset[str], origin: str | None) -> bool:
    """Whether a request's Origin header is one of `origins`."""
    return origin is not None and (ANY in origins or origin in origins)
