"""The top-level helpers for untrusted input and user-fixable failures: bounded YAML, the
output folder's lock, one-line failures."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

from tokenmill import boundedyaml, outputlock
from tokenmill.failures import disk_full_line, failure_line


def _laughs(levels: int, open_: str = "[", close: str = "]", dict_: bool = False) -> str:
    rows = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        items = ",".join(f"k{j}: *a{i - 1}" if dict_ else f"*a{i - 1}" for j in range(10))
        rows.append(f"a{i}: &a{i} {'{' if dict_ else open_}{items}{'}' if dict_ else close}")
    return "\n".join(rows) + f"\nlicense: *a{levels}\n"


@pytest.mark.parametrize("text", [
    _laughs(7), _laughs(9), _laughs(7, dict_=True),
    "s: &s " + "x" * 200_000 + "\nl: [" + ",".join(["*s"] * 600) + "]\n",  # long strings
    "a: &a [*a]\n",  # recursive
    "x: " + "[" * 5000 + "]" * 5000 + "\n",  # deep
    "base: &b {" + ",".join(f"k{i}: {i}" for i in range(2000)) + "}\n"
    + "\n".join(f"m{i}: {{<<: *b}}" for i in range(1000)) + "\n",  # merge keys
])
def test_every_yaml_bomb_shape_is_refused_in_one_line(text):
    with pytest.raises(boundedyaml.YamlLimitError) as e:
        boundedyaml.load(text, "card.md")
    msg = str(e.value)
    assert msg.startswith("card.md: YAML refused") and "\n" not in msg and len(msg) < 300


def test_ordinary_yaml_with_aliases_still_loads():
    text = "d: &d {license: mit, tags: [a, b]}\nx: *d\ny: [*d, *d]\n"
    assert boundedyaml.load(text, "f")["y"][1]["license"] == "mit"


def _lock_of(path, **holder) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / outputlock.LOCK_NAME).write_text(json.dumps(holder))


def test_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _lock_of(tmp_path / "a", pid=live.pid, host=socket.gethostname(),
                 since="2026-01-01T00:00:00Z", command="tokenmill run other.yaml")
        with pytest.raises(outputlock.OutputLockedError) as e:
            outputlock.acquire(tmp_path / "a")
        assert f"pid {live.pid}" in str(e.value) and "other.yaml" in str(e.value)
    finally:
        live.kill()
        live.wait()
    path = outputlock.acquire(tmp_path / "a")  # its holder is gone: stale, taken over
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert outputlock.acquire(tmp_path / "a") == path  # nested in one process
    outputlock.release(path)
    assert path.exists()
    outputlock.release(path)
    assert not path.exists()


def test_lock_of_another_host_is_never_taken_over(tmp_path):
    _lock_of(tmp_path, pid=1, host="some-other-host", since="x", command="tokenmill run y")
    with pytest.raises(outputlock.OutputLockedError, match="some-other-host"):
        outputlock.acquire(tmp_path)


def _wrapped(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise RuntimeError("task failed:\n  File x\n  File y") from e
    except RuntimeError as outer:
        return outer


def test_a_full_disk_is_one_line_naming_the_folder(tmp_path):
    for inner in (OSError(errno.ENOSPC, "No space left on device"),
                  OSError(errno.EDQUOT, "Disk quota exceeded"),
                  OSError("IOError: [Errno 28] No space left on device")):  # pyarrow's form
        line = disk_full_line(_wrapped(inner), tmp_path)
        assert line.startswith(f"{tmp_path}: disk full") and "bytes free" in line
    assert disk_full_line(_wrapped(ValueError("bad row")), tmp_path) is None


def test_permission_and_work_files_are_one_line():
    line = failure_line(_wrapped(PermissionError(errno.EACCES, "Permission denied", "/o/x")))
    assert line == "/o/x: permission denied"
    gone = "/tmp/out/work/read/0123456789abcdef0123.docs.parquet"
    line = failure_line(_wrapped(FileNotFoundError(
        f"[Errno 2] Failed to open local file '{gone}'. Detail: [errno 2] No such file")))
    assert gone in line and "rerun" in line
    assert failure_line(_wrapped(FileNotFoundError(
        "'/work/src/tokenmill/blocks.py' not found"))) is None  # not a work file


def test_cli_prints_one_line_and_debug_shows_the_traceback(tmp_path, monkeypatch):
    from tokenmill import cli

    def boom(args):
        raise _wrapped(OSError(errno.ENOSPC, "No space left on device"))

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["report"].set_defaults(func=boom)
    assert cli.main(["report", str(tmp_path)]) == 2
    monkeypatch.setenv("TOKENMILL_DEBUG", "1")
    with pytest.raises(RuntimeError):
        cli.main(["report", str(tmp_path)])


@pytest.mark.parametrize("text", ["a: 1\nb: 2\na: 3\n", "{a: 1, a: 2}\n", "x:\n  k: 1\n  'k': 2\n"])
def test_a_key_named_twice_is_refused_with_its_line(text):
    with pytest.raises(yaml.YAMLError) as e:
        boundedyaml.load(text, "mix.yaml")
    assert "appears twice" in str(e.value).splitlines()[0]


def test_keys_a_merge_brings_in_may_be_overridden():
    text = "base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n"
    assert boundedyaml.load(text, "f")["c"] == {"x": 3, "y": 2}
