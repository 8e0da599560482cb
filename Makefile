# Shardline developer commands. `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup check test lint demo clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# The quick tier: the tests that start no server, Ray cluster or browser.
check: setup
	$(BIN)/ruff check .
	$(BIN)/mypy src/shardline bench tests
	OMP_NUM_THREADS=1 $(BIN)/pytest -q -ra --durations=10 tests/unit

test: setup
	$(BIN)/ruff check .
	$(BIN)/mypy src/shardline bench tests
	OMP_NUM_THREADS=1 $(BIN)/pytest -q -ra --durations=15 tests

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy src/shardline bench tests

demo: setup
	OMP_NUM_THREADS=1 $(BIN)/shardline demo examples/demo.yaml

clean:
	rm -rf $(VENV) .shardline .pytest_cache .mypy_cache .ruff_cache
