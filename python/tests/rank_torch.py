"""One rank of the torch.distributed checks of backend "comms" (run by
test_torch.py under commsrun, once per COMMS_BACKEND and size). Every result
is compared with a reference computed here in numpy from every rank's known
input, never through another collective. Writes {check: "ok" | error} to
OUT_DIR/rank<R>.json."""
import json
import time

import numpy as np
import torch
import torch.distributed as dist

import comms.torch
import torch_rank

CHECKS = []
R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]


def check(fn):
    CHECKS.append(fn)
    return fn


def source(rank, n, dtype, salt=0):
    """Rank `rank`'s input: small values, exact in every dtype, products fit int8."""
    base = (np.arange(n) * 3 + 7 * rank + salt) % 3 + 1
    if dtype == torch.bool:
        return torch.from_numpy((np.arange(n) + rank + salt) % 2 == 0)
    if dtype.is_complex:
        return torch.complex(torch.tensor(base, dtype=torch.float32), torch.tensor(-base, dtype=torch.float32))
    return torch.tensor(base).to(dtype)


def ref(t):
    """A tensor as a float64 / bool numpy array (bfloat16 has no numpy type)."""
    if t.dtype == torch.bool:
        return t.numpy().copy()
    if t.is_complex():
        return torch.view_as_real(t).to(torch.float64).numpy()
    return t.to(torch.float64).numpy()


def reduce_ref(op, arrays, dtype):
    a = np.stack(arrays)
    if op == R.SUM:
        return a.sum(0) if dtype != torch.bool else a.any(0)
    if op == R.PRODUCT:
        return a.prod(0)
    if op == R.MIN:
        return a.min(0)
    if op == R.MAX:
        return a.max(0)
    if op == R.AVG:
        return a.mean(0)
    ints = a.astype(np.int64) if dtype != torch.bool else a
    red = {R.BAND: np.bitwise_and, R.BOR: np.bitwise_or, R.BXOR: np.bitwise_xor}[op]
    out = red.reduce(ints, axis=0)
    return out.astype(np.float64) if dtype != torch.bool else out


def expect_tensor(actual, expected, what):
    got = ref(actual)
    expected = np.asarray(expected)
    if got.shape != expected.shape:
        raise AssertionError("%s: shape %s, expected %s" % (what, got.shape, expected.shape))
    bad = np.flatnonzero(~np.isclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-2, atol=1e-2))
    if bad.size:
        i = bad[0]
        raise AssertionError("%s (%s): index %d is %r, expected %r" % (what, actual.dtype, i, got.flat[i],
                                                                       expected.flat[i]))


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    if dtype.is_floating_point:
        return ops + [R.AVG]
    return ops + [R.BAND, R.BOR, R.BXOR]


@check
def all_reduce_every_dtype_and_op(rank, size):
    for dtype in FLOATS + INTS + [torch.bool]:
        for op in ops_for(dtype):
            t = source(rank, 5, dtype)
            dist.all_reduce(t, op=op)
            expected = reduce_ref(op, [ref(source(r, 5, dtype)) for r in range(size)], dtype)
            expect_tensor(t, expected, "all_reduce %s" % op)


@check
def all_reduce_premul_sum_and_large(rank, size):
    for dtype in (torch.float32, torch.float64):
        t = source(rank, 7, dtype)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.5))
        expect_tensor(t, 2.5 * sum(ref(source(r, 7, dtype)) for r in range(size)), "premul_sum 2.5")
    big = torch.arange(100000, dtype=torch.float32) + rank
    dist.all_reduce(big)
    expect_tensor(big, size * np.arange(100000) + sum(range(size)), "all_reduce 100000")


@check
def all_reduce_complex_as_real_pairs(rank, size):
    t = source(rank, 4, torch.complex64)
    dist.all_reduce(t)
    expect_tensor(t, sum(ref(source(r, 4, torch.complex64)) for r in range(size)), "complex all_reduce")


@check
def reduce_to_the_last_rank(rank, size):
    root = size - 1
    for dtype, op in ((torch.float32, R.SUM), (torch.int32, R.MAX), (torch.bfloat16, R.MIN)):
        t = source(rank, 6, dtype)
        dist.reduce(t, dst=root, op=op)
        if rank == root:
            expect_tensor(t, reduce_ref(op, [ref(source(r, 6, dtype)) for r in range(size)], dtype), "reduce")
        else:
            expect_tensor(t, ref(source(rank, 6, dtype)), "reduce leaves a non-root's input")


@check
def broadcast_every_dtype(rank, size):
    for dtype in FLOATS + INTS + [torch.bool, torch.int16, torch.complex64]:
        for root in {0, size - 1}:
            t = source(rank, 5, dtype, salt=root)
            dist.broadcast(t, src=root)
            expect_tensor(t, ref(source(root, 5, dtype, salt=root)), "broadcast from %d" % root)


@check
def all_gather_list_every_dtype(rank, size):
    for dtype in FLOATS + INTS + [torch.bool, torch.int16, torch.complex64]:
        outs = [torch.zeros(3, dtype=dtype) for _ in range(size)]
        dist.all_gather(outs, source(rank, 3, dtype))
        for r in range(size):
            expect_tensor(outs[r], ref(source(r, 3, dtype)), "all_gather [%d]" % r)


@check
def all_gather_coalesced_every_dtype(rank, size):
    shapes = [(2, 3), (1,), (4,)]  # different sizes: each lands in its own place
    for dtype in FLOATS + INTS + [torch.bool, torch.int16, torch.complex64]:
        ins = [source(rank, int(np.prod(s)), dtype, salt=i).reshape(s) for i, s in enumerate(shapes)]
        outs = [[torch.zeros(s, dtype=dtype) for s in shapes] for _ in range(size)]
        dist.all_gather_coalesced(outs, ins)
        for r in range(size):
            for i, s in enumerate(shapes):
                expected = ref(source(r, int(np.prod(s)), dtype, salt=i).reshape(s))
                expect_tensor(outs[r][i], expected, "all_gather_coalesced [%d][%d]" % (r, i))


@check
def all_gather_into_tensor(rank, size):
    for dtype in (torch.float32, torch.int64, torch.float16):
        out = torch.zeros(size * 4, dtype=dtype)
        dist.all_gather_into_tensor(out, source(rank, 4, dtype))
        expect_tensor(out, np.concatenate([ref(source(r, 4, dtype)) for r in range(size)]), "all_gather_into_tensor")
        out = torch.zeros(size * 4, dtype=dtype)
        dist._all_gather_base(out, source(rank, 4, dtype))
        expect_tensor(out, np.concatenate([ref(source(r, 4, dtype)) for r in range(size)]), "_allgather_base")


@check
def reduce_scatter_list_and_tensor(rank, size):
    for dtype, op in ((torch.float32, R.SUM), (torch.int64, R.MAX), (torch.float64, R.AVG)):
        ins = [source(rank, 3, dtype, salt=j) for j in range(size)]
        out = torch.zeros(3, dtype=dtype)
        dist.reduce_scatter(out, ins, op=op)
        expect_tensor(out, reduce_ref(op, [ref(source(r, 3, dtype, salt=rank)) for r in range(size)], dtype),
                      "reduce_scatter")
        flat = source(rank, 3 * size, dtype)
        out = torch.zeros(3, dtype=dtype)
        dist.reduce_scatter_tensor(out, flat, op=op)
        full = reduce_ref(op, [ref(source(r, 3 * size, dtype)) for r in range(size)], dtype)
        expect_tensor(out, full[3 * rank:3 * rank + 3], "reduce_scatter_tensor")
        out = torch.zeros(3, dtype=dtype)
        dist._reduce_scatter_base(out, flat, op=op)
        expect_tensor(out, full[3 * rank:3 * rank + 3], "_reduce_scatter_base")


def block(src, dst, n, dtype=torch.float32):
    """What rank src sends rank dst: n values naming both."""
    return torch.tensor([100 * src + 10 * dst + k for k in range(n)], dtype=torch.float64).to(dtype)


@check
def all_to_all_list_uneven(rank, size):
    ins = [block(rank, j, rank + j + 1) for j in range(size)]
    outs = [torch.zeros(j + rank + 1) for j in range(size)]
    dist.all_to_all(outs, ins)
    for j in range(size):
        expect_tensor(outs[j], ref(block(j, rank, j + rank + 1)), "all_to_all from %d" % j)


@check
def all_to_all_single_even_and_uneven(rank, size):
    for dtype in (torch.float32, torch.int8, torch.int16):
        inp = torch.cat([block(rank, j, 2, dtype) for j in range(size)])
        out = torch.zeros(2 * size, dtype=dtype)
        dist.all_to_all_single(out, inp)
        expect_tensor(out, np.concatenate([ref(block(j, rank, 2, dtype)) for j in range(size)]), "all_to_all_single")
    # rank r sends (r + j) % 3 rows of 2 columns to rank j.
    rows = lambda s, d: (s + d) % 3  # noqa: E731
    inp = torch.cat([block(rank, j, 2 * rows(rank, j)) for j in range(size)]).reshape(-1, 2)
    out = torch.zeros(sum(rows(j, rank) for j in range(size)), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=[rows(j, rank) for j in range(size)],
                           input_split_sizes=[rows(rank, j) for j in range(size)])
    expected = np.concatenate([ref(block(j, rank, 2 * rows(j, rank))) for j in range(size)])
    expect_tensor(out.reshape(-1), expected, "all_to_all_single uneven")


@check
def gather_and_scatter_at_both_ends(rank, size):
    for root in sorted({0, size - 1}):
        outs = [torch.zeros(4, dtype=torch.int32) for _ in range(size)] if rank == root else None
        dist.gather(source(rank, 4, torch.int32), gather_list=outs, dst=root)
        if rank == root:
            for r in range(size):
                expect_tensor(outs[r], ref(source(r, 4, torch.int32)), "gather [%d] at %d" % (r, root))
        out = torch.zeros(3, dtype=torch.float16)
        ins = [block(root, j, 3, torch.float16) for j in range(size)] if rank == root else None
        dist.scatter(out, scatter_list=ins, src=root)
        expect_tensor(out, ref(block(root, rank, 3, torch.float16)), "scatter from %d" % root)


@check
def barrier_and_coalesced(rank, size):
    dist.barrier()
    ts = [source(rank, 3, torch.float32), source(rank, 5, torch.float32, salt=1)]
    dist.all_reduce_coalesced(ts)
    expect_tensor(ts[0], sum(ref(source(r, 3, torch.float32)) for r in range(size)), "coalesced [0]")
    expect_tensor(ts[1], sum(ref(source(r, 5, torch.float32, salt=1)) for r in range(size)), "coalesced [1]")


@check
def send_recv_isend_irecv_batch(rank, size):
    if size == 1:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    for dtype in (torch.float32, torch.bfloat16, torch.complex64, torch.int16):
        got = torch.zeros(4, dtype=dtype)
        if rank % 2 == 0:
            dist.send(block(rank, right, 4).to(dtype), dst=right)
            dist.recv(got, src=left)
        else:
            dist.recv(got, src=left)
            dist.send(block(rank, right, 4).to(dtype), dst=right)
        expect_tensor(got, ref(block(left, rank, 4).to(dtype)), "send/recv ring")
    got = torch.zeros(6)
    reqs = [dist.isend(block(rank, right, 6), dst=right, tag=3), dist.irecv(got, src=left, tag=3)]
    for q in reqs:
        q.wait()
    expect_tensor(got, ref(block(left, rank, 6)), "isend/irecv")
    got_l, got_r = torch.zeros(5), torch.zeros(5)
    ops = [dist.P2POp(dist.isend, block(rank, right, 5), right), dist.P2POp(dist.irecv, got_l, left),
           dist.P2POp(dist.isend, block(rank, left, 5), left), dist.P2POp(dist.irecv, got_r, right)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    expect_tensor(got_l, ref(block(left, rank, 5)), "batch_isend_irecv from the left")
    expect_tensor(got_r, ref(block(right, rank, 5)), "batch_isend_irecv from the right")


@check
def isend_and_irecv_that_cross_both_complete(rank, size):
    """Partners (0-1, 2-3) each post an isend and then an irecv to the other
    before waiting on either: large enough that a send cannot complete before
    its receive is posted."""
    partner = rank ^ 1
    if partner >= size:
        return
    n = 1 << 20  # 4 MiB: past every eager threshold
    got = torch.zeros(n)
    mine = torch.arange(n, dtype=torch.float32) + rank * n
    reqs = [dist.isend(mine, dst=partner), dist.irecv(got, src=partner)]
    for q in reqs:
        q.wait()
    expect_tensor(got[:4], [partner * n + i for i in range(4)], "crossing irecv, first elements")
    if not torch.equal(got, torch.arange(n, dtype=torch.float32) + partner * n):
        raise AssertionError("crossing irecv: %d of %d elements differ" % (int((got != torch.arange(
            n, dtype=torch.float32) + partner * n).sum()), n))


@check
def a_send_completes_while_its_sender_sleeps(rank, size):
    """The even partner posts an isend and sleeps before waiting on it; the
    odd one's recv must finish during that sleep (the send started when it
    was issued)."""
    partner = rank ^ 1
    stamps = torch.zeros(size, dtype=torch.float64)  # rank r's moment at r
    if partner < size:
        t = torch.full((1 << 20,), float(rank))
        if rank % 2 == 0:
            work = dist.isend(t, dst=partner, tag=7)
            time.sleep(1.5)
            stamps[rank] = time.time()  # the sender wakes
            work.wait()
        else:
            dist.recv(t, src=partner, tag=7)
            stamps[rank] = time.time()  # the receiver has the data
            expect_tensor(t[:2], [float(partner)] * 2, "recv during the sender's sleep")
    dist.all_reduce(stamps)
    for sender in range(0, size - 1, 2):
        woke, received = stamps[sender].item(), stamps[sender + 1].item()
        if not received < woke:
            raise AssertionError("rank %d's recv finished %.3f s after rank %d woke: the send waited for wait()"
                                 % (sender + 1, received - woke, sender))


@check
def recv_from_any_source_is_refused(rank, size):
    try:
        dist.recv(torch.zeros(1))
    except (RuntimeError, ValueError) as e:
        if "recv" not in str(e) or "any source" not in str(e):
            raise AssertionError("the error does not name the call: %s" % e)
    else:
        raise AssertionError("recv from any source did not raise")
    t = torch.ones(2)
    dist.all_reduce(t)
    expect_tensor(t, [size, size], "all_reduce after the refused recv")


@check
def async_work_wait_is_completed_and_future(rank, size):
    t = source(rank, 8, torch.float32)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    if not work.is_completed() or not work.is_success():
        raise AssertionError("a waited work is not completed and successful")
    expected = sum(ref(source(r, 8, torch.float32)) for r in range(size))
    expect_tensor(t, expected, "async all_reduce")
    t = source(rank, 8, torch.float32)
    fut = dist.all_reduce(t, async_op=True).get_future()
    value = fut.wait()
    expect_tensor(value[0], expected, "get_future().wait() value")
    chained = dist.all_reduce(source(rank, 8, torch.float32), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    expect_tensor(chained.wait(), 2 * expected, "future.then")
    outs = [torch.zeros(2) for _ in range(size)]
    work = dist.all_gather(outs, torch.full((2,), float(rank)), async_op=True)
    work.wait()
    for r in range(size):
        expect_tensor(outs[r], [r, r], "async all_gather [%d]" % r)


def record_backend(results):
    results["backend"] = json.loads(comms.torch.describe())["backend"]


def main():
    torch_rank.run(CHECKS, record_backend)


if __name__ == "__main__":
    main()
