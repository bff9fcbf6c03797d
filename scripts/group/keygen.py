"""scripts/serve keygen DIR: write CURVE keys for --curve DIR (docs/security.md, "CurveZMQ").

DIR/server.key and server.key_secret (the frontend's pair, also the operator's), a key pair
per client under DIR/clients/ and per joining replica under DIR/replicas/; each secret file
is mode 0600. An existing key is never overwritten: run it again with new names to add
clients (the server's pair is then kept).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from core.ipc.curve import CLIENTS, PUBLIC, REPLICAS, SECRET, SERVER, write_pair

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/serve keygen", description=__doc__.split("\n")[0])
    p.add_argument("dir", help="the key directory (made if missing)")
    p.add_argument("--clients", type=int, default=1,
                   help="client key pairs named client0, client1, ... (default 1)")
    p.add_argument("--client", action="append", default=[], metavar="NAME",
                   help="a client key pair of this name, instead of --clients (repeatable)")
    p.add_argument("--replicas", type=int, default=1,
                   help="key pairs for replicas that join (serve --join --curve DIR)")
    a = p.parse_args(argv)
    if a.clients < 0 or a.replicas < 0:
        p.error("--clients and --replicas must be >= 0")
    bad = [n for n in a.client if not NAME.fullmatch(n)]
    if bad:
        p.error(f"a client's name is letters, digits, '_', '.' and '-': not {bad[0]!r}")
    return a


def plan(a: argparse.Namespace) -> list[tuple[str, str]]:
    """(folder, name) of every key pair to write; folder "" is DIR itself."""
    clients = a.client or [f"client{k}" for k in range(a.clients)]
    return ([("", SERVER)] + [(CLIENTS, n) for n in clients]
            + [(REPLICAS, f"replica{k}") for k in range(a.replicas)])


def main(argv=None) -> int:
    a = parse(argv)
    root = Path(a.dir)
    for folder, name in plan(a):
        where = root / folder
        if (where / (name + SECRET)).exists():
            if folder:
                print(f"keygen: {where / name}{SECRET} exists: keeping it", file=sys.stderr)
            continue
        write_pair(where, name)
        print(f"{where / name}{PUBLIC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
