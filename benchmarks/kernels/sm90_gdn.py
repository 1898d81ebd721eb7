"""Offline sm_90 compile report of the GDN plain-decode kernels (plan / readout / flush) and
the stock route at the Qwen3.5-122B geometry (16 key / 64 value heads, 128 x 128, L = 16):
registers, spills and the SASS mix per kernel variant, on a machine without a GPU (the
figures in vllm_replayssm/kernels/README.md).

    .venv/bin/python benchmarks/kernels/sm90_gdn.py --tool PATH/TO/sm90_report.py

The tool (`compile_sm90`) compiles a Triton kernel for sm_90 with Triton's bundled ptxas and
reads the SASS back; it comes with the development environment, not with this repository.
Strides are those of real pages: the layer's page is carved on the meta device
(`layout.carve`), so every stride is the one the launchers pass.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_replayssm.kernels.gdn import flush, plan, readout
from vllm_replayssm.kernels.gdn import window as gdn_window
from vllm_replayssm.layout import (
    GDNGeometry,
    GDNReplayCache,
    carve,
    gdn_state_specs,
    page_size_bytes,
    ring_rows,
)

GEOM = GDNGeometry(num_k_heads=16, num_v_heads=64, head_k_dim=128, head_v_dim=128)
L, R = 16, 256  # buffer_len, rows
KEYS = (
    "regs",
    "local",
    "stack",
    "smem",
    "sass",
    "LDG128",
    "STG128",
    "BAR",
    "SHFL",
    "MMA",
    "ATOM",
    "INT",
)
TORCH_TO_TRITON = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
TORCH_TO_TRITON[torch.int32] = "*i32"


def _tensors(lp: torch.dtype | None, window: int = 1, d_lp: bool = False):
    """Every tensor a launcher passes, on the meta device, keyed by its argument prefix
    (`window` tokens per row: the speculative window step's page and token tensors; d_lp:
    d records in the LP dtype, gdn_d_dtype "lp")."""
    d = lp if d_lp else torch.float32
    conv = ((8192, 3), torch.bfloat16)
    specs = gdn_state_specs(GEOM, L, window, torch.bfloat16, lp, True, *conv, d)
    raw = torch.empty(4 * page_size_bytes(specs), dtype=torch.uint8, device="meta")
    cache = GDNReplayCache.from_views(carve(raw, specs))
    scratch = plan.GDNScratch.allocate(
        R, GEOM.num_v_heads, GEOM.num_k_heads, GEOM.head_k_dim, L, "meta"
    )
    Hk, Hv, K, V = GEOM.num_k_heads, GEOM.num_v_heads, GEOM.head_k_dim, GEOM.head_v_dim
    n_tok = R * window
    qkv = torch.empty(n_tok, 2 * Hk * K + Hv * V, dtype=torch.bfloat16, device="meta")
    ba = torch.empty(n_tok, 2 * Hv, dtype=torch.bfloat16, device="meta")
    t = {
        "hp": cache.hp,
        "lp": cache.lp if cache.lp is not None else cache.hp,
        "ck": cache.lp if cache.lp is not None else cache.hp,
        "rg": cache.ring_g,
        "rbeta": cache.ring_beta,
        "rk": cache.ring_k,
        "rd": cache.ring_d,
        "rv": cache.ring_v,
        "meta": cache.meta,
        "q": qkv[:, : Hk * K].view(n_tok, Hk, K),  # vLLM's packed projection: strided views
        "k": qkv[:, Hk * K : 2 * Hk * K].view(n_tok, Hk, K),
        "v": qkv[:, 2 * Hk * K :].view(n_tok, Hv, V),
        "a": ba[:, :Hv],
        "b": ba[:, Hv:],
        "out": torch.empty(n_tok, Hv, V, dtype=torch.bfloat16, device="meta"),
        "kq": scratch.kq,
    }
    if window > 1:  # the window plan's scratch (window.gdn_window_decode allocates it)
        bw, bh = max(2, window), plan.history_block(L)
        t["kq"] = torch.empty(R, Hk, 2 * bw * K, dtype=torch.float32, device="meta")
        t["coef"] = torch.empty(
            R, Hv, gdn_window.window_coef_len(bw, bh), dtype=torch.float32, device="meta"
        )
    return t, scratch


PTRS = {  # pointer argument -> tensor prefix
    "hp_ptr": "hp",
    "lp_ptr": "lp",
    "ckpt_ptr": "ck",
    "ring_g_ptr": "rg",
    "ring_beta_ptr": "rbeta",
    "ring_k_ptr": "rk",
    "ring_d_ptr": "rd",
    "ring_v_ptr": "rv",
    "meta_ptr": "meta",
    "q_ptr": "q",
    "k_ptr": "k",
    "v_ptr": "v",
    "a_ptr": "a",
    "b_ptr": "b",
    "out_ptr": "out",
    "kq_ptr": "kq",
}
SCALARS = {
    "scale": GEOM.head_k_dim**-0.5,
    "null_block_id": 0,
    "num_ring_rows": ring_rows(L, 1),
    "stagger_mod": L,
    "A_log_ptr": "*fp32",
    "dt_bias_ptr": "*fp32",
    "state_indices_ptr": "*i32",
    "plan_ptr": "*i32",
    "coef_ptr": "*fp32",
    "hp_rows_ptr": "*i32",
    "hp_count_ptr": "*i32",
    "flush_rows_ptr": "*i32",
    "flush_count_ptr": "*i32",
    "qsl_ptr": "*i32",
    "acc_ptr": "*i32",
    "num_programs_per_row": 512,
}


def kernel_args(kernel, lp: torch.dtype | None, window: int = 1, d_lp: bool = False) -> dict:
    """Argument values of a kernel's non-constexpr parameters, from the meta tensors: a
    pointer's dtype, a stride_<prefix>_<dim> its stride (dims in the tensor's order)."""
    t, scratch = _tensors(lp, window, d_lp)
    strides = {
        "coef": scratch.coef.stride()[:2],  # the window step's own below, from t
        **{p: x.stride() for p, x in t.items()},
    }
    out = {}
    for p in kernel.params:
        if p.is_constexpr:
            continue
        name = p.name
        if name in PTRS:
            out[name] = TORCH_TO_TRITON[t[PTRS[name]].dtype]
        elif name == "num_ring_rows":
            out[name] = ring_rows(L, window)
        elif name in SCALARS:
            out[name] = SCALARS[name]
        elif name.startswith("stride_"):
            prefix = name[len("stride_") :].rsplit("_", 1)[0]
            out[name] = strides[prefix][_dim_index(kernel, prefix, name)]
        else:
            raise KeyError(f"{kernel.fn.__name__}: no value for argument {name}")
    return out


def _dim_index(kernel, prefix: str, name: str) -> int:
    """Position of stride `name` among the kernel's strides of `prefix`."""
    names = [p.name for p in kernel.params if p.name.startswith(f"stride_{prefix}_")]
    names = [n for n in names if n[len(f"stride_{prefix}_") :].count("_") == 0]
    return names.index(name)


def variants() -> list[tuple[str, object, dict, dict, int]]:
    """(name, kernel, args, constexprs, num_warps) of every variant reported."""
    Hk, Hv, K, V = GEOM.num_k_heads, GEOM.num_v_heads, GEOM.head_k_dim, GEOM.head_v_dim
    BL = plan.history_block(L)
    out = [
        (
            "plan",
            plan._gdn_plan_kernel,
            kernel_args(plan._gdn_plan_kernel, torch.bfloat16),
            dict(
                V_PER_K=Hv // Hk,
                head_k_dim=K,
                BLOCK_K=K,
                BLOCK_HG=Hv // Hk,
                BLOCK_L=BL,
                HAS_LP=True,
                EXACT_FLUSH=True,
            ),
            1,
        )
    ]
    # the readout's tile loop: one tile per program, 4 (the bs 256 default); d_lp: d records
    # in the LP dtype
    for lp, rows, tiles, d_lp in (
        (None, 16, 1, False),
        (torch.bfloat16, 32, 1, False),
        (torch.float16, 32, 1, False),
        (None, 16, 4, False),
        (torch.bfloat16, 32, 4, False),
        (torch.bfloat16, 32, 1, True),
        (torch.bfloat16, 32, 4, True),
    ):
        name = "fp32" if lp is None else str(lp).split(".")[1]
        loop = f" tiles {tiles}" if tiles > 1 else ""
        loop += ", d in LP dtype" if d_lp else ""
        out.append(
            (
                f"readout {rows} x {K} {name}{loop}",
                readout._gdn_readout_kernel,
                kernel_args(readout._gdn_readout_kernel, lp, d_lp=d_lp),
                dict(
                    V_PER_K=Hv // Hk,
                    TILES_PER_HEAD=V // rows,
                    head_k_dim=K,
                    head_v_dim=V,
                    BLOCK_V=rows,
                    BLOCK_K=K,
                    BLOCK_L=BL,
                    EXACT_FLUSH=True,
                    TILES=tiles,
                ),
                1,
            )
        )
    # The flush shapes and fold precisions the H200 sweep compares (decode.launch_config's
    # flush_block_v / flush_warps; bf16x3 is the GPU default with bf16 k records).
    # The exact flush recomputes d from HP with an LP copy, and sums the cached d without one
    # (`flush.gdn_flush`'s recompute).
    for rows, warps, precision, lp, *d_lp in (
        (16, 1, "bf16x3", torch.bfloat16, True),  # the LP default, d records in the LP dtype
        (64, 4, "bf16x3", torch.bfloat16),
        (64, 4, "tf32x3", torch.bfloat16),
        (64, 8, "bf16x3", torch.bfloat16),
        (32, 4, "bf16x3", torch.bfloat16),
        (32, 4, "tf32x3", torch.bfloat16),
        (32, 2, "bf16x3", torch.bfloat16),
        (16, 1, "bf16x3", torch.bfloat16),
        (64, 4, "bf16x3", None),
        (32, 2, "bf16x3", None),
        (16, 1, "bf16x3", None),
        (16, 2, "bf16x3", None),  # the HP-only default
    ):
        kind = "recompute" if lp is not None else "sum d, HP only"
        kind += ", d in LP dtype" if d_lp else ""
        out.append(
            (
                f"flush {rows} x {K} {precision} {kind}",
                flush._gdn_flush_kernel,
                kernel_args(flush._gdn_flush_kernel, lp, d_lp=bool(d_lp)),
                dict(
                    NUM_V_HEADS=Hv,
                    V_PER_K=Hv // Hk,
                    TILES_PER_HEAD=V // rows,
                    head_k_dim=K,
                    head_v_dim=V,
                    BLOCK_V=rows,
                    BLOCK_K=K,
                    BLOCK_L=BL,
                    HAS_LP=lp is not None,
                    LP_IS_FP16=False,
                    EXACT_FLUSH=True,
                    RECOMPUTE_D=lp is not None,
                    DOT_PRECISION=precision,
                ),
                warps,
            )
        )
    return out


def window_variants(T: int = 4) -> list[tuple[str, object, dict, dict, int]]:
    """The speculative window step (`window.py`, ngram k = 3: T = 4) at bs >= 64, bf16 LP:
    the split route's plan, flush list and readout (value tiles of 16-128 rows), and the
    fused step (16-row value tiles; all value heads of a key head per program, or one as
    `dispatch` launches it)."""
    Hk, Hv, K, V = GEOM.num_k_heads, GEOM.num_v_heads, GEOM.head_k_dim, GEOM.head_v_dim
    kern = gdn_window._gdn_window_kernel
    bh = plan.history_block(L)
    base = dict(
        head_k_dim=K,
        head_v_dim=V,
        v_per_k=Hv // Hk,
        WINDOW=T,
        BLOCK_W=T,
        BLOCK_V=16,
        BLOCK_K=K,
        BLOCK_H=bh,
        HAS_LP=True,
        LP_IS_FP16=False,
        EXACT_FLUSH=True,
        HAS_ACC=True,
        IS_VARLEN=True,
        HEADS_PER_PROGRAM=Hv // Hk,
        NUM_STAGES=1,
        FOLD_EXACT=True,
        FOLD="serial",
        BLOCK_L=max(16, bh),
    )
    out = [
        (
            f"window {T} plan{', flush rows read LP' if lp_flush else ''}"
            f"{', stale LP refreshed' if refresh else ''}",
            gdn_window._gdn_window_plan_kernel,
            kernel_args(gdn_window._gdn_window_plan_kernel, torch.bfloat16, T),
            dict(
                v_per_k=Hv // Hk,
                head_k_dim=K,
                WINDOW=T,
                BLOCK_W=T,
                BLOCK_K=K,
                BLOCK_H=bh,
                BLOCK_HG=Hv // Hk,
                HAS_ACC=True,
                IS_VARLEN=True,
                EXACT_FLUSH=True,
                HAS_LP=True,
                FLUSH_READS_LP=lp_flush,
                REFRESH_STALE=refresh,
            ),
            1,
        )
        for lp_flush, refresh in ((False, False), (True, False), (True, True))
    ]
    readout = gdn_window._gdn_window_readout_kernel
    for block_v, warps, lp_dot, tiles, stages, *d_lp in (  # block_v < 0: LP_ONLY
        (16, 1, "tf32x3", 1, 1),
        (16, 1, "bf16x3", 1, 1),
        (32, 1, "tf32x3", 1, 1),
        (32, 1, "bf16x3", 1, 1),
        (32, 2, "tf32x3", 1, 1),
        (64, 4, "tf32x3", 1, 1),
        (128, 4, "tf32x3", 1, 1),
        (16, 1, "bf16x3", 4, 1),
        (16, 1, "bf16x3", 4, 2),
        (16, 1, "bf16x3", 4, 3),
        (16, 1, "bf16x3", 8, 2),
        (-16, 1, "bf16x3", 8, 1),
        (-16, 1, "bf16x3", 8, 2),
        (-16, 1, "bf16x3", 8, 3),
        (-16, 1, "bf16x3", 4, 2),
        (-32, 1, "bf16x3", 4, 1),
        (-32, 1, "bf16x3", 4, 2),
        (-32, 2, "bf16x3", 4, 2),
        (-64, 4, "bf16x3", 2, 2),
        (-16, 1, "bf16x2", 8, 2),
        (-16, 1, "bf16x2", 8, 3),
        (-32, 2, "bf16x2", 4, 2),
        (32, 1, "bf16x3", 4, 2),
        (32, 2, "bf16x3", 4, 2),
        (16, 1, "bf16x3", 4, 2, True),  # d records in the LP dtype
        (-16, 1, "bf16x3", 8, 2, True),
    ):
        loop = f", {tiles} tiles, {stages} stages" if tiles > 1 else ""
        lp_only = block_v < 0
        block_v = abs(block_v)
        loop += ", LP only" if lp_only else ""
        loop += ", d in LP dtype" if d_lp else ""
        out.append(
            (
                f"window {T} readout, planned, {block_v} rows, LP {lp_dot}{loop}",
                readout,
                kernel_args(readout, torch.bfloat16, T, d_lp=bool(d_lp)),
                dict(
                    v_per_k=Hv // Hk,
                    tiles_per_head=V // block_v,
                    head_k_dim=K,
                    head_v_dim=V,
                    WINDOW=T,
                    BLOCK_W=T,
                    BLOCK_V=block_v,
                    BLOCK_K=K,
                    BLOCK_H=bh,
                    DOT_K=K,
                    DOT_H=max(16, bh),
                    DOT_N=max(16, 2 * T),
                    HAS_LP=True,
                    EXACT_FLUSH=True,
                    IS_VARLEN=True,
                    LP_PRECISION=lp_dot,
                    TILES=tiles,
                    HEAD_TILES=min(tiles, V // block_v),
                    NUM_STAGES=stages,
                    LP_ONLY=lp_only,
                ),
                warps,
            )
        )
    kern_list = gdn_window._gdn_window_flush_list_kernel
    for refresh in (False, True):  # one warp's 16-row tile (more warps were slower)
        rows = gdn_window.FLUSH_BLOCK_V
        out.append(
            (
                f"window {T} flush list, WY bf16x3{', refresh stale LP' if refresh else ''}",
                kern_list,
                kernel_args(kern_list, torch.bfloat16, T),
                dict(
                    num_v_heads=Hv,
                    v_per_k=Hv // Hk,
                    tiles_per_head=V // rows,
                    head_k_dim=K,
                    head_v_dim=V,
                    BLOCK_V=rows,
                    BLOCK_K=K,
                    HAS_LP=True,
                    LP_IS_FP16=False,
                    FOLD_EXACT=True,
                    FOLD="bf16x3",
                    BLOCK_L=max(16, bh),
                    REFRESH_STALE=refresh,
                ),
                1,
            )
        )
    hp_only = dict(HAS_LP=False, FOLD_EXACT=False, FOLD="bf16x3")  # sums the cached d
    for name, over in (
        ("fused", {}),
        ("fused, 1 head", dict(HEADS_PER_PROGRAM=1)),  # dispatch's fused route, bf16 LP
        ("fused, 1 head, HP only, WY bf16x3", dict(hp_only, HEADS_PER_PROGRAM=1)),  # HP only
    ):
        out.append(
            (
                f"window {T} {name}",
                kern,
                kernel_args(kern, torch.bfloat16, T),
                dict(base, **over),
                1,
            )
        )
    return out


def main() -> None:
    global L
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tool", required=True, help="path of sm90_report.py")
    p.add_argument("--out-dir", default="/tmp/sm90_gdn", help="where .ptx / .sass files go")
    p.add_argument("--match", default="", help="only the variants whose name has this")
    p.add_argument(
        "--num-stages",
        type=int,
        default=1,
        help="Triton num_stages of every compile (launchers that pass none get Triton's 3)",
    )
    p.add_argument("--buffer-len", type=int, default=16, help="L: ring history and fold length")
    args = p.parse_args()
    L = args.buffer_len
    SCALARS["stagger_mod"] = L
    spec = importlib.util.spec_from_file_location("sm90_report", args.tool)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    for name, kernel, kargs, constexprs, warps in variants() + window_variants():
        if args.match not in name:
            continue
        row = tool.compile_sm90(
            kernel,
            kargs,
            constexprs,
            num_warps=warps,
            num_stages=args.num_stages,
            tag="_".join(name.replace(",", "").split()),
            out_dir=args.out_dir,
        )
        print(f"{name:42s} warps={warps}", json.dumps({k: row.get(k) for k in KEYS}))


if __name__ == "__main__":
    main()
