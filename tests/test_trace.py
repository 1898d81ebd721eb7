"""The diagnosis step trace (vllm_replayssm/trace.py) on a CPU engine: NemotronH with ngram
speculative decoding, REPLAYSSM_TRACE_STEPS set. Every step has a build line; every step with
decode rows has a forward line of the first Mamba-2 layer (no CUDA graphs on CPU), whose rows
agree with the build's; commits never exceed the pending window, and some drafts commit."""

import json
import os

import pytest

from vllm_replayssm.trace import TRACE_ENV

from .models.runs import NEMOTRON_H_PROMPTS, PEAKED, SCHEDULER
from .models.tiny import greedy_outputs

pytestmark = pytest.mark.engine


def test_trace_of_a_speculative_cpu_run(runs, tmp_path, monkeypatch):
    path = tmp_path / "trace"
    monkeypatch.setenv(TRACE_ENV, str(path))
    greedy_outputs(
        runs.checkpoint("nemotron_h", **PEAKED),
        NEMOTRON_H_PROMPTS[:4],
        12,
        additional_config={"replayssm": {"enabled": True, "buffer_len": 8}},
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        },
        **SCHEDULER,
    )
    text = (tmp_path / f"trace.{os.getpid()}").read_text()
    lines = [json.loads(x) for x in text.splitlines()]
    builds: dict[int, list[dict]] = {}  # one line per Mamba-2 KV-cache group and step
    for x in lines:
        if x["kind"] == "build":
            builds.setdefault(x["step"], []).append(x)
    forwards = [x for x in lines if x["kind"] == "forward"]
    assert len(builds) > 12 and forwards
    for group_builds in builds.values():
        for b in group_builds:
            assert b["num_decodes"] + b["num_prefills"] == b["num_reqs"]
    decode_steps = {s for s, bs in builds.items() if bs[0]["num_decodes"]}
    assert decode_steps <= {f["step"] for f in forwards}
    for f in forwards:
        assert len(f["slots"]) == len(f["q"]) == len(f["seq_lens"]) == len(f["meta"])
        assert all(c <= p for c, p in zip(f["committed"], f["pending"], strict=True))
        # The traced layer's group is one of the step's builds; its decode rows (or, for
        # windowed prefill rows, some of its prefill rows) are the forward's rows.
        rows = [b["decode_slots"] for b in builds[f["step"]]]
        rows += [b["prefill_slots"] for b in builds[f["step"]]]
        assert any(set(f["slots"]) <= set(r) for r in rows), (f, builds[f["step"]])
    assert any(c > 1 for f in forwards for c in f["committed"]), "no draft was committed"
