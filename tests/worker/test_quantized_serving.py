"""Quantized weights as the worker serves them (worker/quantized.py): `--quantize q8_0|q4_0`
on a float checkpoint, the default on a quantized GGUF and `--dequantize`; the decode graph
and the batch-invariant mode on them; the refusals; replay of a quantized log."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from replay.__main__ import main as replay_main
from scripts.group.commands import commands
from scripts.group.supervisor import parse
from worker.linear.quant_module import QuantLinear
from worker.load import make_runner, resolve_model
from worker.quantized import refusal, settings

from tests.worker.test_invariant import assert_invariant, record, workload
from tests.worker.test_worker_engine import GREEDY, run_engine, stock_greedy

GGUF_Q4 = {"format": "gguf", "path": "m.gguf", "tensor_types": {"Q4_1": 210, "F32": 61}}
GGUF_F16 = {"format": "gguf", "path": "m.gguf", "tensor_types": {"F16": 210, "F32": 61}}
HF = {"format": "hf", "path": "/m"}


@pytest.fixture(scope="module", params=["q8_0", "q4_0"])
def qtiny(request):
    return make_runner("tiny", num_blocks=96, batch_invariant=True, quantize=request.param)


def test_every_linear_layer_but_the_head_is_quantized(qtiny):
    q = qtiny.info.quantization
    layers = [n for n, m in qtiny.model.named_modules() if isinstance(m, QuantLinear)]
    assert q["mode"] in ("q8_0", "q4_0") and sorted(q["layers"]) == sorted(layers)
    assert len(layers) == 7 * qtiny.model.config.num_hidden_layers
    assert set(q["layers"].values()) == {q["mode"].upper()}
    assert qtiny.graph is not None   # recorded with tl::quant_linear, checked bit for bit
    assert qtiny.info.weights != make_runner("tiny", num_blocks=8).info.weights


def test_greedy_equals_transformers_on_the_dequantized_weights(qtiny):
    from worker.linear.quant import TYPES
    from worker.linear.quant_module import quantize_linears
    stock = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).eval()
    ref = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).eval()
    # the same quantizer on the same weights: the runner's blocks (its siblings are fused)
    for name in quantize_linears(ref, TYPES[qtiny.info.quantization["mode"].upper()]):
        stock.get_submodule(name).weight.data = ref.get_submodule(name).dense()
    prompts = [[3, 17, 99, 200, 5], [42] * 9, list(range(100, 133))]
    ours, _ = run_engine(qtiny, [(p, 12, GREEDY) for p in prompts])
    assert ours == [stock_greedy(stock, p, 12) for p in prompts]


def test_a_row_alone_equals_it_in_any_batch(qtiny):
    assert_invariant(qtiny, 512, n=16, compared=4, num_blocks=12)


def test_replay_reruns_a_quantized_log_bitwise(qtiny, tmp_path, capsys):
    path = str(tmp_path / "q.db")
    record(qtiny, path, workload(512, 6, seed=5))
    from replay.logfile import LogFile
    meta = LogFile(path).meta["model_info"]
    assert meta["quantization"]["mode"] == qtiny.info.quantization["mode"]
    assert replay_main(["verify", "--with-model", path]) == 0
    assert replay_main(["request", path, "2", "--rerun"]) == 0
    assert "match" in capsys.readouterr().out


@pytest.mark.parametrize("checkpoint,kw,words", [
    (GGUF_Q4, {"quantize": "q8_0"}, "already quantized (Q4_1)"),
    (HF, {"quantize": "q5_k"}, "q8_0 or q4_0, not 'q5_k'"),
    (HF, {"quantize": "q8_0", "dequantize": True}, "opposite"),
    (HF, {"quantize": "q4_0", "dtype": "bfloat16"}, "float32"),
    (GGUF_F16, {"quantize": "q4_0", "tp": 2}, "--tp 1"),
])
def test_weight_settings_it_cannot_take_are_refused(checkpoint, kw, words):
    args = {"quantize": None, "dequantize": False, "device": "cpu", "dtype": "float32",
            "tp": 1, **kw}
    assert words in refusal(checkpoint, **args)


def test_weight_settings_it_takes():
    for checkpoint, q in ((HF, "q8_0"), (GGUF_F16, "q4_0"), (GGUF_Q4, None)):
        assert refusal(checkpoint, q, False, "cpu", "float32", 1) is None
    assert refusal(GGUF_Q4, None, True, "cpu", "bfloat16", 1) is None


def test_serve_refuses_quantize_on_a_null_model_and_passes_the_flags():
    from worker.settings import problem
    assert "no weights" in problem("null", quantize="q8_0", read_config=False)
    cmds = commands(parse(["--quantize", "q4_0", "--dp", "2"]), "/tmp/x", None)
    assert all(cmds[w][cmds[w].index("--quantize") + 1] == "q4_0" for w in ("worker0", "worker1"))
    assert "--dequantize" in commands(parse(["--dequantize"]), "/tmp/x",
                                      None)["worker"]
    assert "--quantize" not in commands(parse([]), "/tmp/x", None)["worker"]


def test_a_quantized_file_of_a_layout_it_does_not_read_is_served_float(capsys):
    from worker.quantized import mode
    phi3 = {**GGUF_Q4, "architecture": "phi3"}
    assert mode(phi3) == "none"
    assert "not 'phi3'" in capsys.readouterr().err
    llama = {**GGUF_Q4, "architecture": "llama"}
    assert mode(llama, dtype="bfloat16") == "none"
    assert "float32 with --tp 1" in capsys.readouterr().err
    assert (mode(llama), mode(llama, dequantize=True), mode(GGUF_F16, "q4_0")) == (
        "gguf", "none", "q4_0")
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="already quantized"):
        mode(llama, "q8_0")


def test_replay_loads_the_weights_the_log_names():
    assert settings({"quantization": {"mode": "q4_0", "layers": {}}}) == {"quantize": "q4_0"}
    assert settings({"quantization": {"mode": "gguf", "layers": {}}}) == {}
    assert settings({"quantization": {"mode": "none"}}) == {"dequantize": True}
    assert settings({}) == {"dequantize": True}   # logs from before quantized weights


def test_a_damaged_quantization_record_is_a_damaged_log():
    from replay.damage import DamagedLog
    from replay.rows import MODEL_INFO
    read = MODEL_INFO["quantization"]
    assert read({"mode": "gguf", "layers": {"a": "Q4_1"}}, "q")["mode"] == "gguf"
    assert read({}, "q") == {}
    for bad in ({"mode": "q2"}, {"mode": "gguf", "layers": []}, [1], {"mode": 3}):
        with pytest.raises(DamagedLog):
            read(bad, "q")


def test_the_kernel_less_worker_refuses_the_mode_on_quantized_weights(monkeypatch):
    from worker import invariant
    from worker.linear import quant
    runner = make_runner("tiny", num_blocks=8, quantize="q8_0")
    monkeypatch.setattr(quant, "kernel", lambda: None)
    with pytest.raises(ValueError, match="quantized kernel"):
        invariant.check_supported(runner.model, runner.kv, 2, 1)
    layer = runner.model.model.layers[0].mlp.down_proj   # not fused: quant_fuse.py
    x = torch.randn(3, layer.in_features)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.dense()))


def test_sibling_layers_fused_give_the_same_bits():
    from worker.linear import quant_fuse
    from worker.linear.quant import Q4_0
    from worker.linear.quant_module import quantize_linears
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).eval()
    quantize_linears(model, Q4_0)
    ids = torch.tensor([[5, 9, 300, 2, 77, 18]])
    with torch.inference_mode():
        before = model(ids).logits
        fused = quant_fuse.fuse(model, lambda: model(ids))
        after = model(ids).logits
    # q, k and v; gate and up: two groups a layer
    assert len(fused) == 2 * model.config.num_hidden_layers
    assert [f.widths for f in fused[:2]] == [[64, 32, 32], [128, 128]]
    assert torch.equal(before, after)
    assert model.model.layers[0].self_attn.k_proj.blocks.numel() == 0   # held once, fused
