"""`python -m frontend.http`: run the gateway (frontend/http/server.py)."""
from core.ipc.lifeline import exit_now
from frontend.http.server import main

exit_now(main())
