# One entry point for people and CI. Every target sets up the virtual environment first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup check lint format typecheck test soak bench demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check stream_dedup tests bench
	$(BIN)/ruff format --check stream_dedup tests bench

format: $(STAMP)
	$(BIN)/ruff format stream_dedup tests bench
	$(BIN)/ruff check --fix stream_dedup tests bench

typecheck: $(STAMP)
	$(BIN)/mypy stream_dedup

check: lint typecheck

test: check
	$(BIN)/pytest

# The long crash, outage and rebalance runs that `make test` leaves out (~3 minutes).
soak: $(STAMP)
	$(BIN)/pytest -m soak

demo: $(STAMP)
	$(BIN)/stream-dedup demo

bench: $(STAMP)
	$(BIN)/python bench/bench_offline.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
