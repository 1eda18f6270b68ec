#!/usr/bin/env bash
# One step of `make test`, timed: runs the command and appends "seconds<TAB>step<TAB>exit status" to
# build/test-steps.tsv, which tests/timing/summary.py prints, slowest first, at the end of `make test`.
#   tests/timing/step.sh NAME COMMAND [ARGS...]
set -uo pipefail
name="$1"
shift
mkdir -p build
started=$(date +%s)
"$@"
status=$?
printf '%s\t%s\t%s\n' "$(( $(date +%s) - started ))" "$name" "$status" >> build/test-steps.tsv
exit "$status"
