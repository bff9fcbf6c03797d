"""The client library: `Client` (blocking, blocking.py), `AsyncClient` (asyncio, aio.py) and
what they share (common.py). Imports only the standard library, zmq, msgpack and
core.ipc.protocol; `AsyncClient` is loaded on first use, so a blocking client never
imports zmq.asyncio."""
from frontend.client.blocking import Client
from frontend.client.common import ClientError, Result

__all__ = ["AsyncClient", "Client", "ClientError", "Result"]


def __getattr__(name: str):
    if name == "AsyncClient":
        from frontend.client.aio import AsyncClient
        return AsyncClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
