"""Test session setup: Triton kernels run in the interpreter where there is no GPU
(`TRITON_INTERPRET` must be set before any kernel module is imported; its dead work is
skipped: tests/triton_interpreter.py), `gpu`-marked tests are skipped there, and vLLM's CPU
kernels run without AMX in this process and every engine and server it starts, stock ones
included (REPLAYSSM_CPU_AMX=0; vllm_replayssm.cpu_amx: an engine with ReplaySSM on hides
AMX in its own processes, stock vLLM keeps it)."""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("REPLAYSSM_CPU_AMX", "0")
    from vllm_replayssm.cpu_amx import hide_amx

    hide_amx()
    from .triton_interpreter import speed_up

    speed_up()
# vLLM's log handler keeps the sys.stdout of vLLM's first import: imported first inside a
# test that takes capsys (a run of one engine-test node), it writes to that test's capture
# after it is closed, and every later engine line of the process is a "Logging error"
# traceback ("I/O operation on closed file": 1,800 lines of one GPU log on 2026-12-07).
import vllm.logger  # noqa: E402, F401


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Tiny checkpoints and greedy engine runs, each built or run once per session
    (tests/models/runs.py)."""
    from .models.runs import EngineRuns

    return EngineRuns(tmp_path_factory.mktemp("tiny"))
