#!/usr/bin/env bash
# Instructions per eager op on the NCCL plugin's path (backends/nccl/README.md,
# "CPU per op"): callgrind counts run_ops of build/tests/backends/nccl/nccl_op_cost for
# N and 2N ops; (I(2N) - I(N)) / N cancels setup and teardown. Runs it
# RUNS times (default 3) and prints each value.
#   scripts/nccl_op_cost.sh [N] [RUNS]    (build first: tools/dev build)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${COMMS_BUILD_DIR:-$ROOT/build}/tests/backends/nccl/nccl_op_cost
N=${1:-2000}
RUNS=${2:-3}
command -v valgrind >/dev/null || { echo "nccl_op_cost: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "nccl_op_cost: $BIN not built (tools/dev build)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
instructions() {  # ops -> instructions inside run_ops (inclusive), main thread
  valgrind --tool=callgrind --callgrind-out-file="$TMP/out" --toggle-collect='*run_ops*' \
    --separate-threads=yes "$BIN" "$1" >/dev/null 2>"$TMP/log" || { cat "$TMP/log" >&2; exit 1; }
  # Only the main thread's file (…-01) ran run_ops; "summary:" is its total.
  awk '/^summary:/ {print $2}' "$TMP/out"-01
}
for run in $(seq "$RUNS"); do
  a=$(instructions "$N")
  b=$(instructions $((2 * N)))
  echo "run $run: $(( (b - a) / N )) instructions per op (N=$N: $a, 2N: $b)"
done
