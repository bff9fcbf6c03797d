"""`--int8-activations` (docs/design/cpu-paths.md, "Activations in int8"): the quantized
kernel's int8 path (worker/csrc/quant_int8.h) on the types it has, against the float64 product
of the weights and x rounded to int8 per 256 values (rounded here as the kernel does), within
float32's bound; a damaged scale or min fails it; a row's bits the same in any batch and on 1
or 2 threads; the other types and rows of part of a group take the float32 path. Then the
worker: what it refuses, what the step log records and replay re-runs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from scripts.group.supervisor import parse
from tests.worker.test_kquant_kernels import gguf_weights, weight
from tests.worker.test_quant_kernels import U
from worker.linear import quant
from worker.linear.quant_module import QuantLinear
from worker.load import make_runner
from worker.presets import _LLAMA, Preset, write_checkpoint
from worker.quantized import settings

pytestmark = pytest.mark.skipif(not quant.has_int8(),
                                reason="no AVX2 kernel: --int8-activations is refused")

INT8 = [quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.Q4_0, quant.Q8_0]
QUANTS = {"Q4_K": [(16, 144)], "Q5_K": [(16, 176)], "Q6_K": [(0, 192)],
          "Q4_0": [(2 + 18 * b, 18 * b + 18) for b in range(8)],
          "Q8_0": [(2 + 34 * b, 34 * b + 34) for b in range(8)]}


def rounded(x: torch.Tensor) -> torch.Tensor:
    """x rounded to int8 per 256 values as the kernel rounds it, as float64 (q * d)."""
    g = x.numpy().astype(np.float32).reshape(x.shape[0], -1, 256)
    top = np.abs(g).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(top != 0, np.float32(127) / top, np.float32(0)).astype(np.float32)
    q = np.rint((g * inv).astype(np.float32))
    d = (top / np.float32(127)).astype(np.float32)
    return torch.from_numpy((q.astype(np.float64) * d).reshape(x.shape))


def gross(qw: quant.QuantWeight) -> np.ndarray:
    """|w| plus the weight a zero quant has (the min or offset the kernel subtracts apart)."""
    group = 8 if qw.qtype.block == 32 else 1   # Q4_0, Q8_0: eight blocks a group of x
    data = qw.data.numpy().copy().reshape(qw.shape[0], -1, group * qw.qtype.block_bytes)
    for lo, hi in QUANTS[qw.qtype.name]:
        data[..., lo:hi] = 0
    zeroed = quant.QuantWeight(torch.from_numpy(data.reshape(qw.shape[0], -1)), qw.qtype, qw.shape)
    return np.abs(gguf_weights(qw)).astype(np.float64) + np.abs(gguf_weights(zeroed))


def within_int8_bound(y, x, qw, w, b) -> bool:
    """y against the float64 product of the rounded x and w (gguf-py's float32 weights): a
    few roundings a group of 256, the groups summed in 8 lanes, then the lanes and the bias."""
    xq, w64 = rounded(x), torch.from_numpy(w.astype(np.float64))
    exact, scale = xq @ w64.T, xq.abs() @ torch.from_numpy(gross(qw)).T
    if b is not None:
        exact, scale = exact + b.double(), scale + b.double().abs()
    steps = 4 * (x.shape[1] // 256) + 16
    gamma = steps * U / (1 - steps * U)
    return bool(((y.double() - exact).abs() <= gamma * scale).all())


@pytest.mark.parametrize("qtype", INT8, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 17, 33])
def test_outputs_within_the_bound_of_the_rounded_product(qtype, m):
    k = 768
    qw, x, b = weight(qtype, 37, k, seed=m), torch.randn(m, k), torch.randn(37)
    x[0, 256:512] = 0                          # a group of zeros: d = 0, no division by it
    y = quant.matmul(x, qw, b, int8=True)
    assert within_int8_bound(y, x, qw, gguf_weights(qw), b)
    # x was rounded: the float32 path's answer is not this one
    assert not torch.equal(y, quant.matmul(x, qw, b))


@pytest.mark.parametrize("qtype,at", [(quant.Q4_K, 1), (quant.Q4_K, 3), (quant.Q4_K, 5),
                                      (quant.Q5_K, 1), (quant.Q5_K, 3), (quant.Q5_K, 5),
                                      (quant.Q6_K, 209), (quant.Q6_K, 195), (quant.Q4_0, 1),
                                      (quant.Q8_0, 1)],
                         ids=["Q4_K-d", "Q4_K-dmin", "Q4_K-scale", "Q5_K-d", "Q5_K-dmin",
                              "Q5_K-scale", "Q6_K-d", "Q6_K-scale", "Q4_0-d", "Q8_0-d"])
def test_a_damaged_scale_or_min_fails_the_bound(qtype, at):
    k = 512
    qw, x = weight(qtype, 23, k), torch.randn(5, k)
    w = gguf_weights(qw)
    data = qw.data.numpy().copy()
    data[3, at] ^= 0x04 if at in (1, 3, 209) else 0x21   # an exponent bit, or a scale's bits
    broken = quant.QuantWeight(torch.from_numpy(data), qtype, qw.shape)
    assert not np.array_equal(gguf_weights(broken), w)
    assert not within_int8_bound(quant.matmul(x, broken, int8=True), x, qw, w, None)


def same_bits_in_any_batch(call, x: torch.Tensor, sizes: tuple[int, ...]) -> None:
    """call(rows) gives each row the bits it gets in the whole of x: for the last m rows of x
    (m in sizes), and on one thread."""
    full = call(x)
    for m in sizes:
        assert torch.equal(call(x[-m:]), full[-m:]), m
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(call(x), full)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", INT8, ids=lambda t: t.name)
@pytest.mark.parametrize("k", [512, 16384])   # 16384: the kernel takes x 8 rows a block
def test_a_rows_bits_do_not_depend_on_the_batch_or_threads(qtype, k):
    qw, x, b = weight(qtype, 41, k), torch.randn(40, k), torch.randn(41)
    same_bits_in_any_batch(lambda rows: quant.matmul(rows, qw, b, int8=True), x,
                           (1, 2, 3, 5, 16, 17, 39))


def test_the_flag_in_the_type_is_the_same_call():
    qw, x = weight(quant.Q4_K, 19, 512), torch.randn(3, 512)
    code = quant.kernel_code(quant.Q4_K.ggml_id, True)
    assert torch.equal(quant.blocks_matmul(x, qw.data, code),
                       quant.matmul(x, qw, int8=True))


@pytest.mark.parametrize("qtype,k", [(quant.Q4_1, 512), (quant.Q5_0, 512), (quant.Q4_0, 160)],
                         ids=["Q4_1", "Q5_0", "Q4_0-k160"])
def test_what_the_path_lacks_takes_the_float32_path(qtype, k):
    qw, x = weight(qtype, 19, k), torch.randn(3, k)
    assert torch.equal(quant.matmul(x, qw, int8=True), quant.matmul(x, qw))
    assert quant.int8_group(qtype, k) == 0   # and the kernel says so, as the worker asks it


def test_the_kernel_names_what_it_takes():
    """The worker's list of the path's types and group is the kernel's own answer"""
    assert quant.int8_types() == {t.name: 256 for t in INT8}
    assert [quant.int8_group(t, 512) for t in INT8] == [256] * len(INT8)
    assert quant.int8_types(quant.load(("-mno-avx",))) == {}   # no int8 path built


def test_the_avx2_build_gives_the_native_builds_bits():
    """AVX-512's two runs a register (quant_int8_avx512.h, with VNNI's fused multiply-adds or
    without) and AVX2's one: the same integer sums and the same float order, so the same bits
    (on an AVX2-only host every build is AVX2's); the scalar build has no int8 path."""
    builds = {"avx2": quant.load(("-mno-avx512f",)), "no-vnni": quant.load(("-mno-avx512vnni",))}
    assert quant.has_int8(builds["avx2"]) and not quant.has_int8(quant.load(("-mno-avx",)))
    for qtype in INT8:
        qw, x, b = weight(qtype, 29, 512), torch.randn(6, 512), torch.randn(29)
        for m in (1, 6):
            want = quant.matmul(x[:m], qw, b, int8=True)
            for name, lib in builds.items():
                assert torch.equal(quant.matmul(x[:m], qw, b, lib=lib, int8=True), want), \
                    (name, qtype.name, m)


# -- the worker ------------------------------------------------------------------------------
WIDE = Preset("wide", "v1", init_std=0.1, config=dict(
    _LLAMA, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024,
    tie_word_embeddings=False))   # every linear layer's rows whole groups of 256


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    """A small llama of 256-wide rows with its linear layers in Q4_0, in float32 and with
    --int8-activations (batch invariance where the model allows it)."""
    path = tmp_path_factory.mktemp("wide")
    write_checkpoint(WIDE, path)
    args = dict(num_blocks=64, batch_invariant=None, quantize="q4_0")
    return make_runner(str(path), **args), make_runner(str(path), int8_activations=True, **args)


def test_every_quantized_layer_takes_the_path(runners):
    plain, int8 = runners
    layers = [m for m in int8.model.modules() if isinstance(m, QuantLinear)]
    assert layers and all(m.int8 for m in layers)
    layer = next(m for m in layers if m.qweight is not None)
    x = torch.randn(3, layer.in_features)
    exact = quant.matmul(x, layer.qweight, layer.bias)
    assert torch.equal(layer(x), quant.matmul(x, layer.qweight, layer.bias, int8=True))
    assert not torch.equal(layer(x), exact)
    assert torch.allclose(layer(x), exact, rtol=0.05, atol=0.05 * exact.abs().max().item())


def test_the_log_records_it_and_replay_asks_for_it(runners):
    plain, int8 = runners
    assert "activations" not in plain.info.quantization
    assert int8.info.quantization["activations"] == {"dtype": "int8", "group": 256,
                                                     "types": ["Q4_0"]}
    assert settings({"quantization": int8.info.quantization}) == {"quantize": "q4_0",
                                                                  "int8_activations": True}
    # its bits are a row's own: batch invariance holds in it
    assert int8.info.batch_invariant and plain.info.batch_invariant


@pytest.mark.parametrize("logged,why", [
    ({"activations": {"dtype": "int8", "group": 32, "types": ["Q4_K"]}}, "groups of 32"),
    ({"activations": {"dtype": "int8", "group": 256}}, "for no type"),
    ({"activations": {"dtype": "int8", "group": 256, "types": ["Q4_K", "Q4_1"]}},
     "Q4_1 not at all"),
    ({"prefill": {"dtype": "bfloat16", "rows": 8}}, "8 rows or more"),
])
def test_replay_refuses_a_mode_this_worker_runs_otherwise(logged, why):
    with pytest.raises(ValueError, match=why):
        settings({"quantization": {"mode": "gguf", **logged}})


@pytest.mark.parametrize("model,kwargs,why", [
    ("tiny", dict(), "these are float"),
    ("null", dict(), "null model"),
    ("tiny", dict(quantize="q4_0"), "no quantized layer here is one it multiplies"),
])
def test_what_it_refuses(model, kwargs, why):
    with pytest.raises(ValueError, match=why):
        make_runner(model, num_blocks=8, int8_activations=True, **kwargs)


def test_serve_passes_it_to_the_worker_and_refuses_it_under_tp(capsys):
    from scripts.group.commands import commands
    assert "--int8-activations" in commands(parse(["--int8-activations"]), "/tmp/x",
                                            None)["worker"]
    assert "--int8-activations" not in commands(parse([]), "/tmp/x", None)["worker"]
    with pytest.raises(SystemExit):
        parse(["--model", "tiny", "--int8-activations", "--tp", "2"])
    assert "run with --tp 1" in capsys.readouterr().err


def test_the_engine_serves_on_it(runners):
    """A prompt step and decode steps on the path: the greedy tokens come, and the first
    agrees with float32's (this model's first top two are far apart)."""
    from tests.worker.test_worker_engine import GREEDY, run_engine
    plain, int8 = runners
    prompt = list(range(100, 140))
    ours, _ = run_engine(int8, [(prompt, 8, GREEDY)])
    theirs, _ = run_engine(plain, [(prompt, 8, GREEDY)])
    assert len(ours[0]) == 8 and ours[0][0] == theirs[0][0], (ours, theirs)


def reruns_in_its_mode(runner, path: str, key: str, capsys) -> None:
    """A log of `runner` names its mode (model_info.quantization[key]); the re-run (a worker
    made from the log alone) takes it, so `replay verify --with-model` gives the logged
    tokens."""
    from replay.__main__ import main as replay_main
    from replay.logfile import LogFile
    from replay.model import runner_for
    from tests.worker.test_invariant import record, workload
    record(runner, path, workload(512, 6, seed=5))
    rerun = runner_for(LogFile(path).meta)
    assert rerun.info.quantization[key] == runner.info.quantization[key]
    assert replay_main(["verify", "--with-model", path]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def test_replay_reruns_its_log_in_it(runners, tmp_path, capsys):
    reruns_in_its_mode(runners[1], str(tmp_path / "w.db"), "activations", capsys)



def test_replay_refuses_a_log_whose_int8_layers_this_kernel_rounds_otherwise(runners, tmp_path):
    """A log made by a kernel that rounded other types (here: said to have taken Q8_0 too) is
    refused once the model is loaded, not re-run with other bits"""
    from replay.logfile import LogFile
    from replay.model import ModelUnavailable, runner_for
    from tests.worker.test_invariant import record, workload
    path = str(tmp_path / "w.db")
    record(runners[1], path, workload(512, 2, seed=5))
    meta = LogFile(path).meta
    meta["model_info"]["quantization"]["activations"]["types"] = ["Q4_0", "Q8_0"]
    with pytest.raises(ModelUnavailable, match="would round them"):
        runner_for(meta)
