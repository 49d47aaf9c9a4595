#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang-14, ASan+UBSan) and runs
# each over its committed corpus for a bounded time.
#   scripts/fuzz.sh [BUILD_DIR] [SECONDS_PER_TARGET]     (build-fuzz, 20)
# One line per target, then "N passed, N failed"; exit status 1 if any failed.
# New inputs go to a temporary directory, never into the repository; a
# crash's reproducer is kept under BUILD_DIR/fuzz-artifacts/ and its path
# printed. FUZZ_JOBS (default 2) targets run at once.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build-fuzz}")
SECONDS_PER_TARGET=${2:-20}
JOBS=${FUZZ_JOBS:-2}
CXX_FUZZ=${CXX_FUZZ:-clang++-14}

if ! command -v "$CXX_FUZZ" >/dev/null; then
  echo "scripts/fuzz.sh: $CXX_FUZZ not found (tools/dev installs clang-14 and libclang-rt-14-dev)" >&2
  exit 1
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

start=$(date +%s)
if [ ! -f "$BUILD/build.ninja" ]; then
  # Parsers at -O1 (the core's other sources are built at -O0, see
  # core/meson.build); line tables for symbolized reports.
  CXX="$CXX_FUZZ" meson setup "$BUILD" "$ROOT" -Dfuzz=true -Doptimization=1 -Ddebug=false >"$WORK/setup.log" 2>&1 || {
    cat "$WORK/setup.log" >&2
    exit 1
  }
fi
meson compile -C "$BUILD" -j 2 >"$BUILD/fuzz-build.log" 2>&1 || {
  tail -50 "$BUILD/fuzz-build.log" >&2
  echo "scripts/fuzz.sh: build failed (log: $BUILD/fuzz-build.log)" >&2
  exit 1
}
echo "fuzz: built in $(( $(date +%s) - start )) s"

mapfile -t TARGETS < <(cd "$ROOT/tests/fuzz" && ls fuzz_*.cc | sed 's/\.cc$//' | sort)
mkdir -p "$BUILD/fuzz-artifacts" "$BUILD/fuzz-logs"

# Runs one target; writes "runs<TAB>status<TAB>detail" to $WORK/<target>.result.
run_target() {
  local t=$1 exe="$BUILD/tests/fuzz/$1" log="$BUILD/fuzz-logs/$1.log"
  local corpus="$ROOT/tests/fuzz/corpus/$1" dict="$ROOT/tests/fuzz/dict/$1.dict"
  local artifacts="$BUILD/fuzz-artifacts/$1/"
  rm -rf "$artifacts" && mkdir -p "$artifacts" "$WORK/$t"
  local args=(-max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048
              -print_final_stats=1 -artifact_prefix="$artifacts")
  [ -f "$dict" ] && args+=(-dict="$dict")
  # New inputs land in the first directory: the temporary one.
  local dirs=("$WORK/$t")
  [ -d "$corpus" ] && dirs+=("$corpus")
  local rc=0
  timeout $((SECONDS_PER_TARGET + 120)) "$exe" "${args[@]}" "${dirs[@]}" >"$log" 2>&1 || rc=$?
  local runs
  runs=$(grep -a 'stat::number_of_executed_units' "$log" | awk '{print $2}' | tail -1) || true
  local repro
  repro=$(ls "$artifacts" 2>/dev/null | head -1) || true
  if [ "$rc" -eq 0 ] && [ -z "$repro" ]; then
    printf '%s\tok\t\n' "${runs:-?}" >"$WORK/$t.result"
  elif [ -n "$repro" ]; then
    printf '%s\tFAILED\treproducer %s (rerun: %s %s; log %s)\n' "${runs:-?}" "$artifacts$repro" "$exe" \
      "$artifacts$repro" "$log" >"$WORK/$t.result"
  else
    printf '%s\tFAILED\texit %s, no reproducer (log %s)\n' "${runs:-?}" "$rc" "$log" >"$WORK/$t.result"
  fi
}

run_start=$(date +%s)
running=0
for t in "${TARGETS[@]}"; do
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_target "$t" &
  running=$((running + 1))
done
wait || true

passed=0
failed=0
for t in "${TARGETS[@]}"; do
  IFS=$'\t' read -r runs status detail <"$WORK/$t.result" || { runs='?'; status=FAILED; detail='no result'; }
  if [ "$status" = ok ]; then
    passed=$((passed + 1))
    printf 'fuzz %-22s %10s runs  ok\n' "$t" "$runs"
  else
    failed=$((failed + 1))
    printf 'fuzz %-22s %10s runs  FAILED: %s\n' "$t" "$runs" "$detail"
  fi
done
echo "fuzz: ran ${#TARGETS[@]} targets for ${SECONDS_PER_TARGET} s each in $(( $(date +%s) - run_start )) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
