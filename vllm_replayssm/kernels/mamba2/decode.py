"""The Mamba-2 replay route in Triton: one decode step of one layer for a batch of rows.

Plain decode (one token per row, window 1) runs three launches that share caller-owned
scratch (`plan.Mamba2Scratch`):
1. `plan.py`: cursor words -> dense plan rows; per (row, group) B_j . C and per (row, head)
   the readout coefficients; dt and B records appended; the list of rows that read HP;
2. `flush.py`: persistent over that list: flush rows fold their records into HP with one
   tensor-core product (HP read once, HP and LP written) and read out; stale-LP rows read
   out from HP;
3. `readout.py`: every other row, one ~8 KiB checkpoint tile per program, LP (or HP when LP
   is off) + history; stores the cursor words.
2 and 3 touch different rows; with `overlap` the flush runs on a side stream beside the
readout.
Speculative windows (T = 1 + k) run the same three launches specialised for T (the plan
writes every window token's coefficients; the readout and the flush read a tile once for
the whole window); a step of at most `fused_max_rows` rows runs the readout and the flush
as one launch (`fused.py`) and its plan writes no HP list.

No host synchronisation, no allocation when scratch is given, launch shapes fixed by the
batch: safe in CUDA graphs. Semantics: `reference.mamba2_replay_decode`.
"""

from __future__ import annotations

import functools

import torch

from vllm_replayssm.kernels.common.args import require_tensors
from vllm_replayssm.kernels.common.blocks import cdiv, next_pow2
from vllm_replayssm.kernels.common.rows import require_row_contiguous
from vllm_replayssm.kernels.common.streams import beside, num_sms
from vllm_replayssm.kernels.mamba2.flush import mamba2_flush
from vllm_replayssm.kernels.mamba2.fused import mamba2_window_fused
from vllm_replayssm.kernels.mamba2.plan import Mamba2Scratch, mamba2_plan
from vllm_replayssm.kernels.mamba2.readout import DOT_MIN_ROWS, mamba2_readout, window_products
from vllm_replayssm.layout import NULL_BLOCK_ID, Mamba2ReplayCache, ring_rows

TILE_BYTES = 8192  # checkpoint bytes per readout program
# Speculative steps of up to this many rows run the readout and the flush as one launch
# (`fused.py`): one launch and one memset fewer per layer and step. Measured on the H100
# (5542074, Super T = 4, `kernels-h100-20261206-5542074-mamba2-window4-fused.json`): with
# an LP copy the fused launch is ahead up to 8 rows and behind at 16; HP only, where the
# readout's body runs on the flush's 32 x 128 fp32 tile (four warps; the readout launch's
# tile is 16 x 128 on one), ahead at 1 row and behind from 2. Nemotron-3 Nano-4B alike
# (dde4507, `kernels-h100-20261206-dde4507-mamba2-window4-fused-nano4b.json`). Both were
# measured on that 32-row tile; the fused tile is 16 rows on two warps since 7333e0a's
# H200 sweep (`launch_config`), where HP only on 32 rows and two warps ran 24% faster than
# on four at 2 rows. Against the two launches in one run (H100, ef84825, Super T = 4,
# `kernels-h100-20261206-ef84825-mamba2-window4-hp-fused32x2.json`) that tile is 7% / 2%
# ahead at 2 / 4 rows and 11% behind at 8, so HP only still fuses one row only.
FUSED_MAX_ROWS_LP = 8
FUSED_MAX_ROWS_HP = 1


def launch_config(
    num_rows: int,
    nheads: int,
    headdim: int,
    dstate: int,
    ckpt_itemsize: int,
    device: torch.device,
    window: int = 1,
    readout_products: str | None = None,
) -> dict:
    """Launch knobs of the plan / flush / readout launches.

    readout: block_p rows of the checkpoint per program (TILE_BYTES of them), one warp
    (no cross-warp reductions); flush: one head's tile (up to 64 rows) per item, four
    warps, a persistent grid of two programs per SM (8 programs in the interpreter), on a
    side stream beside the readout (GPU). H200 sweeps, Nemotron-3 Super bs 256
    (benchmarks/results/kernels-h200-20261201-*): readout 16 or 32 rows and one warp
    within 1% of each other, two warps 2-7% slower; flush 64 rows x 4 warps and 32 x 2
    best, 8 warps 13% slower, 264-1056 programs alike; the overlap 2-8% faster.
    Speculative windows (sm_90 compile report at T = 4, Nemotron-3 Super,
    `benchmarks/kernels/sm90_mamba2.py`): the flush tile 32 rows (64 rows: 255 registers
    and a 40-byte stack; 32: 141, no spill), the plan on four warps (its [heads, window,
    history] coefficient blocks: 96 registers). Windows take their products on tensor
    cores by default (readout_products None: "dot" for windows, "fma" for plain decode,
    which refuses "dot"): the readout keeps the full tile (32 x 128 bf16: 70 registers, 736
    SASS instructions, against 1,688 for the half tile that "fma" takes, 16 x 128 bf16 at
    128 registers; fp32 16 x 128: 80), and the flush reads the window out of its folded
    tile the same way (flush_products "dot"), with an LP copy only. H100 at fbc1225, Super
    T = 4, bs 256, µs per step and layer, readout / flush products
    (`kernels-h100-20261206-fbc1225-mamba2-window4-readout-products.json`): bf16 LP
    fma/fma 803, dot/fma 781, fma/dot 753, dot/dot 628; HP only fma/fma 805, dot/fma 724,
    dot/dot 758, fma/dot 893. GPU test of both products at 874c28c
    (`pytest-gpu-h100-20261206-874c28c-mamba2-window-knobs.log`).
    flush_maxnreg caps the flush's registers (0: none): the window flush's 141 fit three
    programs per SM, capped at 128 (no spill at sm_90; 96 spills 40 bytes) four. Measured
    at the window defaults (H100, 4b2a1ab, Super T = 4 bs 256,
    `kernels-h100-20261206-4b2a1ab-mamba2-window4-products-maxnreg.json`, 264 / 528
    programs x cap 0 / 128): the defaults, no cap and two programs per SM, took bf16 LP
    631.3 µs and HP only 729.8; the best other points were 624.5 (bf16 LP, capped, 528
    programs, with the "fma" flush) and 725.9 (HP only, capped, 264): single `--quick`
    points 1.1% and 0.5% ahead, so neither is on.
    fused_max_rows: speculative steps of up to this many rows run the readout and the flush
    in one launch (`fused.py`: the flush's products, no register cap; fused_block_p rows of
    a head per program on fused_warps warps, by default 16 rows on two warps); 0 never
    (plain decode never). sm_90 (Super T = 4, `kernels/README.md`): 32 rows on four warps
    128 registers bf16 LP and 139 HP only; 16 rows on four warps 114 and 72, on two 108 and
    146; no spills. H100 at 5542074, Super T = 4, µs per step and layer,
    two launches / fused on 32 rows and four warps
    (`kernels-h100-20261206-5542074-mamba2-window4-fused.json`):
    bf16 LP bs 1 14.6 / 10.7, 2 18.3 / 13.4, 4 22.3 / 18.8, 8 31.4 / 30.1, 16 53.3 / 54.5;
    HP only bs 1 16.1 / 14.2, 2 18.8 / 20.9, 4 24.8 / 29.0, 8 37.0 / 49.0 (vLLM's kernel
    9.6 µs at bs 1, 17.1 at 2). The fused tile, H200 at 7333e0a, every step fused,
    fused_block_p / fused_warps 16 / 2, 16 / 4, 32 / 2, 32 / 4
    (`kernels-h200-20261206-7333e0a-mamba2-window4-fused-tiles.json`): bf16 LP bs 1 9.95,
    10.40, 10.74, 10.69; bs 2 12.27, 15.02, 11.95, 12.23; bs 4 17.42, 22.57, 18.08, 17.35;
    bs 8 27.47, 37.70, 25.13, 27.38; HP only bs 1 13.25, 14.00, 13.81, 13.76 (vLLM's kernel
    8.41 µs at bs 1). So 16 rows on two warps: 7% and 4% ahead where the fused launch runs
    by default at one row, within 0.5% at 2-8 rows with an LP copy."""
    if readout_products is None:
        readout_products = "dot" if window > 1 else "fma"
    block_p = TILE_BYTES // (next_pow2(dstate) * ckpt_itemsize)
    if window > 1 and readout_products == "fma":
        block_p //= 2
    min_p = DOT_MIN_ROWS if readout_products == "dot" else 8
    block_p = max(min_p, min(block_p, next_pow2(headdim)))
    flush_p = max(16, min(64 if window == 1 else 32, next_pow2(headdim)))
    if device.type == "cuda":
        programs = 2 * num_sms(device)
    else:
        programs = 8
    flush_items = num_rows * nheads * cdiv(headdim, flush_p)
    return dict(
        readout_block_p=block_p,
        readout_warps=1,
        flush_block_p=flush_p,
        flush_warps=4,
        flush_programs=min(programs, flush_items),
        plan_warps=1 if window == 1 else 4,
        overlap=device.type == "cuda",
        readout_products=readout_products,
        flush_products="dot" if window > 1 and ckpt_itemsize < 4 else "fma",
        flush_maxnreg=0,
        fused_max_rows=0
        if window == 1
        else (FUSED_MAX_ROWS_LP if ckpt_itemsize < 4 else FUSED_MAX_ROWS_HP),
        fused_block_p=16,
        fused_warps=2,
    )


def resolved_config(
    num_rows: int,
    nheads: int,
    headdim: int,
    dstate: int,
    ckpt_dtype: torch.dtype,
    c_dtype: torch.dtype,
    device: torch.device,
    window: int,
    plain: bool,
    knobs: dict,
) -> dict:
    """`launch_config` with `knobs` applied and checked (unknown names, products against the
    tile dtypes, flush_maxnreg), raising ValueError before anything is launched. Memoised:
    an eager step (a PIECEWISE CUDA-graph step runs the SSM layers eagerly) pays for this
    once per batch shape, not in every layer. Returns a new dict."""
    key = tuple(sorted(knobs.items()))
    args = (num_rows, nheads, headdim, dstate, ckpt_dtype, c_dtype, device, window, plain)
    try:
        hash(key)
    except TypeError:  # an unhashable knob value: resolve without the memo
        return dict(_resolve.__wrapped__(*args, key))
    return dict(_resolve(*args, key))


@functools.lru_cache(maxsize=512)
def _resolve(num_rows, nheads, headdim, dstate, ckpt_dtype, c_dtype, device, window, plain, knobs):
    knobs = dict(knobs)
    itemsize = ckpt_dtype.itemsize
    products = knobs.get("readout_products")
    cfg = launch_config(num_rows, nheads, headdim, dstate, itemsize, device, window, products)
    unknown = set(knobs) - set(cfg) - {"dot_precision"}
    if unknown:
        raise ValueError(f"unknown decode knobs {sorted(unknown)}")
    cfg.update(knobs)
    window_products(cfg["readout_products"], ckpt_dtype, c_dtype, cfg["readout_block_p"], plain)
    window_products(
        cfg["flush_products"], torch.float32, c_dtype, cfg["flush_block_p"], plain, "flush"
    )
    if cfg["flush_maxnreg"] < 0:
        raise ValueError(f"flush_maxnreg must be >= 0, got {cfg['flush_maxnreg']}")
    if cfg["fused_max_rows"] < 0:
        raise ValueError(f"fused_max_rows must be >= 0, got {cfg['fused_max_rows']}")
    fused = not plain and num_rows <= cfg["fused_max_rows"]
    dots = [k for k in ("readout_products", "flush_products") if cfg[k] == "dot"]
    if fused and dots and cfg["fused_block_p"] < DOT_MIN_ROWS:  # one tile for both bodies
        raise ValueError(
            f'{" and ".join(dots)} "dot" need fused_block_p >= {DOT_MIN_ROWS}, '
            f"got {cfg['fused_block_p']}"
        )
    return tuple(cfg.items())


def mamba2_replay_decode(
    cache: Mamba2ReplayCache,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    buffer_len: int,
    window: int,
    query_start_loc: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    null_block_id: int = NULL_BLOCK_ID,
    scratch: Mamba2Scratch | None = None,
    **knobs,
) -> None:
    """Triton twin of `reference.mamba2_replay_decode` (same arguments and effects).

    scratch: `Mamba2Scratch` for at least R rows and this window; None allocates one per
    call (tests; not for CUDA graphs). knobs override `launch_config` (readout_block_p,
    readout_warps, readout_products, flush_block_p, flush_warps, flush_programs,
    flush_products, flush_maxnreg, plan_warps, overlap, fused_max_rows, fused_block_p,
    fused_warps, dot_precision).
    """
    H, P = x.shape[1], x.shape[2]
    N = B.shape[2]
    R = state_indices.shape[0]
    num_ring_rows = ring_rows(buffer_len, window)
    plain = window == 1 and query_start_loc is None
    check_args(
        cache,
        x,
        dt,
        A,
        B,
        C,
        D,
        dt_bias,
        state_indices,
        out,
        num_ring_rows,
        query_start_loc,
        num_accepted_tokens,
    )
    if R == 0:
        return
    if scratch is None:
        scratch = Mamba2Scratch.allocate(R, H, buffer_len, x.device, window=window)
    elif not scratch.fits(R, H, buffer_len, window=window):
        raise ValueError(
            f"scratch {tuple(scratch.coef.shape)} too small for {R} rows, "
            f"{H} heads, buffer_len {buffer_len}, window {window}"
        )
    ckpt = cache.lp if cache.lp is not None else cache.hp
    cfg = resolved_config(R, H, P, N, ckpt.dtype, C.dtype, x.device, window, plain, knobs)
    common = dict(num_ring_rows=num_ring_rows, buffer_len=buffer_len)
    windows = dict(window=window, query_start_loc=query_start_loc)
    fused = not plain and cfg["fused_max_rows"] >= R
    mamba2_plan(
        cache,
        dt,
        A,
        B,
        C,
        D,
        dt_bias,
        state_indices,
        scratch,
        null_block_id=null_block_id,
        num_accepted_tokens=num_accepted_tokens,
        num_warps=cfg["plan_warps"],
        hp_list=not fused,
        **windows,
        **common,
    )
    if fused:
        mamba2_window_fused(
            cache,
            x,
            C,
            out,
            scratch,
            num_rows=R,
            null_block_id=null_block_id,
            block_p=cfg["fused_block_p"],
            num_warps=cfg["fused_warps"],
            readout_products=cfg["readout_products"],
            flush_products=cfg["flush_products"],
            dot_precision=cfg.get("dot_precision"),
            **windows,
            **common,
        )
        return
    # the flush and the readout touch different rows: run both at once
    with beside(x.device, cfg["overlap"], rows=R) as on_side:
        with on_side:
            mamba2_flush(
                cache,
                x,
                C,
                out,
                scratch,
                block_p=cfg["flush_block_p"],
                num_warps=cfg["flush_warps"],
                num_programs=cfg["flush_programs"],
                dot_precision=cfg.get("dot_precision"),
                products=cfg["flush_products"],
                maxnreg=cfg["flush_maxnreg"],
                **windows,
                **common,
            )
        mamba2_readout(
            cache,
            x,
            C,
            out,
            scratch,
            num_rows=R,
            null_block_id=null_block_id,
            block_p=cfg["readout_block_p"],
            num_warps=cfg["readout_warps"],
            products=cfg["readout_products"],
            **windows,
            **common,
        )


def check_args(
    cache, x, dt, A, B, C, D, dt_bias, state_indices, out, num_ring_rows, qsl, acc
) -> None:
    """Shapes, dtypes and devices of a decode step's arguments (see mamba2_replay_decode);
    ValueError naming the first tensor that does not fit (`args.require_tensors`)."""
    num_tokens, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    S = cache.hp.shape[0]
    R = state_indices.shape[0]
    device = x.device
    state = (S, H, P, N)
    want = (  # (name, tensor or None, shape, dtype or None for any)
        ("hp", cache.hp, state, torch.float32),
        ("lp", cache.lp, state, None),
        ("ring_dt", cache.ring_dt, (S, H, num_ring_rows), torch.float32),
        # records have the activations' dtype
        ("ring_x", cache.ring_x, (S, H, num_ring_rows, P), x.dtype),
        ("ring_B", cache.ring_B, (S, G, num_ring_rows, N), B.dtype),
        ("meta", cache.meta, (S, 8), torch.int32),
        ("dt", dt, (num_tokens, H), None),
        ("C", C, B.shape, None),
        ("A", A, (H,), None),
        ("D", D, (H,), None),
        ("dt_bias", dt_bias, (H,), None),
        ("out", out, x.shape, None),
        ("state_indices", state_indices, (R,), None),
        ("query_start_loc", qsl, (R + 1,), None),
        ("num_accepted_tokens", acc, (R,), None),
    )
    require_tensors(want, device, "x")
    require_row_contiguous(
        state_indices=state_indices, query_start_loc=qsl, num_accepted_tokens=acc
    )
    if H % G:
        raise ValueError(f"nheads={H} not divisible by ngroups={G}")
    if qsl is None and num_tokens != R:
        raise ValueError(f"{num_tokens} tokens for {R} rows without query_start_loc")
