#!/usr/bin/env bash
# Run one phase of `make test` and print its wall time, so drift shows in every CI log:
#   tools/timed.sh NAME COMMAND [ARGS...]
# With CI_TIMES set (.ci/run sets it), the line is also appended there for the summary.
set -uo pipefail
name="$1"
shift
start=$(date +%s.%N)
"$@"
rc=$?
secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
line="phase ${name}: ${secs} s (exit ${rc})"
echo "== ${line}"
if [[ -n "${CI_TIMES:-}" ]]; then
    echo "${line}" >>"${CI_TIMES}"
fi
exit "$rc"
