"""Write docs/configuration.md (input files) and docs/manifest-fields.md (the manifests
tokenmill writes) from their pydantic models.

    python docs/make_configuration.py            # rewrite both files
    python docs/make_configuration.py --check    # exit 1 if one is out of date

Every field of every model in :data:`REGISTRY` and :data:`MANIFEST_REGISTRY` (and of the
models its fields hold) becomes a table row: name, type, default, meaning. The meaning is the
field's ``description`` plus its constraints (``ge``, ``gt``, ...); a section's introduction
is its model's docstring. A new file kind is one more registry entry, a new field needs
nothing here.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

DOCS = Path(__file__).resolve().parent
TARGET = DOCS / "configuration.md"
MANIFEST_TARGET = DOCS / "manifest-fields.md"

#: (title, "module:Class", what reads the file): the top-level models, in document order.
REGISTRY: list[tuple[str, str, str]] = [
    ("Datamix (curation config)", "tokenmill.pipeline.config:DatamixConfig",
     "`tokenmill run DATAMIX.yaml`; example `manifests/quickstart.yaml`"),
    ("Mix spec (training mix)", "tokenmill.manifests.mix:MixSpec",
     "`tokenmill mix plan SPEC.yaml`, `tokenmill mix build SPEC.yaml -o mix.json`; example "
     "`manifests/mix-example.yaml`"),
    ("Train config", "tokenmill.train.config:TrainConfig",
     "`tokenmill train CONFIG.yaml`; example `manifests/train-tiny.yaml`"),
]

#: The JSON manifests tokenmill writes, in document order.
MANIFEST_REGISTRY: list[tuple[str, str, str]] = [
    ("Curation manifest", "tokenmill.manifests.schema:DatamixManifest",
     "`tokenmill run` (`OUT/manifest.json`)"),
    ("Mix manifest (training mix)", "tokenmill.manifests.mixschema:TrainingMixManifest",
     "`tokenmill mix build SPEC -o mix.json`"),
]

MANIFEST_HEADER = """\
# Manifest fields

Every field of the JSON manifests tokenmill writes: the curation manifest
(`OUT/manifest.json`) and the mix manifest (`mix.json`). Both are UTF-8 JSON, indented by 2,
keys sorted, no timestamps, paths relative to the manifest's folder; a reader checks `kind`
and `schema_version` first. The byte-level formats of the files they list are in
[formats.md](formats.md).

This file is generated from the pydantic models by `python docs/make_configuration.py`;
edit the models' `description=` texts, not this file.
"""

HEADER = """\
# Configuration reference

Every field of tokenmill's input files: the datamix (curation config), the mix spec and the
train config. All three are YAML (the train config may also be JSON); unknown keys are
errors, and a wrong value is reported by its path (`sources.0.weight: ...`). Relative paths
in a file are relative to that file.

This file is generated from the pydantic models by `python docs/make_configuration.py`;
edit the models' `description=` texts, not this file.
"""

_CONSTRAINTS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"),
                ("min_length", "at least {} item(s)"), ("max_length", "at most {} item(s)"))


def resolve(dotted: str) -> type[BaseModel]:
    """``"package.module:Class"`` -> the class. Raises ``ImportError`` naming the entry."""
    module, _, name = dotted.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"REGISTRY entry {dotted!r} in {__file__} is not importable ({e}); "
                          "point it at the model's new home") from None


def plain(text: str) -> str:
    """Docstring markup (RST roles, double backquotes) as Markdown code spans."""
    text = re.sub(r":(?:func|class|mod|meth|data|attr):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def type_name(annotation: Any) -> str:
    """A reader's spelling of a field type: ``str | None``, ``list[str]``, ``'a' | 'b'``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(map(type_name, args))}]"
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return getattr(annotation, "__name__", str(annotation))


def default_text(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()
        if isinstance(value, BaseModel):
            return "(all defaults)"
    elif info.default is PydanticUndefined:
        return "**required**"
    else:
        value = info.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"`{value:_}`"
    if isinstance(value, list | dict) and not value:
        return "empty"
    if isinstance(value, list):
        return "`[" + ", ".join(map(str, value)) + "]`"
    return f"`{value}`"


def meaning(info: FieldInfo) -> str:
    bounds = []
    for meta in info.metadata:
        for attr, symbol in _CONSTRAINTS:
            bound = getattr(meta, attr, None)
            if bound is not None:
                bounds.append(symbol.format(bound) if "{" in symbol else f"{symbol} {bound}")
    text = plain(info.description or "").strip()
    text = f"{text} ({', '.join(bounds)})" if bounds else text
    extra = info.json_schema_extra
    if isinstance(extra, dict) and extra.get("identity") is False:
        text += "; not part of the config's identity (`config_sha256`)"
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def model_section(model: type[BaseModel], level: int, title: str,
                  reads: str | None = None) -> list[str]:
    """Markdown for ``model``: heading, docstring, field table."""
    lines = [f"{'#' * level} {title}", ""]
    if reads:
        lines += [f"{reads}.", ""]
    doc = inspect.getdoc(model)
    if doc and model.__doc__:  # the class's own docstring, not BaseModel's
        lines += [plain(doc), ""]
    lines += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, info in model.model_fields.items():
        kind = type_name(info.annotation)
        lines.append(f"| `{name}` | {_cell(kind)} | {_cell(default_text(info))} | "
                     f"{_cell(meaning(info))} |")
    return lines + [""]


def nested_models(model: type[BaseModel]) -> list[type[BaseModel]]:
    """Every model reachable from ``model``'s fields, depth first, each once."""
    seen: list[type[BaseModel]] = []

    def visit(m: type[BaseModel]) -> None:
        for info in m.model_fields.values():
            for sub in _models_in(info.annotation):
                if sub not in seen:
                    seen.append(sub)
                    visit(sub)
    visit(model)
    return seen


def undescribed_fields() -> list[str]:
    """``Model.field`` of every documented field without a description."""
    out = []
    for _, dotted, _ in REGISTRY + MANIFEST_REGISTRY:
        top = resolve(dotted)
        for m in [top, *nested_models(top)]:
            out += [f"{m.__name__}.{n}" for n, i in m.model_fields.items() if not i.description]
    return sorted(set(out), key=out.index)


def render(registry: list[tuple[str, str, str]] | None = None, header: str = HEADER,
           verb: str = "Read by") -> str:
    """The whole of docs/configuration.md (or, with the manifest registry and header,
    docs/manifest-fields.md); a model used by two entries is described once."""
    lines, done = [header], set()
    for title, dotted, reads in REGISTRY if registry is None else registry:
        top = resolve(dotted)
        lines += model_section(top, 2, f"{title}: {top.__name__}", f"{verb} {reads}")
        for sub in nested_models(top):
            if sub not in done:
                done.add(sub)
                lines += model_section(sub, 3, sub.__name__)
    return "\n".join(lines).rstrip() + "\n"


def documents() -> dict[Path, str]:
    """Each generated file and its text."""
    return {TARGET: render(),
            MANIFEST_TARGET: render(MANIFEST_REGISTRY, MANIFEST_HEADER, "Written by")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write the generated reference files in docs/")
    ap.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    args = ap.parse_args(argv)
    stale = 0
    for target, text in documents().items():
        if args.check:
            current = target.read_text(encoding="utf-8") if target.exists() else ""
            if current != text:
                print(f"{target} is out of date: run python docs/make_configuration.py",
                      file=sys.stderr)
                stale = 1
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
