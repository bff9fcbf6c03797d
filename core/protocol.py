"""Re-export of core.ipc.protocol, the path this module had before the wire layer moved."""
from core.ipc.protocol import *  # noqa: F401,F403
