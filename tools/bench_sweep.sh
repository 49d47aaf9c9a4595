#!/usr/bin/env bash
# tools/dev bench: a short standard comms-bench sweep over every op at 2 and 4
# ranks into build/bench/results.json and build/bench/results.md. Per op and
# world size it runs comms with results checked, comms alternating with raw
# Gloo running the same algorithm (--overhead), and Gloo's own algorithms
# (--gloo-native).
set -euo pipefail
BUILD=${1:?usage: bench_sweep.sh BUILD_DIR}
OUT="$BUILD/bench"
ITERS=${COMMS_BENCH_ITERS:-50}
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.txt
OPS=(all_reduce all_gather reduce_scatter broadcast reduce all_to_all gather scatter send_recv barrier)
for n in 2 4; do
  for op in "${OPS[@]}"; do
    for mode in comms overhead native; do
      case $mode in
        comms) flags=(-c 1) ;;
        overhead) flags=(--overhead) ;;
        native) flags=(--gloo-native) ;;
      esac
      tag=$op-n$n-$mode
      "$BUILD/tools/commsrun" -n "$n" --timeout 300 -- "$BUILD/tools/comms-bench" -C "$op" -b 4K -e 16M -f 4 \
        -n "$ITERS" -w 5 --outofplace "${flags[@]}" --json "$OUT/$tag.json" > "$OUT/$tag.txt"
    done
  done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(out, "*-*-*.json"))):
    mode = os.path.basename(f)[:-5].rsplit("-", 1)[1]
    for r in json.load(open(f)):
        runs.setdefault((r["op"], r["ranks"], r["bytes"]), {})[mode] = r
rows = []
with open(os.path.join(out, "results.md"), "w") as md:
    md.write("| op | ranks | bytes | p50 µs | p99 µs | busbw GB/s | #wrong | overhead vs same algorithm | "
             "Gloo's own p50 µs | vs Gloo's own | algorithm |\n")
    md.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
    for key in sorted(runs, key=lambda k: (k[0], k[1], k[2])):
        m = runs[key]
        c, o, g = m.get("comms"), m.get("overhead"), m.get("native")
        if not c:
            continue
        row = dict(c)
        over = ""
        if o and o.get("raw_p50_us"):
            row["overhead_us"] = o["p50_us"] - o["raw_p50_us"]
            row["overhead_pct"] = 100 * row["overhead_us"] / o["raw_p50_us"]
            over = "%+.1f µs (%+.1f%%)" % (row["overhead_us"], row["overhead_pct"])
        native, ratio = "", ""
        if g and g["p50_us"] > 0:
            row["gloo_native_p50_us"] = g["p50_us"]
            row["gloo_native_algorithm"] = g["algorithm"]
            native = "%.1f" % g["p50_us"]
            ratio = "%.2fx" % (c["p50_us"] / g["p50_us"])
        rows.append(row)
        md.write("| %s | %d | %d | %.1f | %.1f | %.3f | %d | %s | %s | %s | %s |\n" % (
            c["op"], c["ranks"], c["bytes"], c["p50_us"], c["p99_us"], c["busbw_gbps"], c["wrong"], over,
            native, ratio, c["algorithm"]))
json.dump(rows, open(os.path.join(out, "results.json"), "w"), indent=1)
print("wrote", os.path.join(out, "results.md"), "and results.json")
PY
