# The two commands of the README: `make run` (every artifact at embedded scale) and `make test`.
# Each creates the virtual environment from requirements.lock first if it is missing or stale.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: run test lint bench cost clean-results

$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

run: $(VENV)/.installed
	$(BIN)/snakemake --cores $(CORES)

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests benchmarks workflow/scripts
	$(BIN)/snakemake --lint

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/engine.py
	$(BIN)/python benchmarks/engine.py --preset peers --clients 10 20 50 100 --rounds 5
	$(BIN)/python benchmarks/memory.py

cost: $(VENV)/.installed
	$(BIN)/python -m fedrepro.cost --configfile config/paper.yaml

clean-results:
	rm -rf results/*/ .snakemake/metadata
