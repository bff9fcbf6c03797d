"""aiohttp's log of requests it cannot parse, as one line that repeats nothing they sent.

aiohttp logs a request line or header it refuses (an `Authorization` header over its 8,190
bytes, say) at ERROR with a traceback whose message quotes the first 100 bytes of the
value: an API key in the log. `install` puts a filter on its logger that turns such a
record into one WARNING naming the error's class and status only.
"""
from __future__ import annotations

import logging

LOGGER = "aiohttp.server"


class ParseErrorFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = "refused a request it could not parse: %s (%s)"
            record.args = (type(exc).__name__, exc.code)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def install() -> None:
    """Once per process (the gateway's main)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, ParseErrorFilter) for f in logger.filters):
        logger.addFilter(ParseErrorFilter())
