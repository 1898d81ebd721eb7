"""GPU smoke test of the plugin's layer paths with the tiny seeded checkpoints of
tests/models/tiny.py: per model, stock vLLM (replayssm off) and ReplaySSM with route "replay"
(the replay kernels at every batch size), FULL CUDA graphs for pure decode batches
(compilation mode 0, FULL_DECODE_ONLY, capture sizes 1-4), chunked prefill and mixed batches
(max_num_seqs 3, 32 batched tokens), 8 prompts x 40 greedy tokens, buffer_len 8; then the
top-5 comparison of tests/models/compare.py. The same check as tests/plugin/test_gpu_engine.py,
runnable without pytest:

    source .gpu/activate.sh && python benchmarks/e2e/gpu_smoke.py nemotron_h qwen3_next
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.models.compare import compare_greedy
from tests.models.tiny import build_checkpoint, greedy_outputs

PROMPT_LENS = [5, 9, 14, 22, 31, 40, 2, 57]
ENGINE = dict(max_num_seqs=3, max_num_batched_tokens=32, enable_chunked_prefill=True,
              enforce_eager=False,
              compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
                                  "cudagraph_capture_sizes": [1, 2, 3, 4]})
MODES = (("stock", {"enabled": False}), ("replay", {"enabled": True, "route": "replay"}))


def main(kinds: list[str]) -> int:
    prompts = [[(7 * i + 3 * j) % 500 + 1 for j in range(n)] for i, n in enumerate(PROMPT_LENS)]
    failed = False
    for kind in kinds:
        model_dir = build_checkpoint(kind, Path(f"/tmp/replayssm-smoke-{kind}"),
                                     initializer_range=0.3)
        extra = {"gdn_prefill_backend": "triton"} if kind == "qwen3_next" else {}
        results = {}
        for name, replayssm in MODES:
            start = time.time()
            try:
                results[name] = greedy_outputs(
                    model_dir, prompts, 40, logprobs=5,
                    additional_config={"replayssm": {"buffer_len": 8, **replayssm}, **extra},
                    **ENGINE)
                print(f"SMOKE {kind} {name} ok {time.time() - start:.0f} s", flush=True)
            except Exception:
                failed = True
                print(f"SMOKE {kind} {name} FAILED {traceback.format_exc()[-1500:]}", flush=True)
        if len(results) == len(MODES):
            cmp = compare_greedy(results["stock"], results["replay"])
            print(f"SMOKE {kind} identical {cmp.identical}/{cmp.prompts} divergences "
                  f"(prompt, position, logprob gap) {cmp.divergences}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["nemotron_h", "qwen3_next"]))
