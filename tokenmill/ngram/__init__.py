"""N-gram side models built from tokenmill shards, for any trainer.

* :mod:`tokenmill.ngram.index` — infini-gram-style suffix-array index over a datamix
  (``count``, ``next_token_distribution``, ``longest_match`` (∞-gram), ``find``).
* :mod:`tokenmill.ngram.counts` — exact count tables of orders 2..8 built on Ray, with an
  interpolated ``P(next | context)`` (top-k per position or full distributions).
* :mod:`tokenmill.ngram.lem` — online causal longest-exact-match predictor (suffix
  automaton, numba), per-position or per-step causality, bounded window.
* :mod:`tokenmill.ngram.stream` — ``LEMStream``: the predictor in its own process, ahead of
  a trainer, through shared-memory ring slots.

Nothing is imported here, so ``tokenmill --help`` stays fast; import the modules.
"""
