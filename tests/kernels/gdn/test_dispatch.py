"""GDN dispatcher (`kernels/gdn/dispatch.py`): the route policy (`launch_config`,
`plan_launch`) and `gdn_decode` running the op that policy names, checked against calling
that op directly (every buffer bitwise); on CPU tensors (the layer's CPU path), its
precision against vLLM's own CPU decode op and the float64 oracle."""

import pytest
import torch

from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook
from vllm_replayssm.kernels.gdn import reference
from vllm_replayssm.kernels.gdn.dispatch import (
    FUSED_ROUTE_MAX_ROWS,
    FUSED_ROUTE_MAX_ROWS_HP_ONLY,
    STOCK_ROUTE_MAX_ROWS,
    STOCK_ROUTE_MAX_ROWS_HP_ONLY,
    chosen_route,
    gdn_decode,
    launch_config,
    plan_launch,
)
from vllm_replayssm.layout import NULL_BLOCK_ID, GDNGeometry, GDNReplayCache

from ..families import GDNFamily
from ..tolerances import TOL
from .test_reference import GEOMS

L = 4


# (num_rows, plain, has_lp) -> route, heads_per_program (None: no head loop)
POLICY = {
    "plain_bs1": (1, True, True, "stock", None),
    "plain_at_threshold": (STOCK_ROUTE_MAX_ROWS, True, True, "stock", None),
    "plain_above_threshold": (STOCK_ROUTE_MAX_ROWS + 1, True, True, "replay", None),
    # HP only replay reads twice the checkpoint bytes: the crossover is later
    "hp_only_at_threshold": (STOCK_ROUTE_MAX_ROWS_HP_ONLY, True, False, "stock", None),
    "hp_only_above_threshold": (STOCK_ROUTE_MAX_ROWS_HP_ONLY + 1, True, False, "replay", None),
    "plain_bs256": (256, True, True, "replay", None),
    "hp_only_bs256": (256, True, False, "replay", None),
    "spec_bs1": (FUSED_ROUTE_MAX_ROWS, False, True, "fused", 1),
    "spec_bs2": (FUSED_ROUTE_MAX_ROWS + 1, False, True, "split", None),
    # HP only the fused step reads twice the bytes per row and wins one row further
    "spec_hp_only_at_threshold": (FUSED_ROUTE_MAX_ROWS_HP_ONLY, False, False, "fused", 1),
    "spec_hp_only_above_threshold": (
        FUSED_ROUTE_MAX_ROWS_HP_ONLY + 1,
        False,
        False,
        "split",
        None,
    ),
    "spec_bs16": (16, False, True, "split", None),
    "spec_bs64": (64, False, False, "split", None),
    "spec_bs64_lp": (64, False, True, "split", None),
}


def test_hp_only_threshold_is_later():
    assert STOCK_ROUTE_MAX_ROWS < STOCK_ROUTE_MAX_ROWS_HP_ONLY
    assert FUSED_ROUTE_MAX_ROWS < FUSED_ROUTE_MAX_ROWS_HP_ONLY


@pytest.mark.parametrize("case", list(POLICY))
def test_launch_config(case):
    rows, plain, has_lp, route, hpp = POLICY[case]
    cfg = launch_config(rows, plain=plain, has_lp=has_lp)
    assert cfg["route"] == route
    assert cfg.get("heads_per_program") == hpp
    if route == "replay":  # the replay launches take decode.launch_config's knobs
        assert cfg == {"route": "replay"}
    else:  # 16-row value tiles on one warp (the planned readout: several per program)
        assert cfg["block_v"] == 16 and cfg["num_warps"] == 1
    want = "stock" if route == "stock" else "replay"
    assert chosen_route("auto", rows, plain, has_lp=has_lp) == want
    # Planned window steps read flush rows' fresh LP copy when there is one.
    assert cfg.get("flush_rows_read") == ("lp" if route == "split" and has_lp else None)


@pytest.mark.parametrize("bf16_keys", [True, False])
def test_window_steps_fold_in_wy_form_with_bf16_keys(bf16_keys):
    """Planned split steps fold flush rows in WY form and take the readout's LP products in bf16
    (the keys' two larger parts), fused steps fold in WY form HP only: exact bf16 products, which
    only bf16 k records allow; other key dtypes keep the serial fold and tf32x3 products."""
    split = launch_config(64, plain=False, bf16_keys=bf16_keys)
    assert split["route"] == "split"
    assert split["readout_tiles"] == 0 and split["readout_stages"] == 2  # the tile loop
    assert split["flush_stages"] == 1
    wy = dict(flush_precision="bf16x3", readout_precision="bf16x2")  # 16-bit keys
    assert {k: split.get(k) for k in wy} == (wy if bf16_keys else dict.fromkeys(wy))
    for has_lp in (True, False):
        fused = launch_config(1, plain=False, has_lp=has_lp, bf16_keys=bf16_keys)
        assert fused["route"] == "fused" and "readout_precision" not in fused
        want = "bf16x3" if bf16_keys and not has_lp else None
        assert fused.get("flush_precision") == want


# (replayssm.route, num_rows, plain, launch overrides) -> the kernel route that runs
ROUTES = {
    "auto_plain_small": ("auto", 4, True, None, "stock"),
    "auto_plain_large": ("auto", 64, True, None, "replay"),
    "auto_spec_one_row": ("auto", 1, False, None, "fused"),
    "auto_spec": ("auto", 4, False, None, "split"),
    "replay_plain_small": ("replay", 4, True, None, "replay"),
    "stock_plain_large": ("stock", 64, True, None, "stock"),
    "stock_spec_replays": ("stock", 4, False, None, "split"),
    "override_fused": ("auto", 4, False, {"route": "fused"}, "fused"),
    "override_split": ("auto", 4, True, {"route": "split"}, "split"),
    "override_stock": ("replay", 4, True, {"route": "stock", "block_v": 8}, "stock"),
    "override_replay_knob": ("auto", 64, True, {"readout_warps": 2}, "replay"),
}


@pytest.mark.parametrize("case", list(ROUTES))
def test_plan_launch(case):
    route, rows, plain, launch, want = ROUTES[case]
    cfg = plan_launch(route, rows, plain, launch)
    assert cfg["route"] == want
    if want == "stock":
        assert set(cfg) == {"route", "block_v", "num_warps"}
    elif want == "fused":  # a forced window form starts from its configuration
        assert cfg["heads_per_program"] == 1 and cfg["num_stages"] == 1
    elif want == "split":  # no head loop: its plan, flush and readout take other knobs
        assert "heads_per_program" not in cfg and "num_stages" not in cfg
        assert cfg["readout_tiles"] == 0 and cfg["flush_stages"] == 1
    for key, val in (launch or {}).items():
        assert cfg[key] == val


def test_plan_launch_refuses():
    with pytest.raises(ValueError, match="route must be one of"):
        plan_launch("fused", 4, True)
    with pytest.raises(ValueError, match="plain decode"):
        plan_launch("auto", 4, False, {"route": "stock"})
    with pytest.raises(ValueError, match="plain decode"):
        plan_launch("auto", 4, False, {"route": "replay"})
    with pytest.raises(ValueError, match="launch route must be one of"):
        plan_launch("auto", 4, True, {"route": "both"})


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
    cfg = plan_launch(route, slots.shape[0], True)
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


# --- Precision of the CPU path against vLLM's own CPU op --------------------------------------
# The geometry of the tiny Qwen3-Next engine checkpoint (vLLM's CPU op takes head dims 64 or
# 128), bf16 activations as in the engine, three flush cycles.
CPU_OP_GEOM = GDNGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=64)
CPU_OP_ROWS, CPU_OP_STEPS = 4, 3 * L + 2

# replayssm settings on CPU tensors -> (route, LP dtype)
PRECISION_ROUTES = {
    "replay_hp_only": ("replay", None),
    "stock_route": ("stock", None),
    "replay_lp_bf16": ("replay", torch.bfloat16),
}


def _step_errors(ys: list[torch.Tensor], ref: torch.Tensor) -> torch.Tensor:
    """Relative Frobenius error of each step's outputs [R, Hv, V] against ref [steps, ...]."""
    y = torch.stack(ys).double()
    return (y - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)


@pytest.mark.parametrize("case", list(PRECISION_ROUTES))
def test_gdn_decode_on_cpu_is_as_precise_as_vllm_cpu_op(case):
    """The layer's CPU decode core (`gdn_decode` on CPU tensors; the conv before it is vLLM's
    own function) against vLLM's CPU GDN decode op on the same inputs and state, both
    against the float64 recurrence (errors per step, relative Frobenius over 4 rows, 26
    steps). Measured: HP-only replay and the stock route, fp32 outputs, against the oracle
    with beta rounded to bf16 (our references' contract; vLLM's GPU decode kernel and its
    gating op round it so): 1.9e-7 at most, fp32 throughout. With the bf16 outputs the layer
    writes (vLLM's op writes bf16 too), against the oracle with beta unrounded (transformers'
    float32 model): ours 1.8e-3 mean / 2.0e-3 max, vLLM's op 2.0e-3 / 2.3e-3 (it forms beta
    in bf16 arithmetic); LP bf16 replay 2.3e-3 / 2.5e-3 (1.6e-3 before the output rounding).
    Held: the fp32 paths to the float32 bound and to no more error than vLLM's op; LP (a
    bf16 state read by design) to the bf16 bound."""
    from vllm import _custom_ops as ops

    route, lp = PRECISION_ROUTES[case]
    R, steps = CPU_OP_ROWS, CPU_OP_STEPS
    fam = GDNFamily(CPU_OP_GEOM, act_dtype=torch.bfloat16, seed=3)
    fam.params["dt_bias"] = fam.params["dt_bias"].to(torch.bfloat16)  # the checkpoint's dtype
    A_log, dt_bias = fam.params["A_log"], fam.params["dt_bias"]
    gen = torch.Generator().manual_seed(3)
    S0 = torch.stack([fam.initial_state(gen) for _ in range(R)])  # [R, Hv, V, K]
    toks = [fam.tokens(R, gen) for _ in range(steps)]
    slots = torch.arange(1, R + 1)

    def oracle(beta_dtype: torch.dtype | None) -> torch.Tensor:  # [steps, R, Hv, V] float64
        ys = []
        for r in range(R):
            seq = {k: torch.stack([t[k][r] for t in toks]) for k in toks[0]}
            if beta_dtype is not None:  # naive rounds beta to b's dtype
                seq["b"] = seq["b"].to(beta_dtype)
            ys.append(fam.naive(S0[r].double(), seq)[0])
        return torch.stack(ys, 1)

    rounded_beta, exact_beta = oracle(None), oracle(torch.float64)

    cache = fam.cache(fam.specs(L, 1, lp), R + 1)
    cache.hp[1:] = S0
    apply_prefill_hook(cache.hp, cache.lp, cache.meta, slots, buffer_len=L, window=1, stagger=True)
    # vLLM's CPU kernels keep each head's state as [K, V] in the memory declared [V, K].
    vllm_state = torch.zeros(R + 1, *fam.state_shape)
    k_major = vllm_state.view(R + 1, CPU_OP_GEOM.num_v_heads, CPU_OP_GEOM.head_k_dim, -1)
    k_major[1:] = S0.transpose(-1, -2)
    ours: list[torch.Tensor] = []
    theirs: list[torch.Tensor] = []
    for tok in toks:
        out = torch.full(fam.out_shape(R), float("nan"))  # fp32: the arithmetic before rounding
        args = (tok["q"], tok["k"], tok["v"], tok["a"], tok["b"], A_log, dt_bias, slots, out)
        gdn_decode(cache, *args, scale=fam.scale, buffer_len=L, window=1, stagger=True, route=route)
        ours.append(out)
        o = ops.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=A_log,
            dt_bias=dt_bias,
            q=tok["q"][None],
            k=tok["k"][None],
            v=tok["v"][None],
            a=tok["a"],
            b=tok["b"],
            initial_state_source=k_major,
            initial_state_indices=slots.to(torch.int32),
            cu_seqlens=torch.arange(R + 1, dtype=torch.int32),
            use_qk_l2norm_in_kernel=True,
        )
        theirs.append(o.reshape(fam.out_shape(R)))

    ours_bf16 = _step_errors([y.to(torch.bfloat16) for y in ours], exact_beta)
    vllm_bf16 = _step_errors(theirs, exact_beta)
    if lp is None:
        assert _step_errors(ours, rounded_beta).max() <= TOL[torch.float32]
        assert ours_bf16.mean() <= vllm_bf16.mean(), (ours_bf16, vllm_bf16)
        assert ours_bf16.max() <= vllm_bf16.max(), (ours_bf16, vllm_bf16)
    else:
        assert _step_errors(ours, rounded_beta).max() <= TOL[lp]
        assert ours_bf16.max() <= TOL[lp]
