"""A tokenizer as a user names it: on the command line (a built-in encoding's name, or a
file that gives or records one), and a ``tokenizer:`` value's name for messages."""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

from tokenmill import boundedyaml
from tokenmill.tokenizers.identities import SUPPORTED_ENCODINGS
from tokenmill.tokenizers.registry import identity, load_checked, load_tokenizer


def tokenizer_arg(text: str) -> str:
    """Load the tokenizer a command-line argument names and return its name: a built-in
    encoding name; or a file: a tokenizer.json, a tokenizer table (YAML or JSON), or a
    datamix / manifest (YAML or JSON) whose ``tokenizer`` is used (a manifest's recorded
    identity is loaded from its source and checked).

    Raises:
        ValueError: one line naming ``text``: neither a known name nor a readable file.
    """
    if text in SUPPORTED_ENCODINGS or not os.path.isfile(text):
        return identity(text).name  # an unknown name raises, naming the known ones
    try:
        with open(text, encoding="utf-8") as f:
            raw = f.read()
        try:
            doc = json.loads(raw)  # a tokenizer.json or a manifest: JSON, parsed fast
        except ValueError:
            doc = boundedyaml.load(raw, text)  # bounded alias expansion and depth
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"tokenizer file {text}: cannot be read ({type(e).__name__})"
                         ) from None
    if not isinstance(doc, dict):
        raise ValueError(f"tokenizer file {text}: not a table")
    base = os.path.dirname(os.path.abspath(text))
    if "model" in doc and "pre_tokenizer" in doc:  # a Hugging Face tokenizer.json
        return load_tokenizer({"tokenizer_json": os.path.basename(text)}, base).name
    value = doc.get("tokenizer", doc)
    if isinstance(value, dict) and "ranks_sha256" in value:  # an identity a manifest records
        return load_checked(value, text).name
    return load_tokenizer(value, base).name


def tokenizer_label(spec: Any) -> str:
    """A ``tokenizer:`` value's name for messages (a built-in name, or the table's name)."""
    if isinstance(spec, str):
        return spec
    name = spec.get("name") if isinstance(spec, dict) else getattr(spec, "name", None)
    return name or "tokenizer.json"
