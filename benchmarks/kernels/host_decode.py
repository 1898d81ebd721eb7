"""Host time of one eager decode step of one layer: what a PIECEWISE CUDA-graph step (whose
SSM layers run eagerly) spends launching, per call, for ReplaySSM's Mamba-2 speculative
layer and vLLM's:

    python3 benchmarks/kernels/host_decode.py --geom nemotron3_super --bs 1 --window 4

At bs 1 the GPU finishes each kernel before the host has launched the next, so a step's
time is its host time. Each item runs --calls times back to back after a warm-up; "host"
is the loop's time before the final synchronisation, "wall" with it (µs per call). Our
decode call (`mamba2_replay_decode`) is also split into its parts (argument checks, launch
configuration, plan, flush, readout or, for a window of few rows, the two in one launch
(`fused.py`); "rest": the side-stream switch and the remainder).
The layer's other launches (the step start: fresh-row reset and acceptance, in one launch
since 2026-12-06, and apart as before; the conv update) and the few torch ops the layer
ran around them before that are timed one by one; vLLM's items are its two launches per layer
(`causal_conv1d_update`, `selective_state_update`). Our items run twice (--launch): with our
launches through Triton's dispatch (rows "ours [dispatch]") and relaunched through the
compiled kernels' launchers (`kernels/common/launch.py`, the default since 2026-12-06; rows
"ours [direct]"). Two bare Triton kernels (3 and 40 arguments) calibrate a launch, and our
plan launch alone runs through Triton's dispatch and straight through its compiled kernel.
--cprofile N profiles N of our decode calls in each mode."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench_decode as bench

from benchmarks import common


@triton.jit
def _bare3(a_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(a_ptr + o, tl.zeros([BLOCK], tl.float32), mask=o < n)


@triton.jit
def _bare40(
    a_ptr, b_ptr, c_ptr, d_ptr, e_ptr, f_ptr, g_ptr, h_ptr, n,
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15, s16, s17, s18, s19,
    s20, s21, s22, s23, s24, s25, s26, s27, s28, s29,
    BLOCK: tl.constexpr,
):  # fmt: skip
    o = tl.arange(0, BLOCK)
    tl.store(a_ptr + o, tl.zeros([BLOCK], tl.float32), mask=o < n)


def time_calls(fn, calls: int) -> dict:
    """Host and wall µs per call of `fn()` run `calls` times eagerly (after 3 warm-up runs)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"host_us": (t1 - t0) * 1e6 / calls, "wall_us": (t2 - t0) * 1e6 / calls}


class Parts:
    """Wraps named functions of a module to add up their host time per call."""

    def __init__(self, module, names: list[str]) -> None:
        self.module, self.saved, self.total = module, {}, defaultdict(float)
        for name in names:
            fn = getattr(module, name)
            self.saved[name] = fn
            setattr(module, name, self._wrap(name, fn))

    def _wrap(self, name: str, fn):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.total[name] += time.perf_counter() - t0

        return timed

    def restore(self) -> None:
        for name, fn in self.saved.items():
            setattr(self.module, name, fn)


def lean_plan_items(fn, a, kw) -> dict:
    """Our plan launch with the arguments of one decode call: through Triton's JIT dispatch
    (`kernel[grid](...)`, as the launcher calls it: binding, specialisation, cache lookup) and
    straight through the compiled kernel (`CompiledKernel[grid]`, what a launcher that
    skipped the dispatch would pay). The difference bounds what a lean relaunch path could
    save per launch."""
    import inspect

    from vllm_replayssm.kernels.mamba2 import plan

    real = plan._mamba2_plan_window_kernel
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.update(grid=grid, args=args, kwargs=kwargs)
                return real[grid](*args, **kwargs)

            return launch

    plan._mamba2_plan_window_kernel = Recorder()
    try:
        fn(*a, **kw)
    finally:
        plan._mamba2_plan_window_kernel = real
    grid, args, kwargs = seen["grid"], seen["args"], seen["kwargs"]
    params = inspect.signature(real.fn).parameters
    bound = inspect.signature(real.fn).bind(
        *args, **{k: v for k, v in kwargs.items() if k in params}
    )
    bound.apply_defaults()
    values = list(bound.arguments.values())
    compiled = real[grid](*args, **kwargs)
    runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]  # its launcher takes x, y and z
    stream = torch.cuda.current_stream().cuda_stream
    return {
        "ours: plan launch, Triton's JIT dispatch": lambda: real[grid](*args, **kwargs),
        "ours: plan launch, compiled kernel direct": lambda: runner(*values, stream=stream),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--geom", default="nemotron3_super", choices=[
        g for g, v in bench.GEOMETRIES.items() if bench.family(v) == "mamba2"
    ])  # fmt: skip
    p.add_argument("--bs", type=int, default=1)
    p.add_argument("--window", type=int, default=4, help="T = 1 + k tokens per row")
    p.add_argument("--lp", default="bf16", choices=list(bench.LP_DTYPES))
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument(
        "--launch",
        type=lambda v: v.split(","),
        default=["dispatch", "direct"],
        help="our launches through Triton's dispatch, relaunched directly (kernels/common/"
        "launch.py), or both (default: dispatch,direct)",
    )
    p.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="N",
        help="also run our decode call N times under cProfile and print where its host time "
        "goes (top 30 by own time)",
    )
    args = p.parse_args(argv)
    geom, bs, T = bench.GEOMETRIES[args.geom], args.bs, args.window
    bench.set_steps(bench.buffer_len_for(geom, args.lp), T)  # the plugin's L
    dev = torch.device("cuda")
    slots = torch.arange(1, bs + 1, dtype=torch.int32, device=dev)
    layers = bench.our_layers(geom, bs, 1, args.lp, slots)
    ((fn, a, kw),) = bench.our_calls(geom, layers, slots, {})
    cache = layers[0][0]
    rows: dict[str, dict] = {}

    from vllm_replayssm.kernels.common import launch as launch_mod
    from vllm_replayssm.kernels.common.triton_acceptance import spec_acceptance
    from vllm_replayssm.kernels.common.triton_conv import spec_conv_update_triton
    from vllm_replayssm.kernels.common.triton_fresh import reset_fresh_rows
    from vllm_replayssm.kernels.common.triton_spec_start import spec_step_start
    from vllm_replayssm.kernels.mamba2 import decode
    from vllm_replayssm.layout import ring_rows

    qsl = torch.arange(0, bs * T + 1, T, dtype=torch.int32, device=dev)
    q = qsl[1:] - qsl[:-1]
    seq_lens = torch.full((bs,), 100, dtype=torch.int32, device=dev)
    D, K = bench.conv_dim(geom), 4
    M = K - 1 + T - 1
    conv = torch.zeros((bs + 1, M, D), dtype=torch.bfloat16, device=dev).transpose(1, 2)
    weight = torch.randn((D, K), device=dev).to(torch.bfloat16)
    bias = torch.randn(D, device=dev).to(torch.bfloat16)
    xc = torch.randn((bs * T, D), device=dev).to(torch.bfloat16)
    window_start = torch.zeros(bs + 1, dtype=torch.int64, device=dev)
    full = torch.full((bs,), T, dtype=torch.int32, device=dev)
    lp = [] if cache.lp is None else [cache.lp]
    rr = ring_rows(bench.BUFFER_LEN, T)
    start = seq_lens.long() - q.long()
    # the layer's other launches (`layers/mamba2._decode_spec`)
    launches = {
        "reset_fresh_rows": lambda: reset_fresh_rows(
            [cache.hp, *lp, conv], cache.meta, slots, q, seq_lens,
            buffer_len=bench.BUFFER_LEN, window=T, stagger=True,
        ),
        "spec_acceptance": lambda: spec_acceptance(
            cache.meta, window_start, slots, q, seq_lens, num_ring_rows=rr, window=T
        ),
        "spec_step_start (reset + acceptance)": lambda: spec_step_start(
            [cache.hp, *lp, conv], cache.meta, window_start, slots, qsl, seq_lens,
            buffer_len=bench.BUFFER_LEN, window=T, stagger=True,
        ),
        "spec_conv_update": lambda: spec_conv_update_triton(
            xc, conv, slots, qsl, full, full, weight, bias, "silu", T
        ),
    }  # fmt: skip
    names = ["check_args", "launch_config", "mamba2_plan", "mamba2_flush", "mamba2_readout"]
    names.append("mamba2_window_fused")  # the readout and the flush of a small step
    saved_env = os.environ.get(launch_mod.DIRECT_LAUNCH_ENV)
    for mode in args.launch:
        # our launches through Triton's dispatch, or relaunched directly (kernels/common/
        # launch.py); `tag` names the rows of each
        os.environ[launch_mod.DIRECT_LAUNCH_ENV] = "1" if mode == "direct" else "0"
        launch_mod.reset()
        tag = f"ours [{mode}]:"
        rows[f"{tag} mamba2_replay_decode"] = time_calls(lambda: fn(*a, **kw), args.calls)
        parts = Parts(decode, names)
        whole = time_calls(lambda: fn(*a, **kw), args.calls)
        parts.restore()
        n = args.calls + 3
        split = {name: parts.total[name] * 1e6 / n for name in names}
        split["rest"] = whole["host_us"] - sum(split.values())
        for name, us in split.items():
            rows[f"{tag}   {name}"] = {"host_us": us}
        for name, call in launches.items():
            rows[f"{tag} {name}"] = time_calls(call, args.calls)
        if args.cprofile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.cprofile):
                fn(*a, **kw)
            prof.disable()
            torch.cuda.synchronize()
            print(f"# cProfile of {args.cprofile} decode calls, launches: {mode}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    if saved_env is None:
        os.environ.pop(launch_mod.DIRECT_LAUNCH_ENV)
    else:
        os.environ[launch_mod.DIRECT_LAUNCH_ENV] = saved_env
    launch_mod.reset()

    # the torch ops the layer ran before 2026-12-06 (now inside the step start)
    items = {
        "torch: slots.long()": lambda: slots.long(),
        "torch: qsl[1:] - qsl[:-1]": lambda: qsl[1:] - qsl[:-1],
        "torch: window_start[slots] = start": lambda: window_start.__setitem__(
            slots.long(), start
        ),
        "torch: zeros_like(x)": lambda: torch.zeros_like(xc),
    }  # fmt: skip
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update

    vcalls, _, _ = bench.vllm_calls(geom, bs, 1, slots)
    ((vfn, va, vkw),) = vcalls
    items["vllm: causal_conv1d_update"] = lambda: causal_conv1d_update(
        xc, conv, weight, bias, "silu", conv_state_indices=slots,
        num_accepted_tokens=full, query_start_loc=qsl, max_query_len=T, validate_data=False,
    )  # fmt: skip
    items["vllm: selective_state_update"] = lambda: vfn(*va, **vkw)
    buf = torch.empty(1024, device=dev)
    items["bare triton, 3 args"] = lambda: _bare3[(1,)](buf, 1024, BLOCK=1024)
    items["bare triton, 40 args"] = lambda: _bare40[(1,)](
        buf, buf, buf, buf, buf, buf, buf, buf, 1024, *range(3, 33), BLOCK=1024
    )
    items["torch: empty(4, R) int64"] = lambda: torch.empty(4, bs, dtype=torch.int64, device=dev)
    try:
        items.update(lean_plan_items(fn, a, kw))
    except Exception as exc:  # Triton internals it reaches for: report, keep the rest
        print(f"lean plan launch: ERROR {exc!r}", flush=True)
        rows["ours: plan launch, compiled kernel direct"] = {"host_us": float("nan"),
                                                             "error": repr(exc)}  # fmt: skip
    for name, call in items.items():
        try:
            rows[name] = time_calls(call, args.calls)
        except Exception as exc:  # one item's failure leaves the others' figures
            print(f"{name}: ERROR {exc!r}", flush=True)
            rows[name] = {"host_us": float("nan"), "error": repr(exc)}

    print(
        f"# host µs per eager call: {args.geom} bs {bs} T {T} L {bench.BUFFER_LEN} lp {args.lp}, "
        f"{args.calls} calls"
    )
    for name, r in rows.items():
        wall = f"{r['wall_us']:9.1f}" if "wall_us" in r else " " * 9
        print(f"{r['host_us']:9.1f} host {wall} wall  {name}")
    if args.json:
        out = common.run_header(__file__, common.machine_info())
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        out.update(settings={**settings, "buffer_len": bench.BUFFER_LEN}, rows=rows)
        common.write_json(Path(args.json), out)
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
