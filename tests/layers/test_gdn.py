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


def _mixed_spec_step():
    """Metadata of a speculative step with every kind of row, as SimpleNamespace: two spec
    rows (tokens 1-3 and 8-9), a one-token row continuing a request (token 0) and a prefill
    chunk continuing a stored state (tokens 4-7)."""
    from types import SimpleNamespace

    from vllm_replayssm.backends.gdn import SpecSplit

    split = SpecSplit(
        spec_seq_lens=torch.tensor([20, 30], dtype=torch.int32),
        non_spec_seq_lens=torch.tensor([7, 10], dtype=torch.int32),
        num_decode_rows=1,
        decode_rows_lead=True,
        prefill_query_start_loc_cpu=torch.tensor([0, 4], dtype=torch.int32),
        prefill_init_rows=torch.tensor([0]),
    )
    return SimpleNamespace(
        replay_spec_split=split,
        replay_step_rows=None,
        spec_sequence_masks=torch.tensor([False, True, False, True]),
        num_spec_decodes=2,
        spec_token_indx=torch.tensor([1, 2, 3, 8, 9], dtype=torch.int32),
        spec_state_indices_tensor=torch.tensor([[11, 0, 0], [12, 0, 0]], dtype=torch.int32),
        spec_query_start_loc=torch.tensor([0, 3, 5], dtype=torch.int32),
        non_spec_token_indx=torch.tensor([0, 4, 5, 6, 7], dtype=torch.int32),
        non_spec_state_indices_tensor=torch.tensor([13, 14], dtype=torch.int32),
        non_spec_query_start_loc=torch.tensor([0, 1, 5], dtype=torch.int32),
        has_initial_state=torch.tensor([True, True]),
        num_decodes=1,
        num_prefills=1,
        num_actual_tokens=10,
        replay_seq_lens=torch.tensor([7, 20, 10, 30], dtype=torch.int32),
    )


def test_split_step_rows_joins_decode_rows_and_keeps_the_prefill_chunks():
    """Spec rows first, then the one-token row, in one set of decode rows (int64 slots and
    lengths, each row's own tokens); the prefill chunk with its slot, lengths and the slot
    of the chunk that continues a stored state. No device read-back."""
    from vllm_replayssm.layers.gdn import _split_step_rows

    from ..readback import device_readbacks

    md = _mixed_spec_step()
    assert device_readbacks(lambda: _split_step_rows(md, md.replay_spec_split, "cpu")) == []
    rows = _split_step_rows(md, md.replay_spec_split, torch.device("cpu"))
    tokens, slots, qsl, seq_lens, q = rows.decode
    assert tokens.tolist() == [1, 2, 3, 8, 9, 0]
    assert slots.tolist() == [11, 12, 13] and slots.dtype == torch.int64
    assert qsl.tolist() == [0, 3, 5, 6] and q.tolist() == [3, 2, 1]
    assert seq_lens.tolist() == [20, 30, 7] and seq_lens.dtype == torch.int64
    p = rows.prefill
    assert p.tokens.tolist() == [4, 5, 6, 7]
    assert p.slots.tolist() == [14] and p.slots.dtype == torch.int32
    assert p.slots_long.dtype == torch.int64 and p.init_slots.tolist() == [14]
    assert p.has_init.tolist() == [True] and p.seq_lens.tolist() == [10]


def test_split_steps_derive_their_rows_once_per_metadata_uniform_steps_per_layer():
    """Every GDN layer of a metadata group reads the same rows of a split (eager) step: the
    first derives them and the metadata keeps them, so the next layer gets the very same
    tensors. A uniform batch (no split; on GPUs a CUDA graph, where a tensor one layer's
    Python made would not be remade at replay) keeps nothing on the metadata."""
    from types import SimpleNamespace

    from vllm_replayssm.layers.gdn import ReplayQwenGatedDeltaNetAttention

    calls = []
    layer = SimpleNamespace(
        _decode_rows_spec=lambda *args: calls.append(("decode", args[-1])),
        _prefill_rows_spec=lambda *args: calls.append(("prefill", args[-2])),
    )
    core = ReplayQwenGatedDeltaNetAttention._replay_core_spec
    md = _mixed_spec_step()
    for _ in range(2):  # two layers of the group
        core(layer, torch.zeros(10, 1), None, None, None, md, None)
    assert [c[0] for c in calls] == ["decode", "prefill", "decode", "prefill"]
    assert calls[0][1] is calls[2][1] and calls[1][1] is calls[3][1]
    assert md.replay_step_rows.decode is calls[0][1]

    calls.clear()
    uniform = SimpleNamespace(
        replay_spec_split=None,
        replay_step_rows=None,
        spec_sequence_masks=torch.tensor([True, True]),
        num_spec_decodes=2,
        spec_token_indx=None,
        num_spec_decode_tokens=8,
        spec_state_indices_tensor=torch.tensor([[3, 0, 0, 0], [5, 0, 0, 0]], dtype=torch.int32),
        spec_query_start_loc=torch.tensor([0, 4, 8], dtype=torch.int32),
        replay_seq_lens=torch.tensor([40, 50], dtype=torch.int32),
    )
    for _ in range(2):
        core(layer, None, None, None, None, uniform, None)
    assert uniform.replay_step_rows is None
    first, second = calls[0][1], calls[1][1]
    assert first.tokens == slice(0, 8) and first.slots.tolist() == [3, 5]
    assert first.q.tolist() == [4, 4] and first.slots is not second.slots
