"""Decontamination against eval sets: normalized-word n-grams (:mod:`.text`, after
datatrove's ``NGramsDecontConfig``) and the eval-set index (:mod:`.index`). The stage is
:mod:`tokenmill.pipeline.document.decontaminate`."""
