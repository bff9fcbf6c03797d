"""Each supported architecture family (worker/archs.py) served by the engine against
transformers' own greedy generate: text prompts through the checkpoint's tokenizer, several
prompts batched, chunked prefill so spans attend over a cached prefix. Sliding-window
families use a window far shorter than prompt + output, so an ignored window fails."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from worker import archs
from worker.load import make_runner

from tests.checkpoints import make_checkpoint
from tests.worker.test_worker_engine import GREEDY, run_engine, stock_greedy

PROMPTS = ("The quick brown fox jumps over the lazy dog, twice.",
           "Once upon a time",
           "def main():\n    return [x * x for x in range(10)]\n")
NEW_TOKENS = 24
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320}

# family -> (config, checkpoint options); what each one covers is in README's table
FAMILIES = {
    "llama": ({}, {"bos": True}),
    "mistral": ({"num_key_value_heads": 1, "sliding_window": 8}, {}),
    "qwen2": ({"use_sliding_window": True, "sliding_window": 12, "max_window_layers": 1},
              {"bias_std": 0.5}),
    "qwen3": ({"head_dim": 24, "use_sliding_window": True, "sliding_window": 10,
               "max_window_layers": 1}, {}),
    "gemma": ({"head_dim": 16, "num_key_value_heads": 1, "tie_word_embeddings": True},
              {"bos": True}),
    "gemma2": ({"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8,
                "attn_logit_softcapping": 5.0, "final_logit_softcapping": 30.0}, {}),
    "phi3": ({"sliding_window": 12, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}, {}),
    "olmo2": ({}, {"seed": 4}),  # seed 1 repeats a few tokens
    "granite": ({"embedding_multiplier": 4.0, "attention_multiplier": 0.1,
                 "residual_multiplier": 0.5, "logits_scaling": 2.0}, {}),
    "starcoder2": ({"sliding_window": 8}, {"bias_std": 0.5}),
    "gpt2": ({"n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 128,
              "scale_attn_by_inverse_layer_idx": True}, {"bias_std": 0.5}),
    "gpt_neox": ({"num_key_value_heads": None}, {"bias_std": 0.5}),
    "mixtral": ({"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8}, {}),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Models this small run several times faster on one thread than on two cores shared
    with other work (every op's thread barrier waits for a busy core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def family_dir(tmp_path_factory, family: str):
    config, options = FAMILIES[family]
    cfg = {"model_type": family, **({} if family == "gpt2" else SMALL), "vocab_size": 320,
           **config}
    return make_checkpoint(tmp_path_factory, family, options.get("seed", 1),
                           {k: v for k, v in cfg.items() if v is not None},
                           bias_std=options.get("bias_std", 0.0), bos=options.get("bos", False))


def switched_off(config: dict) -> list[dict]:
    """Overrides that turn off what the family's test must see applied."""
    out = []
    if config.get("sliding_window"):
        out.append({"sliding_window": 10**6})
    if config.get("attn_logit_softcapping"):
        out.append({"attn_logit_softcapping": None})
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_transformers_generate(family, tmp_path_factory):
    path = family_dir(tmp_path_factory, family)
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok(text).input_ids for text in PROMPTS]
    if FAMILIES[family][1].get("bos"):
        assert all(p[0] == tok.bos_token_id for p in prompts)
    runner = make_runner(str(path), num_blocks=64, block_size=8)
    got, _ = run_engine(runner, [(p, NEW_TOKENS, GREEDY) for p in prompts], max_chunk=16)
    attn = "eager" if family == "gemma2" else "sdpa"  # transformers' sdpa has no softcap
    stock = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn)
    want = [stock_greedy(stock, p, NEW_TOKENS) for p in prompts]
    assert got == want
    assert all(len(set(t)) > 5 for t in got)  # varied, or the comparison proves little
    for off in switched_off(FAMILIES[family][0]):
        other = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, **off)
        assert stock_greedy(other, prompts[0], NEW_TOKENS) != want[0], off


def test_unsupported_model_type_is_refused_at_load(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory, "gemma3", 1, {
        "model_type": "gemma3_text", **SMALL, "head_dim": 16})
    with pytest.raises(ValueError, match="model_type 'gemma3_text' is not supported"):
        make_runner(str(path), num_blocks=8)


def test_unsupported_feature_is_refused_at_load(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory, "llama_dyn", 1, {
        "model_type": "llama", **SMALL, "rope_parameters": {
            "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}})
    with pytest.raises(ValueError, match="rope_type 'dynamic'"):
        make_runner(str(path), num_blocks=8)


def test_unimplemented_attention_keyword_is_refused_at_load(tmp_path_factory, monkeypatch):
    """GPT-OSS passes attention sinks (s_aux): the load-time probe forward refuses them even
    if the model_type were listed."""
    path = make_checkpoint(tmp_path_factory, "gpt_oss", 1, {
        "model_type": "gpt_oss", **SMALL, "head_dim": 16, "num_local_experts": 4,
        "sliding_window": 8, "max_position_embeddings": 4096})
    monkeypatch.setattr(archs, "SUPPORTED", archs.SUPPORTED | {"gpt_oss"})
    with pytest.raises(ValueError, match="GptOssAttention passes s_aux"):
        make_runner(str(path), num_blocks=8)


def test_windows_and_softcap_keep_the_torch_decode_path():
    """The C decode kernel does neither: archs decides from the config."""
    plain = archs.plain_attention
    assert plain(AutoConfig.for_model("llama"))
    assert plain(AutoConfig.for_model("qwen2"))  # use_sliding_window defaults to False
    assert not plain(AutoConfig.for_model("mistral", sliding_window=8))
    assert not plain(AutoConfig.for_model("gemma2", sliding_window=None))  # softcap alone
    assert archs.windows(AutoConfig.for_model(
        "qwen3", use_sliding_window=True, sliding_window=8, num_hidden_layers=2,
        max_window_layers=2)) == ()  # no layer is a sliding one
    assert archs.windows(AutoConfig.for_model("gemma2", sliding_window=8)) == (8,)
