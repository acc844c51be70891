# The two commands of the README: `make run` (every artifact at embedded scale) and `make test`.
# Each creates the virtual environment from requirements.lock first if it is missing or stale.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= $(shell nproc 2>/dev/null || echo 2)
# Another CPU's kernels on this one (docs/measurements/kernel-sets.md): torch's ATen vectors and oneDNN's convolutions capped to
# what an AVX2-only or an SSE4.1-only x86-64 CPU runs. `make test KERNELS=avx2`, `make run KERNELS=sse41`.
KERNELS ?= native
KERNELS_native :=
KERNELS_avx2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
KERNELS_sse41 := ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41
ifeq ($(filter $(KERNELS),native avx2 sse41),)
$(error KERNELS=$(KERNELS): one of native, avx2, sse41)
endif
WITH_KERNELS := env $(KERNELS_$(KERNELS))

.PHONY: run test test-durations browser fashion-mnist laptop-full laptop-feddle-600 laptop-feddle-table5 \
	laptop-feddle-table5-d01 laptop-feddle-table5-d03 laptop-feddle-table5-widths snapshot-laptop-full snapshot-laptop-feddle-table5-parts \
	runs-save runs-restore lint bench \
	kernel-check cost preflight clean-results \
	clean-paper-results

# --no-compile: pip would byte-compile all ~12,000 modules (~40 s of one core, mostly torch's); Python compiles
# the few hundred a job imports on first use and caches them in the venv
$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

# the embedded default's artifacts, the scorecard and the README showcase, then the HTML report of all of them
# (the default reads Fashion-MNIST: `make fashion-mnist` first puts Debian's copy where the download step looks)
run: $(VENV)/.installed fashion-mnist
	$(WITH_KERNELS) $(BIN)/snakemake --cores $(CORES) --report results/report.html --report-after-run

# one worker per core; a test file's tests stay on one worker (its module fixtures, such as the SLURM cluster, start
# once), and files are dealt longest first (tests/conftest.py orders them by tests/durations.json)
PYTEST_WORKERS = -n $(CORES) --dist loadfile --no-loadscope-reorder
test: $(VENV)/.installed browser fashion-mnist
	$(WITH_KERNELS) $(BIN)/python -m pytest -q $(PYTEST_WORKERS)

# the suite once more, its seconds per test file written to tests/durations.json (the order `make test` deals them
# in): after adding or growing a long test
test-durations: $(VENV)/.installed browser fashion-mnist
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS) --durations=0 | $(BIN)/python tests/support/durations.py

# Headless Chromium for tests/report/test_report_browser.py: installed with apt-get where missing and we are root
# (CI); elsewhere that test is skipped with the reason.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else echo "chromium or chromedriver missing (not root): the report's browser test will be skipped"; fi

# Fashion-MNIST's four idx files from Debian's package (the config's local_data_dirs looks in its directory
# before the network): installed with apt-get where missing and we are root; elsewhere the download step
# uses the network, and the test of the package's files is skipped with the reason.
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist
fashion-mnist:
	@if [ -f $(FASHION_MNIST_DIR)/train-images-idx3-ubyte.gz ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	else echo "dataset-fashion-mnist missing (not root): Fashion-MNIST will be downloaded from the network"; fi

# every table and figure of the four studies at laptop scale (hours: docs/laptop-full.md), into results/laptop-full;
# -P starts Feddle's Fashion-MNIST jobs (the longest, up to ~50 minutes each) first, so no core idles at the end
laptop-full: $(VENV)/.installed fashion-mnist
	$(BIN)/snakemake --cores $(CORES) --configfile config/laptop-full.yaml \
	  -P results/laptop-full/feddle-fmnist/tables/table5.md

# Feddle's four averaging baselines of Table 5 trained until they settle (600 rounds, ~0.9 core-hours; not in
# laptop-full: docs/laptop-full.md), into results/laptop-feddle-600
laptop-feddle-600: $(VENV)/.installed fashion-mnist
	$(BIN)/snakemake --cores $(CORES) --configfile config/laptop-feddle-600.yaml

# Feddle's Table 5 on Fashion-MNIST, four columns, at the paper's tuning protocol, with Tables 3 and 6 and Figs. 2, 6
# and 7 on the same data (not in laptop-full; ~93 core-hours estimated by fedrepro.cost), in parts of at most a few
# hours on 2 cores that each resume where they stopped (docs/measurements/laptop-feddle-table5.md): each tuning stage
# (laptop-feddle-table5-tune-<stage>: clients first, then server_<method>, one per method's grid, each writing its
# table and choice); Table 5's D(0.1) and D(0.3) columns (METHODS="..." narrows them to methods already tuned,
# TABLE=table5-readings runs the other readings' rows instead); the rest (Tables 3 and 6, Fig. 2) and every table
# and figure with laptop-feddle-table5
TABLE5_CONFIG := config/laptop-feddle-table5.yaml
TABLE5 := results/laptop-feddle-table5/feddle-table5
# Snakemake's targets for a part of the study's train jobs (fedrepro.jobs; a name it does not know stops the part),
# before --configfile, which would take them for config files
TABLE5_PART = targets=$$($(BIN)/python -m fedrepro.jobs --configfile $(TABLE5_CONFIG) $(1) \
	$(if $(METHODS),--methods $(METHODS))) && $(BIN)/snakemake --cores $(CORES) $$targets --configfile $(TABLE5_CONFIG)
# the table whose cells a -d01/-d03 part fills: table5, or table5-readings (the two ambiguous baselines' other readings)
TABLE ?= table5
# each part first puts back the finished seeds archived in the repository (runs-restore: a new machine resumes
# where the last one stopped; one whose results root holds them already copies nothing)
RESTORE = $(BIN)/python -m fedrepro.report.archive restore --configfile
TABLE5_RESTORE = $(RESTORE) $(TABLE5_CONFIG)
laptop-feddle-table5-tune-%: $(VENV)/.installed fashion-mnist
	$(TABLE5_RESTORE)
	$(BIN)/snakemake --cores $(CORES) $(TABLE5)/tuning/$*.md --configfile $(TABLE5_CONFIG)
laptop-feddle-table5-d01: $(VENV)/.installed fashion-mnist
	$(TABLE5_RESTORE)
	$(call TABLE5_PART,--study feddle-table5 --table $(TABLE) --settings fm-d01-n20 fm-d01-n5)
laptop-feddle-table5-d03: $(VENV)/.installed fashion-mnist
	$(TABLE5_RESTORE)
	$(call TABLE5_PART,--study feddle-table5 --table $(TABLE) --settings fm-d03-n20 fm-d03-n5)
laptop-feddle-table5: $(VENV)/.installed fashion-mnist
	$(TABLE5_RESTORE)
	$(BIN)/snakemake --cores $(CORES) --configfile $(TABLE5_CONFIG)
# a probe beside it (issue 49): FedBuff at its tuned values with Feddle's CNN at the laptop and the paper-scale widths,
# D(0.1), 3 seeds (~5 core-hours estimated; SETTINGS="fm-d01-n5-cnn3 ..." runs only those columns' jobs)
WIDTHS_CONFIG := config/laptop-feddle-table5-widths.yaml
laptop-feddle-table5-widths: $(VENV)/.installed fashion-mnist
	$(RESTORE) $(WIDTHS_CONFIG)
	targets=$$($(BIN)/python -m fedrepro.jobs --configfile $(WIDTHS_CONFIG) --study feddle-table5-widths \
	  $(if $(SETTINGS),--settings $(SETTINGS))) && $(BIN)/snakemake --cores $(CORES) $$targets \
	  $(if $(SETTINGS),,all) --configfile $(WIDTHS_CONFIG)
# copy what has finished so far into docs/results/laptop-feddle-table5: the tuning stages (a later call adds the ones
# since) and the tables from the jobs finished (fedrepro.report.progress); first, every finished seed into its
# archive (runs-save), which a snapshot with no stage finished since would otherwise stop
snapshot-laptop-feddle-table5-parts: $(VENV)/.installed
	$(BIN)/python -m fedrepro.report.archive save --configfile $(TABLE5_CONFIG)
	$(BIN)/python -m fedrepro.report.snapshot --configfile $(TABLE5_CONFIG) --out docs/results/laptop-feddle-table5 --parts

# A results root does not outlive its machine: the finished seeds of a config's train jobs (run folders and
# done-markers, a few KB a seed) saved into docs/results/runs/<config>/ and put back on another machine, where the
# train jobs then train none of them again (fedrepro.report.archive; RUNS_CONFIG=config/laptop-full.yaml ...)
RUNS_CONFIG ?= $(TABLE5_CONFIG)
runs-save: $(VENV)/.installed
	$(BIN)/python -m fedrepro.report.archive save --configfile $(RUNS_CONFIG)
runs-restore: $(VENV)/.installed
	$(RESTORE) $(RUNS_CONFIG)

# copy a complete laptop-full run's scorecard, tables and figures into docs/results/laptop-full (WALL_TIME: as measured;
# REFRESH=study ...: replace only those studies' files, from a run of them alone: docs/laptop-full.md)
snapshot-laptop-full: $(VENV)/.installed
	$(BIN)/python -m fedrepro.report.snapshot --configfile config/laptop-full.yaml --out docs/results/laptop-full \
	  --wall-time "$(WALL_TIME)" $(if $(REFRESH),--refresh $(REFRESH))

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests benchmarks workflow/scripts
	$(BIN)/snakemake --lint

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/engine.py
	$(BIN)/python benchmarks/engine.py --preset peers --clients 10 20 50 100 --rounds 5
	$(BIN)/python benchmarks/memory.py
	$(BIN)/python benchmarks/roofline.py
	$(BIN)/python benchmarks/pool_order.py
	$(BIN)/python benchmarks/moon_features.py
	$(BIN)/python benchmarks/inference_batch.py
	$(BIN)/python benchmarks/kernel_sets.py

# the default with seeds 0-4 under each KERNELS set, into results/kernels/<set>/, then every run's status and plateau
# and Disco's paired gain per set (~2 h 10 min on 2 cores, SSE4.1 half of it: docs/measurements/kernel-sets.md)
kernel-check: $(VENV)/.installed fashion-mnist
	$(BIN)/python benchmarks/default_on_kernel_sets.py --cores $(CORES)

cost: $(VENV)/.installed
	$(BIN)/python -m fedrepro.cost --configfile config/paper.yaml

# every job shape of a config through the real train path for two rounds on synthetic data of its real shapes,
# projected to the paper's sizes against train_resources (PREFLIGHT_ARGS: --sample N, --device cuda, ...)
PREFLIGHT_CONFIG ?= config/paper.yaml
preflight: $(VENV)/.installed
	$(BIN)/python -m fedrepro.preflight --configfile $(PREFLIGHT_CONFIG) --jobs $(CORES) \
	  --out results/preflight/$(notdir $(basename $(PREFLIGHT_CONFIG))).md $(PREFLIGHT_ARGS)

# the embedded default's results only: paper-scale ones (results/paper, GPU days) go with clean-paper-results
clean-results:
	find results -mindepth 1 -maxdepth 1 -type d ! -name paper -exec rm -rf {} +
	rm -rf .snakemake/metadata

clean-paper-results:
	rm -rf results/paper .snakemake/metadata
