"""The tiny checkpoints' build options (tests/models/tiny.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from .tiny import LONG_MEMORY_DT, build_checkpoint


def test_long_memory_makes_gdn_decays_input_independent_and_slow(tmp_path):
    """long_memory zeroes every GDN layer's gate projection and draws dt from LONG_MEMORY_DT;
    A and every other weight stay those of the same seed's default build."""
    default = load_file(build_checkpoint("qwen3_next", tmp_path / "default") / "model.safetensors")
    path = build_checkpoint("qwen3_next", tmp_path / "long", long_memory=True)
    weights = load_file(path / "model.safetensors")
    assert weights.keys() == default.keys()
    changed = {name for name in weights if not torch.equal(weights[name], default[name])}
    gates = {n for n in weights if n.endswith("in_proj_ba.weight")}
    dt_biases = {n for n in weights if n.endswith("dt_bias")}
    assert gates and len(gates) == len(dt_biases)
    assert changed == gates | dt_biases
    lo, hi = LONG_MEMORY_DT
    for name in gates:
        assert not weights[name].any(), name
    for name in dt_biases:
        dt = torch.nn.functional.softplus(weights[name].float())
        assert (dt >= lo * 0.99).all() and (dt <= hi * 1.01).all(), (name, dt)


def test_long_memory_needs_gdn_layers(tmp_path):
    with pytest.raises(ValueError, match="long_memory needs GDN layers"):
        build_checkpoint("nemotron_h", tmp_path / "nemotron_h", long_memory=True)
