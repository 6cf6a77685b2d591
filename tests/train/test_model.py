"""The speedrun-style GPT: shapes, causality, document masking, LEM side input, loss wiring."""

import pytest
import torch
import torch.nn.functional as F

from tokenmill.train import kernels as K
from tokenmill.train.model import GPT, GPTConfig, bucketize_match_length

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tiny(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig.preset("tiny", vocab_size=300, max_seq_len=64, **kw)
    return GPT(cfg)


def _randomize(model: GPT) -> GPT:
    # zero-initialised projections make every position alike; perturb them for the tests
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def test_shapes_and_padded_vocab():
    m = _tiny()
    assert m.cfg.padded_vocab == 384 and m.wte.weight.shape == (384, 128)
    idx = torch.randint(0, 300, (2, 17))
    logits = m(idx)
    assert logits.shape == (2, 17, 300)
    loss = m(idx, idx)
    assert loss.shape == () and torch.isfinite(loss)
    # zero head at init: uniform distribution over the real vocabulary
    assert abs(loss.item() - torch.log(torch.tensor(300.0)).item()) < 1e-4
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.zeros(1, 65, dtype=torch.long))


def test_causal_and_document_mask():
    m = _randomize(_tiny()).eval()
    idx = torch.randint(0, 300, (1, 20))
    base = m(idx)
    idx2 = idx.clone()
    idx2[0, 12] = (idx2[0, 12] + 1) % 300
    out2 = m(idx2)
    torch.testing.assert_close(base[0, :12], out2[0, :12])
    assert not torch.allclose(base[0, 12:], out2[0, 12:])
    # document masking: the second document sees only itself; rotary makes absolute
    # position irrelevant, so it matches the document run alone
    doc = torch.tensor([[0] * 8 + [1] * 12])
    packed = m(idx, doc_ids=doc)
    alone = m(idx[:, 8:])
    torch.testing.assert_close(packed[0, 8:], alone[0], atol=1e-4, rtol=1e-4)


def test_bucketize_match_length():
    lens = torch.tensor([0, 1, 7, 8, 15, 16, 255, 256, 100000])
    got = bucketize_match_length(lens, (1, 8, 16, 32, 64, 128, 256)).tolist()
    assert got == [-1, 0, 0, 1, 1, 2, 5, 6, 6]


def test_lem_side_input_starts_neutral_then_acts_only_where_matched():
    base = _randomize(_tiny())
    lem = _tiny(lem=True)
    lem.load_state_dict(base.state_dict(), strict=False)
    b, t, k = 2, 24, 4
    idx = torch.randint(0, 300, (b, t))
    lem_len = torch.zeros(b, t, dtype=torch.long)
    lem_len[:, 10:] = torch.randint(1, 300, (b, t - 10))
    cand = torch.randint(-1, 300, (b, t, k))
    torch.testing.assert_close(lem(idx, lem_len=lem_len, lem_cand=cand), base(idx))
    with torch.no_grad():
        lem.lem_scale.fill_(2.0)
        lem.lem_bucket_emb.normal_()
    out = lem(idx, lem_len=lem_len, lem_cand=cand)
    ref = base(idx)
    torch.testing.assert_close(out[:, :10], ref[:, :10])  # before the first match: untouched
    assert not torch.allclose(out[:, 10:], ref[:, 10:])
    loss = lem(idx, idx, lem_len=lem_len, lem_cand=cand)
    loss.backward()
    assert lem.lem_scale.grad.abs().sum() > 0 and lem.lem_bucket_emb.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="lem"):
        lem(idx)


def test_loss_uses_kernels_under_interpreter(monkeypatch):
    """Same loss and gradients with the Triton kernels (interpreted) and the torch fallback,
    with the LEM feature, the prefix auxiliary target and the legality mask all on."""
    m = _randomize(_tiny(lem=True))
    with torch.no_grad():
        m.lem_scale.fill_(0.5)
    b, t = 2, 9
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 300, (b, t), generator=g)
    tgt = torch.randint(0, 300, (b, t), generator=g)
    aux = torch.randint(-1, 300, (b, t), generator=g)
    lem_len = torch.randint(0, 40, (b, t), generator=g)
    cand = torch.randint(-1, 300, (b, t, 3), generator=g)
    allowed = torch.rand(300, 300, generator=g) < 0.5
    allowed[idx.reshape(-1), tgt.reshape(-1)] = True
    bits = K.pack_mask_rows(allowed)
    kw = dict(lem_len=lem_len, lem_cand=cand, aux_targets=aux, aux_weight=0.3, mask_bits=bits)

    def run():
        m.zero_grad()
        loss = m(idx, tgt, **kw)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in m.parameters()]

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    l_ref, g_ref = run()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    l_tri, g_tri = run()
    torch.testing.assert_close(l_tri, l_ref, atol=1e-5, rtol=1e-5)
    for a, r in zip(g_tri, g_ref, strict=True):
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-4)
    # and the wiring: loss == CE(target) + 0.3 * CE(aux) over allowed tokens, by hand
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with torch.no_grad():
        logits = m(idx, lem_len=lem_len, lem_cand=cand).reshape(b * t, -1)
        logp = logits.masked_fill(~allowed[idx.reshape(-1)], float("-inf")).log_softmax(-1)
        a = aux.reshape(-1)
        ok = (a >= 0) & allowed[idx.reshape(-1), a.clamp_min(0)]
        main = -logp.gather(1, tgt.reshape(-1, 1))[:, 0]
        side = torch.where(ok, -logp.gather(1, a.clamp_min(0)[:, None])[:, 0], 0.0)
        torch.testing.assert_close(l_ref, (main + 0.3 * side).mean(), atol=1e-5, rtol=1e-5)
        unmasked = m(idx, tgt, lem_len=lem_len, lem_cand=cand)
        masked = m(idx, tgt, lem_len=lem_len, lem_cand=cand, mask_bits=bits)
        assert masked <= unmasked


def test_tiny_model_learns_real_text():
    """A few AdamW steps on one batch of real English (gpt2 tokens) cut the loss by > 1 nat."""
    from tests.shared import corpora
    from tokenmill.tokenizers import get_encoding

    path = corpora("books-public-domain")
    txt = sorted(p for p in path.rglob("*.txt") if "shakespeare" in p.name.lower())
    if not txt:
        txt = sorted(path.rglob("*.txt"))
    text = txt[0].read_text(encoding="utf-8", errors="replace")[:20000]
    enc = get_encoding("gpt2")
    raw = enc.encode_ordinary(text)[: 2 * 65]
    # compact the ids to the tokens used (cheap head), keep the real sequence
    uniq, inv = torch.unique(torch.tensor(raw), return_inverse=True)
    ids = inv.view(2, 65)
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny", vocab_size=len(uniq), max_seq_len=64))
    opt = m.configure_optimizer(lr=3e-3, weight_decay=0.0)
    first = None
    for _ in range(20):
        loss = m(ids[:, :-1], ids[:, 1:])
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first - loss.item() > 1.0, (first, loss.item())


def test_tied_head_and_softcap():
    m = _randomize(_tiny(tie_embeddings=True, logit_softcap=15.0))
    assert m.lm_head is None
    idx = torch.randint(0, 300, (1, 8))
    logits = m(idx)
    assert logits.abs().max() <= 15.0
    loss = m(idx, idx)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(8, -1), idx.reshape(-1)))


def test_return_aux_splits_the_loss_into_lm_and_auxiliary():
    """``return_aux`` gives the weighted auxiliary term: loss - aux is the plain next-token
    loss of the same logits, and aux is 0 without auxiliary targets."""
    m = _randomize(_tiny())
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 300, (2, 16), generator=g)
    y = torch.randint(0, 300, (2, 16), generator=g)
    aux_t = torch.randint(-1, 300, (2, 16), generator=g)
    loss, aux = m(idx, y, aux_targets=aux_t, aux_weight=0.3, return_aux=True)
    plain = m(idx, y)
    assert not aux.requires_grad and aux > 0
    torch.testing.assert_close(loss - aux, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, m(idx, y, aux_targets=aux_t, aux_weight=0.3))
    loss0, aux0 = m(idx, y, return_aux=True)
    assert aux0 == 0 and torch.equal(loss0, plain)


def _ngram_inputs(b, t, m, v, seed=0):
    g = torch.Generator().manual_seed(seed)
    cand = torch.randint(-1, v, (b, t, m), generator=g, dtype=torch.int32)
    cand[0, 0] = -1  # a position without candidates
    logp = torch.where(cand >= 0, -torch.rand(b, t, m, generator=g) * 5, 0.0)
    return cand, logp


def test_ngram_model_at_zero_gate_is_the_baseline_and_learns_the_gate():
    """With ``ngram_gate = ngram_scale = 0`` the n-gram model's loss equals the
    baseline's exactly (same weights), the gate gets a non-zero gradient at once, the scale
    once the blocks carry gradient, and the loss equals the dense reference with the bias."""
    base = _randomize(_tiny())
    ng = _tiny(ngram=True, ngram_m=4)
    ng.load_state_dict({**base.state_dict(), "ngram_scale": torch.zeros(()),
                        "ngram_gate": torch.zeros(())})
    idx = torch.randint(0, 300, (2, 16))
    tgt = torch.randint(0, 300, (2, 16))
    cand, logp = _ngram_inputs(2, 16, 4, 300)
    l0 = base(idx, tgt)
    l1 = ng(idx, tgt, ngram_cand=cand, ngram_logp=logp)
    assert torch.equal(l0, l1)
    l1.backward()
    assert ng.ngram_gate.grad != 0 and ng.ngram_scale.grad != 0
    with torch.no_grad():
        ng.ngram_gate.fill_(0.7)
        ng.ngram_scale.fill_(0.3)
    logits = ng(idx, ngram_cand=cand, ngram_logp=logp)  # the bias is in the logits
    ref = F.cross_entropy(logits.reshape(-1, 300), tgt.reshape(-1))
    torch.testing.assert_close(ng(idx, tgt, ngram_cand=cand, ngram_logp=logp), ref)
    with pytest.raises(ValueError, match="ngram_cand"):
        ng(idx, tgt)
