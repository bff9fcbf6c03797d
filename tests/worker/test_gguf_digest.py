"""The file's sha256 the step log records and pins are checked against (worker/gguf_file.py):
a remembered digest is never served for other bytes."""
from __future__ import annotations

import os

from worker import gguf_file


def test_a_same_size_file_with_its_mtime_set_back_is_hashed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"a" * 4096)
    first = gguf_file.sha256_of(f)
    st = f.stat()
    f.write_bytes(b"b" * 4096)                                # same size, other bytes
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))          # the mtime set back
    assert gguf_file.sha256_of(f) == gguf_file.hash_file(f) != first


def test_a_pinned_file_is_hashed_from_its_bytes_whatever_is_remembered(tmp_path, monkeypatch):
    from tests.gguf_files import smollm2
    monkeypatch.setenv("TL_CACHE_DIR", str(tmp_path / "cache"))
    path = smollm2().resolve()
    st = path.stat()
    key = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    gguf_file._save_memo(gguf_file._memo_path(path), {"key": key, "sha256": "0" * 64})
    assert gguf_file.sha256_of(path) == "0" * 64                 # remembered: served as is
    assert gguf_file.inspect(path, pinned=True).sha256 == gguf_file.hash_file(path)
