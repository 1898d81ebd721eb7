"""backends/mamba2.py: each row's draft count travels in a dataclass field of our Mamba-2
metadata, so that the views the layer builds with dataclasses.replace keep it."""

import dataclasses

import torch
from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadata

from vllm_replayssm.backends.mamba2 import (
    ReplayMamba2AttentionBackend,
    ReplayMamba2AttentionMetadata,
    ReplayMamba2AttentionMetadataBuilder,
)


def _stock_metadata() -> Mamba2AttentionMetadata:
    """Two decode rows with drafts, then a new one-token request with 3 placeholder drafts
    and a 5-token prompt (vLLM's Mamba-2 metadata makes both prefill rows)."""
    none = dict.fromkeys(
        (
            "num_computed_tokens_p",
            "num_accepted_tokens",
            "block_idx_last_scheduled_token",
            "block_idx_first_scheduled_token_p",
            "block_idx_last_computed_token",
            "block_idx_last_scheduled_token_prev_step",
        )
    )
    return Mamba2AttentionMetadata(
        num_prefills=2,
        num_prefill_tokens=9,
        num_decodes=2,
        num_decode_tokens=8,
        num_reqs=4,
        has_initial_states_p=torch.tensor([False, False]),
        query_start_loc_p=torch.tensor([0, 4, 9], dtype=torch.int32),
        state_indices_tensor_p=torch.tensor([5, 6], dtype=torch.int32),
        state_indices_tensor_d=torch.tensor([[3], [4]], dtype=torch.int32),
        query_start_loc_d=torch.tensor([0, 4, 8], dtype=torch.int32),
        seq_lens=torch.tensor([20, 31, 4, 5], dtype=torch.int32),
        **none,
    )


def test_extend_keeps_every_stock_field():
    md = _stock_metadata()
    drafts = torch.tensor([3, 3, 3, 0], dtype=torch.int32)
    ours = ReplayMamba2AttentionMetadata.extend(md, drafts)
    assert isinstance(ours, Mamba2AttentionMetadata)
    for f in dataclasses.fields(md):
        assert getattr(ours, f.name) is getattr(md, f.name), f.name
    assert ours.replay_num_drafts is drafts


def test_replace_keeps_the_draft_counts():
    """The layer's views (dataclasses.replace) still carry replay_num_drafts."""
    drafts = torch.tensor([3, 3, 3, 0], dtype=torch.int32)
    md = ReplayMamba2AttentionMetadata.extend(_stock_metadata(), drafts)
    view = dataclasses.replace(md, num_prefills=1, num_prefill_tokens=5)
    assert type(view) is ReplayMamba2AttentionMetadata
    assert view.replay_num_drafts is drafts and view.num_prefills == 1


def test_backend_builds_our_metadata():
    assert ReplayMamba2AttentionBackend.get_builder_cls() is ReplayMamba2AttentionMetadataBuilder
