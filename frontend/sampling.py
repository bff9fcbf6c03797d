"""A Generate's sampling as the core takes it (SamplingParams), and the seed a sampled
request is given when it may have to run again on another replica."""
from __future__ import annotations

import hashlib

from core.ipc.protocol import Generate, SamplingParams
from core.bounds import SEED_LIMIT


def failover_seed(msg: Generate, ident: bytes) -> int | None:
    """With several replicas, a sampled request without a seed gets one here, from its
    client and request id: if its replica dies, the re-run on another draws the same tokens,
    so the stream the client already has goes on coherently (a core would derive a seed from
    its own request id, which differs between replicas)."""
    if msg.temperature == 0 or msg.seed is not None:
        return None
    h = hashlib.blake2b(ident + msg.request_id.encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") % SEED_LIMIT


def sampling_of(msg: Generate, seed: int | None = None) -> SamplingParams:
    """The request's sampling (its constraint checked by check_params already); `seed`
    stands in for a missing one."""
    from frontend.structured import constraint_of
    return SamplingParams(msg.temperature, msg.top_p, msg.top_k,
                          msg.seed if msg.seed is not None else seed, msg.min_p,
                          msg.presence_penalty, msg.frequency_penalty, msg.repetition_penalty,
                          msg.min_tokens, msg.stop_token_ids, msg.logprobs,
                          msg.prompt_logprobs,
                          constraint_of(msg.response_format, msg.structured_outputs),
                          speculative=msg.speculative)
