"""The training loop on real text: learning, exact resume, masked validation, side inputs.

The data fixture tokenizes real corpora from ``../shared/data/corpora`` with tiktoken (EOT
before every document) into shards + a curation manifest, standing in for the pipeline's
quickstart output (swap :func:`sample_datamix` for it later).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenmill.atomic import sha256_file
from tokenmill.manifests.schema import DatamixManifest, ShardEntry, SourceCounts, SourceEntry
from tokenmill.manifests.shards import sidecar_path, version_for_vocab, write_shard
from tokenmill.tokenizers import get_encoding, identity
from tokenmill.train import train as T


def _docs(root: Path, name: str, limit: int) -> list[tuple[str, str]]:
    out = []
    if name == "c4-en-sample":
        for f in sorted((root / name / "data").glob("*.gz")):
            with gzip.open(f, "rt", encoding="utf-8") as fh:
                for row, line in enumerate(fh):
                    out.append((f"{name}/{f.name}#{row}", json.loads(line)["text"]))
    else:
        for f in sorted((root / name / "data").glob("*.txt")):
            out.append((f"{name}/{f.name}#0", f.read_text(encoding="utf-8", errors="replace")))
    return out[:limit]


def sample_datamix(out: Path, sources: dict[str, int], val_every: int = 10) -> Path:
    """Shards + ``manifest.json`` from real corpora: ``sources`` maps corpus -> max docs;
    every ``val_every``-th document goes to val. Returns the manifest folder."""
    from tests.shared import corpora

    root = corpora()
    enc = get_encoding("gpt2")
    ident = identity("gpt2")
    version = version_for_vocab(ident.n_vocab)
    entries = []
    for name, limit in sources.items():
        docs = _docs(root, name, limit)
        ids = enc.encode_ordinary_batch([t for _, t in docs], num_threads=1)
        shards = []
        for split in ("train", "val"):
            pick = [i for i in range(len(docs)) if (i % val_every == val_every - 1) == (
                split == "val")]
            if not pick:
                continue
            offs, parts, pos = [], [], 0
            for i in pick:
                offs.append(pos)
                parts.append(np.array([ident.eot_token, *ids[i]], dtype=np.int64))
                pos += len(ids[i]) + 1
            toks = np.concatenate(parts)
            rel = f"shards/{name}/{split}_0000.bin"
            write_shard(out / rel, toks, version, np.array(offs, np.uint64),
                        [docs[i][0] for i in pick])
            shards.append(ShardEntry(path=rel, split=split, version=version,
                                     tokens=int(toks.size), documents=len(pick),
                                     sha256=sha256_file(out / rel),
                                     sidecar_sha256=sha256_file(sidecar_path(out / rel))))
        entries.append(SourceEntry(
            name=name, origin=f"corpora/{name}", license="see dataset card",
            mixture_weight=1.0, counts=SourceCounts(read=len(docs), kept=len(docs)),
            tokens={s: sum(x.tokens for x in shards if x.split == s) for s in ("train", "val")},
            documents={s: sum(x.documents for x in shards if x.split == s)
                       for s in ("train", "val")},
            shards=shards))
    DatamixManifest(name="train-test", config={}, config_sha256="0" * 64, tokenizer=ident,
                    sources=entries, quarantine=[]).write(out)
    return out


@pytest.fixture(scope="module")
def datamix(tmp_path_factory) -> Path:
    return sample_datamix(tmp_path_factory.mktemp("datamix"),
                          {"c4-en-sample": 400, "wikipedia-wikitext-sample": 40})


def _cfg(data: Path, out: Path, **kw) -> T.TrainConfig:
    base = dict(data=str(data), out_dir=str(out), model="tiny", seq_len=64, batch_size=4,
                steps=16, val_every=8, val_tokens=2048, lr=5e-3, warmup_steps=2,
                num_threads=1, progress=False, device="cpu")
    base.update(kw)
    return T.TrainConfig(**base)


def test_schedules():
    c = T.TrainConfig(data="x", steps=100, lr=1.0, min_lr_frac=0.1, warmup_steps=10)
    lrs = [T.lr_at(s, c) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)
    c.schedule, c.cooldown_frac = "trapezoid", 0.2
    lrs = [T.lr_at(s, c) for s in range(100)]
    assert lrs[10:80] == [1.0] * 70 and lrs[-1] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(lrs[80:], lrs[81:], strict=False))


def test_stream_loader_resumes_and_splits_ranks(datamix):
    paths, _ = T._shard_paths(str(datamix), "train")
    a = T.StreamLoader(paths, 4, 32, seed=3)
    first = [a.next_batch() for _ in range(5)]
    state = a.state_dict()
    rest = [a.next_batch() for _ in range(3)]
    b = T.StreamLoader(paths, 4, 32, seed=3)
    b.load_state_dict(state)
    for x, y in zip(rest, [b.next_batch() for _ in range(3)], strict=True):
        assert torch.equal(x.inputs, y.inputs) and torch.equal(x.targets, y.targets)
    r0 = T.StreamLoader(paths, 2, 32, rank=0, world=2, seed=3).next_batch()
    r1 = T.StreamLoader(paths, 2, 32, rank=1, world=2, seed=3).next_batch()
    assert torch.equal(torch.cat([r0.inputs, r1.inputs]), first[0].inputs)
    assert torch.equal(first[0].inputs[:, 1:], first[0].targets[:, :-1])


def test_cpu_run_learns_and_resumes_exactly(datamix, tmp_path, capsys):
    """Val loss falls by > 1 nat from the first evaluation, and a run stopped at step 8 and
    resumed (through the CLI) reproduces the uninterrupted losses bit for bit."""
    full = T.train(_cfg(datamix, tmp_path / "full"))
    first, last = full.val[0]["val_loss"], full.val[-1]["val_loss"]
    print(f"val loss {first:.4f} -> {last:.4f}")
    assert first - last >= 1.0, full.val
    assert (tmp_path / "full" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "full" / "metrics.json").read_text())["steps_done"] == 16

    cfg = _cfg(datamix, tmp_path / "resumed", stop_after=8)
    part = T.train(cfg)
    assert part.stopped_early and part.steps_done == 8
    assert T.latest_checkpoint(tmp_path / "resumed").name == "step_0000008.pt"
    cfg_path = tmp_path / "resumed.json"
    d = {k: v for k, v in cfg.__dict__.items() if k != "stop_after"}
    cfg_path.write_text(json.dumps(d))
    from tokenmill.cli import main

    assert main(["train", str(cfg_path), "--resume", "--no-progress"]) == 0
    resumed = json.loads((tmp_path / "resumed" / "metrics.json").read_text())
    assert [tuple(x) for x in resumed["train_loss"]] == [tuple(x) for x in full.train_loss]
    assert resumed["val"] == full.val
    assert "tokens/s" in capsys.readouterr().out


def _legality_bits(datamix: Path, tmp_path: Path) -> Path:
    """Packed legality rows for gpt2 from the analytic table (tokenmill.tokenizers.legality),
    built only for the previous tokens the val set uses; other rows allow everything."""
    legality = pytest.importorskip("tokenmill.tokenizers.legality")
    enc = get_encoding("gpt2")
    paths, _ = T._shard_paths(str(datamix), "val")
    prev = np.unique(np.concatenate([np.asarray(T.read_tokens(p)) for p in paths]))
    table = legality.LegalityTable.build("gpt2", rows=prev.astype(np.int64))
    rb = (enc.n_vocab + 7) // 8
    bits = np.full((enc.n_vocab, rb), 0xFF, dtype=np.uint8)
    bits[prev] = np.asarray(table.packed)
    out = tmp_path / "gpt2_partial_legality.npy"
    np.save(out, bits)
    return out


def test_masked_validation_and_side_inputs(datamix, tmp_path):
    """Legality mask at evaluation (never above the unmasked loss, zero masked targets),
    the prefix auxiliary loss and the LEM feature from LEMStream in its own process."""
    pytest.importorskip("tokenmill.ngram.stream")
    bits = _legality_bits(datamix, tmp_path)
    cfg = _cfg(datamix, tmp_path / "side", steps=10, val_every=5, legality=str(bits),
               prefix_aux_weight=0.3, lem=True, lem_k=4, lem_ahead=4, lem_window=1 << 16)
    r = T.train(cfg)
    for v in r.val:
        assert v["masked_targets"] == 0
        assert v["val_loss_masked"] <= v["val_loss"] + 1e-6
        assert math.isfinite(v["val_loss_masked"])
    assert r.val[-1]["val_loss_masked"] < r.val[-1]["val_loss"]  # the mask removes mass
    print(f"LEM wait share of step time: {r.lem_wait_frac:.2%}")
    assert r.lem_wait_frac < 0.10
    # the LEM parameters were trained (gradients reached them through the kernel path)
    ck = torch.load(T.latest_checkpoint(tmp_path / "side"), weights_only=False)
    assert ck["model"]["lem_scale"].abs().sum() > 0


def test_config_errors(datamix, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(f"data: {datamix}\nsteps: 3\nlearning_rate: 1.0\n")
    with pytest.raises(ValueError, match="learning_rate"):
        T.TrainConfig.load(p)
    with pytest.raises(ValueError, match="schedule"):
        T.train(_cfg(datamix, tmp_path / "x", schedule="linear"))


def _ddp_worker(rank: int, world: int, port: int, cfg: T.TrainConfig, q) -> None:
    import os

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    r = T.train(cfg)
    q.put((rank, r.train_loss, r.val))
    torch.distributed.destroy_process_group()


def test_ddp_two_ranks_match_single_process(datamix, tmp_path):
    """torchrun-style data parallel (gloo, 2 CPU ranks x 2 sequences) gives the losses of one
    process with 4 sequences per step: same data split, all-reduced gradients."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kw = dict(steps=4, val_every=4, val_tokens=512)
    single = T.train(_cfg(datamix, tmp_path / "single", batch_size=4, **kw))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    cfg = _cfg(datamix, tmp_path / "ddp", batch_size=2, **kw)
    procs = [ctx.Process(target=_ddp_worker, args=(r, 2, port, cfg, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, (tl, v)) for r, tl, v in (q.get(timeout=300) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got[0][0] == got[1][0]  # every rank logs the all-reduced loss
    ddp_losses = [l for _, l in got[0][0]]
    np.testing.assert_allclose(ddp_losses, [l for _, l in single.train_loss], rtol=2e-5)
    np.testing.assert_allclose(got[0][1][-1]["val_loss"], single.val[-1]["val_loss"], rtol=2e-5)


def test_lem_feed_replays_on_resume(datamix, tmp_path):
    """After a resume the predictor replays the stream from step 0, so the features of steps
    3.. equal an uninterrupted feed's (and positions with a match have a candidate)."""
    pytest.importorskip("tokenmill.ngram.stream")
    cfg = _cfg(datamix, tmp_path, steps=6, lem=True, lem_window=1 << 16)
    eot = identity("gpt2").eot_token
    a = T.LEMFeed(cfg, 0, 1, eot)
    b = T.LEMFeed(cfg, 0, 1, eot)
    try:
        full = [a.get(s) for s in range(6)]
        b.skip_to(3)
        for s in range(3, 6):
            ml, cand = b.get(s)
            assert torch.equal(ml, full[s][0]) and torch.equal(cand, full[s][1])
        ml, cand = full[5]
        assert (ml > 0).any() and torch.all(cand[ml > 0][:, 0] >= 0)
    finally:
        a.close()
        b.close()


def test_training_mix_manifest_uses_the_datamix_loader(datamix, tmp_path):
    """A `tokenmill mix` manifest is read through tokenmill.train.data.MixLoader (document-
    aligned rows, document-masked attention) and trains."""
    mix = pytest.importorskip("tokenmill.manifests.mix")
    spec = tmp_path / "mix.yaml"
    spec.write_text(
        f"name: train-test-mix\nmanifests: [{datamix / 'manifest.json'}]\n"
        "target_tokens: 200000\nseed: 1\nsources:\n"
        "  c4-en-sample: {weight: 0.7}\n  wikipedia-wikitext-sample: {weight: 0.3}\n")
    out = tmp_path / "mix.json"
    mix.build_mix(spec, out)
    cfg = _cfg(out, tmp_path / "run", steps=3, val_every=3, val_tokens=512, doc_mask=True)
    loader = T.make_train_loader(cfg, 0, 1)
    assert type(loader).__name__ == "_MixAdapter"
    b = loader.next_batch()
    eot = identity("gpt2").eot_token
    assert torch.all(b.inputs[:, 0] == eot) and b.doc_ids is not None
    starts = (b.doc_ids[:, 1:] != b.doc_ids[:, :-1])
    assert torch.all(b.inputs[:, 1:][starts] == eot)  # each new segment begins at EOT
    r = T.train(cfg)
    assert r.steps_done == 3 and r.val[-1]["val_loss"] < r.val[0]["val_loss"]
    with pytest.raises(ValueError, match="budget"):
        T.train(_cfg(out, tmp_path / "long", steps=10**6))
