"""Manifest and mix-spec errors are one line (the spec's at most three): the file, then the
wrong fields by their path with what was expected, no pydantic dump; a file of the wrong
kind is named as such."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.manifests.mixdata import write_spec, write_texts_curation
from tests.shared import shared_data
from tokenmill.manifests.mix import build_mix, load_mix_manifest, load_spec
from tokenmill.manifests.schema import ManifestError, load_manifest

TEXTS = [(f"a#{i}", f"Document number {i} says something short.") for i in range(12)]
PYDANTIC_NOISE = ("pydantic", "For further information", "validation error", "type=")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    shared_data("tiktoken")
    tmp = tmp_path_factory.mktemp("errors")
    man = write_texts_curation(tmp / "cur", "cur", {"s": TEXTS}, val_every=4)
    spec = write_spec(tmp / "spec.yaml", [man], {"s": {"weight": 1.0}}, 100)
    build_mix(spec, tmp / "mix.json")
    return {"curation": man, "mix": tmp / "mix.json", "spec": spec, "tmp": tmp}


def _one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg and not any(n in msg for n in PYDANTIC_NOISE), msg
    return msg


def test_mix_manifest_where_a_curation_one_is_expected(files):
    with pytest.raises(ManifestError) as e:
        load_manifest(files["mix"])
    msg = _one_line(e.value)
    assert msg.startswith(f"{files['mix']}: this is a training-mix manifest")
    assert "but a curation manifest" in msg and "schema_version" not in msg
    with pytest.raises(ManifestError) as e:
        load_mix_manifest(files["curation"])
    assert _one_line(e.value).startswith(f"{files['curation']}: this is a curation manifest")
    assert "but a training-mix manifest" in str(e.value)


def test_export_json_is_named(files):
    p = files["tmp"] / "export.json"
    p.write_text(json.dumps({"format": "modded-nanogpt", "files": [], "tokenizer": {}}))
    with pytest.raises(ManifestError, match="this is a modded-nanogpt export's export.json"):
        load_manifest(p)


def test_wrong_fields_by_path_in_one_line(files):
    data = json.loads(files["curation"].read_text())
    data["name"] = 5
    del data["config_sha256"]
    data["sourcez"] = data.pop("sources")
    data["tokenizer"]["n_vocab"] = "many"
    bad = files["tmp"] / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ManifestError) as e:
        load_manifest(bad)
    msg = _one_line(e.value)
    assert msg.startswith(f"{bad}: invalid curation manifest: ")
    for part in ("config_sha256: required, missing", "sources: required, missing",
                 "sourcez: unknown field (did you mean 'sources'?)",
                 "name: expected a valid string, got 5", "tokenizer.n_vocab: expected"):
        assert part in msg
    data = json.loads(files["curation"].read_text())
    data["schema_version"] = 7
    bad.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"curation manifest schema_version 7, expected 1"):
        load_manifest(bad)
    bad.write_text("{not json")
    with pytest.raises(ManifestError, match="not a JSON manifest"):
        load_manifest(bad)


def test_mix_manifest_wrong_fields(files):
    data = json.loads(files["mix"].read_text())
    data["total_tokens"] = "lots"
    bad = files["tmp"] / "badmix.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ManifestError) as e:
        load_mix_manifest(bad)
    assert _one_line(e.value) == (f"{bad}: invalid training-mix manifest: total_tokens: "
                                  "expected a valid integer, unable to parse string as an "
                                  "integer, got 'lots'")


def test_spec_errors(files):
    with pytest.raises(ValueError) as e:
        load_spec(files["mix"])  # a manifest given where the spec is expected
    assert _one_line(e.value).startswith(f"{files['mix']}: this is a training-mix manifest")
    bad = files["tmp"] / "bad.yaml"
    bad.write_text("name: x\nmanifests: []\ntarget_tokens: -1\nsourcs: {}\n")
    with pytest.raises(ValueError) as e:
        load_spec(bad)
    lines = str(e.value).splitlines()
    assert lines[0] == f"{bad}: invalid mix spec" and len(lines) <= 3
    assert lines[1] == "  sources: required, missing"
    assert not any(n in str(e.value) for n in PYDANTIC_NOISE)
    bad.write_text("name: [x\n")
    with pytest.raises(ValueError, match=r"not a YAML mix spec \(line 2, column 1\)"):
        load_spec(bad)


def test_cli_show_of_a_mix_manifest(files, capsys):
    from tokenmill.cli import main

    assert main(["manifest", "show", str(files["mix"])]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tokenmill: {files['mix']}: this is a training-mix manifest")
    assert len(err.splitlines()) == 1 and "schema_version" not in err
    assert main(["mix", "plan", str(files["curation"])]) == 2
    err = capsys.readouterr().err.strip()
    assert "this is a curation manifest" in err and "but a mix spec" in err
