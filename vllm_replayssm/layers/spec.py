"""Speculative decoding on one page per request: which tokens of the previous window a step
commits, derived from token positions (tensor ops only, no host synchronisation).

vLLM passes acceptance counts only on steps where some row has drafts; a row whose drafts
were rejected on the step before a draft-free step would then commit them. So a layer keeps,
per slot, the tokens before its pending window (`SpecWindows.starts`), and a step's accepted
count is the tokens before its own window (seq_len - q) minus that.
"""

from __future__ import annotations

import torch

from vllm_replayssm.kernels.common.cursor import PENDING, meta_is_valid
from vllm_replayssm.layout import ring_rows


def capturing(device: torch.device) -> bool:
    """Whether the current stream of `device` is being captured into a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class SpecWindows:
    """One layer's window starts and the commit counts derived from them."""

    def __init__(self, buffer_len: int, window: int) -> None:
        self.buffer_len = buffer_len
        self.window = window
        self._starts: torch.Tensor | None = None

    def reserve(self, num_slots: int, device: torch.device) -> None:
        """Allocate `starts` for num_slots slots (zeros) unless it has that size already;
        the layer calls this when vLLM binds its KV cache (`layers/pages.ReplayPage`)."""
        starts = self._starts
        if starts is None or starts.shape[0] != num_slots or starts.device != device:
            if capturing(device):
                raise RuntimeError(
                    "replayssm: speculative window starts allocated inside CUDA-graph capture "
                    "(their zero-fill would replay at every step); the KV-cache binding "
                    "should have sized them"
                )
            self._starts = torch.zeros(num_slots, dtype=torch.long, device=device)

    def starts(self, num_slots: int, device: torch.device) -> torch.Tensor:
        """[num_slots] int64: per slot, the tokens before its pending window. Every prefill
        chunk and decode step that writes a slot sets its entry (`starts(...)[slots] = ...`);
        `reserve`d at KV-cache binding, or here (zeros) when the slot count or device
        changes."""
        self.reserve(num_slots, device)
        return self._starts

    def acceptance(
        self, meta: torch.Tensor, slots: torch.Tensor, q: torch.Tensor, seq_lens: torch.Tensor
    ):
        """Commit counts of a speculative step's rows. meta: [S, META_LEN] cursor words;
        slots, q (tokens this step), seq_lens (request lengths after it): [R]. Returns
        (start, accepted, pending, committed), [R] int64 each; store `start` with
        `starts(...)[slots] = start` after the step."""
        window_start = self.starts(meta.shape[0], meta.device)
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
        accepted = (start - window_start[slots]).clamp(min=0)
        words = meta[slots]
        valid = meta_is_valid(words, self.buffer_len, self.window)
        pending = torch.where(valid, words[:, PENDING].long(), 0)
        return start, accepted, pending, torch.minimum(accepted, pending)
