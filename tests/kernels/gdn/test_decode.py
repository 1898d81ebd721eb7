"""Triton GDN plain decode (plan / flush / readout, `decode.py`) against the float64 oracle
and the torch reference.

On CPU the kernels run in Triton's interpreter on tiny shapes (CI); on the GPU host the
same checks run at real geometries (`gpu` marker). Parameter tables change one factor per
row from their base row."""

import functools

import pytest
import torch

from vllm_replayssm.kernels.gdn import decode, readout
from vllm_replayssm.kernels.gdn import stock_route as gdn_stock
from vllm_replayssm.kernels.gdn.plan import GDNScratch
from vllm_replayssm.layout import GDNGeometry

from ..checks import (
    check_hp_independent_of_lp,
    check_kernel_matches_reference,
    check_mixed_routes,
    check_scenario,
    out_tolerance,
)
from ..families import GDNFamily
from .test_reference import GEOMS

# One value head per key head (Hv / Hk = 1), besides test_reference's geometries.
GEOMS = {
    **GEOMS,
    "one_v_per_k": GDNGeometry(num_k_heads=2, num_v_heads=2, head_k_dim=8, head_v_dim=8),
}


def _op(**knobs):
    return functools.partial(decode.gdn_replay_decode, **knobs)


# Decode scenarios against the float64 oracle (outputs every step, materialised states).
SCENARIO_BASE = dict(
    geom="tiny",
    L=4,
    lp=None,
    act=torch.float32,
    exact=True,
    churn=False,
    stagger=True,
    rounding=None,
    knobs={},
    d_lp=False,
)
SCENARIOS = {
    "base": {},  # 2 key heads, 2 value heads each
    "lp_fp16": dict(lp=torch.float16),
    "lp_bf16": dict(lp=torch.bfloat16),
    # d records in the LP dtype (gdn_d_dtype "lp"): the readouts' history reads them
    "lp_fp16_d_lp": dict(lp=torch.float16, d_lp=True),
    "lp_bf16_d_lp": dict(lp=torch.bfloat16, d_lp=True),
    "fold": dict(exact=False),
    # fold mode sums cached d, which follow the LP read: HP carries LP's rounding (by design)
    "fold_lp_bf16": dict(exact=False, lp=torch.bfloat16, rounding=torch.bfloat16),
    "L16": dict(L=16),
    "act_bf16": dict(act=torch.bfloat16),
    "one_v_per_k": dict(geom="one_v_per_k"),
    "qwen35_122b_geometry": dict(geom="qwen35_122b"),  # 1 key head, 4 value heads
    "uneven_geometry": dict(geom="uneven"),  # K = 12, V = 20, 3 value heads per key head
    "churn": dict(churn=True),  # rows join and leave: fresh pages, NULL rows, new slots
    "no_stagger": dict(stagger=False),  # every row flushes in the same step
    "one_flush_program": dict(knobs=dict(flush_programs=1)),  # the persistent loop
    # several value tiles per head in both launches (V = 16)
    "tiles_of_8": dict(geom="qwen3_next", knobs=dict(readout_block_v=8, flush_block_v=8)),
    # the readout's tile loop: 4 of a key head's 8 tiles per program (two value heads); with
    # rows that join and leave (NULL rows store zeros from the loop); 3 value heads of
    # V = 20 on one program
    "readout_tile_loop": dict(geom="qwen35_122b", knobs=dict(readout_block_v=8, readout_tiles=4)),
    "readout_tile_loop_churn": dict(churn=True, knobs=dict(readout_tiles=2)),
    "uneven_readout_tiles": dict(geom="uneven", knobs=dict(readout_tiles=3)),
}


def test_plain_readout_defaults():
    """Plain decode's readout takes auto_readout_tiles' choice of at most four tiles per
    program (the H200 sweep in `decode.launch_config`)."""
    cfg = decode.launch_config(256, 64, 128, 128, 2, torch.device("cpu"), recompute_d=True)
    assert (cfg["readout_block_v"], cfg["readout_tiles"]) == (32, 0)
    assert readout.MAX_TILES == 4


def _step_launches(monkeypatch, geom, lp, knobs, exact=True) -> dict:
    """One plain step of two rows through `gdn_replay_decode` with the plan, flush and
    readout launches replaced by recorders; returns the flush launcher's keyword
    arguments."""
    launched = {}
    monkeypatch.setattr(decode, "gdn_plan", lambda *a, **k: None)
    monkeypatch.setattr(decode, "gdn_flush", lambda *a, **k: launched.update(k))
    monkeypatch.setattr(decode, "gdn_readout", lambda *a, **k: None)
    fam = GDNFamily(GEOMS[geom], exact_flush=exact, decode_op=_op(**knobs), seed=1)
    cache = fam.cache(fam.specs(4, 1, lp), 4)
    tok = fam.tokens(2, torch.Generator().manual_seed(0))
    rows = torch.tensor([1, 2], dtype=torch.int32)
    fam.decode(cache, tok, rows, torch.empty(fam.out_shape(2)), 4, 1)
    return launched


@pytest.mark.parametrize(
    "lp, exact, knobs, warps",
    [
        (None, True, {}, 2),  # HP only: the exact flush sums the cached d
        (torch.bfloat16, True, {}, 1),  # LP copy: it recomputes d from HP
        (None, True, dict(flush_recompute=1), 1),  # recompute forced without LP
        (torch.bfloat16, True, dict(flush_recompute=0), 2),  # sum forced with LP
        (torch.bfloat16, False, {}, 2),  # fold mode sums d in any case
    ],
    ids=["hp_only", "lp_bf16", "hp_only_recompute", "lp_bf16_sum", "fold_lp_bf16"],
)
def test_plain_flush_warps_follow_recompute(lp, exact, knobs, warps, monkeypatch):
    """The flush's warps follow what it does, not the checkpoint's width: the flush summing
    the cached d runs on two warps, the recomputing one (255 registers on any warp count) on
    one (the H200 sweeps in `decode.launch_config`). The launches are recorded, not run."""
    launched = _step_launches(monkeypatch, "tiny", lp, knobs, exact=exact)
    assert launched["num_warps"] == warps
    assert launched["block_v"] == 16


def test_knobs_leave_the_memoised_defaults_alone(monkeypatch):
    """The default knobs are memoised per shape (`decode._default_config`); a step with
    overrides takes a copy, so the next step without them gets the defaults again."""
    default = _step_launches(monkeypatch, "tiny", None, {})["num_warps"]
    assert _step_launches(monkeypatch, "tiny", None, dict(flush_warps=4))["num_warps"] == 4
    assert _step_launches(monkeypatch, "tiny", None, {})["num_warps"] == default != 4


SLOW = {"L16"}  # a minute in the interpreter


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in SCENARIOS]
)
def test_kernel_matches_naive(case, device):
    c = {**SCENARIO_BASE, **SCENARIOS[case]}
    fam = GDNFamily(
        GEOMS[c["geom"]],
        act_dtype=c["act"],
        exact_flush=c["exact"],
        d_lp=c["d_lp"],
        decode_op=_op(**c["knobs"]),
        device=device,
        seed=3,
    )
    check_scenario(
        fam,
        L=c["L"],
        T=1,
        lp=c["lp"],
        spec=False,
        churn=c["churn"],
        stagger=c["stagger"],
        rounding=c["rounding"],
        requests=3,
        cycles=3,
        seed=len(case),
    )


@pytest.mark.parametrize(
    "exact, knobs",
    [(True, {}), (False, {}), (True, dict(flush_recompute=1))],
    ids=["exact", "fold", "exact_recompute"],
)
def test_hp_only_replay_is_fp32_accurate(exact, knobs, device):
    """The point of fp32 corrected values: HP-only replay with bf16 activations stays within
    1e-5 of the float64 oracle in every step (bf16 d records were ~1e-3 off). exact: the
    default exact flush without an LP copy, which sums the cached d (the delta rule from HP
    up to reassociation); exact_recompute: the same flush recomputing them from HP over the
    cached k, v, g, β (`flush.gdn_flush`'s recompute, what an LP copy needs)."""
    fam = GDNFamily(
        GEOMS["qwen3_next"],
        act_dtype=torch.bfloat16,
        exact_flush=exact,
        decode_op=_op(**knobs),
        device=device,
        seed=12,
    )
    check_scenario(fam, L=8, T=1, lp=None, spec=False, requests=3, cycles=2, out_tol=1e-5)


# Lockstep with the torch reference: outputs, cursor words (exact), records, HP and LP.
LOCKSTEP_BASE = dict(lp=None, exact=True, stock_share=0.0, knobs={}, d_lp=False)
LOCKSTEP = {
    "base": {},
    "lp_fp16": dict(lp=torch.float16),
    "lp_bf16": dict(lp=torch.bfloat16),
    "lp_fp16_d_lp": dict(lp=torch.float16, d_lp=True),
    "lp_bf16_d_lp": dict(lp=torch.bfloat16, d_lp=True),
    "fold": dict(exact=False),
    "stock_route_steps_lp_bf16": dict(lp=torch.bfloat16, stock_share=0.4),  # stale LP rows
}


@pytest.mark.parametrize("case", list(LOCKSTEP))
def test_kernel_matches_reference_buffers(case, device):
    c = {**LOCKSTEP_BASE, **LOCKSTEP[case]}
    lp = c["lp"]
    check_kernel_matches_reference(
        lambda op: GDNFamily(
            GEOMS["qwen35_122b"],
            act_dtype=torch.float16,
            device=device,
            exact_flush=c["exact"],
            d_lp=c["d_lp"],
            decode_op=op,
            seed=4,
        ),
        _op(**c["knobs"]),
        L=4,
        T=1,
        lp=lp,
        out_tol=out_tolerance(lp, device),
        # fold: HP sums the cached d, which follow the LP read (interpreted bf16 LP is
        # truncated, not rounded: see out_tolerance)
        hp_tol=1e-5 if c["exact"] or lp is None else out_tolerance(lp, device),
        stock_route_op=gdn_stock.gdn_stock_route_decode if c["stock_share"] else None,
        stock_share=c["stock_share"],
    )


@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["none", "bf16"])
def test_stock_route_interleaved(lp, device):
    """Stock-route steps (HP alone, LP marked stale) between replay steps, against the
    oracle: a replay step that read a stale LP would be off by the LP-vs-HP difference."""
    fam = GDNFamily(
        GEOMS["tiny"],
        act_dtype=torch.bfloat16,
        device=device,
        seed=9,
        decode_op=_op(),
        stock_route_op=gdn_stock.gdn_stock_route_decode,
    )
    check_mixed_routes(fam, L=4, lp=lp)


@pytest.mark.parametrize("d_lp", [False, True], ids=["d_fp32", "d_lp"])
def test_hp_independent_of_lp(d_lp, device):
    """The exact flush reads HP only: HP after every flush is bitwise the same with LP off,
    bf16 and fp16. The flush recomputes d from HP in all three (LP off sums the cached d by
    default: the same HP up to reassociation, test_hp_only_replay_is_fp32_accurate); d_lp:
    with an LP copy the d records take its dtype, and never reach HP."""
    check_hp_independent_of_lp(
        lambda: GDNFamily(
            GEOMS["tiny"],
            act_dtype=torch.bfloat16,
            device=device,
            seed=5,
            d_lp=d_lp,
            decode_op=_op(flush_recompute=1),
        ),
        L=4,
        T=1,
        spec=False,
    )


def test_speculative_step_runs_the_window_kernel(device):
    """A speculative step through `decode.gdn_replay_decode` takes the window step, with its
    knobs."""
    fam = GDNFamily(GEOMS["tiny"], device=device, seed=6, decode_op=_op(route="split"))
    check_scenario(fam, L=5, T=3, lp=None, spec=True, requests=2, cycles=2)


def _decode_three_rows(device, lp, scratch_rows: int, **knobs):
    """One plain step of 3 rows (tiny geometry, L = 4) through `decode.gdn_replay_decode`
    with a caller-made scratch of `scratch_rows` rows."""
    g = GEOMS["tiny"]
    scratch = GDNScratch.allocate(
        scratch_rows, g.num_v_heads, g.num_k_heads, g.head_k_dim, 4, device
    )
    fam = GDNFamily(g, device=device, seed=1, decode_op=_op(scratch=scratch, **knobs))
    cache = fam.cache(fam.specs(4, 1, lp), 4)
    tok = fam.tokens(3, torch.Generator().manual_seed(0))
    out = torch.empty(fam.out_shape(3), device=device)
    fam.decode(cache, tok, torch.tensor([1, 2, 3], device=device), out, L=4, T=1)


def test_scratch_too_small_is_refused(device):
    with pytest.raises(ValueError, match="does not fit"):
        _decode_three_rows(device, None, 2)


@pytest.mark.parametrize(
    "spoil, match",
    [
        (lambda c: c._replace(ring_k=c.ring_k.half()), "ring_k: dtype"),
        (lambda c: c._replace(ring_v=c.ring_v[:, :, :1]), "ring_v: shape"),
        (lambda c: c._replace(meta=c.meta[:, :4]), "meta: shape"),
        # d records below fp32 only in the dtype of an LP copy (here there is none)
        (lambda c: c._replace(ring_d=c.ring_d.bfloat16()), "ring_d: dtype"),
    ],
    ids=["ring_k_dtype", "ring_v_shape", "meta_shape", "ring_d_dtype"],
)
def test_bad_page_tensors_are_refused_by_name(spoil, match, device):
    """`window.check_args` (`kernels/common/args.require_tensors`) names the page tensor
    that does not fit, before any launch: the page stays as it was."""
    g = GEOMS["tiny"]
    fam = GDNFamily(g, device=device, seed=1, decode_op=_op())
    cache = fam.cache(fam.specs(4, 1, None), 4)
    assert cache.ring_v is not None  # the exact flush's records are checked too
    tok = fam.tokens(3, torch.Generator().manual_seed(0))
    out = torch.empty(fam.out_shape(3), device=device)
    before = {k: v.clone() for k, v in cache._asdict().items() if v is not None}
    with pytest.raises(ValueError, match=match):
        fam.decode(spoil(cache), tok, torch.tensor([1, 2, 3], device=device), out, L=4, T=1)
    for k, v in before.items():
        assert torch.equal(v.view(torch.uint8), cache._asdict()[k].contiguous().view(torch.uint8))


def test_summing_lp_dtype_d_records_is_refused(device):
    """d records in the LP dtype must be recomputed by the flush: forcing it to sum them
    (flush_recompute 0) would put their rounding into HP, so the step is refused."""
    fam = GDNFamily(
        GEOMS["tiny"], device=device, seed=1, d_lp=True, decode_op=_op(flush_recompute=0)
    )
    cache = fam.cache(fam.specs(4, 1, torch.bfloat16), 4)
    tok = fam.tokens(3, torch.Generator().manual_seed(0))
    out = torch.empty(fam.out_shape(3), device=device)
    with pytest.raises(ValueError, match="the flush must recompute them from HP"):
        fam.decode(cache, tok, torch.tensor([1, 2, 3], device=device), out, L=4, T=1)


REAL = {
    "qwen35_4b": GDNGeometry(16, 32, 128, 128),
    "qwen35_122b": GDNGeometry(16, 64, 128, 128),
}


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp", "lp_bf16"])
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "fold"])
def test_real_geometry_on_gpu(geom, lp, exact):
    fam = GDNFamily(
        REAL[geom],
        act_dtype=torch.bfloat16,
        exact_flush=exact,
        device="cuda",
        seed=1,
        decode_op=_op(),
    )
    # fold mode sums cached d, which follow the LP read: HP carries LP's rounding (by
    # design, as in the interpreter table's fold_lp_bf16 row)
    rounding = None if exact else lp
    check_scenario(fam, L=16, T=1, lp=lp, spec=False, requests=8, cycles=2, rounding=rounding)


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp", "lp_bf16"])
@pytest.mark.parametrize("tiles", [4, 8])
def test_real_geometry_readout_tile_loop_on_gpu(geom, lp, tiles):
    """Several value tiles per readout program (at 8 rows `auto_readout_tiles` picks 1;
    bs 256 takes 4)."""
    fam = GDNFamily(
        REAL[geom],
        act_dtype=torch.bfloat16,
        device="cuda",
        seed=13,
        decode_op=_op(readout_tiles=tiles),
    )
    check_scenario(fam, L=16, T=1, lp=lp, spec=False, requests=8, cycles=2)


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("lp", [torch.bfloat16, torch.float16], ids=["lp_bf16", "lp_fp16"])
def test_real_geometry_d_records_in_lp_dtype_on_gpu(geom, lp):
    """d records in the LP dtype (gdn_d_dtype "lp") at real geometries, against the oracle
    at the LP table's bound."""
    fam = GDNFamily(
        REAL[geom], act_dtype=torch.bfloat16, device="cuda", seed=14, d_lp=True, decode_op=_op()
    )
    check_scenario(fam, L=16, T=1, lp=lp, spec=False, requests=8, cycles=2)


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
def test_real_geometry_hp_only_fp32_accurate_on_gpu(geom):
    fam = GDNFamily(REAL[geom], act_dtype=torch.bfloat16, device="cuda", seed=8, decode_op=_op())
    check_scenario(fam, L=16, T=1, lp=None, spec=False, requests=8, cycles=2, out_tol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lp, d_lp",
    [
        (None, False),
        (torch.bfloat16, False),
        (torch.float16, False),
        (torch.bfloat16, True),  # d records in the LP dtype (gdn_d_dtype "lp")
        (torch.float16, True),
    ],
    ids=["hp", "lp_bf16", "lp_fp16", "lp_bf16_d_lp", "lp_fp16_d_lp"],
)
def test_real_geometry_lockstep_on_gpu(lp, d_lp):
    check_kernel_matches_reference(
        lambda op: GDNFamily(
            REAL["qwen35_122b"],
            act_dtype=torch.bfloat16,
            device="cuda",
            d_lp=d_lp,
            decode_op=op,
            seed=4,
        ),
        _op(),
        L=16,
        T=1,
        lp=lp,
        out_tol=out_tolerance(lp, "cuda"),
        requests=6,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("geom", list(REAL))
@pytest.mark.parametrize("lp", [None, torch.bfloat16], ids=["hp", "lp_bf16"])
def test_real_geometry_stock_route_on_gpu(geom, lp):
    fam = GDNFamily(
        REAL[geom],
        act_dtype=torch.bfloat16,
        device="cuda",
        seed=2,
        decode_op=_op(),
        stock_route_op=gdn_stock.gdn_stock_route_decode,
    )
    check_mixed_routes(fam, L=16, lp=lp)
