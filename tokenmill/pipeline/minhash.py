"""MinHash-LSH fuzzy deduplication, with the hashing vectorized in numba and LSH bands
grouped on Ray.

Technique: Broder, "On the resemblance and containment of documents" (1997) for
MinHash; Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets* ch. 3 for LSH
banding; the false-positive/false-negative weighted choice of (bands, rows) is
datasketch's ``_optimal_param``; the pipeline shape (signatures, band buckets, union-find
clusters) follows datatrove's and NeMo Curator's fuzzy dedup.

API (what the executor calls)
-----------------------------
``fuzzy_dedup(keys, texts, threshold=0.8, ngram=5, num_perm=128, seed=1)``
    -> :class:`FuzzyDedupResult`. ``keys`` are the unique document keys of a whole datamix
    (after exact dedup), ``texts`` the matching texts (any iterable, read once, in the
    same order). ``result.removed`` maps each removed key to ``(kept_key, jaccard)``
    (quarantine each with ``stage="fuzzy_dedup"``, ``reason="fuzzy_dedup:near_duplicate"``,
    ``duplicate_of=kept_key``); ``result.params`` (num_perm, bands, rows, threshold, ngram,
    seed, hash, scheme, FP/FN weights) goes into the manifest; ``result.counters``
    (documents, empty, candidate_pairs, candidate_clusters, removed,
    kept_below_threshold, seconds) are the stage counters, e.g.
    ``stages["fuzzy_dedup"] = {"removed": n_removed_from_this_source, "params": ...}``
    (the report reads ``removed`` or ``rejected``); ``result.cluster_sizes`` lists the size
    of every duplicate cluster (kept document + its removed twins). The result does not
    depend on the order of the inputs or on the number of Ray workers. Ray: uses the
    running Ray (if none is initialized, a new local one with at most 2 CPUs:
    ``address="local"``, never a cluster joined by accident); signatures are computed in the
    calling process (numba, one thread; about 57,000 documents per CPU-second on
    linux-docs + cc-main, see benchmarks/bench_minhash.py).

:class:`FuzzyDedup` wraps the same call as a :class:`~tokenmill.pipeline.step.PipelineStep`
(``name = "fuzzy_dedup"``, reason ``"fuzzy_dedup:near_duplicate"``, ``duplicate_of`` =
kept key, ``detail`` = ``"jaccard=0.912"``); it holds all documents of its input in memory.

Lower-level pieces: :func:`normalize_for_shingles`, :func:`shingles` (reference, for
tests and peers), :func:`minhash_signatures` (``(n_docs, num_perm)`` uint32),
:func:`shingle_hash32` / :func:`word_hash32` / :func:`fmix32` (the hashes in pure
Python), :func:`to_minhash` / :func:`to_lean_minhash` (datasketch objects),
:func:`lsh_params`.

Shingles
--------
Word ``ngram``-grams of :func:`normalize_for_shingles`: each character replaced by its
NFKC form, lower-cased, and words are maximal runs of alphanumeric characters. The numba
kernel does all of it from the UTF-8 bytes in one pass (tables built once per process).

datasketch interoperability
---------------------------
Signatures are bit-identical to
``datasketch.MinHash(num_perm, seed, hashfunc=shingle_hash32, scheme="affine32")`` updated
with the UTF-8 bytes of every shingle (``" ".join(words[i:i + ngram])``): the shingle's
32-bit hash (:func:`shingle_hash32`, a polynomial of its words' MurmurHash64A hashes),
datasketch's fmix32 pre-mix, then ``a * h + b mod 2**32`` with datasketch's own
permutation parameters. ``to_lean_minhash(sig[i], seed)`` gives a
``LeanMinHash`` usable in ``datasketch.MinHashLSH``.

No transitive blow-up
---------------------
LSH candidates are joined into clusters by union-find, but a cluster is never removed
wholesale. Its members are visited in key order; the first is kept. Every later member is
removed only if its estimated Jaccard (share of equal signature values) with a document
already kept in the cluster is at or above ``threshold`` (its twin is the lowest-key such
document); otherwise it is kept too and becomes a representative that later members may
duplicate. A chain A~B~C~D where A and D are unrelated therefore keeps A and C.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
from llvmlite import ir as llvm_ir
from numba.core import types
from numba.extending import intrinsic

from tokenmill.pipeline.step import Document, PipelineStep

MAX_HASH32 = np.uint32(0xFFFFFFFF)
SCHEME = "affine32"
HASH_NAME = ("shingle_hash32: fmix32 of a base-0x9E3779B1 polynomial of the words' "
             "murmur64a (low 32 bits); datasketch affine32 permutations")

_NON_WORD = re.compile(r"[\W_]+")


# ---------------------------------------------------------------------------------------
# normalization and shingles
# ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _char_map() -> dict[int, str]:
    """code point -> ``NFKC(chr(cp)).lower()`` where that differs from the character
    (about 6,200 code points; built once per process, ~0.7 s)."""
    out = {}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        m = unicodedata.normalize("NFKC", ch).lower()
        if m != ch:
            out[cp] = m
    return out


def normalize_for_shingles(text: str) -> str:
    """Text as the words MinHash sees: every character replaced by its NFKC compatibility
    form, lower-cased (``unicodedata.normalize("NFKC", ch).lower()``, character by
    character), then every run of non-alphanumeric characters (punctuation, whitespace,
    ``_``; ``str.isalnum``) replaced by one space, stripped.

    Per-character NFKC folds width variants, ligatures, superscripts, NBSP and the like
    as whole-string NFKC does, but does not compose decomposed accents (``e`` + U+0301
    stays two characters, the accent a separator); in exchange the kernel applies it from
    a table, in one pass. The result is the words joined by single spaces (maybe ``""``).
    """
    mapped = text.translate(_char_map())
    return _NON_WORD.sub(" ", mapped).strip()


def _prepare(text: str) -> bytes:
    # all normalization happens in the kernel; Python only encodes
    return text.encode("utf-8", "surrogatepass")


def shingles(text: str, ngram: int = 5) -> list[bytes]:
    """Reference shingling (pure Python; the fast path is :func:`minhash_signatures`).

    Word ``ngram``-grams of :func:`normalize_for_shingles`, each as UTF-8 bytes of the
    words joined by one space. A document with fewer than ``ngram`` (but at least one)
    words is one shingle; an empty document has none.
    """
    words = normalize_for_shingles(text).split(" ")
    if words == [""]:
        return []
    n = max(1, len(words) - ngram + 1)
    return [" ".join(words[i:i + ngram]).encode("utf-8") for i in range(n)]


def fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finalizer (an avalanching bijection on uint32)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


MURMUR64A_M = 0xC6A4A7935BD1E995  # MurmurHash64A's multiplier (r = 47)
_MASK64 = 0xFFFFFFFFFFFFFFFF


def murmur64a(data: bytes, seed: int = 0) -> int:
    """MurmurHash64A (Austin Appleby's MurmurHash2 for 64-bit platforms, public domain;
    ``MurmurHash64A`` in smhasher's ``MurmurHash2.cpp``): 8-byte little-endian blocks,
    each mixed (``k *= m; k ^= k >> 47; k *= m``) and folded in (``h ^= k; h *= m``),
    the 1-7 byte tail xored in as a little-endian integer (``h *= m``), then
    ``h ^= h >> 47; h *= m; h ^= h >> 47``."""
    m = MURMUR64A_M
    n = len(data)
    h = (seed ^ (n * m)) & _MASK64
    full = n - n % 8
    for i in range(0, full, 8):
        k = (int.from_bytes(data[i:i + 8], "little") * m) & _MASK64
        k ^= k >> 47
        h = ((h ^ ((k * m) & _MASK64)) * m) & _MASK64
    if n % 8:
        h = ((h ^ int.from_bytes(data[full:], "little")) * m) & _MASK64
    h ^= h >> 47
    h = (h * m) & _MASK64
    return h ^ (h >> 47)


def word_hash32(word: bytes) -> int:
    """The hash of one word (UTF-8 bytes): the low 32 bits of ``murmur64a(word, seed=0)``.

    A block hash rather than a byte-serial one (such as FNV-1a): the kernel reads each
    word as at most two unaligned 8-byte loads, with no per-byte multiply chain."""
    return murmur64a(word) & 0xFFFFFFFF


SHINGLE_BASE = 0x9E3779B1  # odd 32-bit multiplier (golden ratio) of the polynomial hash


def shingle_hash32(shingle: bytes) -> int:
    """The 32-bit hash of a shingle (UTF-8 words joined by one space): ``fmix32`` of the
    polynomial ``sum_k word_hash32(w_k) * SHINGLE_BASE**(n-1-k) mod 2**32`` over its n words.

    Words are hashed once (:func:`word_hash32`, MurmurHash64A) and every shingle's
    polynomial is a Horner evaluation over its words' hashes (the Karp-Rabin fingerprint,
    Karp & Rabin, "Efficient randomized pattern-matching algorithms", 1987). Pass it as
    ``hashfunc`` to ``datasketch.MinHash`` to reproduce :func:`minhash_signatures`.
    """
    h = 0
    for w in shingle.split(b" "):
        h = (h * SHINGLE_BASE + word_hash32(w)) & 0xFFFFFFFF
    return fmix32(h)


# ---------------------------------------------------------------------------------------
# numba kernels
# ---------------------------------------------------------------------------------------
@numba.njit(inline="always")
def _fmix32_u32(h):
    # numba widens uint32 products to 64 bits: truncate explicitly
    h = np.uint32(h ^ (h >> np.uint32(16)))
    h = np.uint32(h * np.uint32(0x85EBCA6B))
    h = np.uint32(h ^ (h >> np.uint32(13)))
    h = np.uint32(h * np.uint32(0xC2B2AE35))
    return np.uint32(h ^ (h >> np.uint32(16)))


@functools.lru_cache(maxsize=1)
def _char_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tables of the kernel's per-code-point normalization (see
    :func:`normalize_for_shingles`), built once per process:

    * ``info``: int32 (0x110000,), per code point 0 (separator), 1 (alphanumeric, kept as
      is) or ``2 + k`` (replaced by replacement k);
    * ``rep_off``: int64 (n_rep + 1,), ``rep_cp``: int64, the replacements' code points,
      ``rep_word``: uint8, 1 where such a code point is alphanumeric;
    * ``ascii``: uint8 (128,), the lower-cased byte of an ASCII alphanumeric, else 0.
    """
    word = np.array([chr(i).isalnum() for i in range(0x110000)], dtype=np.uint8)
    cmap = _char_map()
    info = word.astype(np.int32)
    rep_off = np.zeros(len(cmap) + 1, np.int64)
    reps: list[int] = []
    for k, (cp, rep) in enumerate(sorted(cmap.items())):
        info[cp] = 2 + k
        reps.extend(ord(c) for c in rep)
        rep_off[k + 1] = len(reps)
    rep_cp = np.array(reps, np.int64)
    ascii_lut = np.array([ord(chr(c).lower()) if chr(c).isalnum() else 0 for c in range(128)],
                         np.uint8)
    return info, rep_off, rep_cp, word[rep_cp], ascii_lut


@intrinsic
def _load_u64le(typingctx, arr, idx):
    """``int.from_bytes(arr[idx:idx + 8], "little")`` for a uint8 array, as one unaligned
    load (no bounds check: the caller keeps 16 bytes of slack)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint8
            and isinstance(idx, types.Integer)):
        return None
    sig = types.uint64(arr, idx)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [i]), llvm_ir.IntType(64).as_pointer())
        v = builder.load(ptr, align=1)
        return builder.bswap(v) if sys.byteorder == "big" else v

    return sig, codegen


@intrinsic
def _store_u64le(typingctx, arr, idx, val):
    """``arr[idx:idx + 8] = val.to_bytes(8, "little")`` for a uint8 array, as one unaligned
    store (no bounds check)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint8
            and isinstance(idx, types.Integer) and val == types.uint64):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [i]), llvm_ir.IntType(64).as_pointer())
        v = builder.bswap(args[2]) if sys.byteorder == "big" else args[2]
        builder.store(v, ptr, align=1)
        return context.get_dummy_value()

    return types.void(arr, idx, val), codegen


@intrinsic
def _popcount64(typingctx, x):
    """Number of set bits of a uint64, as intp."""
    if x != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])

    return types.intp(x), codegen


@intrinsic
def _tzcnt64(typingctx, x):
    """Trailing zero bits of a uint64 (64 for 0), as intp."""
    if x != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], llvm_ir.Constant(llvm_ir.IntType(1), 0))

    return types.intp(x), codegen


@intrinsic
def _ascii_block64(typingctx, src, i, dst, j):
    """SIMD over the 64 bytes ``src[i:i + 64]`` (LLVM vector IR: on AVX2 two 32-byte
    loads, compares and ``vpmovmskb``): stores them ASCII-lower-cased into
    ``dst[j:j + 64]`` and returns ``(word, high)``, uint64 bit masks (bit b for byte b) of
    the bytes that are ASCII alphanumeric and of those >= 0x80. No bounds checks."""
    if not (isinstance(src, types.Array) and src.dtype == types.uint8
            and isinstance(dst, types.Array) and dst.dtype == types.uint8
            and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
        return None
    rt = types.UniTuple(types.uint64, 2)

    def codegen(context, builder, signature, args):
        i8 = llvm_ir.IntType(8)
        vt = llvm_ir.VectorType(i8, 64)

        def splat(v):
            return llvm_ir.Constant(vt, [llvm_ir.Constant(i8, v)] * 64)

        sa = context.make_array(signature.args[0])(context, builder, args[0])
        da = context.make_array(signature.args[2])(context, builder, args[2])
        ii = context.cast(builder, args[1], signature.args[1], types.intp)
        jj = context.cast(builder, args[3], signature.args[3], types.intp)
        v = builder.load(builder.bitcast(builder.gep(sa.data, [ii]), vt.as_pointer()), align=1)
        high = builder.icmp_signed("<", v, splat(0))
        upper = builder.icmp_unsigned("<", builder.sub(v, splat(65)), splat(26))  # A-Z
        low = builder.or_(v, builder.shl(builder.zext(upper, vt), splat(5)))
        digit = builder.icmp_unsigned("<", builder.sub(v, splat(48)), splat(10))  # 0-9
        alpha = builder.icmp_unsigned("<", builder.sub(low, splat(97)), splat(26))  # a-z
        builder.store(low, builder.bitcast(builder.gep(da.data, [jj]), vt.as_pointer()),
                      align=1)
        i64 = llvm_ir.IntType(64)
        word = builder.bitcast(builder.or_(digit, alpha), i64)
        return context.make_tuple(builder, rt, [word, builder.bitcast(high, i64)])

    return rt(src, i, dst, j), codegen


_M64 = np.uint64(MURMUR64A_M)
_ONES64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@numba.njit(inline="always")
def _mm_chunk(k):
    # MurmurHash64A's mix of one full 8-byte block (before it is xored into the state)
    k = k * _M64
    k ^= k >> np.uint64(47)
    return k * _M64


@numba.njit(inline="always")
def _murmur64a_short(c0, c1, n):
    """MurmurHash64A (seed 0) of an ``n``-byte string, 1 <= n <= 16, given its first two
    8-byte little-endian blocks ``c0``, ``c1`` as loaded (bytes past ``n`` are masked off
    here). Branch-free: both possible block mixes are computed and the right one selected,
    so word lengths cost no branch mispredictions."""
    nn = np.uint64(n)
    c0 &= _ONES64 >> (np.uint64(64) - np.uint64(8) * min(nn, np.uint64(8)))
    n1 = min(max(nn, np.uint64(9)), np.uint64(16)) - np.uint64(8)
    c1 &= _ONES64 >> (np.uint64(64) - np.uint64(8) * n1)
    h = nn * _M64  # seed 0 ^ (len * m)
    k0 = _mm_chunk(c0)
    if n < 8:  # a tail block: xored in unmixed (compiles to a select)
        k0 = c0
    h = (h ^ k0) * _M64
    k1 = _mm_chunk(c1)
    if n < 16:
        k1 = c1
    h2 = (h ^ k1) * _M64
    if n > 8:
        h = h2
    return _mm_final(h)


@numba.njit(inline="always")
def _mm_final(h):
    h ^= h >> np.uint64(47)
    h = h * _M64
    return h ^ (h >> np.uint64(47))


@numba.njit(nogil=True)
def _murmur64a_long(scr, s, n):
    """MurmurHash64A (seed 0) of ``scr[s:s + n]`` for any n (long words; not inlined)."""
    h = np.uint64(n) * _M64
    q = s
    end = s + (n & ~7)
    while q < end:
        h = (h ^ _mm_chunk(_load_u64le(scr, q))) * _M64
        q += 8
    t = n & 7
    if t:
        c = _load_u64le(scr, q) & (_ONES64 >> np.uint64(64 - 8 * t))
        h = (h ^ c) * _M64
    return _mm_final(h)


@numba.njit(inline="always")
def _utf8(rc):
    """UTF-8 of code point ``rc``: (bytes as a little-endian int64, length)."""
    if rc < 0x80:
        return rc, 1
    if rc < 0x800:
        return (0xC0 | (rc >> 6)) | ((0x80 | (rc & 0x3F)) << 8), 2
    if rc < 0x10000:
        return ((0xE0 | (rc >> 12)) | ((0x80 | ((rc >> 6) & 0x3F)) << 8)
                | ((0x80 | (rc & 0x3F)) << 16)), 3
    return ((0xF0 | (rc >> 18)) | ((0x80 | ((rc >> 12) & 0x3F)) << 8)
            | ((0x80 | ((rc >> 6) & 0x3F)) << 16) | ((0x80 | (rc & 0x3F)) << 24)), 4


@numba.njit(cache=True, nogil=True)
def _normalize(buf, s, e, info, rep_off, rep_cp, rep_word, ascii_lut, scr, bnd):
    """One pass over UTF-8 ``buf[s:e]``: the words of :func:`normalize_for_shingles`, as
    UTF-8 bytes in ``scr`` (uint8) and their boundaries in ``bnd`` (int64: start, end,
    start, end, ...; word k is ``scr[bnd[2k]:bnd[2k + 1]]``; what lies between words in
    ``scr`` is unspecified). Returns the number of boundaries (twice the number of words),
    or -1 when the buffers are too small (NFKC expansions: grow both and call again).

    ASCII goes 64 bytes at a time (:func:`_ascii_block64`: lower case, stored, and bit
    masks of the alphanumeric and the non-ASCII bytes); the word/non-word flips of the
    block's ASCII prefix are a 64-bit mask whose set bits are the boundaries, written 8 at
    a time without a branch per word (simdjson's flattening of a bitmap into indices;
    Langdale & Lemire, "Parsing gigabytes of JSON per second", 2019). Other bytes go one
    character at a time: ASCII from a table, other code points decoded, mapped through
    the NFKC/lower table and written as UTF-8. Reads up to 64 bytes past ``e`` when
    ``buf`` has them (never past its end); they do not change the result."""
    nb = 0
    inw = 0
    j = 0
    cap = scr.shape[0] - 96  # slack: one character adds at most 18 code points (< 80 bytes)
    n_buf = buf.shape[0]
    i = s
    while i < e:
        c0 = buf[i]
        if c0 < 0x80:
            if i + 64 <= n_buf:  # a block of up to 64 ASCII bytes
                wm, hi = _ascii_block64(buf, i, scr, j)
                n_ok = min(_tzcnt64(hi), e - i)  # ASCII bytes before the first other byte
                f = wm ^ ((wm << np.uint64(1)) | np.uint64(inw))  # word/non-word flips
                if n_ok < 64:
                    f &= _ONES64 >> np.uint64(64 - n_ok)
                inw = np.intp((wm >> np.uint64(n_ok - 1)) & np.uint64(1))
                cnt = _popcount64(f)
                q = nb
                while True:  # boundaries, 8 at a time; entries past cnt are overwritten
                    for r in range(8):
                        bnd[q + r] = j + _tzcnt64(f)
                        f &= f - np.uint64(1)
                    q += 8
                    if f == np.uint64(0):
                        break
                nb += cnt
                i += n_ok
                j += n_ok
                continue
            t = ascii_lut[c0]
            w = np.intp(t != 0)
            scr[j] = t
            bnd[nb] = j
            nb += w ^ inw
            inw = w
            j += 1
            i += 1
            continue
        if j + (e - i) >= cap or nb + (e - i) >= cap:
            return -1  # the caller grows scr and bnd and calls again
        if i + 4 <= e and i + 8 <= n_buf:  # decode from one load (later bytes unused)
            x = np.int64(_load_u64le(buf, i) & np.uint64(0xFFFFFFFF))
            b1 = (x >> 8) & 0x3F
            b2 = (x >> 16) & 0x3F
            if c0 < 0xE0:
                ln = 2
                cp = ((x & 0x1F) << 6) | b1
            elif c0 < 0xF0:
                ln = 3
                cp = ((x & 0x0F) << 12) | (b1 << 6) | b2
            else:
                ln = 4
                cp = ((x & 0x07) << 18) | (b1 << 12) | (b2 << 6) | ((x >> 24) & 0x3F)
        else:  # the document's last bytes (a sequence may be cut short)
            if c0 < 0xE0:
                ln = 2
                cp = np.int64(c0 & 0x1F)
            elif c0 < 0xF0:
                ln = 3
                cp = np.int64(c0 & 0x0F)
            else:
                ln = 4
                cp = np.int64(c0 & 0x07)
            if i + ln > e:
                ln = e - i
            for q in range(1, ln):
                cp = (cp << 6) | (np.int64(buf[i + q]) & 0x3F)
        if cp >= 0x110000:
            cp = 0  # malformed: a separator
        k = info[cp]
        if k < 2:  # kept as is: copy its bytes (8 at once; j only moves for a word)
            w = np.intp(k)
            bnd[nb] = j
            nb += w ^ inw
            inw = w
            if i + 8 <= n_buf:
                _store_u64le(scr, j, _load_u64le(buf, i))
            else:
                for q in range(ln):
                    scr[j + q] = buf[i + q]
            j += ln & -w
        else:
            for r in range(rep_off[k - 2], rep_off[k - 1]):
                rc = rep_cp[r]
                w = np.intp(rep_word[r])
                bnd[nb] = j
                nb += w ^ inw
                inw = w
                if w:
                    u, ln8 = _utf8(rc)
                    for q in range(ln8):
                        scr[j + q] = (u >> (8 * q)) & 0xFF
                    j += ln8
        i += ln
    if inw:
        bnd[nb] = j
        nb += 1
    return nb


@numba.njit(cache=True, nogil=True)
def _word_hashes(buf, s, e, tables, scr, bnd, wh):
    """``word_hash32`` of every word of :func:`normalize_for_shingles` of UTF-8
    ``buf[s:e]`` into ``wh`` (uint32); returns the number of words, or -1 when the scratch
    buffers ``scr`` (uint8), ``bnd`` (int64) and ``wh`` are too small (grow, call again)."""
    info, rep_off, rep_cp, rep_word, ascii_lut = tables
    nb = _normalize(buf, s, e, info, rep_off, rep_cp, rep_word, ascii_lut, scr, bnd)
    if nb < 0 or nb // 2 > wh.shape[0]:
        return -1
    nw = nb // 2
    for k in range(nw):
        a = bnd[2 * k]
        n = bnd[2 * k + 1] - a
        if n < 8:  # most words: one tail block
            c0 = _load_u64le(scr, a) & (_ONES64 >> np.uint64(64 - 8 * n))
            h = _mm_final(((np.uint64(n) * _M64) ^ c0) * _M64)
        elif n <= 16:  # (loads here, not in a helper: passing the array costs refcounts)
            h = _murmur64a_short(_load_u64le(scr, a), _load_u64le(scr, a + 8), n)
        else:
            h = _murmur64a_long(scr, a, n)
        wh[k] = np.uint32(h & np.uint64(0xFFFFFFFF))
    return nw


@numba.njit(cache=True, nogil=True)
def _shingle_minhash(wh, nw, ngram, a, b, hv, sig):
    """``sig[p] = min over shingles of a[p] * fmix32(H) + b[p] mod 2**32`` (uint32 (P,)),
    H = :func:`shingle_hash32` of each shingle from the word hashes ``wh[:nw]``; ``hv`` is
    scratch (uint32, >= number of shingles). Returns the number of shingles; with none,
    ``sig`` is all 0xFFFFFFFF (datasketch's empty MinHash)."""
    P = a.shape[0]
    if nw == 0:
        for p in range(P):
            sig[p] = np.uint32(0xFFFFFFFF)
        return 0
    base = np.uint32(SHINGLE_BASE)
    if nw < ngram:  # one shingle of all the words
        h = np.uint32(0)
        for q in range(nw):
            h = np.uint32(h * base + wh[q])
        hv[0] = h
        nsh = 1
    else:
        # Horner's rule over the ngram words, one vectorized pass per word position
        # (instead of a rolling hash: no serial dependency from shingle to shingle)
        nsh = nw - ngram + 1
        for w in range(nsh):
            hv[w] = wh[w]
        for q in range(1, ngram):
            for w in range(nsh):
                hv[w] = np.uint32(hv[w] * base + wh[w + q])
    for w in range(nsh):  # shingle_hash32's fmix32, then datasketch's pre-mix
        hv[w] = _fmix32_u32(_fmix32_u32(hv[w]))
    # permutation-major, four permutations per pass over the shingle hashes (one load
    # feeds four multiply-add-min chains; 8 uint32 lanes on AVX2); uint32 wrap-around is
    # the affine32 "mod 2**32"
    p = 0
    while p + 4 <= P:
        a0, a1, a2, a3 = a[p], a[p + 1], a[p + 2], a[p + 3]
        b0, b1, b2, b3 = b[p], b[p + 1], b[p + 2], b[p + 3]
        m0 = m1 = m2 = m3 = np.uint32(0xFFFFFFFF)
        for w in range(nsh):
            h = hv[w]
            m0 = min(m0, np.uint32(a0 * h + b0))
            m1 = min(m1, np.uint32(a1 * h + b1))
            m2 = min(m2, np.uint32(a2 * h + b2))
            m3 = min(m3, np.uint32(a3 * h + b3))
        sig[p], sig[p + 1], sig[p + 2], sig[p + 3] = m0, m1, m2, m3
        p += 4
    while p < P:
        ap = a[p]
        bp = b[p]
        acc = np.uint32(0xFFFFFFFF)
        for w in range(nsh):
            acc = min(acc, np.uint32(ap * hv[w] + bp))
        sig[p] = acc
        p += 1
    return nsh


@numba.njit(cache=True, nogil=True)
def _signatures_kernel(buf, doc_off, ngram, a, b, tables, out, n_shingles):
    """buf: uint8, the documents' UTF-8 bytes (``surrogatepass``), concatenated; doc_off:
    int64 (n_docs + 1,); a, b: uint32 (P,) datasketch affine32 permutations; tables:
    :func:`_char_tables`; out: uint32 (n_docs, P); n_shingles: int64 (n_docs,)."""
    n_docs = doc_off.shape[0] - 1
    longest = 1
    for d in range(n_docs):
        longest = max(longest, doc_off[d + 1] - doc_off[d])
    # ASCII adds at most one byte and one boundary per byte: enough unless NFKC expands
    # (then grow); 128 bytes of slack for the expansion check and the 16-byte reads
    size = longest + 128
    scr = np.zeros(size, np.uint8)
    bnd = np.empty(size, np.int64)
    wh = np.empty(size // 2 + 64, np.uint32)
    hv = np.empty(size // 2 + 64, np.uint32)
    for d in range(n_docs):
        while True:
            nw = _word_hashes(buf, doc_off[d], doc_off[d + 1], tables, scr, bnd, wh)
            if nw >= 0:
                break
            size *= 2
            scr = np.zeros(size, np.uint8)
            bnd = np.empty(size, np.int64)
            wh = np.empty(size // 2 + 64, np.uint32)
            hv = np.empty(size // 2 + 64, np.uint32)
        n_shingles[d] = _shingle_minhash(wh, nw, ngram, a, b, hv, out[d])


_PAD = bytes(64)


@functools.lru_cache(maxsize=16)
def _permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from datasketch import MinHash

    a, b = MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME).permutations
    return a.astype(np.uint32), b.astype(np.uint32)


def minhash_signatures(
    texts: Iterable[str],
    num_perm: int = 128,
    seed: int = 1,
    ngram: int = 5,
    batch_size: int = 2048,
    return_shingle_counts: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """MinHash signatures of ``texts``.

    Returns a ``(n_docs, num_perm)`` uint32 array (with ``return_shingle_counts`` also an
    int64 ``(n_docs,)`` array of shingle counts). An empty document's row is all
    ``0xFFFFFFFF`` (datasketch's empty MinHash). Bit-identical to datasketch (see module
    docstring). Per document, Python only encodes the text to UTF-8; normalization (from
    tables) and word splitting (one pass over the bytes, 64 ASCII bytes at a time), word
    hashing, the shingle hashes and the minimum over permutations run in one numba kernel
    per batch.

    Raises:
        ValueError: ``num_perm``, ``ngram`` or ``batch_size`` < 1.
        TypeError: ``texts`` is one string, or holds something that is not a ``str`` (the
            message gives its index).
    """
    if num_perm < 1 or ngram < 1 or batch_size < 1:
        raise ValueError(f"num_perm, ngram and batch_size must be >= 1, got {num_perm}, "
                         f"{ngram}, {batch_size}")
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts is an iterable of documents (str), not a single "
                        f"{type(texts).__name__}")
    a, b = _permutations(num_perm, seed)
    tables = _char_tables()
    parts: list[np.ndarray] = []
    counts: list[np.ndarray] = []

    def flush(batch: list[bytes]) -> None:
        lens = np.fromiter(map(len, batch), np.int64, len(batch))
        off = np.zeros(len(batch) + 1, np.int64)
        np.cumsum(lens, out=off[1:])
        batch.append(_PAD)  # lets the last document's tail take the 64-byte path too
        buf = np.frombuffer(b"".join(batch), np.uint8)
        batch.pop()
        out = np.empty((len(batch), num_perm), np.uint32)
        nsh = np.empty(len(batch), np.int64)
        _signatures_kernel(buf, off, ngram, a, b, tables, out, nsh)
        parts.append(out)
        counts.append(nsh)

    it = iter(texts)
    done = 0
    while chunk := list(itertools.islice(it, batch_size)):
        try:
            batch = [t.encode("utf-8", "surrogatepass") for t in chunk]  # as _prepare
        except AttributeError:
            i, t = next((i, t) for i, t in enumerate(chunk) if not isinstance(t, str))
            raise TypeError(f"document {done + i} is a {type(t).__name__}, not a str") from None
        flush(batch)
        done += len(chunk)
    sig = np.concatenate(parts) if parts else np.empty((0, num_perm), np.uint32)
    if return_shingle_counts:
        return sig, (np.concatenate(counts) if counts else np.empty(0, np.int64))
    return sig


def to_minhash(signature: np.ndarray, seed: int = 1):
    """A ``datasketch.MinHash`` (scheme affine32, hashfunc :func:`shingle_hash32`) holding
    ``signature`` (uint32 ``(num_perm,)``); ``update`` on it continues consistently."""
    from datasketch import MinHash

    a, b = _permutations(len(signature), seed)
    return MinHash(seed=seed, hashfunc=shingle_hash32, hashvalues=np.asarray(signature),
                   permutations=(a, b), scheme=SCHEME)


def to_lean_minhash(signature: np.ndarray, seed: int = 1):
    """A ``datasketch.LeanMinHash`` of ``signature`` (for ``MinHashLSH`` and storage)."""
    from datasketch import LeanMinHash

    return LeanMinHash(seed=seed, hashvalues=np.asarray(signature), scheme=SCHEME)


@functools.lru_cache(maxsize=64)
def lsh_params(threshold: float, num_perm: int, false_positive_weight: float = 0.2,
               false_negative_weight: float = 0.8) -> tuple[int, int]:
    """``(bands, rows)`` with ``bands * rows <= num_perm`` minimizing the weighted
    integrated false-positive and false-negative probability of the LSH S-curve
    ``1 - (1 - s**rows)**bands`` around ``threshold`` (datasketch ``_optimal_param``).

    Raises:
        ValueError: threshold outside (0, 1) or weights not summing to 1.
    """
    from datasketch.lsh import _optimal_param

    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    if abs(false_positive_weight + false_negative_weight - 1.0) > 1e-9:
        raise ValueError("false_positive_weight + false_negative_weight must be 1")
    b, r = _optimal_param(threshold, num_perm, false_positive_weight, false_negative_weight)
    return int(b), int(r)


# ---------------------------------------------------------------------------------------
# LSH bands on Ray
# ---------------------------------------------------------------------------------------
def band_edges(sig: np.ndarray, valid: np.ndarray, band_lo: int, band_hi: int,
               rows: int) -> np.ndarray:
    """Candidate edges of bands ``[band_lo, band_hi)``.

    For every band, documents whose ``rows`` signature values in that band are all equal
    share a bucket; each bucket member is linked to the bucket's lowest index. Returns an
    int64 ``(m, 2)`` array of ``(lowest index, member index)``, unique, sorted. Rows with
    ``valid == False`` (empty documents) take part in no bucket.
    """
    idx_valid = np.flatnonzero(valid)
    out = []
    for band in range(band_lo, band_hi):
        block = np.ascontiguousarray(sig[idx_valid, band * rows:(band + 1) * rows])
        if block.shape[0] < 2:
            continue
        keys = block.view(np.dtype((np.void, block.dtype.itemsize * rows))).ravel()
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        new_group = np.ones(len(sk), bool)
        new_group[1:] = sk[1:] != sk[:-1]
        group_id = np.cumsum(new_group) - 1
        first_pos = np.flatnonzero(new_group)
        first = order[first_pos][group_id]
        member = order
        dup = ~new_group
        if dup.any():
            e = np.stack([idx_valid[first[dup]], idx_valid[member[dup]]], axis=1)
            out.append(e)
    if not out:
        return np.empty((0, 2), np.int64)
    return np.unique(np.concatenate(out).astype(np.int64), axis=0)


def _ray_band_edges(sig, valid, band_lo, band_hi, rows):
    return band_edges(sig, valid, band_lo, band_hi, rows)


def _ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=min(2, os.cpu_count() or 1), include_dashboard=False,
                 log_to_driver=False, configure_logging=False)


def lsh_candidate_edges(sig: np.ndarray, valid: np.ndarray, bands: int, rows: int,
                        n_tasks: int | None = None) -> np.ndarray:
    """All LSH candidate edges, bands split over Ray tasks (a new local Ray with at most 2
    CPUs if Ray is not initialized). Same result for any ``n_tasks``/worker count: int64
    ``(m, 2)``, unique, sorted."""
    import ray

    _ensure_ray()
    if n_tasks is None:
        n_tasks = max(1, int(ray.cluster_resources().get("CPU", 1)))
    n_tasks = max(1, min(n_tasks, bands))
    remote = ray.remote(num_cpus=1)(_ray_band_edges)
    sig_ref = ray.put(sig)
    valid_ref = ray.put(valid)
    bounds = np.linspace(0, bands, n_tasks + 1).astype(int)
    futs = [remote.remote(sig_ref, valid_ref, int(lo), int(hi), rows)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True) if hi > lo]
    parts = ray.get(futs)
    if not parts:
        return np.empty((0, 2), np.int64)
    return np.unique(np.concatenate(parts), axis=0)


@numba.njit(cache=True)
def _union_find(n, edges):
    parent = np.arange(n)
    for k in range(edges.shape[0]):
        x = edges[k, 0]
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        y = edges[k, 1]
        while parent[y] != y:
            parent[y] = parent[parent[y]]
            y = parent[y]
        if x < y:
            parent[y] = x
        elif y < x:
            parent[x] = y
    for i in range(n):
        r = i
        while parent[r] != r:
            r = parent[r]
        parent[i] = r
    return parent


@numba.njit(cache=True)
def _verify_clusters(sig, members, bounds, threshold, twin, sim):
    """members: indices grouped by cluster (ascending inside each), bounds: cluster
    starts (+ end). Sets twin[i] = kept representative (or -1 if i is kept), sim[i]."""
    P = sig.shape[1]
    reps = np.empty(members.shape[0], np.int64)
    for c in range(bounds.shape[0] - 1):
        lo = bounds[c]
        hi = bounds[c + 1]
        nrep = 1
        reps[0] = members[lo]
        twin[members[lo]] = -1
        for k in range(lo + 1, hi):
            i = members[k]
            found = -1
            best = 0.0
            for q in range(nrep):
                r = reps[q]
                eq = 0
                for p in range(P):
                    if sig[i, p] == sig[r, p]:
                        eq += 1
                j = eq / P
                if j >= threshold:
                    found = r
                    best = j
                    break
            if found >= 0:
                twin[i] = found
                sim[i] = best
            else:
                twin[i] = -1
                reps[nrep] = i
                nrep += 1


# ---------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------
@dataclass
class FuzzyDedupResult:
    """Outcome of :func:`fuzzy_dedup`.

    ``removed``: removed key -> (kept key, estimated Jaccard); ``params``: the settings to
    record in the manifest; ``cluster_sizes``: size of each duplicate cluster (kept
    document + removed twins, >= 2), descending; ``counters``: documents, empty,
    candidate_pairs, candidate_clusters, removed, kept_below_threshold and seconds.
    """

    removed: dict[str, tuple[str, float]]
    params: dict[str, Any]
    cluster_sizes: list[int] = field(default_factory=list)
    counters: dict[str, Any] = field(default_factory=dict)

    def is_removed(self, key: str) -> bool:
        return key in self.removed


def fuzzy_dedup(
    keys: Sequence[str],
    texts: Iterable[str],
    threshold: float = 0.8,
    ngram: int = 5,
    num_perm: int = 128,
    seed: int = 1,
    bands: int | None = None,
    rows: int | None = None,
    false_positive_weight: float = 0.2,
    false_negative_weight: float = 0.8,
    n_tasks: int | None = None,
    progress: bool = False,
) -> FuzzyDedupResult:
    """MinHash-LSH near-duplicate removal over a whole collection.

    Args:
        keys: unique document keys; the kept document of a cluster is the lowest key.
        texts: the documents' texts, same order and length as ``keys`` (read once).
        threshold: Jaccard threshold on word ``ngram`` shingles (LSH tuning and the
            removal check).
        num_perm, seed: MinHash size and datasketch permutation seed.
        bands, rows: LSH banding; by default :func:`lsh_params` of threshold/num_perm
            with the two weights below.
        false_positive_weight, false_negative_weight: weights of the integrated FP and
            FN probabilities. The default (0.2, 0.8) favours recall because every LSH
            candidate is verified against the threshold afterwards, so a false positive
            costs only a comparison: for 0.8/128 it gives 12 bands x 10 rows (candidate
            probability 0.74 at Jaccard 0.8, 0.93 at 0.85, 0.99 at 0.9), where the
            unweighted optimum (9 x 13) finds only 0.69 of pairs at 0.85.
        n_tasks: Ray tasks for the band grouping (default: cluster CPUs); no effect on
            the result.
        progress: show a tqdm bar while hashing.

    Returns:
        :class:`FuzzyDedupResult`.

    Raises:
        ValueError: duplicate keys, ``len(texts) != len(keys)``, bad threshold, or
            ``bands * rows > num_perm``.
    """
    keys = list(keys)
    n = len(keys)
    if len(set(keys)) != n:
        dup = [k for k, c in Counter(keys).items() if c > 1][:3]
        raise ValueError(f"fuzzy_dedup: duplicate document keys, e.g. {dup}")
    if bands is None or rows is None:
        bands, rows = lsh_params(threshold, num_perm, false_positive_weight,
                                 false_negative_weight)
    if bands * rows > num_perm:
        raise ValueError(f"bands*rows = {bands}*{rows} exceeds num_perm = {num_perm}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    t0 = time.perf_counter()
    it: Iterable[str] = texts
    if progress:
        from tqdm import tqdm

        it = tqdm(texts, total=n, desc="minhash", unit="doc")
    sig, nsh = minhash_signatures(it, num_perm=num_perm, seed=seed, ngram=ngram,
                                  return_shingle_counts=True)
    if sig.shape[0] != n:
        raise ValueError(f"fuzzy_dedup: {sig.shape[0]} texts for {n} keys")
    result = fuzzy_dedup_signatures(
        keys, sig, nsh, threshold=threshold, ngram=ngram, seed=seed, bands=bands, rows=rows,
        false_positive_weight=false_positive_weight,
        false_negative_weight=false_negative_weight, n_tasks=n_tasks)
    result.counters["seconds"]["signatures"] = round(time.perf_counter() - t0, 3) - sum(
        v for k, v in result.counters["seconds"].items() if k != "signatures")
    return result


def fuzzy_dedup_signatures(
    keys: Sequence[str], sig: np.ndarray, nsh: np.ndarray, threshold: float = 0.8,
    ngram: int = 5, seed: int = 1, bands: int | None = None, rows: int | None = None,
    false_positive_weight: float = 0.2, false_negative_weight: float = 0.8,
    n_tasks: int | None = None,
) -> FuzzyDedupResult:
    """:func:`fuzzy_dedup` from precomputed signatures (the executor computes them per
    block on Ray workers and holds only ``num_perm * 4`` bytes per document).

    Args:
        keys: unique document keys, length n.
        sig: uint32[n, num_perm] from :func:`minhash_signatures` (same ngram and seed).
        nsh: int64[n] shingle counts (0 = too short to compare; never a duplicate).
    """
    keys = list(keys)
    n = len(keys)
    num_perm = int(sig.shape[1]) if sig.ndim == 2 else 0
    if sig.shape[0] != n or len(nsh) != n:
        raise ValueError(f"fuzzy_dedup: {sig.shape[0]} signatures for {n} keys")
    if bands is None or rows is None:
        bands, rows = lsh_params(threshold, num_perm, false_positive_weight,
                                 false_negative_weight)
    t1 = time.perf_counter()
    # documents in key order: index = rank of the key
    order = np.array(sorted(range(n), key=keys.__getitem__), dtype=np.int64)
    sig = np.ascontiguousarray(sig[order])
    valid = nsh[order] > 0
    if int(valid.sum()) >= 2:
        edges = lsh_candidate_edges(sig, valid, bands, rows, n_tasks=n_tasks)
    else:  # nothing to compare: no need for Ray
        edges = np.empty((0, 2), np.int64)
    t2 = time.perf_counter()
    root = _union_find(n, edges) if n else np.empty(0, np.int64)
    sizes = np.bincount(root, minlength=n) if n else np.empty(0, np.int64)
    in_cluster = np.flatnonzero(sizes[root] > 1)
    removed: dict[str, tuple[str, float]] = {}
    cluster_sizes: list[int] = []
    kept_below = 0
    if in_cluster.size:
        grp = np.lexsort((in_cluster, root[in_cluster]))
        members = in_cluster[grp].astype(np.int64)
        r = root[members]
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        bounds = np.r_[starts, len(members)].astype(np.int64)
        twin = np.full(n, -1, np.int64)
        sim = np.zeros(n, np.float64)
        _verify_clusters(sig, members, bounds, float(threshold), twin, sim)
        dups = np.flatnonzero(twin >= 0)
        for i in dups:
            removed[keys[order[i]]] = (keys[order[twin[i]]], float(sim[i]))
        per_kept = np.bincount(twin[dups], minlength=n)
        cluster_sizes = sorted((per_kept[per_kept > 0] + 1).tolist(), reverse=True)
        kept_below = int(len(members) - len(dups) - (len(bounds) - 1))
    t3 = time.perf_counter()
    params = {"num_perm": num_perm, "bands": bands, "rows": rows, "threshold": threshold,
              "ngram": ngram, "seed": seed, "hash": HASH_NAME, "scheme": SCHEME,
              "false_positive_weight": false_positive_weight,
              "false_negative_weight": false_negative_weight}
    counters = {"documents": n, "empty": int((~valid).sum()),
                "candidate_pairs": int(len(edges)),
                "candidate_clusters": int((sizes > 1).sum()) if n else 0,
                "removed": len(removed), "kept_below_threshold": kept_below,
                "seconds": {"signatures": 0.0, "lsh": round(t2 - t1, 3),
                            "clusters": round(t3 - t2, 3)}}
    return FuzzyDedupResult(removed=removed, params=params, cluster_sizes=cluster_sizes,
                            counters=counters)


class FuzzyDedup(PipelineStep):
    """MinHash-LSH near-duplicate removal as a stage (see :func:`fuzzy_dedup`).

    It reads its whole input before yielding (a global stage), then yields the kept
    documents in input order and rejects the others with reason
    ``"fuzzy_dedup:near_duplicate"``, ``duplicate_of`` = the kept key and
    ``detail = "jaccard=<estimate>"``. After running, ``self.result`` holds the
    :class:`FuzzyDedupResult` (its ``params`` belong in the manifest).
    """

    name = "fuzzy_dedup"
    version = 1

    def __init__(self, threshold: float = 0.8, ngram: int = 5, num_perm: int = 128,
                 seed: int = 1, bands: int | None = None, rows: int | None = None,
                 false_positive_weight: float = 0.2,
                 false_negative_weight: float = 0.8) -> None:
        super().__init__(threshold=threshold, ngram=ngram, num_perm=num_perm, seed=seed,
                         bands=bands, rows=rows, false_positive_weight=false_positive_weight,
                         false_negative_weight=false_negative_weight)
        self.result: FuzzyDedupResult | None = None

    def run(self, docs: Iterable[Document]) -> Iterator[Document]:
        docs = list(docs)
        self.result = fuzzy_dedup([d.key for d in docs], (d.text for d in docs),
                                  **self.config)
        for d in docs:
            hit = self.result.removed.get(d.key)
            if hit is None:
                yield d
            else:
                self.reject(d, "fuzzy_dedup:near_duplicate", duplicate_of=hit[0],
                            detail=f"jaccard={hit[1]:.3f}")
