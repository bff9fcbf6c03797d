"""`--help` of scripts/serve, scripts/replay and scripts/bench: grouped options, each with one
line of help (its default shown by core/cli.py)."""
import argparse
from pathlib import Path
import importlib
import subprocess

import pytest

from scripts.group.supervisor import parser as serve_parser

GROUPS = {"model", "scheduling", "KV cache", "logging", "HTTP (the OpenAI-compatible gateway)",
          "scale-out", "faults"}


def _options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.dest != "help"]


def test_serve_groups_every_option_with_help():
    p = serve_parser()
    groups = {g.title: g for g in p._action_groups}
    assert GROUPS <= set(groups)
    assert all(a.help and a.help.strip() for a in _options(p)), \
        [a.option_strings for a in _options(p) if not a.help]
    assert not [a for a in _options(p) if a in groups["options"]._group_actions]
    text = p.format_help()
    for flag, default in (("--block-size", "16"), ("--max-seqs", "256"),
                          ("--address", "tcp://127.0.0.1:7600"), ("--max-batch-tokens", "2048")):
        block = text.split(f"\n  {flag} ", 1)[1].split("\n  --", 1)[0]
        assert f"(default: {default})" in " ".join(block.split()), flag


def test_replay_commands_have_help():
    from replay.__main__ import parser
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        assert all(a.help for a in p._actions if a.dest != "help"), name


class _Parsed(Exception):
    pass


BENCHMARKS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "scripts" / "benchmarks")
                    .glob("*.py") if not p.stem.startswith("_") and p.stem != "common")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_benchmark_gives_every_option_help(name, monkeypatch):
    """The parser the benchmark's main builds, caught where it would parse."""
    seen = {}

    def catch(self, args=None, namespace=None):
        seen["p"] = self
        raise _Parsed
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    main = importlib.import_module(f"scripts.benchmarks.{name}").main
    with pytest.raises(_Parsed):
        main([]) if main.__code__.co_argcount else main()
    assert all(a.help for a in _options(seen["p"]))


def test_bench_without_a_name_lists_each_benchmark():
    out = subprocess.run(["scripts/bench"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage: scripts/bench NAME" in out.stderr
    assert all(f"  {n} " in out.stderr for n in ("serve", "sched", "soak", "whatif"))
