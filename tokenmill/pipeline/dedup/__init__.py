"""The cross-document stages: exact dedup and MinHash-LSH fuzzy dedup, decided in hash
partitions on Ray (partitioned files, connected components of the candidate graph, the
MinHash kernels in :mod:`.minhash`)."""
