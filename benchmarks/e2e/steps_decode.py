"""Where an e2e generate's time goes, step by step: which steps ran as CUDA graphs, how long
each took on the host and on the GPU, and what compiled.

`bench_decode_e2e.py` gives tokens per second; `timeline_decode.py` a profiled window of
graph steps. Neither says how many steps ran eagerly (prefill, and speculative steps whose
rows do not all have the same number of drafts: FULL_DECODE_ONLY graphs only uniform
batches), what those cost, or whether a graph step waits on the GPU. This tool runs the e2e
benchmark's engine (same model geometry, dummy weights, engine arguments) with vLLM's engine
core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so that it can watch the steps),
one child process per mode, and generates as the benchmark does: a warm-up of
--warmup-tokens, then --repeats x (first token, --output-len tokens) of --batch-size prompts.
Per engine step it records:

- wall time of `EngineCore.step` (schedule, forward, sampling, drafting, bookkeeping), or
  of `step_with_batch_queue` under asynchronous scheduling, and the period since the previous
  step's start (the step time that sets the throughput when steps overlap);
- the CUDA-graph runtime mode vLLM's dispatcher chose (FULL, PIECEWISE or NONE);
- GPU time of the model forward (CUDA events around `GPUModelRunner._model_forward`), and
  the GPU span of sampling and drafting (`GPU_TIMED_PHASES`);
- host time of the model runner's phases (`_prepare_inputs`, `_build_attention_metadata`,
  `_sample`, `_bookkeeping_sync`, `propose_draft_token_ids`, ...), and on GPUs of the SSM
  ops' bodies (Mamba-2's `conv_ssm_forward`, GDN's `_forward_core`: eager steps only, a
  graph replay runs no Python);
- scheduled tokens, rows and the draft-length histogram;

plus every Triton compile (kernel name and phase). The JSON keeps the settings, each
phase's summary and the compiles; the per-step records go to a gzipped JSON next to it
(`write_outputs`). With --cprofile, one more generate of --cprofile-tokens tokens runs
under cProfile (written next to the JSON). With
--shared-prefix-len N every prompt starts with the same N ids, as in the e2e benchmark's
prefix-caching runs (modes off_pc / on_pc; the warm-up's prompts are the e2e benchmark's:
the timed ones outside these modes, other ones after the prefix in them); the host time of vLLM's
align-mode state copies (`mamba_utils.preprocess_mamba`, which runs before the forward of
every step in that mode) is then recorded too.

    source .gpu/activate.sh && python benchmarks/e2e/steps_decode.py --model qwen3_next \
        --layers 48 --batch-size 64 --modes off_spec,on_spec
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import common
from benchmarks.e2e import bench_decode_e2e as e2e
from benchmarks.e2e import interleave

RUNNER_PHASES = (
    "_update_states",
    "_prepare_inputs",
    "_build_attention_metadata",
    "_preprocess",
    "_sample",
    "_bookkeeping_sync",
    "propose_draft_token_ids",
    "_update_states_after_model_execute",
    "_calc_spec_decode_metadata",
    "_model_forward",
)
# Runner phases also timed on the GPU (on GPUs: the span between CUDA events recorded before
# and after the call on the current stream, so any wait for the host's launches inside the
# call counts): under asynchronous scheduling a step's period exceeds its forward by what
# else the GPU runs (sampling, rejection, vLLM's GPU ngram drafter) and by the time it idles.
GPU_TIMED_PHASES = ("_sample", "propose_draft_token_ids")
# Host-timed functions of vllm.v1.worker.mamba_utils (module attributes the runner calls
# through the module): "align" mode's per-step state copies.
MAMBA_UTILS_PHASES = ("preprocess_mamba",)


class StepRecorder:
    """Hooks on vLLM's engine core, cudagraph dispatcher, model runner and SSM layers (this
    process), recording one entry per engine step that scheduled tokens."""

    def __init__(self) -> None:
        self.phase = "startup"
        self.steps: list[dict] = []
        self.compiles: list[dict] = []
        self._cg: tuple | None = None
        self._host: dict[str, float] = {}
        # (phase, start, end) CUDA events of the forward and GPU_TIMED_PHASES this step
        self._phase_events: list = []
        # (step index, its phase events) to resolve after the generate
        self._pending: list[tuple[int, list]] = []
        self._gc_t0: float | None = None
        self._gc_s = 0.0  # collections since the last recorded step: seconds, generations
        self._gc_gens: list[int] = []

    def gc_callback(self, phase: str, info: dict) -> None:
        """gc.callbacks hook: the time of each collection in this process (the engine core
        runs here), charged to the next recorded step; a full (generation 2) collection of
        vLLM's many objects can pause a step for tens of milliseconds."""
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0 is not None:
            self._gc_s += time.perf_counter() - self._gc_t0
            self._gc_gens.append(int(info.get("generation", -1)))
            self._gc_t0 = None

    def install(self) -> None:
        import torch
        import triton
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
            QwenGatedDeltaNetAttention,
        )
        from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
        from vllm.v1.engine.core import EngineCore
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        rec = self
        gc.callbacks.append(self.gc_callback)

        def compiled(*_args, **kwargs):
            fn = kwargs.get("fn")  # triton's JitFunctionInfo
            name = getattr(fn, "name", None) or str(fn)
            rec.compiles.append({"phase": rec.phase, "name": name, "after_steps": len(rec.steps)})

        triton.knobs.runtime.jit_post_compile_hook = compiled

        dispatch = CudagraphDispatcher.dispatch

        CudagraphDispatcher.dispatch = dispatch_recorded(rec, dispatch)

        def timed(owner, name, key):  # a class's method or a module's function
            setattr(owner, name, rec.host_timed(getattr(owner, name), key))

        for name in RUNNER_PHASES:
            if hasattr(GPUModelRunner, name) and name != "_model_forward":
                timed(GPUModelRunner, name, name)
                if name in GPU_TIMED_PHASES and torch.cuda.is_available():
                    setattr(
                        GPUModelRunner, name, rec.gpu_timed(getattr(GPUModelRunner, name), name)
                    )
        from vllm.v1.worker import mamba_utils

        for name in MAMBA_UTILS_PHASES:
            timed(mamba_utils, name, name)
        # On GPUs only (on the CPU platform vLLM compiles the model, and a hook inside it
        # changes what is compiled): the SSM ops' bodies, which run eagerly in PIECEWISE and
        # NONE steps (vLLM's custom ops call them; Dynamo traces the forward around them under
        # compilation mode 3, so the layers' forward itself is never timed there). Ours
        # override them; the outermost call of a step's layer is timed (`ssm_op_timed`).
        if torch.cuda.is_available():
            from vllm_replayssm.layers.gdn import ReplayQwenGatedDeltaNetAttention
            from vllm_replayssm.layers.mamba2 import ReplayMambaMixer2

            timed_op = ssm_op_timed(rec)
            for cls, name in (
                (MambaMixer2, "conv_ssm_forward"),
                (ReplayMambaMixer2, "conv_ssm_forward"),
                (QwenGatedDeltaNetAttention, "_forward_core"),
                (ReplayQwenGatedDeltaNetAttention, "_forward_core"),
            ):
                if name in cls.__dict__:
                    setattr(cls, name, timed_op(cls.__dict__[name]))

        # The forward: host time and its GPU span (forward_gpu_ms), on GPUs only.
        if torch.cuda.is_available():
            host_forward = rec.host_timed(GPUModelRunner._model_forward, "_model_forward")
            GPUModelRunner._model_forward = rec.gpu_timed(host_forward, "_model_forward")

        def step_hooked(step):
            def step_hook(self):
                scheduled: list = []
                schedule = self.scheduler.schedule
                update = self.scheduler.update_from_output
                timed_schedule = rec.host_timed(schedule, "schedule")

                def schedule_hook(*args, **kwargs):
                    scheduled.append(timed_schedule(*args, **kwargs))
                    return scheduled[-1]

                self.scheduler.schedule = schedule_hook
                # The scheduler's per-request work after a step (vLLM's prefix-caching
                # bookkeeping included): host time of the engine core, outside the runner.
                self.scheduler.update_from_output = rec.host_timed(update, "update_from_output")
                rec._cg, rec._host, rec._phase_events = None, {}, []
                t0 = time.perf_counter()
                try:
                    return step(self)
                finally:
                    wall = time.perf_counter() - t0
                    self.scheduler.schedule = schedule
                    self.scheduler.update_from_output = update
                    rec.record(scheduled[0] if scheduled else None, wall, start_s=t0)

            return step_hook

        # With asynchronous scheduling (vLLM's default for plain decoding on GPUs) the engine
        # core steps through step_with_batch_queue: each call schedules and launches a batch
        # and then waits for the previous one's output, so a call's wall time is not a step's
        # time; the period between consecutive launches is.
        EngineCore.step = step_hooked(EngineCore.step)
        EngineCore.step_with_batch_queue = step_hooked(EngineCore.step_with_batch_queue)

    def host_timed(self, fn: Any, key: str) -> Any:
        """`fn` with its wall time added to the current step's host_ms[key]."""

        def hook(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._host[key] = self._host.get(key, 0.0) + time.perf_counter() - t0

        return hook

    def gpu_timed(self, fn: Any, key: str) -> Any:
        """`fn` between two CUDA events on the current stream, the pair kept for the current
        step's phase_gpu_ms[key] (forward_gpu_ms for the model forward; resolved after the
        generate, `resolve_gpu_times`)."""
        import torch

        def hook(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                return fn(*args, **kwargs)
            finally:
                end.record()
                self._phase_events.append((key, start, end))

        return hook

    def record(self, so: Any, wall_s: float, start_s: float | None = None) -> None:
        """One step: `so` is the scheduler output, `wall_s` the step call's wall time and
        `start_s` its start (perf_counter), from which the period since the previous step of
        the same phase follows."""
        if so is None or not so.total_num_scheduled_tokens:
            return
        drafts = [len(v) for v in so.scheduled_spec_decode_tokens.values()]
        prev = self.steps[-1] if self.steps else None
        period = None
        if (
            start_s is not None
            and prev
            and prev["phase"] == self.phase
            and prev["start_s"] is not None
        ):
            period = (start_s - prev["start_s"]) * 1e3
        if self._phase_events:  # resolved after the generate (the GPU may still run them)
            self._pending.append((len(self.steps), self._phase_events))
        if self._gc_gens:
            self._host["gc"] = self._gc_s
        gc_gens, self._gc_s, self._gc_gens = self._gc_gens, 0.0, []
        self.steps.append(
            {
                "phase": self.phase,
                "start_s": start_s,
                "period_ms": period,
                "wall_ms": wall_s * 1e3,
                "tokens": so.total_num_scheduled_tokens,
                "rows": len(so.num_scheduled_tokens),
                "drafts": {str(k): drafts.count(k) for k in sorted(set(drafts))},
                "cudagraph": self._cg[0] if self._cg else None,
                # the dispatcher's inputs (`dispatch_hook`); None where not hooked (tests)
                "dispatch": self._cg[2] if self._cg and len(self._cg) > 2 else None,
                "forward_gpu_ms": None,
                "phase_gpu_ms": {},  # GPU_TIMED_PHASES, filled in with forward_gpu_ms
                "host_ms": {k: v * 1e3 for k, v in self._host.items()},
                "gc_generations": gc_gens,  # the collections charged to host_ms["gc"]
            }
        )

    def resolve_gpu_times(self) -> None:
        """Fill forward_gpu_ms of the steps recorded so far (waits for the GPU)."""
        if not self._pending:
            return
        import torch

        torch.cuda.synchronize()
        for i, phase_events in self._pending:
            step, gpu = self.steps[i], self.steps[i]["phase_gpu_ms"]
            for key, a, b in phase_events:
                if key == "_model_forward":
                    step["forward_gpu_ms"] = (step["forward_gpu_ms"] or 0.0) + a.elapsed_time(b)
                else:
                    gpu[key] = gpu.get(key, 0.0) + a.elapsed_time(b)
        self._pending = []

    def summary(self) -> dict:
        out: dict[str, Any] = {}
        for phase in dict.fromkeys(s["phase"] for s in self.steps):
            steps = [s for s in self.steps if s["phase"] == phase]
            by_mode: dict[str, Any] = {}
            for mode in dict.fromkeys(str(s["cudagraph"]) for s in steps):
                group = [s for s in steps if str(s["cudagraph"]) == mode]
                keys = sorted({k for s in group for k in s["host_ms"]})
                by_mode[mode] = {
                    "steps": len(group),
                    "wall_ms_sum": sum(s["wall_ms"] for s in group),
                    "wall_ms_median": statistics.median(s["wall_ms"] for s in group),
                    "period_ms_median": _median(s["period_ms"] for s in group),
                    "forward_gpu_ms_median": statistics.median(
                        s["forward_gpu_ms"] or 0.0 for s in group
                    ),
                    "host_ms_median": {
                        k: statistics.median(s["host_ms"].get(k, 0.0) for s in group) for k in keys
                    },
                    "phase_gpu_ms_median": {
                        k: statistics.median(s.get("phase_gpu_ms", {}).get(k, 0.0) for s in group)
                        for k in sorted({k for s in group for k in s.get("phase_gpu_ms", {})})
                    },
                    # sums show what the medians hide: rare long pauses (a full collection)
                    "host_ms_sum": {k: sum(s["host_ms"].get(k, 0.0) for s in group) for k in keys},
                    "gc_full_collections": sum(s.get("gc_generations", []).count(2) for s in group),
                }
            out[phase] = {
                "steps": len(steps),
                "wall_ms_sum": sum(s["wall_ms"] for s in steps),
                "compiles": [c["name"] for c in self.compiles if c["phase"] == phase],
                "by_cudagraph_mode": by_mode,
            }
        return out


def dispatch_recorded(rec: StepRecorder, dispatch: Any) -> Any:
    """vLLM's `CudagraphDispatcher.dispatch` keeping, for the current step, the mode it chose,
    the tokens and what the runner asked for: a uniform decode batch, whether it ruled FULL
    graphs out (cascade attention, encoder outputs) and the padded token count; why a step
    ran PIECEWISE."""

    def dispatch_hook(self, num_tokens, *args, **kwargs):
        mode, desc = dispatch(self, num_tokens, *args, **kwargs)
        invalid = kwargs.get("invalid_modes") or ()
        asked = {
            "uniform_decode": kwargs.get("uniform_decode"),
            "full_ruled_out": any(getattr(m, "name", None) == "FULL" for m in invalid),
            "padded_tokens": getattr(desc, "num_tokens", None),
        }
        rec._cg = (mode.name, num_tokens, asked)
        return mode, desc

    return dispatch_hook


def ssm_op_timed(rec: StepRecorder) -> Any:
    """A wrapper maker: an SSM op body with its host time added to the step's
    host_ms["ssm_layers"], outer calls only (ours call vLLM's body through super() on the
    stock route), untimed while Dynamo traces."""
    import torch

    depth = [0]

    def wrap(fn: Any) -> Any:
        timed = rec.host_timed(fn, "ssm_layers")

        def hook(*args, **kwargs):
            if depth[0] or torch.compiler.is_compiling():
                return fn(*args, **kwargs)
            depth[0] += 1
            try:
                return timed(*args, **kwargs)
            finally:
                depth[0] -= 1

        return hook

    return wrap


def _median(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def run_mode(args: argparse.Namespace, mode: str, model_dir: Path, vocab: int) -> dict:
    """One engine (this process) for `mode`: warm-up, timed generates, optional cProfile;
    with --interleave (`args.turns`) each of those phases in a turn the driver hands out
    (`interleave.py`), the engine kept until every mode's turns are over."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch

    turns = interleave.Turns() if args.turns else None
    turn = turns.turn if turns is not None else contextlib.nullcontext

    rec = StepRecorder()
    rec.install()
    on_gpu = torch.cuda.is_available()
    kwargs = e2e.tool_engine_kwargs(
        args,
        args.model,
        mode,
        model_dir,
        max_model_len(args),
        on_gpu,
        compilation_config=args.compilation_config if on_gpu else None,
    )
    from vllm import LLM

    tag = f"{args.model}/{mode}"
    e2e.log(f"engine start {json.dumps(kwargs['additional_config'])}", tag)
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    result: dict[str, Any] = {"mode": mode, "kwargs": kwargs}
    result["startup_s"] = time.perf_counter() - t0
    bs = args.batch_size
    spec = {
        "mode": mode,
        "shared_prefix_len": args.shared_prefix_len,
        "vocab_size": vocab,
        "input_len": args.input_len,
        "seed": args.seed,
    }
    shared = e2e.shared_prefix(spec)
    prompts = e2e.make_prompts(bs, args.input_len, vocab, args.seed, shared)
    if turns is not None:
        turns.say("ready")
    rec.phase = "warmup"
    warm = e2e.warmup_prompts(spec, bs, prompts, shared)  # as the e2e benchmark warms up
    with turn():
        result["warmup_s"] = e2e.timed_generate(llm, warm, args.warmup_tokens).elapsed
        rec.resolve_gpu_times()
    for r in range(args.repeats):
        with turn():
            rec.phase = f"first{r}"
            first = e2e.timed_generate(llm, prompts, 1)
            result[f"first{r}_s"], result[f"first{r}_cached_tokens"] = first.elapsed, first.cached
            rec.phase = f"full{r}"
            result[f"full{r}_s"] = e2e.timed_generate(llm, prompts, args.output_len).elapsed
            rec.resolve_gpu_times()
        e2e.log(f"repeat {r}: full generate {result[f'full{r}_s']:.3f} s", tag)
    if args.cprofile:
        import cProfile
        import pstats

        rec.phase = "cprofile"
        prof = cProfile.Profile()
        with turn():
            prof.enable()
            e2e.timed_generate(llm, prompts, args.cprofile_tokens)
            prof.disable()
            rec.resolve_gpu_times()
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("tottime").print_stats(60)
        stats.sort_stats("cumulative").print_stats(100)
        result["cprofile"] = buf.getvalue()
    result["summary"] = rec.summary()
    result["compiles"] = rec.compiles
    result["steps"] = rec.steps
    if turns is not None:
        turns.stdin.read()  # until the driver closes it: every mode's turns are over
    llm.llm_engine.engine_core.shutdown()
    return result


def max_model_len(args: argparse.Namespace) -> int:
    """The e2e benchmark's default for the same lengths (and --tiny floor)."""
    return e2e.default_max_model_len(
        args.shared_prefix_len, args.input_len, args.output_len, tiny=args.tiny
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=e2e.MODELS, default="qwen3_next")
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--tiny", action="store_true", help="the e2e benchmark's tiny geometry (CPU)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument(
        "--shared-prefix-len",
        type=int,
        default=0,
        help="ids every prompt starts with (prefix caching: modes off_pc / on_pc)",
    )
    p.add_argument("--warmup-tokens", type=int, default=20)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--modes", default="off_spec,on_spec", help=f"comma list of {e2e.MODES}")
    e2e.add_engine_json_args(
        p, {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "max_cudagraph_capture_size": 1024}
    )
    p.add_argument(
        "--gpu-memory-utilization",
        default="0.85",
        metavar="SHARE[,SHARE...]",
        help="one share for every mode or one per mode, as in bench_decode_e2e.py",
    )
    p.add_argument(
        "--devices",
        default=None,
        metavar="SET[,SET...]",
        help="each mode's CUDA devices (its CUDA_VISIBLE_DEVICES), as in bench_decode_e2e.py",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cprofile", action="store_true", help="one more generate under cProfile")
    p.add_argument("--cprofile-tokens", type=int, default=12)
    p.add_argument("--json", default=None)
    p.add_argument(
        "--interleave",
        action="store_true",
        help="every mode's engine up at once, their phases taking turns, as "
        "bench_decode_e2e.py --interleave does (give each its --gpu-memory-utilization share)",
    )
    p.add_argument(
        "--worker-timeout",
        type=float,
        default=None,
        help="with --interleave: seconds each wait for a child may take (an engine start, a "
        "turn, a shutdown; default none); a child past it is killed and the run fails",
    )
    p.add_argument("--mode-json", default=None, help=argparse.SUPPRESS)  # child process
    p.add_argument("--turns", action="store_true", help=argparse.SUPPRESS)  # interleaved child
    args = p.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or any(m not in e2e.MODES for m in args.modes):
        p.error(f"--modes must name some of {list(e2e.MODES)}")
    try:
        args.device_sets = e2e.device_sets(args.devices, args.modes)
        args.memory_shares = e2e.memory_shares(
            args.gpu_memory_utilization, args.modes, args.device_sets
        )
    except ValueError as exc:
        p.error(str(exc))
    # A child runs one mode: its share (the driver appends it to the child's arguments).
    args.gpu_memory_utilization = args.memory_shares[0]
    if (
        args.output_len < 2
        or args.warmup_tokens < 1
        or args.repeats < 1
        or args.shared_prefix_len < 0
    ):
        p.error(
            "--output-len >= 2, --warmup-tokens >= 1, --repeats >= 1 and --shared-prefix-len >= 0"
        )
    return args


def table(modes: list[dict]) -> str:
    rows = []
    for m in modes:
        for phase, s in m["summary"].items():
            if not phase.startswith("full"):
                continue
            for cg, g in s["by_cudagraph_mode"].items():
                host = g["host_ms_median"]
                gpu = g.get("phase_gpu_ms_median", {})
                rows.append(
                    [
                        m["mode"],
                        phase,
                        cg,
                        g["steps"],
                        f"{g['wall_ms_median']:.1f}",
                        "-" if g["period_ms_median"] is None else f"{g['period_ms_median']:.1f}",
                        f"{g['forward_gpu_ms_median']:.1f}",
                        f"{gpu.get('_sample', 0.0):.1f}",
                        f"{gpu.get('propose_draft_token_ids', 0.0):.1f}",
                        f"{host.get('ssm_layers', 0.0):.1f}",
                        f"{host.get('_prepare_inputs', 0.0):.1f}",
                        f"{host.get('_bookkeeping_sync', 0.0):.1f}",
                        f"{host.get('preprocess_mamba', 0.0):.1f}",
                        f"{host.get('schedule', 0.0):.1f}",
                        f"{host.get('update_from_output', 0.0):.1f}",
                        f"{g.get('host_ms_sum', {}).get('gc', 0.0):.0f}",
                        g.get("gc_full_collections", 0),
                        f"{g['wall_ms_sum']:.0f}",
                    ]
                )
    head = [
        "mode",
        "phase",
        "cudagraph",
        "steps",
        "step ms (median)",
        "period ms",
        "forward GPU ms",
        "sample GPU ms",
        "drafter GPU ms",
        "SSM ops host ms",
        "prepare_inputs ms",
        "bookkeeping ms",
        "align copies ms",
        "schedule ms",
        "update_from_output ms",
        "gc ms (sum)",
        "full gcs",
        "sum ms",
    ]
    return common.format_table(head, rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="replayssm-steps-") as tmp:
        model_dir, config = e2e.write_model_dir(
            args.model,
            Path(tmp),
            tiny=args.tiny,
            layers=args.layers,
            max_model_len=max_model_len(args),
        )
        if args.mode_json:  # child: one mode, this process
            result = run_mode(args, args.modes[0], model_dir, config["vocab_size"])
            Path(args.mode_json).write_text(json.dumps(result, default=str))
            return 0
        payload: dict[str, Any] = {
            **common.run_header(__file__, common.machine_info()),
            "settings": {k: v for k, v in vars(args).items() if k != "mode_json"},
            "model_config": config,
            "modes": [],
        }
        child_args = argv if argv is not None else sys.argv[1:]
        parts = {mode: Path(tmp) / f"{mode}.json" for mode in args.modes}
        cmds, envs = {}, {}
        for i, mode in enumerate(args.modes):
            devices = args.device_sets[i] if args.device_sets else None
            cmds[mode] = (
                [sys.executable, str(Path(__file__).resolve()), *child_args]
                + ["--modes", mode, "--mode-json", str(parts[mode])]
                + ["--gpu-memory-utilization", str(args.memory_shares[i])]
                # its own device set only (set through its environment)
                + (["--devices", devices.replace(",", "+")] if devices else [])
                + (["--turns"] if args.interleave else [])
            )
            envs[mode] = e2e.worker_env(devices)
        if args.interleave:
            exits = run_interleaved(args, cmds, envs)
        else:  # one process per mode, one after another: an engine keeps its GPU memory
            exits = {
                mode: subprocess.run(cmds[mode], check=False, env=envs[mode]).returncode
                for mode in cmds
            }
        for mode in args.modes:
            if exits[mode] != 0 or not parts[mode].is_file():
                print(f"# FAILED {args.model}/{mode}: child exited {exits[mode]}")
                return 1
            payload["modes"].append(json.loads(parts[mode].read_text()))
    print(f"# {args.model} {args.layers} layers bs {args.batch_size}: steps of the full generates")
    print(table(payload["modes"]))
    path = (
        Path(args.json)
        if args.json
        else common.default_json_path(
            f"steps-{args.model}-{args.layers}layers-bs{args.batch_size}", payload["machine"]
        )
    )
    write_outputs(path, payload)
    print(f"# wrote {path}")
    return 0


def run_interleaved(
    args: argparse.Namespace,
    cmds: dict[str, list[str]],
    envs: dict[str, dict[str, str] | None] | None = None,
) -> dict[str, int | str]:
    """--interleave: the modes' children up at once (each in envs[mode], where given), their
    phases in turns (`interleave.py`): the warm-up, each repeat, the cProfile generate.
    Returns each mode's exit status."""
    from vllm_replayssm.server_process import end_group

    def on_line(name: str, line: str) -> None:
        sys.stdout.write(line)

    children = interleave.start_children(
        list(cmds.items()), on_line, args.worker_timeout, end_group, e2e.log, envs
    )
    interleave.run_turns(children, [args.batch_size], args.repeats + bool(args.cprofile))
    return {mode: child.stop() for mode, child in zip(cmds, children, strict=True)}


def write_outputs(path: Path, payload: dict) -> None:
    """The JSON at `path` (settings, summaries, compiles), each mode's cProfile text beside
    it (`<stem>-<mode>-cprofile.txt`) and every mode's per-step records in one gzipped JSON
    beside it (`<stem>-steps.json.gz`, {mode: [step, ...]}): about 0.5 MB of records per run
    would otherwise travel to the GPU host with the repository on every call."""
    steps: dict[str, list] = {}
    for m in payload["modes"]:
        text = m.pop("cprofile", None)
        if text:
            side = path.with_name(f"{path.stem}-{m['mode']}-cprofile.txt")
            side.write_text(text)
            m["cprofile_file"] = side.name
        if "steps" in m:
            steps[m["mode"]] = m.pop("steps")
    if steps:
        side = path.with_name(f"{path.stem}-steps.json.gz")
        side.write_bytes(gzip.compress(json.dumps(steps, default=str).encode(), mtime=0))
        payload["steps_file"] = side.name
    common.write_json(path, payload)


if __name__ == "__main__":
    sys.exit(main())
