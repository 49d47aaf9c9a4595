#!/usr/bin/env bash
# tools/dev bench: a short standard comms-bench sweep over every op at 2 and 4
# ranks into build/bench/results.json and build/bench/results.md. Per op and
# world size it runs comms with results checked, comms alternating with its
# own plugin called directly (--overhead: libcomms' overhead), Gloo's own
# algorithms (--gloo-native), and Open MPI's own collective with the same
# sizes, iterations and p50-of-max-over-ranks rule (tools/mpi_bench), whose
# ratio comms/MPI each row shows. COMMS_BACKEND picks the comms backend (e.g.
# cpu:ucx); every column runs for any of them.
set -euo pipefail
BUILD=${1:?usage: bench_sweep.sh BUILD_DIR}
OUT="$BUILD/bench"
ITERS=${COMMS_BENCH_ITERS:-50}
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.txt
OPS=(all_reduce all_gather reduce_scatter broadcast reduce all_to_all gather scatter send_recv barrier)
MODES=(comms overhead native)
# The Open MPI column, or why it is missing.
MPI_MISSING=""
if [[ ! -x "$BUILD/tools/mpi-bench" ]]; then
  MPI_MISSING="$BUILD/tools/mpi-bench was not built: meson found no MPI for C (tools/dev installs libopenmpi-dev)"
elif ! command -v mpirun > /dev/null; then
  MPI_MISSING="mpirun is not on PATH (tools/dev installs openmpi-bin)"
else
  MODES+=(mpi)
  MPIRUN=(mpirun --oversubscribe)
  [[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)
fi
SIZES=(--minbytes 4K --maxbytes 16M --stepfactor 4 --iters "$ITERS" --warmup 5)
for n in 2 4; do
  for op in "${OPS[@]}"; do
    for mode in "${MODES[@]}"; do
      tag=$op-n$n-$mode
      if [[ $mode == mpi ]]; then
        "${MPIRUN[@]}" -np "$n" "$BUILD/tools/mpi-bench" --op "$op" "${SIZES[@]}" --json "$OUT/$tag.json" \
          > "$OUT/$tag.txt" 2>&1 || echo "mpi-bench $op at $n ranks failed: see $OUT/$tag.txt" >&2
        continue
      fi
      case $mode in
        comms) flags=(--check 1) ;;
        overhead) flags=(--overhead) ;;
        native) flags=(--gloo-native) ;;
      esac
      "$BUILD/tools/commsrun" -n "$n" --timeout 300 -- "$BUILD/tools/comms-bench" -C "$op" "${SIZES[@]}" \
        --outofplace "${flags[@]}" --json "$OUT/$tag.json" > "$OUT/$tag.txt"
    done
  done
done
MPI_MISSING="$MPI_MISSING" python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
mpi_missing = os.environ.get("MPI_MISSING", "")
runs = {}
for f in sorted(glob.glob(os.path.join(out, "*-*-*.json"))):
    mode = os.path.basename(f)[:-5].rsplit("-", 1)[1]
    for r in json.load(open(f)):
        runs.setdefault((r["op"], r["ranks"], r["bytes"]), {})[mode] = r
rows = []
with open(os.path.join(out, "results.md"), "w") as md:
    if mpi_missing:
        md.write("Open MPI column missing: %s.\n\n" % mpi_missing)
    md.write("| op | ranks | bytes | p50 µs | p99 µs | busbw GB/s | #wrong | overhead vs the plugin called directly | "
             "Gloo's own p50 µs | vs Gloo's own | Open MPI p50 µs | MPI busbw GB/s | comms/MPI p50 | algorithm |\n")
    md.write("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for key in sorted(runs, key=lambda k: (k[0], k[1], k[2])):
        m = runs[key]
        c, o, g, mp = m.get("comms"), m.get("overhead"), m.get("native"), m.get("mpi")
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
            row["gloo_native_algorithm"] = g.get("algorithm", "")
            native = "%.1f" % g["p50_us"]
            ratio = "%.2fx" % (c["p50_us"] / g["p50_us"])
        mpi_p50, mpi_bw, mpi_ratio = "", "", ""
        if mp and mp["p50_us"] > 0:
            row["mpi_p50_us"], row["mpi_busbw_gbps"] = mp["p50_us"], mp["busbw_gbps"]
            row["comms_over_mpi_p50"] = c["p50_us"] / mp["p50_us"]
            mpi_p50, mpi_bw = "%.1f" % mp["p50_us"], "%.3f" % mp["busbw_gbps"]
            mpi_ratio = "%.2fx" % row["comms_over_mpi_p50"]
        elif mpi_missing:
            mpi_ratio = "n/a (no MPI)"
        rows.append(row)
        md.write("| %s | %d | %d | %.1f | %.1f | %.3f | %d | %s | %s | %s | %s | %s | %s | %s |\n" % (
            c["op"], c["ranks"], c["bytes"], c["p50_us"], c["p99_us"], c["busbw_gbps"], c["wrong"], over,
            native, ratio, mpi_p50, mpi_bw, mpi_ratio, c.get("algorithm", "-")))
json.dump(rows, open(os.path.join(out, "results.json"), "w"), indent=1)
print("wrote", os.path.join(out, "results.md"), "and results.json")
PY
