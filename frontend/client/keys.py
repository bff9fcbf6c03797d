"""CURVE keys for Client and AsyncClient (docs/security.md, "CurveZMQ").

`server_key`: the frontend's public key: z85 text (40 characters, str or bytes) or the path
of its key file (DIR/server.key). `client_key`: this client's key pair: the path of its
secret key file (DIR/clients/NAME.key_secret, which holds both keys), or a (public, secret)
pair of z85 texts. Both or neither: without them the client speaks plain ZeroMQ, which a
frontend started with --curve refuses.
"""
from __future__ import annotations

import os

import zmq
from zmq.auth import load_certificate

Key = str | bytes | os.PathLike


def _file(key) -> str | None:
    """`key` as a key file's path, or None where it is not one."""
    if isinstance(key, os.PathLike) or (isinstance(key, str) and os.path.isfile(key)):
        return os.fspath(key)
    return None


def _z85(key, what: str) -> bytes:
    raw = key.encode() if isinstance(key, str) else key
    if not isinstance(raw, bytes) or len(raw) != 40:
        raise ValueError(f"{what} must be 40 characters of z85 or a key file's path")
    return raw


def server_public(key: Key) -> bytes:
    path = _file(key)
    return load_certificate(path)[0] if path else _z85(key, "server_key")


def client_pair(key) -> tuple[bytes, bytes]:
    path = _file(key)
    if path:
        public, secret = load_certificate(path)
        if secret is None:
            raise ValueError(f"client_key {path} holds no secret key (give NAME.key_secret)")
        return public, secret
    if isinstance(key, (tuple, list)) and len(key) == 2:
        return _z85(key[0], "client_key's public key"), _z85(key[1], "client_key's secret key")
    raise ValueError("client_key must be a key_secret file's path or a (public, secret) pair")


def curve_options(server_key: Key | None, client_key) -> dict[int, bytes]:
    """The socket options of a CURVE client; {} when neither key is given."""
    if server_key is None and client_key is None:
        return {}
    if server_key is None or client_key is None:
        raise ValueError("give both server_key and client_key, or neither")
    public, secret = client_pair(client_key)
    return {zmq.CURVE_SERVERKEY: server_public(server_key), zmq.CURVE_PUBLICKEY: public,
            zmq.CURVE_SECRETKEY: secret}
