"""benchmarks/e2e/bench_decode_e2e.py: a worker process and everything it started end with
it, on a time-out too (a vLLM engine core left behind keeps the GPU's memory, and the next
mode's engine fails to start); which prompts the warm-up generates."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.e2e import bench_decode_e2e as bench
from benchmarks.e2e.bench_decode_e2e import run_worker_process


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _worker(pidfile: Path, then: str) -> list[str]:
    """A worker that starts a long-lived child (as vLLM starts its engine core), says so,
    then runs `then`."""
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "print('engine up', flush=True)\n" + then
    )
    return [sys.executable, "-c", code]


def test_a_timed_out_worker_leaves_no_process(tmp_path):
    pidfile, lines = tmp_path / "child.pid", []
    t0 = time.monotonic()
    rc = run_worker_process(_worker(pidfile, "time.sleep(300)"), 5, lines.append)
    assert rc == "timeout" and time.monotonic() - t0 < 60
    assert lines == ["engine up\n"]
    assert not _alive(int(pidfile.read_text()))


def test_a_worker_that_exits_leaves_no_process(tmp_path):
    pidfile, lines = tmp_path / "child.pid", []
    rc = run_worker_process(_worker(pidfile, "sys.exit(3)"), 60, lines.append)
    assert rc == 3 and lines == ["engine up\n"]
    assert not _alive(int(pidfile.read_text()))


class _RecordingLLM:
    """`llm.generate` as measure_batch calls it: records each call's prompts and max_tokens
    and answers max_tokens copies of each prompt's last id."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[list[int]], int]] = []

    def generate(self, batch, params, use_tqdm=False):
        prompts = [b["prompt_token_ids"] for b in batch]
        self.calls.append((prompts, params.max_tokens))
        return [
            SimpleNamespace(
                num_cached_tokens=0,
                outputs=[SimpleNamespace(token_ids=[p[-1]] * params.max_tokens)],
            )
            for p in prompts
        ]


@pytest.mark.parametrize(
    ("mode", "shared", "same"), [("off", 0, True), ("on", 0, True), ("on_pc", 32, False)]
)
def test_the_warm_up_runs_the_timed_prompts_outside_prefix_caching(mode, shared, same):
    """Outside the *_pc modes the warm-up generates the timed prompts (their step shapes,
    and so their JIT compiles, come before the timing); with prefix caching it takes other
    prompts after the same shared prefix (the timed first token stays a TTFT)."""
    spec = {
        "model": "nemotron_h",
        "mode": mode,
        "vocab_size": 1000,
        "input_len": 8,
        "output_len": 4,
        "warmup_tokens": 4,
        "seed": 0,
        "repeats": 1,
        "shared_prefix_len": shared,
        "replay": {"route": "replay"},
    }
    llm = _RecordingLLM()
    row = bench.measure_batch(llm, 3, spec, "test")
    (warm, n_warm), (first, n_first), (full, n_full) = llm.calls
    assert (n_warm, n_first, n_full) == (4, 1, 4) and first == full
    assert (warm == full) is same
    assert row["warmup_prompts"] == ("timed" if same else "other")
    if shared:
        assert all(w[:shared] == f[:shared] for w, f in zip(warm, full, strict=True))


class _TimedLLM:
    """`llm.generate` whose outputs carry vLLM's request metrics: request i's first token at
    `first[i]` s and its last one `decode[i % len(decode)]` s later (engine-core clock)."""

    def __init__(self, first: list[float], decode: list[float] | None) -> None:
        self.first, self.decode = first, decode

    def generate(self, batch, params, use_tqdm=False):
        outs = []
        for i, b in enumerate(batch):
            metrics = None
            if self.decode is not None:
                f = self.first[i]
                last = f + (self.decode[i % len(self.decode)] if params.max_tokens > 1 else 0.0)
                metrics = SimpleNamespace(first_token_ts=f, last_token_ts=last)
            outs.append(
                SimpleNamespace(
                    num_cached_tokens=0,
                    metrics=metrics,
                    outputs=[
                        SimpleNamespace(token_ids=[b["prompt_token_ids"][-1]] * params.max_tokens)
                    ],
                )
            )
        return outs


def test_decode_is_also_measured_inside_the_full_generate():
    """decode_tok_s_in_full: bs * (out - 1) over the last minus first token time of the
    request whose first token came last in each full generate (its decode steps all follow
    the prefill; no prefill-only generate enters it); without request metrics (stats logging
    off) the row says None and keeps no per-repeat figures."""
    spec = {
        "model": "nemotron_h",
        "mode": "on",
        "vocab_size": 1000,
        "input_len": 8,
        "output_len": 5,
        "warmup_tokens": 5,
        "seed": 0,
        "repeats": 2,
        "shared_prefix_len": 0,
        "replay": {"route": "replay"},
    }
    llm = _TimedLLM(first=[100.0, 101.0, 100.5], decode=[4.0, 2.5, 3.0])
    row = bench.measure_batch(llm, 3, spec, "test")
    assert row["t_decode_in_full_all_s"] == [2.5, 2.5]  # the request first served last
    assert row["first_token_spread_all_s"] == [1.0, 1.0]
    assert row["decode_tok_s_in_full"] == pytest.approx(3 * 4 / 2.5)
    assert row["peak_decoding_all"] == [3, 3] and "in_full_note" not in row
    # the third request starts after the first two finished (it waited for memory): the
    # batch never decoded together, so no in-full rate
    row = bench.measure_batch(
        _TimedLLM(first=[100.0, 101.0, 104.5], decode=[4.0, 2.0, 1.0]), 3, spec, "test"
    )
    assert row["peak_decoding_all"] == [2, 2] and row["decode_tok_s_in_full"] is None
    assert row["in_full_note"].startswith("at most 2 of 3 requests")
    row = bench.measure_batch(_TimedLLM(first=[0.0] * 3, decode=None), 3, spec, "test")
    assert row["decode_tok_s_in_full"] is None and "t_decode_in_full_all_s" not in row
    # a request without timestamps (vLLM leaves 0.0) makes the generate's spans unknown
    gen = bench.timed_generate(_TimedLLM(first=[0.0, 5.0], decode=[1.0]), [[1], [2]], 4)
    assert gen.spans is None and bench.decode_in_generate(gen.spans) is None
    gen = bench.timed_generate(_TimedLLM(first=[4.0, 5.0], decode=[1.0, 3.0]), [[1], [2]], 4)
    assert gen.spans == [(4.0, 5.0), (5.0, 8.0)] and gen.tokens == [[1] * 4, [2] * 4]
    assert bench.decode_in_generate(gen.spans) == {
        "decode_s": 3.0,
        "first_token_spread_s": 1.0,
        "peak_decoding": 2,  # one's first token when the other's last came
    }


def _saved(*bs: int, machine: bool = True, error=None, row_error: bool = False) -> dict:
    """A worker's last save: results for `bs`, `machine` once its engine had shut down."""
    results = [{"bs": b, "decode_tok_s": 1.0} for b in bs]
    if row_error:
        results[-1] = {"bs": bs[-1], "error": "RuntimeError()"}
    return {"results": results, "error": error, **({"machine": {}} if machine else {})}


@pytest.mark.parametrize(
    ("saved", "rc", "error", "note"),
    [
        (_saved(1, 256), 0, None, False),
        # timed out after the final save, every batch size measured: the figures stand
        (_saved(1, 256), "timeout", None, True),
        # timed out before the engine shut down, or with a batch size missing: an error
        (_saved(1, 256, machine=False), "timeout", "worker exited (timeout)", False),
        (_saved(1), "timeout", "worker exited (timeout)", False),
        (_saved(1, 256), -9, "worker exited (-9)", False),
        # the worker's own errors are kept as they are
        (_saved(1, 256, error="OOM"), "timeout", "OOM", False),
        (_saved(1, 256, row_error=True), "timeout", None, False),
    ],
)
def test_mark_worker_exit(saved, rc, error, note):
    bench.mark_worker_exit(saved, rc, [1, 256])
    assert saved["error"] == error
    assert ("worker_note" in saved) == note


def test_resolved_settings_record_the_captured_sizes_as_vllm_rounded_them():
    from vllm.config import CompilationConfig

    comp = CompilationConfig(cudagraph_capture_sizes=[6, 8, 1024], max_cudagraph_capture_size=1024)
    comp.adjust_cudagraph_sizes_for_spec_decode(4, 1)  # what vLLM does for k = 3 drafts
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(compilation_config=comp))
    )
    got = bench.resolved_settings(llm)
    assert got["compilation.cudagraph_capture_sizes"] == str(comp.cudagraph_capture_sizes)
    assert all(size % 4 == 0 for size in comp.cudagraph_capture_sizes)
    assert 1024 in comp.cudagraph_capture_sizes


def test_the_table_shows_each_runs_host_probe_range():
    """The results table carries each run's Python probe over its repeats (min-max ms), so a
    ratio between modes measured on a drifting host is visible as such; runs without the
    probe show none."""
    result = dict(
        bs=1,
        route="replay",
        decode_tok_s=458.3,
        output_tok_s=428.5,
        t_full_s=0.6,
        t_prefill_s=0.04,
        distinct_tokens=2,
    )
    runs = [
        dict(model="m", mode="on", error=None,
             results=[dict(result, python_probe_ms_per_repeat=[24.856, 24.758, 24.983])]),
        dict(model="m", mode="off", error=None,
             results=[dict(result, python_probe_ms_per_repeat=[45.4, 24.939, 44.933])]),
        dict(model="m", mode="on_spec", error=None, results=[result]),
    ]  # fmt: skip
    rows = bench.table_rows(runs, [])
    col = bench.HEADER.index("probe ms")
    assert [row[col] for row in rows] == ["25", "25-45", None]
    assert all(len(row) == len(bench.HEADER) for row in rows)


def test_mean_accepted_length_from_counters():
    """1 + accepted drafts per draft (shared by the benchmark's rows and timeline_decode.py);
    None where nothing was drafted."""
    counted = {
        "vllm:spec_decode_num_drafts": 4.0,
        "vllm:spec_decode_num_draft_tokens": 12.0,
        "vllm:spec_decode_num_accepted_tokens": 6.0,
    }
    assert bench.mean_accepted_length(counted) == 2.5
    assert bench.mean_accepted_length({**counted, "vllm:spec_decode_num_drafts": 0.0}) is None


def _state_bytes(model_dir, replayssm: dict | None) -> dict:
    """`state_bytes` of an engine config as vLLM builds it (no engine started)."""
    from ...plugin.test_config_checks import _config

    cfg = _config(model_dir, replayssm or {}, mamba_ssm_cache_dtype="float32")
    return bench.state_bytes(SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=cfg)))


def test_state_bytes_record_the_ring_that_ran(runs):
    """The benchmark's default replayssm settings run the family's ring (32 steps for Mamba-2
    with an LP copy) and the record says so; the page grows with the ring."""
    model = runs.checkpoint("nemotron_h")
    default = _state_bytes(model, bench.DEFAULT_REPLAY)
    short = _state_bytes(model, {**bench.DEFAULT_REPLAY, "buffer_len": 16})
    hp_only = _state_bytes(model, {**bench.DEFAULT_REPLAY, "lp_dtype": "none"})
    assert (default["buffer_len"], short["buffer_len"], hp_only["buffer_len"]) == (32, 16, 16)
    assert default["page_bytes_per_layer"] > short["page_bytes_per_layer"]
    assert _state_bytes(model, None)["buffer_len"] is None  # stock state
