"""The one tokenizer identity check every consumer of token ids calls."""

from __future__ import annotations

import pytest

from tokenmill.tokenizers import (
    TokenizerMismatchError,
    check_identity,
    check_installed,
    identity,
    load_checked,
)


def test_a_drifted_tokenizer_is_refused_naming_both_identities():
    real = identity("gpt2")
    drifted = real.model_copy(update={"ranks_sha256": "e" * 64})
    check_identity(real, real, "out/manifest.json")
    check_identity(real.model_dump(), real, "out/manifest.json")  # as written in JSON
    with pytest.raises(TokenizerMismatchError) as e:
        check_identity(drifted, real, "out/manifest.json")
    msg = str(e.value)
    assert "out/manifest.json" in msg and drifted.short() in msg and real.short() in msg
    assert "\n" not in msg
    with pytest.raises(TokenizerMismatchError, match="cl100k_base"):
        check_identity(real, identity("cl100k_base"), "idx")
    # the same ranks, pattern and special tokens under two names are one tokenizer
    check_identity(real, identity("r50k_base"), "idx")
    assert load_checked(real, "x").n_vocab == real.n_vocab
    with pytest.raises(TokenizerMismatchError):
        load_checked(drifted, "x")


def test_consumers_without_tokenizer_files_are_not_stopped_but_a_drift_is():
    real = identity("gpt2")
    assert check_installed(real, "mix.json")
    assert not check_installed({**real.model_dump(), "name": "no-such-encoding"}, "mix.json")
    with pytest.raises(TokenizerMismatchError, match="mix.json"):
        check_installed(real.model_copy(update={"ranks_sha256": "0" * 64}), "mix.json")
