"""`scripts/bench compare --peer llamacpp`: its pure parts always; a tiny end-to-end smoke
(slow) only where llama-server is already built in the cache (the peer is a benchmark
dependency: neither the suite nor CI builds it). No timing is asserted."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scripts import ROOT
from scripts.benchmarks import _compare_bandwidth as cbw
from scripts.benchmarks import _compare_peer as peer
from scripts.benchmarks import _compare_shared as cs
from scripts.benchmarks import _llamacpp_get as get
from scripts.benchmarks import _llamacpp_serve as serve
from scripts.benchmarks import common as bl
from scripts.benchmarks._llamacpp_convert import ascii_lead_bytes
from worker.preset_tokenizer import _byte_chars



def test_first_token_agreement_counts_early_differences_only():
    eng = [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6], None, [7, 8, 9]]
    llm = [[1, 2, 3, 9], [1, 9, 3, 4], [5, 6], [1], [7, 8]]
    ag = peer.first_token_agreement(eng, llm, first=3, eog={4})
    assert ag["compared"] == 4 and ag["differ"] == 2      # request 1 at 1; request 4 shorter
    assert ag["diverged_at_eog"] == 1                     # request 0 at 3: the engine's 4
    assert ag["examples"][0] == {"request": 1, "position": 1, "engine": 2, "llamacpp": 9}
    assert ag["examples"][1]["request"] == 4 and ag["examples"][1]["position"] is None
    assert ag["whole_equal_frac"] == 1 / 4


def test_goals_need_their_levels():
    assert peer.goals({8: {"engine_over_llamacpp_tok_s": 3.0}}) == {}
    g = peer.goals({1: {"engine_over_llamacpp_tpot_p50": 1.6},
                    64: {"engine_over_llamacpp_tok_s": 1.5}})
    assert g["c64_tok_s_ratio_at_least_1.5"]["met"] is True
    assert g["c1_tpot_ratio_at_most_1.5"] == {"ratio": 1.6, "met": False}
    same = peer.goals({1: {"engine_over_llamacpp_tpot_p50": 0.99},
                       64: {"engine_over_llamacpp_tok_s": 2.9}}, same_file=True)
    assert same == {"c64_tok_s_ratio_at_least_3.0": {"ratio": 2.9, "met": False},
                    "c1_tpot_ratio_at_most_1.0": {"ratio": 0.99, "met": True}}


def test_a_real_size_file_has_the_issues_goals():
    """1B-3B shapes: TPOT at most 0.9x, prompt tokens/s at least 1.0x at one in flight, and
    at least 2x the tok/s at 8 and 64; a JSON file's levels are keyed by strings."""
    levels = {"1": {"engine_over_llamacpp_tpot_p50": 0.83, "engine_over_llamacpp_prefill": 0.78},
              "8": {"engine_over_llamacpp_tok_s": 2.1}, "64": {"engine_over_llamacpp_tok_s": 1.5}}
    g = peer.goals(levels, same_file=True, real_size=True)
    assert g == {"c8_tok_s_ratio_at_least_2.0": {"ratio": 2.1, "met": True},
                 "c64_tok_s_ratio_at_least_2.0": {"ratio": 1.5, "met": False},
                 "c1_tpot_ratio_at_most_0.9": {"ratio": 0.83, "met": True},
                 "c1_prefill_ratio_at_least_1.0": {"ratio": 0.78, "met": False}}


def test_the_prefill_ratio_is_the_ratio_of_mean_ttfts():
    assert peer.prefill_ratio({"ttft_ms": {"mean": 2000.0}}, {"ttft_ms": {"mean": 1600.0}}) == 0.8
    assert peer.prefill_ratio({"ttft_ms": {}}, {"ttft_ms": {"mean": 1600.0}}) is None


def test_rounds_split_the_workload_in_order_and_keep_the_level_busy():
    reqs = [bl.Req([i], 1) for i in range(64)]
    for c, sizes in ((1, [16] * 4), (8, [32, 32]), (64, [64])):
        parts = peer.rounds(reqs, c)
        assert [len(p) for p in parts] == sizes
        assert [r for p in parts for r in p] == reqs
    assert [len(p) for p in peer.rounds(reqs[:5], 1)] == [5]
    assert [len(p) for p in peer.rounds(reqs[:40], 1)] == [20, 20]


def test_merged_rounds_are_one_run_in_workload_order():
    t = [bl.Trace(sent=0.0) for _ in range(3)]
    runs = [bl.RunResult(t[:1], 2.0, {"steps": 1}, {"steps": 5}),
            bl.RunResult(t[1:], 3.0, {"steps": 9}, {"steps": 20})]
    m = cs.merged(runs)
    assert m.traces == t and m.wall == 5.0
    assert (m.stats_before, m.stats_after) == ({"steps": 1}, {"steps": 20})


def test_slot_ctx_covers_the_longest_request():
    reqs = [bl.Req([1] * 300, 200), bl.Req([1] * 10, 5)]
    assert peer.slot_ctx(reqs) == 512
    assert peer.slot_ctx([bl.Req([1] * 256, 0)]) == 256


def test_ascii_lead_bytes_renames_only_utf8_lead_byte_tokens():
    chars = _byte_chars()
    tokens = [chars[b] for b in range(256)] + ["<|endoftext|>", "<|extra_257|>"]
    out = ascii_lead_bytes(tokens)
    assert out[:0xC0] == tokens[:0xC0] and out[256:] == tokens[256:]
    assert out[0xC3] == "<|byte_c3|>" and all(t.isascii() for t in out[0xC0:256])
    assert len(set(out)) == len(out)


def test_server_args_size_slots_and_context():
    args = serve.server_args(Path("/x/llama-server"), Path("/m.gguf"), 1234, 8, 768, 2)
    assert args[args.index("-np") + 1] == "8" and args[args.index("-c") + 1] == str(8 * 768)
    assert args[args.index("-t") + 1] == "2" and "--cont-batching" in args
    assert args[args.index("-ctk") + 1] == args[args.index("-ctv") + 1] == "f32"


def test_parse_peer_defaults_and_refusals():
    from scripts.benchmarks import compare
    a = compare.parse(["--peer", "llamacpp"])
    assert a.requests == 64 and a.concurrency == [1, 8, 64]
    assert compare.parse([]).requests == 256
    assert compare.parse(["--peer", "llamacpp", "--gguf", "m.gguf", "--gguf-type",
                          "Q8_0"]).gguf_type == "Q8_0"
    for bad in (["--concurrency", "0"], ["--concurrency", "a,b"], ["--peer", "vllm"],
                ["--gguf", "m.gguf"], ["--peer", "llamacpp", "--gguf-type", "Q8_0"],
                ["--peer", "llamacpp", "--gguf", "m.gguf", "--gguf-type", "Q2_K"]):
        with pytest.raises(SystemExit):
            compare.parse(bad)


@pytest.mark.slow
@pytest.mark.skipif(get.found() is None, reason="llama-server not built in the cache "
                    "(scripts/bench compare --peer llamacpp builds it)")
def test_compare_peer_llamacpp_tiny(tmp_path):
    out = tmp_path / "peer.json"
    cmd = [str(ROOT / "scripts" / "bench"), "compare", "--peer", "llamacpp", "--model", "tiny",
           "--requests", "4", "--concurrency", "1,2", "--no-progress", "--allow-dirty",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    facts = doc["llamacpp"]["gguf_facts"]
    assert facts["vocab"] == 512 and facts["eog_ids"] == [256, 258]  # EOS and <|im_end|>
    want = doc["workload"]["max_output_tokens"]
    for c in ("1", "2"):
        row = doc["levels"][c]
        for name in peer.SYSTEMS:
            assert row[name]["completed"] == 4 and row[name]["output_tokens"] == want
        # the same weights: tiny's logit gaps are far above f32 noise (worker/presets.py)
        assert row["agreement"]["compared"] == 4 and row["agreement"]["differ"] == 0
        assert row["llamacpp_batched_bench_tok_s"] > 0
    assert doc["bandwidth_gb_s"] > 0 and doc["bytes_per_token"]["bytes_per_token"] > 0
    assert all(doc["levels"]["1"][f"{n}_bandwidth_fraction"] > 0 for n in peer.SYSTEMS)


def _fake_pair(tmp_path: Path, vocab: int = 8):
    """A checkpoint dir (config + safetensors) and a GGUF holding the same tensors."""
    gguf = pytest.importorskip("gguf")   # a benchmark dependency: absent, nothing to check
    import numpy as np
    from safetensors.numpy import save_file
    rng = np.random.default_rng(0)
    tensors = {hf: rng.standard_normal((vocab, 4)).astype(np.float32)
               for hf in get.SAME_BITS.values()}
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({"vocab_size": vocab, "eos_token_id": 2}))
    save_file(tensors, str(hf_dir / "model.safetensors"))
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list([f"t{i}" for i in range(vocab - 1)] + ["<|im_end|>"])
    w.add_eos_token_id(2)
    for g_name, hf_name in get.SAME_BITS.items():
        w.add_tensor(g_name, tensors[hf_name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, hf_dir, tensors


def test_check_model_passes_the_same_and_refuses_other_weights(tmp_path):
    path, hf_dir, tensors = _fake_pair(tmp_path)
    facts = get.check_model(path, hf_dir)
    assert facts["vocab"] == 8 and facts["eog_ids"] == [2, 7]
    from safetensors.numpy import save_file
    tensors["model.layers.0.mlp.down_proj.weight"][3, 1] += 1e-6
    save_file(tensors, str(hf_dir / "model.safetensors"))
    with pytest.raises(ValueError, match="blk.0.ffn_down.weight differs"):
        get.check_model(path, hf_dir)


def _gguf(path: Path, tied: bool) -> Path:
    """A llama GGUF of three F32 tensors: a 10 x 4 embedding, one 4 x 4 layer, a head."""
    import gguf
    import numpy as np
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.ones((10, 4), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.ones((4, 4), dtype=np.float32))
    if not tied:
        w.add_tensor("output.weight", np.ones((10, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_bytes_per_token_count_one_embedding_row_and_the_whole_head(tmp_path):
    untied = cbw.bytes_per_token(_gguf(tmp_path / "u.gguf", tied=False))
    assert untied == {"bytes_per_token": 64 + 160 + 16, "weight_bytes": 160 + 64 + 160,
                      "tied": False}
    tied = cbw.bytes_per_token(_gguf(tmp_path / "t.gguf", tied=True))
    assert tied == {"bytes_per_token": 64 + 160, "weight_bytes": 160 + 64, "tied": True}


# llama-batched-bench --output-format jsonl, as it printed on this machine (and a log line)
BATCHED_BENCH = """main: n_kv_max = 1024
{"n_kv_max": 1024, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1, "is_pp_shared": 0, "n_gpu_layers": -1, "n_threads": 2, "n_threads_batch": 2, "pp": 32, "tg": 4, "pl": 1, "n_kv": 36, "t_pp": 1.434801, "speed_pp": 22.302744, "t_tg": 0.373881, "speed_tg": 10.698591, "t": 1.808682, "speed": 19.903997}
{"n_kv_max": 1024, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1, "is_pp_shared": 0, "n_gpu_layers": -1, "n_threads": 2, "n_threads_batch": 2, "pp": 32, "tg": 4, "pl": 2, "n_kv": 72, "t_pp": 6.920807, "speed_pp": 9.247477, "t_tg": 3.658189, "speed_tg": 2.186874, "t": 10.578996, "speed": 6.805939}
"""


def test_batched_bench_output_is_tg_tok_s_per_level():
    assert cbw.parse_batched_bench(BATCHED_BENCH) == {1: 10.698591, 2: 2.186874}
    args = cbw.batched_bench_args(Path("b"), Path("m.gguf"), 100, 20, [1, 8], 2)
    assert args[args.index("-c") + 1] == str(8 * 120)
    assert args[args.index("-npl") + 1] == "1,8" and "jsonl" in args


def test_a_batched_bench_level_whose_row_was_lost_is_run_again_alone(tmp_path):
    """llama.cpp's log thread sometimes loses the last row at exit: the level runs again."""
    calls = tmp_path / "calls"
    fake = tmp_path / "llama-batched-bench"
    # prints a row per -npl level, except level 2 on its first run
    fake.write_text(f"""#!/usr/bin/env python3
import json, sys
a = sys.argv
levels = [int(x) for x in a[a.index("-npl") + 1].split(",")]
with open({str(calls)!r}, "a") as f:
    f.write(",".join(map(str, levels)) + "\\n")
first = len(open({str(calls)!r}).read().splitlines()) == 1
for pl in levels:
    if not (first and pl == 2):
        print(json.dumps({{"pl": pl, "speed_tg": 10.0 * pl}}))
""")
    fake.chmod(0o755)
    got = cbw.batched_bench(fake, tmp_path / "m.gguf", {"prompt_len_mean": 10,
                                                        "output_len_mean": 5}, [1, 2, 8], 2,
                            tmp_path / "log")
    assert got == {1: 10.0, 2: 20.0, 8: 80.0}
    assert calls.read_text().splitlines() == ["1,2,8", "2"]


def test_bandwidth_figures_join_the_levels(tmp_path):
    path = _gguf(tmp_path / "m.gguf", tied=True)   # 224 bytes a token
    doc = {"levels": {1: {"engine": {"tpot_ms": {"p50": 1e-3}},
                          "llamacpp": {"tpot_ms": {"p50": 2e-3}}}, 8: {}}}
    res = {"llamacpp": {"gguf": str(path), "batched_bench": {"tok_s": {1: 50.0, 8: 300.0}}}}
    triad = {"threads": 2, "size_mb": 1, "triad_gb_s": 0.448, "sum_gb_s": 1.0}
    peer.add_bandwidth(doc, res, triad, None)
    one = doc["levels"][1]
    assert one["engine_bandwidth_gb_s"] == pytest.approx(0.224)   # 224 B per microsecond
    assert one["engine_bandwidth_fraction"] == pytest.approx(0.5)
    assert one["llamacpp_bandwidth_fraction"] == pytest.approx(0.25)
    assert [doc["levels"][c]["llamacpp_batched_bench_tok_s"] for c in (1, 8)] == [50.0, 300.0]
    assert doc["bandwidth_gb_s"] == 0.448 and doc["bytes_per_token"]["tied"]
    lines = "\n".join(peer.bandwidth_lines(doc))
    assert "50% of the triad" in lines and "c8 300.0" in lines


def test_bandwidth_smoke_writes_its_json(tmp_path):
    from scripts.benchmarks import bandwidth
    out = tmp_path / "bw.json"
    assert bandwidth.main(["--size-mb", "1", "--runs", "1", "--threads", "1,2",
                           "--json", str(out), "--allow-dirty"]) == 0
    doc = json.loads(out.read_text())
    assert [r["threads"] for r in doc["levels"]] == [1, 2]
    assert all(r["triad_gb_s"] > 0 and r["sum_gb_s"] > 0 for r in doc["levels"])


def test_gguf_type_takes_the_k_quants():
    from scripts.benchmarks import compare
    a = compare.parse(["--peer", "llamacpp", "--gguf", "m.gguf", "--gguf-type", "Q4_K_M"])
    assert a.gguf_type == "Q4_K_M"
    with pytest.raises(SystemExit):
        compare.parse(["--peer", "llamacpp", "--gguf", "m.gguf", "--gguf-type", "F32"])


def test_a_stream_that_holds_back_ids_still_counts_every_token():
    """llama-server streams no id for a token whose text ends inside a UTF-8 sequence: the
    request is no failure, its tokens count in tok/s and TPOT, its ids are not compared."""
    tr = bl.Trace(sent=0.0, deltas=[(1.0, 1), (2.0, 2), (3.0, 1)], tokens=[5, 6, 7],
                  end=3.0, ids_partial=True)
    assert tr.count() == 4 and tr.tpot() == 2.0 / 3
    m = bl.metrics(bl.RunResult([tr], 3.0, {}, {}))
    assert (m["errors"], m["output_tokens"], m["ids_partial"]) == (0, 4, 1)


def test_a_level_starts_on_a_settled_machine(monkeypatch):
    """compare waits for the load of the level before to decay (the worker chooses its wait
    policy from it), and gives up after its timeout."""
    loads = iter([2.0, 1.2, 0.4, 0.4])
    slept = []
    monkeypatch.setattr(cs.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(cs.time, "sleep", slept.append)
    assert cs.settle(limit=0.5) == 0.4 and len(slept) == 2
    monkeypatch.setattr(cs.os, "getloadavg", lambda: (3.0, 0.0, 0.0))
    assert cs.settle(limit=0.5, timeout=0) == 3.0


def test_a_build_made_with_other_flags_is_not_found_and_is_made_again(tmp_path, monkeypatch):
    """llama.cpp is built without AMX (a VM may fault on its first tile instruction); a
    build/ configured by an older harness with other flags is not taken as built."""
    monkeypatch.setattr(get, "home", lambda: tmp_path)
    assert "-mno-amx-tile" in " ".join(get.CMAKE_FLAGS)
    tool = tmp_path / "build" / "bin" / "llama-server"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert get.found() is None   # no stamp: made before the flags were recorded
    get._fresh_build_dir(tmp_path / "build")
    assert not tool.exists()     # wiped, to be built again with these flags
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert get.found() == tool
    get._flags_stamp(tmp_path / "build").write_text("-DOTHER=ON")
    assert get.found() is None


@pytest.mark.slow
@pytest.mark.skipif(not (get.home() / "src" / "convert_hf_to_gguf.py").is_file(),
                    reason="llama.cpp's tree not in the cache (scripts/bench builds it)")
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_real_size_shape_gets_smollm2s_pre_tokenizer(tmp_path, monkeypatch, model_type):
    """A tiny shape of each family through llama.cpp's converter: the file's pre-tokenizer is
    SmolLM2's ("smollm"), also for qwen2, whose AutoTokenizer class has another."""
    import gguf

    from scripts.benchmarks import _real_size as rs
    base = rs._LLAMA if model_type == "llama" else rs._QWEN2
    monkeypatch.setitem(rs.SHAPES, "tiny", dict(base, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    monkeypatch.setattr(rs, "home", lambda: tmp_path)
    fields = gguf.GGUFReader(str(rs.gguf_file("tiny", "F16"))).fields
    text = lambda key: bytes(fields[key].parts[-1]).decode()   # noqa: E731
    assert (text("general.architecture"), text("tokenizer.ggml.pre")) == (model_type, "smollm")
