"""The training config: :class:`TrainConfig`, a pydantic model.

A config file is YAML or JSON with the fields of :class:`TrainConfig`; paths in it are
relative to the file. A config that fails validation raises :class:`TrainConfigError`, whose
message is at most three lines: the file, then each wrong field by its path with what was
expected (no pydantic dump, no documentation links)::

    runs/tiny.yaml: invalid train config
      stpes: unknown field (did you mean 'steps'?)
      schedule: expected 'cosine' or 'trapezoid', got 'linear'
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tokenmill import boundedyaml, storage
from tokenmill.errors import MAX_ERROR_LINES, field_lines


class TrainConfigError(ValueError):
    """A train config that fails validation: ``header`` (what and where) and one line per
    wrong field (``path: what was expected``, :func:`tokenmill.errors.field_lines`), at most
    :data:`~tokenmill.errors.MAX_ERROR_LINES` lines."""

    def __init__(self, header: str, lines: list[str] | None = None) -> None:
        self.header, self.field_lines = header, list(lines or [])
        super().__init__("\n".join([header, *self.field_lines]))


class TrainConfig(BaseModel):
    """Everything a run needs. Paths in a config file are relative to that file.

    Construct it from keywords, or from a file with :meth:`load`. Unknown keys and wrong
    values raise :class:`TrainConfigError` (a ``ValueError``), also on attribute assignment.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True,
                              protected_namespaces=())

    data: str = Field(description="mix manifest (`tokenmill mix build`) or curation "
                      "manifest (file or folder); a path or an s3://, gs:// or hf:// URL, "
                      "whose shards are downloaded once into the node's cache")
    out_dir: str = Field(
        default="runs/train",
        description="run folder: config.json, metrics.json, checkpoints, summary (-o/--output "
        "overrides it)")
    model: str = Field(default="tiny", description="GPTConfig preset")
    model_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="GPTConfig fields that replace the preset's (e.g. n_layer, n_embd)")
    seq_len: int = Field(default=128, gt=0, description="tokens per training row")
    batch_size: int = Field(default=8, gt=0, description="sequences per rank per micro-step")
    grad_accum: int = Field(default=1, gt=0, description="micro-steps per optimizer step")
    steps: int = Field(default=200, gt=0, description="optimizer steps")
    lr: float = Field(default=3e-3, gt=0, description="peak learning rate (AdamW)")
    min_lr_frac: float = Field(
        default=0.1, ge=0, le=1,
        description="cosine: final learning rate as a fraction of lr")
    warmup_steps: int = Field(default=10, ge=0, description="linear warmup steps")
    schedule: Literal["cosine", "trapezoid"] = Field(
        default="cosine",
        description="learning-rate schedule after warmup: cosine decay, or trapezoid (constant, "
        "then linear decay over cooldown_frac)")
    cooldown_frac: float = Field(default=0.3, gt=0, le=1,
                                 description="trapezoid: fraction of steps in the final decay")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW beta1")
    beta2: float = Field(default=0.95, ge=0, lt=1, description="AdamW beta2")
    grad_clip: float = Field(default=1.0, ge=0, description="0 = no clipping")
    seed: int = Field(
        default=0,
        description="seed of the model's initialisation (the data order comes from the mix)")
    val_every: int = Field(default=50, ge=0, description="0 = no validation")
    val_tokens: int = Field(
        default=16384, gt=0,
        description="validation tokens per evaluation (val_tokens // seq_len document-aligned "
        "rows of the val split)")
    ckpt_every: int = Field(default=0, ge=0, description="0 = only at the end")
    keep_checkpoints: int = Field(default=3, ge=0,
                                  description="keep the last N checkpoints (0 = keep all)")
    stop_after: int | None = Field(default=None, gt=0, description="stop (with a checkpoint) "
                                   "after this step: a planned pause")
    prefix_aux_weight: float = Field(default=0.0, ge=0, description="> 0: prefix auxiliary "
                                     "loss with this weight (the start weight with anneal)")
    prefix_aux_schedule: Literal["constant", "anneal"] = Field(
        default="constant", description="anneal: the weight falls linearly from "
        "prefix_aux_weight to 0 over the steps (the speedrun's schedule, 0.25 at the start)")
    legality: str | None = Field(default=None, description="saved legality table (file or "
                                 "folder; polarity from its header): masked validation")
    lem: bool = Field(
        default=False,
        description="feed the model longest-exact-match features (see lem_features, lem_workers)")
    lem_features: str | None = Field(default=None, description="LEM side channel made before "
                                     "the run (`tokenmill ngram lem` output folder); None: "
                                     "lem_workers, else the online predictor")
    lem_workers: int = Field(default=0, ge=0, description="> 0: LEM features from this many "
                             "Ray CPU workers running ahead of the trainer, chunk by chunk")
    lem_chunk_tokens: int | None = Field(default=None, gt=0, description="lem_workers: "
                                         "stream tokens per task (None: window / 8)")
    lem_k: int = Field(default=4, gt=0, description="LEM candidate next tokens per position")
    lem_ahead: int = Field(default=4, gt=0, description="LEMStream slots ahead of the trainer")
    lem_window: int | None = Field(default=None, gt=0, description="predictor memory window "
                                   "(tokens); None = its default")
    # cap on the predictor's match length: lengths are bucketed up to 256 anyway, and the
    # cap bounds its work per token inside long runs of a repeated token (O(run**2) without)
    lem_max_len: int = Field(
        default=1024, ge=0,
        description="cap on the predictor's match length (0: none); bounds its work inside long "
        "runs of a repeated token")
    ngram_features: str | None = Field(default=None, description="n-gram side channel of "
                                       "the train split (`tokenmill ngram features MIX -o "
                                       "DIR`): model input feature and sparse logit bias")
    ngram_val_features: str | None = Field(default=None, description="n-gram side channel "
                                           "of the val split (`ngram features --split "
                                           "val`); None: computed at setup from the train "
                                           "stream")
    ngram_m: int | None = Field(default=None, gt=0, description="n-gram candidates used per "
                                "position (None: the side channel's m)")
    doc_mask: bool = Field(default=False, description="attention stays inside each document")
    verify: bool = Field(default=True, description="check every shard's sha256 against the "
                         "manifest before reading (false: printed as skipped)")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="auto: cuda when available, else cpu")
    num_threads: int = Field(default=0, ge=0, description="CPU torch threads (0 = default)")
    peak_flops: float = Field(default=0.0, ge=0, description="per device, for MFU; 0 = guess "
                              "from the device name")
    compile: bool = Field(default=False, description="wrap the model in torch.compile")
    progress: bool = Field(
        default=True,
        description="show a progress bar (-q/--quiet turns it off)")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise TrainConfigError("invalid train config", field_lines(
                e, MAX_ERROR_LINES - 1, type(self).model_fields)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as e:
            raise TrainConfigError("invalid train config", field_lines(
                e, MAX_ERROR_LINES - 1, type(self).model_fields)) from None

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if (self.lem_features is not None or self.lem_workers) and not self.lem:
            raise ValueError("lem_features and lem_workers need lem: true")
        if self.lem_features is not None and self.lem_workers:
            raise ValueError("lem_features and lem_workers: choose one LEM source")
        if (self.lem and self.lem_features is None and not self.lem_workers
                and self.grad_accum != 1):
            raise ValueError("lem: true supports grad_accum: 1 only with the online predictor "
                             "(lem_features or lem_workers allow any)")
        if self.ngram_features is None and (self.ngram_val_features is not None
                                            or self.ngram_m is not None):
            raise ValueError("ngram_val_features and ngram_m need ngram_features")
        return self

    @classmethod
    def load(cls, path: str | os.PathLike, **overrides: Any) -> TrainConfig:
        """Read a YAML or JSON config. ``data``/``out_dir``/``legality``/``lem_features``/
        ``ngram_features``/``ngram_val_features`` in the file are resolved against the file's
        folder; ``overrides`` (CLI options, ``None`` = not given) replace
        file values as given (relative to the working directory).

        Raises:
            FileNotFoundError: no such file.
            TrainConfigError: unparsable file, unknown key or wrong value (names the file and
                each wrong field).
        """
        p = Path(path)
        text = p.read_text()
        try:
            yml = p.suffix in (".yaml", ".yml")
            raw = boundedyaml.load(text, str(p)) if yml else json.loads(text)
        except (yaml.YAMLError, json.JSONDecodeError) as e:
            first = str(e).strip().splitlines()[0]
            raise TrainConfigError(f"{p}: not valid {p.suffix.lstrip('.').upper()}: {first}"
                                   ) from None
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise TrainConfigError(f"{p}: a train config is a mapping of keys to values, "
                                   f"got a {type(raw).__name__}")
        if storage.is_url(str(raw.get("out_dir") or "")):
            raise TrainConfigError(f"{p}: out_dir: a local folder (checkpoints and the "
                                   f"report are written there), not a URL: "
                                   f"{storage.redact(str(raw['out_dir']))}")
        for key in ("data", "out_dir", "legality", "lem_features", "ngram_features",
                    "ngram_val_features"):
            if (isinstance(raw.get(key), str) and not Path(raw[key]).is_absolute()
                    and not storage.is_url(raw[key])):
                raw[key] = str((p.parent / raw[key]).resolve())
        raw.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**raw)
        except TrainConfigError as e:
            raise TrainConfigError(f"{p}: invalid train config", e.field_lines) from None

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON-ready values (what ``config.json`` and checkpoints hold)."""
        return self.model_dump(mode="json")
