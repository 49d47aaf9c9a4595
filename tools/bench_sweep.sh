#!/usr/bin/env bash
# tools/dev bench: a short standard comms-bench sweep over every op at 2 and 4
# ranks, through comms and through raw Gloo (same algorithm), into
# build/bench/results.json and build/bench/results.md.
set -euo pipefail
BUILD=${1:?usage: bench_sweep.sh BUILD_DIR}
OUT="$BUILD/bench"
mkdir -p "$OUT"
rm -f "$OUT"/*.json
OPS=(all_reduce all_gather reduce_scatter broadcast reduce all_to_all gather scatter send_recv barrier)
for n in 2 4; do
  for op in "${OPS[@]}"; do
    for raw in "" --raw-gloo; do
      tag=$op-n$n${raw:+-raw}
      "$BUILD/tools/commsrun" -n "$n" --timeout 300 -- "$BUILD/tools/comms-bench" -o "$op" -b 4K -e 16M -f 4 \
        -n 20 -w 5 -c 1 --outofplace $raw --json "$OUT/$tag.json" > "$OUT/$tag.txt"
    done
  done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
rows = []
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    if os.path.basename(f) == "results.json":
        continue
    rows += json.load(open(f))
json.dump(rows, open(os.path.join(out, "results.json"), "w"), indent=1)
raw = {(r["op"], r["ranks"], r["bytes"]): r for r in rows if r["raw_gloo"]}
with open(os.path.join(out, "results.md"), "w") as md:
    md.write("| op | ranks | bytes | p50 µs | p99 µs | busbw GB/s | raw Gloo p50 µs | overhead | #wrong | algorithm |\n")
    md.write("|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        if r["raw_gloo"]:
            continue
        b = raw.get((r["op"], r["ranks"], r["bytes"]))
        overhead = ""
        if b and b["p50_us"] > 0:
            overhead = "%+.1f%% (%+.1f µs)" % (100 * (r["p50_us"] / b["p50_us"] - 1), r["p50_us"] - b["p50_us"])
        md.write("| %s | %d | %d | %.1f | %.1f | %.3f | %s | %s | %d | %s |\n" % (
            r["op"], r["ranks"], r["bytes"], r["p50_us"], r["p99_us"], r["busbw_gbps"],
            "%.1f" % b["p50_us"] if b else "", overhead, r["wrong"], r["algorithm"]))
print("wrote", os.path.join(out, "results.md"), "and results.json")
PY
