"""numba kernels of :class:`~tokenmill.pipeline.document.fasttext_model.FastTextModel`:
fastText 0.9.2's ``Dictionary::getLine``, ``Model::computeHidden`` and
``HierarchicalSoftmaxLoss::dfs`` with k = 1, float32 arithmetic in fastText's order.

A token's input rows (its word id, then its character n-grams' pruned buckets) depend on
its bytes only, so they are remembered per distinct token (the memo, bounded, emptied
when full): a repeated word costs one hash, one comparison and its row additions, which
stay in fastText's order, so the sums are the same floats.

Arrays passed in:

* ``vocab``: (word table int32 ``[2**k]``, word bytes uint8, word starts int64
  ``[nwords + 1]``, n-gram table int32 ``[2**k, 2]`` of (bucket, row) (``[0, 2]``: every
  bucket kept), params int64 ``[minn, maxn, bucket, eos_id, nwords]``).
* ``memo``: (table int32 ``[2**k]``, hashes int64 ``[E]``, byte starts int64 ``[E + 1]``,
  bytes uint8 ``[B]``, row starts int64 ``[E + 1]``, rows int32 ``[R]``, used int64 ``[1]``
  entries).
"""

from __future__ import annotations

import numba
import numpy as np

_FNV_OFFSET, _FNV_PRIME = 2166136261, 16777619
#: fastText's hash of "</s>"
_EOS_HASH = 3617362777
_WORD_NGRAM_PRIME = 116049371
#: tokens longer than this (bytes) are not remembered
MEMO_TOKEN_BYTES = 64


@numba.njit(cache=True, inline="always")
def _fnv_step(h: int, byte: int) -> int:
    signed = byte | 0xFFFFFF00 if byte >= 128 else byte  # fastText hashes signed chars
    return ((h ^ signed) * _FNV_PRIME) & 0xFFFFFFFF


@numba.njit(cache=True, inline="always")
def _is_separator(byte: int) -> bool:
    # fastText's readWord: space \n \r \t \v \f \0
    return byte == 32 or byte == 10 or byte == 13 or byte == 9 or byte == 11 or byte == 12 \
        or byte == 0


@numba.njit(cache=True, inline="always")
def _same_bytes(a, a_start, b, b_start, size):
    for k in range(size):
        if a[a_start + k] != b[b_start + k]:
            return False
    return True


@numba.njit(cache=True, inline="always")
def _word_id(data, start, end, h, vocab):
    table, word_bytes, word_starts = vocab[0], vocab[1], vocab[2]
    mask = table.size - 1
    slot = h & mask
    while table[slot] >= 0:
        wid = table[slot]
        ws = word_starts[wid]
        if word_starts[wid + 1] - ws == end - start \
                and _same_bytes(word_bytes, ws, data, start, end - start):
            return wid
        slot = (slot + 1) & mask
    return -1


@numba.njit(cache=True)
def _is_label(data, start, end):
    prefix = b"__label__"
    return end - start >= len(prefix) and _same_bytes(data, start, prefix, 0, len(prefix))


@numba.njit(cache=True)
def _is_eos(data, start, end):
    return end - start == 4 and data[start] == 60 and data[start + 1] == 47 \
        and data[start + 2] == 115 and data[start + 3] == 62  # "</s>"


@numba.njit(cache=True, inline="always")
def ngram_slot(key: int, mask: int) -> int:
    """Home slot of an n-gram bucket in the pruned model's table (Fibonacci hashing)."""
    return ((key * 2654435761) >> 16) & mask


@numba.njit(cache=True, inline="always")
def _ngram_row(key, ngrams, nwords):
    """Input row of n-gram bucket ``key``, -1 where the model pruned it."""
    if ngrams.shape[0] == 0:
        return nwords + key
    mask = ngrams.shape[0] - 1
    slot = ngram_slot(key, mask)
    while ngrams[slot, 0] >= 0:
        if ngrams[slot, 0] == key:
            return ngrams[slot, 1]
        slot = (slot + 1) & mask
    return -1


@numba.njit(cache=True)
def _ngram_rows(word, size, vocab, rows, n_rows):
    """Append to ``rows`` the input rows of the character n-grams of ``word[:size]``
    (``<token>``), as fastText's computeSubwords and pushHash; returns the new count."""
    ngrams, minn, maxn, bucket, nwords = vocab[3], vocab[4][0], vocab[4][1], vocab[4][2], \
        vocab[4][4]
    for i in range(size):
        if word[i] & 0xC0 == 0x80:
            continue
        h, j, n = _FNV_OFFSET, i, 1
        while j < size and n <= maxn:
            h = _fnv_step(h, word[j])
            j += 1
            while j < size and word[j] & 0xC0 == 0x80:
                h = _fnv_step(h, word[j])
                j += 1
            if n >= minn and not (n == 1 and (i == 0 or j == size)):
                row = _ngram_row(h % bucket, ngrams, nwords)
                if row >= 0:
                    rows[n_rows] = row
                    n_rows += 1
            n += 1
    return n_rows


@numba.njit(cache=True)
def _token_rows(data, start, end, h, vocab, word, rows):
    """Write the input rows of one token into ``rows`` as fastText's getLine and
    addSubwords (a ``__label__`` token has none); returns how many."""
    wid = _word_id(data, start, end, h, vocab)
    if wid < 0 and _is_label(data, start, end):
        return 0
    n_rows = 0
    if wid >= 0:
        rows[0] = wid
        n_rows = 1
    if vocab[4][1] <= 0:
        return n_rows
    size = end - start + 2
    word[0] = 60  # "<"
    word[1:size - 1] = data[start:end]
    word[size - 1] = 62  # ">"
    return _ngram_rows(word, size, vocab, rows, n_rows)


@numba.njit(cache=True, inline="always")
def _memo_find(data, start, end, h, memo):
    """The memo entry of the token ``data[start:end]`` (hash ``h``), or ``-(slot + 1)``
    of the free slot where it goes."""
    table, hashes, byte_starts, memo_bytes = memo[0], memo[1], memo[2], memo[3]
    mask = table.size - 1
    slot = h & mask
    while table[slot] >= 0:
        e = table[slot]
        bs = byte_starts[e]
        if hashes[e] == h and byte_starts[e + 1] - bs == end - start \
                and _same_bytes(memo_bytes, bs, data, start, end - start):
            return e
        slot = (slot + 1) & mask
    return -(slot + 1)


@numba.njit(cache=True)
def _memo_store(slot, data, start, end, h, rows, n_rows, memo):
    """Remember the token's rows at ``slot``; a full memo is emptied first."""
    table, hashes, byte_starts, memo_bytes, row_starts, memo_rows, used = memo
    e = used[0]
    size = end - start
    if size > memo_bytes.size or n_rows > memo_rows.size:
        return  # never fits
    if e + 1 >= hashes.size or byte_starts[e] + size > memo_bytes.size \
            or row_starts[e] + n_rows > memo_rows.size:
        table[:] = -1
        e = 0
        slot = h & (table.size - 1)
    table[slot] = e
    hashes[e] = h
    byte_starts[e + 1] = byte_starts[e] + size
    memo_bytes[byte_starts[e]:byte_starts[e + 1]] = data[start:end]
    row_starts[e + 1] = row_starts[e] + n_rows
    memo_rows[row_starts[e]:row_starts[e + 1]] = rows[:n_rows]
    used[0] = e + 1


@numba.njit(cache=True, inline="always")
def _add_row(hidden, weights, row):
    for j in range(hidden.size):
        hidden[j] += weights[row, j]


@numba.njit(cache=True)
def _add_new_token(data, start, end, h, slot, hidden, weights, vocab, memo, word, rows):
    """The memo's miss: find the token's rows, add them, remember them at ``slot``
    (-1: too long to remember); returns how many."""
    most = 1 + (end - start + 2) * max(vocab[4][1], 1)
    buf = rows if most <= rows.size else np.empty(most, dtype=np.int32)
    n_rows = _token_rows(data, start, end, h, vocab, word, buf)
    for k in range(n_rows):
        _add_row(hidden, weights, buf[k])
    if slot >= 0:
        _memo_store(slot, data, start, end, h, buf, n_rows, memo)
    return n_rows


@numba.njit(cache=True)
def _line_hidden(data, at, hidden, weights, vocab, memo, word, rows, hashes):
    """Sum the input rows of the line starting at ``data[at]`` (ended by ``\\n``, read as
    fastText's end-of-sentence word) into ``hidden``, and write the hashes of its words
    (not labels; the end-of-sentence word last) into ``hashes``; returns (rows, start of
    the next line, words). A token ``</s>`` ends the line there, as in fastText."""
    # one call per line: a call per token would cost more than the token (numba counts
    # references of every array passed), so a remembered token is added right here
    memo_row_starts, memo_rows = memo[4], memo[5]
    n_rows, n_words = 0, 0
    i = at
    while True:
        while data[i] != 10 and _is_separator(data[i]):
            i += 1
        start = i
        h = _FNV_OFFSET
        while not _is_separator(data[i]):
            h = _fnv_step(h, data[i])
            i += 1
        if i == start or _is_eos(data, start, i):  # the line's end, or a literal </s>
            eos_id = vocab[4][3]
            if eos_id >= 0:
                _add_row(hidden, weights, eos_id)
                n_rows += 1
            hashes[n_words] = _EOS_HASH
            while data[i] != 10:
                i += 1
            return n_rows, i + 1, n_words + 1
        if not _is_label(data, start, i):
            hashes[n_words] = h
            n_words += 1
        elif vocab[4][1] <= 0:
            continue  # a label: no rows
        if vocab[4][1] <= 0:  # no character n-grams: the word's own row, no memo needed
            wid = _word_id(data, start, i, h, vocab)
            if wid >= 0:
                _add_row(hidden, weights, wid)
                n_rows += 1
            continue
        slot = -1
        if i - start <= MEMO_TOKEN_BYTES:
            found = _memo_find(data, start, i, h, memo)
            if found >= 0:
                for k in range(memo_row_starts[found], memo_row_starts[found + 1]):
                    _add_row(hidden, weights, memo_rows[k])
                n_rows += memo_row_starts[found + 1] - memo_row_starts[found]
                continue
            slot = -found - 1
        n_rows += _add_new_token(data, start, i, h, slot, hidden, weights, vocab, memo, word,
                                 rows)


@numba.njit(cache=True, inline="always")
def _std_log(x):
    # fastText's std_log: log(x + 1e-5) in double, of and to float
    return np.float32(np.log(np.float64(np.float32(x)) + 1e-5))


@numba.njit(cache=True)
def _tree_walk(hidden, output, left, right, out, top_only):
    """fastText's HierarchicalSoftmaxLoss::dfs with threshold 0: the same walk (left before
    right), pruning and logarithms. ``top_only`` (k = 1): subtrees scoring below the best
    leaf so far are pruned, a later leaf of equal score wins; returns (label, log-
    probability), label -1 if every leaf was pruned. Else (k = every label): each leaf's
    log-probability into ``out`` (``-inf`` where pruned); returns (-1, 0)."""
    osz = output.shape[0]
    floor = _std_log(0.0)
    out[:] = -np.inf
    nodes = np.empty(2 * osz, dtype=np.int64)
    scores = np.empty(2 * osz, dtype=np.float32)
    nodes[0], scores[0], top = 2 * osz - 2, np.float32(0.0), 1
    best, best_score = -1, np.float32(0.0)
    while top > 0:
        top -= 1
        node, score = nodes[top], scores[top]
        if score < floor or (top_only and best >= 0 and score < best_score):
            continue
        if left[node] == -1 and right[node] == -1:
            if top_only:
                best, best_score = node, score
            else:
                out[node] = score
            continue
        f = np.float32(0.0)
        for j in range(hidden.size):
            f += output[node - osz, j] * hidden[j]
        f = np.float32(1.0 / np.float64(np.float32(1.0) + np.exp(-f)))
        nodes[top], scores[top] = right[node], score + _std_log(f)
        nodes[top + 1], scores[top + 1] = left[node], score + _std_log(1.0 - np.float64(f))
        top += 2
    return best, best_score


@numba.njit(cache=True)
def _add_word_ngrams(hidden, weights, vocab, hashes, n_words, word_ngrams):
    """Add the rows of the line's word n-grams (n = 2 .. ``word_ngrams``), as fastText's
    addWordNgrams: hashes read as int32 and widened to uint64; returns how many."""
    ngrams, bucket, nwords = vocab[3], vocab[4][2], vocab[4][4]
    added = 0
    for i in range(n_words):
        h = _widened(hashes[i])
        for j in range(i + 1, min(n_words, i + word_ngrams)):
            h = h * np.uint64(_WORD_NGRAM_PRIME) + _widened(hashes[j])
            row = _ngram_row(np.int64(h % np.uint64(bucket)), ngrams, nwords)
            if row >= 0:
                _add_row(hidden, weights, row)
                added += 1
    return added


@numba.njit(cache=True, inline="always")
def _widened(h):
    # a uint32 hash stored as fastText's int32, then widened (sign-extended) to uint64
    return np.uint64(h) | np.uint64(0xFFFFFFFF00000000) if h >= 0x80000000 else np.uint64(h)


@numba.njit(cache=True)
def _hidden(data, at, hidden, weights, vocab, memo, word, rows, hashes, word_ngrams):
    """fastText's computeHidden of the line at ``data[at]``: the mean of its input rows
    (words, character and word n-grams) in ``hidden``; returns (rows, next line)."""
    hidden[:] = 0
    n_rows, at, n_words = _line_hidden(data, at, hidden, weights, vocab, memo, word, rows,
                                       hashes)
    if word_ngrams > 1:
        n_rows += _add_word_ngrams(hidden, weights, vocab, hashes, n_words, word_ngrams)
    if n_rows > 0:
        scale = np.float32(1.0 / n_rows)
        for j in range(hidden.size):
            hidden[j] *= scale
    return n_rows, at


@numba.njit(cache=True)
def _softmax(hidden, output, out):
    """fastText's SoftmaxLoss::computeOutput into ``out`` (float32)."""
    for i in range(output.shape[0]):
        d = np.float32(0.0)
        for j in range(hidden.size):
            d += output[i, j] * hidden[j]
        out[i] = d
    top = out[0]
    for i in range(out.size):
        top = max(out[i], top)
    z = np.float32(0.0)
    for i in range(out.size):
        out[i] = np.float32(np.exp(np.float64(out[i] - top)))
        z += out[i]
    for i in range(out.size):
        out[i] /= z


def _check_lines(data, nlines):
    if data.size == 0 or data[data.size - 1] != 10 or int((data == 10).sum()) != nlines:
        raise ValueError("predict_lines reads nlines lines, each ended by a newline")


@numba.njit(cache=True)
def _scratch(data, vocab):
    word = np.empty(data.size + 2, dtype=np.uint8)
    rows = np.empty(1 + (MEMO_TOKEN_BYTES + 2) * max(vocab[4][1], 1), dtype=np.int32)
    hashes = np.empty(data.size + 1, dtype=np.int64)
    return word, rows, hashes


@numba.njit(cache=True)
def _top_label(hidden, output, left, right, softmax, out):
    """(label, probability) as fastText's predict with k = 1 (label -1: none)."""
    if softmax:
        _softmax(hidden, output, out)
        label, score = -1, np.float32(0.0)
        for i in range(out.size):  # findKBest, k = 1: a later label of equal score wins
            if label < 0 or _std_log(out[i]) >= score:
                label, score = i, _std_log(out[i])
    else:
        label, score = _tree_walk(hidden, output, left, right, out, True)
    return label, np.exp(score) if label >= 0 else np.float32(0.0)


@numba.njit(cache=True)
def _label_probs(hidden, output, left, right, softmax, out, probs):
    """Every label's probability into ``probs`` as fastText's predict with k = -1 lists
    it (0.0 for a label left out)."""
    if softmax:
        _softmax(hidden, output, out)
        for i in range(out.size):
            probs[i] = np.exp(_std_log(out[i]))
    else:
        _tree_walk(hidden, output, left, right, out, False)
        for i in range(out.size):
            probs[i] = np.exp(out[i]) if out[i] > -np.inf else np.float32(0.0)


@numba.njit(cache=True)
def _predict(data, nlines, weights, output, left, right, vocab, memo, softmax, word_ngrams,
             every_label):
    found = np.full(nlines, -1, dtype=np.int32)
    probs = np.zeros((nlines, output.shape[0] if every_label else 1), dtype=np.float32)
    hidden = np.zeros(output.shape[1], dtype=np.float32)
    out = np.zeros(output.shape[0], dtype=np.float32)
    word, rows, hashes = _scratch(data, vocab)
    at = 0
    for line in range(nlines):
        n_rows, at = _hidden(data, at, hidden, weights, vocab, memo, word, rows, hashes,
                             word_ngrams)
        if n_rows == 0:
            continue
        if every_label:
            _label_probs(hidden, output, left, right, softmax, out, probs[line])
        else:
            found[line], probs[line, 0] = _top_label(hidden, output, left, right, softmax,
                                                     out)
    return found, probs


def predict_lines(data: np.ndarray, nlines: int, weights: np.ndarray, output: np.ndarray,
                  left: np.ndarray, right: np.ndarray, vocab: tuple, memo: tuple,
                  softmax: bool = False, word_ngrams: int = 1
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Top label (int32 ``[nlines]``, -1 for none) and its probability (float32) of each
    ``\\n``-ended line in the UTF-8 bytes ``data`` (uint8), as fastText's ``predict``
    with k = 1; ``weights`` float32 ``[rows, dim]`` (decoded input matrix), ``output``
    float32 ``[labels, dim]``, ``left``/``right`` int32 tree children (hierarchical
    softmax), ``softmax``: the model's loss is softmax.

    Raises:
        ValueError: ``data`` is not ``nlines`` newline-ended lines.
    """
    _check_lines(data, nlines)
    found, probs = _predict(data, nlines, weights, output, left, right, vocab, memo, softmax,
                            word_ngrams, False)
    return found, probs[:, 0]


def predict_all_lines(data: np.ndarray, nlines: int, weights: np.ndarray, output: np.ndarray,
                      left: np.ndarray, right: np.ndarray, vocab: tuple, memo: tuple,
                      softmax: bool = False, word_ngrams: int = 1) -> np.ndarray:
    """float32 ``[nlines, labels]``: every label's probability as fastText's ``predict``
    with k = -1 lists it (0.0 for a label it does not list). Arguments as
    :func:`predict_lines`.

    Raises:
        ValueError: ``data`` is not ``nlines`` newline-ended lines.
    """
    _check_lines(data, nlines)
    return _predict(data, nlines, weights, output, left, right, vocab, memo, softmax,
                    word_ngrams, True)[1]
