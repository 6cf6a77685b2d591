"""The trainer's n-gram side input: side-channel folders in the format of
``tokenmill ngram features`` (tokenmill/ngram/ngramfeat_commands.py), made here by a small
causal bigram stand-in for the producer, are read in lockstep with the loader (steps, ranks, files
crossed), refused when made for another mix or geometry, and a tiny CPU run with them trains
the gate and the scale and resumes exactly."""

from __future__ import annotations

import json
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.train.test_train import _cfg, sample_datamix
from tokenmill.atomic import sha256_file
from tokenmill.cli import main
from tokenmill.manifests.mix import build_mix
from tokenmill.manifests.mixschema import mix_identity_sha256
from tokenmill.ngram.sidechannel import register_side_channel_files
from tokenmill.tokenizers import identity
from tokenmill.train import train as T
from tokenmill.train.batches import open_data
from tokenmill.train.ngramside import (
    NgramSideChannel,
    NgramSideChannelError,
    ngram_for_validation,
)

SEQ, BATCH, M, CHUNK = 32, 4, 4, 200
EOT = identity("gpt2").eot_token
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def mix(tmp_path_factory) -> Path:
    """A small training-mix manifest over real text."""
    root = tmp_path_factory.mktemp("ngrammix")
    data = sample_datamix(root / "data", {"c4-en-sample": 40, "wikipedia-wikitext-sample": 4},
                          val_every=4)
    spec = root / "mix.yaml"
    spec.write_text(
        f"name: ngram-mix\nmanifests: [{data / 'manifest.json'}]\ntarget_tokens: 20000\n"
        "seed: 3\nsources:\n  c4-en-sample: {weight: 0.7}\n"
        "  wikipedia-wikitext-sample: {weight: 0.3}\n")
    build_mix(spec, root / "mix.json")
    return root / "mix.json"


def bigram_features(stream: np.ndarray, history: np.ndarray | None = None,
                    chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """A causal stand-in for the producer: the top-``M`` next tokens after ``stream[p]`` by
    bigram counts over the chunks before ``p``'s chunk (or over ``history`` only), as
    ``uint16 [n, M]`` (65535 = none) and ``float16 [n, M]`` natural-log probabilities."""
    n = stream.size
    cand = np.full((n, M), 65535, np.uint16)
    logp = np.full((n, M), -np.inf, np.float16)
    counts: dict[int, Counter] = defaultdict(Counter)

    def add(toks: np.ndarray) -> None:
        for a, b in zip(toks[:-1].tolist(), toks[1:].tolist(), strict=True):
            counts[a][b] += 1

    if history is not None:
        add(history)
    for lo in range(0, n, n if history is not None else chunk):
        hi = min(n, lo + (n if history is not None else chunk))
        for p in range(lo, hi):
            c = counts.get(int(stream[p]))
            if c:
                top = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:M]
                tot = sum(c.values())
                cand[p, : len(top)] = [t for t, _ in top]
                logp[p, : len(top)] = [np.log(k / tot) for _, k in top]
        if history is None:
            add(stream[lo : hi + 1])  # pairs ending in the next chunk's first token too
    return cand, logp


def write_side(out: Path, mix: Path, stream: np.ndarray, cand: np.ndarray, logp: np.ndarray,
               *, split: str, batch_size: int, shard: int = 1001) -> Path:
    """A side-channel folder in the format of ``tokenmill ngram features``."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i, lo in enumerate(range(0, stream.size, shard)):
        e = {"cand": f"ngram_cand_{i:06d}.npy", "logp": f"ngram_logp_{i:06d}.npy",
             "start": lo, "tokens": min(shard, stream.size - lo)}
        for key, a in (("cand", cand), ("logp", logp)):
            np.save(out / e[key], a[lo : lo + shard])
            e[f"{key}_sha256"] = sha256_file(out / e[key])
        files.append(e)
    meta = {"kind": "ngram-side-channel", "mix": str(mix), "mix_sha256": mix_identity_sha256(mix),
            "split": split, "seq_len": SEQ, "batch_size": batch_size, "remainder": "carry",
            "orders": [2], "beta": 1.0, "m": M, "chunk_tokens": CHUNK, "eot": EOT,
            "tokens": int(stream.size), "stream_sha256": "", "files": files}
    (out / "ngram.json").write_text(json.dumps(meta))
    return out


@pytest.fixture(scope="module")
def sides(mix) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """Train and val side channels of the mix: ``(train dir, val dir, cand, logp)`` (the
    train arrays)."""
    cfg = _cfg(mix, Path("unused"), seq_len=SEQ, batch_size=BATCH)
    loader = open_data(cfg, verify=False).loader()
    stream = open_data(cfg).stream_prefix(loader.num_steps * BATCH * (SEQ + 1))
    cand, logp = bigram_features(stream)
    train = write_side(mix.parent / "ngram", mix, stream, cand, logp, split="train",
                       batch_size=BATCH)
    vstream = open_data(cfg, verify=False).loader("val")  # BATCH rows per step: the same stream
    vrows = np.concatenate([torch.cat([d["inputs"], d["targets"][:, -1:]], 1).numpy()
                            .reshape(-1) for d in vstream]).astype(np.int32)
    vc, vl = bigram_features(vrows, history=stream)
    val = write_side(mix.parent / "ngram_val", mix, vrows, vc, vl, split="val",
                     batch_size=BATCH)
    return train, val, cand, logp


def test_features_follow_the_loader_stream_and_ranks(mix, sides):
    """What the trainer feeds the model at each step is the side channel at the loader's
    positions (files of 1,001 positions: rows cross them), for 1 and 2 ranks; none
    candidates read as -1 with log-probability 0; validation features are the val side
    channel's first rows."""
    train, val, cand, logp = sides
    w = SEQ + 1
    cfg = _cfg(mix, mix.parent / "run0", seq_len=SEQ, batch_size=BATCH, steps=6,
               ngram_features=str(train), ngram_val_features=str(val), val_every=3,
               val_tokens=256)
    run = T.setup(cfg)
    try:
        assert isinstance(run.side["ngram"], NgramSideChannel) and run.model.cfg.ngram_m == M
        for s in range(3):
            _, _, kw = run.next_inputs()
            want = cand[s * BATCH * w : (s + 1) * BATCH * w].reshape(BATCH, w, M)[:, :SEQ]
            got = kw["ngram_cand"].numpy()
            assert np.array_equal(np.where(got < 0, 65535, got), want)
            lp = logp[s * BATCH * w : (s + 1) * BATCH * w].reshape(BATCH, w, M)[:, :SEQ]
            ok = want != 65535
            assert np.allclose(kw["ngram_logp"].numpy()[ok], lp[ok].astype(np.float32))
            assert torch.all(kw["ngram_logp"][~torch.from_numpy(ok)] == 0)
        assert (cand[: 3 * BATCH * w] != 65535).mean() > 0.1
        # the val channel's first rows: the validation rows
        vc, vlp = run.val_side["ngram_cand"], run.val_side["ngram_logp"]
        nv = 256 // SEQ
        assert vc.shape == (nv, SEQ, M) and (vc >= 0).any() and np.all(vlp[vc < 0] == 0)
        meta = json.loads((val / "ngram.json").read_text())
        disk = np.load(val / meta["files"][0]["cand"])[: nv * w].reshape(nv, w, M)[:, :SEQ]
        assert np.array_equal(np.where(vc < 0, 65535, vc), disk)
        vs = np.concatenate([torch.cat([d["inputs"], d["targets"][:, -1:]], 1).numpy()
                             .reshape(-1) for d in open_data(cfg, verify=False).loader("val")])
        assert np.array_equal(run.val.numpy().reshape(-1), vs[: nv * w])  # same rows
    finally:
        run.close()
    half = cfg.model_copy(update={"batch_size": BATCH // 2})
    full = NgramSideChannel(train, open_data(cfg), cfg)
    for rank in range(2):
        f = NgramSideChannel(train, open_data(half, rank, 2), half)
        for s in (0, 5):
            c, lp = f.get(s)
            fc, flp = full.get(s)
            rows = slice(rank * 2, rank * 2 + 2)
            assert torch.equal(c, fc[rows]) and torch.equal(lp, flp[rows])


def _refusal(capsys, cfg, tmp_path) -> str:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg.to_dict()))
    assert main(["train", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_side_channel_of_another_mix_or_geometry_is_refused(mix, sides, tmp_path, capsys):
    """Another mix identity, another seq_len or global batch, a val channel given as the
    train one, a changed file: one line each naming ngram.json (or the file)."""
    train, val, *_ = sides
    base = dict(seq_len=SEQ, batch_size=BATCH, steps=2, val_every=0)
    meta = json.loads((train / "ngram.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    for e in meta["files"]:
        for key in ("cand", "logp"):
            (other / e[key]).write_bytes((train / e[key]).read_bytes())
    (other / "ngram.json").write_text(json.dumps({**meta, "mix_sha256": "ab" * 32}))
    err = _refusal(capsys, _cfg(mix, tmp_path / "a", ngram_features=str(other), **base),
                   tmp_path)
    assert str(other / "ngram.json") in err and "sha256" in err and str(mix) in err
    err = _refusal(capsys, _cfg(mix, tmp_path / "b", ngram_features=str(train),
                                **{**base, "seq_len": SEQ * 2}), tmp_path)
    assert "ngram.json" in err and f"seq_len is {SEQ}" in err
    err = _refusal(capsys, _cfg(mix, tmp_path / "c", ngram_features=str(train),
                                **{**base, "batch_size": BATCH * 2}), tmp_path)
    assert "ngram.json" in err and f"batch_size is {BATCH}" in err
    err = _refusal(capsys, _cfg(mix, tmp_path / "d", ngram_features=str(val), **base),
                   tmp_path)
    assert "ngram.json" in err and "split is 'val'" in err
    err = _refusal(capsys, _cfg(mix, tmp_path / "e", ngram_features=str(train), ngram_m=M + 1,
                                **base), tmp_path)
    assert "ngram.json" in err and f"m is {M}" in err
    (other / "ngram.json").write_text(json.dumps(meta))
    f = other / meta["files"][1]["cand"]
    a = np.load(f)
    a[0, 0] ^= 1
    np.save(f, a)
    err = _refusal(capsys, _cfg(mix, tmp_path / "f", ngram_features=str(other), **base),
                   tmp_path)
    assert str(f) in err and "sha256" in err
    for bad in ([None], [{"start": 0, "tokens": "abc"}]):  # hand-edited entries
        (other / "ngram.json").write_text(json.dumps({**meta, "files": bad}))
        err = _refusal(capsys, _cfg(mix, tmp_path / "g", ngram_features=str(other), **base),
                       tmp_path)
        assert str(other / "ngram.json") in err and "files[0]" in err


def test_a_side_channel_the_mix_lists_is_checked_against_the_listing(mix, sides, tmp_path):
    """A side channel listed in the mix manifest is checked against that listing before
    training: a file rewritten together with its sha256 in ngram.json is refused naming
    ngram.json; a listed file that is gone is named (an unlisted folder keeps the
    ngram.json checks alone: the other tests)."""
    copy = tmp_path / "ngram"
    shutil.copytree(sides[0], copy)
    meta = json.loads((copy / "ngram.json").read_text())
    register_side_channel_files(mix, copy, kind="ngram-side-channel", meta_name="ngram.json",
                                keys=("cand", "logp"), split="train", files=meta["files"])
    cfg = _cfg(mix, tmp_path / "run", seq_len=SEQ, batch_size=BATCH, steps=2, val_every=0,
               ngram_features=str(copy))
    NgramSideChannel(copy, open_data(cfg), cfg)  # as listed: accepted
    f = copy / meta["files"][0]["logp"]
    listed_f = f.read_bytes()
    a = np.load(f)
    a[0, 0] = -1.5
    np.save(f, a)
    listed_meta = (copy / "ngram.json").read_text()
    meta["files"][0]["logp_sha256"] = sha256_file(f)
    (copy / "ngram.json").write_text(json.dumps(meta))
    with pytest.raises(NgramSideChannelError) as e:
        NgramSideChannel(copy, open_data(cfg), cfg)
    assert str(e.value).startswith(f"{copy / 'ngram.json'}: sha256 differs from its listing")
    (copy / "ngram.json").write_text(listed_meta)  # the listed bytes again
    f.write_bytes(listed_f)
    g = copy / meta["files"][-1]["cand"]
    g.unlink()
    with pytest.raises(NgramSideChannelError) as e:
        NgramSideChannel(copy, open_data(cfg), cfg)
    assert str(e.value).startswith(f"{g}: missing (listed in {mix})")


def test_cpu_run_with_ngram_features_trains_and_resumes(mix, sides, tmp_path):
    """A tiny CPU run with the n-gram input: its first train and val losses are the
    baseline's exactly (gate and scale start at 0), the gate and the scale move, and a run
    stopped at step 3 and resumed reproduces the uninterrupted losses bit for bit."""
    train, val, *_ = sides
    kw = dict(seq_len=SEQ, batch_size=BATCH, steps=6, val_every=3, val_tokens=256,
              model_overrides={"n_layer": 1, "n_embd": 64, "tie_embeddings": True})
    base = T.train(_cfg(mix, tmp_path / "base", **{**kw, "steps": 1, "val_every": 1}))
    ng = dict(kw, ngram_features=str(train), ngram_val_features=str(val))
    full = T.train(_cfg(mix, tmp_path / "full", **ng))
    assert full.train_loss[0] == base.train_loss[0] and full.val[0] == base.val[0]
    ck = torch.load(T.latest_checkpoint(tmp_path / "full"), weights_only=False)
    assert ck["model"]["ngram_gate"] != 0 and ck["model"]["ngram_scale"] != 0
    assert ck["model_config"]["ngram"] and ck["model_config"]["ngram_m"] == M
    part = T.train(_cfg(mix, tmp_path / "resumed", stop_after=3, **ng))
    assert part.stopped_early and part.steps_done == 3
    resumed = T.train(_cfg(mix, tmp_path / "resumed", **ng), resume=True)
    assert resumed.train_loss == full.train_loss and resumed.val == full.val


def test_producer_output_trains_and_validation_features_agree(mix, tmp_path):
    """End to end with the producer (``tokenmill ngram features``, train and ``--split
    val``): a short run reads both; validation features computed at setup by
    ``precompute_ngram`` over the whole training stream (counts from training data only)
    equal the val side channel's."""
    out, vout = tmp_path / "ng", tmp_path / "ngv"
    geo = ["--seq-len", str(SEQ), "--batch-size", str(BATCH), "-m", str(M), "--orders", "2-4",
           "-q"]
    assert main(["ngram", "features", str(mix), "-o", str(out), "--chunk-tokens", "4000",
                 "--shard-tokens", "5000", *geo]) == 0
    assert main(["ngram", "features", str(mix), "-o", str(vout), "--split", "val", *geo]) == 0
    cfg = _cfg(mix, tmp_path / "run", seq_len=SEQ, batch_size=BATCH, steps=3, val_every=3,
               val_tokens=256, ngram_features=str(out), ngram_val_features=str(vout),
               model_overrides={"n_layer": 1, "n_embd": 64, "tie_embeddings": True})
    r = T.train(cfg)
    assert r.steps_done == 3 and np.isfinite(r.val[-1]["val_loss"])
    val = open_data(cfg).validation_rows(cfg.val_tokens)
    feed = NgramSideChannel(out, open_data(cfg), cfg)
    c1, lp1 = ngram_for_validation(val, feed, cfg.ngram_val_features)
    c2, lp2 = ngram_for_validation(val, feed)  # computed from the train stream
    assert c1.shape == (val.shape[0], SEQ, M) and (c1 >= 0).mean() > 0.2
    assert np.array_equal(c1, c2) and np.allclose(lp1, lp2, atol=1e-2)  # float16 on disk
    assert np.all(lp2[c2 < 0] == 0) and np.all(lp2 <= 0)


def test_an_entry_without_its_sha256_is_refused_when_verifying(tmp_path):
    """``verify`` with an entry that lists no sha256 for a file: refused, one line naming
    the metadata file (not accepted unhashed)."""
    from tokenmill.train.ngramside import SideFiles

    np.save(tmp_path / "c.npy", np.zeros((3, 2), np.int32))
    np.save(tmp_path / "l.npy", np.zeros((3, 2), np.float16))
    meta = {"files": [{"start": 0, "tokens": 3, "cand": "c.npy", "logp": "l.npy"}]}
    keys = {"cand": ((2,), "iu"), "logp": ((2,), "f")}
    with pytest.raises(NgramSideChannelError, match="has no cand_sha256") as e:
        SideFiles(tmp_path / "ngram.json", meta, keys, True, NgramSideChannelError)
    assert "\n" not in str(e.value)
    assert SideFiles(tmp_path / "ngram.json", meta, keys, False,
                     NgramSideChannelError).positions == 3
