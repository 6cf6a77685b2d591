"""A vocabulary over 65,536 ids writes uint32 (version 2) shards that decode correctly."""

from __future__ import annotations

import numpy as np

from tests.shared import corpora
from tokenmill.manifests.shards import iter_documents, read_header, read_tokens
from tokenmill.manifests.validate import validate_manifest
from tokenmill.pipeline.config import DatamixConfig
from tokenmill.pipeline.read.normalize import normalize_text
from tokenmill.pipeline.run.executor import run_datamix
from tokenmill.tokenizers import get_encoding


def test_cl100k_writes_uint32_shards(tmp_path):
    cfg = DatamixConfig(name="cl", tokenizer="cl100k_base", data_root=str(corpora()),
                        output_dir=str(tmp_path / "out"),
                        sources=[{"name": "books", "path": "books-public-domain"}],
                        shards={"val_fraction": 0.0})
    res = run_datamix(cfg, num_cpus=1, progress=False)
    root = res.manifest_path.parent
    assert validate_manifest(res.manifest_path) == []
    enc = get_encoding("cl100k_base")
    texts = {p.name: normalize_text(p.read_text(encoding="utf-8-sig"))  # BOM skipped
             for p in (corpora("books-public-domain") / "data").iterdir()}
    seen = 0
    for sh in res.manifest.shards():
        h = read_header(root / sh.path)
        assert h.version == 2 and sh.version == 2
        toks = read_tokens(root / sh.path)
        assert toks.dtype == np.uint32 and int(toks.max()) > 65535
        for key, doc in iter_documents(root / sh.path):
            name = key.split("/")[-1].split("#")[0]
            assert enc.decode(doc[1:].tolist()) == texts[name]
            seen += 1
    assert seen == 3
