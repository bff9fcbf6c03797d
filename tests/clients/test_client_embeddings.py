"""Embeddings through the client libraries RAG stacks use, on the trained smollm2 (slow; the
libraries installed into their tool venvs, flows in scripts/evaltools/clients/).

- langchain-openai's `OpenAIEmbeddings(check_embedding_ctx_length=False)`: `embed_documents`
  on three texts (the first and last the same) and `embed_query` on the first; the openai SDK
  under it asks for `encoding_format: base64` and decodes the vectors itself.
- litellm's `embedding` on the same list and on one string (floats).

Each checks the shape, not the values (tests of POST /v1/embeddings compare those with
transformers): one vector per input in order, 576 dimensions (smollm2's hidden size), unit
norm, and the same text gives the same vector, within a batch and across requests.
"""
from __future__ import annotations

import math

import pytest

from scripts.evaltools.toolenv import LANGCHAIN_OPENAI, LITELLM

from tests.clients.checks import flows

GROUP_ARGS = ["--model", "smollm2", "--http-port", "0"]   # test_trained_serving's group
pytestmark = pytest.mark.tool_venvs(LANGCHAIN_OPENAI, LITELLM)
HIDDEN = 576                                               # smollm2's hidden size
CLIENTS = {"langchain": (LANGCHAIN_OPENAI, "langchain_flows.py", "embeddings"),
           "litellm": (LITELLM, "litellm_flows.py", "embedding")}


def close(a: list[float], b: list[float], tol: float = 1e-5) -> bool:
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tol


@pytest.mark.slow
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_vectors_have_the_models_shape_and_repeat(group, client):
    tool, script, name = CLIENTS[client]
    out = flows(tool, script, group.http)(name)
    docs, query = out["documents"], out["query"]
    assert len(docs) == 3
    for v in (*docs, query):
        assert len(v) == HIDDEN
        assert abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4
    assert close(docs[0], docs[2]), "the same text in one batch"
    assert close(docs[0], query), "the same text in another request"
    assert not close(docs[0], docs[1], 1e-2), "two texts, two vectors"
