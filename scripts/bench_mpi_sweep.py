#!/usr/bin/python3
"""tools/dev bench-mpi: comms against Open MPI at every size, one command.

For each world size, op and size (8 B, then powers of 4 from 16 B to
64 MiB), comms-bench and Open MPI's own collective (build/tools/mpi-bench)
run back to back, one process launch each, --runs times, alternating which
goes first; each side's p50 (of the per-iteration maximum over ranks) is the
median over runs, and the row's ratio is comms/MPI. Iterations scale down
with size so the whole sweep stays short. Writes OUT/sweep.json (every run's
p50, the medians, the ratio, the load average before and after) and
OUT/sweep.md (the table), and prints the table.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"]
SIZE_IS_TOTAL = {"all_gather", "reduce_scatter"}  # nccl-tests' convention: the whole buffer
ELEMENT = 4  # float32


def default_sizes():
    return [8] + [4 ** k for k in range(2, 14)]  # 8, 16, 64, ..., 64 MiB


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)


def unit_bytes(op, ranks):
    return ELEMENT * ranks if op in SIZE_IS_TOTAL else ELEMENT


def row_bytes(op, ranks, size):
    """The size rounded to whole units (at least one), as both benches count it."""
    u = unit_bytes(op, ranks)
    return max(u, size // u * u)


def iterations(size, most, budget):
    return max(10, min(most, budget // max(size, 1)))


def run_json(cmds, timeout):
    """Runs one bench launch writing --json to a temp file; returns its one row.
    `cmds` is one command, or several started together (one per host, the
    first of which writes the row). They share one process group in this
    script's session, which a timeout or a failure kills whole. One session,
    as mpirun's ranks and daemons share mpirun's: the kernel's autogroups
    give each session its share of the cores, and ranks split over sessions
    woke each other about 250 us late (8 B all_reduce over two simulated
    hosts: 255 us against 37 in one session)."""
    if cmds and isinstance(cmds[0], str):
        cmds = [cmds]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    procs = []
    try:
        for cmd in cmds:
            procs.append(subprocess.Popen(cmd + ["--json", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, process_group=procs[0].pid if procs else 0))
        deadline = time.monotonic() + timeout
        outputs = []
        for cmd, p in zip(cmds, procs):
            try:
                out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError("%s ran past %d s" % (" ".join(cmd), timeout))
            outputs.append(out)
            if p.returncode != 0:
                raise RuntimeError("%s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode, out[-2000:]))
        text = "\n".join(o[-2000:] for o in outputs)
        rows = json.load(open(path))
        if not rows:
            raise RuntimeError("%s wrote no row:\n%s" % (" ".join(cmds[0]), text))
        if rows[0].get("wrong", 0):
            raise RuntimeError("%s: %d wrong results" % (" ".join(cmds[0]), rows[0]["wrong"]))
        return rows[0]
    finally:
        if procs and any(p.poll() is None for p in procs):
            try:
                os.killpg(procs[0].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait()
        os.unlink(path)


def binding(args, ranks):
    """mpirun binds each rank to a core when the ranks fit the cores (and to
    none when they outnumber them); commsrun binds nothing, so the comms side
    gets the same with taskset, else the scheduler may put two ranks on one
    core (8 B all_reduce at 2 ranks: ~1 µs bound, ~10 µs sharing a core)."""
    cores = len(os.sched_getaffinity(0))
    if args.no_bind or ranks > cores:
        return []
    return ["sh", "-c", 'exec taskset -c "$((LOCAL_RANK %% %d))" "$@"' % cores, "bind"]


def commands(args, op, ranks, size, iters):
    warm = max(2, iters // 10)
    common = ["--minbytes", str(size), "--maxbytes", str(size), "--iters", str(iters), "--warmup", str(warm)]
    comms = [os.path.join(args.build, "tools", "commsrun"), "-n", str(ranks), "--timeout", str(args.timeout), "--"]
    comms += binding(args, ranks) + [os.path.join(args.build, "tools", "comms-bench"), "-C", op, "--outofplace",
                                     "--check", "1", "--backend", args.backend] + common
    mpi = ["mpirun", "--oversubscribe", "-np", str(ranks)]
    if os.geteuid() == 0:
        mpi.append("--allow-run-as-root")
    mpi += [os.path.join(args.build, "tools", "mpi-bench"), "--op", op] + common
    return {"comms": comms, "mpi": mpi}


def alternate(cmds, runs, timeout):
    """Launches each side's command `runs` times, alternating which side goes
    first; returns each side's p50s and comms' algorithm."""
    sides = list(cmds)
    p50s = {side: [] for side in sides}
    algorithm = ""
    for run in range(runs):
        for side in (sides if run % 2 == 0 else sides[::-1]):
            r = run_json(cmds[side], timeout)
            p50s[side].append(r["p50_us"])
            if side == "comms":
                algorithm = r.get("algorithm", "")
    return p50s, algorithm


def row(op, ranks, size, iters, p50s, algorithm, peer="mpi"):
    """One table row: each side's median p50 over runs and comms/peer."""
    c, m = statistics.median(p50s["comms"]), statistics.median(p50s[peer])
    return {"op": op, "ranks": ranks, "bytes": 0 if op == "barrier" else size, "iters": iters,
            "comms_p50_us": c, peer + "_p50_us": m, "ratio": c / m if m > 0 else None,
            "comms_runs_us": p50s["comms"], peer + "_runs_us": p50s[peer], "algorithm": algorithm}


def measure(args, op, ranks, size):
    iters = iterations(size, args.iters, args.budget_bytes)
    p50s, algorithm = alternate(commands(args, op, ranks, size, iters), args.runs, args.timeout + 30)
    return row(op, ranks, size, iters, p50s, algorithm)


def table(rows, peer="mpi", peer_name="Open MPI"):
    lines = ["| op | ranks | bytes | comms p50 µs | %s p50 µs | comms/peer | comms runs (min-max) | "
             "peer runs (min-max) | algorithm |" % peer_name, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "%.2f" % r["ratio"] if r["ratio"] is not None else "n/a"
        lines.append("| %s | %d | %d | %.2f | %.2f | %s%s | %.2f-%.2f | %.2f-%.2f | %s |" % (
            r["op"], r["ranks"], r["bytes"], r["comms_p50_us"], r[peer + "_p50_us"], ratio,
            " (over)" if r["ratio"] is not None and r["ratio"] > 1.0 else "", min(r["comms_runs_us"]),
            max(r["comms_runs_us"]), min(r[peer + "_runs_us"]), max(r[peer + "_runs_us"]), r["algorithm"]))
    return "\n".join(lines) + "\n"


def sweep_sizes(op, ranks, sizes):
    """The row sizes of one op: each size rounded to whole units, once each
    (barrier: one row of 0 bytes)."""
    if op == "barrier":
        return [0]
    out = []
    for size in sizes:
        b = row_bytes(op, ranks, size)
        if b not in out:
            out.append(b)
    return out


def print_row(r, peer="mpi", peer_name="MPI"):
    print("%-14s n=%d %10d B  comms %10.2f µs  %s %10.2f µs  ratio %s" % (
        r["op"], r["ranks"], r["bytes"], r["comms_p50_us"], peer_name, r[peer + "_p50_us"],
        "%.2f" % r["ratio"] if r["ratio"] is not None else "n/a"), flush=True)


def add_common_args(ap):
    """The arguments every comparison sweep takes."""
    ap.add_argument("--build", default=os.environ.get("COMMS_BUILD_DIR", "build"))
    ap.add_argument("--runs", type=int, default=5, help="launches per side and row; medians over them")
    ap.add_argument("--sizes", help="comma-separated sizes (K, M suffixes); default 8 B, then 4^k 16 B..64 MiB")
    ap.add_argument("--iters", type=int, default=1000, help="timed iterations at the smallest sizes")
    ap.add_argument("--budget-bytes", type=int, default=1 << 28,
                    help="iterations = budget / size, between 10 and --iters")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per launch")


def write_results(out, result, note, md):
    os.makedirs(out, exist_ok=True)
    json.dump(result, open(os.path.join(out, "sweep.json"), "w"), indent=1)
    open(os.path.join(out, "sweep.md"), "w").write(note + md)
    print("\n" + note + md + "wrote %s and %s" % (os.path.join(out, "sweep.json"), os.path.join(out, "sweep.md")))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--out", help="output folder (default BUILD/bench-mpi)")
    ap.add_argument("--backend", default=os.environ.get("COMMS_BACKEND") or "cpu:ucx")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--no-bind", action="store_true",
                    help="do not bind comms' ranks to cores (mpirun binds them when they fit the cores)")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    for tool in ("commsrun", "comms-bench", "mpi-bench"):
        if not os.access(os.path.join(args.build, "tools", tool), os.X_OK):
            sys.exit("bench-mpi: %s/tools/%s is missing (mpi-bench needs an MPI for C: tools/dev installs "
                     "libopenmpi-dev)" % (args.build, tool))
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else default_sizes()
    load_before = os.getloadavg()
    rows = []
    for ranks in [int(n) for n in args.ranks.split(",")]:
        for op in args.ops.split(","):
            if op not in OPS:
                ap.error("unknown op '%s' (ops: %s)" % (op, ", ".join(OPS)))
            for b in sweep_sizes(op, ranks, sizes):
                rows.append(measure(args, op, ranks, b))
                print_row(rows[-1])
    result = {"backend": args.backend, "runs": args.runs, "bound": not args.no_bind, "loadavg_before": load_before,
              "loadavg_after": os.getloadavg(), "rows": rows}
    note = ("backend %s, median of %d alternating runs per side, comms' ranks %s; load average %.2f before, "
            "%.2f after\n\n") % (args.backend, args.runs, "not bound" if args.no_bind else "bound as mpirun's",
                                   load_before[0], result["loadavg_after"][0])
    write_results(args.out or os.path.join(args.build, "bench-mpi"), result, note, table(rows))


if __name__ == "__main__":
    main()
