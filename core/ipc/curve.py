"""CurveZMQ keys: the key directory's layout, writing it (scripts/serve keygen) and the
socket options of a CURVE server and client (docs/security.md, "CurveZMQ").

The layout of a key directory DIR:

    DIR/server.key              the frontend's public key (give it to every client)
    DIR/server.key_secret       its key pair, mode 0600: the frontend's, and the operator's
    DIR/clients/NAME.key        a client's public key: listed, so admitted on --address
    DIR/clients/NAME.key_secret that client's key pair, mode 0600 (give it to that client)
    DIR/replicas/NAME.key       a replica's public key: admitted on --replica-address
    DIR/replicas/NAME.key_secret

Files are zmq.auth's certificate format (zmq.auth.load_certificate reads them). The
server's own key pair is admitted on both endpoints and is the operator's: only a peer
presenting it may call stats() (frontend/operator.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth import load_certificate

from core.ipc.channel import is_loopback

SERVER = "server"
CLIENTS, REPLICAS = "clients", "replicas"
PUBLIC, SECRET = ".key", ".key_secret"
# ZAP domains: which list of public keys a handshake is checked against (frontend/zap.py)
CLIENT_DOMAIN, REPLICA_DOMAIN = "tl-clients", "tl-replicas"
OPERATOR = "operator"   # the ZAP User-Id of a peer presenting the server's own key


class CurveKeyError(ValueError):
    """A key directory or key file that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class KeyPair:
    public: bytes   # z85, 40 bytes
    secret: bytes


@dataclass(frozen=True)
class CurveDir:
    """What a frontend needs: its key pair and the public keys admitted per domain."""
    server: KeyPair
    clients: dict[bytes, str]    # public key -> the name its file gives it
    replicas: dict[bytes, str]

    def admitted(self, domain: str) -> dict[bytes, str]:
        listed = self.clients if domain == CLIENT_DOMAIN else self.replicas
        return {**listed, self.server.public: OPERATOR}


def read_pair(path: Path) -> KeyPair:
    try:
        public, secret = load_certificate(path)
    except (OSError, ValueError) as e:
        raise CurveKeyError(f"cannot read the key file {path}: {e}") from None
    if secret is None or len(public) != 40 or len(secret) != 40:
        raise CurveKeyError(f"{path} holds no CURVE key pair (scripts/serve keygen writes one)")
    return KeyPair(public, secret)


def read_public(path: Path) -> bytes:
    try:
        public, _ = load_certificate(path)
    except (OSError, ValueError) as e:
        raise CurveKeyError(f"cannot read the key file {path}: {e}") from None
    if len(public) != 40:
        raise CurveKeyError(f"{path} holds no CURVE public key")
    return public


def _listed(folder: Path) -> dict[bytes, str]:
    if not folder.is_dir():
        return {}
    # "clients/NAME": no listed name can be OPERATOR's
    return {read_public(p): f"{folder.name}/{p.name[:-len(PUBLIC)]}"
            for p in sorted(folder.glob("*" + PUBLIC))}


def load_server(root: str | os.PathLike) -> CurveDir:
    """The frontend's view of DIR: its key pair and every listed public key."""
    d = Path(root)
    return CurveDir(read_pair(d / (SERVER + SECRET)), _listed(d / CLIENTS),
                    _listed(d / REPLICAS))


def load_peer(root: str | os.PathLike, folder: str | None) -> tuple[bytes, KeyPair]:
    """(the server's public key, the key pair to present) for a peer of the frontend: the
    first pair under DIR/`folder` (sorted by name), or with `folder` None the server's own
    pair (the operator's: the gateway runs beside the frontend)."""
    d = Path(root)
    server = read_public(d / (SERVER + PUBLIC))
    if folder is None:
        return server, read_pair(d / (SERVER + SECRET))
    pairs = sorted((d / folder).glob("*" + SECRET))
    if not pairs:
        raise CurveKeyError(f"{d / folder} holds no key pair (scripts/serve keygen writes them)")
    return server, read_pair(pairs[0])


def bind_problem(address: str, *, allow_remote: bool, curve: bool,
                 insecure_remote: bool) -> str | None:
    """Why a ZeroMQ endpoint may not be bound (None: it may): a non-loopback one needs
    --allow-remote, and CURVE or an explicit --insecure-remote."""
    if is_loopback(address):
        return None
    if not allow_remote:
        return f"{address} is not a loopback address; pass --allow-remote to bind it"
    if not (curve or insecure_remote):
        return (f"{address} is not a loopback address: pass --curve DIR (scripts/serve keygen)"
                " so that only listed keys may talk to it, or --insecure-remote to serve"
                " anyone who reaches it")
    return None


def server_options(secret: bytes, domain: str) -> dict[int, bytes | int]:
    """A bound socket as a CURVE server whose handshakes go to the ZAP handler of `domain`."""
    return {zmq.CURVE_SERVER: 1, zmq.CURVE_SECRETKEY: secret,
            zmq.ZAP_DOMAIN: domain.encode()}


def client_options(server_public: bytes, pair: KeyPair) -> dict[int, bytes]:
    return {zmq.CURVE_SERVERKEY: server_public, zmq.CURVE_PUBLICKEY: pair.public,
            zmq.CURVE_SECRETKEY: pair.secret}


def write_pair(folder: Path, name: str) -> KeyPair:
    """NAME.key (public) and NAME.key_secret (mode 0600 from its creation) in `folder`."""
    public, secret = zmq.curve_keypair()
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / (name + PUBLIC), 0o644, public, None)
    _write(folder / (name + SECRET), 0o600, public, secret)
    return KeyPair(public, secret)


def _write(path: Path, mode: int, public: bytes, secret: bytes | None) -> None:
    text = ("#   ZeroMQ CURVE certificate written by scripts/serve keygen\n"
            + ("#   SECRET: do not give this file to anyone else\n" if secret else "")
            + "metadata\ncurve\n" + f'    public-key = "{public.decode()}"\n'
            + (f'    secret-key = "{secret.decode()}"\n' if secret else ""))
    # O_EXCL: keygen never overwrites a key; the mode holds from the file's first byte
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
