# One-command set-up: `make demo` and `make test` build .venv from pinned versions when
# it is missing or out of date, then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Compiled kernels are cached here and reused across test processes and runs.
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.cache/inductor
export PYTHONWARNINGS ?= ignore::FutureWarning
PYTEST_WORKERS ?= 2
# the slowest tests listed after a run (0: every test, for a profile of the suite's time)
PYTEST_DURATIONS ?= 15

.PHONY: demo test test-fast lint clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m probtorch.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) lint
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=$(PYTEST_DURATIONS) tests probtorch --doctest-modules

# Skips the tests marked slow.
test-fast: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not slow" tests

clean:
	rm -rf $(VENV) .cache .pytest_cache
