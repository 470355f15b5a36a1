# The README's two set-up commands. On a fresh machine they are all the set-up there is.
#   make run   venv with every extra, then `starvecheck doctor --quick` on the embedded default
#   make test  venv with every extra and the test tools, then ruff, mypy and the fast lane
#              (what CI runs first): every test but the slow and the accuracy ones, on
#              every CPU
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip install --quiet --constraint constraints.txt

.PHONY: run test test-slow accuracy package-check lint bench clean system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first (the CPU build constraints.txt pins), then the torchvision made for it,
# without the compiled ops that cannot load beside a CPU torch: why, what works and what
# it costs are in scripts/torchvision_cpu.py. Everything after finds both installed.
$(VENV)/.installed-torch: constraints.txt scripts/torchvision_cpu.py | $(BIN)/python
	$(PIP) torch
	$(BIN)/python scripts/torchvision_cpu.py
	touch $@

# Stamp files record which extras are installed, so a second `make` is instant.
$(VENV)/.installed-test: pyproject.toml constraints.txt $(VENV)/.installed-torch
	$(PIP) -e '.[test]'
	touch $@

$(VENV)/.installed-all: pyproject.toml constraints.txt $(VENV)/.installed-torch
	$(PIP) -e '.[all,test]'
	touch $@ $(VENV)/.installed-test

run: $(VENV)/.installed-all
	$(BIN)/starvecheck doctor --quick

# System packages the tests run: Debian's prometheus (the server and promtool, which
# tests/test_prometheus.py starts and runs). Installed with apt-get where promtool is
# missing and we are root (CI); otherwise those tests skip saying why.
system-deps:
	@if command -v promtool >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q prometheus >/dev/null \
		|| { apt-get update -q >/dev/null && apt-get install -y -q prometheus >/dev/null; }; \
	else echo "make: promtool missing and not root: the Prometheus tests will skip"; fi

# Tests run with every extra: the tokenizer, Streaming and plot paths are tested, not skipped.
# Three lanes (docs/development.md, "The test lanes"):
#   test       the fast lane, in parallel (pytest-xdist): deterministic on a loaded machine
#   test-slow  real workers, processes and signals end to end; deterministic, minutes
#   accuracy   truth checks of samplers, timings and predictions: needs a quiet machine
TEST_WORKERS ?= auto
# mypy checks the packages [tool.mypy] in pyproject.toml names (docs/development.md,
# "Types"); its cache (.mypy_cache) makes a second run take a second or two.
test: $(VENV)/.installed-all system-deps
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow and not accuracy"

test-slow: $(VENV)/.installed-all system-deps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "slow and not accuracy"

accuracy: $(VENV)/.installed-all system-deps
	$(BIN)/python -m pytest -q -m accuracy

# Build the wheel and sdist, install the wheel in a fresh venv and run it (CI runs this).
package-check: $(VENV)/.installed-test
	$(BIN)/python scripts/package_check.py

lint: $(VENV)/.installed-test
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts

# BENCH_DIR: a directory on the storage to measure (io writes and removes its data there).
# io_vs_fio.py needs fio (apt-get install fio).
BENCH_DIR ?= .
bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/env_startup.py
	$(BIN)/python benchmarks/io_overhead.py --dir $(BENCH_DIR)
	$(BIN)/python benchmarks/io_vs_fio.py --dir $(BENCH_DIR)
	$(BIN)/python benchmarks/pad_strategies.py
	$(BIN)/python benchmarks/watch_overhead.py
	$(BIN)/python benchmarks/doctor_quick.py --dir $(BENCH_DIR)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
