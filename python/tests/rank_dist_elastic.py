"""One rank of test_dist_elastic.py, under commsrun --keep-going: rank 1 dies
inside a world all_reduce, the survivors recover through comms.dist /
comms.parallel and print one line per check. Sums are of 2**(old world rank)
over a group's members, so each names the membership.
  groups   A = all but the last rank (holds rank 1), B = the last two.
  mp RULE  tp=2 collection; RULE is drop_replicas, callable or none."""
import os
import signal
import sys
import threading
import time

import numpy as np

import comms
from comms import dist, parallel

OLD = -1


def member_sum(group):
    x = np.full(64, float(2 ** OLD), np.float64)
    group.all_reduce(x, op="sum")
    return int(x[0])


def lose(victim):
    w = dist.world()
    if not comms.agree_all(w.comm, True):
        sys.exit(7)
    if OLD == victim:
        threading.Thread(target=lambda: (time.sleep(0.02), os.kill(os.getpid(), signal.SIGKILL)), daemon=True).start()
    x = np.ones(1 << 14, np.float32)
    while True:
        try:
            w.all_reduce(x, op="sum")
        except comms.Error:
            return


def groups():
    n = dist.world().size
    a = dist.new_group(list(range(n - 1)), name="A")
    b = dist.new_group([n - 2, n - 1], name="B")
    b_comm = b.comm if b else None
    for g in (a, b):
        if g:
            member_sum(g)
    lose(1)
    r = dist.recover()
    print("PYRESULT old %d new %d world %d lost %s rebuilt %s kept %s" % (
        OLD, r["rank"], r["world_size"], r["lost"], r["rebuilt"], r["kept"]), flush=True)
    for name, g in (("A", a), ("B", b)):
        if g:
            same = int(g.comm is b_comm) if name == "B" else 0
            print("PYGROUP %d %s ranks %s sum %d same_comm %d" % (OLD, name, g.global_ranks, member_sum(g), same),
                  flush=True)
        else:
            print("PYGROUP %d %s none" % (OLD, name), flush=True)


def mp(rule):
    pgs = parallel.initialize_model_parallel(tp=2)
    member_sum(pgs.tp)
    lose(1)
    if rule == "callable":
        rule = lambda lost, world_size: [x ^ 1 for x in lost]  # the tp partner
    elif rule == "none":
        rule = None
    try:
        r = parallel.recover_model_parallel(pgs, rule)
    except comms.Error as e:
        print("PYREFUSED %d %s %s" % (OLD, e.code, e), flush=True)
        print("PYWORLD %d size %d sum %d" % (OLD, dist.world().size, member_sum(dist.world())), flush=True)
        return
    if r["excluded"]:
        print("PYEXCLUDED %d dropped %s initialized %d" % (OLD, r["dropped"], dist.is_initialized()), flush=True)
        return
    print("PYMP %d new %d world %d dp_size %d tp %s dp %s tp_sum %d dp_sum %d" % (
        OLD, r["rank"], pgs.world_size, pgs.dp_size, pgs.tp.global_ranks, pgs.dp.global_ranks, member_sum(pgs.tp),
        member_sum(pgs.dp)), flush=True)


def main():
    global OLD
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group(device="cpu")
    OLD = dist.world().rank
    if sys.argv[1] == "groups":
        groups()
    else:
        mp(sys.argv[2])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
