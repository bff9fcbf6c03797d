"""Pull a request_id out of a frame the decoder refused, so its error reply can name it."""
from __future__ import annotations

import msgpack


def peek_request_id(frame: bytes) -> str | None:
    """The frame's top-level "request_id" string, or None; never raises.

    Walks the map with a streaming unpacker and skips other values unread into Python
    objects, so a 3 MB prompt costs a scan, not a list of a million ints.
    """
    if not frame:
        return None
    try:
        up = msgpack.Unpacker(raw=False, max_buffer_size=len(frame))
        up.feed(frame)
        for _ in range(up.read_map_header()):
            key = up.unpack()
            if key == "request_id":
                value = up.unpack()
                return value if isinstance(value, str) else None
            up.skip()
    except Exception:  # any malformation just means "unknown"
        return None
    return None
