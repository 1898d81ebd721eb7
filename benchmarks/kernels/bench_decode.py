"""Decode-kernel benchmark: ReplaySSM's Triton decode kernels against vLLM 0.26.0's own, in
one process on one GPU, per decode step and SSM layer, at real geometries.

Measured: microseconds per decode step per layer for a batch of bs rows (plain decode,
window T = 1, fp32 HP, bf16 activations, GDN exact flush; buffer_len L the production
default of the family and LP, `config.DEFAULT_BUFFER_LEN`, unless --buffer-len). With
--window T: speculative verify steps of T = 1 + k tokens per row, every draft accepted,
against vLLM's kernels as its layers call them under speculative decoding (state indices
[bs, T], one page per token: the state read from the accepted column and written to all
T): Mamba-2 `selective_state_update` vs ours with the window launches (plan / flush /
readout specialised for T), GDN `fused_sigmoid_gating_delta_rule_update` vs our window
step (`--route fused,split`); a graph holds L / T steps, one flush per row:
  Mamba-2  ours `mamba2_replay_decode` vs vLLM `mamba_ssm.selective_state_update`, called
           as `MambaMixer2`'s decode path calls it (stride-0 expansions: TIE_HDIM path)
  GDN      ours `dispatch.gdn_decode` (route "auto", as the layer calls it, unless --route
           says otherwise: replay = plan / flush / readout, stock, or the window step's
           fused / split) vs vLLM `fused_recurrent_gated_delta_rule_packed_decode`,
           called as `QwenGatedDeltaNetAttention._forward_core_decode_non_spec` calls it
Method: NL independent layers (own state pages, own inputs) so that the states cannot stay
in L2 (stock fp32 states >= 256 MiB in all, 2 GiB at bs 256); one CUDA graph holds a full
cycle of L steps x NL layers, so each row flushes once per replay (the stagger spreads the
flushes: ~1/L of the rows per step); after warm-up replays, each replay is timed with CUDA
events; reported: median replay / (L * NL). Slot 0 is vLLM's NULL block: rows use slots
1..bs. GB/s and the ceiling come from the bytes model of design §2 (`benchmarks/common.py`);
the copy bandwidth is measured in the same run.

    python3 benchmarks/kernels/bench_decode.py --json          # full run
    python3 benchmarks/kernels/bench_decode.py --quick --families mamba2 --batch 256
    python3 benchmarks/kernels/bench_decode.py --families mamba2 --batch 256 \
        --knob readout_block_p=16,32 --knob flush_warps=4,8 --json
    python3 benchmarks/kernels/bench_decode.py --families mamba2 --window 4 --batch 1,64,256 \
        --lp none,bf16 --json
    python3 benchmarks/kernels/bench_decode.py --dry-run       # bytes model only, no GPU
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from benchmarks import common
from vllm_replayssm.config import DEFAULT_BUFFER_LEN
from vllm_replayssm.layout import (
    GDNGeometry,
    GDNReplayCache,
    Mamba2Geometry,
    Mamba2ReplayCache,
    StateTensorSpec,
    carve,
    gdn_state_specs,
    mamba2_state_specs,
    page_size_bytes,
    ring_rows,
)

GEOMETRIES: dict[str, Mamba2Geometry | GDNGeometry] = {
    "nemotron3_super": Mamba2Geometry(nheads=128, headdim=64, dstate=128, ngroups=8),
    "nemotron3_nano4b": Mamba2Geometry(nheads=96, headdim=80, dstate=128, ngroups=8),
    "qwen35_4b": GDNGeometry(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128),
    "qwen35_122b": GDNGeometry(num_k_heads=16, num_v_heads=64, head_k_dim=128, head_v_dim=128),
}
# LP names: the LP copy's dtype; "_d_lp": GDN's d records in it too (gdn_d_dtype "lp")
LP_DTYPES = {
    "none": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "bf16_d_lp": torch.bfloat16,
    "fp16_d_lp": torch.float16,
}
D_LP = "_d_lp"
LP_ALIASES = {"bfloat16": "bf16", "float16": "fp16"}
BUFFER_LEN = 16
# Tokens per row and step, and steps per graph (one flush cycle, `common.flush_cycle`):
# `set_steps` sets all three per measurement (`buffer_len_for`, --window).
WINDOW = 1
STEPS = BUFFER_LEN // WINDOW
ACT = torch.bfloat16
CONV_ROWS = 3  # conv_kernel - 1
# Ring tensors (layout.py names) read by a readout / by a flush (GDN: exact flush).
RING_READS = {
    "mamba2": (("ring_dt", "ring_x", "ring_B"), ("ring_dt", "ring_x", "ring_B")),
    "gdn": (("ring_g", "ring_k", "ring_d"), ("ring_g", "ring_beta", "ring_k", "ring_v")),
}
# Our launchers' knobs (each CLI option takes a comma list; configs = their product). GDN:
# the tile of a head's value dimension (block_v), warps per program, the route (one launch,
# or flush + readout, or stock), heads per program (0 = all heads sharing a key head) and
# software-pipelining stages of the head loop. Mamba-2: the route (auto, replay, stock) and
# any knob of `kernels/mamba2/decode.launch_config` through --knob NAME=v1,v2.
KNOBS = ("tile", "num_warps", "route", "heads_per_program", "num_stages")
TILE_ARG = {"mamba2": "block_p", "gdn": "block_v"}
# GDN: auto (the policy), replay (plan / flush / readout), stock, or the window step's
# routes (fused: one launch; split: its plan, flush and readout launches).
ROUTES = {
    "mamba2": ("auto", "replay", "stock"),
    "gdn": ("auto", "replay", "stock", "fused", "split"),
}
MIB = 2**20
DEV = "cuda"


def family(geom) -> str:
    return "mamba2" if isinstance(geom, Mamba2Geometry) else "gdn"


def buffer_len_for(geom, lp_name: str, requested: int | None = None) -> int:
    """L of a measurement: `requested` (--buffer-len) where given, else what the plugin
    runs for this family and LP (`config.DEFAULT_BUFFER_LEN`: 32 for Mamba-2 with an LP
    copy, 16 otherwise)."""
    if requested is not None:
        return requested
    return DEFAULT_BUFFER_LEN[(family(geom), lp_name != "none")]


def conv_dim(geom) -> int:
    if family(geom) == "mamba2":
        return geom.nheads * geom.headdim + 2 * geom.ngroups * geom.dstate
    return 2 * geom.num_k_heads * geom.head_k_dim + geom.num_v_heads * geom.head_v_dim


def our_specs(geom, lp_name: str) -> list[StateTensorSpec]:
    """Our page for an LP name (`LP_DTYPES`)."""
    lp = LP_DTYPES[lp_name]
    conv = ((CONV_ROWS, conv_dim(geom)), ACT)
    if family(geom) == "mamba2":
        if lp_name.endswith(D_LP):
            raise ValueError(f"LP {lp_name!r}: the *{D_LP} names are GDN's (gdn_d_dtype lp)")
        return mamba2_state_specs(geom, BUFFER_LEN, WINDOW, ACT, lp, *conv)
    d = lp if lp_name.endswith(D_LP) else torch.float32
    return gdn_state_specs(geom, BUFFER_LEN, WINDOW, ACT, lp, True, *conv, d)


def stock_specs(geom) -> list[StateTensorSpec]:
    """vLLM's page: conv state (index 0), then the fp32 SSM state (index 1)."""
    if family(geom) == "mamba2":
        shape = (geom.nheads, geom.headdim, geom.dstate)
    else:
        shape = (geom.num_v_heads, geom.head_v_dim, geom.head_k_dim)
    return [
        StateTensorSpec("conv", (CONV_ROWS, conv_dim(geom)), ACT),
        StateTensorSpec("ssm", shape, torch.float32),
    ]


def bytes_model(geom, lp_name: str) -> dict:
    """Bytes per row, layer and step (design §2); record sizes from our page's specs."""
    lp = LP_DTYPES[lp_name]
    readout, flush = RING_READS[family(geom)]
    rows = ring_rows(BUFFER_LEN, WINDOW)
    rec = common.record_bytes(our_specs(geom, lp_name), rows, readout, flush)
    E = geom.state_elems
    lp_size = None if lp is None else torch.empty((), dtype=lp).element_size()
    stock = common.stock_bytes(E, WINDOW)
    ours = common.replay_bytes(E, BUFFER_LEN, rec, lp_size, WINDOW)
    return {
        "state_elems": E,
        "r_w": rec.write,
        "r_rd": rec.readout,
        "r_fl": rec.flush,
        "ring_per_step": common.ring_bytes(rec, BUFFER_LEN, WINDOW),
        "stock_per_row": stock,
        "ours_per_row": ours,
        "ceiling_speedup": stock / ours,
    }


def num_layers(geom, bs: int) -> int:
    """Enough layers that the stock fp32 states total bs * 8 MiB, clamped to [256 MiB,
    2 GiB] (L2 is 60 MB), and at least 2 (a speculative stock layer holds T pages per row)."""
    target = min(2048 * MIB, max(256 * MIB, bs * 8 * MIB))
    return max(2, math.ceil(target / (bs * WINDOW * 4 * geom.state_elems)))


def window_rows(bs: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(query_start_loc [bs + 1], num_accepted_tokens [bs]) of a speculative step of WINDOW
    tokens per row, every draft of the previous step accepted; (None, None) at T = 1."""
    if WINDOW == 1:
        return None, None
    qsl = torch.arange(0, bs * WINDOW + 1, WINDOW, dtype=torch.int32, device=DEV)
    return qsl, torch.full((bs,), WINDOW, dtype=torch.int32, device=DEV)


# --- inputs and state pages ----------------------------------------------------------------


def _randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=DEV) * scale).to(ACT)


def _decay_rate(n: int) -> torch.Tensor:
    """-A (Mamba-2) or exp(A_log) (GDN): uniform in [1, 16]."""
    return torch.empty(n, device=DEV).uniform_(1.0, 16.0)


def _dt_bias(n: int) -> torch.Tensor:
    """softplus(dt_bias) log-uniform in [1e-3, 1e-1], as in the precision study; rounded
    to bf16 (vLLM's model-dtype parameter), held in fp32 (our kernels' argument)."""
    s = torch.empty(n, device=DEV).uniform_(math.log(1e-3), math.log(1e-1)).exp()
    return torch.log(torch.expm1(s)).to(ACT).float()


def _pages(specs, num_slots: int) -> dict[str, torch.Tensor]:
    """Views over a fresh buffer with vLLM's paged strides. The state (hp or ssm) gets
    random values; the rest stays as found (kernels write ring rows before reading them)."""
    raw = torch.empty(num_slots * page_size_bytes(specs), dtype=torch.uint8, device=DEV)
    views = carve(raw, specs)
    views["hp" if "hp" in views else "ssm"].normal_(0.0, 0.1)
    return views


def make_inputs(geom, bs: int) -> dict[str, torch.Tensor]:
    """One layer's current-token inputs. GDN q, k, v are views of one packed conv output,
    as the layer splits it. Per-head parameters are fp32 holding bf16 values, so that both
    implementations compute the same function."""
    if family(geom) == "mamba2":
        H, P, N, G = geom.nheads, geom.headdim, geom.dstate, geom.ngroups
        return {
            "x": _randn(bs, H, P),
            "dt": _randn(bs, H, scale=0.5),
            "A": -_decay_rate(H),
            "B": _randn(bs, G, N, scale=0.3),
            "C": _randn(bs, G, N, scale=0.3),
            "D": _randn(H).float(),
            "dt_bias": _dt_bias(H),
        }
    Hk, Hv, K, V = geom.num_k_heads, geom.num_v_heads, geom.head_k_dim, geom.head_v_dim
    mixed_qkv = _randn(bs, conv_dim(geom))
    q, k, v = torch.split(mixed_qkv, [Hk * K, Hk * K, Hv * V], dim=1)
    return {
        "mixed_qkv": mixed_qkv,
        "q": q.view(bs, Hk, K),
        "k": k.view(bs, Hk, K),
        "v": v.view(bs, Hv, V),
        "a": _randn(bs, Hv, scale=0.5),
        "b": _randn(bs, Hv),
        "A_log": _decay_rate(Hv).log(),
        "dt_bias": _dt_bias(Hv),
    }


# --- the two implementations: NL layers of (fn, args, kwargs) calls, and their outputs ----


def vllm_calls(geom, bs: int, nl: int, slots: torch.Tensor):
    """vLLM 0.26.0's decode kernel on NL layers; returns (calls, outputs, launch config)."""
    calls, outs = [], []
    if family(geom) == "mamba2":
        from vllm.model_executor.layers.mamba.ops.mamba_ssm import (
            selective_state_update,
            try_get_optimal_ssm_config,
        )

        H, P, N = geom.nheads, geom.headdim, geom.dstate
        is_blackwell = torch.cuda.get_device_capability()[0] == 10  # as MambaMixer2 sets it
        # Under speculative decoding a row owns T pages (slots 1 + r * T + t), reads the
        # state of its accepted column and writes one state per token.
        qsl, acc = window_rows(bs)
        pages = slots[:, None] if WINDOW == 1 else window_slots(bs)
        for _ in range(nl):
            t = make_inputs(geom, bs * WINDOW)
            out = torch.empty(bs * WINDOW, H, P, dtype=ACT, device=DEV)
            # MambaMixer2: A, dt, dt_bias, D expanded over headdim with stride 0; D and
            # dt_bias are model-dtype parameters there; state indices are [bs, 1].
            args = (
                _pages(stock_specs(geom), bs * WINDOW + 1)["ssm"],
                t["x"],
                t["dt"][:, :, None].expand(-1, -1, P),
                t["A"][:, None, None].expand(-1, P, N),
                t["B"],
                t["C"],
            )
            kwargs = dict(
                D=t["D"].to(ACT)[:, None].expand(-1, P),
                dt_bias=t["dt_bias"].to(ACT)[:, None].expand(-1, P),
                dt_softplus=True,
                state_batch_indices=pages,
                dst_state_batch_indices=pages,
                out=out,
                is_blackwell=is_blackwell,
            )
            if WINDOW > 1:
                kwargs.update(num_accepted_tokens=acc, cu_seqlens=qsl)
            calls.append((selective_state_update, args, kwargs))
            outs.append(out)
        bm, nw = try_get_optimal_ssm_config(P, N, bs, H, "float32", is_blackwell)
        return calls, outs, {"BLOCK_SIZE_M": bm, "num_warps": nw}

    import triton
    from vllm.third_party.flash_linear_attention.ops.fused_recurrent import (
        fused_recurrent_gated_delta_rule_packed_decode,
    )

    Hv, V, K = geom.num_v_heads, geom.head_v_dim, geom.head_k_dim
    if WINDOW > 1:
        return vllm_gdn_window_calls(geom, bs, nl)
    for _ in range(nl):
        t = make_inputs(geom, bs)
        out = torch.empty(bs, 1, Hv, V, dtype=ACT, device=DEV)
        kwargs = dict(
            mixed_qkv=t["mixed_qkv"],
            a=t["a"],
            b=t["b"],
            A_log=t["A_log"],
            dt_bias=t["dt_bias"].to(ACT),  # a model-dtype parameter in vLLM
            scale=K**-0.5,
            initial_state=_pages(stock_specs(geom), bs + 1)["ssm"],
            out=out,
            ssm_state_indices=slots,
            use_qk_l2norm_in_kernel=True,
        )
        calls.append((fused_recurrent_gated_delta_rule_packed_decode, (), kwargs))
        outs.append(out)
    # Fixed in that launcher (no tuning table): BV = min(next_pow2(V), 32), one warp.
    return calls, outs, {"BV": min(triton.next_power_of_2(V), 32), "num_warps": 1}


def vllm_gdn_window_calls(geom, bs: int, nl: int):
    """vLLM's GDN speculative verify (`fused_sigmoid_gating_delta_rule_update`, as
    QwenGatedDeltaNetAttention calls it for spec rows: q/k/v as [1, tokens, heads, dim]
    contiguous, T pages per row). It returns its output (no out= argument): the outputs are
    read from the tensors it returned while the graph was captured."""
    from vllm.third_party.flash_linear_attention.ops import (
        fused_sigmoid_gating_delta_rule_update,
    )

    qsl, acc = window_rows(bs)
    pages = window_slots(bs)
    calls, returned = [], []
    for _ in range(nl):
        t = make_inputs(geom, bs * WINDOW)
        kwargs = dict(
            A_log=t["A_log"],
            a=t["a"],
            b=t["b"],
            dt_bias=t["dt_bias"].to(ACT),
            q=t["q"].unsqueeze(0).contiguous(),
            k=t["k"].unsqueeze(0).contiguous(),
            v=t["v"].unsqueeze(0).contiguous(),
            initial_state=_pages(stock_specs(geom), bs * WINDOW + 1)["ssm"],
            inplace_final_state=True,
            cu_seqlens=qsl,
            ssm_state_indices=pages,
            num_accepted_tokens=acc,
            use_qk_l2norm_in_kernel=True,
        )
        slot: dict = {}

        def call(slot=slot, **kw):
            slot["o"] = fused_sigmoid_gating_delta_rule_update(**kw)[0]

        calls.append((call, (), kwargs))
        returned.append(slot)
    return calls, _Returned(returned), {"kernel": "fused_sigmoid_gating_delta_rule_update"}


class _Returned(list):
    """The outputs of calls that return them: iterating yields each call's last output."""

    def __iter__(self):
        return (slot["o"] for slot in super().__iter__())


def window_slots(bs: int) -> torch.Tensor:
    """[bs, WINDOW] int32: row r's pages 1 + r * WINDOW + t (stock speculative decoding)."""
    return torch.arange(1, bs * WINDOW + 1, dtype=torch.int32, device=DEV).view(bs, WINDOW)


def our_layers(geom, bs: int, nl: int, lp_name: str, slots: torch.Tensor):
    """NL layers of (cache, inputs, out) with the page of an LP name (`LP_DTYPES`); each
    cache gets random HP, then the prefill hook (cursors reset with stagger, LP <- HP)."""
    from vllm_replayssm.kernels.common.prefill_hook import apply_prefill_hook

    cache_cls = Mamba2ReplayCache if family(geom) == "mamba2" else GDNReplayCache
    layers = []
    for _ in range(nl):
        cache = cache_cls.from_views(_pages(our_specs(geom, lp_name), bs + 1))
        apply_prefill_hook(
            cache.hp,
            cache.lp,
            cache.meta,
            slots,
            buffer_len=BUFFER_LEN,
            window=WINDOW,
            stagger=True,
        )
        t = make_inputs(geom, bs * WINDOW)
        out = torch.empty(t["x" if "x" in t else "v"].shape, dtype=ACT, device=DEV)
        layers.append((cache, t, out))
    return layers


# GDN launch knobs per kernel route: the window step's and the stock route's CLI knobs; the
# replay launches take `kernels/gdn/decode.launch_config`'s through --knob.
GDN_ROUTE_KNOBS = {
    "stock": {"block_v", "num_warps"},
    "fused": {
        "block_v",
        "num_warps",
        "heads_per_program",
        "num_stages",
        "flush_precision",
        "flush_stages",
    },
    "split": {
        "block_v",
        "num_warps",
        "flush_precision",
        "readout_precision",
        "readout_tiles",
        "readout_stages",
        "flush_stages",
        "flush_rows_read",
        "flush_programs",
    },
}


def gdn_launch(geom, bs: int, config: dict, has_lp: bool) -> dict:
    """The `launch` overrides of gdn_decode for a configuration: its route ("auto": none, as
    the layer runs it) and the knobs that route's launcher takes."""
    knobs = dict(config)
    route = knobs.pop("route", "auto")
    launch = {} if route == "auto" else {"route": route}
    kernel_route = route_ran(geom, bs, config, has_lp)
    allowed = GDN_ROUTE_KNOBS.get(kernel_route)
    launch.update({k: v for k, v in knobs.items() if allowed is None or k in allowed})
    if kernel_route == "replay":  # only decode.launch_config's knobs (--knob)
        launch = {k: v for k, v in launch.items() if k not in GDN_ROUTE_KNOBS["fused"]}
    return launch


def our_calls(geom, layers, slots: torch.Tensor, config: dict) -> list:
    """Our decode op on the layers; config: route and launcher overrides."""
    kwargs = dict(buffer_len=BUFFER_LEN, window=WINDOW)
    if family(geom) == "mamba2":
        from vllm_replayssm.kernels.mamba2.decode import mamba2_replay_decode
        from vllm_replayssm.kernels.mamba2.dispatch import choose_route
        from vllm_replayssm.kernels.mamba2.plan import Mamba2Scratch
        from vllm_replayssm.kernels.mamba2.stock_route import mamba2_stock_route_decode

        knobs = dict(config)
        route = choose_route(knobs.pop("route", "auto"), len(slots), plain=WINDOW == 1)
        if route == "stock":
            fn = mamba2_stock_route_decode
            kwargs.update(stagger=True, **knobs)
        else:
            fn = mamba2_replay_decode
            scratch = Mamba2Scratch.allocate(
                len(slots), geom.nheads, BUFFER_LEN, DEV, window=WINDOW
            )
            qsl, acc = window_rows(len(slots))
            kwargs.update(scratch=scratch, query_start_loc=qsl, num_accepted_tokens=acc, **knobs)
        names = ("x", "dt", "A", "B", "C", "D", "dt_bias")
    else:
        from vllm_replayssm.kernels.gdn.dispatch import gdn_decode
        from vllm_replayssm.kernels.gdn.plan import GDNScratch

        launch = gdn_launch(geom, len(slots), config, layers[0][0].lp is not None)
        scratch = GDNScratch.allocate(
            len(slots),
            geom.num_v_heads,
            geom.num_k_heads,
            geom.head_k_dim,
            BUFFER_LEN,
            DEV,
        )
        qsl, acc = window_rows(len(slots))
        kwargs = dict(
            buffer_len=BUFFER_LEN,
            window=WINDOW,
            stagger=True,
            scale=geom.head_k_dim**-0.5,
            launch=launch,
            scratch=scratch,
            query_start_loc=qsl,
            num_accepted_tokens=acc,
        )
        names, fn = ("q", "k", "v", "a", "b", "A_log", "dt_bias"), gdn_decode
    return [(fn, (cache, *(t[n] for n in names), slots, out), kwargs) for cache, t, out in layers]


# --- measurement ---------------------------------------------------------------------------


def measure(calls: list, outs: list, nl: int, args) -> dict:
    """Time one graph of L steps x NL layers; us = median replay / (L * NL)."""

    def cycle() -> None:
        for _ in range(STEPS):
            for fn, a, kw in calls:
                fn(*a, **kw)

    torch.cuda.reset_peak_memory_stats()
    stats = common.summarize(common.time_graph(cycle, args.replays, args.warmup))
    stats["us"] = stats["median_ms"] * 1e3 / (STEPS * nl)
    stats["outputs_finite"] = all(bool(torch.isfinite(o).all()) for o in outs)
    stats["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return stats


def guarded(label: str, fn) -> dict:
    """Run one measurement; an exception becomes {"error", "traceback"} and the run goes on."""
    print(f"  {label} ...", end=" ", flush=True)
    try:
        res = fn()
    except Exception as exc:
        print(f"ERROR {exc!r}", flush=True)
        res = {"error": repr(exc), "traceback": traceback.format_exc()}
    else:
        flag = "" if res["outputs_finite"] else "  NON-FINITE OUTPUTS"
        print(f"{res['us']:.2f} us/step/layer (spread {res['spread']:.1%}){flag}", flush=True)
    gc.collect()
    torch.cuda.empty_cache()
    return res


def run_vllm(geom, bs: int, nl: int, slots: torch.Tensor, args) -> dict:
    calls, outs, config = vllm_calls(geom, bs, nl, slots)
    return {**measure(calls, outs, nl, args), "config": config}


def launch_configs(geom, args) -> list[dict]:
    """Launcher overrides to try: the product of the knob lists given on the command line
    (the launchers decide what is not given)."""
    fam = family(geom)
    group = geom.nheads // geom.ngroups if fam == "mamba2" else geom.num_v_heads // geom.num_k_heads
    knobs = ("route",) if fam == "mamba2" else KNOBS
    given = [(k, getattr(args, k)) for k in knobs if getattr(args, k)]
    given += list(args.knob.items())
    configs = []
    for vals in itertools.product(*(v for _, v in given)):
        cfg = {}
        for (k, _), v in zip(given, vals, strict=True):
            if k == "heads_per_program":
                v = v or group
                if group % v:
                    break
            cfg[TILE_ARG[fam] if k == "tile" else k] = v
        else:
            if cfg not in configs:
                configs.append(cfg)
    return configs or [{}]


def route_ran(geom, bs: int, config: dict, has_lp: bool) -> str:
    """Which of our routes a configuration runs (README and notes credit only what ran);
    has_lp: the layers keep an LP copy."""
    if family(geom) == "mamba2":
        from vllm_replayssm.kernels.mamba2.dispatch import choose_route

        route = choose_route(config.get("route", "auto"), bs, plain=WINDOW == 1)
        if route == "replay" and WINDOW > 1:
            route += " (window launches)"
        return route
    from vllm_replayssm.kernels.gdn.dispatch import plan_launch

    route = config.get("route", "auto")
    launch = {} if route == "auto" else {"route": route}
    return plan_launch("auto", bs, WINDOW == 1, launch, has_lp=has_lp)["route"]


def run_ours(geom, bs: int, nl: int, lp_name: str, slots: torch.Tensor, args) -> dict:
    """Every launch config on the same caches; top-level figures are the fastest one's."""
    try:
        layers = our_layers(geom, bs, nl, lp_name, slots)
    except Exception as exc:
        print(f"  ours: setup ERROR {exc!r}", flush=True)
        return {"error": repr(exc), "traceback": traceback.format_exc(), "configs": []}
    outs = [out for _, _, out in layers]
    tried = []
    for config in launch_configs(geom, args):
        label = ",".join(f"{k}={v}" for k, v in config.items()) or "default config"
        res = guarded(
            f"ours {label}",
            lambda c=config: measure(our_calls(geom, layers, slots, c), outs, nl, args),
        )
        route = route_ran(geom, bs, config, LP_DTYPES[lp_name] is not None)
        tried.append({"config": config, "route": route, **res})
    ok = [t for t in tried if "error" not in t]
    if not ok:
        return {"error": tried[-1]["error"], "configs": tried}
    best = min(ok, key=lambda t: t["us"])
    return {**{k: v for k, v in best.items() if k != "replay_ms"}, "configs": tried}


def derive(row: dict, copy_gbs: float | None) -> None:
    """Speed-up and bandwidths from the two timings and the bytes model."""
    bs, b, v, o = row["bs"], row["bytes"], row["vllm"], row["ours"]
    if "us" in v:
        row["vllm_gbs"] = bs * b["stock_per_row"] / (v["us"] * 1e-6) / common.GB
    if "us" in o:
        row["ours_gbs"] = bs * b["ours_per_row"] / (o["us"] * 1e-6) / common.GB
        row["ours_frac_copy"] = row["ours_gbs"] / copy_gbs if copy_gbs else None
    if "us" in v and "us" in o:
        row["speedup"] = v["us"] / o["us"]
        row["ours_over_vllm_bw"] = row["ours_gbs"] / row["vllm_gbs"]


HEADER = [
    "geometry",
    "bs",
    "lp",
    "L",
    "NL",
    "route",
    "vLLM us",
    "ours us",
    "speedup",
    "ceil",
    "ours MB",
    "ours GB/s",
    "of copy",
    "vLLM GB/s",
    "BW/vLLM",
]


def table_row(row: dict) -> list[str]:
    def f(key: str, fmt: str, src: dict = row) -> str:
        return format(src[key], fmt) if src.get(key) is not None else "-"

    b = row["bytes"]
    return [
        row["geometry"],
        str(row["bs"]),
        row["lp"],
        str(row["buffer_len"]),
        str(row["num_layers"]),
        row["ours"].get("route", "-"),
        f("us", ".2f", row["vllm"]),
        f("us", ".2f", row["ours"]),
        f("speedup", ".2f"),
        f"{b['ceiling_speedup']:.2f}",
        f"{row['bs'] * b['ours_per_row'] / 1e6:.1f}",
        f("ours_gbs", ".0f"),
        f("ours_frac_copy", ".2f"),
        f("vllm_gbs", ".0f"),
        f("ours_over_vllm_bw", ".2f"),
    ]


# --- driver --------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--families", default="mamba2,gdn", help="mamba2, gdn")
    p.add_argument("--geoms", default=",".join(GEOMETRIES), help="comma list of geometries")
    p.add_argument("--batch", default="1,32,256", help="comma list of batch sizes")
    p.add_argument(
        "--lp",
        default="none,bf16,fp16",
        help="LP dtypes: none, bf16, fp16; GDN also bf16_d_lp, fp16_d_lp (d records in the "
        "LP dtype, gdn_d_dtype lp)",
    )
    p.add_argument("--quick", action="store_true", help="5 timed replays instead of 20")
    p.add_argument("--replays", type=int, default=None, help="timed replays per variant")
    p.add_argument(
        "--tile",
        default=None,
        help="our kernels' row tiles (Mamba-2 block_p, GDN block_v), comma list",
    )
    p.add_argument("--num-warps", default=None, help="our kernels' num_warps, comma list")
    p.add_argument(
        "--route",
        default=None,
        help="comma list; Mamba-2: auto, replay, stock; GDN: auto, replay, stock, "
        "fused, split (the window step; at --window 1 for comparison)",
    )
    p.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="replay launch knob values to try (repeatable; both families' "
        "decode.launch_config; the GDN window step's launch arguments), e.g. "
        "readout_block_p=16,32, readout_block_v=16,32 or flush_warps=4,8",
    )
    p.add_argument(
        "--heads-per-program",
        default=None,
        help="heads per program, comma list; 0 = a whole group / key head",
    )
    p.add_argument("--num-stages", default=None, help="head-loop pipelining, comma list")
    p.add_argument(
        "--json",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="write JSON (default benchmarks/results/kernels-<date>-<commit>.json)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=1,
        help="tokens per row and step: 1 (plain decode) or 1 + k (speculative verify, "
        "every draft accepted)",
    )
    p.add_argument(
        "--buffer-len",
        type=int,
        default=None,
        help="our layers' buffer_len L (default: the plugin's per family and LP, 32 for "
        "Mamba-2 with an LP copy, 16 otherwise; vLLM's kernel does not take it)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the bytes model; no GPU")
    args = p.parse_args(argv)
    args.families = _csv(args.families, ("mamba2", "gdn"), "--families")
    args.geoms = [
        g for g in _csv(args.geoms, GEOMETRIES, "--geoms") if family(GEOMETRIES[g]) in args.families
    ]
    args.batch = [int(b) for b in _csv(args.batch, None, "--batch")]
    args.lp = _csv(
        ",".join(LP_ALIASES.get(x.strip(), x) for x in args.lp.split(",")), LP_DTYPES, "--lp"
    )
    try:  # every (geometry, LP) measurement's L against --window, and its page
        for g, lp in itertools.product(args.geoms, args.lp):
            set_steps(buffer_len_for(GEOMETRIES[g], lp, args.buffer_len), args.window)
            our_specs(GEOMETRIES[g], lp)
    except ValueError as exc:
        sys.exit(str(exc))
    for knob in KNOBS:
        raw = getattr(args, knob)
        if raw is not None:
            vals = [x.strip() for x in raw.split(",") if x.strip()]
            setattr(args, knob, vals if knob == "route" else [int(x) for x in vals])
    allowed = {r for f in args.families for r in ROUTES[f]}
    if args.route and set(args.route) - allowed:
        sys.exit(f"--route: bad value(s) {args.route}; allowed: {', '.join(sorted(allowed))}")
    knobs = {}
    for item in args.knob:
        name, _, vals = item.partition("=")
        if not name or not vals:
            sys.exit(f"--knob: expected NAME=V1,V2, got {item!r}")
        knobs[name.strip()] = [
            int(v) if v.strip().lstrip("-").isdigit() else v.strip()
            for v in vals.split(",")
            if v.strip()
        ]
    args.knob = knobs
    args.replays = args.replays or (5 if args.quick else 20)
    args.warmup = 1 if args.quick else 3
    return args


def _csv(text: str, allowed, flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if allowed is not None and x not in allowed]
    if bad or not items:
        sys.exit(f"{flag}: bad value(s) {bad or text!r}; allowed: {', '.join(allowed or [])}")
    return items


def dry_run(args) -> None:
    """The bytes model per geometry and LP dtype, and the layer counts; needs no GPU."""
    header = [
        "geometry",
        "lp",
        "L",
        "E",
        "state MiB",
        "r_w",
        "r_rd",
        "r_fl",
        "stock B",
        "ours B",
        "ceil",
        "NL@bs " + "/".join(map(str, args.batch)),
    ]
    rows = []
    for name in args.geoms:
        geom = GEOMETRIES[name]
        for lp in args.lp:
            set_steps(buffer_len_for(geom, lp, args.buffer_len), WINDOW)
            b = bytes_model(geom, lp)
            rows.append(
                [
                    name,
                    lp,
                    str(BUFFER_LEN),
                    str(b["state_elems"]),
                    f"{4 * b['state_elems'] / MIB:.2f}",
                    str(b["r_w"]),
                    str(b["r_rd"]),
                    str(b["r_fl"]),
                    str(b["stock_per_row"]),
                    f"{b['ours_per_row']:.0f}",
                    f"{b['ceiling_speedup']:.2f}",
                    "/".join(str(num_layers(geom, bs)) for bs in args.batch),
                ]
            )
    print(
        f"# bytes per row, layer and step (design §2): T={WINDOW}, "
        "bf16 act, fp32 HP, GDN exact flush; ceil = stock / ours"
    )
    print(common.format_table(header, rows))


def set_steps(buffer_len: int, window: int) -> None:
    """Set L, T and the steps per graph (one flush cycle, `common.flush_cycle`) that every
    measurement here reads (--buffer-len, --window; profile_decode.py sets them too)."""
    global BUFFER_LEN, WINDOW, STEPS
    if buffer_len < 2 or not 1 <= window <= buffer_len:
        raise ValueError(f"--window: 1 to --buffer-len (>= 2), got {window} and {buffer_len}")
    BUFFER_LEN, WINDOW, STEPS = buffer_len, window, common.flush_cycle(buffer_len, window)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        dry_run(args)
        return 0
    if not torch.cuda.is_available():
        sys.exit("no CUDA device (--dry-run prints the bytes model without one)")
    torch.manual_seed(0)
    info = common.machine_info()
    copy = common.copy_bandwidth()
    print(common.machine_line(info, copy["gbs"]), flush=True)
    path = None
    if args.json is not None:
        path = Path(args.json) if args.json else common.default_json_path("kernels", info)
    payload = {
        "benchmark": "benchmarks/kernels/bench_decode.py",
        "command": " ".join(["python3", *sys.argv]),
        "machine": info,
        "copy_bandwidth": copy,
        "settings": {
            # None: each row's family and LP default (the rows' buffer_len)
            "buffer_len": args.buffer_len,
            "window": WINDOW,
            "act_dtype": "bfloat16",
            "hp_dtype": "float32",
            "gdn_flush": "exact",
            "stagger": True,
            "replays": args.replays,
            "warmup_replays": args.warmup,
            "knobs": {**{k: getattr(args, k) for k in KNOBS}, **args.knob},
            "geometries": {g: asdict(GEOMETRIES[g]) for g in args.geoms},
        },
        "results": [],
    }
    rows = payload["results"]
    for name in args.geoms:
        geom = GEOMETRIES[name]
        for bs in args.batch:
            nl = num_layers(geom, bs)
            slots = torch.arange(1, bs + 1, dtype=torch.int32, device=DEV)
            print(f"{family(geom)} {name} bs={bs} NL={nl}", flush=True)
            # vLLM's graph: the first LP's steps (its kernel takes no L; µs are per step)
            set_steps(buffer_len_for(geom, args.lp[0], args.buffer_len), WINDOW)
            vllm = guarded("vllm", lambda g=geom, b=bs, n=nl, s=slots: run_vllm(g, b, n, s, args))
            vllm["steps_per_graph"] = STEPS
            for lp in args.lp:
                set_steps(buffer_len_for(geom, lp, args.buffer_len), WINDOW)
                print(f" lp={lp} L={BUFFER_LEN}", flush=True)
                row = {
                    "family": family(geom),
                    "geometry": name,
                    "bs": bs,
                    "lp": lp,
                    "buffer_len": BUFFER_LEN,
                    "steps_per_graph": STEPS,
                    "num_layers": nl,
                    "bytes": bytes_model(geom, lp),
                    "vllm": vllm,
                    "ours": run_ours(geom, bs, nl, lp, slots, args),
                }
                derive(row, copy["gbs"])
                rows.append(row)
                if path is not None:
                    common.write_json(path, payload)
    print()
    print(common.machine_line(info, copy["gbs"]))
    print(
        "# us per decode step per layer (median of graph replays); ceil: stock/ours bytes; "
        "ours MB: analytic bytes per step, all rows; GB/s: bytes model (vLLM 8E) / time"
    )
    print(common.format_table(HEADER, [table_row(r) for r in rows]))
    if path is not None:
        common.write_json(path, payload)
        print(f"# wrote {path}")
    failed = sum("us" not in r["ours"] or "us" not in r["vllm"] for r in rows)
    if failed:
        print(f"# {failed} rows with errors: see the progress lines and the JSON")
    return 0


if __name__ == "__main__":
    sys.exit(main())
