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
        --route split --kernel-times"""

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
        "--route", default=None, help="Mamba-2: auto, replay, stock; GDN: fused, split, stock"
    )
    p.add_argument("--window", type=int, default=1, help="tokens per row and step (1 + k)")
    args = p.parse_args()
    if args.window < 1 or bench.BUFFER_LEN % args.window:
        p.error(f"--window: 1 or a divisor of {bench.BUFFER_LEN}, got {args.window}")
    bench.WINDOW, bench.STEPS = args.window, bench.BUFFER_LEN // args.window
    geom = bench.GEOMETRIES[args.geom]
    if args.route and args.route not in bench.ROUTES[bench.family(geom)]:
        p.error(f"--route {args.route}: not a route of {bench.family(geom)}")
    slots = torch.arange(1, args.bs + 1, dtype=torch.int32, device="cuda")
    layers = bench.our_layers(geom, args.bs, 1, bench.LP_DTYPES[args.lp], slots)  # 1 layer
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

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        steps(args.steps)
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            times.setdefault(ev.name, []).append(ev.device_time)
    print(
        f"# GPU time per kernel over {args.steps} eager steps of {args.geom} bs={args.bs} "
        f"lp={args.lp} window={args.window} (us; per step = total / steps)"
    )
    for name, ts in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(
            f"{sum(ts) / args.steps:10.2f} us/step {sum(ts) / len(ts):10.2f} us/call "
            f"{len(ts):6d} calls  {name[:70]}"
        )


if __name__ == "__main__":
    main()
