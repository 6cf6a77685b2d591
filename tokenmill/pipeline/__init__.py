"""The curation pipeline of ``tokenmill run``, in wings:

``read/``
    sources (local folders, Hub snapshots), file readers, the license gates, text
    normalization: everything up to a stream of documents.
``document/``
    the per-document stages (length, quality, language): a new document stage goes here.
``dedup/``
    the cross-document (global) stages: exact and MinHash-LSH fuzzy dedup, decided in
    hash partitions on Ray (connected components, the MinHash kernels).
``run/``
    the executor and what it runs: the stage list, the Ray tasks (prepare a unit,
    tokenize a block, write a source) and their typed specs, the global decisions'
    removals, the content-addressed and partitioned intermediates, the manifest's
    accounting.
``report/``
    what a finished output folder is turned into for people: ``report.html`` and its
    plots, the curated text in the Hugging Face layout.

:mod:`.stage` holds the shape every stage has (documents, rejections, the document and
global stage interfaces); :mod:`.config` the datamix configuration; :mod:`.commands`
the CLI. A new stage is a module (a class with the shape of :mod:`.stage`) and one line
in :data:`tokenmill.pipeline.run.stage_list.STAGES`.
"""
