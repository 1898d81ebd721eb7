"""Triton Mamba-2 decode (plan / flush / readout for plain decode, the window step for
speculative decoding, the stock route) against the float64 oracle and the torch reference.

On CPU the kernels run in Triton's interpreter on tiny shapes (CI); on the GPU host the
same checks run at real geometries (`gpu` marker). Parameter tables change one factor per
row from their base row."""

import functools

import pytest
import torch

from vllm_replayssm.config import DEFAULT_BUFFER_LEN
from vllm_replayssm.kernels.mamba2 import decode, dispatch, readout, stock_route
from vllm_replayssm.kernels.mamba2.plan import Mamba2Scratch
from vllm_replayssm.layout import Mamba2Geometry

from ..checks import (
    check_hp_independent_of_lp,
    check_kernel_matches_reference,
    check_mixed_routes,
    check_scenario,
    out_tolerance,
)
from ..families import Mamba2Family
from .test_reference import GEOMS


def _op(**knobs):
    return functools.partial(decode.mamba2_replay_decode, **knobs)


# The readout and the flush of a speculative step as one launch (`fused.py`): by default
# for steps of up to 8 rows with an LP copy, so every step of these tests (at most 8 rows),
# and for one-row steps HP only (decode.FUSED_MAX_ROWS_LP / _HP). FUSED takes it for every
# step, UNFUSED for none, MIXED for the one-row steps of a scenario (rows join and leave).
FUSED = dict(fused_max_rows=8)
UNFUSED = dict(fused_max_rows=0)
MIXED = dict(fused_max_rows=1)
# The fused launch's tile: 16 rows on two warps by default; the former default, the flush's
# window tile (32 rows on four warps), and 16 rows on four warps stay knobs.
FUSED32 = dict(FUSED, fused_block_p=32, fused_warps=4)
FUSED16_4_WARPS = dict(FUSED, fused_block_p=16, fused_warps=4)
DOT = dict(readout_products="dot", flush_products="dot")
# The products windows took before tensor cores became their default (decode.launch_config).
FMA = dict(readout_products="fma", flush_products="fma")

# Decode scenarios against the float64 oracle (outputs every step, materialised states).
SCENARIO_BASE = dict(
    geom="tiny", L=4, T=1, lp=None, act=torch.float32, churn=False, knobs={}, cycles=3
)
# headdim 40: three 16-row tiles per head, the last one partly masked
SCENARIO_GEOMS = {**GEOMS, "wide_head": Mamba2Geometry(nheads=4, headdim=40, dstate=16, ngroups=2)}
SCENARIOS = {
    "base": {},
    "lp_fp16": dict(lp=torch.float16),
    "lp_bf16": dict(lp=torch.bfloat16),
    "L16": dict(L=16),
    # the default ring with an LP copy (config.DEFAULT_BUFFER_LEN), two cycles of it
    "L32_lp_bf16": dict(L=32, lp=torch.bfloat16, cycles=2),
    "nano4b_geometry": dict(geom="nemotron_nano4b"),  # headdim 10, 12 heads per group
    "super_geometry": dict(geom="nemotron_super"),  # 16 heads per group
    "act_bf16": dict(act=torch.bfloat16),
    "churn": dict(churn=True),  # rows join and leave: fresh pages, NULL rows, new slots
    "one_flush_program": dict(knobs=dict(flush_programs=1)),  # the persistent loop
    "readout_block_p_8": dict(knobs=dict(readout_block_p=8)),  # several tiles per head
    # windows, default products ("dot" readouts, the flush's "dot" with an LP copy) and
    # "fma"; the plan, then the readout and the flush fused or not (above)
    "spec_T3": dict(L=5, T=3),
    "spec_T3_fused": dict(L=5, T=3, knobs=FUSED),
    "spec_T3_unfused": dict(L=5, T=3, knobs=UNFUSED),
    "spec_T3_fma": dict(L=5, T=3, knobs=FMA),
    "spec_T3_fma_fused": dict(L=5, T=3, knobs={**FMA, **FUSED}),
    "spec_T2_lp_fp16_churn": dict(L=4, T=2, lp=torch.float16, churn=True),
    "spec_T2_lp_fp16_churn_mixed": dict(L=4, T=2, lp=torch.float16, churn=True, knobs=MIXED),
    "spec_T4_L16_lp_bf16": dict(L=16, T=4, lp=torch.bfloat16),  # the production shape
    # The production shape's knob variants run one cycle of steps (26): at T = 4 a row
    # commits up to 4 tokens a step, so each of the 3 rows still flushes several times.
    "spec_T4_L16_lp_bf16_unfused": dict(L=16, T=4, lp=torch.bfloat16, knobs=UNFUSED, cycles=1),
    # a longer ring (buffer_len 32: a flush about every eighth step at T = 4; one cycle of
    # steps, 50: several flushes per row)
    "spec_T4_L32_lp_bf16_unfused": dict(L=32, T=4, lp=torch.bfloat16, knobs=UNFUSED, cycles=1),
    "spec_T4_L16_lp_bf16_fma": dict(L=16, T=4, lp=torch.bfloat16, knobs={**FMA, **MIXED}, cycles=1),
    "spec_T3_wide_head_fused": dict(geom="wide_head", L=5, T=3, knobs=FUSED),
    "spec_T4_wide_head_lp_bf16_fused": dict(geom="wide_head", L=8, T=4, lp=torch.bfloat16),
    "spec_T4_wide_head_lp_bf16_fused32": dict(
        geom="wide_head", L=8, T=4, lp=torch.bfloat16, knobs=FUSED32
    ),
    # The window's readouts (the readout launch's and the flush's) in tensor-core products,
    # one row per product kind of the readout's tile: an fp32 tile against fp32 C (tf32x3),
    # bf16 LP and bf16 C (dot16), an fp32 tile against bf16 C (bf16x3), fp16 LP and fp16
    # C with churn (dot16); the flush's fp32 tile takes tf32x3 or bf16x3; T = 3: masked
    # token slots.
    "spec_T3_dot": dict(L=5, T=3, knobs=DOT),
    "spec_T4_L16_lp_bf16_dot": dict(
        L=16, T=4, lp=torch.bfloat16, act=torch.bfloat16, knobs=DOT, cycles=1
    ),
    "spec_T4_act_bf16_dot": dict(L=8, T=4, act=torch.bfloat16, knobs=DOT),
    "spec_T2_lp_fp16_churn_dot": dict(
        L=4,
        T=2,
        lp=torch.float16,
        act=torch.float16,
        churn=True,
        knobs=DOT,
    ),
    # a register cap on the window flush (the interpreter ignores it; the GPU test runs it)
    "spec_T3_flush_maxnreg": dict(L=5, T=3, knobs=dict(flush_maxnreg=128, **UNFUSED)),
}


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_kernel_matches_naive(case, device):
    c = {**SCENARIO_BASE, **SCENARIOS[case]}
    fam = Mamba2Family(
        SCENARIO_GEOMS[c["geom"]],
        act_dtype=c["act"],
        decode_op=_op(**c["knobs"]),
        device=device,
        seed=3,
    )
    check_scenario(
        fam,
        L=c["L"],
        T=c["T"],
        lp=c["lp"],
        spec=c["T"] > 1,
        churn=c["churn"],
        requests=3,
        cycles=c["cycles"],
        seed=len(case),
    )


# Lockstep with the torch reference: outputs, cursor words (exact), records, HP and LP.
# out_tol None: `out_tolerance`; the window readouts' tensor-core products from an fp32
# tile are held to 1e-6 (fp32-accurate: a bf16x3 product without its low part is 5e-6 off).
LOCKSTEP_BASE = dict(lp=None, T=1, stock_share=0.0, act=torch.float16, knobs={}, out_tol=None)
LOCKSTEP = {
    "base": {},
    "lp_fp16": dict(lp=torch.float16),
    "lp_bf16": dict(lp=torch.bfloat16),
    "spec_T3": dict(T=3),
    "spec_T3_fused": dict(T=3, knobs=FUSED),
    "spec_T3_fma": dict(T=3, knobs=FMA),
    "stock_route_steps_lp_bf16": dict(lp=torch.bfloat16, stock_share=0.4),  # stale LP
    "spec_T3_dot": dict(T=3, knobs=DOT, out_tol=1e-6),  # fp32 tile, fp16 C: tf32x3
    "spec_T3_act_bf16_dot": dict(T=3, act=torch.bfloat16, knobs=DOT, out_tol=1e-6),  # bf16x3
    "spec_T3_lp_fp16_dot": dict(T=3, lp=torch.float16, knobs=DOT),  # dot16
}


@pytest.mark.parametrize("case", list(LOCKSTEP))
def test_kernel_matches_reference_buffers(case, device):
    c = {**LOCKSTEP_BASE, **LOCKSTEP[case]}
    check_kernel_matches_reference(
        lambda op: Mamba2Family(
            GEOMS["tp_groups"], act_dtype=c["act"], device=device, decode_op=op, seed=4
        ),
        _op(**c["knobs"]),
        L=4,
        T=c["T"],
        lp=c["lp"],
        out_tol=c["out_tol"] or out_tolerance(c["lp"], device),
        stock_route_op=stock_route.mamba2_stock_route_decode if c["stock_share"] else None,
        stock_share=c["stock_share"],
    )


@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["none", "bf16"])
def test_stock_route_interleaved(lp, device):
    """Stock-route steps (HP alone, LP marked stale) between replay steps, against the
    oracle: a replay step that read a stale LP would be off by the LP-vs-HP difference."""
    fam = Mamba2Family(
        GEOMS["tiny"],
        act_dtype=torch.bfloat16,
        device=device,
        seed=9,
        decode_op=_op(),
        stock_route_op=stock_route.mamba2_stock_route_decode,
    )
    check_mixed_routes(fam, L=4, lp=lp)


def test_hp_independent_of_lp(device):
    """The flush reads HP only: HP after every flush is bitwise the same with LP off, bf16
    and fp16."""
    check_hp_independent_of_lp(
        lambda: Mamba2Family(
            GEOMS["tiny"], act_dtype=torch.bfloat16, device=device, seed=5, decode_op=_op()
        ),
        L=4,
        T=1,
        spec=False,
    )


def test_dispatch_routes(device):
    """The route policy: plain decode of few rows takes the stock route under "auto",
    speculative steps always replay, bad names are refused."""
    assert dispatch.choose_route("auto", dispatch.STOCK_ROUTE_MAX_ROWS, plain=True) == "stock"
    assert dispatch.choose_route("auto", dispatch.STOCK_ROUTE_MAX_ROWS + 1, True) == "replay"
    assert dispatch.choose_route("stock", 4, plain=False) == "replay"
    assert dispatch.choose_route("replay", 1, plain=True) == "replay"
    with pytest.raises(ValueError, match="route must be one of"):
        dispatch.choose_route("fused", 1, plain=True)


def test_window_readout_products():
    """The window readout's product kind by tile and C dtypes, and the refusals: unknown
    names, "dot" for plain decode, tiles below a tensor-core product's 16 rows."""
    wp = readout.window_products
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    assert wp("fma", fp32, bf16, 8, plain=True) == "fma"
    assert wp("dot", bf16, bf16, 16, plain=False) == "dot16"
    assert wp("dot", fp16, fp16, 16, plain=False) == "dot16"
    assert wp("dot", fp32, bf16, 16, plain=False) == "bf16x3"
    assert wp("dot", fp32, fp16, 16, plain=False) == "tf32x3"
    assert wp("dot", bf16, fp16, 32, plain=False) == "tf32x3"
    with pytest.raises(ValueError, match="one of"):
        wp("mma", bf16, bf16, 16, plain=False)
    with pytest.raises(ValueError, match="speculative windows only"):
        wp("dot", bf16, bf16, 16, plain=True)
    with pytest.raises(ValueError, match="readout_block_p >= 16, got 8"):
        wp("dot", bf16, bf16, 8, plain=False)
    with pytest.raises(ValueError, match="flush_block_p >= 16, got 8"):
        wp("dot", fp32, bf16, 8, plain=False, launch="flush")


@pytest.mark.parametrize(
    "knobs, match",
    [
        (dict(flush_maxnreg=-1), "flush_maxnreg must be >= 0"),
        (dict(readout_products="dot"), "speculative windows only"),
        (dict(flush_products="mma"), "flush_products must be one of"),
    ],
    ids=["negative_register_cap", "plain_dot_readout", "unknown_flush_products"],
)
def test_bad_launch_knobs_are_refused_before_any_launch(knobs, match, device):
    """A bad knob is refused before the plan launch: the page (cursor words, records,
    checkpoint) stays as it was."""
    fam = Mamba2Family(GEOMS["tiny"], device=device, seed=1)
    cache = fam.cache(fam.specs(4, 1, None), 4)
    before = {k: v.clone() for k, v in cache._asdict().items() if v is not None}
    with pytest.raises(ValueError, match=match):
        _plain_step(fam, cache, [1, 2], **knobs)
    after = cache._asdict()
    for k, v in before.items():  # bit for bit: never-written pages may hold NaN
        assert torch.equal(v.view(torch.uint8), after[k].contiguous().view(torch.uint8)), k


def test_resolved_config_is_memoised_but_refuses_every_time():
    """The memo of a batch shape's launch knobs (`decode.resolved_config`) hands out a new
    dict each call (callers may change it), answers as `launch_config` with the knobs
    applied, and refuses a bad knob on every call (a refusal is never remembered)."""
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    shape = (4, 8, 16, 32, bf16, bf16, cpu, 4, False)
    a = decode.resolved_config(*shape, {"flush_warps": 2})
    want = decode.launch_config(4, 8, 16, 32, 2, cpu, 4)
    assert a == {**want, "flush_warps": 2}
    a["flush_warps"] = 8
    assert decode.resolved_config(*shape, {"flush_warps": 2})["flush_warps"] == 2
    assert decode.resolved_config(*shape, {}) == want
    for _ in range(2):
        with pytest.raises(ValueError, match="unknown decode knobs"):
            decode.resolved_config(*shape, {"flush_wraps": 2})
        with pytest.raises(ValueError, match="flush_maxnreg must be >= 0"):
            decode.resolved_config(*shape, {"flush_maxnreg": -1})
    # an unhashable knob value bypasses the memo (and is refused here as a bad products name)
    with pytest.raises(ValueError, match="readout_products must be one of"):
        decode.resolved_config(*shape, {"readout_products": ["dot"]})


def test_fused_tile_below_16_rows_refuses_dot_products():
    """The fused launch's one tile serves both bodies: with either product "dot" it needs
    16 rows (a tensor-core product's smallest M), refused before anything is launched;
    steps above fused_max_rows do not run it and are not refused."""
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    shape = (4, 8, 16, 32, bf16, bf16, cpu, 4, False)
    with pytest.raises(ValueError, match='readout_products and flush_products "dot" need'):
        decode.resolved_config(*shape, {"fused_block_p": 8})
    with pytest.raises(ValueError, match='flush_products "dot" need fused_block_p >= 16'):
        decode.resolved_config(*shape, {"fused_block_p": 8, "readout_products": "fma"})
    fma = {"readout_products": "fma", "flush_products": "fma"}
    assert decode.resolved_config(*shape, {"fused_block_p": 8, **fma})["fused_block_p"] == 8
    assert decode.resolved_config(*shape, {"fused_block_p": 8, "fused_max_rows": 2})


def test_fused_launch_policy():
    """Which steps run the readout and the flush as one launch by default: speculative
    steps of up to 8 rows with a 2-byte LP copy, of one row HP only, plain steps never (the
    H100 sweep in `decode.launch_config`), on 16-row tiles and two warps (the H200 sweep)."""
    cpu = torch.device("cpu")
    for itemsize, window, want in ((2, 4, 8), (4, 4, 1), (2, 1, 0), (4, 1, 0)):
        cfg = decode.launch_config(8, 8, 64, 128, itemsize, cpu, window)
        assert cfg["fused_max_rows"] == want, (itemsize, window)
        assert (cfg["fused_block_p"], cfg["fused_warps"]) == (16, 2), (itemsize, window)


# Bad arguments of a decode step, each refused with the tensor's name before any launch:
# name -> (the page's tensor or the argument, how it is spoiled, message).
BAD_ARGS = {
    "ring_x_dtype": ("ring_x", lambda t: t.half(), "ring_x: dtype"),
    "hp_dtype": ("hp", lambda t: t.double(), "hp: dtype"),
    "meta_shape": ("meta", lambda t: t[:, :4], "meta: shape"),
    "out_shape": ("out", lambda t: t[:2], "out: shape"),
    "D_shape": ("D", lambda t: t[:1], "D: shape"),
    "C_shape": ("C", lambda t: t[:, :, :1], "C: shape"),
}


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_bad_arguments_are_refused_by_name(case, device):
    """`decode.check_args` names the first tensor that does not fit (shape or dtype), and
    nothing is launched: the page stays as it was."""
    fam = Mamba2Family(GEOMS["tiny"], device=device, seed=1)
    cache = fam.cache(fam.specs(4, 1, None), 4)
    tok = fam.tokens(3, torch.Generator().manual_seed(0))
    args = dict(out=torch.empty(fam.out_shape(3), device=device), D=fam.params["D"], C=tok["C"])
    name, spoil, match = BAD_ARGS[case]
    bad = cache
    if name in args:
        args[name] = spoil(args[name])
    else:
        bad = cache._replace(**{name: spoil(getattr(cache, name))})
    before = {k: v.clone() for k, v in cache._asdict().items() if v is not None}
    with pytest.raises(ValueError, match=match):
        decode.mamba2_replay_decode(
            bad,
            tok["x"],
            tok["dt"],
            fam.params["A"],
            tok["B"],
            args["C"],
            args["D"],
            fam.params["dt_bias"],
            torch.tensor([1, 2, 3], device=device),
            args["out"],
            buffer_len=4,
            window=1,
        )
    for k, v in before.items():
        assert torch.equal(v.view(torch.uint8), cache._asdict()[k].contiguous().view(torch.uint8))


def test_scratch_too_small_is_refused(device):
    fam = Mamba2Family(GEOMS["tiny"], device=device, seed=1)
    cache = fam.cache(fam.specs(4, 1, None), 4)
    small = Mamba2Scratch.allocate(2, fam.geom.nheads, 4, device)
    with pytest.raises(ValueError, match="too small"):
        _plain_step(fam, cache, [1, 2, 3], scratch=small)


def _plain_step(fam, cache, slots: list[int], **kwargs) -> None:
    """One plain decode step (buffer_len 4) of the kernels on `slots` with fresh tokens."""
    device = cache.hp.device
    tok = fam.tokens(len(slots), torch.Generator().manual_seed(0))
    decode.mamba2_replay_decode(
        cache,
        tok["x"],
        tok["dt"],
        fam.params["A"],
        tok["B"],
        tok["C"],
        fam.params["D"],
        fam.params["dt_bias"],
        torch.tensor(slots, device=device),
        torch.empty(fam.out_shape(len(slots)), device=device),
        buffer_len=4,
        window=1,
        **kwargs,
    )


def _strided_column(slots: list[int], width: int, device) -> torch.Tensor:
    """Column 0 of a [R, width] table whose rows repeat each slot: vLLM's decode state
    indices under speculative decoding with FULL CUDA graphs ([max_bs, 1 + k] buffer)."""
    table = torch.tensor(slots, dtype=torch.int32, device=device)[:, None].repeat(1, width)
    return table[:, 0]


@pytest.mark.parametrize("window", [1, 4], ids=["plain", "spec"])
def test_strided_state_indices_are_refused(window, device):
    """The kernels read row r's slot at offset r: a strided view (the H200 defect of
    2026-12-02, rows > 0 stepping row 0's slot) is refused, plain and speculative alike, and
    by the stock route."""
    fam = Mamba2Family(GEOMS["tiny"], device=device, seed=1)
    cache = fam.cache(fam.specs(8, window, None), 6)
    tok = fam.tokens(3, torch.Generator().manual_seed(0))
    out = torch.empty(fam.out_shape(3), device=device)
    slots = _strided_column([1, 2, 3], 4, device)
    assert slots.stride(0) == 4
    common = dict(buffer_len=8, window=window)
    if window > 1:
        qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=device)
        common.update(query_start_loc=qsl)
    args = (tok["x"], tok["dt"], fam.params["A"], tok["B"], tok["C"], fam.params["D"])
    with pytest.raises(ValueError, match="state_indices: stride 4"):
        decode.mamba2_replay_decode(cache, *args, fam.params["dt_bias"], slots, out, **common)
    if window == 1:
        with pytest.raises(ValueError, match="state_indices: stride 4"):
            stock_route.mamba2_stock_route_decode(
                cache, *args, fam.params["dt_bias"], slots, out, stagger=True, **common
            )


REAL = {
    "nemotron3_super": Mamba2Geometry(128, 64, 128, 8),
    "nemotron3_nano4b": Mamba2Geometry(96, 80, 128, 8),
}


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp", "lp_bf16"])
@pytest.mark.parametrize("T", [1, 4])
def test_real_geometry_on_gpu(geom, lp, T):
    """At the ring length that runs by default (32 steps with an LP copy, 16 HP only)."""
    fam = Mamba2Family(REAL[geom], act_dtype=torch.bfloat16, device="cuda", seed=1, decode_op=_op())
    L = DEFAULT_BUFFER_LEN[("mamba2", lp is not None)]
    check_scenario(fam, L=L, T=T, lp=lp, spec=T > 1, requests=8, cycles=2)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lp", [None, torch.bfloat16, torch.float16], ids=["hp", "lp_bf16", "lp_fp16"]
)
@pytest.mark.parametrize("T", [1, 4])
def test_real_geometry_lockstep_on_gpu(lp, T):
    check_kernel_matches_reference(
        lambda op: Mamba2Family(
            REAL["nemotron3_super"], act_dtype=torch.bfloat16, device="cuda", decode_op=op, seed=4
        ),
        _op(),
        L=16,
        T=T,
        lp=lp,
        out_tol=out_tolerance(lp, "cuda"),
        requests=6,
    )


# Window launch knobs not on by default, on the GPU (up to 6 rows): the readouts in
# elementwise products; both in tensor-core products (the flush's is the default with an
# LP copy only); the flush capped at 128 registers with four programs per SM; the readout
# and the flush as one launch for every step (the default with an LP copy at these rows),
# on its default 16-row tiles on two warps, on 32 rows on four (the former default) and on
# 16 rows on four (fused_block_p, fused_warps).
WINDOW_KNOBS = {
    "fma": FMA,
    "dot": DOT,
    "flush_maxnreg128": dict(flush_maxnreg=128, flush_programs=528, **UNFUSED),
    "fused": FUSED,
    "fused32": FUSED32,
    "fused16_4_warps": FUSED16_4_WARPS,
}


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", list(WINDOW_KNOBS))
@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp", "lp_bf16"])
def test_real_geometry_window_knobs_on_gpu(lp, knobs):
    """The window step with launch knobs that are not (all) the defaults at Nemotron-3
    Super, T = 4: lockstep with the torch reference (bf16 activations; with products "dot":
    bf16x3 for HP tiles, one bf16 product for the LP tile) and the float64 oracle."""
    op = _op(**WINDOW_KNOBS[knobs])
    check_kernel_matches_reference(
        lambda o: Mamba2Family(
            REAL["nemotron3_super"], act_dtype=torch.bfloat16, device="cuda", decode_op=o, seed=4
        ),
        op,
        L=16,
        T=4,
        lp=lp,
        out_tol=out_tolerance(lp, "cuda"),
        requests=6,
    )
    fam = Mamba2Family(
        REAL["nemotron3_super"], act_dtype=torch.bfloat16, device="cuda", seed=1, decode_op=op
    )
    check_scenario(fam, L=16, T=4, lp=lp, spec=True, requests=8, cycles=2)


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp", "lp_bf16"])
def test_real_geometry_stock_route_on_gpu(geom, lp):
    fam = Mamba2Family(
        REAL[geom],
        act_dtype=torch.bfloat16,
        device="cuda",
        seed=2,
        decode_op=_op(),
        stock_route_op=stock_route.mamba2_stock_route_decode,
    )
    check_mixed_routes(fam, L=16, lp=lp, rounding=None)
