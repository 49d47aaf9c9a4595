#!/usr/bin/python3
"""tools/dev bench-steady: is the small all_reduce steady from launch to launch?

Launches comms-bench --launches times in a row (2 ranks, all_reduce of 8 B
and 4 KiB, out of place, --iters timed iterations each, the per-iteration
maximum over ranks as comms-bench reports it). For each size it checks:
  - no launch's p50 is over --max-launch-ratio (2) times the median launch's,
    nor under the median over that ratio (when most launches run in a slow
    mode, the median is slow and the launches that escaped it are fast);
  - within each launch, p99/p50 is at most --max-tail-ratio (3).
Prints one table per size (every launch's p50, p99 and p99/p50, the failing
cells marked, and the launch's floor: the same op by threads of one process,
comms-bench --floor, with its own p99/p50, so that a slow launch or a long
tail that the floor shares points below comms, at the machine), writes OUT/steady.json (every launch, the load average
before and after each), and exits 1 when a check fails. A benchmark, not a
test: the verdict depends on the machine and what else runs on it.

Before each launch, comms-noise (--noise-seconds) measures how often the
machine takes a core away and for how long (the rate comes and goes from
minute to minute on a shared host). A rank that loses its core mid-op holds
up its peers too, so a gap hits about
  sum over the ranks' cores of (gaps per second) x (the op's p50)
of a launch's iterations (the table's "gap hit%"). Where that share is 1%
or more, the launch's p99 lies among the hit iterations, and a long tail
there is marked "(machine)": the machine's, not comms'.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_mpi_sweep import binding

SIZES = (8, 4096)
# A p99 is the machine's when at least this share of iterations meets a gap.
MACHINE_TAIL_SHARE = 0.01


def machine_noise(args):
    """comms-noise's result for this machine's cores (None with --noise-seconds 0)."""
    if args.noise_seconds <= 0:
        return None
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [os.path.join(args.build, "tools", "comms-noise"), "--seconds", str(args.noise_seconds), "--json", path]
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=args.noise_seconds + 30)
        return json.load(open(path))
    finally:
        os.unlink(path)


def gap_share(args, noise, p50_us):
    """The share of iterations of this p50 a machine gap falls in, on the ranks' cores."""
    if not noise:
        return None
    rates = [c["gaps_per_second"] for c in noise["cores"]]
    if binding(args, args.ranks):  # rank r on the r-th core (mod cores)
        per_rank = [rates[r % len(rates)] for r in range(args.ranks)]
    else:
        per_rank = [sum(rates) / len(rates)] * args.ranks
    return min(1.0, sum(per_rank) * p50_us * 1e-6)


def noise_line(noises):
    """The launches' probes summed up in one line."""
    noises = [n for n in noises if n]
    if not noises:
        return None
    cores = [c for n in noises for c in n["cores"]]
    rate = sum(c["gaps_per_second"] for c in cores) / len(cores)
    lost = sum(c["lost_fraction"] for c in cores) / len(cores)
    irq = [c.get("kernel_interrupts_per_second") for c in cores]
    buckets = {}
    for c in cores:
        for k, v in c["gaps_by_length"].items():
            buckets[k] = buckets.get(k, 0) + v
    common = max(buckets, key=buckets.get) if buckets else "-"
    rates = [sum(c["gaps_per_second"] for c in n["cores"]) / len(n["cores"]) for n in noises]
    return ("machine (comms-noise, %g s before each launch): each core lost %.0f gaps/s over %d ns (%.0f-%.0f by "
            "launch), %.1f%% of its time, most of them %s; the kernel counted %s interrupts/s" % (
                noises[0]["seconds"], rate, noises[0]["threshold_ns"], min(rates), max(rates), 100 * lost, common,
                "%.0f" % (sum(irq) / len(irq)) if None not in irq else "-"))


def launch(args):
    """One comms-bench launch with both rows; returns {size: row}."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [os.path.join(args.build, "tools", "commsrun"), "-n", str(args.ranks), "--timeout", str(args.timeout), "--"]
    cmd += binding(args, args.ranks) + [
        os.path.join(args.build, "tools", "comms-bench"), "-C", "all_reduce", "--outofplace", "--backend",
        args.backend, "-b", str(SIZES[0]), "-e", str(SIZES[1]), "-f", str(SIZES[1] // SIZES[0]), "-n",
        str(args.iters), "-w", str(args.warmup), "-c", "1", "--floor", "--json", path]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout + 30)
        if p.returncode != 0:
            raise RuntimeError("%s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode, p.stdout[-2000:]))
        rows = {r["bytes"]: r for r in json.load(open(path))}
    finally:
        os.unlink(path)
    missing = [s for s in SIZES if s not in rows]
    if missing:
        raise RuntimeError("%s wrote no row for %s bytes" % (" ".join(cmd), missing))
    wrong = sum(rows[s]["wrong"] for s in SIZES)
    if wrong:
        raise RuntimeError("%s: %d wrong results" % (" ".join(cmd), wrong))
    return rows


def verdict(args, launches, size):
    """The size's table lines and whether both checks pass."""
    p50s = [l["rows"][size]["p50_us"] for l in launches]
    median = statistics.median(p50s)
    ok = True
    tails, machine_tails = 0, 0
    lines = ["all_reduce %d B, %d launches: median launch p50 %.2f us; checks: p50 within %.1fx of the median, "
             "p99/p50 <= %.1f" % (size, len(launches), median, args.max_launch_ratio, args.max_tail_ratio),
             "%7s %10s %10s %9s %9s %10s %8s %12s %9s %8s  %s" % (
                 "launch", "p50(us)", "p99(us)", "p99/p50", "p50/med", "floor(us)", "x floor", "floor p99/50",
                 "gap hit%", "load1", "")]
    for i, l in enumerate(launches):
        r = l["rows"][size]
        tail = r["p99_us"] / r["p50_us"] if r["p50_us"] > 0 else float("inf")
        rel = r["p50_us"] / median if median > 0 else float("inf")
        bad = []
        if rel > args.max_launch_ratio:
            bad.append("SLOW LAUNCH")
        if rel * args.max_launch_ratio < 1:
            bad.append("FAST LAUNCH")
        share = gap_share(args, l.get("noise"), r["p50_us"])
        machine = share is not None and share >= MACHINE_TAIL_SHARE
        if tail > args.max_tail_ratio:
            bad.append("LONG TAIL (machine)" if machine else "LONG TAIL")
            tails += 1
            machine_tails += machine
        ok = ok and not bad
        lines.append("%7d %10.2f %10.2f %9.2f %9.2f %10.2f %8.2f %12.2f %9s %8.2f  %s" % (
            i + 1, r["p50_us"], r["p99_us"], tail, rel, r["floor_us"], r["floor_ratio"],
            r["floor_p99_us"] / r["floor_us"], "-" if share is None else "%.2f" % (100 * share),
            l["load_before"][0], " ".join(bad)))
    lines.append("%s: p50 %.2f-%.2f us over launches" % ("PASS" if ok else "FAIL", min(p50s), max(p50s)))
    if tails:
        lines.append("%d launches with a long tail, %d of them where the machine's gaps reach %.0f%% of the "
                     "iterations" % (tails, machine_tails, 100 * MACHINE_TAIL_SHARE))
    return lines, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.environ.get("COMMS_BUILD_DIR", "build"))
    ap.add_argument("--out", help="output folder (default BUILD/bench-steady)")
    ap.add_argument("--backend", default=os.environ.get("COMMS_BACKEND") or "cpu:ucx")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--iters", type=int, default=1000, help="timed iterations per row")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--max-launch-ratio", type=float, default=2.0)
    ap.add_argument("--max-tail-ratio", type=float, default=3.0)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per launch")
    ap.add_argument("--noise-seconds", type=float, default=0.5,
                    help="how long comms-noise probes the cores before each launch (0: not at all)")
    ap.add_argument("--no-bind", action="store_true",
                    help="do not bind the ranks to cores (by default each rank gets its own core when they fit, "
                         "as bench-mpi does)")
    args = ap.parse_args()
    if args.launches < 2 or args.iters < 1:
        ap.error("--launches must be at least 2 and --iters at least 1")
    out = args.out or os.path.join(args.build, "bench-steady")
    os.makedirs(out, exist_ok=True)
    launches = []
    for i in range(args.launches):
        noise = machine_noise(args)
        before = os.getloadavg()
        rows = launch(args)
        launches.append({"load_before": before, "load_after": os.getloadavg(), "rows": rows, "noise": noise})
        print("launch %2d: %s" % (i + 1, "  ".join("%d B p50 %.2f p99 %.2f floor %.2f us" % (
            s, rows[s]["p50_us"], rows[s]["p99_us"], rows[s]["floor_us"]) for s in SIZES)), flush=True)
    ok = True
    report = ["backend %s, %d ranks %s, %d iterations (%d warm-up) per row" % (
        args.backend, args.ranks, "not bound" if args.no_bind else "each bound to its own core when they fit",
        args.iters, args.warmup)]
    machine = noise_line([l["noise"] for l in launches])
    if machine:
        report.append(machine)
    for size in SIZES:
        lines, size_ok = verdict(args, launches, size)
        ok = ok and size_ok
        report += [""] + lines
    print("\n" + "\n".join(report))
    result = {"backend": args.backend, "ranks": args.ranks, "bound": not args.no_bind, "iters": args.iters,
              "warmup": args.warmup, "max_launch_ratio": args.max_launch_ratio,
              "max_tail_ratio": args.max_tail_ratio, "pass": ok,
              "launches": [{"load_before": l["load_before"], "load_after": l["load_after"],
                            "machine_noise": l["noise"], "rows": {str(s): l["rows"][s] for s in SIZES}}
                           for l in launches]}
    json.dump(result, open(os.path.join(out, "steady.json"), "w"), indent=1)
    print("wrote %s" % os.path.join(out, "steady.json"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
