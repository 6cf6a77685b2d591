"""tokenmill: the data side of an LLM pretraining stack.

Curate a datamix (curation config) into modded-nanogpt token shards plus a curation
manifest, build tokenizer legality tables and n-gram side models over them, mix curated
sources into a training mix (mix spec -> mix manifest -> modded-nanogpt export), and train.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"


def _arrow_on_the_system_allocator() -> None:
    """pyarrow allocates from the C library's ``malloc`` in every tokenmill process (the
    driver, Ray's workers, the plot workers), unless ``ARROW_DEFAULT_MEMORY_POOL`` says
    otherwise. pyarrow's default, mimalloc, spends seconds of system time returning the
    pages of large buffers filled by several threads: reading the 185 MB text column of
    a quarantine took 4.9 s (4.0 s of it system time) against 0.7 s, and a 233 MB
    ``tokenmill run`` took 26.6 s against 21.7 s (``benchmarks/bench_pipeline.py``)."""
    if "ARROW_DEFAULT_MEMORY_POOL" in _os.environ:
        return
    _os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"  # read when pyarrow is imported
    if "pyarrow" in _sys.modules:  # imported before us (by Ray, in a worker)
        import pyarrow

        pyarrow.set_memory_pool(pyarrow.system_memory_pool())


_arrow_on_the_system_allocator()
