"""scripts/serve --tp 2: the worker as two ranks over gloo. Greedy tokens equal one process's
and transformers' generate; a rank killed mid-run restarts the whole group with no request
lost; the log verifies, also with the model in one process."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from frontend.client import Client
from replay.logfile import LogFile
from scripts.group.harness import start_group
from tests.conftest import verify_log
from tests.group.test_faults import REQS, run_concurrently
from tests.group.test_group_lifecycle import wait_dead
# qwen2_dir: a Qwen2-shaped checkpoint (biases, 6 heads / 2 KV heads: 1 per rank)
from tests.worker.test_worker_engine import alone, prompts, qwen2_dir, stock_greedy  # noqa: F401
from worker.load import make_runner, resolve_model
from worker.archs import check_split

TP2 = ["--tp", "2", "--num-blocks", "128"]


def group_pids(g) -> dict[str, int]:
    with Client(g.address, timeout=30) as c:
        pids = dict(c.stats()["pids"])
    pids["rank1"] = g.pid_of("--rank 1")
    return pids


def greedy_over(address: str, ps, n: int = 12) -> list[list[int]]:
    with Client(address, timeout=120) as c:
        return [c.generate(prompt=p, max_tokens=n, ignore_eos=True).token_ids for p in ps]


def assert_same_greedy(address: str, model: str, path, attn: str = "sdpa") -> None:
    """The group's greedy tokens == one process's (tp 1) == transformers' generate."""
    one = make_runner(model, num_blocks=64)
    stock = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn)
    ps = prompts(one.info.vocab_size, (1, 17, 40, 100))
    got = greedy_over(address, ps)
    for p, toks in zip(ps, got):
        assert toks == alone(one, p, 12) == stock_greedy(stock, p, 12), len(p)


def test_refusals_name_why():
    tiny = AutoConfig.from_pretrained(resolve_model("tiny"))  # 4 heads, 2 KV heads
    check_split(tiny, 2)
    with pytest.raises(ValueError, match="does not divide the model's 4 attention heads"):
        check_split(tiny, 3)
    tiny.num_attention_heads = 8
    with pytest.raises(ValueError, match="does not divide the model's 2 KV heads"):
        check_split(tiny, 4)
    from transformers import GPT2Config
    with pytest.raises(ValueError, match="'gpt2' has no tensor-parallel plan"):
        check_split(GPT2Config(), 2)
    from transformers import Phi3Config
    # transformers' plan leaves phi3's fused QKV whole (each rank would hold every head)
    with pytest.raises(ValueError, match="'phi3' is not checked under tensor parallel"):
        check_split(Phi3Config(), 2)
    with pytest.raises(ValueError, match="at least 1"):
        check_split(tiny, 0)


def test_a_bad_tp_is_refused_before_any_rank_starts():
    r = subprocess.run([sys.executable, "-m", "worker", "--tp", "3", "--to-core", "ipc:///x",
                        "--from-core", "ipc:///y"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "--tp 3 does not divide the model's 4 attention heads" in r.stderr
    r = subprocess.run([sys.executable, "-m", "scripts.group.supervisor", "--tp", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--tp must be at least 1" in r.stderr


@pytest.mark.slow  # a group of three processes, one with a second rank: ~30 s
def test_a_checkpoint_over_two_ranks_matches_one_process(tmp_path, qwen2_dir):  # noqa: F811
    g = start_group(tmp_path, [*TP2, "--model", str(qwen2_dir)], log=False)
    try:
        assert_same_greedy(g.address, str(qwen2_dir), qwen2_dir)
        pids = group_pids(g)
    finally:
        code = g.stop()
    assert code == 0, g.tail()
    assert wait_dead(pids.values())


@pytest.mark.slow  # 1-2 minutes on 2 shared cores
def test_tiny_over_two_ranks_survives_a_rank_killed_mid_run(tmp_path):
    g = start_group(tmp_path, TP2)
    seen: set[int] = set()
    try:
        with Client(g.address, timeout=30) as c:
            assert (c.stats()["model"], c.stats()["tp"]) == ("tiny", 2)
        assert_same_greedy(g.address, "tiny", resolve_model("tiny"))
        with Client(g.address, timeout=120) as c:
            want = [c.generate(**r).token_ids for r in REQS]
        before = group_pids(g)
        seen.update(before.values())
        started = threading.Event()
        threads, results = run_concurrently(g.address, REQS, started)
        assert started.wait(60)
        os.kill(before["rank1"], signal.SIGKILL)
        for t in threads:
            t.join(240)
        after = group_pids(g)
        seen.update(after.values())
        with Client(g.address, timeout=30) as c:
            st = c.stats()
    finally:
        code = g.stop()
    assert code == 0, g.tail()
    assert wait_dead(seen), [p for p in seen if os.path.exists(f"/proc/{p}")]
    for (reason, toks), ref in zip(results, want):
        assert reason == "length" and toks == ref
    assert after["worker"] != before["worker"] and after["rank1"] != before["rank1"]
    assert (after["core"], after["frontend"]) == (before["core"], before["frontend"])
    assert st["free_blocks"] == st["total_blocks"]
    err = g.stderr.read_text()
    assert re.search(r"rank 1 \(pid \d+\) exited", err) and re.search(r"worker \d+ lost", err)
    assert LogFile(g.log).meta["model_info"]["tp"] == 2
    assert verify_log(g.log).returncode == 0
    r = verify_log(g.log, "--with-model")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the log ran with tp 2" in r.stderr


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two 'machines' (process groups) on loopback: 1-2 minutes on 2 cores
def test_ranks_on_another_machine_serve_and_survive_its_rank_killed(tmp_path):
    """--tp 2 over --nnodes 2: node 1 runs rank 1 only and meets rank 0 at --dist-init.
    Killing it mid-run restarts the group on node 0 and the rank on node 1; every request
    completes with the tokens of an undisturbed run."""
    spread = ["--tp", "2", "--nnodes", "2", "--dist-init", f"tcp://127.0.0.1:{free_port()}"]
    (tmp_path / "n1").mkdir()
    node1 = start_group(tmp_path / "n1", [*spread, "--node-rank", "1"], log=False)
    g = None
    try:
        g = start_group(tmp_path, [*spread, "--num-blocks", "128"])
        assert_same_greedy(g.address, "tiny", resolve_model("tiny"))
        with Client(g.address, timeout=120) as c:
            want = [c.generate(**r).token_ids for r in REQS]
        rank1 = node1.pid_of("--rank 1")
        started = threading.Event()
        threads, results = run_concurrently(g.address, REQS, started)
        assert started.wait(60)
        os.kill(rank1, signal.SIGKILL)
        for t in threads:
            t.join(240)
        assert [toks for _, toks in results] == want, results
        assert node1.pid_of("--rank 1") != rank1 and node1.alive()
    finally:
        if g is not None:
            assert g.stop() == 0, g.tail()
        node1.stop()
    assert "a collective failed" in g.stderr.read_text()
    assert "starting this node's ranks again" in node1.stderr.read_text()
    assert verify_log(g.log).returncode == 0


def test_spread_ranks_need_a_rendezvous_and_a_divisible_tp():
    for args in (["--tp", "2", "--nnodes", "2"],
                 ["--tp", "3", "--nnodes", "2", "--dist-init", "tcp://127.0.0.1:1"],
                 ["--tp", "2", "--nnodes", "2", "--dist-init", "tcp://10.1.2.3:5"]):
        p = subprocess.run([sys.executable, "-m", "scripts.group.supervisor", "--no-log",
                            *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (args, p.stderr)
        assert "--nnodes" in p.stderr or "--allow-remote" in p.stderr, p.stderr


# The families of worker/archs.py's CHECKED beyond llama and qwen2, each on its test checkpoint
# (tests/worker/test_arch_families.py) with 2 KV heads, so that 2 ranks hold one each.
@pytest.mark.slow  # ~30 s each on two shared cores
@pytest.mark.parametrize("family", ["mistral", "qwen3", "gemma", "gemma2", "granite",
                                    "starcoder2", "mixtral"])
def test_family_over_two_ranks_matches_one_process(family, tmp_path, tmp_path_factory):
    from tests.worker.test_arch_families import FAMILIES, family_dir
    config, options = FAMILIES[family]
    FAMILIES[family] = ({**config, "num_key_value_heads": 2}, options)
    try:
        path = family_dir(tmp_path_factory, family)
    finally:
        FAMILIES[family] = (config, options)
    g = start_group(tmp_path, [*TP2, "--model", str(path)], log=False)
    try:
        assert_same_greedy(g.address, str(path), path,
                           "eager" if family == "gemma2" else "sdpa")
    finally:
        assert g.stop() == 0, g.tail()
