"""N-gram side models built from tokenmill shards, for any trainer.

* :mod:`tokenmill.ngram.index` — infini-gram-style suffix-array index over a datamix
  (``count``, ``next_token_distribution``, ``longest_match`` (∞-gram), ``find``).
* :mod:`tokenmill.ngram.counts` — n-gram counting: compact follower tables of orders 2..32
  derived from the index (frequent contexts stored, the rest answered exactly from the
  suffix array), with an interpolated ``P(next | context)`` (top-k per position or full
  distributions); and sparse pair counts of verified shards on Ray.
* :mod:`tokenmill.ngram.observed` — ``ObservedPairs``: the order-2 counts of a manifest's
  shards and the legality table's soundness check (``tokenmill ngram pairs``).
* :mod:`tokenmill.ngram.lem` — online causal longest-exact-match predictor (suffix
  automaton, numba), per-position or per-step causality, bounded window.
* :mod:`tokenmill.ngram.stream` — ``LEMStream``: the predictor in its own process, ahead of
  a trainer, through shared-memory ring slots.
* :mod:`tokenmill.ngram.precompute` — ``precompute_lem``: the same features of a whole
  stream ahead of time, by the chunk algorithm of :mod:`tokenmill.ngram.lem_chunks` (in
  process) or its Ray and shared-memory execution (:mod:`tokenmill.ngram.lem_ray`).
* :mod:`tokenmill.suffixarray` — suffix arrays and LCP arrays (libdivsufsort), the one
  place suffixes are sorted (index, counts, LEM precompute, substring dedup).
* :mod:`tokenmill.ngram.ngramfeat` — the n-gram model's top-m candidates per position.
* :mod:`tokenmill.ngram.sidechannel` — a mix's token stream and the side channels written
  beside it (``tokenmill ngram lem`` / ``ngram features``).

Nothing is imported here, so ``tokenmill --help`` stays fast; import the modules.
"""


def __getattr__(name: str):  # ``tokenmill.ngram.precompute_lem``, imported on first use
    if name == "precompute_lem":
        from tokenmill.ngram.precompute import precompute_lem
        return precompute_lem
    raise AttributeError(f"module 'tokenmill.ngram' has no attribute {name!r}")
