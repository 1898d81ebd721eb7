#!/usr/bin/env bash
# GPU engine tests side by side on one GPU host (tests/models/tiny.py asks vLLM for 20% of
# the GPU and fixes the KV cache, so engines of several processes fit): one pytest process
# per node id, each with its own --basetemp, under a per-node time limit. Writes one log
# with every node's output (vLLM's INFO/WARNING engine lines dropped) and prints each
# node's status; the exit status is 1 if any node failed or timed out. The device tool
# brings back at most a few files, hence one log.
#
#   source .gpu/activate.sh && REPLAYSSM_GIT_COMMIT=<sha> \
#     scripts/gpu_tests_parallel.sh $OUT/pytest-gpu.log NODE [NODE ...]
#
# NODE: a pytest node id, e.g. "tests/plugin/test_spec_gpu_engine.py::test_gdn_one_token_prompts_on_gpu".
# GPU_TESTS_TIMEOUT: seconds per node (default 540); PYTHON: the interpreter (python3).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: $0 LOG NODE [NODE ...]" >&2
  exit 2
fi
log=$1
shift
tmp=$(mktemp -d)
export PYTHONUNBUFFERED=1
i=0
for node in "$@"; do
  i=$((i + 1))
  (
    timeout "${GPU_TESTS_TIMEOUT:-540}" "${PYTHON:-python3}" -m pytest -m gpu -q -s -p no:cacheprovider \
      --basetemp="$tmp/base$i" "$node" >"$tmp/$i.log" 2>&1
    echo "rc=$? node=$node" >>"$tmp/$i.log"
  ) &
  sleep 2 # staggered engine starts: vLLM's start-up memory check reads free memory
done
wait
status=0
{
  echo "# $(date -u +%FT%TZ) commit ${REPLAYSSM_GIT_COMMIT:-unknown}, $# nodes side by side"
  for j in $(seq 1 "$i"); do
    echo "=================== node $j"
    grep -v -E "(^|[ )])(INFO|WARNING|DEBUG) [0-9]|^\s*$|warnings.warn|DeprecationWarning" "$tmp/$j.log"
  done
} >"$log"
for j in $(seq 1 "$i"); do
  line=$(tail -1 "$tmp/$j.log")
  echo "$line"
  [ "${line#rc=0 }" = "$line" ] && status=1
done
rm -rf "$tmp"
exit $status
