"""The trainer's LEM features from a side channel made before the run (``tokenmill ngram
lem``): aligned with the loader's tokens step by step (resume, ranks, shards crossed),
refused when made for another mix or geometry, validation in the same (position) mode, and
the online feed giving the same global features for any number of ranks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.train.test_train import _cfg, sample_datamix
from tokenmill.atomic import sha256_file
from tokenmill.cli import main
from tokenmill.manifests.mix import build_mix
from tokenmill.ngram.lem import OnlineLEM
from tokenmill.ngram.precompute import precompute_lem
from tokenmill.ngram.sidechannel import register_side_channel_files
from tokenmill.tokenizers import identity
from tokenmill.train import train as T
from tokenmill.train.batches import open_data
from tokenmill.train.lemside import (
    LEMFeed,
    LEMSideChannel,
    LEMSideChannelError,
    lem_for_validation,
)
from tokenmill.train.lemworkers import LEMWorkers

SEQ, BATCH, WINDOW = 64, 4, 1 << 14
EOT = identity("gpt2").eot_token


@pytest.fixture(scope="module")
def mix(tmp_path_factory) -> Path:
    """A training-mix manifest over real text (about 200 K tokens)."""
    root = tmp_path_factory.mktemp("lemmix")
    data = sample_datamix(root / "data", {"c4-en-sample": 200, "wikipedia-wikitext-sample": 20})
    spec = root / "mix.yaml"
    spec.write_text(
        f"name: lem-mix\nmanifests: [{data / 'manifest.json'}]\ntarget_tokens: 200000\n"
        "seed: 3\nsources:\n  c4-en-sample: {weight: 0.7}\n"
        "  wikipedia-wikitext-sample: {weight: 0.3}\n")
    build_mix(spec, root / "mix.json")
    return root / "mix.json"


@pytest.fixture(scope="module")
def side(mix) -> Path:
    """``ngram lem`` output for the global geometry SEQ x BATCH, in shards of 10,007
    positions (rows of 65 cross shard boundaries)."""
    out = mix.parent / "lem"
    assert main(["ngram", "lem", str(mix), "-o", str(out), "--seq-len", str(SEQ),
                 "--batch-size", str(BATCH), "--window", str(WINDOW),
                 "--shard-tokens", "10007"]) == 0
    return out


def _expected(cfg, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """precompute_lem over the loader's global stream: ``[steps, BATCH, SEQ + 1]`` views."""
    stream = open_data(cfg).stream_prefix(n_steps * BATCH * (SEQ + 1))
    ml, nt = precompute_lem(stream, k=4, window=WINDOW, eot=EOT)
    ml = np.where(ml >= 255, 256, ml)  # the side channel's uint8 saturation, as read
    return ml.reshape(n_steps, BATCH, SEQ + 1), nt.reshape(n_steps, BATCH, SEQ + 1, 4)


def test_features_follow_the_loader_stream_resume_and_ranks(mix, side):
    """What the trainer feeds the model at each step equals precompute_lem over the
    loader's stream at the same positions: from step 0, after a resume at step 5, and for
    each of 2 ranks (global features, the rank's rows)."""
    cfg = _cfg(mix, side.parent / "run", seq_len=SEQ, batch_size=BATCH, steps=8, lem=True,
               lem_features=str(side), val_every=0)
    exp_ml, exp_nt = _expected(cfg, 8)
    assert (exp_ml > 0).mean() > 0.3 and (exp_nt[..., 0] >= 0).any()
    run = T.setup(cfg)
    try:
        assert isinstance(run.lem, LEMSideChannel)
        for s in range(3):
            x, _, kw = run.next_inputs()
            assert torch.equal(kw["lem_len"], torch.from_numpy(exp_ml[s, :, :SEQ]))
            assert torch.equal(kw["lem_cand"], torch.from_numpy(exp_nt[s, :, :SEQ]))
        state = run.loader.state_dict()
    finally:
        run.close()
    resumed = open_data(cfg).loader()
    resumed.load_state_dict({**state, "step": 5})  # features follow the loader's step
    feed = LEMSideChannel(side, open_data(cfg), cfg)
    d = resumed.next_batch()
    assert d["step"] == 5 and torch.equal(feed.get(d["step"])[0],
                                          torch.from_numpy(exp_ml[5, :, :SEQ]))
    half = cfg.model_copy(update={"batch_size": BATCH // 2})
    for rank in range(2):
        f = LEMSideChannel(side, open_data(half, rank, 2), half)
        rows = slice(rank * 2, rank * 2 + 2)
        for s in (0, 7):
            ml, nt = f.get(s)
            assert torch.equal(ml, torch.from_numpy(exp_ml[s, rows, :SEQ]))
            assert torch.equal(nt, torch.from_numpy(exp_nt[s, rows, :SEQ]))
        x = open_data(half, rank, 2).loader().next_batch()["inputs"]
        assert torch.equal(x, open_data(cfg).loader().next_batch()["inputs"][rows])  # same tokens


def _refusal(capsys, cfg, tmp_path) -> str:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg.to_dict()))
    assert main(["train", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_side_channel_of_another_mix_or_geometry_is_refused(mix, side, tmp_path, capsys):
    """Other mix sha256, other seq_len, other global batch, a changed file: one line each,
    naming lem.json (or the file)."""
    base = dict(seq_len=SEQ, batch_size=BATCH, steps=2, lem=True, val_every=0)
    meta = json.loads((side / "lem.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    for e in meta["files"]:
        for key in ("len", "next"):
            (other / e[key]).write_bytes((side / e[key]).read_bytes())
    (other / "lem.json").write_text(json.dumps({**meta, "mix_sha256": "ab" * 32}))
    err = _refusal(capsys, _cfg(mix, tmp_path / "a", lem_features=str(other), **base), tmp_path)
    assert str(other / "lem.json") in err and "sha256" in err and str(mix) in err
    err = _refusal(capsys, _cfg(mix, tmp_path / "b", lem_features=str(side),
                                **{**base, "seq_len": SEQ * 2}), tmp_path)
    assert "lem.json" in err and f"seq_len is {SEQ}" in err and str(SEQ * 2) in err
    err = _refusal(capsys, _cfg(mix, tmp_path / "c", lem_features=str(side),
                                **{**base, "batch_size": BATCH * 2}), tmp_path)
    assert "lem.json" in err and f"batch_size is {BATCH}" in err
    (other / "lem.json").write_text(json.dumps(meta))
    f = other / meta["files"][1]["next"]
    a = np.load(f)
    a[0, 0] ^= 1
    np.save(f, a)
    err = _refusal(capsys, _cfg(mix, tmp_path / "d", lem_features=str(other), **base), tmp_path)
    assert str(f) in err and "sha256" in err


def _register(mix, out, files) -> None:
    register_side_channel_files(mix, out, kind="lem-side-channel", meta_name="lem.json",
                                keys=("len", "next"), split="train", files=files)


def test_a_side_channel_the_mix_lists_is_checked_against_the_listing(mix, side, tmp_path):
    """A side channel listed in the mix manifest is checked against that listing before
    training: a file rewritten together with its sha256 in lem.json (which lem.json's own
    check accepts) is refused naming lem.json; a file changed under an unchanged lem.json
    is named with the mix manifest whose listing it differs from."""
    copy = tmp_path / "lem"
    shutil.copytree(side, copy)
    text = (copy / "lem.json").read_text()
    meta = json.loads(text)
    _register(mix, copy, meta["files"])
    try:
        cfg = _cfg(mix, tmp_path / "run", seq_len=SEQ, batch_size=BATCH, steps=2, lem=True,
                   lem_features=str(copy), val_every=0)
        LEMSideChannel(copy, open_data(cfg), cfg)  # as listed: accepted
        f = copy / meta["files"][0]["len"]
        a = np.load(f)
        a[0] ^= 1
        np.save(f, a)
        meta["files"][0]["len_sha256"] = sha256_file(f)
        (copy / "lem.json").write_text(json.dumps(meta, indent=1) + "\n")
        with pytest.raises(LEMSideChannelError) as e:
            LEMSideChannel(copy, open_data(cfg), cfg)
        assert str(e.value).startswith(f"{copy / 'lem.json'}: sha256 differs from its listing")
        (copy / "lem.json").write_text(text)  # the listed bytes again
        with pytest.raises(LEMSideChannelError) as e:
            LEMSideChannel(copy, open_data(cfg), cfg)
        assert str(e.value).startswith(f"{f}: sha256 differs") and str(mix) in str(e.value)
    finally:  # the module's side channel is the listed one again
        orig = json.loads((side / "lem.json").read_text())["files"]
        _register(mix, side, orig)


def test_validation_features_are_position_mode_over_train_history(mix, side):
    """Validation rows get position-mode features (as training), computed ahead of time
    with H = window / 2 tokens of the training stream as history: equal to OnlineLEM in
    position mode fed that history and then the rows; a short run with the side channel
    trains and evaluates."""
    cfg = _cfg(mix, side.parent / "val", seq_len=SEQ, batch_size=BATCH, steps=3, lem=True,
               lem_features=str(side), val_every=3, val_tokens=512)
    r = T.train(cfg)
    assert r.steps_done == 3 and np.isfinite(r.val[-1]["val_loss"])
    val = open_data(cfg).validation_rows(cfg.val_tokens)
    ml, nt = lem_for_validation(open_data(cfg), val, k=4, window=WINDOW, max_len=0)
    lem = OnlineLEM(eot=EOT, k=4, mode="position", window=WINDOW)
    lem.step(open_data(cfg).stream_prefix(WINDOW // 2))
    oml, ont = lem.step(val.numpy().reshape(-1))
    n, w = val.shape
    assert np.array_equal(ml, oml.reshape(n, w)[:, :-1])
    assert np.array_equal(nt, ont.reshape(n, w, 4)[:, :-1])
    assert (ml > 0).any()


def test_online_feed_is_global_and_equals_the_side_channel(mix, side):
    """The online predictor (position mode over the global stream) gives each rank its rows
    of the same global features, equal to the side channel's (lengths below the cap)."""
    cfg = _cfg(mix, side.parent / "online", seq_len=SEQ, batch_size=BATCH, steps=3, lem=True,
               lem_window=WINDOW, lem_max_len=0)
    half = cfg.model_copy(update={"batch_size": BATCH // 2})
    feeds = [LEMFeed(open_data(cfg), cfg), LEMFeed(open_data(half, 1, 2), half)]
    try:
        disk = LEMSideChannel(side, open_data(cfg), cfg)
        for s in range(3):
            (ml, nt), (ml1, nt1) = (f.get(s) for f in feeds)
            dml, dnt = disk.get(s)
            assert torch.equal(torch.where(ml >= 255, 256, ml), dml) and torch.equal(nt, dnt)
            assert torch.equal(ml1, ml[2:]) and torch.equal(nt1, nt[2:])
    finally:
        for f in feeds:
            f.close()


# starts a Ray with its LEM workers and trains twice in it: slow, in `.ci/run`
@pytest.mark.slow
def test_ray_workers_run_ahead_and_equal_the_side_channel(mix, side):
    """Ray CPU workers computing the chunks concurrently (2 workers, chunks of 3,000
    tokens) give the side channel's features step by step, also from a resume at step 6,
    and report the trainer's wait; a run with them stops and resumes."""
    cfg = _cfg(mix, side.parent / "workers", seq_len=SEQ, batch_size=BATCH, steps=8, lem=True,
               lem_window=WINDOW, lem_max_len=0, lem_workers=2, lem_chunk_tokens=3000)
    disk = LEMSideChannel(side, open_data(cfg), cfg)
    feed = LEMWorkers(open_data(cfg), cfg)
    try:
        for s in range(8):
            ml, nt = feed.get(s)
            dml, dnt = disk.get(s)
            assert torch.equal(torch.where(ml >= 255, 256, ml), dml) and torch.equal(nt, dnt)
        assert feed.wait_s >= 0 and feed.mean_lag >= 0
        later = LEMWorkers(open_data(cfg), cfg)
        try:
            later.skip_to(6)
            assert torch.equal(later.get(6)[1], disk.get(6)[1])
        finally:
            later.close()
        run = cfg.model_copy(update={"steps": 4, "val_every": 4, "stop_after": 2})
        assert T.train(run).steps_done == 2  # in this Ray session (started by `feed`)
        r = T.train(run.model_copy(update={"stop_after": None}), resume=True)
        assert r.steps_done == 4 and 0 <= r.lem_wait_frac < 1 and np.isfinite(r.lem_mean_lag)
    finally:
        feed.close()


def test_setup_checks_the_shards_once_and_side_inputs_share_one_interface(mix, side,
                                                                          monkeypatch):
    """Setting up a run with a side input hashes the mix's shards once (one pass over
    every shard and sidecar, however many loaders and side inputs read the data), and
    every kind of side input offers the trainer's interface."""
    from tokenmill.manifests import verify

    hashed: list[int] = []
    mismatches = verify._mismatches
    monkeypatch.setattr(verify, "_mismatches",
                        lambda shards, *rest: hashed.append(len(shards))
                        or mismatches(shards, *rest))
    cfg = _cfg(mix, side.parent / "once", seq_len=SEQ, batch_size=BATCH, steps=2, lem=True,
               lem_features=str(side), val_every=2, val_tokens=256)
    run = T.setup(cfg)
    try:
        assert len(hashed) == 1 and hashed[0] > 0, hashed
        assert set(run.val_side) == {"lem_len", "lem_cand"}
    finally:
        run.close()
    for kind in T.SIDE_INPUTS:
        assert kind.key in ("lem", "ngram") and len(kind.names) == 2
        for member in ("from_config", "get", "for_validation", "skip_to", "close", "lag",
                       "mean_lag"):
            assert hasattr(kind, member), (kind.__name__, member)
