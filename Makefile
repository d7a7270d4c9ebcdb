# One command each for a newcomer: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint gpu-test bench clean

$(BIN)/gpuwarden: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,ray]'
	@touch $@

demo: $(BIN)/gpuwarden
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/demo.sh

lint: $(BIN)/gpuwarden
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

# Four workers keep two cores busy (tests wait on daemons and jobs between bursts); a
# file's tests stay together on one worker, Ray's file first (tests/conftest.py: in the
# order given there, not xdist's). The suite starts over a thousand
# interpreters (CLI calls, daemons, supervisors, simulated jobs): compiled once here,
# their modules load from bytecode instead of being compiled by each, even where
# PYTHONDONTWRITEBYTECODE is set (it also keeps pytest from caching its rewritten tests).
PYTEST_WORKERS ?= 4

test: lint
	$(BIN)/python -m compileall -q src tests
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# On a machine with a real NVIDIA GPU, torch and nvidia-ml-py (no venv needed).
gpu-test:
	PYTHONPATH=src $(PY) -m pytest -m gpu tests/gpu -p no:cacheprovider -v

bench: $(BIN)/gpuwarden
	PATH="$(CURDIR)/$(BIN):$$PATH" bench/run.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
