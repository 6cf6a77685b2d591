"""Running the pipeline: the executor, the stage list, the Ray tasks (prepare a unit,
tokenize a block, write a source's shards) and how they run (:mod:`.tasks`), the global
stages' decisions and removals (:mod:`.removals`), the content-addressed and partitioned
intermediates, the quarantine files and the manifest's accounting."""
