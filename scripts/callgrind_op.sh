#!/usr/bin/env bash
# Instructions per op of one small collective on cpu:ucx at 2 ranks, from
# valgrind's callgrind (repeatable where timings are not): rank 0 runs
# comms-bench under callgrind, rank 1 runs natively and busy-polls so that it
# is always ready; per op = (Ir at 2N ops - Ir at N ops) / N, which cancels
# start-up and teardown. A rank that has to wait for its peer polls, and the
# polls count too, so the script repeats the pair and prints the minimum
# (a loaded machine only adds to it). Each rank is bound to its own core
# (taskset), and as root both run at nice -10, so that other work on the
# machine preempts them less.
#   scripts/callgrind_op.sh BUILD [OP] [BYTES] [N] [REPEATS]
# e.g. scripts/callgrind_op.sh build all_reduce 8 2000 3
# Environment passes through (COMMS_UCX_SHM=0: the UCX path).
set -euo pipefail
BUILD=$(cd "${1:?usage: callgrind_op.sh BUILD [OP] [BYTES] [N] [REPEATS]}" && pwd)
OP=${2:-all_reduce}
BYTES=${3:-8}
N=${4:-2000}
REPEATS=${5:-3}
command -v valgrind > /dev/null || { echo "callgrind_op.sh: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PRIO=()
[ "$(id -u)" = 0 ] && PRIO=(nice -n -10)
cat > "$WORK/rank.sh" <<EOF
#!/usr/bin/env bash
args=(-C $OP -b $BYTES -e $BYTES -w 0 -c 0 --outofplace --backend cpu:ucx -n "\$1")
if [ "\$RANK" = 0 ]; then
  exec taskset -c 0 ${PRIO[*]} valgrind --tool=callgrind --callgrind-out-file="\$2" "$BUILD/tools/comms-bench" "\${args[@]}"
fi
COMMS_UCX_BUSY_POLL=1 exec taskset -c 1 ${PRIO[*]} "$BUILD/tools/comms-bench" "\${args[@]}"
EOF
chmod +x "$WORK/rank.sh"
ir() {  # total Ir of rank 0 for $1 ops
  "$BUILD/tools/commsrun" -n 2 --timeout 600 -- "$WORK/rank.sh" "$1" "$WORK/cg.out" > "$WORK/log" 2>&1 ||
    { cat "$WORK/log" >&2; exit 1; }
  sed -n 's/^summary: //p' "$WORK/cg.out"
}
best=""
for ((r = 0; r < REPEATS; ++r)); do
  one=$(ir "$N")
  two=$(ir $((2 * N)))
  per=$(((two - one) / N))
  echo "run $((r + 1)): $per instructions per $OP of $BYTES B"
  if [ -z "$best" ] || [ "$per" -lt "$best" ]; then best=$per; fi
done
echo "minimum: $best instructions per $OP of $BYTES B (rank 0, 2 ranks, cpu:ucx, COMMS_UCX_SHM=${COMMS_UCX_SHM:-1})"
