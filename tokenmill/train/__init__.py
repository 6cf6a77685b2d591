"""The reference trainer (``tokenmill train``).

* :mod:`tokenmill.train.config` — :class:`TrainConfig` (pydantic, one-line errors), the
  learning-rate schedule;
* :mod:`tokenmill.train.data` — :class:`MixLoader`, the one loader (document-aligned rows
  from a training-mix or curation manifest);
* :mod:`tokenmill.train.batches` — the run's data opened once (:func:`open_data`): every
  loader of the run (the train loader checked against the budget), the global stream,
  validation rows, document ids;
* :mod:`tokenmill.train.side` — the side-input interface and side-channel reading;
  :mod:`tokenmill.train.lemside`, :mod:`tokenmill.train.lemworkers`,
  :mod:`tokenmill.train.ngramside` — the LEM and n-gram side inputs;
* :mod:`tokenmill.train.targets` — the tokenizer tables opened once (:class:`TokenTables`:
  legality mask rows, prefix auxiliary targets), checked against the data's tokenizer;
* :mod:`tokenmill.train.model` / :mod:`tokenmill.train.kernels` — the GPT and its Triton
  kernels, one module per kernel family beside its torch reference;
* :mod:`tokenmill.train.checkpoint` — exact-resume checkpoints, rotated;
* :mod:`tokenmill.train.report` — ``metrics.json``, the summary table, the loss plot;
* :mod:`tokenmill.train.train` — :func:`~tokenmill.train.train.setup` (a run object) and
  :func:`~tokenmill.train.train.training_loop`, read top to bottom as nanoGPT's.

Nothing is imported here, so ``tokenmill --help`` stays fast; import the modules.
"""
