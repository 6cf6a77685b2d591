"""Pre-tokenizer (regex) side of the legality table: which token junctions can be a piece
boundary, and which can lie inside one regex piece.

tiktoken first splits text with the encoding's ``pat_str`` regex and runs BPE inside each
piece; merges never cross a piece boundary. For an adjacent output pair ``(a, b)`` the junction
between them is therefore either

* a **piece boundary** (``cross``): ``a`` ends a piece and ``b`` starts the next one; the regex
  alone decides whether that is possible, or
* **inside one piece** (``within``): the regex must allow ``a``'s end and ``b``'s start in the
  same piece, and then BPE decides (see :mod:`tokenmill.tokenizers.legality_bpe`).

Each token is summarised by a small *signature* of its end (as a left token) and of its start
(as a right token): the UTF-8 state at the edge (continuation bytes still needed / leading
continuation bytes), the regex character class of the edge character (space ``S``, CR/LF
``R``, other white space ``W``, letter ``L``, number ``N``, apostrophe ``Q``, other ``P``),
and a few whole-token flags the regex cares about (all white space, one character, a single
space, all digits and how many, contraction suffix). The rules below were derived by hand from
the two regexes, alternative by alternative, and are *over-approximations*: whenever a
character is not fully known (a token that starts or ends inside a multi-byte character, a
code point unassigned in Python's Unicode tables) every class it could have is allowed. The
tests check them against tiktoken itself on real corpora and on adversarial contexts.

Supported regexes (as spelled by tiktoken >= 0.9): GPT-2 / r50k / p50k, cl100k_base and
o200k_base (whose letter pieces also split where a lower-case letter meets an upper-case one,
end with a contraction, and whose punctuation pieces may end with CR/LF and '/'; combining
marks are treated conservatively there). Any other ``pat_str`` gets the conservative model:
every junction at a character boundary may be a piece boundary, so only UTF-8 constraints and
unrealisable tokens produce impossible pairs.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np

# class bits
S, R, W, L, N, Q, P = 1, 2, 4, 8, 16, 32, 64
# o200k_base splits letters by case and treats combining marks specially
U, LW, B, MK = 128, 256, 512, 1024  # Lu/Lt, Ll, Lm/Lo, \p{M}
WS = S | R | W
MB = L | N | P | W  # what a multi-byte character can be (never ' ', CR, LF or "'")
MB_FINE = U | LW | B | MK | N | P | W
CLASS_NAMES = {S: "space", R: "CR/LF", W: "other white space", L: "letter", N: "number",
               Q: "apostrophe", P: "punctuation/symbol", U: "upper/title-case letter",
               LW: "lower-case letter", B: "modifier/other letter", MK: "combining mark"}

# Unicode White_Space (what the Rust regex crate used by tiktoken means by \s)
_WHITE_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)
}

R50K_PAT = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_CONTRACTIONS = ("s", "d", "m", "t", "ll", "ve", "re")


O200K_PAT = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


def model_for_pattern(pat_str: str) -> str:
    """``"r50k"``, ``"cl100k"``, ``"o200k"`` or ``"generic"`` (conservative) for a tiktoken
    ``pat_str``."""
    if pat_str == R50K_PAT:
        return "r50k"
    if pat_str == CL100K_PAT:
        return "cl100k"
    if pat_str == O200K_PAT:
        return "o200k"
    return "generic"


_CLASS_CACHE: dict[str, int] = {}


def char_class(ch: str) -> int:
    """Class bits of one complete character (several bits when uncertain)."""
    c = _CLASS_CACHE.get(ch)
    if c is None:
        c = _CLASS_CACHE[ch] = _char_class(ch)
    return c


_FINE_CACHE: dict[str, int] = {}


def char_class_fine(ch: str) -> int:
    """Like :func:`char_class` but letters by case (``U``/``LW``/``B``) and marks ``MK``
    (o200k_base)."""
    c = _FINE_CACHE.get(ch)
    if c is None:
        c = char_class(ch)
        if c & L or c == P:
            cat = unicodedata.category(ch)
            if cat in ("Lu", "Lt"):
                c = U
            elif cat == "Ll":
                c = LW
            elif cat in ("Lm", "Lo"):
                c = B
            elif cat[0] == "M":
                c = MK
            elif cat == "Cn":
                c = U | LW | B | MK | N | P
        _FINE_CACHE[ch] = c
    return c


def _char_class(ch: str) -> int:
    if ch == " ":
        return S
    if ch in "\r\n":
        return R
    if ch in _WHITE_SPACE:
        return W
    if ch == "'":
        return Q
    cat = unicodedata.category(ch)
    if cat[0] == "L":
        return L
    if cat[0] == "N":
        return N
    if cat == "Cn":  # unassigned here, maybe assigned in the regex engine's Unicode version
        return L | N | P
    return P


def _valid_incomplete(p: bytes) -> int:
    """Continuation bytes still needed if ``p`` is a valid proper prefix of a UTF-8 character,
    else -1."""
    lead = p[0]
    if 0xC2 <= lead <= 0xDF:
        total = 2
    elif 0xE0 <= lead <= 0xEF:
        total = 3
    elif 0xF0 <= lead <= 0xF4:
        total = 4
    else:
        return -1
    if len(p) >= total:
        return -1
    for fill in (0x80, 0x90, 0xA0, 0xBF):
        try:
            (p + bytes([fill]) * (total - len(p))).decode("utf-8")
            return total - len(p)
        except UnicodeDecodeError:
            continue
    return -1


@dataclass(frozen=True)
class TokenShape:
    """UTF-8 and character-class view of one token's bytes.

    ``lead_cont``: leading continuation bytes (finishing a character begun in the previous
    token); ``all_cont``: the token is only continuation bytes; ``needs``: bit set of how many
    continuation bytes may still follow (bit 0 = ends on a character boundary); ``classes``:
    class bits of the token's characters, in order, where a character only partly inside the
    token counts with every class a multi-byte character may have; ``text``: the complete
    characters fully inside the token.
    """

    valid: bool
    lead_cont: int
    all_cont: bool
    needs: int
    classes: tuple[int, ...]
    text: str
    tail_partial: bool


def token_shape(b: bytes, fine: bool = False) -> TokenShape:
    """Analyse a token's bytes as a substring of valid UTF-8 (see :class:`TokenShape`);
    ``fine`` classifies letters by case and marks apart (o200k_base)."""
    cls = char_class_fine if fine else char_class
    mb = MB_FINE if fine else MB
    if b.isascii():
        text = b.decode("ascii")
        return TokenShape(True, 0, False, 1, tuple(map(cls, text)), text, False)
    m = 0
    while m < len(b) and 0x80 <= b[m] <= 0xBF:
        m += 1
    if m == len(b):
        ok = m <= 3
        needs = sum(1 << k for k in range(0, 4 - m)) if ok else 0
        return TokenShape(ok, m, True, needs, (mb,), "", False)
    valid = m <= 3
    rest = b[m:]
    text, tail_partial, needs = None, False, 1
    try:
        text = rest.decode("utf-8")
    except UnicodeDecodeError:
        for k in (1, 2, 3):
            if k >= len(rest) + 1:
                break
            if k > len(rest):
                break
            head, tail = rest[: len(rest) - k], rest[len(rest) - k :]
            n = _valid_incomplete(tail)
            if n < 0:
                continue
            try:
                text = head.decode("utf-8")
            except UnicodeDecodeError:
                continue
            tail_partial, needs = True, 1 << n
            break
    if text is None:
        return TokenShape(False, m, False, 0, (), "", False)
    classes = ([mb] if m else []) + [cls(c) for c in text] + ([mb] if tail_partial else [])
    return TokenShape(valid, m, False, needs, tuple(classes), text, tail_partial)


def _contr_end_forms(case_insensitive: bool) -> set[str]:
    out = set()
    for c in _CONTRACTIONS:
        full = "'" + c
        for i in range(len(full)):
            out.add(full[i:])
    return out


_CONTR_END = _contr_end_forms(False)
_CONTR_FULL = tuple("'" + c for c in _CONTRACTIONS)
_CONTR_TAIL = {c[:i] for c in _CONTRACTIONS for i in range(1, len(c) + 1)}


def _fold(s: str) -> str:
    return s.lower().replace("\u017f", "s")  # (?i) matches U+017F LONG S as 's'


def left_signature(shape: TokenShape, model: str) -> tuple:
    """Signature of a token as the *previous* token of a pair (its end matters)."""
    if not shape.valid:
        return ("invalid",)
    cl = shape.classes
    text_exact = shape.text if (shape.lead_cont == 0 and not shape.tail_partial) else None
    last = cl[-1] if cl else 0
    allws = all(c & WS for c in cl)
    allsw = all(c & (S | W) for c in cl)
    single = len(cl) == 1
    space1 = text_exact == " "
    ndig = min(len(cl), 4) if all(c & N for c in cl) else 0
    if model == "cl100k":  # a contraction is a piece of its own
        contr = shape.lead_cont > 0 or (
            text_exact is not None and _fold(text_exact) in _CONTR_END
        )
    elif model == "o200k":  # a contraction ends a word piece ("person's", "DON'T")
        folded = _fold(shape.text)
        contr = shape.lead_cont > 0 or (not shape.tail_partial and (
            folded in _CONTR_END or folded.endswith(_CONTR_FULL)))
    else:
        contr = text_exact is not None and text_exact in _CONTR_END
    apos = text_exact == "'"
    slash = not shape.tail_partial and shape.text.endswith("/")
    return ("ok", shape.needs, last, allws, allsw, single, space1, ndig, contr, apos, slash)


def right_signature(shape: TokenShape, model: str) -> tuple:
    """Signature of a token as the *next* token of a pair (its start matters)."""
    if not shape.valid:
        return ("invalid",)
    if shape.lead_cont:
        return ("cont", shape.lead_cont, shape.all_cont)
    cl = shape.classes
    first = cl[0]
    allws = all(c & WS for c in cl)
    ws1_nonws = bool(first & WS) and (len(cl) == 1 or bool(cl[1] & ~WS))
    single = len(cl) == 1
    ndig = min(len(cl), 4) if all(c & N for c in cl) else 0
    text_exact = shape.text if not shape.tail_partial else None
    tail = text_exact is not None and text_exact in _CONTR_TAIL
    return ("ok", first, allws, ws1_nonws, single, ndig, tail)


def _bits(mask: int) -> list[int]:
    return [1 << k for k in range(11) if mask >> k & 1]


def _rules_r50k(A: tuple, B: tuple, c1: int, c2: int) -> tuple[bool, bool, str]:
    _, _, _, allws, _, single, space1, _, contr, apos, _ = A
    _, _, ballws, ws1_nonws, bsingle, _, tail = B
    n1, n2 = CLASS_NAMES[c1], CLASS_NAMES[c2]
    # piece boundary?
    if c1 == L:
        cross = c2 != L or contr
        why = ("' ?\\p{L}++' runs on through letters; only a contraction piece ('s 'll ...) "
               "ends before a letter") if c2 == L else f"a letter run ends at a {n2}"
    elif c1 == N:
        cross, why = c2 != N, "' ?\\p{N}++' never stops inside a run of numbers"
    elif c1 in (P, Q):
        cross = c2 not in (P, Q)
        why = "' ?[^\\s\\p{L}\\p{N}]++' never stops inside a run of punctuation"
    elif c1 == S and not c2 & WS:
        cross, why = False, f"a space before a {n2} always joins it (' ?' prefix)"
    elif c2 & WS:  # white space followed by white space
        cross = allws and ws1_nonws and (c2 == S or bsingle)
        why = ("'\\s+(?!\\S)' splits a white-space run only before its last character, "
               "which is followed by a non-space")
    else:  # CR/LF or other white space before a non-space: '\s' alone
        cross = single
        why = f"'\\s' makes a lone {n1} a piece before a {n2}; longer runs end earlier"
    # inside one piece?
    if c1 == L and c2 == L or c1 == N and c2 == N or c1 in (P, Q) and c2 in (P, Q):
        within = True
    elif c1 == S and not c2 & WS:
        within = space1
    elif c1 == Q and c2 == L:
        within = apos and tail
    elif c1 & WS and c2 & WS:
        within = allws and ballws
    else:
        within = False
    return cross, within, why


def _rules_cl100k(A: tuple, B: tuple, c1: int, c2: int) -> tuple[bool, bool, str]:
    _, _, _, allws, allsw, single, space1, ndig, contr, _, _ = A
    _, _, ballws, ws1_nonws, _, bndig, _ = B
    n1, n2 = CLASS_NAMES[c1], CLASS_NAMES[c2]
    if c1 == L:
        cross = c2 != L or contr
        why = ("'\\p{L}++' runs on through letters; only a contraction piece ('s 'LL ...) ends "
               "before a letter") if c2 == L else f"a letter run ends at a {n2}"
    elif c1 == N:
        if c2 == N:
            cross = 1 <= ndig <= 3 and 1 <= bndig <= 3
            why = "'\\p{N}{1,3}+' pieces are 1-3 numbers; both tokens must be all numbers"
        else:
            cross, why = ndig >= 1, "a number piece holds numbers only"
    elif c1 in (P, Q):
        cross = c2 not in (P, Q, R)
        why = "' ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+' takes all following punctuation and CR/LF"
    elif c1 == R:
        cross = c2 != R
        why = "CR/LF runs end a piece ('\\s*[\\r\\n]', '[\\r\\n]*+') only after the last CR/LF"
    elif c2 == L:
        cross, why = False, f"'[^\\r\\n\\p{{L}}\\p{{N}}]?+\\p{{L}}++' joins a {n1} to the letters"
    elif c2 == N:
        cross, why = single, f"'\\s' makes a lone {n1} a piece before a number"
    elif c2 in (P, Q):
        if c1 == S:
            cross, why = False, "' ?[^\\s\\p{L}\\p{N}]++' joins a space to the punctuation"
        else:
            cross, why = single, f"'\\s' makes a lone {n1} a piece before punctuation"
    elif c2 == R:
        cross, why = False, "'\\s*[\\r\\n]' takes white space up to the last CR/LF"
    else:  # S/W followed by S/W
        cross = allsw and ws1_nonws
        why = ("'\\s+(?!\\S)' splits a white-space run (after its last CR/LF) only before its "
               "last character")
    if c1 == L and c2 == L or c1 in (P, Q) and c2 in (P, Q):
        within = True
    elif c2 == L:
        within = single and c1 in (S, W, P, Q)
    elif c1 == N and c2 == N:
        within = ndig >= 1 and bndig >= 1 and ndig + bndig <= 3
    elif c1 == S and c2 in (P, Q):
        within = space1
    elif c1 in (P, Q) and c2 == R:
        within = True
    elif c1 & WS and c2 & WS:
        within = (c1 == R and c2 == R) or (allws and ballws)
    else:
        within = False
    return cross, within, why


def _rules_o200k(A: tuple, B_: tuple, c1: int, c2: int) -> tuple[bool, bool, str]:
    _, _, _, allws, allsw, single, space1, ndig, contr, _, slash = A
    _, _, ballws, ws1_nonws, _, bndig, _ = B_
    n1, n2 = CLASS_NAMES[c1], CLASS_NAMES[c2]
    if c1 == MK or c2 == MK:
        return True, True, "combining marks join letters and punctuation alike (conservative)"
    l1, l2 = c1 in (U, LW, B), c2 in (U, LW, B)
    if l1 and l2:
        cross = contr or (c1 in (LW, B) and c2 == U)
        why = ("a letter run splits only where a lower-case or other letter meets an upper-case "
               "one, or after a contraction ('s 'LL ...)")
    elif l1:
        cross, why = True, f"a letter piece ends at a {n2}"
    elif c1 == N:
        if c2 == N:
            cross = 1 <= ndig <= 3 and 1 <= bndig <= 3
            why = "'\\p{N}{1,3}' pieces are 1-3 numbers; both tokens must be all numbers"
        else:
            cross, why = ndig >= 1, "a number piece holds numbers only"
    elif c1 in (P, Q):
        # after CR/LF, the trailing '[\r\n/]*' may end a piece with '/' before punctuation
        cross = c2 not in (P, Q, R) or (slash and c2 in (P, Q))
        why = "' ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*' takes all following punctuation and CR/LF"
    elif c1 == R:
        cross = c2 != R
        why = "CR/LF runs end a piece only after the last CR/LF"
    elif l2:
        cross, why = False, f"'[^\\r\\n\\p{{L}}\\p{{N}}]?' joins a {n1} to the letters"
    elif c2 == N:
        cross, why = single, f"'\\s+' makes a lone {n1} a piece before a number"
    elif c2 in (P, Q):
        if c1 == S:
            cross, why = False, "' ?[^\\s\\p{L}\\p{N}]+' joins a space to the punctuation"
        else:
            cross, why = single, f"'\\s+' makes a lone {n1} a piece before punctuation"
    elif c2 == R:
        cross, why = False, "'\\s*[\\r\\n]+' takes white space up to the last CR/LF"
    else:
        cross = allsw and ws1_nonws
        why = ("'\\s+(?!\\S)' splits a white-space run (after its last CR/LF) only before its "
               "last character")
    if l1 and l2 or l1 and c2 == Q or c1 == Q and l2 or c1 in (P, Q) and c2 in (P, Q):
        within = True
    elif l2:
        within = single and c1 in (S, W, P)
    elif c1 == N and c2 == N:
        within = ndig >= 1 and bndig >= 1 and ndig + bndig <= 3
    elif c1 == S and c2 in (P, Q):
        within = space1
    elif c1 in (P, Q) and c2 == R or c1 == R and c2 in (P, Q):
        within = True
    elif c1 & WS and c2 & WS:
        within = (c1 == R and c2 == R) or (allws and ballws)
    else:
        within = False
    return cross, within, why


def pair_rule(A: tuple, B: tuple, model: str) -> tuple[bool, bool, str]:
    """``(cross, within, reason)`` for a left signature ``A`` and a right signature ``B``.

    ``cross``: the junction may be a regex piece boundary (then the pair is possible);
    ``within``: the junction may lie inside one piece (then BPE decides); ``reason`` explains
    the verdict in words.
    """
    if A[0] == "invalid":
        return False, False, "the previous token's bytes cannot occur in valid UTF-8"
    if B[0] == "invalid":
        return False, False, "the next token's bytes cannot occur in valid UTF-8"
    needs = A[1]
    if B[0] == "cont":
        m, all_cont = B[1], B[2]
        ok = any(needs >> n & 1 and (n == m or (all_cont and m <= n)) for n in range(1, 4))
        if ok:
            return False, True, "the junction falls inside one multi-byte character"
        return False, False, (
            f"the next token starts with {m} UTF-8 continuation byte(s) that the previous "
            "token's end cannot take")
    if not needs & 1:
        return False, False, ("the previous token ends inside a multi-byte character but the "
                              "next token does not continue it")
    if model == "generic":
        return True, True, "no regex model for this pre-tokenizer (conservative)"
    rules = {"r50k": _rules_r50k, "cl100k": _rules_cl100k, "o200k": _rules_o200k}[model]
    cross = within = False
    why_c, why_w = "", ""
    for c1 in _bits(A[2]):
        for c2 in _bits(B[1]):
            c, w, why = rules(A, B, c1, c2)
            if c and not cross:
                why_c = f"{CLASS_NAMES[c1]} | {CLASS_NAMES[c2]} may be a piece boundary"
                cross = True
            if w and not within:
                within = True
                why_w = f"{CLASS_NAMES[c1]} + {CLASS_NAMES[c2]} may share one piece"
            if not c and not why_c:
                why_c = why
    if cross:
        return True, within, why_c
    return False, within, (why_c + ("; " + why_w if within else
                                    "; and the two cannot share one piece"))


def signature_tables(
    tokens: list[bytes | None], model: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[tuple], list[tuple]]:
    """Signatures of every token and the (cross, within) matrices over signature pairs.

    Args:
        tokens: ``tokens[id]`` bytes of mergeable token ``id`` (None: special or unused id).
        model: ``"r50k"``, ``"cl100k"`` or ``"generic"``.

    Returns:
        ``(lsig int32[V], rsig int32[V], cross bool[nL, nR], within bool[nL, nR], lsigs,
        rsigs)``; ids with ``None`` bytes get the ``("invalid",)`` signatures.
    """
    lidx: dict[tuple, int] = {}
    ridx: dict[tuple, int] = {}
    lsig = np.empty(len(tokens), dtype=np.int32)
    rsig = np.empty(len(tokens), dtype=np.int32)
    for i, b in enumerate(tokens):
        if b is None:
            ls, rs = ("invalid",), ("invalid",)
        else:
            sh = token_shape(b, fine=model == "o200k")
            ls, rs = left_signature(sh, model), right_signature(sh, model)
        lsig[i] = lidx.setdefault(ls, len(lidx))
        rsig[i] = ridx.setdefault(rs, len(ridx))
    lsigs, rsigs = list(lidx), list(ridx)
    cross = np.zeros((len(lsigs), len(rsigs)), dtype=np.bool_)
    within = np.zeros_like(cross)
    for i, A in enumerate(lsigs):
        for j, B in enumerate(rsigs):
            c, w, _ = pair_rule(A, B, model)
            cross[i, j], within[i, j] = c, w
    return lsig, rsig, cross, within, lsigs, rsigs
