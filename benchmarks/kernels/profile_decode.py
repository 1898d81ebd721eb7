"""Run a few decode steps of one kernel configuration for a profiler (Nsight Compute):

    ncu --clock-control none --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats -k regex:mamba2 -c 4 --launch-skip 32 \\
        python3 benchmarks/kernels/profile_decode.py --geom nemotron3_super --bs 256

Builds one layer as bench_decode.py does (pages, stagger, LP) and calls our decode kernel
`--steps` times (flush rows included: about 1/16 of the rows per step; with --window T,
speculative verify steps of T tokens per row, every draft accepted, as bench_decode.py
--window). With --kernel-times it prints each kernel's GPU time per step instead
(torch.profiler, eager), e.g. the GDN window step's plan, flush and readout launches:

    python3 benchmarks/kernels/profile_decode.py --geom qwen35_122b --bs 256 --window 4 \
        --route split --kernel-times

--graph replays the steps from one CUDA graph instead (as bench_decode.py times them), and
--timeline places each kernel within its step: with the GDN flush on its side stream, how
much of it runs beside the readout. Eager steps are paced by the host's launches (under the
profiler the flush started ~100 µs after the plan on the H200), so only --graph shows the
overlap of the timed step:

    python3 benchmarks/kernels/profile_decode.py --geom qwen35_122b --bs 256 --lp bf16 \
        --route replay --kernel-times --graph --timeline"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench_decode as bench


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--geom", default="nemotron3_super", choices=list(bench.GEOMETRIES))
    p.add_argument("--bs", type=int, default=256)
    p.add_argument("--lp", default="bf16", choices=list(bench.LP_DTYPES))
    p.add_argument("--steps", type=int, default=48)
    p.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="launch knob (repeatable), as bench_decode.py --knob takes it",
    )
    p.add_argument(
        "--kernel-times",
        action="store_true",
        help="time each kernel with torch.profiler instead of running for ncu",
    )
    p.add_argument(
        "--timeline",
        action="store_true",
        help="with --kernel-times: also each kernel's mean start and end within a step, "
        "from the start of the step's kernel named by --anchor (shows what overlaps: run "
        "without --knob overlap=0)",
    )
    p.add_argument(
        "--graph",
        action="store_true",
        help="with --kernel-times: profile a replay of one CUDA graph of the steps",
    )
    p.add_argument("--anchor", default="_plan_kernel", help="--timeline's step-start kernel")
    p.add_argument(
        "--route", default=None, help="Mamba-2: auto, replay, stock; GDN: fused, split, stock"
    )
    p.add_argument("--window", type=int, default=1, help="tokens per row and step (1 + k)")
    p.add_argument(
        "--buffer-len",
        type=int,
        default=None,
        help="our buffer_len L (default: the plugin's for the family and LP)",
    )
    args = p.parse_args()
    geom = bench.GEOMETRIES[args.geom]
    try:
        bench.set_steps(bench.buffer_len_for(geom, args.lp, args.buffer_len), args.window)
    except ValueError as exc:
        p.error(str(exc))
    if args.route and args.route not in bench.ROUTES[bench.family(geom)]:
        p.error(f"--route {args.route}: not a route of {bench.family(geom)}")
    slots = torch.arange(1, args.bs + 1, dtype=torch.int32, device="cuda")
    layers = bench.our_layers(geom, args.bs, 1, args.lp, slots)  # 1 layer
    config = {"route": args.route} if args.route else {}
    for item in args.knob:
        name, _, val = item.partition("=")
        config[name] = int(val) if val.lstrip("-").isdigit() else val
    calls = bench.our_calls(geom, layers, slots, config)

    def steps(n: int) -> None:
        for _ in range(n):
            for fn, a, kw in calls:
                fn(*a, **kw)

    if not args.kernel_times:
        steps(args.steps)
        torch.cuda.synchronize()
        print(f"ran {args.steps} steps of {args.geom} bs={args.bs} lp={args.lp}")
        return
    steps(bench.STEPS)  # compile and warm up
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    graph = None
    if args.graph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            steps(args.steps)
        graph.replay()
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if graph is not None:
            graph.replay()
        else:
            steps(args.steps)
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    spans: list[tuple[float, float, str]] = []
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            times.setdefault(ev.name, []).append(ev.device_time)
            spans.append((ev.time_range.start, ev.time_range.end, ev.name))
    print(
        f"# GPU time per kernel over {args.steps} {'graph' if graph else 'eager'} steps of "
        f"{args.geom} bs={args.bs} lp={args.lp} window={args.window} (us; per step = total / steps)"
    )
    for name, ts in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(
            f"{sum(ts) / args.steps:10.2f} us/step {sum(ts) / len(ts):10.2f} us/call "
            f"{len(ts):6d} calls  {name[:70]}"
        )
    if args.timeline:
        print_timeline(spans, args.anchor)


def print_timeline(spans: list[tuple[float, float, str]], anchor: str) -> None:
    """Each kernel's mean (start, end) in µs from the start of its step, a step starting
    at a kernel whose name contains `anchor` (kernels before the first anchor are
    skipped), and the mean step span (anchor start to the step's last end)."""
    spans.sort()
    offsets: dict[str, list[tuple[float, float]]] = {}
    step_ends: list[float] = []
    t0 = None
    for start, end, name in spans:
        if anchor in name:
            t0 = start
            step_ends.append(0.0)
        if t0 is None:
            continue
        offsets.setdefault(name, []).append((start - t0, end - t0))
        step_ends[-1] = max(step_ends[-1], end - t0)
    print(f"# timeline: µs from the start of each step's {anchor} (mean over steps)")
    for name, se in sorted(offsets.items(), key=lambda kv: sum(s for s, _ in kv[1])):
        n = len(se)
        print(
            f"  start {sum(s for s, _ in se) / n:8.2f}  end {sum(e for _, e in se) / n:8.2f}  "
            f"{n:5d} calls  {name[:70]}"
        )
    if step_ends:
        print(f"  step span {sum(step_ends) / len(step_ends):8.2f} us over {len(step_ends)} steps")


if __name__ == "__main__":
    main()
