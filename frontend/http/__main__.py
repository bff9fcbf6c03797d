"""`python -m frontend.http`: run the gateway (frontend/http/server.py)."""
import sys

from frontend.http.server import main

sys.exit(main())
