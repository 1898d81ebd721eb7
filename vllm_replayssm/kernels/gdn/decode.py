"""The Gated DeltaNet replay route in Triton: one decode step of one layer for a batch of rows.

Plain decode (one token per row, window 1) runs three launches that share caller-owned
scratch (`plan.GDNScratch`):
1. `plan.py`: cursor words -> dense plan rows; per (row, key head) the normalised k_t and
   q_t and their products with the ring's keys, per (row, value head) the readout
   coefficients; g, β and k records appended; the list of rows that read HP;
2. `flush.py`: persistent over that list: flush rows fold their records into HP (HP read
   once, HP and LP written) and read out; stale-LP rows read out from HP;
3. `readout.py`: every other row, one ~8 KiB checkpoint tile per program, LP (or HP when LP
   is off) + history; stores the d and v records and the cursor words.
2 and 3 touch different rows; with `overlap` the flush runs on a side stream beside the
readout. Speculative windows (T = 1 + k) run the window step (`window.py`).

No host synchronisation, no allocation when scratch is given, launch shapes fixed by the
batch: safe in CUDA graphs. Semantics: `reference.gdn_replay_decode`.
"""

from __future__ import annotations

import functools

import torch

from vllm_replayssm.kernels.common.blocks import cdiv, next_pow2, pow2_block
from vllm_replayssm.kernels.common.streams import beside, num_sms
from vllm_replayssm.kernels.gdn.flush import gdn_flush, recomputes_d
from vllm_replayssm.kernels.gdn.plan import GDNScratch, gdn_plan
from vllm_replayssm.kernels.gdn.readout import gdn_readout
from vllm_replayssm.kernels.gdn.window import check_args, gdn_window_decode
from vllm_replayssm.layout import NULL_BLOCK_ID, GDNReplayCache, ring_rows

TILE_BYTES = 8192  # checkpoint bytes per readout program


def launch_config(
    num_rows: int,
    num_v_heads: int,
    head_v_dim: int,
    head_k_dim: int,
    ckpt_itemsize: int,
    device: torch.device,
    recompute_d: bool,
) -> dict:
    """Launch knobs of the plain-decode launches (measured on the H200, Qwen3.5-122B bs 256:
    `benchmarks/results/kernels-h200-20261201-5721ade-gdn-*.json`). recompute_d: whether
    the flush recomputes the corrected values from HP (`flush.recomputes_d` of the cache and
    the flush_recompute knob); it picks the flush's warps and grid.

    readout: block_v rows of the checkpoint per tile (TILE_BYTES of them: 16 x 128 fp32,
    32 x 128 bf16/fp16), one warp (no cross-warp reductions), readout_tiles tiles of one key
    head per program (0: `blocks.auto_readout_tiles`, at most `readout.MAX_TILES`) in a loop
    that is not pipelined. At bs 256 four tiles per program against one: 122B bf16 LP
    255.4 -> 240.6 µs (2.19x vLLM's 527.8), HP only 340.6 -> 330.3 (1.60x); 4B 140.3 ->
    135.3 (1.98x of 267.8), 181.6 -> 177.4 (1.51x)
    (`kernels-h200-20261203-fa40548-gdn-plain-readout-loop{,-bs32-64}.json`; at bs 32 / 64
    two to four tiles gain 1-4%). Measured slower and removed (8a5bb61, 122B bs 256, four
    tiles): the loop pipelined (readout_stages 2), bf16 LP 296.6 against 240.7 µs, HP only
    409.6 against 323.2; the LP tile's S0·k̂, S0·q̂ as one tensor-core product
    (readout_s0_dot) 322.8; both despite fewer registers (kernels README).
    flush: 16-row value tiles,
    one warp per program, a persistent grid of four programs per SM (8 in the interpreter;
    a flush that sums the cached d: two two-warp programs per SM, below),
    on a side stream beside the readout (GPU): the flush is a chain of dependent steps per
    tile (HP load, three products, a substitution, stores), so many small programs hide its
    latency better than 64-row tiles on four warps, two per SM (bf16 LP 260 vs 281 µs per
    step and layer; 2 or 8 per SM: 296, 269). flush_recompute None: the corrected values
    are recomputed from HP where an LP copy exists and summed from the cached d without one
    (`flush.gdn_flush`'s recompute; HP only 332 µs against 350 recomputing). Fold inverses
    (the fold's (I + A)⁻¹ applied as one product instead of each value tile substituting)
    measured slower in both forms tried and were removed: stored by the plan per (flush
    row, value head), they moved the work onto the critical path (122B bf16 LP, eager:
    flush 129.5 -> 118.7 µs, plan 12.3 -> 28.3; step in a graph 259.8 -> 274.5 µs,
    `kernels-h200-20261202-a8e3f00-gdn-fold-inverse.json`); formed by the flush once per
    head, 259.8 against 240.3 µs (`kernels-h200-20261203-c93eed3-gdn-plain-head-inverse.json`)."""
    block_v = TILE_BYTES // (pow2_block(head_k_dim) * ckpt_itemsize)
    block_v = max(8, min(block_v, next_pow2(head_v_dim)))
    flush_v = 16  # the dot products' smallest tile
    # The flush that sums the cached d (HP only by default) takes 129 registers on two
    # warps instead of 203 on one, leaving the readout beside it more of each SM (HP only,
    # two two-warp programs per SM against four one-warp ones: 122B bs 256 322.6 against
    # 329.3 µs, 4B 173.7 against 178.1, 122B bs 64 92.8 against 94.3, 4B bs 64 53.3
    # against 53.1; `kernels-h200-20261204-00d51e1-gdn-hp-only-flush-warps-bs{256,64}.json`,
    # 1 / 2 / 4 warps x 132 / 264 / 528 programs); the flush that recomputes d from HP
    # (with an LP copy by default) takes 255 registers on any warp count and stays on one.
    # recompute_d (`flush.recomputes_d`) keys the choice, not the checkpoint's width, so a
    # forced flush_recompute gets the grid measured for its flush.
    flush_warps = 1 if recompute_d else 2
    if device.type == "cuda":
        programs = (4 if recompute_d else 2) * num_sms(device)
    else:
        programs = 8
    flush_items = num_rows * num_v_heads * cdiv(head_v_dim, flush_v)
    return dict(
        readout_block_v=block_v,
        readout_warps=1,
        readout_tiles=0,
        flush_block_v=flush_v,
        flush_warps=flush_warps,
        flush_programs=min(programs, flush_items),
        plan_warps=1,
        overlap=device.type == "cuda",
        flush_recompute=None,
    )


@functools.lru_cache(maxsize=512)
def _default_config(num_rows, num_v_heads, head_v_dim, head_k_dim, itemsize, device, recompute):
    """`launch_config`, memoised (read only: a step without knobs takes it as it is): an eager
    step (a PIECEWISE CUDA-graph step runs the SSM layers eagerly) asks in every layer."""
    return launch_config(
        num_rows, num_v_heads, head_v_dim, head_k_dim, itemsize, device, recompute_d=recompute
    )


def gdn_replay_decode(
    cache: GDNReplayCache,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    buffer_len: int,
    window: int,
    query_start_loc: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    null_block_id: int = NULL_BLOCK_ID,
    scratch: GDNScratch | None = None,
    **knobs,
) -> None:
    """Triton twin of `reference.gdn_replay_decode` (same arguments and effects).

    scratch: `GDNScratch` for at least R rows (plain decode); None allocates one per call
    (tests; not for CUDA graphs). knobs override `launch_config` (plain decode:
    readout_block_v, readout_warps, readout_tiles, flush_block_v, flush_warps,
    flush_programs, plan_warps, overlap, flush_recompute, dot_precision) or set the window
    step's (speculative: route, block_v, num_warps, heads_per_program, num_stages).
    """
    Hk, K = k.shape[1], k.shape[2]
    Hv, V = v.shape[1], v.shape[2]
    R = state_indices.shape[0]
    plain = window == 1 and query_start_loc is None and num_accepted_tokens is None
    if not plain:
        gdn_window_decode(
            cache,
            q,
            k,
            v,
            a,
            b,
            A_log,
            dt_bias,
            state_indices,
            out,
            scale=scale,
            buffer_len=buffer_len,
            window=window,
            query_start_loc=query_start_loc,
            num_accepted_tokens=num_accepted_tokens,
            null_block_id=null_block_id,
            **knobs,
        )
        return
    num_ring_rows = ring_rows(buffer_len, window)
    check_args(
        cache, q, k, v, a, b, A_log, dt_bias, state_indices, out, num_ring_rows, None, None, R
    )
    if R == 0:
        return
    ckpt = cache.lp if cache.lp is not None else cache.hp
    recompute = recomputes_d(cache, knobs.get("flush_recompute"))
    cfg = _default_config(R, Hv, V, K, ckpt.element_size(), v.device, recompute)
    if knobs:
        cfg = dict(cfg)
        unknown = set(knobs) - set(cfg) - {"dot_precision"}
        if unknown:
            raise ValueError(f"unknown plain-decode knobs {sorted(unknown)}")
        cfg.update(knobs)
    common = dict(num_ring_rows=num_ring_rows, buffer_len=buffer_len)
    if scratch is None:
        scratch = GDNScratch.allocate(R, Hv, Hk, K, buffer_len, v.device)
    elif not scratch.fits(R, Hv, Hk, K, buffer_len):
        raise ValueError(
            f"scratch {tuple(scratch.coef.shape)} / {tuple(scratch.kq.shape)} does not fit "
            f"{R} rows, {Hv} value and {Hk} key heads of dim {K}, buffer_len {buffer_len}"
        )
    gdn_plan(
        cache,
        q,
        k,
        a,
        b,
        A_log,
        dt_bias,
        state_indices,
        scratch,
        scale=scale,
        null_block_id=null_block_id,
        num_warps=cfg["plan_warps"],
        **common,
    )
    # the flush and the readout touch different rows: run both at once
    with beside(v.device, cfg["overlap"], rows=R) as on_side:
        with on_side:
            gdn_flush(
                cache,
                v,
                out,
                scratch,
                block_v=cfg["flush_block_v"],
                num_warps=cfg["flush_warps"],
                num_programs=cfg["flush_programs"],
                dot_precision=cfg.get("dot_precision"),
                recompute=recompute,
                **common,
            )
        gdn_readout(
            cache,
            v,
            out,
            scratch,
            null_block_id=null_block_id,
            block_v=cfg["readout_block_v"],
            num_warps=cfg["readout_warps"],
            readout_tiles=cfg["readout_tiles"],
            **common,
        )
