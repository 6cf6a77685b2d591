"""The validation split's per-source minimum (the quickstart's sources are checked in
test_quickstart.py)."""

from __future__ import annotations


def test_validation_minimum_rules():
    from tokenmill.pipeline.run.shard_writer import val_minimum

    assert val_minimum(10, 0.01, None, 1, 10) == 1  # default for >= 10 kept documents
    assert val_minimum(9, 0.01, None, 1, 10) == 0  # smaller: none by default
    assert val_minimum(3, 0.01, 1, 1, 10) == 1  # the source's own minimum
    assert val_minimum(100, 0.0, None, 1, 10) == 0  # val_fraction 0: no validation split
    assert val_minimum(100, 0.0, 2, 1, 10) == 2  # unless the source asks for one
    assert val_minimum(3, 0.01, 5, 1, 10) == 2  # at least one document stays in train
    assert val_minimum(0, 0.01, 5, 1, 10) == 0
