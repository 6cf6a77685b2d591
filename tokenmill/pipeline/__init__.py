"""The curation pipeline of ``tokenmill run``, in wings:

``read/``
    sources (local folders, Hub snapshots), file readers, the license gates, text
    normalization: everything up to a stream of documents.
``document/``
    the per-document stages (length, quality, language): a new document stage goes here.
``dedup/``
    the cross-document stages: exact and MinHash-LSH fuzzy dedup, decided in hash
    partitions (partitioned files, connected components, the MinHash kernels).
``run/``
    the executor and what it runs: the stage list, the Ray tasks (prepare, tokenize,
    shard writing), the content-addressed intermediates and the manifest's accounting.
``report/``
    what a finished output folder is turned into for people: ``report.html`` and its
    plots, the curated text in the Hugging Face layout.

:mod:`.stage` holds the shape every stage has (documents, rejections, the document and
global stage interfaces); :mod:`.config` the datamix configuration; :mod:`.commands`
the CLI.
"""
