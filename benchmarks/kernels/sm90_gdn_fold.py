"""Offline sm_90 compile report of the GDN flush tile at the Qwen3.5 geometry (128 x 128 value
heads, L = 16): the serial `advance_tile` against the chunked `wy_fold_tile` (bf16x3 and
tf32x3), in both flush modes, each inside a minimal 4-warp kernel that loads one value head's
64 x 128 fp32 tile, folds it and stores it (the figures in vllm_replayssm/kernels/gdn/README.md).

    .venv/bin/python benchmarks/kernels/sm90_gdn_fold.py --tool PATH/TO/sm90_report.py

The tool (`compile_sm90`) compiles a Triton kernel for sm_90 with Triton's bundled ptxas and
reads the SASS back; it comes with the development environment, not with this repository.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_replayssm.kernels.gdn.tiles import advance_tile, wy_fold_tile

V, K, L = 128, 128, 16  # Qwen3.5 value and key head dims, buffer_len 16
RING = L + 1
BLOCK_V = 64  # the flush kernel's value tile
KEYS = ("regs", "stack", "local", "sass", "LDG128", "BAR", "SHFL", "LDS_STS", "MMA", "MUFU")


@triton.jit
def _fold_tile_kernel(
    hp_ptr,
    ring_g_ptr,
    ring_beta_ptr,
    ring_k_ptr,
    ring_d_ptr,
    ring_v_ptr,
    fo,
    fn,
    num_ring_rows,
    stride_hp_head,
    stride_rg_head,
    stride_rk_head,
    stride_rd_head,
    stride_rg_row,
    stride_rbeta_row,
    stride_rk_row,
    stride_rk_k,
    stride_rd_row,
    stride_rd_v,
    stride_rv_row,
    stride_rv_v,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_L: tl.constexpr,
    EXACT_FLUSH: tl.constexpr,
    USE_WY: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """hp[h, tile] advanced over ring entries [fo, fo + fn) of value head h (grid: heads x
    tiles); the fold alone, as the flush kernel runs it."""
    h = tl.program_id(0).to(tl.int64)
    o_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    o_k = tl.arange(0, BLOCK_K)
    m_v = o_v < BLOCK_V * tl.num_programs(1)
    m_k = o_k < BLOCK_K
    p_hp = hp_ptr + h * stride_hp_head + o_v[:, None] * BLOCK_K + o_k[None, :]
    S = tl.load(p_hp)
    p_rg = ring_g_ptr + h * stride_rg_head
    p_rbeta = ring_beta_ptr + h * stride_rg_head
    p_rk = ring_k_ptr + h * stride_rk_head
    p_rd = ring_d_ptr + h * stride_rd_head
    p_rv = ring_v_ptr + h * stride_rd_head
    if USE_WY:
        S = wy_fold_tile(
            S,
            p_rg,
            p_rbeta,
            p_rk,
            p_rd,
            p_rv,
            fo,
            fn,
            num_ring_rows,
            o_v,
            o_k,
            m_v,
            m_k,
            stride_rg_row,
            stride_rbeta_row,
            stride_rk_row,
            stride_rk_k,
            stride_rd_row,
            stride_rd_v,
            stride_rv_row,
            stride_rv_v,
            EXACT_FLUSH,
            BLOCK_L,
            PRECISION,
        )
    else:
        S = advance_tile(
            S,
            p_rg,
            p_rbeta,
            p_rk,
            p_rd,
            p_rv,
            fo,
            fn,
            num_ring_rows,
            o_v,
            o_k,
            m_v,
            m_k,
            stride_rg_row,
            stride_rbeta_row,
            stride_rk_row,
            stride_rk_k,
            stride_rd_row,
            stride_rd_v,
            stride_rv_row,
            stride_rv_v,
            EXACT_FLUSH,
        )
    tl.store(p_hp, S)


def variants() -> list[tuple[str, dict, dict]]:
    """(name, args, constexprs) of every variant reported (4 warps each)."""
    args = {
        "hp_ptr": "*fp32",
        "ring_g_ptr": "*fp32",
        "ring_beta_ptr": "*fp32",
        "ring_k_ptr": "*bf16",
        "ring_d_ptr": "*fp32",  # fp32 corrected values (the exact flush does not read them)
        "ring_v_ptr": "*bf16",
        "fo": 3,
        "fn": 15,  # runtime values, not multiples of 16
        "num_ring_rows": RING,
        "stride_hp_head": V * K,
        "stride_rg_head": 2 * RING,
        "stride_rk_head": RING * K,
        "stride_rd_head": RING * V,
        "stride_rg_row": 1,
        "stride_rbeta_row": 1,
        "stride_rk_row": K,
        "stride_rk_k": 1,
        "stride_rd_row": V,
        "stride_rd_v": 1,
        "stride_rv_row": V,
        "stride_rv_v": 1,
    }
    out = []
    for exact in (True, False):
        mode = "exact" if exact else "fold"
        for name, use_wy, precision in (
            ("serial", False, "ieee"),
            ("wy bf16x3", True, "bf16x3"),
            ("wy tf32x3", True, "tf32x3"),
        ):
            constexprs = dict(
                BLOCK_V=BLOCK_V,
                BLOCK_K=K,
                BLOCK_L=L,
                EXACT_FLUSH=exact,
                USE_WY=use_wy,
                PRECISION=precision,
            )
            out.append((f"{name} {mode}", args, constexprs))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tool", required=True, help="path of sm90_report.py")
    p.add_argument("--out-dir", default="/tmp/sm90", help="where .ptx / .sass files go")
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("sm90_report", args.tool)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    for name, kargs, constexprs in variants():
        row = tool.compile_sm90(
            _fold_tile_kernel,
            kargs,
            constexprs,
            num_warps=4,
            num_stages=1,
            tag="gdn_" + name.replace(" ", "_"),
            out_dir=args.out_dir,
        )
        print(f"{name:18s} warps=4", json.dumps({k: row.get(k) for k in KEYS}))


if __name__ == "__main__":
    main()
