# Every target creates .venv and installs the project into it when missing, so a fresh machine
# needs nothing but a Python >= 3.11 on PATH.

VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PACKAGES := eventlog projections sessions replay service sessionlog integrations

# The first interpreter on PATH that is new enough.
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	2>/dev/null && { echo $$p; break; }; done)

.PHONY: test lint typecheck pytest demo bench bench-peers clean

# Two install stamps: the demo needs only the package and its runtime dependencies; the test
# target adds the toolchain (pytest, ruff, mypy, the PostgreSQL driver, ...).
DEMO_STAMP := $(VENV)/.demo-stamp

$(VENV)/bin/python:
	@test -n "$(PYTHON)" || { echo "sessionlog needs Python >= 3.11 on PATH" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP) $(DEMO_STAMP)

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict $(PACKAGES)

pytest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: $(DEMO_STAMP)
	$(BIN)/python demo/demo.py

bench: $(STAMP)
	$(BIN)/python -m bench

# The peer libraries live in a virtualenv of their own, so the project's never depends on them.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed-stamp

$(PEERS_STAMP): pyproject.toml bench/peers/requirements.txt
	@test -n "$(PYTHON)" || { echo "sessionlog needs Python >= 3.11 on PATH" >&2; exit 1; }
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/peers/requirements.txt -e .
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python -m bench.peers $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(PEERS_VENV) var .pytest_cache .mypy_cache .ruff_cache .hypothesis
