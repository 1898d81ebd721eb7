"""Offline sm_90 compile report of the Mamba-2 kernels at the Nemotron-3 Super geometry:
registers, spills and the SASS mix per kernel variant, on a machine without a GPU (the
figures in vllm_replayssm/kernels/README.md).

    .venv/bin/python benchmarks/kernels/sm90_mamba2.py --tool PATH/TO/sm90_report.py

The tool (`compile_sm90`) compiles a Triton kernel for sm_90 with Triton's bundled ptxas and
reads the SASS back; it comes with the development environment, not with this repository.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_replayssm.kernels.mamba2 import flush, fused, plan, readout, stock_route

H, P, N, G, L = 128, 64, 128, 8, 16  # Nemotron-3 Super, buffer_len 16
RING = L + 1
PAGE = 1_600_000  # a slot stride in elements (a multiple of 16, as layout.py makes it)
COEF = 2 * L  # plan.coef_len(16)
KEYS = ("regs", "local", "stack", "sass", "LDG128", "STG128", "BAR", "SHFL", "MMA", "ATOM", "INT")


def _strides(prefix: str, *values: int) -> dict:
    dims = {
        "hp": ("slot", "head", "dim", "dstate"),
        "lp": ("slot", "head", "dim", "dstate"),
        "ck": ("slot", "head", "dim", "dstate"),
        "rx": ("slot", "head", "row", "dim"),
        "rB": ("slot", "group", "row", "dstate"),
        "rdt": ("slot", "head", "row"),
        "meta": ("slot", "word"),
        "x": ("tok", "head", "dim"),
        "out": ("tok", "head", "dim"),
        "dt": ("tok", "head"),
        "B": ("tok", "group", "dstate"),
        "C": ("tok", "group", "dstate"),
    }[prefix]
    return {f"stride_{prefix}_{d}": v for d, v in zip(dims, values, strict=True)}


def _common() -> dict:
    return {
        **_strides("rx", 2 * PAGE, RING * P, P, 1),
        **_strides("rB", 2 * PAGE, RING * N, N, 1),
        **_strides("x", H * P, P, 1),
        **_strides("out", H * P, P, 1),
        **_strides("C", 20_000, N, 1),
        **_strides("meta", PAGE, 1),
    }


def variants() -> list[tuple[str, object, dict, dict, int]]:
    """(name, kernel, args, constexprs, num_warps) of every variant reported."""
    ptrs = {
        "ring_x_ptr": "*bf16",
        "ring_B_ptr": "*bf16",
        "x_ptr": "*bf16",
        "C_ptr": "*bf16",
        "out_ptr": "*bf16",
        "meta_ptr": "*i32",
        "plan_ptr": "*i32",
        "coef_ptr": "*fp32",
    }
    coef = {"stride_coef_row": H * COEF, "stride_coef_head": COEF}
    out = []
    plan_args = {
        **ptrs,
        "ring_dt_ptr": "*fp32",
        "dt_ptr": "*bf16",
        "A_ptr": "*fp32",
        "B_ptr": "*bf16",
        "D_ptr": "*fp32",
        "dt_bias_ptr": "*fp32",
        "state_indices_ptr": "*i32",
        "hp_rows_ptr": "*i32",
        "hp_count_ptr": "*i32",
        "null_block_id": 0,
        "num_ring_rows": RING,
        **_common(),
        **coef,
        **_strides("rdt", PAGE, RING, 1),
        **_strides("dt", 20_000, 1),
        **_strides("B", 20_000, N, 1),
    }
    for del_key in (
        "ring_x_ptr",
        "x_ptr",
        "out_ptr",
        "stride_rx_slot",
        "stride_rx_head",
        "stride_rx_row",
        "stride_rx_dim",
        "stride_x_tok",
        "stride_x_head",
        "stride_x_dim",
        "stride_out_tok",
        "stride_out_head",
        "stride_out_dim",
    ):
        plan_args.pop(del_key)
    out.append(
        (
            "plan",
            plan._mamba2_plan_kernel,
            plan_args,
            dict(
                HEADS_PER_GROUP=H // G,
                dstate=N,
                BLOCK_N=N,
                BLOCK_HG=H // G,
                BLOCK_L=L,
                HAS_D=True,
                HAS_LP=True,
            ),
            1,
        )
    )
    for ck, rows in (("*fp32", 16), ("*bf16", 32), ("*fp16", 32)):
        args = {
            **ptrs,
            "ckpt_ptr": ck,
            "null_block_id": 0,
            "num_ring_rows": RING,
            **_common(),
            **coef,
            **_strides("ck", PAGE, P * N, N, 1),
        }
        for del_key in (
            "ring_B_ptr",
            "stride_rB_slot",
            "stride_rB_group",
            "stride_rB_row",
            "stride_rB_dstate",
        ):
            args.pop(del_key)
        out.append(
            (
                f"readout {rows} x {N} {ck[1:]}",
                readout._mamba2_readout_kernel,
                args,
                dict(
                    HEADS_PER_GROUP=H // G,
                    TILES_PER_HEAD=P // rows,
                    headdim=P,
                    dstate=N,
                    BLOCK_P=rows,
                    BLOCK_N=N,
                    BLOCK_L=L,
                ),
                1,
            )
        )
    for precision in ("bf16x3", "tf32x3"):
        args = {
            **ptrs,
            "hp_ptr": "*fp32",
            "lp_ptr": "*bf16",
            "hp_rows_ptr": "*i32",
            "hp_count_ptr": "*i32",
            "num_ring_rows": RING,
            **_common(),
            **coef,
            **_strides("hp", PAGE, P * N, N, 1),
            **_strides("lp", 2 * PAGE, P * N, N, 1),
        }
        for del_key in ("meta_ptr", "stride_meta_slot", "stride_meta_word"):
            args.pop(del_key)
        out.append(
            (
                f"flush 64 x {N} {precision}",
                flush._mamba2_flush_kernel,
                args,
                dict(
                    NUM_HEADS=H,
                    HEADS_PER_GROUP=H // G,
                    TILES_PER_HEAD=1,
                    headdim=P,
                    dstate=N,
                    BLOCK_P=64,
                    BLOCK_N=N,
                    BLOCK_L=L,
                    HAS_LP=True,
                    LP_IS_FP16=False,
                    DOT_PRECISION=precision,
                ),
                4,
            )
        )
    args = {
        **ptrs,
        "hp_ptr": "*fp32",
        "ring_dt_ptr": "*fp32",
        "dt_ptr": "*bf16",
        "A_ptr": "*fp32",
        "B_ptr": "*bf16",
        "D_ptr": "*fp32",
        "dt_bias_ptr": "*fp32",
        "state_indices_ptr": "*i32",
        "null_block_id": 0,
        "heads_per_group": H // G,
        "num_programs_per_row": H * P // 8,
        "num_ring_rows": RING,
        "stagger_mod": L,
        **_common(),
        **_strides("hp", PAGE, P * N, N, 1),
        **_strides("rdt", PAGE, RING, 1),
        **_strides("dt", 20_000, 1),
        **_strides("B", 20_000, N, 1),
    }
    for del_key in ("plan_ptr", "coef_ptr"):
        args.pop(del_key)
    out.append(
        (
            "stock route 8 x 128",
            stock_route._mamba2_stock_route_kernel,
            args,
            dict(headdim=P, dstate=N, WINDOW=1, BLOCK_P=8, BLOCK_N=N, HAS_D=True),
            1,
        )
    )
    return out + window_variants(plan_args)


def window_variants(plan_args: dict, T: int = 4) -> list[tuple[str, object, dict, dict, int]]:
    """The speculative specialisations (ngram k = 3: T = 4) of the plan / readout / flush."""
    ring = L + T
    coef_n = plan.coef_len(L, T)
    off_w, off_s, off_d = plan.coef_offsets(L, T)
    bt = plan.window_block(T)
    coef = {"stride_coef_row": H * coef_n, "stride_coef_head": coef_n}
    win = dict(WINDOW=T, BLOCK_T=bt, OFF_W=off_w, OFF_S=off_s, IS_VARLEN=True)
    out = []
    args = {
        **plan_args,
        **coef,
        "num_ring_rows": ring,
        "qsl_ptr": "*i32",
        "acc_ptr": "*i32",
        **_strides("rx", 2 * PAGE, ring * P, P, 1),
        **_strides("rB", 2 * PAGE, ring * N, N, 1),
        **_strides("rdt", PAGE, ring, 1),
    }
    for key in [k for k in args if k.startswith("stride_rx_")]:
        args.pop(key)
    out.append(
        (
            f"plan window {T}",
            plan._mamba2_plan_window_kernel,
            args,
            dict(
                HEADS_PER_GROUP=H // G,
                dstate=N,
                BLOCK_N=N,
                BLOCK_HG=H // G,
                BLOCK_L=L,
                HAS_D=True,
                HAS_LP=True,
                HAS_ACC=True,
                OFF_D=off_d,
                HP_LIST=True,
                **win,
            ),
            4,
        )
    )
    ptrs = {
        "ring_x_ptr": "*bf16",
        "ring_B_ptr": "*bf16",
        "x_ptr": "*bf16",
        "C_ptr": "*bf16",
        "out_ptr": "*bf16",
        "plan_ptr": "*i32",
        "coef_ptr": "*fp32",
        "qsl_ptr": "*i32",
    }
    common = {
        **_common(),
        **_strides("rx", 2 * PAGE, ring * P, P, 1),
        **_strides("rB", 2 * PAGE, ring * N, N, 1),
        **coef,
        "num_ring_rows": ring,
    }
    # The readout's sums: elementwise products and warp reductions (the default), or
    # tensor-core products (`readout_products="dot"`: bf16 LP against bf16 C one bf16
    # product, an fp32 tile its three bf16 parts in 32-column chunks).
    readouts = (
        ("*fp32", 8, "fma", N),
        ("*bf16", 16, "fma", N),
        ("*fp32", 16, "bf16x3", 32),
        ("*bf16", 16, "dot16", N),
        ("*bf16", 32, "dot16", N),
    )
    for ck, rows, products, block_k in readouts:
        args = {**ptrs, **common, "ckpt_ptr": ck, "meta_ptr": "*i32", "null_block_id": 0}
        args.update(_strides("ck", PAGE, P * N, N, 1))
        for key in ("ring_B_ptr", *[k for k in args if k.startswith("stride_rB_")]):
            args.pop(key)
        tag = "" if products == "fma" else f" {products}"
        out.append(
            (
                f"readout window {T} {rows} x {N} {ck[1:]}{tag}",
                readout._mamba2_readout_window_kernel,
                args,
                dict(
                    HEADS_PER_GROUP=H // G,
                    TILES_PER_HEAD=P // rows,
                    headdim=P,
                    dstate=N,
                    BLOCK_P=rows,
                    BLOCK_N=N,
                    BLOCK_L=L,
                    PRODUCTS=products,
                    BLOCK_K=block_k,
                    DOT_T=max(16, bt),
                    **{k: v for k, v in win.items() if k != "OFF_D"},
                ),
                1,
            )
        )
    args = {
        **ptrs,
        **common,
        "hp_ptr": "*fp32",
        "lp_ptr": "*bf16",
        "hp_rows_ptr": "*i32",
        "hp_count_ptr": "*i32",
        **_strides("hp", PAGE, P * N, N, 1),
        **_strides("lp", 2 * PAGE, P * N, N, 1),
    }
    for key in ("stride_meta_slot", "stride_meta_word"):
        args.pop(key)
    # The window's readout from the folded tile: "fma" (the default) or tensor-core products
    # (`flush_products="dot"`: the fp32 tile's bf16 parts against bf16 C).
    for products in ("fma", "bf16x3"):
        tag = "" if products == "fma" else " dot"
        out.append(
            (
                f"flush window {T} 32 x {N} bf16x3{tag}",
                flush._mamba2_flush_window_kernel,
                args,
                dict(
                    NUM_HEADS=H,
                    HEADS_PER_GROUP=H // G,
                    TILES_PER_HEAD=P // 32,
                    headdim=P,
                    dstate=N,
                    BLOCK_P=32,
                    BLOCK_N=N,
                    BLOCK_L=L,
                    HAS_LP=True,
                    LP_IS_FP16=False,
                    DOT_PRECISION="bf16x3",
                    OFF_D=off_d,
                    PRODUCTS=products,
                    DOT_T=max(16, bt),
                    **win,
                ),
                4,
            )
        )
    # The readout and the flush in one launch (`fused.py`, steps of up to fused_max_rows
    # rows): the flush's 32-row tile on four warps, 16-row tiles on four and on two (the
    # defaults of fused_block_p and fused_warps since 7333e0a's H200 sweep), default
    # products (bf16 LP: dot16 readout, "dot" flush; HP only: bf16x3 readout, "fma" flush).
    for lp, r_products, f_products in (("*bf16", "dot16", "bf16x3"), ("*fp32", "bf16x3", "fma")):
        fargs = {**args, "lp_ptr": lp, "meta_ptr": "*i32", "null_block_id": 0}
        fargs.update(_strides("meta", PAGE, 1))
        for key in ("hp_rows_ptr", "hp_count_ptr"):
            fargs.pop(key)
        kind = f"{lp[1:]} LP" if lp == "*bf16" else "HP only"
        for block_p, warps in ((32, 4), (16, 4), (16, 2)):
            out.append(
                (
                    f"fused window {T} {block_p} x {N} {kind}" + ("" if warps == 4 else " 2w"),
                    fused._mamba2_window_fused_kernel,
                    fargs,
                    dict(
                        HEADS_PER_GROUP=H // G,
                        TILES_PER_HEAD=P // block_p,
                        headdim=P,
                        dstate=N,
                        BLOCK_P=block_p,
                        BLOCK_N=N,
                        BLOCK_L=L,
                        HAS_LP=lp == "*bf16",
                        LP_IS_FP16=False,
                        DOT_PRECISION="bf16x3",
                        OFF_D=off_d,
                        READOUT_PRODUCTS=r_products,
                        BLOCK_K=N if lp == "*bf16" else 32,
                        FLUSH_PRODUCTS=f_products,
                        DOT_T=max(16, bt),
                        **win,
                    ),
                    warps,
                )
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tool", required=True, help="path of sm90_report.py")
    p.add_argument("--out-dir", default="/tmp/sm90", help="where .ptx / .sass files go")
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("sm90_report", args.tool)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    for name, kernel, kargs, constexprs, warps in variants():
        row = tool.compile_sm90(
            kernel,
            kargs,
            constexprs,
            num_warps=warps,
            num_stages=1,
            tag=re.sub(r"\W+", "_", name),
            out_dir=args.out_dir,
        )
        print(f"{name:42s} warps={warps}", json.dumps({k: row.get(k) for k in KEYS}))


if __name__ == "__main__":
    main()
