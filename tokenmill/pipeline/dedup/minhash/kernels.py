"""The numba kernels of MinHash signatures: normalization from tables, word splitting
(64 ASCII bytes at a time), MurmurHash64A word hashes, Karp-Rabin shingle hashes and the
minimum over datasketch's affine32 permutations, in one pass over a batch's UTF-8 bytes.

Bit-identical to the reference in :mod:`.reference` (tests compare them on real and
adversarial text).
"""

from __future__ import annotations

import functools
import sys
import unicodedata

import numba
import numpy as np
from llvmlite import ir as llvm_ir
from numba.core import types
from numba.extending import intrinsic

from tokenmill.pipeline.dedup.minhash import reference
from tokenmill.pipeline.dedup.minhash.reference import MURMUR64A_M, SHINGLE_BASE, char_map
from tokenmill.tablecache import cached_arrays, source_sha256


@numba.njit(inline="always")
def _fmix32_u32(h):
    # numba widens uint32 products to 64 bits: truncate explicitly
    h = np.uint32(h ^ (h >> np.uint32(16)))
    h = np.uint32(h * np.uint32(0x85EBCA6B))
    h = np.uint32(h ^ (h >> np.uint32(13)))
    h = np.uint32(h * np.uint32(0xC2B2AE35))
    return np.uint32(h ^ (h >> np.uint32(16)))


@functools.lru_cache(maxsize=1)
def char_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tables of the kernel's per-code-point normalization (see
    :func:`normalize_for_shingles`), built once per machine (about 1 s of Python) and
    loaded from :mod:`tokenmill.tablecache` by every other process:

    * ``info``: int32 (0x110000,), per code point 0 (separator), 1 (alphanumeric, kept as
      is) or ``2 + k`` (replaced by replacement k);
    * ``rep_off``: int64 (n_rep + 1,), ``rep_cp``: int64, the replacements' code points,
      ``rep_word``: uint8, 1 where such a code point is alphanumeric;
    * ``ascii``: uint8 (128,), the lower-cased byte of an ASCII alphanumeric, else 0.
    """
    key = [unicodedata.unidata_version, source_sha256(__file__, reference.__file__)]
    return cached_arrays("shingle-chars", key, _build_char_tables)  # type: ignore[return-value]


def _build_char_tables() -> tuple[np.ndarray, ...]:
    word = np.array([chr(i).isalnum() for i in range(0x110000)], dtype=np.uint8)
    cmap = char_map()
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
def signatures_kernel(buf, doc_off, ngram, a, b, tables, out, n_shingles):
    """buf: uint8, the documents' UTF-8 bytes (``surrogatepass``), concatenated; doc_off:
    int64 (n_docs + 1,); a, b: uint32 (P,) datasketch affine32 permutations; tables:
    :func:`char_tables`; out: uint32 (n_docs, P); n_shingles: int64 (n_docs,)."""
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
