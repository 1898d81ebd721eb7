"""benchmarks/e2e/timeline_decode.py: which steps of a worker trace it reads as decode steps,
and how many tokens it asks for (the profiler run itself needs a GPU engine)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.e2e.timeline_decode import (
    analyse_trace,
    full_decode_steps,
    max_model_len,
    step_tokens,
)


def _span(name: str, ts: float, dur: float, cat: str) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat}


def _trace(steps: list[tuple[str, float, float]]) -> list[dict]:
    """A worker trace: per step (execute annotation, period µs, kernel µs) the host's
    annotations (the execute step, its preprocess phase), their copies on the GPU timeline
    and one kernel."""
    events, ts = [], 0.0
    for name, period, kernel in steps:
        for cat in ("user_annotation", "gpu_user_annotation"):
            events.append(_span(name, ts, period * 0.9, cat))
        events.append(_span("gpu_model_runner: preprocess", ts + 1, 5.0, "user_annotation"))
        events.append(_span("k", ts + 10, kernel, "kernel"))
        ts += period
    return events


PREFILL = "execute_context_256(32768)_generation_0(0)"
VERIFY = "execute_context_0(0)_generation_256(1024)"
TAIL = "execute_context_0(0)_generation_40(160)"


def test_verify_steps_are_read_by_their_rows():
    """A speculative generate: prefill steps, 12 full-batch verify steps of 40 ms, then a
    tail of smaller steps. The window is the middle half of the verify steps alone, although
    --steps (24) counts more steps than the trace has verify steps (before, the last 24
    steps of every kind: prefill and tail in the window)."""
    trace = _trace([(PREFILL, 200_000, 150_000)] * 3 + [(VERIFY, 40_000, 25_000)] * 12)
    tail = _trace([(TAIL, 9_000, 4_000)] * 6)
    end = 3 * 200_000 + 12 * 40_000
    trace += [{**e, "ts": e["ts"] + end} for e in tail]
    starts = full_decode_steps([e for e in trace if e["ph"] == "X"])
    assert len(starts) == 12 and starts[0] == 600_000
    got = analyse_trace(trace, steps=24)
    assert got["steps_in_window"] == 5
    assert got["period_us"] == pytest.approx(40_000)
    assert got["kernel_sum_us"] == pytest.approx(25_000)
    assert got["host_phases_us"][VERIFY] == pytest.approx(36_000)


def test_detailed_annotations_and_plain_steps():
    """vLLM's detailed step names (sequence figures in the brackets) count alike; a trace
    without step names falls back to the preprocess phases' last --steps."""
    detailed = "execute_context_0(sq0sk0sqsq0sqsk0)_generation_64(sq64sk9000sqsq64sqsk9000)"
    trace = _trace([(detailed, 10_000, 6_000)] * 16)
    assert len(full_decode_steps(trace)) == 16
    assert analyse_trace(trace, steps=16)["period_us"] == pytest.approx(10_000)
    unnamed = [e for e in trace if not e["name"].startswith("execute_")]
    assert full_decode_steps(unnamed) == []
    assert analyse_trace(unnamed, steps=16)["steps_in_window"] == 7


def test_tokens_per_step_follow_the_draft_length():
    args = argparse.Namespace(
        speculative={"method": "ngram_gpu", "num_speculative_tokens": 3},
        input_len=128,
        steps=24,
    )
    assert step_tokens("on_spec", args) == 4
    assert step_tokens("off", args) == 1
    assert max_model_len(["off", "on_spec"], args) == 128 + 24 * 4 + 32
    assert max_model_len(["off"], args) == 128 + 24 + 32
