#!/usr/bin/env python3
"""Recovery time of elastic training: from a rank's SIGKILL inside an
all_reduce to the first step the survivors complete on the shrunk comm.

    scripts/elastic_bench.py build [--ranks 4 8 16] [--backends cpu:gloo cpu:ucx] [--runs 5]

Each run is `commsrun --keep-going -n N -- trainer --elastic --fail-rank 1
--fail-step 20`. The dying rank prints the wall-clock time just before it
kills itself; the new rank 0 prints it once the redone step (its all_reduce
and commit vote on the shrunk comm) is done. The difference is the figure;
the trainer's own "recovered ... in X ms" (recover() alone) is shown beside.
Prints one line per configuration: median, min, max over the runs, and how
many recoveries lost nobody (an op that timed out without a death).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys


def one_run(build, ranks, backend):
    env = dict(os.environ, COMMS_BACKEND=backend, COMMS_OP_TIMEOUT="20s", COMMS_INIT_TIMEOUT="20s")
    cmd = [os.path.join(build, "tools", "commsrun"), "-n", str(ranks), "--keep-going", "--timeout", "120", "--",
           os.path.join(build, "examples", "trainer"), "--elastic", "--steps", "30", "--print-every", "100",
           "--fail-rank", "1", "--fail-step", "20"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    out = p.stdout + p.stderr
    killed = re.search(r"killing this rank inside the all_reduce \(t=([0-9.]+)\)", out)
    recovered = re.search(r"recovered: lost ranks \[1\] in (\d+) ms", out)
    # The first step done after the kill (a recovery that lost nobody, from
    # an op that timed out, may come before or after it: counted apart).
    done = [float(t) for t in re.findall(r"first step after recovery done \(t=([0-9.]+)\)", out)]
    if p.returncode != 0 or not (killed and done and recovered):
        raise RuntimeError("run failed (exit %d):\n%s" % (p.returncode, out))
    after = [t for t in done if t > float(killed.group(1))]
    spurious = len(re.findall(r"recovered: lost ranks \[\] in", out))
    return (after[0] - float(killed.group(1))) * 1000.0, int(recovered.group(1)), spurious


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--backends", nargs="+", default=["cpu:gloo", "cpu:ucx"])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print("%-9s %5s  %-34s %-36s %s" % ("backend", "ranks", "kill -> first step done, ms", "recover() alone, ms",
                                         "recoveries that lost nobody"))
    for backend in args.backends:
        for ranks in args.ranks:
            totals, recovers, spurious = [], [], 0
            for _ in range(args.runs):
                total, rec, extra = one_run(args.build, ranks, backend)
                totals.append(total)
                recovers.append(rec)
                spurious += extra
            print("%-9s %5d  median %6.0f (min %5.0f, max %5.0f)   median %5.0f (min %4d, max %4d)   %d"
                  % (backend, ranks, statistics.median(totals), min(totals), max(totals),
                     statistics.median(recovers), min(recovers), max(recovers), spurious), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
