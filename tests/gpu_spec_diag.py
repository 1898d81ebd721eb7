"""Where speculative decoding with ReplaySSM parts from plain decoding on a GPU: the workloads
of tests/plugin/test_spec_gpu_engine.py under several engine settings, one engine process
per setting side by side (engines at 20% of the GPU, KV cache fixed), each setting's first
divergence per prompt against its family's reference run, and each divergence judged by
transformers' own model in fp32 teacher-forced on the shared context (`TeacherForcedOracle`):
`fp32_gap` is how far apart the two tokens are there (near-tie: <= NEAR_TIE).

    source .gpu/activate.sh && python tests/gpu_spec_diag.py \
        --settings nem_plain,nem_spec,nem_spec_eager --json $OUT/spec-diag.json [--trace $OUT]

--trace DIR sets REPLAYSSM_TRACE_STEPS=DIR/trace-SETTING for the speculative settings
(`vllm_replayssm/trace.py`: one JSON line per step, synchronising). The H200 run of
2026-12-02 (benchmarks/results/diag-h200-20261202-466b6f1-spec-graphs.json) found NemotronH
lossless eagerly and with graphs one request at a time, and wrong with graphs and three
requests at a time, also when only one-row batches had a graph (nem_spec_graph1): the
layer handed the window kernel a strided state-index column (fixed in 335f808).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root

from tests.models.runs import NEMOTRON_H_PROMPTS, NEMOTRON_H_TOKENS, PEAKED
from tests.plugin.test_spec_cpu_engine import GDN_NGRAM
from tests.plugin.test_spec_gpu_engine import NGRAM, PLAIN, _engine

SPEC = {"enabled": True, "buffer_len": 16, "debug_checks": True}
ONE_GRAPH = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [4]}

# name: (family, replayssm, k, engine overrides, reference setting); k = 0: no drafts.
SETTINGS: dict[str, tuple[str, dict, int, dict, str | None]] = {
    "nem_plain": ("nemotron_h", PLAIN, 0, {}, None),
    "nem_stock": ("nemotron_h", {"enabled": False}, 0, {}, "nem_plain"),
    "nem_spec": ("nemotron_h", SPEC, 3, {}, "nem_plain"),
    "nem_spec_eager": ("nemotron_h", SPEC, 3, {"enforce_eager": True}, "nem_plain"),
    "nem_spec_eager_nodebug": (
        "nemotron_h",
        {**SPEC, "debug_checks": False},
        3,
        {"enforce_eager": True},
        "nem_plain",
    ),
    "nem_spec_seq1": (
        "nemotron_h",
        SPEC,
        3,
        {"max_num_seqs": 1, "compilation_config": ONE_GRAPH},
        "nem_plain",
    ),
    "nem_spec_graph1": ("nemotron_h", SPEC, 3, {"compilation_config": ONE_GRAPH}, "nem_plain"),
    "nem_stock_spec": ("nemotron_h", {"enabled": False}, 3, {}, "nem_plain"),
    "qwen_plain": ("qwen3_next", PLAIN, 0, {}, None),
    "qwen_spec": (
        "qwen3_next",
        {"enabled": True, "buffer_len": 16, "lp_dtype": "none"},
        3,
        {},
        "qwen_plain",
    ),
}


def _checkpoint(family: str, root: Path) -> Path:
    from tests.models.tiny import build_checkpoint

    if family == "nemotron_h":
        return build_checkpoint("nemotron_h", root / "nemotron_h", **PEAKED)
    # test_spec_cpu_engine's qwen_dir: one MoE layer.
    return build_checkpoint("qwen3_next", root / "qwen3_next", **PEAKED, mlp_only_layers=[0, 1, 2])


def _prompts(family: str) -> tuple[list[list[int]], int]:
    from tests.plugin.test_spec_cpu_engine import GDN_ONE_TOKEN_PROMPTS, ONE_TOKEN_NEW_TOKENS

    if family == "nemotron_h":
        return NEMOTRON_H_PROMPTS, NEMOTRON_H_TOKENS
    return GDN_ONE_TOKEN_PROMPTS, ONE_TOKEN_NEW_TOKENS


def run_setting(name: str, workdir: Path) -> None:
    """One setting in this process: greedy outputs to workdir/NAME.json."""
    from tests.models.tiny import greedy_outputs

    family, replayssm, k, over, _ = SETTINGS[name]
    if k:
        drafter = NGRAM if family == "nemotron_h" else GDN_NGRAM
        over = {"speculative_config": {**drafter, "num_speculative_tokens": k}, **over}
    engine = {**_engine(k), **over}  # the GPU test's engine: graphs for 1 + k tokens per row
    prompts, tokens = _prompts(family)
    random.seed(0)
    out = greedy_outputs(
        _checkpoint(family, workdir / f"ckpt-{name}"),
        prompts,
        tokens,
        logprobs=5,
        additional_config={"replayssm": replayssm},
        **engine,
    )
    rows = [[list(t), [{str(a): b for a, b in d.items()} for d in lp]] for t, lp in out]
    (workdir / f"{name}.json").write_text(json.dumps(rows))


def _load(path: Path):
    rows = json.loads(path.read_text())
    return [(t, [{int(a): b for a, b in d.items()} for d in lp]) for t, lp in rows]


def compare(names: list[str], workdir: Path) -> dict:
    """First divergence per prompt of each setting against its reference, fp32-judged."""
    from tests.models.tiny import TeacherForcedOracle

    oracles: dict[str, TeacherForcedOracle] = {}
    report: dict = {}
    for name in names:
        family, _, _, _, ref_name = SETTINGS[name]
        if ref_name is None or not (workdir / f"{name}.json").exists():
            continue
        if not (workdir / f"{ref_name}.json").exists():
            report[name] = {"error": f"reference {ref_name} did not run"}
            continue
        ref, cand = _load(workdir / f"{ref_name}.json"), _load(workdir / f"{name}.json")
        if family not in oracles:
            oracles[family] = TeacherForcedOracle(_checkpoint(family, workdir / "ckpt-oracle"))
        prompts, _ = _prompts(family)
        divergences = []
        for i, ((a, alp), (b, _)) in enumerate(zip(ref, cand, strict=True)):
            pos = next((j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
            if pos is None:
                continue
            lp = oracles[family].next_logprobs(list(prompts[i]) + a[:pos])
            divergences.append(
                dict(
                    prompt=i,
                    position=pos,
                    reference_token=a[pos],
                    token=b[pos],
                    reference_gap=alp[pos][a[pos]] - alp[pos].get(b[pos], float("-inf")),
                    fp32_gap=float(lp[a[pos]] - lp[b[pos]]),
                    fp32_top1=int(lp.argmax()),
                )
            )
        report[name] = {
            "reference": ref_name,
            "identical": len(ref) - len(divergences),
            "prompts": len(ref),
            "divergences": divergences,
        }
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma list of SETTINGS")
    ap.add_argument("--json", required=True, help="report path")
    ap.add_argument("--workdir", default="/tmp/replayssm-spec-diag")
    ap.add_argument("--trace", default=None, help="directory for the step traces")
    ap.add_argument("--timeout", type=float, default=480.0, help="seconds per setting")
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)  # one setting, internal
    args = ap.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.run:
        run_setting(args.run, workdir)
        return 0
    names = args.settings.split(",")
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        ap.error(f"unknown settings {unknown}; known: {list(SETTINGS)}")
    env = dict(os.environ)
    procs = {}
    for name in names:
        penv = dict(env)
        if args.trace and SETTINGS[name][2]:
            penv["REPLAYSSM_TRACE_STEPS"] = str(Path(args.trace) / f"trace-{name}")
        log = open(workdir / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        cmd = [sys.executable, __file__, "--run", name, "--json", args.json, "--workdir"]
        procs[name] = (
            subprocess.Popen([*cmd, str(workdir)], stdout=log, stderr=log, env=penv),
            log,
        )
        time.sleep(1)
    status = {}
    for name, (proc, log) in procs.items():
        try:
            status[name] = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            status[name] = "timeout"
        log.close()
        print(f"{name}: {status[name]}", flush=True)
    from benchmarks import common

    commit, dirty = common.git_commit()
    report = {
        "benchmark": "tests/gpu_spec_diag.py",
        "command": " ".join(sys.argv),
        "commit": commit,
        "dirty": dirty,
        "machine": common.machine_info(),
        "settings": {n: SETTINGS[n] for n in names},
        "exit_status": status,
        "comparisons": compare(names, workdir),
    }
    common.write_json(Path(args.json), report)
    for name, res in report["comparisons"].items():
        if "divergences" in res:
            far = [d for d in res["divergences"] if abs(d["fp32_gap"]) > 0.25]
            print(
                f"{name} vs {res['reference']}: {res['identical']}/{res['prompts']} identical, "
                f"{len(far)} divergences beyond an fp32 near-tie",
                flush=True,
            )
    return 0 if all(s == 0 for s in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
