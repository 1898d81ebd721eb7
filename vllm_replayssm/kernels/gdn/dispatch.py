"""Gated DeltaNet decode: the one op the layer calls (`gdn_decode`) and the route policy
behind it (`launch_config`).

Routes: **replay**, the ReplaySSM step: plain decode by the plan / flush / readout launches
(`decode.py`, route "replay"), speculative windows by the window step (`window.py`, launched
"fused" or "split"); on CPU tensors `reference.gdn_replay_decode`. **stock**, the stock
read + write step on the ReplaySSM page (`stock_route.py`; `reference.gdn_stock_route_decode`),
which only plain decode (one token per row) can take. `replayssm.route` picks between them:
"auto" follows the measured policy, "replay" and "stock" force one; a speculative step
always replays.

On CUDA tensors the Triton kernels run with `launch_config`'s configuration. On CPU tensors
(vLLM's CPU platform, where Triton is not launched) the torch references run; there "auto"
replays, since the policy was measured on GPUs only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vllm_replayssm.config import ROUTES
from vllm_replayssm.kernels.gdn import reference
from vllm_replayssm.layout import NULL_BLOCK_ID, GDNReplayCache

if TYPE_CHECKING:  # Triton modules are imported only where kernels run (GPUs)
    from vllm_replayssm.kernels.gdn.plan import GDNScratch


# Plain decode of up to this many rows takes the stock route, above it the plan / flush /
# readout replay launches: the crossover measured on the H200 at the Qwen3.5-122B geometry
# (`kernels-h200-20261201-a93cdcf-gdn-route.json`). With an LP copy replay reads half the
# bytes and wins from 8 rows (18.1 vs 19.9 µs; at 6 rows 16.6 vs 15.5); HP only it wins
# from 16 (33.8 vs 36.1; at 12 rows 28.6 vs 27.9).
STOCK_ROUTE_MAX_ROWS = 6
STOCK_ROUTE_MAX_ROWS_HP_ONLY = 12
# The window step's one launch ("fused") up to this many rows, the split route above. On the
# H100 at T = 4 (122B geometry, µs per step and layer, fused / split, HP only and bf16 LP;
# `kernels-h100-20261205-3997590-gdn-window4-small-bs-fused-split.json`): bs 1 14.0 / 16.9,
# 17.2 / 18.3; bs 8 64.9 / 41.2, 75.2 / 39.4; bs 16 124.5 / 67.9, 147.0 / 63.6 (vLLM's
# kernel 15.8, 68.8, 129.9). At bs 2 / 4 (`…-cf5baf2-gdn-window4-bs1-4-fused-split.json`):
# HP only 18.2 / 21.4 and 34.1 / 28.5, bf16 LP 21.1 / 20.9 and 39.5 / 26.3 (vLLM 22.1, 39.5).
# So HP only (twice the checkpoint bytes per row, as for the stock route) runs fused one row
# further. At bs 3 split wins both (`…-8180839-gdn-window4-bs2-3-fused-split.json`: HP only
# 32.0 / 24.2, bf16 LP 37.4 / 24.2; bs 2 repeated: 18.0 / 20.1, 21.0 / 20.7).
FUSED_ROUTE_MAX_ROWS = 1
FUSED_ROUTE_MAX_ROWS_HP_ONLY = 2
KERNEL_ROUTES = ("replay", "stock", "fused", "split")


def launch_config(
    num_rows: int, plain: bool = True, has_lp: bool = True, bf16_keys: bool = True
) -> dict:
    """The launch configuration of a step of `num_rows` rows (keys: route, then the chosen
    launcher's arguments; "replay" takes `decode.launch_config`'s knobs). has_lp: the
    layer keeps an LP copy; bf16_keys: its k records are bf16 (bf16 activations).

    Plain decode: the stock route up to STOCK_ROUTE_MAX_ROWS rows (HP only:
    STOCK_ROUTE_MAX_ROWS_HP_ONLY), the replay launches above.
    The stock route's 16-row value tile is the one every engine run so far used: 8-row
    tiles were 5% faster at bs 1 and 1% slower at bs 32
    (`kernels-h200-20261129-22b7412-stock-route-bs1-32.json`).

    Speculative decode (which the stock route cannot do): the window step, one warp per
    program, fused up to FUSED_ROUTE_MAX_ROWS rows (HP only: FUSED_ROUTE_MAX_ROWS_HP_ONLY;
    16-row value tiles; up to 16 rows until the H100 A/B of 3997590 put split 1.6-2.3x ahead
    at 8 and 16), else split (plan, flush,
    the planned readout on 16-row value tiles, several per program), one value head per
    flush program.
    With bf16 keys, split steps fold flush rows in WY form (bf16x3) and take the readout's
    LP products in bf16 (readout_precision bf16x2); fused steps fold in WY form HP only.
    Measured on the H200 at T = 4 against vLLM's kernel
    (Qwen3.5-122B; `kernels-h200-20261202-{29d3230-gdn-window4-wy-flush,
    9a2bfab-gdn-window4-knobs,9a2bfab-gdn-window4-fused,7511bec-gdn-window4-readout-tiles}.json`):
    - the WY flush: bs 256 HP only 1,124 -> 754 µs (vLLM 1,588); bf16 LP unchanged (the
      recomputed d cost what the serial fold saved); fused bs 8 / 16 HP only 0.78x -> 0.92x,
      0.75x -> 0.90x, but bf16 LP 0.79x -> 0.69x, 0.75x -> 0.67x;
    - the bf16 readout products: bf16 LP bs 256 1,074 -> 1,046 µs, bs 64 284 -> 276;
    - the plan's fold inverses (flush_inverse, since removed): slower (1,046 -> 1,083);
    - readout tiles at bs 256: 32 rows on one warp 974 µs bf16 LP, 752 HP only (16 rows:
      1,024, 770; two warps slower);
    - several value tiles per readout program in a pipelined loop (readout_tiles 0:
      `blocks.auto_readout_tiles`; readout_stages 2), bf16 LP bs 256, 16-row tiles
      (`kernels-h200-20261203-fd24f4f-gdn-window4-readout-loop{,32}.json`): 122B 982 ->
      879 µs at 8 tiles (4 tiles: 904; 3 stages slower than 2), 4B 531 -> 485; with
      32-row tiles (4B, flush_readout on: since removed) 4 tiles and 2 stages 634 -> 588
      bf16 LP, 451 -> 430 HP only; in the loop 16-row tiles beat 32-row ones (255 registers at 32
      rows): bs 256 bf16 LP 122B 879 against 891 µs, 4B 485 against 499
      (`…-3648482-gdn-window4-defaults.json`: 32-row tiles, loop against none, bs 64 / 256,
      HP only 1.73-2.21x, bf16 LP 1.40-1.76x of vLLM's kernel);
    - the flush launches at num_stages 1 (flush_stages; Triton's default 3 pipelines the WY
      fold's loops into 33 KiB of shared memory per program), bs 256 bf16 LP
      (`…-e262e85-gdn-window4-flush-stages-solve.json`): 4B 478 -> 450 µs (1.78x vLLM's
      800), 122B 869 -> 817 (1.95x of 1,590). The plan solving the window substitution into
      matrices applied by products (tried at e262e85) was slower (4B 450 -> 465, 122B 817
      -> 845: 228 registers against 168) and is gone;
    - one value head per flush program instead of a key head's v_per_k from 64 rows
      (`…-fb7f13d-gdn-window4-heads.json`; the four-head program spilled 256 B at 255
      registers): bs 256 bf16 LP 122B 815.9 -> 783.3 µs (2.03x vLLM's 1,586.8), 4B 449.9
      -> 420.6 (1.90x of 800.5), HP only 681.1 -> 677.8 and 381.6 -> 365.0; bs 64 bf16 LP
      122B 230.2 -> 205.3, 4B 131.4 -> 115.3 (two heads per program: slower than both);
    - with an LP copy the readout reads a flush row's fresh LP copy instead of its folded HP
      (flush_rows_read "lp": LP rounding, as every other row; half of HP's bytes), bf16 LP
      (`…-5c6c531-gdn-window4-flush-rows-read.json`): bs 256 122B 775.1 -> 739.7 µs (2.13x
      vLLM's 1,572.8), 4B 417.5 -> 395.3 (2.00x of 791.6); bs 64 122B 204.3 -> 191.9, 4B
      113.5 -> 108.4;
    - on the H100 (`kernels-h100-20261205-37e4032-gdn-window4-lp-only-flush-list-overlap.json`,
      `…-flush-programs-keys.json`), bf16 LP: the readout built without its HP branch (stale
      LP refreshed by the flush launch) and the flush launch over the plan's row list, at bs
      256 4B 431.1 -> 366.2 µs (2.26x -> 2.67x of vLLM's 976.2), 122B 806.2 -> 663.5 (2.42x
      -> 2.94x of 1,948.5); bs 64 4B 118.6 -> 106.3, 122B 209.6 -> 182.2. Alone, at bs 256
      4B, the first gave 413.8 µs and the second 395.9. Running the flush on a side stream
      beside the readout of the rows it leaves alone (since removed) was slower (4B 366 ->
      475 µs, 122B 664 -> 845); so were four flush programs per SM instead of eight. The LP
      tile's product with the keys' two larger bf16 parts (16 bits) instead of three, bs
      256: 4B 364.1 -> 356.1, 122B 665.8 -> 647.8 (2.74x, 3.01x)."""
    if plain:
        limit = STOCK_ROUTE_MAX_ROWS if has_lp else STOCK_ROUTE_MAX_ROWS_HP_ONLY
        return _route_config("stock" if num_rows <= limit else "replay")
    limit = FUSED_ROUTE_MAX_ROWS if has_lp else FUSED_ROUTE_MAX_ROWS_HP_ONLY
    route = "fused" if num_rows <= limit else "split"
    return _route_config(route, has_lp=has_lp, bf16_keys=bf16_keys)


def _route_config(route: str, *, has_lp: bool = True, bf16_keys: bool = True) -> dict:
    """The base configuration of one kernel route (`launch_config` gives the measurements)."""
    if route == "stock":
        return dict(route="stock", block_v=16, num_warps=1)
    if route == "replay":
        return dict(route="replay")
    if route not in KERNEL_ROUTES:
        raise ValueError(f"launch route must be one of {list(KERNEL_ROUTES)}, got {route!r}")
    cfg = dict(route=route, block_v=16, num_warps=1)
    if route == "fused":  # one value head per program, its head loop unpipelined
        cfg.update(heads_per_program=1, num_stages=1)
    if route == "split":  # the planned readout's pipelined tile loop; the flush unpipelined
        cfg.update(readout_tiles=0, readout_stages=2, flush_stages=1)
    if route == "split" and has_lp:
        cfg.update(flush_rows_read="lp")
    if bf16_keys and (route == "split" or not has_lp):  # exact bf16 products: bf16 keys
        cfg.update(flush_precision="bf16x3")
    if bf16_keys and route == "split":  # 16-bit keys: the LP tile's rounding dominates
        cfg.update(readout_precision="bf16x2")
    return cfg


def plan_launch(
    route: str,
    num_rows: int,
    plain: bool,
    launch: dict | None = None,
    *,
    has_lp: bool = True,
    bf16_keys: bool = True,
) -> dict:
    """The launch configuration of a Triton step: `launch_config` for `route` ("auto",
    "replay" or "stock"; a step that is not plain replays whatever the route), then the
    entries of `launch` (benchmarks, tests) over it. A `launch` route other than the chosen
    one ("replay", "stock", or the window step's "fused" / "split") starts from that
    route's configuration."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {list(ROUTES)}, got {route!r}")
    cfg = launch_config(num_rows, plain=plain, has_lp=has_lp, bf16_keys=bf16_keys)
    keys = dict(has_lp=has_lp, bf16_keys=bf16_keys)
    if plain and route != "auto":
        cfg = _route_config(route, **keys)
    forced = (launch or {}).get("route", cfg["route"])
    if forced != cfg["route"]:
        cfg = _route_config(forced, **keys)
    cfg.update(launch or {})
    if cfg["route"] in ("stock", "replay") and not plain:
        raise ValueError(f"the {cfg['route']} route is for plain decode (one token per row)")
    return cfg


def chosen_route(route: str, num_rows: int, plain: bool, *, has_lp: bool = True) -> str:
    """The route a step takes on GPUs: "stock" or "replay" (the window step counts as
    replay). Benchmarks and the layer's counters report it."""
    kernel_route = plan_launch(route, num_rows, plain, has_lp=has_lp)["route"]
    return "stock" if kernel_route == "stock" else "replay"


def gdn_decode(
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
    stagger: bool,
    route: str = "auto",
    query_start_loc: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    null_block_id: int = NULL_BLOCK_ID,
    launch: dict | None = None,
    scratch: GDNScratch | None = None,
) -> str:
    """One GDN decode step of a layer, on the route `route` picks (module docstring);
    returns the route it took, "replay" (the window step included) or "stock".

    Arguments and effects as in `reference.gdn_replay_decode` (cache: the layer's paged
    tensors, updated in place; q, k: [num_tokens, Hk, K]; v: [num_tokens, Hv, V]; a, b:
    [num_tokens, Hv]; A_log, dt_bias: [Hv]; state_indices: [R]; out: [num_tokens, Hv, V],
    written). stagger: the cursor reset of a stock-route step staggers the next flush.
    query_start_loc / num_accepted_tokens: a speculative step (None, None: plain decode).
    launch: overrides of the launch configuration (CUDA tensors only; see `plan_launch`).
    scratch: `GDNScratch` for >= R rows (the replay launches of plain decode on CUDA;
    required under CUDA graphs, None allocates one per call).
    """
    plain = query_start_loc is None and num_accepted_tokens is None
    common = dict(scale=scale, buffer_len=buffer_len, window=window, null_block_id=null_block_id)
    args = (cache, q, k, v, a, b, A_log, dt_bias, state_indices, out)
    if not v.is_cuda:
        if route not in ROUTES:
            raise ValueError(f"route must be one of {list(ROUTES)}, got {route!r}")
        if launch:
            raise ValueError("launch overrides configure the Triton kernels (CUDA tensors)")
        if route == "stock" and plain:
            reference.gdn_stock_route_decode(*args, stagger=stagger, **common)
            return "stock"
        reference.gdn_replay_decode(
            *args,
            query_start_loc=query_start_loc,
            num_accepted_tokens=num_accepted_tokens,
            **common,
        )
        return "replay"
    # Triton only on GPUs: importing the kernels defines their JIT functions.
    from vllm_replayssm.kernels.gdn.decode import gdn_replay_decode
    from vllm_replayssm.kernels.gdn.stock_route import gdn_stock_route_decode
    from vllm_replayssm.kernels.gdn.window import gdn_window_decode

    cfg = plan_launch(
        route,
        state_indices.shape[0],
        plain,
        launch,
        has_lp=cache.lp is not None,
        bf16_keys=k.dtype == torch.bfloat16,
    )
    kernel_route = cfg.pop("route")
    if kernel_route == "stock":
        gdn_stock_route_decode(*args, stagger=stagger, **common, **cfg)
        return "stock"
    if kernel_route == "replay":
        gdn_replay_decode(*args, scratch=scratch, **common, **cfg)
    else:
        gdn_window_decode(
            *args,
            query_start_loc=query_start_loc,
            num_accepted_tokens=num_accepted_tokens,
            route=kernel_route,
            **common,
            **cfg,
        )
    return "replay"
