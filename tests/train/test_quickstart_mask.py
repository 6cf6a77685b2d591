"""On the quickstart validation shards (the pipeline's own output), the legality mask
never masks a target: every (previous, target) pair is allowed by the analytic table."""

from __future__ import annotations

import numpy as np

from tokenmill.manifests.shards import read_tokens
from tokenmill.tokenizers.legality import LegalityTable


def test_no_quickstart_validation_target_is_masked(quickstart):
    root = quickstart.manifest_path.parent
    streams = [np.asarray(read_tokens(root / s.path), dtype=np.int64)
               for s in quickstart.manifest.shards("val")]
    prev_all = np.concatenate([t[:-1] for t in streams])
    nxt_all = np.concatenate([t[1:] for t in streams])
    rows = np.unique(prev_all)
    table = LegalityTable.build("gpt2", rows=rows)
    packed = np.asarray(table.packed)  # row i is the row of previous token rows[i]
    r = np.searchsorted(rows, prev_all)
    allowed = (packed[r, nxt_all >> 3] >> (nxt_all & 7)) & 1
    masked = int((allowed == 0).sum())
    print(f"{prev_all.size} validation (previous, target) pairs, {masked} masked")
    assert prev_all.size > 50_000
    assert masked == 0
