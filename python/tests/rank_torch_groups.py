"""One rank of the torch group checks of backend "comms": new_group subsets
(on the COMMS_ROUTE the test sets), options reaching the comm, timeouts,
destroy_process_group of one group, offload/reload, bad input then a good op.
Run by test_torch.py under commsrun at 4 ranks. Writes {check: "ok" | error}
to OUT_DIR/rank<R>.json."""
import datetime
import json
import os

import torch
import torch.distributed as dist

import comms.torch
import torch_rank
from torch_rank import expect

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def summed(values, group=None):
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return t.tolist()


def raises(fn, words, what):
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        for w in words:
            if w not in str(e):
                raise AssertionError("%s: the error does not say %r: %s" % (what, w, e))
        return e
    raise AssertionError("%s did not raise" % what)


@check
def the_world_binds_eagerly_exactly_when_asked(rank, size):
    # First check: no op has run yet. device_id= (or COMMS_ROUTE=split, which
    # binds the world) connects before init_process_group returns; otherwise
    # the backend connects on the first op.
    bound = bool(os.environ.get("TORCH_DEVICE_ID")) or os.environ.get("COMMS_ROUTE") == "split"
    state = comms.torch._backend_of(dist.group.WORLD).backend_state("cpu")
    expect(state, "ready" if bound else "lazy", "the world's cpu backend right after init_process_group")
    expect(str(dist.group.WORLD.bound_device_id) if bound else None,
           "cpu:0" if bound else None, "the world's bound device")


@check
def new_group_subsets(rank, size):
    ends = dist.new_group([0, size - 1])
    tail = dist.new_group(list(range(1, size)))
    if rank in (0, size - 1):
        expect((dist.get_rank(ends), dist.get_world_size(ends)), ([0, size - 1].index(rank), 2), "ends membership")
        expect(summed([rank + 1], ends), [size + 1], "ends all_reduce")
    else:
        expect(ends, dist.GroupMember.NON_GROUP_MEMBER, "non-member of ends")
    if rank >= 1:
        expect(dist.get_rank(tail), rank - 1, "tail group rank")
        expect(summed([rank], tail), [sum(range(1, size))], "tail all_reduce")
        t = torch.full((3,), float(rank))
        dist.broadcast(t, src=size - 1, group=tail)  # a global rank, as torch takes it
        expect(t.tolist(), [size - 1.0] * 3, "tail broadcast from global rank %d" % (size - 1))
    expect(summed([1]), [size], "world after the subsets")


def has_lazy_nccl():
    """The direct-route job's COMMS_BACKEND has a lazy cuda:nccl backend,
    whose configuration is visible without a device (a split needs a bound
    parent, so the split-route job runs on cpu:gloo alone)."""
    return "cuda" in json.loads(comms.torch.describe())["backends"]


@check
def options_reach_the_comm(rank, size):
    nccl_knobs = dict(is_high_priority_stream=True, max_ctas=8, cga_cluster_size=2, min_ctas=1)
    opts = comms.torch.Options(timeout=17.5, busy_poll=False, **(nccl_knobs if has_lazy_nccl() else {}))
    g = dist.new_group(list(range(size)), pg_options=opts)
    described = json.loads(comms.torch.describe(g))
    if has_lazy_nccl():
        nccl = described["backends"]["cuda"]["config"]
        expect({k: nccl["nccl_config"][k] for k in ("max_ctas", "cga_cluster_size", "min_ctas")},
               {"max_ctas": 8, "cga_cluster_size": 2, "min_ctas": 1}, "NCCL config in describe()")
        expect(nccl["stream_priority"]["class"], "high", "is_high_priority_stream in describe()")
    expect(described["backends"]["cpu"]["config"]["busy_poll_enabled"], False, "busy_poll in describe()")
    expect(described["op_timeout_ms"], 17500, "the option's timeout in describe()")
    expect(summed([2], g), [2 * size], "all_reduce on the group with options")
    dist.destroy_process_group(g)


@check
def bad_options_raise_value_error_naming_them(rank, size):
    raises(lambda: comms.torch.Options(max_ctass=3), ["max_ctass"], "unknown option")
    raises(lambda: comms.torch.Options(max_ctas="3"), ["max_ctas"], "bad value")
    raises(lambda: comms.torch.Options(timeout=-1), ["timeout"], "negative timeout")
    raises(lambda: dist.new_group(list(range(size)), pg_options=comms.torch.Options(hints={"no_such_hint": "1"})),
           ["no_such_hint"], "an unknown hint")
    expect(summed([1]), [size], "world after the refused group")


@check
def destroy_finalizes_exactly_that_group(rank, size):
    a = dist.new_group(list(range(size)))
    b = dist.new_group(list(range(size)))
    backend_a = comms.torch._backend_of(a)
    dist.destroy_process_group(a)
    expect(backend_a.is_finalized, True, "the destroyed group's comm is finalized")
    expect(comms.torch._backend_of(b).is_finalized, False, "the other group's comm is live")
    expect(summed([3], b), [3 * size], "all_reduce on the group left")
    expect(summed([1]), [size], "all_reduce on the world")
    dist.destroy_process_group(b)


@check
def destroy_unreferenced_groups_keeps_exactly_the_held_ones(rank, size):
    comms.torch.destroy_unreferenced_groups()  # what earlier checks left
    kept = dist.new_group(list(range(size)))
    dropped = dist.new_group(list(range(size)))
    in_cycle = dist.new_group(list(range(size)))
    backends = {"kept": comms.torch._backend_of(kept), "dropped": comms.torch._backend_of(dropped),
                "in_cycle": comms.torch._backend_of(in_cycle)}
    node = {"group": in_cycle}
    node["self"] = node  # only a collection finds this group unreferenced
    del dropped, in_cycle, node
    expect(comms.torch.destroy_unreferenced_groups(), 2, "groups destroyed: the dropped one and the one in a cycle")
    expect({name: b.is_finalized for name, b in backends.items()},
           {"kept": False, "dropped": True, "in_cycle": True}, "which comms were finalized")
    expect(summed([2], kept), [2 * size], "all_reduce on the kept group")
    expect(comms.torch.destroy_unreferenced_groups(), 0, "a second call, with only a held group")
    dist.destroy_process_group(kept)
    expect(comms.torch.destroy_unreferenced_groups(), 0, "a call with no group but the world")


@check
def offload_reload_keeps_every_option(rank, size):
    opts = comms.torch.Options(timeout=23, busy_poll=False, **({"max_ctas": 4} if has_lazy_nccl() else {}))
    g = dist.new_group(list(range(size)), pg_options=opts)
    expect(summed([1], g), [size], "before offload")
    before = comms.torch.describe(g)
    released = comms.torch.offload_groups(["cpu"])
    if released < 2:
        raise AssertionError("offload released %d backends, expected the world's and the group's" % released)
    expect(comms.torch._backend_of(g).backend_state("cpu"), "offloaded", "state after offload")
    raises(lambda: dist.all_reduce(torch.ones(1), group=g), ["offload"], "an op on an offloaded group")
    expect(comms.torch.reload_groups(["cpu"]), released, "reloaded as many as released")
    expect(comms.torch.describe(g), before, "describe() after reload")
    expect(summed([rank], g), [sum(range(size))], "right after reload")
    expect(summed([1]), [size], "world after reload")
    dist.destroy_process_group(g)


@check
def group_timeout_is_honoured(rank, size):
    g = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=2))
    expect(json.loads(comms.torch.describe(g)).get("op_timeout_ms"), 2000, "the group's op timeout")
    if size > 1:
        t = torch.ones(4)
        if rank == 0:
            e = raises(lambda: dist.all_reduce(t, group=g), ["timeout"], "an all_reduce rank 0 alone enters")
            if "all_reduce" not in str(e):
                raise AssertionError("the timeout does not name the op: %s" % e)
    dist.barrier()


@check
def bad_input_raises_before_sending(rank, size):
    raises(lambda: dist.all_reduce(torch.ones(4, 4).t()), ["contiguous"], "a non-contiguous tensor")
    raises(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), ["all_reduce", "int16"], "an int16 reduction")
    raises(lambda: dist.all_gather([torch.zeros(2)] * size, torch.zeros(3)), ["elements"], "mismatched sizes")
    raises(lambda: dist.all_gather([torch.zeros(2, dtype=torch.int32)] * size, torch.zeros(2)), ["dtype"],
           "mismatched dtypes")
    raises(lambda: dist.all_to_all_single(torch.zeros(size + 1), torch.zeros(size + 1),
                                          output_split_sizes=[1] * size, input_split_sizes=[1] * size),
           ["split"], "split sizes that do not add up")
    expect(summed([rank + 1]), [size * (size + 1) / 2], "a good op after the bad input")


@check
def registration_is_refused_where_the_backend_cannot(rank, size):
    expect(comms.torch.can_register_tensors("cpu"), False, "gloo's capability")
    t = torch.ones(4)
    try:
        comms.torch.register_tensor(t)
    except comms.Error as e:
        expect(e.code, "unsupported", "register_tensor's error code")
        if "cannot register" not in str(e):
            raise AssertionError("register_tensor's error does not say why: %s" % e)
    else:
        raise AssertionError("register_tensor on gloo did not raise")
    expect(summed([1]), [size], "all_reduce after the refused registration")


@check
def torch_timeouts_reach_the_comm(rank, size):
    # torch_rank.run gives init_process_group 60 s; set_timeout changes a live group.
    expect(json.loads(comms.torch.describe()).get("op_timeout_ms"), 60000, "the world's op timeout")
    g = dist.new_group(list(range(size)))
    dist.set_timeout(datetime.timedelta(seconds=42), group=g)
    expect(json.loads(comms.torch.describe(g)).get("op_timeout_ms"), 42000, "the group's timeout after set_timeout")
    expect(summed([1], g), [size], "all_reduce after set_timeout")
    dist.destroy_process_group(g)


@check
def split_group_gives_each_rank_its_part(rank, size):
    halves = [list(range(0, size // 2)), list(range(size // 2, size))] if size > 1 else [[0]]
    mine = next(h for h in halves if rank in h)
    # A lazy NCCL backend splits into a lazy child (its communicator comes
    # with its first CUDA op), so the whole group splits.
    g = dist.split_group(split_ranks=halves, pg_options=comms.torch.Options(timeout=11))
    if has_lazy_nccl():
        nccl = json.loads(comms.torch.describe(g))["backends"]["cuda"]["config"]
        expect(nccl["initialized"], False, "split_group's NCCL communicator before any CUDA op")
    expect(dist.get_world_size(g), len(mine), "split_group size")
    expect(dist.get_rank(g), mine.index(rank), "split_group rank")
    expect(summed([rank + 1], g), [sum(r + 1 for r in mine)], "all_reduce on my half")
    expect(json.loads(comms.torch.describe(g)).get("op_timeout_ms"), 11000, "split_group's pg_options timeout")
    # A split without options inherits its parent's (here busy_poll off);
    # its op timeout is split_group's.
    parent = dist.new_group(list(range(size)), pg_options=comms.torch.Options(busy_poll=False))
    inherit = dist.split_group(parent, split_ranks=[list(range(size))], timeout=datetime.timedelta(seconds=13))
    child = json.loads(comms.torch.describe(inherit))
    expect(child["backends"]["cpu"]["config"]["busy_poll_enabled"], False, "a split child's busy_poll")
    expect(child.get("op_timeout_ms"), 13000, "split_group's timeout")
    expect(summed([1], inherit), [size], "all_reduce on the inheriting split")
    dist.destroy_process_group(parent)
    dist.destroy_process_group(g)
    dist.destroy_process_group(inherit)


@check
def shrink_group_leaves_out_the_excluded_rank(rank, size):
    if size < 2:
        return
    g = dist.new_group(list(range(size)))
    gone = size - 1
    if rank != gone:  # torch: only the ranks that stay call shrink_group
        small = dist.shrink_group([gone], group=g)
        expect(dist.get_world_size(small), size - 1, "shrunk size")
        expect(summed([rank + 1], small), [sum(range(1, size))], "all_reduce without rank %d" % gone)
        # torch replaces the group it shrank: the old handle is gone here.
        raises(lambda: summed([1], g), ["not initialized"], "an op on the group that was shrunk")
        dist.destroy_process_group(small)
    else:
        dist.destroy_process_group(g)
    expect(summed([1]), [size], "the world after the shrink")


def main():
    torch_rank.run(CHECKS)


if __name__ == "__main__":
    main()
