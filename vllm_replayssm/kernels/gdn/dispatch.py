"""Gated DeltaNet decode: the one op the layer calls (`gdn_decode`) and the route policy
behind it (`launch_config`).

Routes: **replay**, the ReplaySSM step (`decode.py`, launched "fused" or "split"; on CPU
tensors `reference.gdn_replay_decode`), and **stock**, the stock read + write step on the
ReplaySSM page (`stock_route.py`; `reference.gdn_stock_route_decode`), which only plain decode
(one token per row) can take. `replayssm.route` picks between them: "auto" follows the
measured policy, "replay" and "stock" force one; a speculative step always replays.

On CUDA tensors the Triton kernels run with `launch_config`'s configuration. On CPU tensors
(vLLM's CPU platform, where Triton is not launched) the torch references run; there "auto"
replays, since the policy was measured on GPUs only.
"""

from __future__ import annotations

import torch

from vllm_replayssm.config import ROUTES
from vllm_replayssm.kernels.gdn import reference
from vllm_replayssm.layout import NULL_BLOCK_ID, GDNReplayCache


def launch_config(num_rows: int, v_per_k: int, plain: bool = True) -> dict:
    """The measured launch configuration of a step of `num_rows` rows, from the H200 sweeps
    in benchmarks/results/ (keys: route, then the chosen launcher's arguments).

    Plain decode takes the stock route at every batch size: the GDN replay kernels lost to
    vLLM's decode kernel at bs 1, 32 and 256 (0.72x / 0.46x / 0.93x on Qwen3.5-122B), the
    stock route ran at 1.42x / 1.03x of it at bs 1 / 32. Its 16-row value tile is the one
    every engine run so far used: 8-row tiles were 5% faster at bs 1 and 1% slower at bs 32
    (`kernels-h200-20261129-22b7412-stock-route-bs1-32.json`). Speculative decode (which the
    stock route cannot do): one warp per program, 16-row value tiles, fused up to 16 rows,
    else flush + readout with all value heads of a key head per program from 64 rows."""
    if plain:
        return dict(route="stock", block_v=16, num_warps=1)
    if num_rows <= 16:
        return dict(route="fused", block_v=16, num_warps=1, heads_per_program=1, num_stages=1)
    return dict(
        route="split",
        block_v=16,
        num_warps=1,
        heads_per_program=v_per_k if num_rows >= 64 else 1,
        num_stages=1,
    )


def plan_launch(
    route: str, num_rows: int, v_per_k: int, plain: bool, launch: dict | None = None
) -> dict:
    """The launch configuration of a Triton step: `launch_config` for `route` ("auto",
    "replay" or "stock"; a step that is not plain replays whatever the route), then the
    entries of `launch` (benchmarks, tests) over it. A `launch` route of another kind than
    the chosen one ("stock" vs "fused" / "split") starts from that kind's configuration."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {list(ROUTES)}, got {route!r}")
    cfg = launch_config(num_rows, v_per_k, plain=plain and route != "replay")
    forced = (launch or {}).get("route", cfg["route"])
    if (forced == "stock") != (cfg["route"] == "stock"):
        cfg = launch_config(num_rows, v_per_k, plain=forced == "stock")
    cfg.update(launch or {})
    if cfg["route"] == "stock" and not plain:
        raise ValueError("the stock route is for plain decode (one token per row)")
    return cfg


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
) -> None:
    """One GDN decode step of a layer, on the route `route` picks (module docstring).

    Arguments and effects as in `reference.gdn_replay_decode` (cache: the layer's paged
    tensors, updated in place; q, k: [num_tokens, Hk, K]; v: [num_tokens, Hv, V]; a, b:
    [num_tokens, Hv]; A_log, dt_bias: [Hv]; state_indices: [R]; out: [num_tokens, Hv, V],
    written). stagger: the cursor reset of a stock-route step staggers the next flush.
    query_start_loc / num_accepted_tokens: a speculative step (None, None: plain decode).
    launch: overrides of the launch configuration (CUDA tensors only; see `plan_launch`).
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
        else:
            reference.gdn_replay_decode(
                *args,
                query_start_loc=query_start_loc,
                num_accepted_tokens=num_accepted_tokens,
                **common,
            )
        return
    # Triton only on GPUs: importing the kernels defines their JIT functions.
    from vllm_replayssm.kernels.gdn.decode import gdn_replay_decode
    from vllm_replayssm.kernels.gdn.stock_route import gdn_stock_route_decode

    cfg = plan_launch(route, state_indices.shape[0], v.shape[1] // k.shape[1], plain, launch)
    kernel_route = cfg.pop("route")
    if kernel_route == "stock":
        gdn_stock_route_decode(*args, stagger=stagger, **common, **cfg)
    else:
        gdn_replay_decode(
            *args,
            query_start_loc=query_start_loc,
            num_accepted_tokens=num_accepted_tokens,
            route=kernel_route,
            **common,
            **cfg,
        )
