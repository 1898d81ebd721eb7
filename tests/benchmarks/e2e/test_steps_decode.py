"""benchmarks/e2e/steps_decode.py: what the step recorder keeps of an engine step and how it
groups steps by phase and CUDA-graph mode (the hooks themselves need an engine: the tool's
own CPU run, `--tiny`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.e2e.steps_decode import StepRecorder, parse_args


def _scheduled(tokens_per_row: list[int], drafts: list[int]):
    return SimpleNamespace(
        total_num_scheduled_tokens=sum(tokens_per_row),
        num_scheduled_tokens={f"r{i}": n for i, n in enumerate(tokens_per_row)},
        scheduled_spec_decode_tokens={f"r{i}": [0] * d for i, d in enumerate(drafts) if d},
    )


def test_steps_are_grouped_by_phase_and_cudagraph_mode():
    rec = StepRecorder()
    rec.phase = "full0"
    for wall, mode, drafts in (
        (0.030, "FULL", [3, 3]),
        (0.034, "FULL", [3, 3]),
        (0.2, "NONE", [1, 3]),
    ):
        rec._cg, rec._host = (mode, 8), {"_prepare_inputs": 0.001}
        rec.record(_scheduled([1 + d for d in drafts], drafts), wall)
    rec.record(_scheduled([], []), 1.0)  # nothing scheduled: not a step
    rec.phase = "first0"
    rec._cg, rec._host = None, {}
    rec.record(_scheduled([128, 128], [0, 0]), 0.3)
    assert [s["drafts"] for s in rec.steps[:3]] == [{"3": 2}, {"3": 2}, {"1": 1, "3": 1}]
    summary = rec.summary()
    assert list(summary) == ["full0", "first0"]
    full = summary["full0"]
    assert full["steps"] == 3 and full["wall_ms_sum"] == pytest.approx(264.0)
    graphs = full["by_cudagraph_mode"]["FULL"]
    assert graphs["steps"] == 2 and graphs["wall_ms_median"] == pytest.approx(32.0)
    assert graphs["host_ms_median"] == {"_prepare_inputs": pytest.approx(1.0)}
    assert full["by_cudagraph_mode"]["NONE"]["steps"] == 1
    assert summary["first0"]["by_cudagraph_mode"]["None"]["steps"] == 1


def test_arguments_are_checked():
    assert parse_args(["--modes", "on_spec"]).modes == ["on_spec"]
    with pytest.raises(SystemExit):
        parse_args(["--modes", "sideways"])
    with pytest.raises(SystemExit):
        parse_args(["--output-len", "1"])
