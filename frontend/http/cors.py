"""CORS for the origins the operator allows (--allowed-origins; none by default), so that a
browser app on another origin can call the API.

A request whose `Origin` is allowed gets `Access-Control-Allow-Origin` (that origin) on its
response, whatever the response (errors and streams too: the headers are added as the
response is prepared). A preflight (`OPTIONS` with `Access-Control-Request-Method`) from an
allowed origin is answered 204 here, before the API-key check (a browser sends no
Authorization on a preflight). Any other origin gets no CORS header and its preflight the
405 it got before, so the browser refuses it.
"""
from __future__ import annotations

import re

from aiohttp import web

from frontend.http.origins import allows

METHODS = "GET, POST, OPTIONS"
# asked for headers are echoed when they are a plain list of header names
DEFAULT_HEADERS = "Authorization, Content-Type, X-TL-Priority"
_HEADER_LIST = re.compile(r"[A-Za-z0-9_-]+(\s*,\s*[A-Za-z0-9_-]+)*")
MAX_HEADER_LIST = 2048
MAX_AGE_S = 600
EXPOSED = "Retry-After, WWW-Authenticate"

ORIGINS = web.AppKey("allowed_origins", frozenset)


def install(app: web.Application, origins: frozenset[str]) -> None:
    if origins:
        app[ORIGINS] = origins
        app.on_response_prepare.append(_add_headers)


def allowed_origin(request: web.Request) -> str | None:
    """The request's Origin when the operator allows it."""
    origin = request.headers.get("Origin")
    return origin if allows(request.app.get(ORIGINS, frozenset()), origin) else None


@web.middleware
async def preflight(request: web.Request, handler):
    if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
        return await handler(request)
    origin = allowed_origin(request)
    if origin is None:
        return await handler(request)   # the router's 405, without CORS headers
    asked = request.headers.get("Access-Control-Request-Headers", "").strip()
    plain = len(asked) <= MAX_HEADER_LIST and _HEADER_LIST.fullmatch(asked)
    return web.Response(status=204, headers={
        "Access-Control-Allow-Methods": METHODS,
        "Access-Control-Allow-Headers": asked if plain else DEFAULT_HEADERS,
        "Access-Control-Max-Age": str(MAX_AGE_S)})


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    origin = allowed_origin(request)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSED
        response.headers.add("Vary", "Origin")
