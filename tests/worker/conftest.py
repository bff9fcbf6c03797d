"""The trained model's worker and transformers' reading of the same file, made once for the
session: test_trained.py and test_embeddings.py both compare against them (each takes ~6 s to
load; the runner's sequences are freed by each test's engine)."""
from __future__ import annotations

import pytest

from tests.gguf_files import registry_model
from worker.load import make_runner


@pytest.fixture(scope="session")
def trained_runner():
    """The engine's worker as served: the batch-invariant mode where the model allows it."""
    return make_runner("smollm2", num_blocks=256, batch_invariant=None)


@pytest.fixture(scope="session")
def trained_stock():
    """transformers' own reading of the GGUF file (the cached directory holds no weights)."""
    return registry_model()
