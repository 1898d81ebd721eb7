"""backends/host.py: the prefill rows that continue a stored state, chosen on the host, are
the rows vLLM's own definition picks (`CommonAttentionMetadata.compute_num_computed_tokens()
> 0`, its has_initial_state), as positions among the prefill rows."""

import torch
from vllm.v1.attention.backend import CommonAttentionMetadata

from vllm_replayssm.backends.host import prefill_init_rows, to_device


def _common(q: list[int], seq_lens: list[int], upper: list[int] | None) -> CommonAttentionMetadata:
    qsl = torch.tensor([0, *torch.tensor(q).cumsum(0).tolist()], dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl.clone(),
        query_start_loc_cpu=qsl,
        seq_lens=seq,
        num_reqs=len(q),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(q),
        max_seq_len=max(seq_lens),
        block_table_tensor=torch.zeros(len(q), 4, dtype=torch.int32),
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64),
        seq_lens_cpu_upper_bound=None if upper is None else torch.tensor(upper, dtype=torch.int32),
    )


def _vllms(common: CommonAttentionMetadata, first: int, count: int) -> list[int]:
    has_init = common.compute_num_computed_tokens()[first : first + count] > 0
    return torch.nonzero(has_init).squeeze(1).tolist()


def test_prefill_init_rows_are_vllms_has_initial_state():
    # two decode rows (drafts pending: the upper bound overstates their lengths), then
    # prefill rows: a fresh prompt, a chunk continuation, a prefix-cache hit, a fresh
    # one-token request, a hit whose chunk is its last token
    q = [1, 1, 100, 64, 30, 1, 1]
    seq_lens = [40, 77, 100, 192, 286, 1, 257]
    upper = [43, 80, *seq_lens[2:]]
    common = _common(q, seq_lens, upper)
    rows = prefill_init_rows(common, 2, 5, common.query_start_loc)
    assert rows.dtype == torch.int64
    assert rows.tolist() == _vllms(common, 2, 5) == [1, 2, 4]
    # the whole batch, decode rows included; without vLLM's upper bound the device lengths
    assert prefill_init_rows(common, 0, 7, common.query_start_loc).tolist() == _vllms(common, 0, 7)
    common = _common(q, seq_lens, None)
    assert prefill_init_rows(common, 2, 5, common.query_start_loc).tolist() == [1, 2, 4]
    # no prefill row continues a state
    common = _common([5, 9], [5, 9], [5, 9])
    assert prefill_init_rows(common, 0, 2, common.query_start_loc).numel() == 0


def test_to_device_keeps_cpu_tensors():
    t = torch.arange(3)
    assert to_device(t, torch.zeros(1)) is t
