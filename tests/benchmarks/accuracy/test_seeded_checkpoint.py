"""benchmarks/accuracy/seeded_checkpoint.py on the e2e benchmark's tiny geometry: the same
arguments give byte-identical weights, another seed other weights, every SSM layer's
(A_log, dt_bias) in Mamba-2's ranges, a checkpoint transformers loads, and the command line
refuses a non-empty output directory."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks.accuracy import seeded_checkpoint


@pytest.mark.parametrize("kind", ["nemotron_h", "qwen3_next"])
def test_seeded_checkpoint_is_reproducible_and_in_range(kind, tmp_path):
    from transformers import AutoModelForCausalLM

    a = seeded_checkpoint.build(kind, tmp_path / "a", layers=4, tiny=True)
    b = seeded_checkpoint.build(kind, tmp_path / "b", layers=4, tiny=True)
    c = seeded_checkpoint.build(kind, tmp_path / "c", layers=4, tiny=True, seed=1)
    assert a["weights_sha256"] == b["weights_sha256"] != c["weights_sha256"]
    assert json.loads((tmp_path / "a" / seeded_checkpoint.MANIFEST).read_text()) == a
    assert a["initializer_range"] == pytest.approx(3.0 / math.sqrt(a["hidden_size"]))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a", dtype=torch.float32)
    ssm = [m for m in model.modules() if isinstance(getattr(m, "A_log", None), torch.nn.Parameter)]
    assert len(ssm) == a["ssm_layers"] > 0
    for m in ssm:
        A = m.A_log.detach().exp()
        dt = torch.nn.functional.softplus(m.dt_bias.detach())
        # bf16 storage: the ranges' ends to bf16 rounding
        assert A.min() >= 1.0 * (1 - 2**-7) and A.max() <= 16.0 * (1 + 2**-7)
        assert dt.min() >= 1e-3 * (1 - 2**-6) and dt.max() <= 1e-1 * (1 + 2**-6)


def test_command_line_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(SystemExit):
        seeded_checkpoint.main(["--model", "nemotron_h", "--out", str(tmp_path), "--tiny"])
