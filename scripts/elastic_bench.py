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

    scripts/elastic_bench.py build --grow [--ranks 4 8 16] [--runs 5]

--grow times the way back instead: N-1 ranks run `trainer --elastic
--grow-step 20` (they wait at step 20's boundary, calling comms::admit every
20 ms), and once they are there a newcomer is started with a rank's
environment and COMMS_REPLACEMENT=1, as commsrun --replace does. Its figures:
from its join call to its first collective at N ranks completed (the
admission: the step broadcast over the grown comm), and the state transfer
(step and parameters, and the commit vote); the members' "grown ... joined
in X ms" (from the admit call that took it) is shown beside.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time


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


def environment_of(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        entries = [e.decode() for e in f.read().split(b"\0") if b"=" in e]
    return dict(e.split("=", 1) for e in entries)


def one_grow(build, ranks, backend):
    """(join -> first collective, state transfer, members' admit -> state sent), ms."""
    env = dict(os.environ, COMMS_BACKEND=backend, COMMS_OP_TIMEOUT="20s", COMMS_INIT_TIMEOUT="20s")
    program = [os.path.join(build, "examples", "trainer"), "--elastic", "--steps", "30", "--print-every", "1",
               "--grow-step", "20"]
    job = subprocess.Popen([os.path.join(build, "tools", "commsrun"), "-n", str(ranks - 1), "--timeout", "120",
                            "--"] + program, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = ""
        while "step 19 loss" not in out:  # the members are at step 20's boundary now
            line = job.stdout.readline()
            if not line:
                raise RuntimeError("the members ended early:\n" + out)
            out += line
        time.sleep(0.2)
        with open("/proc/%d/task/%d/children" % (job.pid, job.pid)) as f:
            newcomer_env = environment_of(int(f.read().split()[0]))
        newcomer_env.pop("RANK", None)
        newcomer_env["COMMS_REPLACEMENT"] = "1"
        newcomer = subprocess.run(program, env=newcomer_env, capture_output=True, text=True, timeout=120)
        out += job.stdout.read()
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    joined = re.search(r"first collective ([0-9.]+) ms after calling join .*state transfer ([0-9.]+) ms",
                       newcomer.stdout)
    grown = re.search(r"grown: ranks \[\d+\] joined in ([0-9.]+) ms at step 20, world %d" % ranks, out)
    if job.returncode != 0 or newcomer.returncode != 0 or not (joined and grown):
        raise RuntimeError("run failed (exit %s, newcomer %d):\n%s\n%s" % (job.returncode, newcomer.returncode, out,
                                                                          newcomer.stdout + newcomer.stderr))
    return float(joined.group(1)), float(joined.group(2)), float(grown.group(1))


def spread(values):
    return "%7.1f (%6.1f-%6.1f)" % (statistics.median(values), min(values), max(values))


def main_grow(args):
    print("load average %.2f %.2f %.2f" % os.getloadavg())
    print("%-9s %5s  %-26s %-26s %s" % ("backend", "ranks", "join -> first collective", "state transfer",
                                         "members: admit -> state sent (ms: median, min-max)"))
    for backend in args.backends:
        for ranks in args.ranks:
            runs = [one_grow(args.build, ranks, backend) for _ in range(args.runs)]
            print("%-9s %5d  %s  %s  %s" % (backend, ranks, spread([r[0] for r in runs]),
                                            spread([r[1] for r in runs]), spread([r[2] for r in runs])), flush=True)
    print("load average %.2f %.2f %.2f" % os.getloadavg())
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--backends", nargs="+", default=["cpu:gloo", "cpu:ucx"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--grow", action="store_true", help="time a newcomer's admission instead of a recovery")
    args = ap.parse_args()
    if args.grow:
        return main_grow(args)
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
