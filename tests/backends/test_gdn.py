"""backends/gdn.py: the request lengths travel in a dataclass field of our GDN metadata, so
that the views the layer builds with dataclasses.replace keep them."""

import dataclasses

import torch
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

from vllm_replayssm.backends.gdn import (
    ReplayGDNAttentionBackend,
    ReplayGDNAttentionMetadata,
    ReplayGDNAttentionMetadataBuilder,
)


def _stock_metadata() -> GDNAttentionMetadata:
    return GDNAttentionMetadata(
        num_prefills=1,
        num_prefill_tokens=5,
        num_decodes=2,
        num_decode_tokens=2,
        num_spec_decodes=0,
        num_spec_decode_tokens=0,
        num_actual_tokens=7,
        has_initial_state=torch.tensor([True, True, False]),
        non_spec_query_start_loc=torch.tensor([0, 1, 2, 7], dtype=torch.int32),
        non_spec_state_indices_tensor=torch.tensor([3, 4, 5], dtype=torch.int32),
    )


def test_extend_keeps_every_stock_field():
    md = _stock_metadata()
    seq_lens = torch.tensor([9, 12, 5], dtype=torch.int32)
    ours = ReplayGDNAttentionMetadata.extend(md, seq_lens)
    assert isinstance(ours, GDNAttentionMetadata)
    for f in dataclasses.fields(md):
        assert getattr(ours, f.name) is getattr(md, f.name), f.name
    assert ours.replay_seq_lens is seq_lens


def test_replace_keeps_the_request_lengths():
    """The layer's prefill-only view (dataclasses.replace) still carries replay_seq_lens:
    an attribute set on vLLM's instance would be dropped here."""
    seq_lens = torch.tensor([9, 12, 5], dtype=torch.int32)
    md = ReplayGDNAttentionMetadata.extend(_stock_metadata(), seq_lens)
    view = dataclasses.replace(md, num_decodes=0, num_decode_tokens=0, num_actual_tokens=5)
    assert type(view) is ReplayGDNAttentionMetadata
    assert view.replay_seq_lens is seq_lens and view.num_actual_tokens == 5


def test_backend_builds_our_metadata():
    assert ReplayGDNAttentionBackend.get_builder_cls() is ReplayGDNAttentionMetadataBuilder
