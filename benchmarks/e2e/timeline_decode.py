"""Where a CUDA-graph decode step's wall time goes: host phases, GPU busy time, GPU gaps.

`bench_decode_e2e.py` measures tokens per second; `profile_decode.py` measures kernel time in
eager mode. Neither says whether a graph-mode step waits on the GPU or on the host. This tool
runs the e2e benchmark's engine (same model geometry, dummy weights, same compilation config,
vLLM's engine-core process as in the benchmark) with vLLM's own torch profiler
(`profiler_config`, worker traces with CPU and CUDA activity), profiles one greedy generate of
--batch-size prompts per mode for about --steps decode steps (1 + --steps tokens; in the
speculative modes 1 + --steps x (1 + k) tokens, as a verify step gives each row up to 1 + k),
and reads the worker's trace:

- step period: time between successive decode steps' starts, over the middle half of the
  full-batch decode steps (vLLM's worker names each step's rows: no prefill rows, all
  --batch-size rows decoding; a speculative mode's verify steps likewise), away from prefill
  and the tail;
- host phases per step: mean duration of each `gpu_model_runner: *` annotation;
- GPU busy per step: the union of kernel / memcpy / memset intervals in the decode window
  divided by the number of steps (so `period - busy` is the GPU idle time per step);
- kernel time per step by name in graph mode.

The profiler adds host overhead (every aten op outside the graph is recorded), so periods here
are longer than the benchmark's; compare the modes with each other, and busy with period.

    source .gpu/activate.sh && python benchmarks/e2e/timeline_decode.py --model nemotron_h \
        --layers 52 --batch-size 256 --steps 48
"""

from __future__ import annotations

import argparse
import glob
import gzip
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# vLLM records its model-runner phases (`gpu_model_runner: *`) only with this set; the
# engine-core process inherits it.
os.environ.setdefault("VLLM_CUSTOM_SCOPES_FOR_PROFILING", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import common
from benchmarks.e2e import bench_decode_e2e as e2e

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
PHASE_PREFIX = "gpu_model_runner: "
# vLLM's worker names each step by its rows: prefill ("context") and decode ("generation")
# requests, each with its tokens (a detailed form adds sequence figures in the brackets).
EXECUTE = re.compile(r"execute_context_(\d+)\(.*?\)_generation_(\d+)\(")


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by [start, end) intervals (µs)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def full_decode_steps(spans: list[dict]) -> list[float]:
    """Start times (µs) of the steps that decode the most rows and prefill none, from
    vLLM's per-step annotation (`EXECUTE`; host events only, not their copies on the GPU
    timeline); [] where the trace has none."""
    steps: list[tuple[int, float]] = []
    for e in spans:
        if e.get("cat") != "user_annotation":
            continue
        m = EXECUTE.match(e.get("name", ""))
        if m and m.group(1) == "0":
            steps.append((int(m.group(2)), e["ts"]))
    if not steps:
        return []
    full = max(rows for rows, _ in steps)
    return sorted(ts for rows, ts in steps if rows == full)


def analyse_trace(events: list[dict], steps: int) -> dict:
    """Summary of a worker trace's decode steps (module docstring). events: chrome-trace
    "X" events (ts and dur in µs)."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    decode = full_decode_steps(spans)
    if len(decode) < 8:
        # Steps by their preprocess phase, else the host's graph launches, of which the
        # last `steps` are decode steps. Host annotations only: the trace repeats each one
        # on the GPU timeline (cat "gpu_user_annotation"), which must not count twice.
        pre = sorted(
            e["ts"]
            for e in spans
            if e.get("name") == PHASE_PREFIX + "preprocess" and e.get("cat") == "user_annotation"
        )
        if len(pre) < 8:
            pre = sorted(e["ts"] for e in spans if e.get("name") == "cudaGraphLaunch")
        if len(pre) < 8:
            names = sorted({e.get("name", "") for e in spans if e.get("cat") != "kernel"})[:40]
            raise RuntimeError(f"only {len(pre)} steps in the trace; CPU event names: {names}")
        decode = pre[-steps:] if steps < len(pre) else pre
    # Drop a quarter at each end (prefill hand-over, the tail where requests finish).
    cut = max(1, len(decode) // 4)
    window = decode[cut : len(decode) - cut]
    t0, t1 = window[0], window[-1]
    n = len(window) - 1
    periods = [b - a for a, b in itertools.pairwise(window)]
    # Every host annotation (model-runner phases and the scheduler's, e.g.
    # "schedule: allocate_slots" once per request), summed per step.
    phases: dict[str, float] = {}
    for e in spans:
        if e.get("cat") == "user_annotation" and t0 <= e["ts"] < t1:
            key = e.get("name", "").removeprefix(PHASE_PREFIX)
            phases[key] = phases.get(key, 0.0) + e["dur"] / n
    gpu = [
        (max(e["ts"], t0), min(e["ts"] + e["dur"], t1))
        for e in spans
        if e.get("cat") in GPU_CATS and e["ts"] < t1 and e["ts"] + e["dur"] > t0
    ]
    gpu = [(s, t) for s, t in gpu if t > s]
    kernels: dict[str, float] = {}
    for e in spans:
        if e.get("cat") in GPU_CATS and t0 <= e["ts"] < t1:
            kernels[e["name"]] = kernels.get(e["name"], 0.0) + e["dur"] / n
    runtime: dict[str, float] = {}
    for e in spans:
        if e.get("cat") == "cuda_runtime" and t0 <= e["ts"] < t1:
            runtime[e["name"]] = runtime.get(e["name"], 0.0) + e["dur"] / n
    busy = union_length(gpu) / n
    period = (t1 - t0) / n
    return {
        "window_us": (t0, t1),
        "steps_in_window": n,
        "period_us": period,
        "period_median_us": statistics.median(periods),
        "period_min_us": min(periods),
        "period_max_us": max(periods),
        "gpu_busy_us": busy,
        "gpu_idle_us": period - busy,
        "gpu_busy_fraction": busy / period,
        "kernel_sum_us": sum(kernels.values()),
        "host_phases_us": dict(sorted(phases.items(), key=lambda kv: -kv[1])[:16]),
        "cuda_runtime_us": dict(sorted(runtime.items(), key=lambda kv: -kv[1])[:12]),
        "kernels_us": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:24]),
    }


def load_worker_trace(trace_dir: str) -> list[dict]:
    """The chrome-trace events of the worker trace in trace_dir (the one with kernels)."""
    best: list[dict] = []
    for path in glob.glob(os.path.join(trace_dir, "**", "*.json*"), recursive=True):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            data = json.load(f)
        events = data.get("traceEvents", []) if isinstance(data, dict) else data
        if sum(e.get("cat") == "kernel" for e in events) > sum(
            e.get("cat") == "kernel" for e in best
        ):
            best = events
    if not best:
        raise RuntimeError(f"no worker trace with CUDA kernels under {trace_dir}")
    return best


def step_tokens(mode: str, args: argparse.Namespace) -> int:
    """The most tokens a row gains in one decode step of `mode`: 1 + k in the speculative
    modes (args.speculative's num_speculative_tokens), else 1."""
    if not e2e.is_spec(mode):
        return 1
    return 1 + int((args.speculative or {}).get("num_speculative_tokens", 0))


def max_model_len(modes: list[str], args: argparse.Namespace) -> int:
    return args.input_len + args.steps * max(step_tokens(m, args) for m in modes) + 32


def profile_mode(model: str, mode: str, model_dir: Path, args: argparse.Namespace, vocab: int):
    import torch
    from vllm import LLM, SamplingParams

    # About args.steps decode steps: a verify step gives each row up to 1 + k tokens.
    decode_tokens = args.steps * step_tokens(mode, args)
    kwargs = e2e.tool_engine_kwargs(
        args,
        model,
        mode,
        model_dir,
        max_model_len([mode], args),
        torch.cuda.is_available(),
        compilation_config=args.compilation_config,
    )
    trace_dir = tempfile.mkdtemp(prefix=f"replayssm-timeline-{mode}-")
    kwargs["profiler_config"] = {
        "profiler": "torch",
        "torch_profiler_dir": trace_dir,
        "torch_profiler_with_stack": False,
        "ignore_frontend": True,
    }
    e2e.log(f"engine start {json.dumps(kwargs['additional_config'])}", f"{model}/{mode}")
    llm = LLM(**kwargs)
    greedy = dict(temperature=0.0, ignore_eos=True)
    prompts = [
        {"prompt_token_ids": p}
        for p in e2e.make_prompts(args.batch_size, args.input_len, vocab, args.seed)
    ]
    warm = [
        {"prompt_token_ids": p}
        for p in e2e.make_prompts(args.batch_size, args.input_len, vocab, args.seed + 1)
    ]
    llm.generate(warm, SamplingParams(max_tokens=decode_tokens, **greedy), use_tqdm=False)
    # Unprofiled timing of the same generate, for the profiler's overhead.
    t0 = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=1, **greedy), use_tqdm=False)
    t_pre = time.perf_counter() - t0
    counters = e2e.counter_names({"mode": mode})
    before = e2e.counter_values(llm, counters)
    t0 = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=1 + decode_tokens, **greedy), use_tqdm=False)
    t_full = time.perf_counter() - t0
    counted = {k: v - before[k] for k, v in e2e.counter_values(llm, counters).items()}
    llm.start_profile()
    llm.generate(prompts, SamplingParams(max_tokens=1 + decode_tokens, **greedy), use_tqdm=False)
    llm.stop_profile()
    time.sleep(2.0)  # the worker writes its trace after stop
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    del llm
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    deadline = time.time() + 120
    while True:
        try:
            events = load_worker_trace(trace_dir)
            break
        except (RuntimeError, json.JSONDecodeError, EOFError, OSError):
            if time.time() > deadline:
                raise
            time.sleep(2.0)
    summary = analyse_trace(events, args.steps)
    if args.trace_out:  # the decode window's events, for a closer look offline
        t0, t1 = summary["window_us"]
        keep = [e for e in events if "ts" in e and t0 <= e["ts"] < t1]
        out = Path(args.trace_out) / f"timeline-{model}-{mode}.json.gz"
        out.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(out, "wt") as f:
            json.dump({"traceEvents": keep}, f)
    e2e.log(
        f"period {summary['period_us']:.0f} us, GPU busy {summary['gpu_busy_us']:.0f} us "
        f"({summary['gpu_busy_fraction']:.0%}), phases {json.dumps(summary['host_phases_us'])}",
        f"{model}/{mode}",
    )
    # Tokens per row and decode step in the unprofiled generate (1 without drafts).
    per_step = e2e.mean_accepted_length(counted) or 1.0
    return {
        "mode": mode,
        "kwargs": {k: v for k, v in kwargs.items() if k != "profiler_config"},
        "async_scheduling": getattr(scheduler, "async_scheduling", None),
        "decode_tokens": decode_tokens,
        "mean_tokens_per_step": per_step,
        "spec_counters": counted,
        "unprofiled_decode_step_us": (t_full - t_pre) / (decode_tokens / per_step) * 1e6,
        **summary,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=e2e.MODELS, default="nemotron_h")
    p.add_argument("--layers", type=int, default=52)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument(
        "--steps",
        type=int,
        default=48,
        help="decode steps profiled per mode (1 + steps x (1 + k) tokens in the *_spec modes)",
    )
    p.add_argument("--modes", default="off,on", help=f"comma list of {', '.join(e2e.MODES)}")
    e2e.add_engine_json_args(p, {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"})
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--trace-out", default=None, help="directory for the decode window's events")
    args = p.parse_args(argv)
    if args.steps < 16:
        p.error("--steps must be at least 16")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in e2e.MODES for m in modes):
        p.error(f"--modes must name some of {list(e2e.MODES)}")
    payload: dict[str, Any] = {
        **common.run_header(__file__, common.machine_info()),
        "settings": vars(args),
        "modes": [],
    }
    with tempfile.TemporaryDirectory(prefix="replayssm-timeline-") as tmp:
        model_dir, config = e2e.write_model_dir(
            args.model,
            Path(tmp),
            tiny=False,
            layers=args.layers,
            max_model_len=max_model_len(modes, args),
        )
        payload["model_config"] = config
        if len(modes) == 1:
            payload["modes"].append(
                profile_mode(args.model, modes[0], model_dir, args, config["vocab_size"])
            )
        else:  # one child process per mode: an engine keeps GPU memory after it is deleted
            for mode in modes:
                part = Path(tmp) / f"{mode}.json"
                child = [a for a in (argv if argv is not None else sys.argv[1:])]
                cmd = [sys.executable, str(Path(__file__).resolve()), *child]
                cmd += ["--modes", mode, "--json", str(part)]
                done = subprocess.run(cmd, check=False)
                if done.returncode != 0 or not part.is_file():
                    print(f"# FAILED {args.model}/{mode}: child exited {done.returncode}")
                    return 1
                payload["modes"].extend(json.loads(part.read_text())["modes"])
    rows = []
    for m in payload["modes"]:
        rows.append(
            [
                m["mode"],
                round(m["mean_tokens_per_step"], 2),
                round(m["unprofiled_decode_step_us"]),
                round(m["period_us"]),
                round(m["gpu_busy_us"]),
                f"{m['gpu_busy_fraction']:.0%}",
                round(m["kernel_sum_us"]),
                " ".join(f"{k}={v:.0f}" for k, v in m["host_phases_us"].items()),
            ]
        )
    head = [
        "mode",
        "tok/step",
        "step (no prof)",
        "period",
        "GPU busy",
        "busy",
        "kernel sum",
        "host phases",
    ]
    print(f"# {args.model} {args.layers} layers bs {args.batch_size}, µs per decode step")
    print(common.format_table(head, rows))
    path = (
        Path(args.json)
        if args.json
        else common.default_json_path(
            f"timeline-{args.model}-{args.layers}layers-bs{args.batch_size}", payload["machine"]
        )
    )
    common.write_json(path, payload)
    print(f"# wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
