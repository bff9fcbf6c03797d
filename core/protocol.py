"""The pinned import path of every message type (docs/design/interfaces.md, "Pinned
interfaces"): the messages live in core/ipc/protocol.py, the wire layer
every process shares, and this name stays for the users and checks that import it."""
from core.ipc.protocol import *  # noqa: F401,F403
