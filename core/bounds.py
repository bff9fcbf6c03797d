"""Every bound a request's values must keep, said once: the frontend's checks
(frontend/validate.py), the gateway's (frontend/http/schema.py), the engine's last check
(core/engine.py, check_ranges), the scheduler's types and replay's check of a log
(replay/bounds.py, replay/rows.py) all import them from here, so they answer alike.

Every bound keeps a value inside the wire type that carries it further (int32 arrays for
top_k, int64 for seeds and the step log's integers) and inside what sampling can use;
the model's own bounds (max_model_len, vocab_size) come from its ModelInfo. Import-light:
the scheduler and the frontend (which runs without torch) import it.
"""
from __future__ import annotations

# Priorities are accepted in [-MAX_PRIORITY, MAX_PRIORITY]: by the scheduler, and before it
# by the frontend and the gateway.
MAX_PRIORITY = 1000
# A request's cache_salt: the frontend sends a 16-character digest of it; a client's raw
# salt is held to the same bound (frontend/validate.py).
MAX_CACHE_SALT_CHARS = 256
# The most drafts a request gets in one step (scripts/serve --num-draft).
MAX_NUM_DRAFT = 16

INT32_MAX = 2 ** 31 - 1          # top_k travels as int32 (core/batch.py)
SEED_LIMIT = 2 ** 63             # seeds travel as int64; [0, 2**63)
SEED_MASK = SEED_LIMIT - 1      # a derived seed is a hash masked into that range
# Below MIN_TEMPERATURE, float32 logits / temperature can overflow to inf and sampling
# returns garbage instead of the greedy token; above MAX_TEMPERATURE sampling is uniform
# for any realistic logits, so larger values mean nothing more.
MIN_TEMPERATURE = 1e-6
MAX_TEMPERATURE = 1e4
# Stop matching costs O(sum of stop lengths + stops x new text) per step (frontend/stops.py);
# these bound it per request.
MAX_STOPS = 16
MAX_STOP_CHARS = 256
# A request_id comes back in every delta: a long one multiplies every reply's size.
MAX_REQUEST_ID_CHARS = 256
# OpenAI's bounds for logprobs (top alternatives per token) and the two OpenAI penalties;
# repetition_penalty divides positive logits, so it must be positive (1 = off).
MAX_LOGPROBS = 20
MAX_PENALTY = 2.0
MAX_REPETITION_PENALTY = 10.0
MAX_STOP_TOKEN_IDS = 64
MAX_USER_CHARS = 256
# An API key's short hash (frontend/http/identity.py writes 12); lower-case hex.
MAX_KEY_HASH_CHARS = 64
# A structured-output field (response_format, structured_outputs) is JSON: walked, dumped
# and compiled recursively, so its nesting is bounded well under Python's recursion limit.
MAX_JSON_DEPTH = 64
