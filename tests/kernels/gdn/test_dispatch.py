"""GDN dispatcher (`kernels/gdn/dispatch.py`): the route policy (`launch_config`,
`plan_launch`) and `gdn_decode` running the op that policy names, checked against calling
that op directly (every buffer bitwise)."""

import pytest
import torch

from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook
from vllm_replayssm.kernels.gdn import reference
from vllm_replayssm.kernels.gdn.dispatch import (
    STOCK_ROUTE_MAX_ROWS,
    chosen_route,
    gdn_decode,
    launch_config,
    plan_launch,
)
from vllm_replayssm.layout import NULL_BLOCK_ID, GDNReplayCache

from ..families import GDNFamily
from .test_reference import GEOMS

L = 4
V_PER_K = 4


# (num_rows, plain) -> route, heads_per_program (None: no head loop)
POLICY = {
    "plain_bs1": (1, True, "stock", None),
    "plain_at_threshold": (STOCK_ROUTE_MAX_ROWS, True, "stock", None),
    "plain_above_threshold": (STOCK_ROUTE_MAX_ROWS + 1, True, "replay", None),
    "plain_bs256": (256, True, "replay", None),
    "spec_bs16": (16, False, "fused", 1),
    "spec_bs17": (17, False, "split", 1),
    "spec_bs64": (64, False, "split", V_PER_K),
}


@pytest.mark.parametrize("case", list(POLICY))
def test_launch_config(case):
    rows, plain, route, hpp = POLICY[case]
    cfg = launch_config(rows, V_PER_K, plain=plain)
    assert cfg["route"] == route
    assert cfg.get("heads_per_program") == hpp
    if route == "replay":  # the replay launches take decode.launch_config's knobs
        assert cfg == {"route": "replay"}
    else:
        assert cfg["block_v"] == 16 and cfg["num_warps"] == 1
    assert chosen_route("auto", rows, V_PER_K, plain) == ("stock" if route == "stock" else "replay")


# (replayssm.route, num_rows, plain, launch overrides) -> the kernel route that runs
ROUTES = {
    "auto_plain_small": ("auto", 4, True, None, "stock"),
    "auto_plain_large": ("auto", 64, True, None, "replay"),
    "auto_spec": ("auto", 4, False, None, "fused"),
    "replay_plain_small": ("replay", 4, True, None, "replay"),
    "stock_plain_large": ("stock", 64, True, None, "stock"),
    "stock_spec_replays": ("stock", 4, False, None, "fused"),
    "override_split": ("auto", 4, True, {"route": "split"}, "split"),
    "override_stock": ("replay", 4, True, {"route": "stock", "block_v": 8}, "stock"),
    "override_replay_knob": ("auto", 64, True, {"readout_warps": 2}, "replay"),
}


@pytest.mark.parametrize("case", list(ROUTES))
def test_plan_launch(case):
    route, rows, plain, launch, want = ROUTES[case]
    cfg = plan_launch(route, rows, V_PER_K, plain, launch)
    assert cfg["route"] == want
    if want == "stock":
        assert set(cfg) == {"route", "block_v", "num_warps"}
    elif want in ("fused", "split"):  # a forced window form starts from its configuration
        assert cfg["heads_per_program"] == 1 and cfg["num_stages"] == 1
    for key, val in (launch or {}).items():
        assert cfg[key] == val


def test_plan_launch_refuses():
    with pytest.raises(ValueError, match="route must be one of"):
        plan_launch("fused", 4, V_PER_K, True)
    with pytest.raises(ValueError, match="plain decode"):
        plan_launch("auto", 4, V_PER_K, False, {"route": "stock"})
    with pytest.raises(ValueError, match="plain decode"):
        plan_launch("auto", 4, V_PER_K, False, {"route": "replay"})
    with pytest.raises(ValueError, match="launch route must be one of"):
        plan_launch("auto", 4, V_PER_K, True, {"route": "both"})


def _setup(window: int, num_tokens: list[int], seed: int):
    """A family, a prefilled cache (slots 1..R, one NULL row last) and one step's tokens."""
    fam = GDNFamily(GEOMS["qwen35_122b"], act_dtype=torch.bfloat16, seed=seed)
    specs = fam.specs(L, window, torch.bfloat16)
    cache = fam.cache(specs, len(num_tokens) + 2)
    slots = torch.tensor([*range(1, len(num_tokens) + 1), NULL_BLOCK_ID])
    gen = torch.Generator().manual_seed(seed)
    cache.hp.copy_(torch.randn(cache.hp.shape, generator=gen))
    apply_prefill_hook(
        cache.hp, cache.lp, cache.meta, slots, buffer_len=L, window=window, stagger=True
    )
    q = [*num_tokens, 1]
    tok = fam.tokens(sum(q), gen)
    qsl = torch.tensor([0, *torch.tensor(q).cumsum(0).tolist()], dtype=torch.int32)
    return fam, cache, slots, tok, qsl


def _clone(cache: GDNReplayCache) -> GDNReplayCache:
    return GDNReplayCache(*(None if t is None else t.clone() for t in cache))


def _run(fn, fam, cache, slots, tok, window, **kwargs):
    p = fam.params
    out = torch.full(
        fam.out_shape(tok["v"].shape[0]), float("nan"), dtype=torch.bfloat16, device=tok["v"].device
    )
    fn(
        cache,
        tok["q"],
        tok["k"],
        tok["v"],
        tok["a"],
        tok["b"],
        p["A_log"],
        p["dt_bias"],
        slots,
        out,
        scale=fam.scale,
        buffer_len=L,
        window=window,
        **kwargs,
    )
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)  # bitwise, NaN garbage in unused rows included


def _assert_same(ours, theirs, out_ours, out_theirs):
    assert torch.equal(_bits(out_ours), _bits(out_theirs))
    for name, a, b in zip(GDNReplayCache._fields, ours, theirs, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(_bits(a), _bits(b)), name


# replayssm.route, speculative step -> the reference op gdn_decode must run on CPU tensors
CPU_ROUTES = {
    "auto_plain_replays": ("auto", False, "replay"),
    "replay_plain": ("replay", False, "replay"),
    "stock_plain": ("stock", False, "stock"),
    "stock_spec_replays": ("stock", True, "replay"),
}


@pytest.mark.parametrize("case", list(CPU_ROUTES))
def test_gdn_decode_on_cpu_runs_the_reference_route(case):
    route, spec, want = CPU_ROUTES[case]
    window = 3 if spec else 1
    fam, cache, slots, tok, qsl = _setup(window, [3, 2] if spec else [1, 1], seed=5)
    step = dict(query_start_loc=qsl) if spec else {}
    ours, theirs = _clone(cache), _clone(cache)
    for _ in range(L + 2):  # through a flush
        out_ours = _run(
            gdn_decode, fam, ours, slots, tok, window, stagger=True, route=route, **step
        )
        if want == "stock":
            out_theirs = _run(
                reference.gdn_stock_route_decode, fam, theirs, slots, tok, window, stagger=True
            )
        else:
            out_theirs = _run(reference.gdn_replay_decode, fam, theirs, slots, tok, window, **step)
        _assert_same(ours, theirs, out_ours, out_theirs)
    assert not torch.equal(ours.meta, cache.meta)


def test_gdn_decode_on_cpu_refuses_launch_overrides():
    fam, cache, slots, tok, _ = _setup(1, [1], seed=6)
    with pytest.raises(ValueError, match="launch overrides"):
        _run(gdn_decode, fam, cache, slots, tok, 1, stagger=True, launch={"route": "split"})
    with pytest.raises(ValueError, match="route must be one of"):
        _run(gdn_decode, fam, cache, slots, tok, 1, stagger=True, route="fused")


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["auto", "replay", "stock"])
def test_gdn_decode_on_gpu_runs_the_planned_kernel(route):
    """On CUDA tensors: the Triton launcher `plan_launch` names, with its configuration."""
    from vllm_replayssm.kernels.gdn.decode import gdn_replay_decode
    from vllm_replayssm.kernels.gdn.stock_route import gdn_stock_route_decode
    from vllm_replayssm.kernels.gdn.window import gdn_window_decode

    fam, cache, slots, tok, _ = _setup(1, [1] * 20, seed=7)
    fam.params = {k: v.cuda() for k, v in fam.params.items()}
    cache = GDNReplayCache(*(None if t is None else t.cuda() for t in cache))
    tok = {k: v.cuda() for k, v in tok.items()}
    slots = slots.cuda()
    cfg = plan_launch(route, slots.shape[0], V_PER_K, True)
    ours, theirs = _clone(cache), _clone(cache)
    for _ in range(L + 2):
        out_ours = _run(gdn_decode, fam, ours, slots, tok, 1, stagger=True, route=route)
        kernel = dict(cfg)
        kernel_route = kernel.pop("route")
        if kernel_route == "stock":
            out_theirs = _run(
                gdn_stock_route_decode, fam, theirs, slots, tok, 1, stagger=True, **kernel
            )
        elif kernel_route == "replay":
            out_theirs = _run(gdn_replay_decode, fam, theirs, slots, tok, 1, **kernel)
        else:
            out_theirs = _run(
                gdn_window_decode, fam, theirs, slots, tok, 1, route=kernel_route, **kernel
            )
        torch.cuda.synchronize()
        _assert_same(ours, theirs, out_ours, out_theirs)
