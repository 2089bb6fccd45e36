# adjcap: the two commands. Each creates .venv with plain pip on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.adjcap-installed

export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export RAY_USAGE_STATS_ENABLED ?= 0
export TOKENIZERS_PARALLELISM ?= false
# Python writes the bytecode of what it imports into .venv (and __pycache__/) on first use. With
# PYTHONDONTWRITEBYTECODE set (some sandboxes and CI images set it), every process -- each Ray worker
# and pool actor, each CLI call -- compiled torch, transformers and ray from source again: ~24 s of CPU
# to import open_clip, ray and transformers against ~8 s with bytecode (2-core Xeon).
unexport PYTHONDONTWRITEBYTECODE
# the demo world + tiny models the tests read, built once and shared by test sessions (tests/conftest.py)
export ADJCAP_TEST_WORLD ?= $(CURDIR)/.cache/test-world

.PHONY: demo test test-fast install clean-demo

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/adjcap demo

# two test processes (the Ray and Java tests wait on process start-up much of the time); modules stay
# whole on one worker (--dist loadfile), the slow ones first (tests/conftest.py). Tests that kill
# processes or nodes at chosen moments (marker `alone`) then run by themselves, without a neighbour's load.
# First, what the modules would wait on is built side by side: the demo world (CPU) and the LAVIS
# environment (pip) (tests/prebuild.py).
TEST_WORKERS ?= 2
# one compute thread per test process: with torch's default (a thread per core) the two workers' threads
# outnumbered the two cores and waited on each other (make test-fast 3:26 against 2:52 with one, 2-core Xeon);
# the Ray workers of a portable-numerics job are pinned to one thread anyway (adjcap.machine.numerics.PIN)
TEST_THREADS ?= 1

test: $(STAMP)
	$(BIN)/python tests/prebuild.py
	OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not alone" --durations=25 tests
	OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python -m pytest -q -m alone --durations=10 tests

# everyday work: no Ray cluster, no LAVIS environment, no end-to-end job, no repeated training of the
# tiny models (make test runs everything)
test-fast: $(STAMP)
	ADJCAP_TEST_FAST=1 OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not lavis and not training" --durations=10 tests

clean-demo:
	rm -rf runs/demo
