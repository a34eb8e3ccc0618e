# Two entry points, see README.md: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint types pytest clean

# The installs come from uv.lock (`uv lock` after a change of pyproject.toml's dependencies;
# `make lint` fails on a stale lock), by uv, pinned once in pyproject.toml's dev group and
# bootstrapped into the venv with pip.
UV       := $(BIN)/uv
UV_PIN   := $(shell sed -n 's/^ *"\(uv==[^"]*\)",*$$/\1/p' pyproject.toml)
UV_SYNC  := UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --frozen --extra all
RUN_STAMP := $(VENV)/.installed-run

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet '$(UV_PIN)'

# The test environment: every extra and the dev group, exactly what the lock says (uv
# removes what it does not list).
$(STAMP): pyproject.toml uv.lock | $(UV)
	$(UV_SYNC) --group dev
	touch $(STAMP)

# What `make run` needs: every extra (the example DAGs watch Kafka and SQS), no dev tool.
# --inexact: a venv `make test` set up keeps its dev tools (and uv).
$(RUN_STAMP): pyproject.toml uv.lock | $(UV)
	$(UV_SYNC) --no-dev --inexact
	touch $(RUN_STAMP)

## Set up, create the SQLite metadata DB if missing, run the engine on dags/.
run: $(RUN_STAMP)
	SLUICE__CORE__DAGS_FOLDER=$${SLUICE__CORE__DAGS_FOLDER:-$(CURDIR)/dags} $(BIN)/sluice db migrate
	SLUICE__CORE__DAGS_FOLDER=$${SLUICE__CORE__DAGS_FOLDER:-$(CURDIR)/dags} $(BIN)/sluice run

## Set up the test environment, then lint (style, layers), type-check and run the whole test suite.
test: $(STAMP) lint types pytest

## The house: layers, no import circle, no _private module imported from outside (pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(UV) lock --check

types: $(STAMP)
	$(BIN)/mypy

## Two test processes (pytest-xdist), each taking whole files: most tests wait on servers
## and engine processes rather than on a core.
pytest: $(STAMP)
	$(BIN)/pytest -m "not soak" -q -n 2 --dist loadfile

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
