#!/usr/bin/env bash
# The CPU test suite in two tiers that run side by side, each timed (make test, make test-all):
#   1. everything that starts no vLLM engine (unit tests, torch references, the Triton
#      interpreter tests) on `nproc` pytest-xdist workers: it shares the cores with tier 2
#      while that runs and has them all afterwards (one process: 1,293 s beside tier 2's
#      1,005 s in a fresh-clone CI at fdcd86b, one core idle for the last 290 s);
#   2. the `engine`-marked modules (vLLM engines, in-process or not, and servers), one test at
#      a time in one process: the session's cache of engine runs (tests/models/runs.py) is per
#      process (with -n 2 this tier took 15 min, not 5.5).
# Every process has one OpenMP thread and one numba thread: the interpreter is
# single-threaded, and a parallel region of two threads waits for a descheduled one while the
# other tier holds a core. numba's OpenMP pool (vLLM's ngram drafter) sets the process's
# OpenMP team, torch's included, to NUMBA_NUM_THREADS, by default the core count: with it
# two engine tests took 504 s and 100 s side by side instead of 9 and 29 (perf: 92% in
# libgomp's spin). Tiers one after the other (tier 1 on two workers) took 604 + 819 s on 2 AMD
# EPYC cores.
# Each tier's output goes to its own log, printed when both have finished (its 15 slowest
# tests at its end); a line every PROGRESS_S seconds (default 120) says where each tier is;
# a table of the tiers' wall times closes the log. The exit status is the first failing
# tier's pytest status ("no tests collected", 5, included).
#
#   scripts/test_tiers.sh PYTHON [MARKEXPR]     e.g. MARKEXPR="not slow" (make test)
set -uo pipefail
cd "$(dirname "$0")/.."
py=$1
extra=${2:+ and ($2)}
names=("unit + kernels" "engines (serial)")
marks=("not engine$extra" "engine$extra")
workers=(-n "$(nproc)")
logs=$(mktemp -d)
pids=()
# Killed or interrupted, stop the tiers too (each runs in its own process group: pytest's
# xdist workers and engine processes go with it); on every exit, remove the logs.
stop_tiers() { for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done; }
trap 'stop_tiers; exit 130' INT
trap 'stop_tiers; exit 143' TERM
trap 'rm -rf "$logs"' EXIT
export OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1
start=$(date +%s)
set -m # the tiers get process groups of their own (job control only while they start)
for i in "${!names[@]}"; do
  printf '== [%s] tier %d: %s (-m "%s") started\n' "$(date +%H:%M:%S)" "$((i + 1))" \
    "${names[i]}" "${marks[i]}"
  (
    t0=$(date +%s)
    args=()
    [ "$i" -eq 0 ] && args=("${workers[@]}")
    "$py" -m pytest -q --durations=15 -m "${marks[i]}" "${args[@]}" tests >"$logs/$i.log" 2>&1
    echo "$? $(($(date +%s) - t0))" >"$logs/$i.status"
  ) &
  pids+=($!)
done
set +m
# Progress: each tier's last pytest progress figure ("[ 47%]") while any runs.
any_running() {
  local pid
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}
while any_running; do
  for _ in $(seq "${PROGRESS_S:-120}"); do
    sleep 1
    any_running || break
  done
  any_running || break
  line="== [$(date +%H:%M:%S)] $(($(date +%s) - start)) s:"
  for i in "${!names[@]}"; do
    if [ -f "$logs/$i.status" ]; then
      state="done"
    else
      state=$(grep -o '\[ *[0-9]*%\]' "$logs/$i.log" 2>/dev/null | tail -1)
      state=${state:-running}
    fi
    line+=" tier $((i + 1)) $state;"
  done
  echo "$line"
done
wait
status=0
summary=()
for i in "${!names[@]}"; do
  read -r rc secs <"$logs/$i.status" || { rc=1 secs=0; }
  printf '\n== tier %d: %s (-m "%s")\n' "$((i + 1))" "${names[i]}" "${marks[i]}"
  cat "$logs/$i.log"
  summary+=("$(printf '%-24s %6d s   pytest status %d' "${names[i]}" "$secs" "$rc")")
  [ "$status" -ne 0 ] || status=$rc
done
printf '\n== test tiers (side by side; wall time)\n'
printf '   %s\n' "${summary[@]}"
printf '   %-24s %6d s\n' "total" "$(($(date +%s) - start))"
exit "$status"
