"""One rank of the allocate_tensor checks (test_torch_alloc.py runs it under
commsrun at 2 ranks, once on cpu:ucx and once on cpu:gloo): CPU tensors from
the group's comm (torch's allocate_tensor, comms.torch.empty) give the same
bits as ordinary tensors in every collective and take UCX's zero-copy path;
their memory is freed when torch frees them, also after their group was
destroyed; Gloo says it cannot allocate. Writes {check: "ok" | error} to
OUT_DIR/rank<R>.json."""
import gc
import json
import os

import torch
import torch.distributed as dist

import comms
import comms.torch
import torch_rank
from torch_rank import expect
from ucx_memory import comms_memfds

CPU = torch.device("cpu")
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64]
OPS = ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor"]


def cpu_backend(group=None):
    return (group or dist.group.WORLD)._get_backend(CPU)


def zero_copy(group=None):
    """The UCX backend's zero-copy record in describe(): {"ops": ops that took
    the path, "min_bytes": the smallest buffer that takes it}. The one place
    that reads it."""
    cpu = json.loads(comms.torch.describe(group))["backends"]["cpu"]
    if "zero_copy" not in cpu.get("config", {}):
        raise AssertionError("describe() shows no zero_copy for the cpu backend: %s" % json.dumps(cpu)[:600])
    return cpu["config"]["zero_copy"]


def has_zero_copy(group=None):
    try:
        zero_copy(group)
        return True
    except AssertionError:
        return False


def values(rank, n, dtype, salt):
    """Rank `rank`'s input: any rank computes any other's."""
    g = torch.Generator().manual_seed(7919 * salt + rank)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(dtype)
    return torch.randint(-10**6, 10**6, (n,), generator=g, dtype=torch.int64).to(dtype)


def elements(dtype):
    """Elements per rank: past the zero-copy threshold where one is shown,
    else 64 KiB of elements and an odd tail."""
    try:
        min_bytes = int(zero_copy()["min_bytes"])
    except AssertionError:
        min_bytes = 1 << 16
    if min_bytes > 8 << 20:
        raise AssertionError("zero_copy min_bytes is %d: set the UCX threshold lower for this test" % min_bytes)
    item = torch.empty(0, dtype=dtype).element_size()
    return (min_bytes + item - 1) // item + 5


def run(op, rank, size, n, dtype, salt, make):
    """`op` on tensors from `make(count)`; returns its output."""
    if op == "all_reduce":
        t = make(n)
        t.copy_(values(rank, n, dtype, salt))
        dist.all_reduce(t)
        return t
    if op == "broadcast":
        t = make(n)
        t.copy_(values(rank, n, dtype, salt))
        dist.broadcast(t, src=size - 1)
        return t
    if op == "all_gather_into_tensor":
        inp, out = make(n), make(n * size)
        inp.copy_(values(rank, n, dtype, salt))
        dist.all_gather_into_tensor(out, inp)
        return out
    inp, out = make(n * size), make(n)
    inp.copy_(values(rank, n * size, dtype, salt))
    dist.reduce_scatter_tensor(out, inp)
    return out


def expected(op, rank, size, n, dtype, salt):
    """The result computed here, from every rank's inputs (sums in rank order)."""
    if op == "all_reduce":
        total = values(0, n, dtype, salt)
        for r in range(1, size):
            total = total + values(r, n, dtype, salt)
        return total
    if op == "broadcast":
        return values(size - 1, n, dtype, salt)
    if op == "all_gather_into_tensor":
        return torch.cat([values(r, n, dtype, salt) for r in range(size)])
    total = values(0, n * size, dtype, salt)[rank * n:(rank + 1) * n]
    for r in range(1, size):
        total = total + values(r, n * size, dtype, salt)[rank * n:(rank + 1) * n]
    return total


def same_bits(a, b):
    """Equal bit for bit (floats compared as their bytes: -0.0 and NaNs too)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def first_difference(a, b):
    diff = (a != b).nonzero()
    return "index %d: %r against %r" % (diff[0].item(), a[diff[0]].item(), b[diff[0]].item()) if len(diff) else "-"


def allocate(dtype):
    return lambda count: comms.torch.empty(count, dtype=dtype)


def ordinary(dtype):
    return lambda count: torch.empty(count, dtype=dtype)


# ---- cpu:ucx ----

def torch_allocates_cpu_tensors_in_comms_memory(rank, size):
    b = cpu_backend()
    expect(b.supports_tensor_alloc(CPU), True, "supports_tensor_alloc(cpu)")
    expect(b.supports_tensor_alloc(torch.device("cuda", 0)), False, "supports_tensor_alloc(cuda:0)")
    base = comms_memfds()
    t = b.allocate_tensor(1000, dtype=torch.float64, device=CPU)
    expect((tuple(t.shape), t.dtype, t.device, t.is_contiguous()), ((1000,), torch.float64, CPU, True), "tensor")
    expect(comms_memfds(), base + 1, "comms memfds with one tensor allocated")
    t.copy_(torch.arange(1000, dtype=torch.float64))
    expect(float(t.sum()), 999 * 1000 / 2, "sum of what was written")
    e = comms.torch.empty((4, 3), dtype=torch.int16)
    expect((tuple(e.shape), e.dtype, comms_memfds()), ((4, 3), torch.int16, base + 2), "comms.torch.empty((4, 3))")
    expect(comms.torch.empty(0).numel(), 0, "an empty tensor")
    expect(comms_memfds(), base + 2, "comms memfds after an empty tensor (no memory)")
    del t, e
    expect(comms_memfds(), base, "comms memfds once the tensors are gone")
    try:
        b.allocate_tensor(8, dtype=torch.float32, device=torch.device("cuda", 0))
        raise AssertionError("a CUDA tensor was allocated")
    except (ValueError, RuntimeError) as err:
        expect("CPU tensors only" in str(err), True, "the error names the device rule: %s" % err)


def allocated_tensors_give_the_bits_of_ordinary_ones(rank, size):
    for salt, (op, dtype) in enumerate((op, dtype) for op in OPS for dtype in DTYPES):
        n = elements(dtype)
        plain = run(op, rank, size, n, dtype, salt, ordinary(dtype))
        ours = run(op, rank, size, n, dtype, salt, allocate(dtype))
        want = expected(op, rank, size, n, dtype, salt)
        what = "%s %s of %d elements on rank %d" % (op, dtype, n, rank)
        expect(same_bits(plain, want), True, "%s, ordinary tensors: %s" % (what, first_difference(plain, want)))
        expect(same_bits(ours, want), True, "%s, allocated tensors: %s" % (what, first_difference(ours, want)))


def ops_on_allocated_tensors_take_the_zero_copy_path(rank, size):
    for salt, (op, dtype) in enumerate((op, dtype) for op in OPS for dtype in DTYPES):
        n = elements(dtype)
        before = zero_copy()["ops"]
        run(op, rank, size, n, dtype, salt, ordinary(dtype))
        between = zero_copy()["ops"]
        run(op, rank, size, n, dtype, salt, allocate(dtype))
        after = zero_copy()["ops"]
        what = "%s %s of %d elements on rank %d" % (op, dtype, n, rank)
        expect(between - before, 0, "zero-copy ops counted for %s on ordinary tensors" % what)
        expect(after - between, 1, "zero-copy ops counted for %s on allocated tensors" % what)


def memory_is_freed_when_torch_frees_the_tensor(rank, size):
    gc.collect()
    base = comms_memfds()
    held = comms.torch.empty(4096, dtype=torch.float32)
    expect(comms_memfds(), base + 1, "comms memfds while one tensor is held")
    for i in range(20):
        t = comms.torch.empty(1024 * (i + 1), dtype=torch.int32)
        t.fill_(rank + i)
        dist.all_reduce(t)
        expect(int(t[-1]), sum(r + i for r in range(size)), "all_reduce in cycle %d" % i)
        view = t[10:20]  # a view keeps the storage, and the memory, alive
        del t
        expect(comms_memfds(), base + 2, "comms memfds while a view of cycle %d's tensor lives" % i)
        del view
    # The group keeps an op's tensors until it sees the op finished, at its
    # next op: the barrier lets the last cycle's tensor go.
    dist.barrier()
    expect(comms_memfds(), base + 1, "comms memfds after 20 allocate/free cycles")
    del held
    expect(comms_memfds(), base, "comms memfds once every tensor is gone")


def a_tensor_outlives_the_destroyed_group(rank, size):
    base = comms_memfds()
    sub = dist.new_group(list(range(size)))
    backend = cpu_backend(sub)
    t = comms.torch.empty(4096, dtype=torch.float32, group=sub)
    t.fill_(rank + 1)
    dist.all_reduce(t, group=sub)
    dist.destroy_process_group(sub)
    del sub
    gc.collect()
    total = float(sum(r + 1 for r in range(size)))
    expect(bool((t == total).all()), True, "the tensor's values after its group was destroyed")
    t += 1  # still mapped, writable
    expect(float(t[-1]), total + 1, "a write after the group was destroyed")
    expect(comms_memfds(), base + 1, "comms memfds while the tensor lives")
    try:
        backend._allocate_tensor(8, torch.float32)
        raise AssertionError("a destroyed group allocated a tensor")
    except ValueError as err:
        expect("destroyed" in str(err), True, "the error says the group was destroyed: %s" % err)
    del t
    expect(comms_memfds(), base, "comms memfds once the tensor is gone")


def a_tensor_outlives_offload_and_serves_after_reload(rank, size):
    t = comms.torch.empty(4096, dtype=torch.int64)
    t.fill_(rank)
    expect(comms.torch.offload_groups(["cpu"]) >= 1, True, "cpu backends offloaded")
    t += 10  # still mapped, writable, while no backend exists
    expect(comms.torch.reload_groups(["cpu"]) >= 1, True, "cpu backends reloaded")
    dist.all_reduce(t)
    expect(int(t[-1]), sum(r + 10 for r in range(size)), "all_reduce after the reload")


_fsdp_runs = {}


def fsdp(allocate_from_group):
    """Three SGD steps of an MLP under FSDP2 on the CPU world mesh, once per
    setting: the losses, the full parameters, the zero-copy ops it took (None
    where describe() shows none) and how many tensors it allocated through
    the group."""
    if allocate_from_group in _fsdp_runs:
        return _fsdp_runs[allocate_from_group]
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    world = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=world)
    fully_shard(model, mesh=world)
    for module in (model[0], model[2], model):  # each holds its own parameter group
        module.set_allocate_memory_from_process_group_for_comm(allocate_from_group)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def ops():
        return zero_copy()["ops"] if has_zero_copy() else None

    # Counts what FSDP asks the group for (it calls allocate_tensor on the backend).
    allocated = []
    inherited = comms.torch.ProcessGroupComms.allocate_tensor

    def counted(backend, size, **kwargs):
        allocated.append(size)
        return inherited(backend, size, **kwargs)

    comms.torch.ProcessGroupComms.allocate_tensor = counted
    before, losses = ops(), []
    try:
        for step in range(3):
            g = torch.Generator().manual_seed(100 * step + dist.get_rank())
            x, y = torch.randn(8, 256, generator=g), torch.randn(8, 64, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    finally:
        del comms.torch.ProcessGroupComms.allocate_tensor  # torch's again
    params = [p.full_tensor().detach() for p in model.parameters()]
    after = ops()
    _fsdp_runs[allocate_from_group] = (torch.stack(losses), params, None if before is None else after - before,
                                       len(allocated))
    return _fsdp_runs[allocate_from_group]


def fsdp_with_staging_buffers_from_the_group_trains_alike(rank, size):
    plain_losses, plain_params, _, plain_allocated = fsdp(False)
    losses, params, _, allocated = fsdp(True)
    expect(plain_allocated, 0, "tensors FSDP allocated through the group by default")
    expect(allocated > 0, True, "tensors FSDP allocated through the group when asked: %d" % allocated)
    expect(same_bits(losses, plain_losses), True, "losses: %s" % first_difference(losses, plain_losses))
    for i, (p, q) in enumerate(zip(params, plain_params)):
        expect(same_bits(p, q), True, "parameter %d: %s" % (i, first_difference(p.flatten(), q.flatten())))


def fsdp_collectives_in_buffers_from_the_group_take_the_zero_copy_path(rank, size):
    zero_copy()  # says what describe() lacks, if it does
    expect(fsdp(False)[2], 0, "zero-copy ops of FSDP with torch's own buffers")
    # FSDP allocates both sides of its all-gathers (the input is a slice of
    # the output) and reduce-scatters through allocate_tensor.
    ops = fsdp(True)[2]
    expect(ops > 0, True, "zero-copy ops of FSDP with buffers from the group: %d" % ops)


_ddp_runs = {}


def staged_all_reduce(staging, bucket):
    """A DDP comm hook: the bucket's average, reduced in a comms.torch.empty
    tensor kept per bucket (copied in and out; DDP allocates buckets itself)."""
    grads = bucket.buffer()
    buf = staging.get(bucket.index())
    if buf is None or buf.numel() != grads.numel() or buf.dtype != grads.dtype:
        buf = staging[bucket.index()] = comms.torch.empty(grads.numel(), dtype=grads.dtype)
    buf.copy_(grads)
    buf.div_(dist.get_world_size())
    dist.all_reduce(buf)
    grads.copy_(buf)
    done = torch.futures.Future()
    done.set_result(grads)
    return done


def ddp(staged):
    """Three SGD steps of an MLP under DDP, with the hook above or torch's own
    all-reduce: the parameters, the zero-copy ops (None where describe()
    shows none) and the staging tensors made."""
    if staged in _ddp_runs:
        return _ddp_runs[staged]
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(13)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 64)))
    staging = {}
    if staged:
        model.register_comm_hook(staging, staged_all_reduce)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = zero_copy()["ops"] if has_zero_copy() else None
    for step in range(3):
        g = torch.Generator().manual_seed(300 * step + dist.get_rank())
        x, y = torch.randn(8, 256, generator=g), torch.randn(8, 64, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    after = zero_copy()["ops"] if has_zero_copy() else None
    _ddp_runs[staged] = ([p.detach().clone() for p in model.parameters()],
                         None if before is None else after - before, len(staging))
    return _ddp_runs[staged]


def ddp_buckets_reduced_in_comms_memory_train_alike(rank, size):
    plain, _, _ = ddp(False)
    staged, _, buckets = ddp(True)
    expect(buckets > 0, True, "staging tensors the hook made: %d" % buckets)
    for i, (p, q) in enumerate(zip(staged, plain)):
        expect(same_bits(p, q), True, "parameter %d: %s" % (i, first_difference(p.flatten(), q.flatten())))


def ddp_buckets_in_comms_memory_take_the_zero_copy_path(rank, size):
    zero_copy()  # says what describe() lacks, if it does
    expect(ddp(False)[1], 0, "zero-copy ops of DDP's own all-reduce")
    ops = ddp(True)[1]
    expect(ops > 0, True, "zero-copy ops of DDP's staged all-reduce: %d" % ops)


UCX_CHECKS = [torch_allocates_cpu_tensors_in_comms_memory, allocated_tensors_give_the_bits_of_ordinary_ones,
              ops_on_allocated_tensors_take_the_zero_copy_path, memory_is_freed_when_torch_frees_the_tensor,
              a_tensor_outlives_the_destroyed_group, a_tensor_outlives_offload_and_serves_after_reload,
              fsdp_with_staging_buffers_from_the_group_trains_alike,
              fsdp_collectives_in_buffers_from_the_group_take_the_zero_copy_path,
              ddp_buckets_reduced_in_comms_memory_train_alike, ddp_buckets_in_comms_memory_take_the_zero_copy_path]


# ---- cpu:gloo ----

def gloo_cannot_allocate_and_says_so(rank, size):
    b = cpu_backend()
    expect(b.supports_tensor_alloc(CPU), False, "supports_tensor_alloc(cpu) on gloo")
    try:
        b.allocate_tensor(16, dtype=torch.float32, device=CPU)
        raise AssertionError("gloo allocated a tensor")
    except RuntimeError as err:
        expect("the gloo backend for cpu has no allocator" in str(err), True, "torch's error: %s" % err)
    try:
        comms.torch.empty(16)
        raise AssertionError("gloo allocated a tensor through comms.torch.empty")
    except comms.Error as err:
        expect(err.code, "unsupported", "comms.torch.empty's error code")
    t = torch.ones(8)
    dist.all_reduce(t)  # the group is still usable
    expect(t.tolist(), [float(size)] * 8, "all_reduce after the refusals")


GLOO_CHECKS = [gloo_cannot_allocate_and_says_so]
CHECKS = {"cpu:ucx": UCX_CHECKS, "cpu:gloo": GLOO_CHECKS}

if __name__ == "__main__":
    torch_rank.run(CHECKS[os.environ["COMMS_BACKEND"]])
