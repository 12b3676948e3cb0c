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

# Three workers (pytest-xdist): most of the suite waits on brokers, Redis and child
# processes rather than on the CPU, so even two cores run it in well under the serial time.
# Every fixture starts its own servers on free ports and names its topics and Redis
# namespaces per test, so the workers never share state. TEST_WORKERS=0 runs it serially.
# One test at a time to each worker (--maxschedchunk 1): the slow tests are collected
# first (tests/conftest.py), and xdist's default first hand-out of ~100 consecutive tests
# per worker gave every one of them to the first worker, which then ran them one after
# another while the others finished the short tests and waited.
TEST_WORKERS ?= 3

test: check
	$(BIN)/pytest -n $(TEST_WORKERS) --dist load --maxschedchunk 1

# The long crash, outage and rebalance runs that `make test` leaves out (~3 minutes).
soak: $(STAMP)
	$(BIN)/pytest -m soak

demo: $(STAMP)
	$(BIN)/stream-dedup demo

bench: $(STAMP)
	$(BIN)/python bench/bench_offline.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
