"""One process of test_dist_grow.py under commsrun --keep-going: 4 ranks with
a collection tp=1 ("mp", so dp is the world) and a group A = [1, 3]. Rank 3
dies inside a world all_reduce; the survivors recover (dp shrinks to 3);
new rank 0 starts this script again as the replacement ("newcomer"), which
calls comms.dist.join_process_group(); the members call
comms.parallel.admit_model_parallel at every step until the world grew.
Every rank of the grown world prints one line. Sums are of 2**(world rank)
over a group's members, so each names the membership."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

import comms
from comms import dist, parallel


def member_sum(group):
    x = np.full(64, float(2 ** dist.world().rank), np.float64)
    group.all_reduce(x, op="sum")
    return int(x[0])


def lose(victim):
    w = dist.world()
    if not comms.agree_all(w.comm, True):
        sys.exit(7)
    if w.rank == victim:
        threading.Thread(target=lambda: (time.sleep(0.02), os.kill(os.getpid(), signal.SIGKILL)), daemon=True).start()
    x = np.ones(1 << 14, np.float32)
    while True:
        try:
            w.all_reduce(x, op="sum")
        except comms.Error:
            return


def report(pgs, admission, newcomer, a=None):
    made = dist.new_group([1, 3])
    # One write: the newcomer shares rank 0's stdout.
    os.write(1, ("PYGROWN rank %d newcomer %d joined %s world %s %d dp %s %d A %s new %s\n" % (
        dist.world().rank, newcomer, admission["joined"], dist.world().global_ranks, member_sum(dist.world()),
        pgs.dp.global_ranks, member_sum(pgs.dp), "%s %d" % (a.global_ranks, member_sum(a)) if a else "none",
        member_sum(made) if made else "none")).encode())
    idle = dist.admit()
    os.write(1, ("PYIDLE rank %d grown %d world %d\n" % (dist.world().rank, idle["grown"], dist.world().size)).encode())
    dist.destroy_process_group()


def member():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group(device="cpu")
    a = dist.new_group([1, 3], name="A")
    pgs = parallel.initialize_model_parallel(tp=1, name="mp")
    member_sum(pgs.dp)
    lose(3)
    r = parallel.recover_model_parallel(pgs)
    child = None
    if r["rank"] == 0:
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "newcomer"])
    steps = 0
    admission = {"grown": False}
    while not admission["grown"]:  # every member sees the same decision at the same call
        member_sum(pgs.dp)
        time.sleep(0.05)
        admission = parallel.admit_model_parallel(pgs)
        steps += 1
        if steps > 600:
            sys.exit(5)
    report(pgs, admission, 0, a)
    if child is not None and child.wait(timeout=60) != 0:
        sys.exit(6)


def newcomer():
    r = dist.join_process_group(timeout=60.0)
    report(r["collection"], r, 1)


if __name__ == "__main__":
    newcomer() if sys.argv[1:] == ["newcomer"] else member()
