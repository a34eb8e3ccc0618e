# Two entry points, see README.md: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint types pytest clean bench-report

# The installs come from uv.lock (`uv lock` after a change of pyproject.toml's dependencies;
# `make lint` fails on a stale lock), by uv, pinned once in pyproject.toml's dev group and
# bootstrapped into the venv with pip.
UV       := $(BIN)/uv
UV_PIN   := $(shell sed -n 's/^ *"\(uv==[^"]*\)",*$$/\1/p' pyproject.toml)
UV_SYNC  := UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --frozen --compile-bytecode --extra all
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
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

types: $(STAMP)
	$(BIN)/mypy

## Three test processes (pytest-xdist) fed one test at a time, the slow directories first and
## the tests that share a module's engine or world as one unit (tests/conftest.py), so that
## no long test runs alone at the end. The property tests run their fixed "ci" budget; every
## run lists its 25 slowest tests. Python may cache bytecode (in the ignored __pycache__
## folders) even where the environment says PYTHONDONTWRITEBYTECODE, and the house is
## compiled once before the run (the installed packages were compiled by uv sync): otherwise
## each of the run's engine, parser and CLI processes compiles the engine anew, and each test
## process rewrites every test module. Three processes on two cores: the tests wait on
## engines, brokers and browsers, and with two the cores stood idle between (whole suite,
## quiet machine: 698 s with two, 535 s with three, the cores 90% busy).
pytest: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m compileall -q -j 2 engine triggers shared_stream producers tests
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -n 3 --dist loadgroup --hypothesis-profile=ci

## The README's performance table and docs/images/user_figures.png, from bench/results/*.json
## (run the benches first: README.md, "Performance"); matplotlib draws the chart.
bench-report: $(STAMP)
	$(BIN)/python -c "import matplotlib" 2>/dev/null || $(UV) pip install --python $(BIN)/python 'matplotlib>=3.8'
	$(BIN)/python bench/user_report.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis site
