"""The outside eval and load tools run against the gateway
(tests/scripts/test_eval_tools.py, slow): lm-evaluation-harness (`lmeval.py`, over the
project's tasks in tasks/) and guidellm (`guidellm.py`), each installed on first use into
a venv of its own (`toolenv.py`); and the client libraries apps call it with
(langchain-openai, litellm: `clients/`, tests/clients/, slow)."""
