# pasta: `make demo` (set up, then run the main job on the embedded model) and `make test` (set up, then the suite).
VENV ?= .venv
PY := $(VENV)/bin/python
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

.PHONY: setup demo test lint

setup:
	PASTA_VENV=$(VENV) bash scripts/setup.sh

demo: setup
	PASTA_VENV=$(VENV) bash scripts/demo.sh

test: setup
	$(OFFLINE) $(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check .
