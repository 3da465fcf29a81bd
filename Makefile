# pasta: `make demo` (set up, then run the main job on the embedded model) and `make test` (set up, then the suite);
# `make docs` builds the docs site into site/ (mkdocs, warnings as errors, offline).
# The virtual environment of every target: VENV=..., else PASTA_VENV as the scripts read it, else .venv.
PASTA_VENV ?= .venv
VENV ?= $(PASTA_VENV)
PY := $(VENV)/bin/python
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# pytest-xdist workers: one per core and one more (each test runs torch on one thread, tests/conftest.py): the
# suite's tests also wait on the processes and servers they start, so a core would sit idle with one worker each;
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

.PHONY: setup demo test lint docs

setup:
	PASTA_VENV=$(VENV) bash scripts/setup.sh

demo: setup
	PASTA_VENV=$(VENV) bash scripts/demo.sh

test: setup
	$(OFFLINE) $(PY) -m pytest -q -n $(TEST_WORKERS)

lint: setup
	$(VENV)/bin/ruff check .

# NO_MKDOCS_2_WARNING: mkdocs-material's banner about MkDocs 2.0, printed on every build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(OFFLINE) $(PY) -m mkdocs build --strict --site-dir site
