#!/usr/bin/env python3
"""How long a comm takes to make and to release: split of the whole world
(every rank connects its backend eagerly), then finalize, timed on rank 0.

    scripts/comm_creation_bench.py build [--ranks 2 4 8] [--backends cpu:gloo cpu:ucx] [--splits 10]

Each configuration is one `commsrun -n N` job that makes and finalizes
--splits comms in a row. Prints one line per configuration: median, min and
max of both, in ms. Megatron makes tens of groups per initialize, and RL
frameworks make them again at every reload, so this is paid per group.
"""
import argparse
import os
import subprocess
import sys
import time

RANK_CODE = r"""
import os, sys, time
import comms
world = comms.new_comm(device="cpu", name="world", backend=sys.argv[1])
made, released = [], []
for i in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    c = world.split(list(range(world.size)), name="s%d" % i)
    t1 = time.perf_counter()
    c.finalize()
    made.append((t1 - t0) * 1e3)
    released.append((time.perf_counter() - t1) * 1e3)
if world.rank == 0:
    print("TIMES", " ".join("%.3f" % t for t in made), "|", " ".join("%.3f" % t for t in released), flush=True)
world.finalize()
"""


def summary(values):
    values = sorted(values)
    return "%7.1f %7.1f %7.1f" % (values[len(values) // 2], values[0], values[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--backends", nargs="+", default=["cpu:gloo", "cpu:ucx"])
    ap.add_argument("--splits", type=int, default=10)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(args.build), "python"))
    print("%-10s %5s   %-23s   %-23s" % ("backend", "ranks", "split ms: p50 min max", "finalize ms: p50 min max"))
    for backend in args.backends:
        for n in args.ranks:
            cmd = [os.path.join(args.build, "tools", "commsrun"), "-n", str(n), "--timeout", "120", "--",
                   sys.executable, "-c", RANK_CODE, backend, str(args.splits)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
            line = next((l for l in p.stdout.splitlines() if "TIMES" in l), None)
            if p.returncode != 0 or line is None:
                print("%-10s %5d   failed (exit %d): %s" % (backend, n, p.returncode, p.stderr[-500:]))
                continue
            made, released = line.split("TIMES", 1)[1].split("|")
            print("%-10s %5d   %-23s   %-23s" % (backend, n, summary(map(float, made.split())),
                                                 summary(map(float, released.split()))))
            time.sleep(0.2)


if __name__ == "__main__":
    main()
