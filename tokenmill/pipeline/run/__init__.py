"""Running the pipeline: the executor, the stage list, the Ray tasks (prepare a unit,
tokenize a block, write a source's shards), the content-addressed intermediates, the
quarantine files and the manifest's accounting."""
