"""One rank of the comms.dist / comms.parallel checks (run by test_dist.py
under commsrun, once per COMMS_ROUTE). Writes {check: "ok" | error} to
OUT_DIR/rank<R>.json."""
import json
import os
import sys
import traceback

import numpy as np

import comms
from comms import dist, parallel

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def expect(actual, expected, what):
    if actual != expected:
        raise AssertionError("%s: got %r, expected %r" % (what, actual, expected))


def summed(group, values, dtype=np.float64, op="sum"):
    x = np.asarray(values, dtype)
    group.all_reduce(x, op=op)
    return x.tolist()


@check
def world_group(world):
    n = world.size
    expect(dist.is_initialized(), True, "is_initialized")
    expect(world.global_ranks, list(range(n)), "global_ranks")
    expect(world.route, os.environ.get("COMMS_ROUTE", "direct"), "route")
    expect(world.device, "cpu", "device")
    expect(dist.world().name, world.name, "dist.world()")
    expect(summed(world, [world.rank + 1, 2]), [n * (n + 1) / 2, 2 * n], "world all_reduce")


@check
def new_group_members(world):
    r, n = world.rank, world.size
    ranks = [0, n - 1] if n > 1 else [0]
    g = dist.new_group(ranks, name="ends", description="first and last", timeout=12.5)
    if r not in ranks:
        expect(bool(g), False, "non-member group is falsy")
        return
    expect((g.rank, g.size, g.global_ranks), (ranks.index(r), len(ranks), ranks), "membership")
    spec = g.spec
    expect((spec["name"], spec["description"], spec["ranks"], spec["route"]),
           ("ends", "first and last", ranks, world.route), "spec")
    expect(spec["timeout"].total_seconds(), 12.5, "spec timeout")
    expect(g.comm.op_timeout.total_seconds(), 12.5, "the timeout reached the comm")
    # Group forwards ops to its comm, like Group's -> in C++.
    expect(summed(g, [r * 10 + 1]), [sum(q * 10 + 1 for q in ranks)], "group all_reduce")
    dist.destroy_process_group(g)


@check
def split_group_pairs(world):
    r, n = world.rank, world.size
    pairs = [[q, q + 1] for q in range(0, n - 1, 2)] or [[0]]
    g = dist.split_group(world, pairs, name="pairs")
    mine = next(p for p in pairs if r in p)
    expect(g.global_ranks, mine, "split_group ranks")
    expect(summed(g, [r + 1], np.int64, "max"), [max(mine) + 1], "pair max")


@check
def offload_reload_cycles(world):
    r, n = world.rank, world.size
    g = dist.new_group(list(range(n)), name="cycled", options={"gloo": {"busy_poll": False}})
    before = (world.describe(), g.describe(), g.spec)
    first = summed(g, [r + 0.25, -r])
    for cycle in range(3):
        report = dist.offload_groups(["cpu"])
        if report["groups_offloaded"] < 2 or "cycled" not in report["groups"]:
            raise AssertionError("cycle %d offload report %r" % (cycle, report))
        expect(g.comm.backend_state("cpu"), "offloaded", "state after offload")
        try:
            summed(g, [1.0])
            raise AssertionError("an op on an offloaded group ran")
        except comms.Error as e:
            if "offload" not in str(e):
                raise AssertionError("offloaded op error does not say so: %s" % e)
        reloaded = dist.reload_groups()
        expect(reloaded["groups_reloaded"], report["groups_offloaded"], "groups reloaded")
        expect(summed(g, [r + 0.25, -r]), first, "results after cycle %d" % cycle)
        expect((world.describe(), g.describe(), g.spec), before, "describe() and spec after cycle %d" % cycle)
    expect(g.spec["options"]["gloo"], {"busy_poll": False}, "typed options kept")


@check
def comm_level_offload(world):
    c = world.comm
    for cycle in range(3):
        expect(c.offload_backend("cpu"), True, "offload_backend")
        expect(c.offload_backend("cpu"), False, "second offload does no work")
        expect(c.reload_backend("cpu"), True, "reload_backend")
        expect(summed(c, [cycle + world.rank]), [sum(cycle + q for q in range(world.size))], "after reload")


@check
def megatron_rank_generator(world):
    gen = parallel.RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp-pp")
    expect(gen.world_size, 8, "world size")
    expect(gen.get_ranks("tp"), [[0, 1], [2, 3], [4, 5], [6, 7]], "tp")
    expect(gen.get_ranks("dp"), [[0, 2], [1, 3], [4, 6], [5, 7]], "dp")
    expect(gen.get_ranks("pp"), [[0, 4], [1, 5], [2, 6], [3, 7]], "pp")
    expect(gen.get_ranks("tp-pp"), [[0, 1, 4, 5], [2, 3, 6, 7]], "tp-pp (model parallel)")
    try:
        parallel.RankGenerator(tp=3, ep=1, dp=1, pp=1, cp=1, order="dp-pp")
        raise AssertionError("an order without tp=3 was accepted")
    except comms.Error as e:
        expect(e.code, "invalid_argument", "bad order code")


@check
def parallel_collection(world):
    r, n = world.rank, world.size
    layout = {1: "tp=1", 2: "tp=2,order=tp-dp", 4: "tp=2,pp=2,order=tp-pp-dp"}[n]
    pgs = parallel.initialize_model_parallel(layout, name="pyc", create_all_gather_groups=True)
    config, _, _ = parallel.parse_parallel_flags(layout)
    gen = parallel.RankGenerator(tp=config.tp, ep=1, dp=n // (config.tp * config.pp), pp=config.pp, cp=1,
                                 order=config.order)
    for axis in ("tp", "pp", "dp"):
        mine = next(lst for lst in gen.get_ranks(axis) if r in lst)
        expect(pgs.get(axis).global_ranks, mine, axis + " group")
        expect(pgs.rank_lists(axis), gen.get_ranks(axis), axis + " rank lists")
    expect(pgs.tp.global_ranks, pgs.get("tp").global_ranks, "attribute access")
    expect(pgs.has("dp_cp_ag"), True, "all-gather group asked for")
    expect(pgs.has("dp_gloo"), False, "gloo groups not asked for")
    dp = pgs.dp
    expect(summed(dp, [r], op="avg"), [sum(dp.global_ranks) / dp.size], "dp avg")
    expect(pgs.prefix, "pyc", "prefix")


def main():
    out_dir = sys.argv[1]
    world = dist.init_process_group(device="cpu", timeout=20.0)
    rank = world.rank
    results = {}
    for fn in CHECKS:
        try:
            fn(world)
            results[fn.__name__] = "ok"
        except Exception:
            results[fn.__name__] = traceback.format_exc()
    dist.destroy_process_group()
    results["destroyed"] = "ok" if not dist.is_initialized() else "still initialized after destroy"
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
