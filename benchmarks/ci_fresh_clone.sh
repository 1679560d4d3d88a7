#!/usr/bin/env bash
# The whole `.ci/run` as CI runs it: a fresh clone of this checkout's HEAD with ../shared beside
# it, nothing reused. Prints one line: commit, start (UTC), load, exit status, wall seconds, the
# machine's CPU seconds over the run from /proc/stat (user / nice / system / idle), and both
# pytest summaries; each pytest run's JUnit XML is kept beside the output (tests/conftest.py). Run it alone on the machine: anything beside it changes every figure.
#   bash benchmarks/ci_fresh_clone.sh [WORK_DIR]   (default /tmp/rlh-ci; removed first; ~40 min here)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/rlh-ci}
rm -rf "$work" && mkdir -p "$work"
git clone -q "$repo" "$work/main" && ln -s "$(cd "$repo/../shared" && pwd)" "$work/shared" || exit 1
read -r _ u0 n0 s0 i0 _ < /proc/stat
load=$(cut -d' ' -f1-3 /proc/loadavg); start_utc=$(date -u +%H:%M:%S); start=$SECONDS
(cd "$work/main" && RLH_JUNIT_DIR="$work" bash .ci/run) > "$work/out.txt" 2>&1; rc=$?
read -r _ u1 n1 s1 i1 _ < /proc/stat
hz=$(getconf CLK_TCK)
echo "$(git -C "$work/main" log --oneline -1 | cut -c1-7) start $start_utc load $load rc=$rc wall=$((SECONDS - start))s" \
     "cpu_s user/nice/sys/idle $(((u1 - u0) / hz))/$(((n1 - n0) / hz))/$(((s1 - s0) / hz))/$(((i1 - i0) / hz))" \
     "$(grep -E '(passed|failed).* in ' "$work/out.txt" | tr '\n' ' ')"
echo "full output: $work/out.txt; per-test times: $work/junit-*.xml (scripts/test_durations.py makes tests/durations.json from them)"
