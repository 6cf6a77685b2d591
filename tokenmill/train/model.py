"""A small, readable GPT in the current NanoGPT speedrun style, with the LEM side input.

Architecture (after Keller Jordan et al., ``modded-nanogpt``, 2024-2025):

* token embedding -> RMSNorm (no learned gain, ``F.rms_norm``) -> ``n_layer`` pre-norm blocks
  -> RMSNorm -> linear head (tied to the embedding or untied and zero-initialised);
* attention: rotary position embeddings (Su et al., "RoFormer", 2021) on queries and keys,
  QK RMSNorm, causal ``scaled_dot_product_attention``, optionally masked to stay inside each
  document (``doc_ids``);
* MLP: ``relu(x)^2`` (So et al., "Primer", 2021), 4x width; output projections zero-initialised;
* the vocabulary is padded to a multiple of 128 for the matmul shapes; padded logits are never
  part of the softmax (the loss reads ``logits[..., :vocab_size]``);
* optional tanh logit soft-cap (Gemma 2; speedrun uses 15-30).

LEM side input (``config.lem``): for each position the online longest-exact-match predictor
(:mod:`tokenmill.ngram`) gives the match length and up to ``lem_k`` candidate next tokens.
The length is bucketed by ``lem_buckets`` (default ``[1, 8, 16, 32, 64, 128, 256]``: bucket
``i`` holds lengths in ``[b_i, b_{i+1})``, the last is open-ended, length 0 = no match) and the
model adds ``mean(wte[candidates]) * scale[bucket] + bucket_emb[bucket]`` to the residual stream
after the input norm, zero where there is no match (kernel: :func:`~.kernels.lem_feature`).
Scales and bucket embeddings start at zero, so the model starts identical to the baseline.

N-gram side input (``config.ngram``): per position the interpolated n-gram
model's top ``ngram_m`` candidate next tokens ``c_j`` and their log-probabilities ``l_j``
(:mod:`tokenmill.train.ngramside`) enter twice, as the speedrun's n-gram record mixed n-gram
counts into the model: as an input feature, ``ngram_scale * sum_j softmax(l)_j * wte[c_j]``
(the candidates' embeddings weighted by their renormalised probabilities,
``F.embedding_bag``) added after the input norm, and as an additive bias ``ngram_gate * l_j``
on the logits of the ``m`` candidates, passed to the fused cross-entropy as a sparse bias
(no dense ``V``-wide tensor). Scale and gate start at zero (the model starts identical to
the baseline, loss for loss); the gate's gradient is non-zero from the first step.

The loss is :func:`~.kernels.fused_cross_entropy` (Triton on GPU), with the optional prefix
auxiliary target and the optional legality mask.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from tokenmill.train.kernels import fused_cross_entropy, lem_feature

DEFAULT_LEM_BUCKETS = (1, 8, 16, 32, 64, 128, 256)


@dataclass
class GPTConfig:
    """Model size and options. ``vocab_size`` is the tokenizer's ``n_vocab``; the embedding and
    head are padded to ``padded_vocab`` (next multiple of 128)."""

    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    max_seq_len: int = 1024
    tie_embeddings: bool = False
    logit_softcap: float = 0.0  # 0 = off
    rope_base: float = 10000.0
    lem: bool = False
    lem_k: int = 4
    lem_buckets: tuple[int, ...] = field(default_factory=lambda: DEFAULT_LEM_BUCKETS)
    ngram: bool = False
    ngram_m: int = 8

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} not divisible by n_head={self.n_head}")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError("head dimension must be even for rotary embeddings")
        self.lem_buckets = tuple(int(b) for b in self.lem_buckets)
        if list(self.lem_buckets) != sorted(set(self.lem_buckets)) or self.lem_buckets[0] < 1:
            raise ValueError(f"lem_buckets must be increasing and >= 1, got {self.lem_buckets}")

    @property
    def padded_vocab(self) -> int:
        return (self.vocab_size + 127) // 128 * 128

    @classmethod
    def preset(cls, name: str, **overrides) -> GPTConfig:
        """``tiny`` (2 layers x 128, CPU), ``small`` (6 x 384), ``gpt2-small`` (12 x 768)."""
        presets = {
            "tiny": dict(n_layer=2, n_head=2, n_embd=128, max_seq_len=256),
            "small": dict(n_layer=6, n_head=6, n_embd=384, max_seq_len=512),
            "gpt2-small": dict(n_layer=12, n_head=12, n_embd=768, max_seq_len=1024),
        }
        if name not in presets:
            raise ValueError(f"unknown model preset {name!r}; choose from {sorted(presets)}")
        return cls(**{**presets[name], **overrides})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["lem_buckets"] = list(self.lem_buckets)
        return d


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


class Rotary(nn.Module):
    """Rotary position embedding on the last dim of ``[B, T, H, Dh]`` (RoFormer)."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float) -> None:
        super().__init__()
        inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        t = torch.arange(max_seq_len, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.size(1)
        cos = self.cos[None, :t, None, :].to(x.dtype)
        sin = self.sin[None, :t, None, :].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos + x2 * sin, -x1 * sin + x2 * cos), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.rotary = Rotary(self.head_dim, cfg.max_seq_len, cfg.rope_base)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, self.head_dim).unbind(2)
        q, k = rms_norm(q), rms_norm(k)
        q, k = self.rotary(q).to(v.dtype), self.rotary(k).to(v.dtype)  # autocast: norm is fp32
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        if attn_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.relu(self.fc(x)).square())


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(rms_norm(x), attn_mask)
        return x + self.mlp(rms_norm(x))


def bucketize_match_length(lengths: torch.Tensor, buckets: tuple[int, ...]) -> torch.Tensor:
    """Match length ``int [...]`` -> bucket index ``int32 [...]``: ``i`` for lengths in
    ``[buckets[i], buckets[i+1])`` (last bucket open-ended), ``-1`` for lengths below
    ``buckets[0]`` (no match)."""
    bounds = torch.tensor(buckets, dtype=lengths.dtype, device=lengths.device)
    return (torch.bucketize(lengths, bounds, right=True) - 1).to(torch.int32)


def document_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """``bool [B, 1, T, T]`` attention mask: causal and inside the same document.
    ``doc_ids`` is ``int [B, T]``, non-decreasing along T."""
    t = doc_ids.size(1)
    causal = torch.ones(t, t, dtype=torch.bool, device=doc_ids.device).tril()
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (same & causal)[:, None]


class GPT(nn.Module):
    """Decoder-only transformer; see the module docstring for the architecture."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        vp = cfg.padded_vocab
        self.wte = nn.Embedding(vp, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.n_embd, vp, bias=False)
        if cfg.lem:
            nb = len(cfg.lem_buckets)
            self.lem_scale = nn.Parameter(torch.zeros(nb))
            self.lem_bucket_emb = nn.Parameter(torch.zeros(nb, cfg.n_embd))
        if cfg.ngram:
            self.ngram_scale = nn.Parameter(torch.zeros(()))
            self.ngram_gate = nn.Parameter(torch.zeros(()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Speedrun init: embedding N(0, 1) (N(0, 0.02) when tied to the head), input
        projections uniform with std ``0.5 / sqrt(d)``, zero residual output projections and a
        zero untied head."""
        nn.init.normal_(self.wte.weight, std=0.02 if self.lm_head is None else 1.0)
        for blk in self.blocks:
            bound = (3 ** 0.5) * 0.5 * self.cfg.n_embd ** -0.5
            nn.init.uniform_(blk.attn.qkv.weight, -bound, bound)
            nn.init.uniform_(blk.mlp.fc.weight, -bound, bound)
            nn.init.zeros_(blk.attn.proj.weight)
            nn.init.zeros_(blk.mlp.proj.weight)
        if self.lm_head is not None:
            nn.init.zeros_(self.lm_head.weight)
        if self.cfg.lem:
            nn.init.zeros_(self.lem_scale)
            nn.init.zeros_(self.lem_bucket_emb)
        if self.cfg.ngram:
            nn.init.zeros_(self.ngram_scale)
            nn.init.zeros_(self.ngram_gate)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, ``6 N + 12 L d T`` (PaLM appendix B; N includes the head)."""
        n = sum(p.numel() for p in self.parameters()) - self.wte.weight.numel()
        if self.lm_head is None:
            n += self.wte.weight.numel()
        return 6.0 * n + 12.0 * self.cfg.n_layer * self.cfg.n_embd * seq_len

    def lem_input(self, match_len: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """LEM feature ``[B, T, n_embd]`` from ``match_len int [B, T]`` and
        ``candidates int [B, T, K]`` (-1 = none; K may be below ``lem_k``, extra columns are
        dropped)."""
        b, t = match_len.shape
        cand = candidates[..., : self.cfg.lem_k].reshape(b * t, -1).to(torch.int32)
        bucket = bucketize_match_length(match_len.reshape(-1), self.cfg.lem_buckets)
        feat = lem_feature(cand, bucket, self.wte.weight, self.lem_scale, self.lem_bucket_emb)
        return feat.view(b, t, -1)

    def ngram_input(self, cand: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        """N-gram input feature ``float32 [B, T, n_embd]``: ``ngram_scale * sum_j w_j *
        wte[cand_j]`` with ``w`` the candidates' probabilities renormalised over the valid
        ones (0 where a position has none), from ``cand int [B, T, m]`` (-1 = none) and
        ``logp float32 [B, T, m]`` (finite)."""
        b, t, m = cand.shape
        valid = cand >= 0
        p = torch.where(valid, logp.float().exp(), torch.zeros((), device=logp.device))
        w = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
        ids = cand.clamp_min(0).reshape(b * t, m).long()
        feat = F.embedding_bag(ids, self.wte.weight, per_sample_weights=w.reshape(b * t, m)
                               .to(self.wte.weight.dtype), mode="sum")
        return (self.ngram_scale * feat.float()).view(b, t, -1)

    def ngram_bias(self, cand: torch.Tensor, logp: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sparse logit bias of the n-gram candidates: ``(ids int32 [B*T, m] (-1 =
        none), values float32 [B*T, m] = ngram_gate * logp)``."""
        m = cand.shape[-1]
        vals = self.ngram_gate.float() * logp.float().reshape(-1, m)
        return cand.reshape(-1, m).to(torch.int32), vals

    def _embed(self, idx, lem_len, lem_cand, ngram_cand, ngram_logp) -> torch.Tensor:
        """Input norm of the token embeddings plus the side-input features."""
        x = rms_norm(self.wte(idx))
        if self.cfg.lem:
            if lem_len is None or lem_cand is None:
                raise ValueError("model was built with lem=True: pass lem_len and lem_cand")
            x = x + self.lem_input(lem_len, lem_cand).to(x.dtype)
        if self.cfg.ngram:
            if ngram_cand is None or ngram_logp is None:
                raise ValueError("model was built with ngram=True: pass ngram_cand and "
                                 "ngram_logp")
            x = x + self.ngram_input(ngram_cand, ngram_logp).to(x.dtype)
        return x

    def _biased_logits(self, logits: torch.Tensor, kw: dict) -> torch.Tensor:
        """``[N, vocab_size]`` logits with the n-gram bias (if any) added densely, for
        callers that want the model's distribution rather than the loss."""
        v = self.cfg.vocab_size
        logits = logits[:, :v]
        if "bias_ids" not in kw:
            return logits
        ids = kw["bias_ids"].long()
        ok = (ids >= 0) & (ids < v)
        vals = torch.where(ok, kw["bias_vals"], 0.0).to(logits.dtype)
        return logits.scatter_add(1, ids.clamp(0, v - 1), vals)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        lem_len: torch.Tensor | None = None,
        lem_cand: torch.Tensor | None = None,
        ngram_cand: torch.Tensor | None = None,
        ngram_logp: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        aux_targets: torch.Tensor | None = None,
        aux_weight: float = 0.0,
        mask_bits: torch.Tensor | None = None,
        reduction: str = "mean",
        return_aux: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits or loss.

        Args:
            idx: ``int64 [B, T]`` token ids (``T <= max_seq_len``).
            targets: ``int64 [B, T]`` next tokens (``< 0`` ignored). Without targets, returns
                logits ``[B, T, vocab_size]`` (padded columns dropped).
            lem_len, lem_cand: LEM side input (required when ``cfg.lem``), see
                :meth:`lem_input`.
            ngram_cand, ngram_logp: n-gram side input ``int [B, T, m]`` / ``float32
                [B, T, m]`` (required when ``cfg.ngram``), see :meth:`ngram_input` and
                :meth:`ngram_bias`; without targets the bias is added to the returned logits.
            doc_ids: optional ``int [B, T]`` document index per position for document-masked
                attention (default: plain causal).
            aux_targets, aux_weight: prefix auxiliary target ``int64 [B, T]`` (-1 = none) and
                its weight (0 = off).
            mask_bits: legality mask rows ``uint8 [V, ceil(V/8)]``; the previous token of each
                position is ``idx`` itself (the target follows the input token).
            reduction: as in :func:`~.kernels.fused_cross_entropy`.
            return_aux: also return the weighted auxiliary term of the loss, detached (the
                loss minus the plain next-token loss on the same logits; 0 without
                ``aux_targets``), for logging the LM and auxiliary parts separately.

        Returns:
            float32 loss (scalar or ``[B*T]``), or logits; ``(loss, aux_part)`` with
            ``return_aux``.
        """
        b, t = idx.shape
        if t > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {t} > max_seq_len {self.cfg.max_seq_len}")
        x = self._embed(idx, lem_len, lem_cand, ngram_cand, ngram_logp)
        mask = document_causal_mask(doc_ids) if doc_ids is not None else None
        for blk in self.blocks:
            x = blk(x, mask)
        x = rms_norm(x)
        w = self.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, w)
        if self.cfg.logit_softcap > 0:
            c = self.cfg.logit_softcap
            logits = c * torch.tanh(logits / c)
        logits = logits.view(b * t, -1)
        kw = {}
        if self.cfg.ngram:
            kw["bias_ids"], kw["bias_vals"] = self.ngram_bias(ngram_cand, ngram_logp)
        if targets is None:
            return self._biased_logits(logits, kw).reshape(b, t, -1)
        if aux_targets is not None and aux_weight:
            kw.update(aux_targets=aux_targets.reshape(-1), aux_weight=float(aux_weight))
        if mask_bits is not None:
            kw.update(prev_ids=idx.reshape(-1), mask_bits=mask_bits)
        loss = fused_cross_entropy(logits, targets.reshape(-1), reduction=reduction,
                                   vocab_size=self.cfg.vocab_size, **kw)
        if not return_aux:
            return loss
        if "aux_targets" not in kw:
            return loss, torch.zeros_like(loss).detach()
        with torch.no_grad():
            del kw["aux_targets"], kw["aux_weight"]
            lm = fused_cross_entropy(logits.detach(), targets.reshape(-1), reduction=reduction,
                                     vocab_size=self.cfg.vocab_size, **kw)
        return loss, (loss.detach() - lm)

    def configure_optimizer(
        self, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95)
    ) -> torch.optim.AdamW:
        """AdamW with decay on matrices only (not on embeddings, scales, bucket embeddings)."""
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            (decay if p.dim() >= 2 and "wte" not in name and "lem" not in name
             else no_decay).append(p)
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        fused = all(p.is_cuda for p in self.parameters())
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8, fused=fused or None)

