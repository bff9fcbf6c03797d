"""The OpenAI-compatible HTTP gateway, a client of the frontend: `python -m frontend.http`
(server.py); routes in app.py, request parsing in schema.py and jsonbody.py, replies in
format.py and generate.py, the chat template in chat.py, /metrics in metrics.py, the engine
clients and the per-user cap in pool.py."""
