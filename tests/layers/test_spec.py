"""layers/spec.py: the commit counts of speculative steps derived from positions and the
pages' window starts, over a sequence of steps in which vLLM's own acceptance counts would
be missing (a draft-free step after a step whose drafts were rejected); prefill rows that
continue a page (`SpecWindows.resume_rows`)."""

import pytest
import torch

from vllm_replayssm.kernels.common.cursor import PENDING, reset_meta
from vllm_replayssm.layers.spec import SpecWindows
from vllm_replayssm.layout import META_LEN

L, T = 8, 4  # buffer_len, window (k = 3 drafts)


def _step(
    spec: SpecWindows,
    meta: torch.Tensor,
    window_start: torch.Tensor,
    slots: torch.Tensor,
    q: list[int],
    seq_lens: list[int],
):
    """One speculative step's commit counts; then what the decode step would leave: the
    window's q records pending, and the window start recorded."""
    q_t, lens = torch.tensor(q), torch.tensor(seq_lens)
    start, accepted, pending, committed = spec.acceptance(meta, window_start, slots, q_t, lens)
    meta[slots, PENDING] = q_t.to(meta.dtype)
    window_start[slots] = start
    return start.tolist(), accepted.tolist(), pending.tolist(), committed.tolist()


def _window_starts(S: int) -> torch.Tensor:
    """[S] int64 with a slot stride, as the pages' window start words are."""
    return torch.zeros(S, 3, dtype=torch.int64)[:, 1]


def test_acceptance_from_positions():
    meta = torch.zeros(4, META_LEN, dtype=torch.int32)
    slots = torch.tensor([1, 3])
    reset_meta(meta, slots, L, T, stagger=False)
    spec = SpecWindows(L, T)
    ws = _window_starts(4)
    # After prefill: prompts of 10 and 6 tokens, nothing pending.
    ws[slots] = torch.tensor([10, 6])
    # Step 1: both rows verify 1 + 3 tokens; nothing was pending, nothing commits.
    assert _step(spec, meta, ws, slots, [4, 4], [14, 10]) == ([10, 6], [0, 0], [0, 0], [0, 0])
    # Step 2: row 1 accepted 2 of its window (bonus included), row 3 all 4.
    assert _step(spec, meta, ws, slots, [4, 4], [16, 14]) == ([12, 10], [2, 4], [4, 4], [2, 4])
    # Step 3 has no drafts (one token per row); row 1 had its drafts rejected (1 accepted):
    # positions still give it, where vLLM passes no acceptance on such a step.
    assert _step(spec, meta, ws, slots, [1, 1], [14, 15]) == ([13, 14], [1, 4], [4, 4], [1, 4])
    # Step 4: the one-token windows commit.
    assert _step(spec, meta, ws, slots, [4, 4], [18, 19]) == ([14, 15], [1, 1], [1, 1], [1, 1])


def test_garbage_words_count_nothing_pending():
    """A page whose cursor words are not valid reads as freshly reset: nothing pending, so
    nothing commits whatever the positions say."""
    meta = torch.full((2, META_LEN), 12345, dtype=torch.int32)
    spec = SpecWindows(L, T)
    start, accepted, pending, committed = spec.acceptance(
        meta, _window_starts(2), torch.tensor([1]), torch.tensor([4]), torch.tensor([30])
    )
    assert start.tolist() == [26] and accepted.tolist() == [26]
    assert pending.tolist() == [0] and committed.tolist() == [0]


def test_triton_acceptance_matches_torch(device):
    """The one-launch Triton twin (kernels/common/triton_acceptance.py, GPUs; interpreted
    here) against the torch version: valid words with pending windows, garbage words, rows
    whose positions went back (clamped to 0), NULL padding rows, more rows than a block;
    window starts read with the pages' slot stride. Interpreted on CPUs, on the device on the
    GPU host."""
    from vllm_replayssm.kernels.common.triton_acceptance import spec_acceptance

    gen = torch.Generator().manual_seed(3)
    S, R = 12, 70
    meta = torch.zeros(S, META_LEN, dtype=torch.int32)
    reset_meta(meta, torch.arange(S), L, T, stagger=True)
    meta[:, PENDING] = torch.randint(0, T + 1, (S,), generator=gen, dtype=torch.int32)
    meta[3] = 12345  # garbage: reads as nothing pending
    meta[7, PENDING] = T + 1  # breaks the invariant too
    spec = SpecWindows(L, T)
    starts = _window_starts(S)
    starts.copy_(torch.randint(0, 40, (S,), generator=gen))
    slots = torch.randint(0, S, (R,), generator=gen)
    q = torch.randint(0, T + 1, (R,), generator=gen)
    seq_lens = torch.randint(0, 50, (R,), generator=gen) + q
    want = spec.acceptance(meta, starts, slots, q, seq_lens)
    ws = torch.zeros(S, 3, dtype=torch.int64, device=device)[:, 1]  # strided, as in pages
    ws.copy_(starts)
    rows = (t.to(device) for t in (slots, q, seq_lens))
    got = spec_acceptance(meta.to(device), ws, *rows, num_ring_rows=L + T, window=T)
    for name, a, b in zip(("start", "accepted", "pending", "committed"), want, got, strict=True):
        assert torch.equal(a, b.cpu()), name
    assert (want[2] == 0).any() and (want[3] > 0).any()  # both kinds of rows occur


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_start_step_in_one_launch_matches_reset_then_acceptance(family, device):
    """`SpecWindows.start_step`: the one-launch Triton version (kernels/common/
    triton_spec_start.py; interpreted on CPUs, on the device on the GPU host) leaves every
    page and count as the fresh-row
    reset followed by the acceptance with store_start (the host path): a new request's
    window in a recycled slot (reset, nothing pending), a continuing window (commits), a row
    without tokens and a NULL padding row (whose counts and window start are never read)."""
    from .test_fresh import FAMILIES, _same_bits, _snapshot, _used_pages

    fam = FAMILIES[family]()
    gen = torch.Generator().manual_seed(5)
    cache, conv = _used_pages(fam, gen)
    conv = conv.transpose(1, 2).contiguous().transpose(1, 2)  # dim-first view, as on GPUs
    starts = _window_starts(4)
    starts.copy_(torch.tensor([7, 3, 9, 20]))
    slots = torch.tensor([2, 3, 1, 0], dtype=torch.int32)
    qsl = torch.tensor([0, T, 2 * T, 2 * T, 3 * T], dtype=torch.int32)
    seq_lens = torch.tensor([T, 26, 17, T], dtype=torch.int32)
    spec = SpecWindows(L, T)
    results = {}
    for graph_safe in (False, True):
        dev = device if graph_safe else "cpu"
        c = type(cache)(*(None if t is None else t.clone().to(dev) for t in cache))
        cv = conv.transpose(1, 2).contiguous().to(dev).transpose(1, 2)
        ws = torch.zeros(4, 3, dtype=torch.int64, device=dev)[:, 1]
        ws.copy_(starts)
        rows = (t.to(dev) for t in (slots, qsl, seq_lens))
        counts = spec.start_step(c, cv, ws, *rows, stagger=True, graph_safe=graph_safe)
        c = type(c)(*(None if t is None else t.cpu() for t in c))
        results[graph_safe] = ([n.cpu() for n in counts], _snapshot(c, cv.cpu()), ws.cpu())
    (want, pages, ws_want), (got, pages_got, ws_got) = results[False], results[True]
    real = slots != 0
    for name, a, b in zip(("start", "accepted", "pending", "committed"), want, got, strict=True):
        assert torch.equal(a[real], b[real]), name
    assert want[2][0] == 0 and want[3][1] > 0  # the fresh row: nothing pending; slot 3 commits
    for name in pages:
        assert _same_bits(pages[name], pages_got[name]), name
    assert not pages["hp"][2].any() and pages["hp"][3].any()
    assert torch.equal(ws_want[1:], ws_got[1:]) and ws_want[1:].tolist() == [17 - 0, 0, 26 - T]


def test_start_step_zeroes_the_tensors_it_is_given_after_a_rebinding(device):
    """`SpecWindows.start_step` keeps the zeroing launch's arguments of the tensors it last
    saw: given other tensors (vLLM bound new ones), it zeroes a fresh row's page in those
    (fails if the arguments of the first call were kept: the second call would zero the
    first tensors again)."""
    from .test_fresh import FAMILIES, _used_pages

    fam = FAMILIES["mamba2"]()
    cache, conv = _used_pages(fam, torch.Generator().manual_seed(5))
    slots = torch.tensor([2], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, T], dtype=torch.int32, device=device)
    seq_lens = torch.tensor([T], dtype=torch.int32, device=device)  # a new request: fresh
    spec = SpecWindows(L, T)
    for _ in range(2):  # two bindings of the same contents
        c = type(cache)(*(None if t is None else t.clone().to(device) for t in cache))
        cv = conv.transpose(1, 2).contiguous().to(device).transpose(1, 2)
        ws = torch.zeros(4, 3, dtype=torch.int64, device=device)[:, 1]
        assert c.hp[2].any() and cv[2].any()
        spec.start_step(c, cv, ws, slots, qsl, seq_lens, stagger=True, graph_safe=True)
        assert not c.hp[2].any() and not cv[2].any()
