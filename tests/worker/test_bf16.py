"""`--dtype bf16`: the alias, and the fallback named where the CPU lacks bf16 instructions."""
from __future__ import annotations

from scripts.group.supervisor import parse
from worker.bf16 import cpu_flags, dtype_name, fallback_note


def test_bf16_is_bfloat16_on_every_command_line():
    assert dtype_name("bf16") == "bfloat16" and dtype_name("float32") == "float32"
    assert parse(["--dtype", "bf16"]).dtype == "bfloat16"
    from worker.__main__ import main
    import pytest
    with pytest.raises(SystemExit):
        main(["--dtype", "f16"])


def test_the_fallback_is_named_only_without_bf16_instructions(tmp_path):
    assert fallback_note("cpu", "bfloat16", {"avx512f", "avx512_bf16"}) is None
    assert fallback_note("cpu", "bfloat16", {"amx_bf16"}) is None
    assert fallback_note("cuda", "bfloat16", set()) is None
    assert fallback_note("cpu", "float32", set()) is None
    note = fallback_note("cpu", "bfloat16", {"avx2", "avx512f"})
    assert "no bf16 dot-product instructions" in note and "float32" in note
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()
