"""A Hub source's fields read as meant: an empty ``split`` (or ``config``) is refused when
the datamix is read (it would silently read train), and a 40-hex revision is a commit sha
in either case (an upper-case one is still checked against the snapshot's commit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenmill.pipeline.config import DatamixConfig, load_datamix
from tokenmill.pipeline.read.sources import SourceError, resolve_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.mark.parametrize("field", ["split", "config"])
@pytest.mark.parametrize("value", ['""', "' '", "", "null", "~"])
def test_an_empty_split_or_config_is_refused_on_read(tmp_path: Path, field: str,
                                                     value: str) -> None:
    spec = tmp_path / "mix.yaml"
    other = "config: en" if field == "split" else "split: train"
    spec.write_text("name: x\ntokenizer: gpt2\nsources:\n  - name: h\n    hub: org/ds@main\n"
                    f"    {other}\n    {field}: {value}\n")
    with pytest.raises(ValueError) as e:
        load_datamix(spec)
    msg = str(e.value)
    assert msg.startswith(f"{spec}: invalid datamix file")
    assert f"source 'h': {field} is empty" in msg


def _fake_snapshot(monkeypatch, tmp_path: Path, commit: str) -> list[str | None]:
    """Stand in for ``huggingface_hub.snapshot_download``: a snapshot folder named
    ``commit`` with a dataset card and one data file; returns the revisions asked for."""
    import huggingface_hub

    snap = tmp_path / "snapshots" / commit
    (snap / "data").mkdir(parents=True)
    (snap / "README.md").write_text("---\nlicense: mit\n---\n")
    (snap / "data" / "a.jsonl").write_text('{"text": "hello"}\n')
    asked: list[str | None] = []

    def snapshot_download(*, repo_id, repo_type, revision, allow_patterns, local_files_only=False):
        asked.append(revision)
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return asked


def _source(hub: str):
    cfg = DatamixConfig.model_validate({"name": "x", "sources": [{"name": "s", "hub": hub}]})
    return cfg, cfg.sources[0]


def test_an_upper_case_pinned_sha_is_checked(monkeypatch, tmp_path: Path) -> None:
    """The upper-case spelling of another commit is refused, not passed unchecked."""
    _fake_snapshot(monkeypatch, tmp_path, OTHER)
    with pytest.raises(SourceError) as e:
        resolve_source(*_source(f"org/ds@{COMMIT.upper()}"))
    assert f"pinned revision {COMMIT} resolved to snapshot {OTHER}" in str(e.value)
    assert "source 's'" in str(e.value) and "\n" not in str(e.value)


def test_an_upper_case_pinned_sha_of_the_snapshot_is_its_commit(monkeypatch,
                                                                tmp_path: Path) -> None:
    asked = _fake_snapshot(monkeypatch, tmp_path, COMMIT)
    r = resolve_source(*_source(f"org/ds@{COMMIT.upper()}"))
    assert asked == [COMMIT] and r.revision == COMMIT  # the Hub's (lower-case) spelling
    asked.clear()
    assert resolve_source(*_source("org/ds@main")).revision == COMMIT and asked == ["main"]
