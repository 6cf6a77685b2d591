"""Side channels listed in a training-mix manifest: a consumer's check against the listing
(:func:`~tokenmill.manifests.mixschema.verify_listed_side_channel`) and registrations that
run at the same time (:func:`~tokenmill.manifests.mixschema.register_side_channel`)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tokenmill.atomic import sha256_file
from tokenmill.manifests.mixschema import (
    SideChannelFile,
    SideChannelListingError,
    SideChannelRef,
    TrainingMixManifest,
    load_mix_manifest,
    mix_identity_sha256,
    register_side_channel,
    verify_listed_side_channel,
)
from tokenmill.tokenizers import identity


def _mix(folder: Path) -> Path:
    """A valid (empty) training-mix manifest: enough for the listing."""
    folder.mkdir(parents=True, exist_ok=True)
    m = TrainingMixManifest(name="t", spec={}, spec_sha256="0" * 64, seed=0, target_tokens=0,
                            total_tokens=0, tokenizer=identity("gpt2"), curation_manifests=[],
                            sources=[], segments=[], warnings=[])
    return m.write(folder / "mix.json")


def _side(mix: Path, name: str, *, mix_sha256: str | None = None, register: bool = True
          ) -> Path:
    """A LEM-like side channel folder ``name`` beside ``mix`` with two array files,
    listed in the mix (``register``)."""
    out = mix.parent / name
    out.mkdir()
    for f in ("lem_len_000000.npy", "lem_next_000000.npy"):
        (out / f).write_bytes(f"{name}/{f}".encode())
    meta = {"kind": "lem-side-channel", "mix_sha256": mix_sha256 or mix_identity_sha256(mix)}
    (out / "lem.json").write_text(json.dumps(meta))
    if register:
        register_side_channel(mix, SideChannelRef(
            kind="lem-side-channel", split="train", path=f"{name}/lem.json",
            sha256=sha256_file(out / "lem.json"),
            files=[SideChannelFile(path=f"{name}/{p.name}", sha256=sha256_file(p))
                   for p in sorted(out.glob("*.npy"))]))
    return out


def _refused(mix: Path, meta: Path) -> str:
    with pytest.raises(SideChannelListingError) as e:
        verify_listed_side_channel(mix, meta)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_a_listed_side_channel_is_checked_against_the_listing(tmp_path):
    """Intact: the array files come back hashed; an unlisted folder is not checked (None);
    a changed or missing file, a changed metadata file, or another mix identity: one line
    naming the file."""
    mix = _mix(tmp_path / "m")
    side = _side(mix, "lem")
    other = _side(mix, "unlisted", register=False)
    checked = verify_listed_side_channel(mix, side / "lem.json")
    assert checked == {str((side / f).resolve()): sha256_file(side / f)
                       for f in ("lem_len_000000.npy", "lem_next_000000.npy")}
    assert verify_listed_side_channel(mix, other / "lem.json") is None
    assert verify_listed_side_channel(mix, side / "lem.json", hash_files=False) == {}

    f = side / "lem_next_000000.npy"
    f.write_bytes(b"changed")
    msg = _refused(mix, side / "lem.json")
    assert msg.startswith(f"{f}: sha256 differs") and str(mix) in msg
    f.unlink()
    assert _refused(mix, side / "lem.json").startswith(f"{f}: missing")
    with pytest.raises(SideChannelListingError, match="missing"):  # even without hashing
        verify_listed_side_channel(mix, side / "lem.json", hash_files=False)

    meta = side / "lem.json"
    meta.write_text(json.dumps({"kind": "lem-side-channel", "mix_sha256": "ab" * 32}))
    assert _refused(mix, meta).startswith(f"{meta}: sha256 differs")


def test_a_listed_side_channel_of_another_mix_identity_is_refused(tmp_path):
    mix = _mix(tmp_path / "m")
    side = _side(mix, "lem", mix_sha256="ab" * 32)  # listed as it is, made for another mix
    msg = _refused(mix, side / "lem.json")
    assert msg.startswith(f"{side / 'lem.json'}: made for the mix identity") and "abab" in msg


def test_concurrent_registrations_are_all_listed(tmp_path):
    """Four registrations of different (kind, split) at once, in several rounds: every one
    is listed each time (the read-modify-write holds a lock)."""
    mix = _mix(tmp_path / "m")
    fresh = mix.read_bytes()
    keys = [(k, s) for k in ("lem-side-channel", "ngram-side-channel") for s in ("train", "val")]
    for _ in range(6):
        mix.write_bytes(fresh)
        barrier = threading.Barrier(len(keys))
        errors: list[BaseException] = []

        def reg(kind: str, split: str, barrier=barrier, errors=errors) -> None:
            try:
                barrier.wait()
                register_side_channel(mix, SideChannelRef(
                    kind=kind, split=split, path=f"{kind}/{split}/meta.json", sha256="0" * 64,
                    files=[]))
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=reg, args=k) for k in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        listed = [(r.kind, r.split) for r in load_mix_manifest(mix).side_channels]
        assert listed == keys


def test_a_folder_reused_for_another_split_checks_the_entry_that_wrote_it(tmp_path):
    """train then val written into one folder: the mix lists its path twice, the stale
    train entry first; the val side channel now there is checked against its own entry
    (matched by the metadata file's sha256), not refused as changed."""
    mix = _mix(tmp_path / "m")
    side = _side(mix, "lem")  # listed as train
    meta = json.loads((side / "lem.json").read_text())
    (side / "lem.json").write_text(json.dumps({**meta, "split": "val"}))
    register_side_channel(mix, SideChannelRef(
        kind="lem-side-channel", split="val", path="lem/lem.json",
        sha256=sha256_file(side / "lem.json"),
        files=[SideChannelFile(path=f"lem/{p.name}", sha256=sha256_file(p))
               for p in sorted(side.glob("*.npy"))]))
    assert [r.split for r in load_mix_manifest(mix).side_channels] == ["train", "val"]
    assert len(verify_listed_side_channel(mix, side / "lem.json")) == 2
