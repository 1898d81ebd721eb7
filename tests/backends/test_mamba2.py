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


def _builder(cls, *, mode: str, full_graphs: bool = True, num_spec: int = 0, max_bs: int = 8):
    """A builder with only the attributes update_block_table reads (vLLM's __init__ needs a
    whole engine configuration): block size 16, CUDA-graph buffer of max_bs rows."""
    from types import SimpleNamespace

    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.kv_cache_interface import MambaSpec

    b = object.__new__(cls)
    b.kv_cache_spec = MambaSpec(
        block_size=16, shapes=((4,),), dtypes=(torch.float32,), mamba_cache_mode=mode
    )
    b.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(mamba_cache_mode=mode))
    graphs = CUDAGraphMode.FULL_DECODE_ONLY if full_graphs else CUDAGraphMode.PIECEWISE
    b.compilation_config = SimpleNamespace(cudagraph_mode=graphs)
    b.num_spec_tokens, b.use_spec_decode = num_spec, num_spec > 0
    b.decode_cudagraph_max_bs = max_bs
    b.state_indices_tensor_d = torch.full((max_bs, 1 + num_spec), -7, dtype=torch.int32)
    return b


def _decode_metadata(seq_lens: list[int], num_decodes: int, num_prefills: int = 0):
    """First-group metadata of a step: num_decodes decode rows, then num_prefills prefill
    rows, then padding rows (sequence length 0) up to len(seq_lens)."""
    r = len(seq_lens)
    md = dataclasses.replace(
        _stock_metadata(),
        num_decodes=num_decodes,
        num_decode_tokens=num_decodes,
        num_prefills=num_prefills,
        num_reqs=r,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
    )
    return ReplayMamba2AttentionMetadata.extend(md, None)


def _block_table(rows: int, real: int, seed: int) -> torch.Tensor:
    """[rows, 6] int32 distinct block ids; rows from `real` on hold the null block, as the
    runner fills CUDA-graph padding rows."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randperm(1000, generator=g)[: rows * 6].reshape(rows, 6).to(torch.int32) + 1
    t[real:] = 0
    return t


def test_align_update_block_table_matches_vllm():
    """On align-mode decode-only steps our short path gives vLLM's state indices (decode rows:
    the block of each row's last token, block boundaries included; padding rows: the null
    block) in the group's CUDA-graph buffer, and later groups reuse the step's row index."""
    stock_cls = ReplayMamba2AttentionMetadataBuilder.__mro__[1]
    seq_lens = [1, 15, 16, 17, 32, 33, 95, 0]  # the last row pads the graph
    md = _decode_metadata(seq_lens, num_decodes=8)
    for group, seed in enumerate((1, 2, 3)):
        table = _block_table(8, real=7, seed=seed)
        ours_b = _builder(ReplayMamba2AttentionMetadataBuilder, mode="align")
        stock_b = _builder(stock_cls, mode="align")
        ours = ours_b.update_block_table(md, table, None)
        stock = stock_cls.update_block_table(stock_b, md, table, None)
        assert torch.equal(ours.state_indices_tensor_d, stock.state_indices_tensor_d), group
        assert ours.state_indices_tensor_d.data_ptr() == ours_b.state_indices_tensor_d.data_ptr()
        assert torch.equal(ours_b.state_indices_tensor_d, stock_b.state_indices_tensor_d)
        assert ours.state_indices_tensor_p.shape == stock.state_indices_tensor_p.shape == (0,)
        assert type(ours) is ReplayMamba2AttentionMetadata
        expected = [table[i, max(s - 1, 0) // 16].item() for i, s in enumerate(seq_lens)]
        assert ours.state_indices_tensor_d[:, 0].tolist() == expected
        assert md.replay_align_index is not None  # computed by the first group, then reused
    # fewer real rows than the padded batch: rows past num_decodes get the null block
    md = _decode_metadata([40, 20, 0, 0], num_decodes=2)
    table = _block_table(4, real=2, seed=4)
    b = _builder(ReplayMamba2AttentionMetadataBuilder, mode="align")
    out = b.update_block_table(md, table, None).state_indices_tensor_d
    assert out[:, 0].tolist() == [table[0, 2].item(), table[1, 1].item(), 0, 0]


def test_update_block_table_other_steps_take_vllms_path(monkeypatch):
    """Mixed steps, "all" / "none" mode, spec decode, batches past the graph buffer and
    steps without full CUDA graphs are left to vLLM's method."""
    stock_cls = ReplayMamba2AttentionMetadataBuilder.__mro__[1]
    calls = []
    monkeypatch.setattr(
        stock_cls, "update_block_table", lambda self, md, t, s: calls.append(md) or md
    )
    table = _block_table(4, real=4, seed=5)
    cases = [
        (dict(mode="align"), _decode_metadata([5, 6, 7, 8], num_decodes=3, num_prefills=1)),
        (dict(mode="all"), _decode_metadata([5, 6, 7, 8], num_decodes=4)),
        (dict(mode="none"), _decode_metadata([5, 6, 7, 8], num_decodes=4)),
        (dict(mode="align", num_spec=2), _decode_metadata([5, 6, 7, 8], num_decodes=4)),
        (dict(mode="align", max_bs=2), _decode_metadata([5, 6, 7, 8], num_decodes=4)),
        (dict(mode="align", full_graphs=False), _decode_metadata([5, 6, 7, 8], num_decodes=4)),
    ]
    for kwargs, md in cases:
        b = _builder(ReplayMamba2AttentionMetadataBuilder, **kwargs)
        assert b.update_block_table(md, table, None) is md, kwargs
    assert len(calls) == len(cases)


def test_build_chooses_the_resumed_prefill_rows_on_the_host(monkeypatch):
    """build() adds which prefill rows continue a stored state (positions among vLLM's prefill
    rows, the batch's last num_prefills), decided from the host's query starts and lengths:
    the layer folds their rings without reading vLLM's has_initial_states_p back. Steps
    without prefill rows carry None, and so do steps of an engine with neither prefix
    caching nor speculative decoding, whose layers fold nothing."""
    from types import SimpleNamespace

    from .test_host import _common

    stock_cls = ReplayMamba2AttentionMetadataBuilder.__mro__[1]
    # two decode rows, then a fresh prompt, a prefix-cache hit, a chunk continuation
    common = _common([1, 1, 20, 7, 16], [30, 9, 20, 135, 48], None)
    stock = dataclasses.replace(_stock_metadata(), num_decodes=2, num_prefills=3, num_reqs=5)
    monkeypatch.setattr(stock_cls, "build", lambda self, *a, **k: stock)

    def builder(prefix_caching: bool, spec: bool):
        b = object.__new__(ReplayMamba2AttentionMetadataBuilder)
        b.vllm_config = SimpleNamespace(
            cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching),
            speculative_config=SimpleNamespace(num_speculative_tokens=3) if spec else None,
        )
        return b

    for prefix_caching, spec in ((True, False), (False, True), (True, True)):
        md = builder(prefix_caching, spec).build(0, common)
        assert md.replay_prefill_init_rows.tolist() == [1, 2]
    view = dataclasses.replace(md, num_decodes=0)  # the layer's prefill-only view keeps it
    assert view.replay_prefill_init_rows is md.replay_prefill_init_rows
    assert builder(False, False).build(0, common).replay_prefill_init_rows is None
    decode_only = dataclasses.replace(stock, num_prefills=0)
    monkeypatch.setattr(stock_cls, "build", lambda self, *a, **k: decode_only)
    assert builder(True, True).build(0, common).replay_prefill_init_rows is None


def test_every_replay_layer_takes_our_backend():
    """Plain decoding too, not only speculative: without our builder the prefill path has no
    host-chosen rows and 'align' mode's update_block_table short path never runs (before
    2026-12-05 plain Mamba-2 layers got vLLM's backend)."""
    from types import SimpleNamespace

    from vllm_replayssm.layers.mamba2 import ReplayMambaMixer2

    for window in (1, 4):
        layer = SimpleNamespace(replay=SimpleNamespace(enabled=True), replay_window=window)
        assert ReplayMambaMixer2.get_attn_backend(layer) is ReplayMamba2AttentionBackend
