"""The cross-document (global) stages, each a
:class:`~tokenmill.pipeline.stage.GlobalStage`: exact dedup (:mod:`.exact`) and MinHash-LSH
fuzzy dedup (:mod:`.fuzzy`), decided in hash partitions on Ray (connected components of
the candidate graph in :mod:`.components`, the MinHash kernels in :mod:`.minhash`)."""
