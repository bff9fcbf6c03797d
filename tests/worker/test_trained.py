"""The trained model (the `smollm2` preset: SmolLM2-135M-Instruct from its Q4_1 GGUF, served on
its quantized blocks as the worker does by default) against transformers on the same
dequantized weights: real chat prompts through the model's own chat
template, greedy tokens compared token for token. Trained weights leave few near-ties, so a
parting is allowed only where the top-2 margin is under 1e-4, and at most once."""
from __future__ import annotations

import pytest
import torch

from frontend.http.chat import ChatTemplate
from frontend.tokenizer import Tokenizer
from worker.load import resolve_checkpoint

from tests.gguf_files import registry_tokenizer
from tests.worker.test_worker_engine import GREEDY, run_engine, stock_greedy, stock_greedy_batch

QUESTIONS = (
    "What is the capital of France?",
    "Explain photosynthesis in two sentences.",
    "Give me three tips for sleeping better.",
    "What is 12 times 13?",
    "Write a haiku about the sea.",
    "Who wrote Romeo and Juliet?",
    "How do I boil an egg?",
    "What does a CPU do?",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Name the planets of the solar system.",
    "What is the difference between weather and climate?",
    "Suggest a name for a friendly cat.",
    "How many legs does a spider have?",
    "What is Python used for?",
    "Summarize the story of Cinderella in one sentence.",
)
NEW_TOKENS = 32
MARGIN = 1e-4


@pytest.fixture(scope="module")
def checkpoint():
    return resolve_checkpoint("smollm2")[0]


@pytest.fixture(scope="module")
def reference_tokenizer():
    """transformers' own reading of the GGUF file's tokenizer and chat template."""
    return registry_tokenizer()


def test_the_registry_file_is_served_on_its_own_blocks(trained_runner):
    """The default: the Q4_1 file's 210 layers on their blocks, and its Q8_0 token embedding
    as both the embedding and the (tied) output head; the graph recorded over them."""
    from worker.linear.quant_module import QuantEmbedding, QuantLinear
    q = trained_runner.info.quantization
    assert q["mode"] == "gguf"
    assert sorted(set(q["layers"].values())) == ["Q4_1", "Q8_0"]
    assert [n for n, t in q["layers"].items() if t == "Q8_0"] == ["model.embed_tokens", "lm_head"]
    assert sum(isinstance(m, QuantLinear) for m in trained_runner.model.modules()) == 211
    assert isinstance(trained_runner.model.get_input_embeddings(), QuantEmbedding)
    assert trained_runner.graph is not None and trained_runner.info.batch_invariant


def messages(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def test_the_chat_template_renders_as_transformers_does(checkpoint, reference_tokenizer):
    ours = ChatTemplate.load(str(checkpoint))
    assert not ours.builtin
    tok = Tokenizer.load(str(checkpoint))
    for q in QUESTIONS:
        text = ours.render(messages(q))
        assert text == reference_tokenizer.apply_chat_template(
            messages(q), tokenize=False, add_generation_prompt=True)
        want = reference_tokenizer.apply_chat_template(messages(q), add_generation_prompt=True)
        want = want["input_ids"] if hasattr(want, "keys") else want
        assert tok.encode(text, add_special_tokens=False) == list(want)


@pytest.mark.slow  # 16 chat prompts through transformers generate: ~45 s on 2 cores
def test_greedy_tokens_equal_transformers_generate(trained_runner, trained_stock,
                                                   reference_tokenizer):
    prompts = [_ids(reference_tokenizer, q) for q in QUESTIONS]
    ours, _ = run_engine(trained_runner, [(p, NEW_TOKENS, GREEDY) for p in prompts],
                         max_chunk=64)
    partings = []
    alone = [stock_greedy(trained_stock, p, NEW_TOKENS) for p in prompts]
    for q, p, got, want in zip(QUESTIONS, prompts, ours, alone):
        if got != want:
            at = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
            partings.append((q, at, _margin(trained_stock, p + want[:at])))
    assert all(m < MARGIN for _, _, m in partings) and len(partings) <= 1, (
        "request, position, top-2 margin where the engine parts from transformers: "
        f"{partings}")
    # the batched reference that the K-quant files' tests use is this one, token for token
    assert stock_greedy_batch(trained_stock, prompts, NEW_TOKENS) == alone


def _ids(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template(messages(question), add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _margin(model, ids: list[int]) -> float:
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -1]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def test_prompt_logprobs_equal_transformers_log_softmax(trained_runner, trained_stock,
                                                       reference_tokenizer):
    """Chat prompts and a plain passage, batched, in 32-token chunks: each prompt token's
    logprob, its rank and the top 3 within 1e-4 of transformers' log_softmax."""
    from tests.worker.test_prompt_logprobs import check_against, collect, engine
    passage = reference_tokenizer("The river rose slowly through the night, and by morning "
                                  "the old stone bridge stood in a wide brown lake.")["input_ids"]
    prompts = [_ids(reference_tokenizer, q) for q in QUESTIONS[:3]] + [list(passage)]
    got = collect(engine(trained_runner, max_chunk=32), [(p, 1) for p in prompts])
    for p, g in zip(prompts, got):
        check_against(trained_stock, p, g)
