"""Per-row index arguments of the Triton launchers (state indices, query_start_loc, accepted
counts): the kernels read row r's entry at offset r, so a strided view must not reach them.
vLLM hands out such views: under speculative decoding with FULL CUDA graphs its Mamba-2
metadata keeps decode rows' state indices in a [max_bs, 1 + k] buffer whose column 0 has
stride 1 + k. Read at offset r, row r > 0 took another row's slot (H200, 2026-12-02).
And the torch references' selection of a batch's real rows (`active_rows`)."""

from __future__ import annotations

import torch

# The kernels' per-row index pointers (parameter names). They are slices of the step's
# metadata whose start moves with the batch's composition (a spec row's slots after a
# number of other rows, an [R] count taken from a [4, R] result, ...), and Triton
# specialises a pointer on its 16-byte alignment: every new alignment is a new compile, in
# the middle of serving and outside any warm-up. The kernels load them one entry per program
# or one masked vector per block of rows, where alignment buys nothing, so the launchers
# keep them off that specialisation (`triton.jit(do_not_specialize_on_alignment=...)`;
# names a kernel does not have are ignored). Counts and strides that only depend on the
# model stay specialised.
ROW_INDEX_ARGS = (
    "state_indices_ptr",
    "slots_ptr",
    "qsl_ptr",
    "acc_ptr",
    "pending_ptr",
    "committed_ptr",
    "seq_lens_ptr",
)


def require_row_contiguous(**tensors: torch.Tensor | None) -> None:
    """Raise ValueError for a 1-D tensor of more than one entry whose stride is not 1."""
    for name, t in tensors.items():
        if t is not None and t.dim() == 1 and t.shape[0] > 1 and t.stride(0) != 1:
            raise ValueError(
                f"{name}: stride {t.stride(0)}; the kernels read row r at offset r "
                "(pass a contiguous tensor)"
            )


def active_rows(
    state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor | None,
    null_block_id: int,
    null_free: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(slots [R'] int64, their accepted counts or None) of the rows of `state_indices` [R]
    that are not the null block, or (None, None) when there are none. null_free: the caller
    vouches that none is, and the rows are taken as they are: the boolean selection reads
    the device back (on a GPU it waits for the queued work), which a caller that knows its
    rows on the host avoids."""
    if null_free:
        if not state_indices.numel():
            return None, None
        return state_indices.long(), num_accepted_tokens
    active = state_indices != null_block_id
    if not bool(active.any()):
        return None, None
    acc = None if num_accepted_tokens is None else num_accepted_tokens[active]
    return state_indices[active].long(), acc
