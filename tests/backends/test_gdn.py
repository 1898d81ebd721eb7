"""backends/gdn.py: the request lengths and the host-side split of speculative steps travel
in dataclass fields of our GDN metadata, so that the views the layer builds with
dataclasses.replace keep them."""

import dataclasses

import torch
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata, GDNAttentionMetadataBuilder

from vllm_replayssm.backends.gdn import (
    ReplayGDNAttentionBackend,
    ReplayGDNAttentionMetadata,
    ReplayGDNAttentionMetadataBuilder,
    plain_prefill_view,
    spec_split,
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


def test_plain_prefill_view_keeps_the_prefill_rows():
    """A plain step of two decode rows and two prefill chunks (5 and 9 tokens): the view
    that vLLM's prefill path reads is the prefill rows' alone, the conv's chunk metadata
    included (vLLM built it over every row: its first programs would read the decode
    rows' tokens)."""
    md = dataclasses.replace(
        _stock_metadata(),
        num_prefills=2,
        num_prefill_tokens=14,
        num_actual_tokens=16,
        has_initial_state=torch.tensor([True, True, False, True]),
        non_spec_query_start_loc=torch.tensor([0, 1, 2, 7, 16], dtype=torch.int32),
        non_spec_state_indices_tensor=torch.tensor([3, 4, 5, 6], dtype=torch.int32),
        prefill_query_start_loc=torch.tensor([0, 5, 14], dtype=torch.int32),
        prefill_state_indices=torch.tensor([5, 6], dtype=torch.int32),
        prefill_has_initial_state=torch.tensor([False, True]),
    )
    view = plain_prefill_view(md, torch.tensor([0, 1, 2, 7, 16], dtype=torch.int32))
    assert (view.num_decodes, view.num_decode_tokens) == (0, 0)
    assert (view.num_prefills, view.num_prefill_tokens, view.num_actual_tokens) == (2, 14, 14)
    assert view.non_spec_query_start_loc.tolist() == [0, 5, 14]
    assert view.non_spec_state_indices_tensor.tolist() == [5, 6]
    assert view.has_initial_state.tolist() == [False, True]
    # the conv's programs (8 tokens each): one for the first chunk, two for the second
    assert view.nums_dict[8]["nums"].tolist() == [1, 2]
    assert view.batch_ptr[:3].tolist() == [0, 1, 1]
    assert view.token_chunk_offset_ptr[:3].tolist() == [0, 0, 1]
    assert md.non_spec_query_start_loc.tolist() == [0, 1, 2, 7, 16]  # md itself unchanged


def test_backend_builds_our_metadata():
    assert ReplayGDNAttentionBackend.get_builder_cls() is ReplayGDNAttentionMetadataBuilder


def _split(q, seq_lens, has_drafts):
    qsl = torch.zeros(len(q) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q), 0)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    mask = None if has_drafts is None else torch.tensor(has_drafts)
    return spec_split(lens, qsl, lens.clone(), mask)


def test_spec_split_of_a_mixed_step():
    """Rows with drafts (4 tokens), one-token continuations, a new one-token request (no
    state: a prefill row) and a prompt chunk: the lengths are gathered per kind in batch
    order and the leading continuations counted, from CPU tensors alone."""
    split = _split(
        q=[4, 1, 4, 1, 1, 7],
        seq_lens=[20, 31, 12, 9, 1, 7],
        has_drafts=[True, False, True, False, False, False],
    )
    assert split.spec_seq_lens.tolist() == [20, 12]
    assert split.non_spec_seq_lens.tolist() == [31, 9, 1, 7]
    assert split.num_decode_rows == 2 and split.decode_rows_lead
    # the prefill chunks: the new one-token request (no state) and the prompt chunk
    assert split.prefill_query_start_loc_cpu.tolist() == [0, 1, 8]
    assert split.prefill_init_rows.tolist() == []


def test_spec_split_of_prefill_chunks_with_a_state_and_padding():
    """A continued prompt chunk (a stored state), a first chunk, then zero-length padding
    rows, which count as neither."""
    split = _split(q=[1, 5, 3, 0, 0], seq_lens=[12, 21, 3, 0, 0], has_drafts=None)
    assert split.num_decode_rows == 1
    assert split.prefill_query_start_loc_cpu.tolist() == [0, 5, 8]
    assert split.prefill_init_rows.tolist() == [0]


def test_spec_split_without_drafts_and_with_drafts_only():
    split = _split(q=[1, 1, 5], seq_lens=[8, 3, 5], has_drafts=None)
    assert split.spec_seq_lens is None
    assert split.non_spec_seq_lens.tolist() == [8, 3, 5]
    assert split.num_decode_rows == 2
    assert _split(q=[4, 4], seq_lens=[9, 10], has_drafts=[True, True]) is None


def test_spec_split_flags_a_continuation_after_a_prefill_chunk():
    split = _split(q=[1, 6, 1], seq_lens=[5, 6, 9], has_drafts=None)
    assert split.num_decode_rows == 1 and not split.decode_rows_lead


def test_builder_passes_the_counts_by_name():
    """vLLM's capture path calls build(0, m, accepted, drafts) by position; ours names
    them for vLLM's build (a *args passthrough lost the drafts for our split)."""
    import inspect

    params = list(inspect.signature(ReplayGDNAttentionMetadataBuilder.build).parameters)
    stock = list(inspect.signature(GDNAttentionMetadataBuilder.build).parameters)
    assert params == stock


def test_plain_build_chooses_the_resumed_prefill_rows_on_the_host(monkeypatch):
    """A plain step with prefill rows carries which of them continue a stored state
    (positions among the prefill rows, after the decode rows), chosen on the host, where
    prefix caching is on (without it the layer folds nothing); a speculative builder leaves
    it to its split (SpecSplit.prefill_init_rows)."""
    from types import SimpleNamespace

    from .test_host import _common

    # two decode rows, then a prefix-cache hit, a fresh prompt, a chunk continuation
    common = _common([1, 1, 9, 20, 16], [30, 9, 137, 20, 48], None)
    stock = dataclasses.replace(
        _stock_metadata(), num_decodes=2, num_prefills=3, num_decode_tokens=2
    )
    monkeypatch.setattr(GDNAttentionMetadataBuilder, "build", lambda self, *a, **k: stock)
    b = object.__new__(ReplayGDNAttentionMetadataBuilder)
    b.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=True))
    b.use_spec_decode = False
    assert b.build(0, common).replay_prefill_init_rows.tolist() == [0, 2]
    b.vllm_config.cache_config.enable_prefix_caching = False
    assert b.build(0, common).replay_prefill_init_rows is None
    b.vllm_config.cache_config.enable_prefix_caching = True
    b.use_spec_decode = True
    assert b.build(0, common).replay_prefill_init_rows is None
