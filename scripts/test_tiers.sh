#!/usr/bin/env bash
# The CPU test suite in two tiers, one after the other, each timed (make test, make test-all):
#   1. everything that starts no vLLM engine (unit tests, torch references, the Triton
#      interpreter tests) on two pytest-xdist workers with one OpenMP thread each: the
#      interpreter is single-threaded (measured on 2 cores: 6.5 min instead of ~12);
#   2. the `engine`-marked modules (vLLM engines, in-process or not, and servers), one test at
#      a time in one process: an engine keeps a core busy, and the session's cache of engine
#      runs (tests/models/runs.py) is per process (with -n 2 this tier took 15 min, not 5.5).
# A fresh-clone CI at eed25c8 on 2 AMD EPYC cores: 486 s and 796 s, 1,425 s with the install
# (2,535 s before the interpreter's dead work was skipped: tests/triton_interpreter.py).
# Each tier prints its 15 slowest tests; a table of the tiers' wall times closes the log.
# Every tier runs even when an earlier one failed; the exit status is the first failing
# tier's pytest status ("no tests collected", 5, included).
#
#   scripts/test_tiers.sh PYTHON [MARKEXPR]     e.g. MARKEXPR="not slow" (make test)
set -uo pipefail
cd "$(dirname "$0")/.."
py=$1
extra=${2:+ and ($2)}
names=("unit + kernels (-n 2)" "engines (serial)")
marks=("not engine$extra" "engine$extra")
args=("-n 2" "")
envs=("OMP_NUM_THREADS=1" "")
status=0
summary=()
start=$(date +%s)
for i in "${!names[@]}"; do
  printf '\n== [%s] tier %d: %s (-m "%s")\n' "$(date +%H:%M:%S)" "$((i + 1))" "${names[i]}" \
    "${marks[i]}"
  t0=$(date +%s)
  # shellcheck disable=SC2086  # envs[i] and args[i] are word lists
  env ${envs[i]} "$py" -m pytest -q --durations=15 -m "${marks[i]}" ${args[i]} tests
  rc=$?
  summary+=("$(printf '%-24s %6d s   pytest status %d' "${names[i]}" "$(($(date +%s) - t0))" \
    "$rc")")
  [ "$status" -ne 0 ] || status=$rc
done
printf '\n== test tiers (wall time)\n'
printf '   %s\n' "${summary[@]}"
printf '   %-24s %6d s\n' "total" "$(($(date +%s) - start))"
exit "$status"
