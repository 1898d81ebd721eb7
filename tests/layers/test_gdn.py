"""layers/gdn.py: pieces of the GDN layer's speculative step that stand alone (the engine
tests, tests/plugin/test_spec_cpu_engine.py, run the layer itself)."""

import pytest
import torch

from vllm_replayssm.layers.gdn import _join_decode_rows


def test_join_decode_rows_keeps_each_rows_tokens():
    """Spec rows (3 and 4 tokens at scattered step positions) joined with two one-token rows:
    the joined rows name the same tokens, slots and lengths, in that order, and the joined
    query_start_loc gives every row its own tokens."""
    spec = (
        torch.tensor([0, 1, 2, 5, 6, 7, 8]),
        torch.tensor([[9, 1], [4, 2]], dtype=torch.int32)[:, 0],  # a strided column
        torch.tensor([0, 3, 7], dtype=torch.int32),
        torch.tensor([30, 41]),
    )
    one_token = (
        torch.tensor([3, 4]),
        torch.tensor([7, 2], dtype=torch.int32),
        torch.tensor([0, 1, 2], dtype=torch.int64),
        torch.tensor([12, 8]),
    )
    tokens, slots, qsl, seq_lens = _join_decode_rows(spec, one_token)
    assert tokens.tolist() == [0, 1, 2, 5, 6, 7, 8, 3, 4]
    assert slots.tolist() == [9, 4, 7, 2] and slots.dtype == torch.int32
    assert qsl.tolist() == [0, 3, 7, 8, 9] and qsl.dtype == torch.int32
    assert seq_lens.tolist() == [30, 41, 12, 8]
    rows = [tokens[qsl[i] : qsl[i + 1]].tolist() for i in range(4)]
    assert rows == [[0, 1, 2], [5, 6, 7, 8], [3], [4]]


def test_join_decode_rows_takes_slices_and_offset_query_starts():
    """Token slices become indices, and a second query_start_loc that does not start at 0
    (a view into a longer one) is rebased onto the first's end."""
    first = (slice(0, 4), torch.tensor([5, 6]), torch.tensor([0, 2, 4]), torch.tensor([3, 3]))
    second = (slice(6, 7), torch.tensor([8]), torch.tensor([6, 7]), torch.tensor([2]))
    tokens, slots, qsl, seq_lens = _join_decode_rows(first, second)
    assert tokens.tolist() == [0, 1, 2, 3, 6]
    assert qsl.tolist() == [0, 2, 4, 5]
    assert slots.tolist() == [5, 6, 8] and seq_lens.tolist() == [3, 3, 2]


def test_prefill_rows_to_fold_are_the_host_chosen_ones_with_prefix_caching_only():
    """With prefix caching the slots of the prefill rows the builder chose (a cache hit's
    ring must be folded before vLLM's prefill reads HP); without it none (a chunk
    continuation's ring is empty); likewise a step without such rows."""
    from types import SimpleNamespace

    from vllm_replayssm.layers.gdn import ReplayQwenGatedDeltaNetAttention

    from ..readback import device_readbacks

    slots = torch.tensor([7, 8, 3, 5, 9], dtype=torch.int32)  # two decode rows first
    init = torch.tensor([0, 2])
    md = SimpleNamespace(num_decodes=2, num_prefills=3, replay_prefill_init_rows=init)

    def layer(pc: bool):
        return SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=pc))

    fold = ReplayQwenGatedDeltaNetAttention._prefill_rows_to_fold
    assert device_readbacks(lambda: fold(layer(True), md, slots)) == []
    assert fold(layer(True), md, slots).tolist() == [3, 9]
    assert fold(layer(False), md, slots) is None
    md.replay_prefill_init_rows = torch.tensor([], dtype=torch.int64)
    assert fold(layer(True), md, slots) is None
    # the builder leaves them out without prefix caching only
    md.replay_prefill_init_rows = None
    assert fold(layer(False), md, slots) is None
    with pytest.raises(RuntimeError, match="replay_prefill_init_rows"):
        fold(layer(True), md, slots)
