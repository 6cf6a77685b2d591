"""Reference (pure Python) shingling and hashes of the MinHash dedup: what the numba
kernels in :mod:`.kernels` compute, for tests, peers and datasketch.

Shingles are word ``ngram``-grams of :func:`normalize_for_shingles`; a shingle's hash is
:func:`shingle_hash32` (a Karp-Rabin polynomial of its words' MurmurHash64A hashes,
then MurmurHash3's ``fmix32``).
"""

from __future__ import annotations

import functools
import re
import unicodedata

import numpy as np

MAX_HASH32 = np.uint32(0xFFFFFFFF)
SCHEME = "affine32"
HASH_NAME = ("shingle_hash32: fmix32 of a base-0x9E3779B1 polynomial of the words' "
             "murmur64a (low 32 bits); datasketch affine32 permutations")

_NON_WORD = re.compile(r"[\W_]+")


@functools.lru_cache(maxsize=1)
def char_map() -> dict[int, str]:
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
    mapped = text.translate(char_map())
    return _NON_WORD.sub(" ", mapped).strip()


def utf8_bytes(text: str) -> bytes:
    """What the kernel reads of a document: its UTF-8 bytes (lone surrogates kept);
    all normalization happens in the kernel."""
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
