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
