"""layers/fresh.py: a decode row whose request has nothing computed (a new one-token request
verified as a window of 1 + k tokens) starts from a fresh page, whatever its recycled slot
held; the other rows' pages are left as they were. Both families, through their torch
references against the float64 oracle."""

import pytest
import torch

from vllm_replayssm.kernels.common.cursor import reset_words
from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook
from vllm_replayssm.layers.fresh import fresh_rows, start_fresh_rows
from vllm_replayssm.layout import GDNGeometry, Mamba2Geometry

from ..kernels.families import GDNFamily, Mamba2Family
from ..kernels.tolerances import tol_for

FAMILIES = {
    "mamba2": lambda: Mamba2Family(Mamba2Geometry(4, 4, 8, 2), seed=3),
    "gdn": lambda: GDNFamily(GDNGeometry(1, 2, 8, 8), seed=3),
}
L, T = 8, 4  # buffer_len, window (k = 3 drafts)
LP = torch.bfloat16
CONV_SHAPE = (6, 2 + T)  # a stand-in conv state per slot: [D, K - 1 + k]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _used_pages(fam, gen: torch.Generator):
    """A cache of 4 slots whose slots 2 and 3 hold other requests' histories: a random
    checkpoint, then three verify windows (the last one pending); a random conv state."""
    cache = fam.cache(fam.specs(L, T, LP), 4)
    slots = torch.tensor([2, 3])
    for s in slots.tolist():
        cache.hp[s] = fam.initial_state(gen)
    apply_prefill_hook(cache.hp, cache.lp, cache.meta, slots, buffer_len=L, window=T, stagger=True)
    for _ in range(3):
        out = torch.empty(fam.out_shape(2 * T))
        qsl, acc = torch.tensor([0, T, 2 * T]), torch.tensor([2, 3])
        fam.decode(cache, fam.tokens(2 * T, gen), slots, out, L, T, qsl=qsl, acc=acc)
    conv = torch.randn(4, *CONV_SHAPE, generator=gen)
    return cache, conv


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality (unused pages hold uninitialised memory, NaNs included)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _snapshot(cache, conv) -> dict[str, torch.Tensor]:
    tensors = {k: v.clone() for k, v in cache._asdict().items() if v is not None}
    return {**tensors, "conv": conv.clone()}


def test_fresh_rows_are_requests_with_nothing_computed():
    slots = torch.tensor([2, 3, 0, 1, 4])
    q = torch.tensor([4, 4, 1, 1, 0])
    seq_lens = torch.tensor([4, 11, 1, 1, 0])
    # A new window, a continuing one, a NULL row, a new one-token row, a row without tokens.
    assert fresh_rows(slots, q, seq_lens).tolist() == [True, False, False, True, False]


@pytest.mark.parametrize("graph_safe", [False, True], ids=["host", "graph_safe"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fresh_row_starts_from_zero_state(family, graph_safe):
    """Both implementations: rows selected on the host (CPU platform), and the one launch
    over every row that CUDA graphs need (kernels/common/triton_fresh.py, interpreted)."""
    fam = FAMILIES[family]()
    gen = torch.Generator().manual_seed(0)
    cache, conv = _used_pages(fam, gen)
    if graph_safe:  # the conv state as vLLM's GPU layout stores it: dim-first only as a view
        conv = conv.transpose(1, 2).contiguous().transpose(1, 2)
    stale = _snapshot(cache, conv)
    # A new request's window in recycled slot 2, the request of slot 3 continuing, a NULL
    # row (padding that looks new: it must stay untouched) and a row without tokens.
    slots = torch.tensor([2, 3, 0, 1])
    q, seq_lens = torch.tensor([T, T, T, 0]), torch.tensor([T, 11, T, 0])
    start_fresh_rows(
        cache, conv, slots, q, seq_lens, buffer_len=L, window=T, stagger=True, graph_safe=graph_safe
    )

    after = _snapshot(cache, conv)
    for name in ("hp", "lp", "conv"):
        assert not after[name][2].any(), name
    assert torch.equal(after["meta"][2], reset_words(torch.tensor([2]), L, T, True)[0].int())
    for name, t in after.items():
        others = [0, 1, 3] if name in ("hp", "lp", "conv", "meta") else [0, 1, 2, 3]
        assert _same_bits(t[others], stale[name][others]), name  # rings are never reset

    # Its window reads the zero state alone: outputs of the oracle from S0 = 0.
    tok = fam.tokens(T, gen)
    zero = torch.zeros(fam.state_shape, dtype=torch.float64)
    ref = fam.naive(zero, tok)[0]
    out = torch.empty(fam.out_shape(T))
    qsl, acc = torch.tensor([0, T]), torch.tensor([1])
    fam.decode(cache, tok, torch.tensor([2]), out, L, T, qsl=qsl, acc=acc)
    assert _rel(out, ref) <= tol_for(LP)
    # The same window on the page as the slot's last request left it reads that request's
    # history: the check above fails without the reset.
    stale_cache = type(cache)(**{k: stale.get(k) for k in cache._fields})
    fam.decode(stale_cache, tok, torch.tensor([2]), out, L, T, qsl=qsl, acc=acc)
    assert _rel(out, ref) > 10 * tol_for(LP)


@pytest.mark.parametrize("graph_safe", [False, True], ids=["host", "graph_safe"])
def test_plain_decode_rows_without_q(graph_safe):
    """Plain decode (q None: one token per row; vLLM's GDN metadata makes a new one-token
    request such a row): the row whose request is one token long is reset, a continuing
    row and a NULL row are not."""
    fam = FAMILIES["gdn"]()
    gen = torch.Generator().manual_seed(1)
    cache, conv = _used_pages(fam, gen)
    stale = _snapshot(cache, conv)
    slots, seq_lens = torch.tensor([3, 2, 0]), torch.tensor([1, 9, 1])
    start_fresh_rows(
        cache,
        conv,
        slots,
        None,
        seq_lens,
        buffer_len=L,
        window=1,
        stagger=False,
        graph_safe=graph_safe,
    )
    after = _snapshot(cache, conv)
    for name in ("hp", "lp", "conv"):
        assert not after[name][3].any(), name
    assert torch.equal(after["meta"][3], reset_words(torch.tensor([3]), L, 1, False)[0].int())
    for name in ("hp", "lp", "conv", "meta"):
        assert _same_bits(after[name][[0, 1, 2]], stale[name][[0, 1, 2]]), name
