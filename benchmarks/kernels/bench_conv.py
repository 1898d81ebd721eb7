"""Speculative conv update on the GPU: ReplaySSM's one-launch Triton step
(`kernels/common/triton_conv.py`, what `layers/conv.spec_conv_update` runs on CUDA tensors)
against vLLM's `causal_conv1d_update` as its GDN and Mamba-2 layers call it for spec rows
(`num_accepted_tokens`, `query_start_loc`, state width K - 1 + k), per layer and step.

Every row verifies a window of T = 1 + k tokens with every draft accepted (ours: pending =
committed = T); NL independent layers (own states and inputs) per CUDA graph so that the
states do not all stay in L2; median graph replay / NL. A 12-layer eager profile of the
48-layer Qwen3-Next dummy model at bs 64 put ours at about 15 µs per layer against vLLM's 4
(4e0bc38): this tool sweeps the launch shape (--block-d, --num-warps) to close that.

    python3 benchmarks/kernels/bench_conv.py --json
    python3 benchmarks/kernels/bench_conv.py --geoms qwen3_next --batch 64 \\
        --block-d 64,128,256 --num-warps 1,2,4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from benchmarks import common

# conv channels (q, k and v for GDN; x, B and C for Mamba-2), kernel width, conv bias
GEOMETRIES = {
    "qwen3_next": dict(dim=2 * 16 * 128 + 32 * 128, width=4, bias=False),
    "nemotron3_super": dict(dim=10240, width=4, bias=True),
}


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--geoms", default="qwen3_next,nemotron3_super")
    p.add_argument("--batch", type=_ints, default=[1, 64, 256])
    p.add_argument("--window", type=int, default=4, help="T = 1 + k tokens per row")
    p.add_argument("--block-d", type=_ints, default=[256], help="our channels per program")
    p.add_argument("--num-warps", type=_ints, default=[4], help="our warps per program")
    p.add_argument("--layers", type=int, default=8, help="independent layers per graph")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--json", nargs="?", const="", default=None, metavar="PATH")
    args = p.parse_args(argv)
    args.geoms = [g for g in args.geoms.split(",") if g]
    bad = [g for g in args.geoms if g not in GEOMETRIES]
    if bad:
        p.error(f"--geoms: unknown {bad}; known: {', '.join(GEOMETRIES)}")
    if args.window < 2:
        p.error("--window must be at least 2 (a speculative step)")
    return args


def _layers(geom: dict, bs: int, window: int, n: int):
    """n layers' inputs: x [bs * T, D], a conv state of bs + 1 slots (slot 0: NULL) stored
    state-len-major as vLLM's default layout and seen dim-first [S, D, K - 1 + k], weight
    [D, K], bias; and the rows' metadata."""
    import torch

    dev, D, K = "cuda", geom["dim"], geom["width"]
    M = K - 1 + window - 1
    g = torch.Generator(device=dev).manual_seed(0)
    meta = dict(
        slots=torch.arange(1, bs + 1, dtype=torch.int32, device=dev),
        qsl=torch.arange(0, bs * window + 1, window, dtype=torch.int32, device=dev),
        full=torch.full((bs,), window, dtype=torch.int32, device=dev),
    )
    layers = []
    for _ in range(n):
        state = torch.randn((bs + 1, M, D), generator=g, device=dev).to(torch.bfloat16)
        layers.append(
            dict(
                x=torch.randn((bs * window, D), generator=g, device=dev).to(torch.bfloat16),
                state=state.transpose(1, 2),
                weight=torch.randn((D, K), generator=g, device=dev).to(torch.bfloat16),
                bias=torch.randn(D, generator=g, device=dev).to(torch.bfloat16)
                if geom["bias"]
                else None,
            )
        )
    return layers, meta


def _time(cycle, n: int, replays: int) -> dict:
    out = common.summarize(common.time_graph(cycle, replays, warmup=3))
    out["us"] = out["median_ms"] * 1000 / n
    return out


def run(args) -> list[dict]:
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update

    from vllm_replayssm.kernels.common.triton_conv import spec_conv_update_triton

    T, rows = args.window, []
    for name in args.geoms:
        geom = GEOMETRIES[name]
        for bs in args.batch:
            layers, m = _layers(geom, bs, T, args.layers)

            def vllm_cycle(layers=layers, m=m) -> None:
                for lay in layers:
                    causal_conv1d_update(
                        lay["x"],
                        lay["state"],
                        lay["weight"],
                        lay["bias"],
                        "silu",
                        conv_state_indices=m["slots"],
                        num_accepted_tokens=m["full"],
                        query_start_loc=m["qsl"],
                        max_query_len=T,
                        validate_data=False,
                    )

            vllm = _time(vllm_cycle, len(layers), args.replays)
            ours = []
            for block_d in args.block_d:
                for warps in args.num_warps:

                    def our_cycle(layers=layers, m=m, block_d=block_d, warps=warps) -> None:
                        for lay in layers:
                            spec_conv_update_triton(
                                lay["x"],
                                lay["state"],
                                m["slots"],
                                m["qsl"],
                                m["full"],
                                m["full"],
                                lay["weight"],
                                lay["bias"],
                                "silu",
                                T,
                                block_d=block_d,
                                num_warps=warps,
                            )

                    t = _time(our_cycle, len(layers), args.replays)
                    ours.append({"block_d": block_d, "num_warps": warps, **t})
            best = min(ours, key=lambda o: o["us"])
            rows.append(
                {
                    "geometry": name,
                    "bs": bs,
                    "window": T,
                    "vllm": vllm,
                    "ours": ours,
                    "best": {k: best[k] for k in ("block_d", "num_warps", "us")},
                    "speedup": vllm["us"] / best["us"],
                }
            )
            print(
                f"{name} bs {bs}: vLLM {vllm['us']:.2f} us; ours "
                + ", ".join(f"{o['block_d']}/{o['num_warps']}w {o['us']:.2f}" for o in ours),
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = common.machine_info()
    payload = {
        **common.run_header(__file__, info),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "geometries": {g: GEOMETRIES[g] for g in args.geoms},
        "results": run(args),
    }
    print(common.machine_line(info, None))
    print(
        common.format_table(
            ["geometry", "bs", "T", "vLLM us", "ours us", "block_d", "warps", "speedup"],
            [
                [
                    r["geometry"],
                    r["bs"],
                    r["window"],
                    round(r["vllm"]["us"], 2),
                    round(r["best"]["us"], 2),
                    r["best"]["block_d"],
                    r["best"]["num_warps"],
                    round(r["speedup"], 2),
                ]
                for r in payload["results"]
            ],
        )
    )
    if args.json is not None:
        path = Path(args.json) if args.json else common.default_json_path("conv-spec", info)
        common.write_json(path, payload)
        print(f"# wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
