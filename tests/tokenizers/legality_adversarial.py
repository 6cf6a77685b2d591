"""Adversarial-context soundness check of a legality table (test helper).

For sampled impossible pairs ``(a, b)`` it builds texts ``left + a + b + right`` over a set of
contexts (empty, space, letters, digits, punctuation, apostrophe, newlines, tab, multi-byte
characters) and checks that tiktoken never puts ``a`` right before ``b``. Tokens that start or
end inside a multi-byte character are completed with the split bytes of real characters so
that the whole text is valid UTF-8; a pair whose bytes cannot occur in valid UTF-8 at all is
counted as ``unrealisable`` (trivially impossible).
"""

from __future__ import annotations

import itertools

import numpy as np

from tokenmill.tokenizers.tiktoken_parts import mergeable_ranks

LEFTS = ["", " ", "a", "Hy", "7", "12", "123", ".", "'", "x'", "\n", "\n\n", "  ", "\t",
         "é", "中", "\u3000", ".\n", " \n", "\xa0", "١"]
RIGHTS = ["", " ", "a", "s", "ll", "7", "12", ".", "'", "\n", "  ", "\t", "é", "中", " x",
          "\r\n", " 1", "\u3000", "\xa0", "٣"]
# split bytes of real characters: leads that start a char before a token's leading
# continuation bytes, continuation bytes that finish a token's trailing partial char
_PREFIXES = [b"", b"\xc3", b"\xd9", b"\xe4", b"\xe4\xb8", b"\xe3\x80", b"\xe2\x80", b"\xf0",
             b"\xf0\x9f", b"\xf0\x9f\x98", b"\xe1", b"\xed", b"\xf3\xa0", b"\xc5"]
_SUFFIXES = [b"", b"\x80", b"\xa9", b"\xbf", b"\x80\x80", b"\xb8\xad", b"\x80\x80\x80",
             b"\x9f\x98\x80", b"\x98\x80", b"\xa0"]


def junction_texts(ba: bytes, bb: bytes) -> list[str]:
    """Valid-UTF-8 completions of ``ba + bb`` (empty if none exists)."""
    core = ba + bb
    try:
        return [core.decode("utf-8")]
    except UnicodeDecodeError:
        pass
    out = []
    pres = _PREFIXES if 0x80 <= core[0] <= 0xBF else [b""]
    for pre in pres:
        for suf in _SUFFIXES:
            try:
                out.append((pre + core + suf).decode("utf-8"))
            except UnicodeDecodeError:
                continue
    return out


def sample_impossible(table, n: int, rng: np.random.Generator,
                      rows: np.ndarray | None = None) -> np.ndarray:
    """``int64[n, 2]`` impossible pairs sampled uniformly over (row, impossible column)."""
    V = table.n_vocab
    rows = np.arange(V) if rows is None else rows
    out = []
    while sum(len(x) for x in out) < n:
        a = int(rng.choice(rows))
        imp = np.flatnonzero(~table.allowed_next(a))
        if len(imp) == 0:
            continue
        take = rng.choice(imp, size=min(len(imp), 64), replace=False)
        out.append(np.stack([np.full(len(take), a), take], 1))
    return np.concatenate(out)[:n]


def adversarial_violations(enc, table, pairs: np.ndarray, rng: np.random.Generator,
                           contexts_per_pair: int = 8, batch: int = 200_000):
    """Return ``(violations, n_texts, n_unrealisable)`` where violations lists
    ``(a, b, text)`` whose encoding contains ``a`` followed by ``b``."""
    ranks_inv = {v: k for k, v in mergeable_ranks(enc).items()}
    V = enc.n_vocab
    texts: list[str] = []
    keys: list[int] = []
    unreal = 0
    violations = []

    def flush():
        if not texts:
            return
        encode = enc.encode_ordinary  # per-text thread-pool overhead dominates batch
        toks = [encode(t) for t in texts]
        lens = np.fromiter((len(t) for t in toks), dtype=np.int64, count=len(toks))
        flat = np.fromiter(itertools.chain.from_iterable(toks), dtype=np.int64,
                           count=int(lens.sum()))
        pk = flat[:-1] * V + flat[1:]
        owner = np.repeat(np.arange(len(toks)), lens)[:-1]
        # pairs that straddle two texts are not real: mask them out
        same = np.repeat(np.arange(len(toks)), lens)[1:] == owner
        want = np.asarray(keys, dtype=np.int64)[owner]
        hit = np.flatnonzero((pk == want) & same)
        for i in np.unique(owner[hit]):
            k = keys[i]
            violations.append((k // V, k % V, texts[i]))
        texts.clear()
        keys.clear()

    n_texts = 0
    # per pair: the bare junction plus ``contexts_per_pair`` distinct left contexts, each with
    # a random right context (over 100k pairs every left/right context is used thousands of
    # times)
    li_all = np.argsort(rng.random((len(pairs), len(LEFTS))), axis=1)[:, :contexts_per_pair]
    ri_all = rng.integers(0, len(RIGHTS), size=(len(pairs), contexts_per_pair))
    for (a, b), li, ri in zip(pairs.tolist(), li_all.tolist(), ri_all.tolist(), strict=True):
        ba, bb = ranks_inv.get(a), ranks_inv.get(b)
        if ba is None or bb is None:
            continue
        cores = junction_texts(ba, bb)
        if not cores:
            unreal += 1
            continue
        texts.append(cores[0])
        keys.append(a * V + b)
        for j in range(contexts_per_pair):
            texts.append(LEFTS[li[j]] + cores[j % len(cores)] + RIGHTS[ri[j]])
            keys.append(a * V + b)
        n_texts += contexts_per_pair + 1
        if len(texts) >= batch:
            flush()
    flush()
    return violations, n_texts, unreal
