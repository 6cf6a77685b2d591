"""Tables built once per machine (:mod:`tokenmill.tablecache`)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tokenmill.tablecache import cached_arrays, table_path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMILL_TABLE_CACHE", str(tmp_path / "tables"))
    return tmp_path / "tables"


def _counting_build(calls: list[int]):
    def build():
        calls.append(1)
        return np.arange(5, dtype=np.int32), np.array([7, 8], np.uint64)
    return build


def test_built_once_then_loaded(cache) -> None:
    calls: list[int] = []
    first = cached_arrays("t", ["v1"], _counting_build(calls))
    again = cached_arrays("t", ["v1"], _counting_build(calls))
    assert calls == [1]
    for a, b in zip(first, again, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert table_path("t", ["v1"]).parent == cache


def test_another_key_is_another_table(cache) -> None:
    calls: list[int] = []
    cached_arrays("t", ["v1"], _counting_build(calls))
    cached_arrays("t", ["v2"], _counting_build(calls))
    assert calls == [1, 1]
    assert table_path("t", ["v1"]) != table_path("t", ["v2"])


def test_a_damaged_file_is_built_again(cache) -> None:
    calls: list[int] = []
    cached_arrays("t", ["v1"], _counting_build(calls))
    table_path("t", ["v1"]).write_bytes(b"PK\x03\x04 not a zip")
    out = cached_arrays("t", ["v1"], _counting_build(calls))
    assert calls == [1, 1] and np.array_equal(out[0], np.arange(5))
    cached_arrays("t", ["v1"], _counting_build(calls))
    assert calls == [1, 1]  # the rebuilt file replaced the damaged one


@pytest.mark.parametrize("damage", ["npy", "other arrays", "huge header", "no digest"])
def test_an_altered_file_is_built_again(cache, damage) -> None:
    """A file under the table's name that is not what was written (a lone .npy, arrays
    of another shape or content, a header claiming 8 TiB, an older file without the
    digest) is never used: it is built again and replaced."""
    calls: list[int] = []
    good = cached_arrays("t", ["v1"], _counting_build(calls))
    path = table_path("t", ["v1"])
    if damage == "npy":
        np.save(path.with_suffix(".tmp.npy"), np.arange(5))
        path.with_suffix(".tmp.npy").replace(path)
    elif damage == "other arrays":
        with np.load(path) as f:
            members = dict(f)
        members["a0"] = np.zeros(3, np.int32)
        np.savez(path.with_suffix(".tmp.npz"), **members)
        path.with_suffix(".tmp.npz").replace(path)
    elif damage == "huge header":
        np.save(path.with_suffix(".tmp.npy"), np.arange(5))
        raw = path.with_suffix(".tmp.npy").read_bytes().replace(b"(5,)", b"(1099511627776,)")
        import zipfile
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("a0.npy", raw)
    else:
        np.savez(path.with_suffix(".tmp.npz"), a0=np.arange(5, dtype=np.int32),
                 a1=np.array([7, 8], np.uint64))
        path.with_suffix(".tmp.npz").replace(path)
    out = cached_arrays("t", ["v1"], _counting_build(calls))
    assert calls == [1, 1]
    for a, b in zip(good, out, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    cached_arrays("t", ["v1"], _counting_build(calls))
    assert calls == [1, 1]  # replaced by a sound file


def test_a_folder_that_cannot_be_made_only_costs_the_build(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TOKENMILL_TABLE_CACHE", str(blocker / "tables"))
    calls: list[int] = []
    out = cached_arrays("t", ["v1"], _counting_build(calls))
    assert calls == [1] and np.array_equal(out[1], [7, 8])


def test_kernel_tables_are_the_same_built_or_loaded(tmp_path) -> None:
    """The Unicode tables of the word splitter and the MinHash kernel, and the MinHash
    permutations, equal in a process that builds them and in one that loads them."""
    code = ("import hashlib, numpy as np\n"
            "from tokenmill.pipeline.document import analysis\n"
            "from tokenmill.pipeline.dedup.minhash.kernels import char_tables\n"
            "from tokenmill.pipeline.dedup.minhash.signatures import permutations\n"
            "h = hashlib.sha256(analysis.FLAGS[:0x10000].tobytes())\n"
            "for a in (*char_tables(), *permutations(128, 1)):\n"
            "    h.update(str(a.dtype).encode() + a.tobytes())\n"
            "print(h.hexdigest())\n")
    env = {**os.environ, "TOKENMILL_TABLE_CACHE": str(tmp_path / "tables")}
    built, loaded = (subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                    capture_output=True, text=True).stdout for _ in range(2))
    assert len(list((tmp_path / "tables").glob("*.npz"))) == 3
    assert built == loaded
