"""GPU smoke test of the plugin's layer paths with the tiny seeded checkpoints of
tests/models/tiny.py: per model, stock vLLM (replayssm off) and ReplaySSM with route "replay"
(the replay kernels at every batch size), FULL CUDA graphs for pure decode batches
(compilation mode 0, FULL_DECODE_ONLY, capture sizes 1-4), chunked prefill and mixed batches
(max_num_seqs 3, 32 batched tokens), 8 prompts x 40 greedy tokens, buffer_len 8; then the
top-5 comparison of tests/models/compare.py. The same check as tests/plugin/test_gpu_engine.py,
runnable without pytest (it lives with the tests whose helpers it uses; the JSON goes to
benchmarks/results/ like the benchmarks'):

    source .gpu/activate.sh && python tests/gpu_smoke.py nemotron_h qwen3_next \
        --json $OUT/gpu-smoke.json

With --json PATH the figures (engines ok/failed and their times, identical prompts,
divergences as (prompt, position, reference logprob gap)) go to PATH with the commit
(REPLAYSSM_GIT_COMMIT where the checkout has no .git) and the GPU name.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root

from benchmarks import common
from tests.models.compare import compare_greedy
from tests.models.runs import BUFFER_LEN, GPU_ENGINE, GPU_NEW_TOKENS, PEAKED, PROMPT_LENS, prompts
from tests.models.tiny import build_checkpoint, greedy_outputs

MODES = (("stock", {"enabled": False}), ("replay", {"enabled": True, "route": "replay"}))


def main(kinds: list[str], json_path: str | None = None) -> int:
    report: dict = {
        "benchmark": "tests/gpu_smoke.py",
        "command": " ".join(sys.argv),
        "engine": dict(GPU_ENGINE),
        "prompt_lens": PROMPT_LENS,
        "max_tokens": GPU_NEW_TOKENS,
        "buffer_len": BUFFER_LEN,
        "results": {},
    }
    failed = False
    for kind in kinds:
        model_dir = build_checkpoint(kind, Path(f"/tmp/replayssm-smoke-{kind}"), **PEAKED)
        extra = {"gdn_prefill_backend": "triton"} if kind == "qwen3_next" else {}
        results = {}
        entry: dict = report["results"].setdefault(kind, {})
        for name, replayssm in MODES:
            start = time.time()
            try:
                results[name] = greedy_outputs(
                    model_dir,
                    prompts(),
                    GPU_NEW_TOKENS,
                    logprobs=5,
                    additional_config={
                        "replayssm": {"buffer_len": BUFFER_LEN, **replayssm},
                        **extra,
                    },
                    **GPU_ENGINE,
                )
                print(f"SMOKE {kind} {name} ok {time.time() - start:.0f} s", flush=True)
                entry[name] = f"ok ({time.time() - start:.0f} s incl. start-up)"
            except Exception:
                failed = True
                entry[name] = f"FAILED: {traceback.format_exc()[-1500:]}"
                print(f"SMOKE {kind} {name} FAILED {traceback.format_exc()[-1500:]}", flush=True)
        if len(results) == len(MODES):
            cmp = compare_greedy(results["stock"], results["replay"])
            print(
                f"SMOKE {kind} identical {cmp.identical}/{cmp.prompts} divergences "
                f"(prompt, position, logprob gap) {cmp.divergences}",
                flush=True,
            )
            entry.update(
                identical_prompts=cmp.identical,
                prompts=cmp.prompts,
                divergences_prompt_position_logprob_gap=cmp.divergences,
            )
    if json_path:
        report["machine"] = common.machine_info()
        common.write_json(Path(json_path), report)
        print(f"# wrote {json_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "kinds", nargs="*", metavar="MODEL", help="nemotron_h and/or qwen3_next (default both)"
    )
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args()
    unknown = sorted(set(args.kinds) - {"nemotron_h", "qwen3_next"})
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose nemotron_h, qwen3_next")
    sys.exit(main(args.kinds or ["nemotron_h", "qwen3_next"], args.json))
