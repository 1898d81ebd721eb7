"""The page copy of prefix caching ("align" mode, docs/prefix-caching.md) at the layer
level: vLLM's copy machinery with our copy function moves every tensor of a ReplaySSM page,
and a page copied at a block boundary, materialised in its new slot, holds the state at that
boundary (against the float64 oracle) with an empty ring, while the cached page stays as
it was. And a layer's named views of its page (`PageViews`): built once per binding, rebuilt
when vLLM binds other tensors, checked against the declared page."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_replayssm.kernels.common.checkpoint import to_lp
from vllm_replayssm.kernels.common.cursor import COMMITTED, PENDING, reset_words
from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook
from vllm_replayssm.layers.conv import conv_state_view
from vllm_replayssm.layers.pages import (
    ReplayPage,
    gdn_page_specs,
    page_copy_func,
    page_rows,
    same_tensors,
)
from vllm_replayssm.layout import (
    GDNGeometry,
    GDNReplayCache,
    Mamba2Geometry,
    Mamba2ReplayCache,
    carve,
    page_size_bytes,
)

from ..kernels.families import GDNFamily, Mamba2Family, cat_tokens
from ..kernels.tolerances import tol_for

FAMILIES = {
    "mamba2": lambda: Mamba2Family(Mamba2Geometry(nheads=4, headdim=8, dstate=16, ngroups=2)),
    "gdn": lambda: GDNFamily(
        GDNGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8)
    ),
}
CACHE = {"mamba2": Mamba2ReplayCache, "gdn": GDNReplayCache}
NUM_SLOTS = 8


def _pages(fam, L: int, T: int, lp, pad: int, seed: int = 0):
    """(raw uint8 buffer, {name: view}, page bytes as vLLM lays them out): garbage bytes,
    pages padded by `pad` bytes as vLLM pads them to the attention page size."""
    specs = fam.specs(L, T, lp)
    page = page_size_bytes(specs) + pad
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (NUM_SLOTS * page,), dtype=torch.uint8, generator=gen)
    return raw, carve(raw, specs, page), page_size_bytes(specs), page


def _vllm_copy(raw: torch.Tensor, views: dict, copy_funcs, block_ids, src_idx, dst_idx):
    """What vLLM's `collect_mamba_copy_meta` + `batch_memcpy` do for one layer: pair the
    layer's tensors with the copy functions (zip), copy num_elements * element size bytes
    from each spec's start to the same tensor's destination block."""
    base = raw.data_ptr()
    for state, func in zip(list(views.values()), copy_funcs):  # noqa: B905 (vLLM's zip)
        spec = func(state, block_ids, src_idx, 1)
        nbytes = spec.num_elements * state.element_size()
        src = spec.start_addr - base
        dst = state[block_ids[dst_idx]].data_ptr() - base
        raw[dst : dst + nbytes] = raw[src : src + nbytes].clone()


@pytest.mark.parametrize("pad", [0, 384], ids=["unpadded", "padded"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_page_copy_moves_every_tensor(family, pad):
    fam = FAMILIES[family]()
    raw, views, nbytes, page = _pages(fam, 4, 1, torch.bfloat16, pad)
    before = raw.clone()
    block_ids = [0, 3, 6]  # the request's blocks; the state moves from index 1 to 2
    _vllm_copy(raw, views, (page_copy_func(nbytes),), block_ids, 1, 2)
    for name, view in views.items():
        assert torch.equal(view[6].view(torch.uint8), view[3].view(torch.uint8)), name
    changed = (raw != before).nonzero().flatten()
    assert changed.numel() > 0
    assert changed.min() >= 6 * page and changed.max() < 6 * page + nbytes


def test_page_copy_is_whole_at_any_accepted_count():
    """Under speculative decoding vLLM passes the tokens the request's last step accepted;
    the page (its window start included) is copied whole whatever the count: the next step
    derives its commit from positions (`layers/spec.py`)."""
    fam = FAMILIES["mamba2"]()
    raw, views, nbytes, _ = _pages(fam, 8, 4, None, 0)
    assert "window_start" in views  # speculative pages keep their window start
    block_ids = [0, 2, 5]
    _vllm_copy(raw, views, (page_copy_func(nbytes),), block_ids, 1, 2)
    for accepted in (1, 3):
        spec = page_copy_func(nbytes)(views["conv"], block_ids, 1, accepted)
        assert spec.start_addr == views["conv"][2].data_ptr()
        assert spec.num_elements * views["conv"].element_size() == nbytes
    for name, view in views.items():
        assert torch.equal(view[5].view(torch.uint8), view[2].view(torch.uint8)), name


def test_page_rows_views_each_page_as_bytes():
    fam = FAMILIES["gdn"]()
    raw, views, nbytes, page = _pages(fam, 8, 4, torch.bfloat16, 384)
    rows = page_rows(views["conv"], nbytes)
    assert rows.shape == (NUM_SLOTS, nbytes)
    assert torch.equal(rows[3], raw[3 * page : 3 * page + nbytes])
    rows[4] = rows[1]
    assert torch.equal(views["window_start"][4], views["window_start"][1])
    assert torch.equal(views["hp"][4], views["hp"][1])


@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp_only", "lp_bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_copied_boundary_page_materialises_to_the_boundary_state(family, lp):
    """Slot 3 prefills, then decodes 7 tokens with L = 4 (flushes; its ring holds the
    records since, the last one pending): the page a block-completing step leaves. Copied to
    slot 6 and materialised there (what a prefix-cache hit does before vLLM's prefill reads
    HP), slot 6 holds the float64 state after all those tokens, LP = HP, an empty ring;
    slot 3 is untouched, and both then decode the same token alike."""
    L, T, steps = 4, 1, 7
    fam = FAMILIES[family]()
    raw, views, nbytes, _ = _pages(fam, L, T, lp, 0, seed=1)
    cache = CACHE[family].from_views(views)
    gen = torch.Generator().manual_seed(2)
    S0 = fam.initial_state(gen).double()
    src, dst = torch.tensor([3]), torch.tensor([6])
    cache.hp[src] = S0.float()[None]
    apply_prefill_hook(cache.hp, cache.lp, cache.meta, src, buffer_len=L, window=T, stagger=True)
    toks = []
    for _ in range(steps):
        tok = fam.tokens(1, gen)
        out = torch.full(fam.out_shape(1), float("nan"))
        fam.decode(cache, tok, src.int(), out, L, T)
        toks.append(tok)
    words = cache.meta[3].tolist()
    assert words[COMMITTED] > 0 and words[PENDING] == 1, words  # a ring left to fold
    _, S_ref = fam.naive(S0, cat_tokens(toks))
    _vllm_copy(raw, views, (page_copy_func(nbytes),), [0, 3, 6], 1, 2)
    cached = raw.clone()
    fam.materialise(cache, dst.int(), L, T, True)
    page = raw.numel() // NUM_SLOTS
    assert torch.equal(raw[3 * page : 3 * page + nbytes], cached[3 * page : 3 * page + nbytes])
    err = (cache.hp[6].double() - S_ref).norm() / S_ref.norm()
    assert err < tol_for(), err
    if cache.lp is not None:
        assert torch.equal(cache.lp[6], to_lp(cache.hp[6], cache.lp.dtype))
    assert torch.equal(cache.meta[6].long(), reset_words(dst, L, T, True)[0])
    tok = fam.tokens(1, gen)
    outs = []
    for slot in (src, dst):
        out = torch.full(fam.out_shape(1), float("nan"))
        fam.decode(cache, tok, slot.int(), out, L, T)
        outs.append(out)
    y_ref, _ = fam.naive(S_ref, tok)
    for out in outs:
        assert (out.double() - y_ref).norm() / y_ref.norm() < tol_for(lp)


@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp_only", "lp_bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_page_copied_inside_a_verify_window_resumes_to_the_boundary_state(family, lp):
    """Speculative decoding with prefix caching (`prefix_cache.py`): slot 3 prefills at
    position P, verifies a window of 4 tokens (2 accepted), then a second window of 4, of
    which the first 2 reach a block boundary b = P + 4. The page as that step left it (both
    windows' records, the second one pending) is copied whole into slot 6, the boundary's
    block; a request that hits it resumes there (`SpecWindows.resume_rows`: 2 of the 4
    pending records committed from positions, folded into HP) and holds the float64 state
    at b, with an empty ring. Slot 3 goes on from the same page, committing the same 2
    records, and both decode the next token alike."""
    from vllm_replayssm.layers.spec import SpecWindows

    L, T, P = 8, 4, 100
    fam = FAMILIES[family]()
    raw, views, nbytes, _ = _pages(fam, L, T, lp, 0, seed=3)
    cache = CACHE[family].from_views(views)
    window_start = views["window_start"][:, 0]
    gen = torch.Generator().manual_seed(4)
    S0 = fam.initial_state(gen).double()
    src, dst = torch.tensor([3]), torch.tensor([6])
    cache.hp[src] = S0.float()[None]
    apply_prefill_hook(cache.hp, cache.lp, cache.meta, src, buffer_len=L, window=T, stagger=True)
    window_start[src] = P
    qsl = torch.tensor([0, T], dtype=torch.int32)
    w1, w2 = fam.tokens(T, gen), fam.tokens(T, gen)
    fam.decode(cache, w1, src.int(), torch.zeros(fam.out_shape(T)), L, T, qsl, torch.tensor([0]))
    fam.decode(cache, w2, src.int(), torch.zeros(fam.out_shape(T)), L, T, qsl, torch.tensor([2]))
    window_start[src] = P + 2
    assert cache.meta[3, PENDING] == T
    _, S_ref = fam.naive(S0, cat_tokens([_head(w1, 2), _head(w2, 2)]))
    _vllm_copy(raw, views, (page_copy_func(nbytes),), [0, 3, 6], 1, 2)
    conv = torch.zeros(NUM_SLOTS, 2, 6)  # [S, D, M], K = 3: the conv's part is test_conv's
    chunk = 5  # the hit request's prefill chunk after b
    SpecWindows(L, T).resume_rows(
        cache.meta,
        window_start,
        conv,
        dst,
        torch.tensor([chunk]),
        torch.tensor([P + 4 + chunk]),
        3,
        lambda rows, accepted: fam.materialise(cache, rows.int(), L, T, True, acc=accepted),
    )
    err = (cache.hp[6].double() - S_ref).norm() / S_ref.norm()
    assert err < tol_for(), err
    assert cache.meta[6, COMMITTED] == 0 and cache.meta[6, PENDING] == 0
    tok = fam.tokens(1, gen)
    y_ref, _ = fam.naive(S_ref, tok)
    one = torch.tensor([0, 1], dtype=torch.int32)
    for slot, acc in ((src, 2), (dst, 0)):
        out = torch.full(fam.out_shape(1), float("nan"))
        fam.decode(cache, tok, slot.int(), out, L, T, one, torch.tensor([acc]))
        assert (out.double() - y_ref).norm() / y_ref.norm() < tol_for(lp)


def _head(tok: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    return {k: v[:n] for k, v in tok.items()}


class _Layer(ReplayPage):
    """What `ReplayPage.page_views` reads of a layer: its bound tensors and its page."""

    def __init__(self, kv_cache, specs):
        self.kv_cache, self.replay_specs = kv_cache, specs


@pytest.mark.parametrize("family", list(FAMILIES))
def test_page_views_are_built_once_per_binding(family):
    fam = FAMILIES[family]()
    specs = fam.specs(8, 4, torch.bfloat16)
    views = carve(torch.zeros(NUM_SLOTS * page_size_bytes(specs), dtype=torch.uint8), specs)
    layer = _Layer([views[s.name] for s in specs], specs)
    page = layer.page_views()
    cache = page.mamba2() if family == "mamba2" else page.gdn(False)
    assert isinstance(cache, CACHE[family])
    assert cache.hp is views["hp"] and cache.lp is views["lp"] and cache.meta is views["meta"]
    assert layer.page_views() is page  # the same binding: nothing rebuilt
    assert (page.mamba2() if family == "mamba2" else page.gdn(False)) is cache
    ws = page.window_start()
    assert ws.shape == (NUM_SLOTS,) and ws.dtype == torch.int64
    ws[3] = 77  # a view of each page's window start word
    assert views["window_start"][3, 0] == 77
    conv = page.conv()
    assert conv.data_ptr() == views["conv"].data_ptr()
    assert conv.stride() == conv_state_view(layer.kv_cache).stride()
    # vLLM binds new tensors (another allocation): the views follow them
    other = carve(torch.zeros(NUM_SLOTS * page_size_bytes(specs), dtype=torch.uint8), specs)
    layer.kv_cache = [views[s.name] for s in specs]
    layer.kv_cache[[s.name for s in specs].index("hp")] = other["hp"]
    fresh = layer.page_views()
    assert fresh is not page
    got = fresh.mamba2() if family == "mamba2" else fresh.gdn(False)
    assert got.hp is other["hp"] and got.meta is views["meta"]


def test_same_tensors_is_identity_not_equality():
    a, b = torch.zeros(3), torch.ones(2)
    assert same_tensors([a, b], (a, b))
    assert not same_tensors([a, b], [b, a])  # order counts
    assert not same_tensors([a, b], [a, b.clone()])  # equal values, another tensor
    assert not same_tensors([a, b], [a])
    assert not same_tensors([a], [a, b])
    assert same_tensors([], [])


def test_gdn_page_views_transpose_the_state_for_k_major_kernels():
    fam = FAMILIES["gdn"]()
    specs = fam.specs(8, 1, torch.bfloat16)
    views = carve(torch.zeros(NUM_SLOTS * page_size_bytes(specs), dtype=torch.uint8), specs)
    page = _Layer([views[s.name] for s in specs], specs).page_views()
    S, H, V, K = views["hp"].shape
    for name in ("hp", "lp"):
        t = getattr(page.gdn(True), name)
        assert t.shape == (S, H, V, K) and t.data_ptr() == views[name].data_ptr()
        # [K, V] in memory: element (v, k) lies at k * V + v of the head's block
        assert t.stride()[-2:] == (1, V)
        assert getattr(page.gdn(False), name) is views[name]


def test_page_views_refuse_a_binding_unlike_the_page():
    fam = FAMILIES["mamba2"]()
    specs = fam.specs(8, 1, None)
    views = carve(torch.zeros(NUM_SLOTS * page_size_bytes(specs), dtype=torch.uint8), specs)
    kv = [views[s.name] for s in specs]
    with pytest.raises(RuntimeError, match="page declares"):
        _Layer(kv[:-1], specs).page_views()
    hp = [s.name for s in specs].index("hp")
    kv[hp] = kv[hp].to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="state tensor hp"):
        _Layer(kv, specs).page_views()


def test_gdn_page_specs_take_the_d_records_dtype_from_the_config():
    """A GDN layer's page as vLLM sizes it (`pages.gdn_page_specs`): the d records are fp32
    by default and take the LP copy's dtype with gdn_d_dtype "lp"; every other tensor stays
    as it was, and the page shrinks."""
    hf = SimpleNamespace(
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
    )

    def specs(**replay):
        vllm_config = SimpleNamespace(
            additional_config={"replayssm": {"enabled": True, **replay}},
            parallel_config=SimpleNamespace(tensor_parallel_size=1),
            speculative_config=None,
            model_config=SimpleNamespace(dtype=torch.bfloat16),
            cache_config=SimpleNamespace(mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto"),
        )
        return gdn_page_specs(vllm_config, hf)

    def tensors(page):
        return {s.name: (s.shape, s.dtype) for s in page if not s.name.startswith("pad")}

    for lp, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        full, small = specs(lp_dtype=lp), specs(lp_dtype=lp, gdn_d_dtype="lp")
        assert tensors(full)["ring_d"][1] == torch.float32
        assert tensors(small)["ring_d"] == (tensors(full)["ring_d"][0], dtype)
        assert {**tensors(small), "ring_d": None} == {**tensors(full), "ring_d": None}
        assert page_size_bytes(small) < page_size_bytes(full)
