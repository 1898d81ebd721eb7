"""Speculative decoding on one page per request: which tokens of the previous window a step
commits, derived from token positions (tensor ops only, no host synchronisation).

vLLM passes acceptance counts only on steps where some row has drafts; a row whose drafts
were rejected on the step before a draft-free step would then commit them. So a page keeps
the tokens before its pending window (its `window_start` word, `layout._window_start_specs`),
and a step's accepted count is the tokens before its own window (seq_len - q) minus that.
Since the start travels with the page, a page that vLLM's prefix caching copies to another
block (`layers/pages.page_copy_func`, `prefix_cache.py`) still says what its next step
commits: a request that continues from a copy made at a block boundary inside a verify
window commits exactly the window's records up to that boundary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vllm_replayssm.kernels.common.cursor import PENDING, meta_is_valid
from vllm_replayssm.layers.conv import conv_context_commit
from vllm_replayssm.layers.fresh import start_fresh_rows
from vllm_replayssm.layers.pages import same_tensors
from vllm_replayssm.layout import ring_rows


def capturing(device: torch.device) -> bool:
    """Whether the current stream of `device` is being captured into a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class SpecWindows:
    """One layer's commit counts derived from positions and its pages' window starts."""

    def __init__(self, buffer_len: int, window: int) -> None:
        self.buffer_len = buffer_len
        self.window = window
        # (the tensors a fresh row zeroes, their kernel arguments) of the last GPU step:
        # the same tensors every step of a binding, and deriving the arguments anew cost
        # about 5 µs of host time per eager step and layer
        self._zero_args: tuple | None = None

    def acceptance(
        self,
        meta: torch.Tensor,
        window_start: torch.Tensor,
        slots: torch.Tensor,
        q: torch.Tensor,
        seq_lens: torch.Tensor,
    ):
        """Commit counts of a speculative step's rows. meta: [S, META_LEN] cursor words;
        window_start: [S] int64, the pages' window starts (any slot stride: a view into the
        pages, `layers/pages.window_start_view`); slots, q (tokens this step), seq_lens
        (request lengths after it): [R]. Returns (start, accepted, pending, committed), [R]
        int64 each; store `start` with `window_start[slots] = start` after the step. A page
        whose words are not valid (fresh, or garbage) has nothing pending, so whatever its
        start holds, nothing commits."""
        if meta.is_cuda:  # one launch instead of these ~15 small ops
            from vllm_replayssm.kernels.common.triton_acceptance import spec_acceptance

            return spec_acceptance(
                meta,
                window_start,
                slots,
                q,
                seq_lens,
                num_ring_rows=ring_rows(self.buffer_len, self.window),
                window=self.window,
            )
        start = seq_lens.long() - q.long()
        accepted = (start - window_start[slots.long()]).clamp(min=0)
        words = meta[slots]
        valid = meta_is_valid(words, self.buffer_len, self.window)
        pending = torch.where(valid, words[:, PENDING].long(), 0)
        return start, accepted, pending, torch.minimum(accepted, pending)

    def start_step(
        self,
        cache,
        conv_state: torch.Tensor,
        window_start: torch.Tensor,
        slots: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        *,
        stagger: bool,
        graph_safe: bool | None = None,
    ):
        """A speculative step's first work in a layer: the pages of its fresh rows reset
        (`layers/fresh.start_fresh_rows`), then the commit counts (`acceptance`), each page's
        new window start stored. cache: the layer's Mamba2ReplayCache or GDNReplayCache;
        conv_state: [S, D, M] dim-first; window_start: as `acceptance` takes it; slots,
        seq_lens: [R]; query_start_loc: [R + 1]. Returns `acceptance`'s four counts. On
        GPUs (`graph_safe`, None: on CUDA tensors) one launch does both
        (`kernels/common/triton_spec_start.py`)."""
        if graph_safe is None:
            graph_safe = cache.hp.is_cuda
        if graph_safe:
            from vllm_replayssm.kernels.common.triton_fresh import slot_zero_args
            from vllm_replayssm.kernels.common.triton_spec_start import spec_step_start

            lp = [] if cache.lp is None else [cache.lp]
            tensors = [cache.hp, *lp, conv_state]
            memo = self._zero_args
            if memo is None or not same_tensors(tensors, memo[0]):
                memo = self._zero_args = (tensors, slot_zero_args(tensors))
            return spec_step_start(
                tensors,
                cache.meta,
                window_start,
                slots,
                query_start_loc,
                seq_lens,
                buffer_len=self.buffer_len,
                window=self.window,
                stagger=stagger,
                zero_args=memo[1],
            )
        q = query_start_loc[1:] - query_start_loc[:-1]
        start_fresh_rows(
            cache,
            conv_state,
            slots,
            q,
            seq_lens,
            buffer_len=self.buffer_len,
            window=self.window,
            stagger=stagger,
            graph_safe=False,
        )
        counts = self.acceptance(cache.meta, window_start, slots, q, seq_lens)
        window_start[slots.long()] = counts[0]
        return counts

    def resume_rows(
        self,
        meta: torch.Tensor,
        window_start: torch.Tensor,
        conv_state: torch.Tensor,
        slots: torch.Tensor,
        q: torch.Tensor,
        seq_lens: torch.Tensor,
        kernel: int,
        materialise: Callable[[torch.Tensor, torch.Tensor], None],
    ) -> None:
        """Prefill rows that continue a stored page, before vLLM's prefill reads its HP and
        conv context: a chunk of a chunked prefill (nothing pending: the prefill hook left
        HP exact), or a prefix-cache hit, whose page is a copy of a cached block's, made
        after a decode step (HP, the records since its last flush, maybe a verify window
        pending, of which the tokens up to the block boundary count). Commits from
        positions as a decode step would, puts the committed conv context last
        (`conv_context_commit`) and folds the committed records into HP with
        `materialise(slots, accepted)` (which resets the cursor). meta, window_start: the
        layer's cursor words and window starts; conv_state: [S, D, M] dim-first; slots, q,
        seq_lens: [R] (q: the chunk's tokens; seq_lens: lengths after it)."""
        if slots.numel() == 0:
            return
        _, accepted, pending, committed = self.acceptance(meta, window_start, slots, q, seq_lens)
        conv_context_commit(conv_state, slots, pending, committed, kernel)
        materialise(slots, accepted)
