"""One rank of the multi-rank op checks (run under commsrun by test_multi_rank.py).

Runs every check, each with values that a wrong offset, dtype or reduction
would change, and writes {check: "ok" | error text} to OUT_DIR/rank<R>.json.
A failing check does not stop the others; collective checks bound their
time with the comm's op timeout.
"""
import json
import os
import sys
import traceback

import numpy as np

import comms
import dlpack_helper as dl

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def expect(actual, expected, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.dtype != expected.dtype or not np.array_equal(actual, expected):
        raise AssertionError("%s: got %r (%s), expected %r (%s)" % (what, actual.tolist(), actual.dtype,
                                                                   expected.tolist(), expected.dtype))


@check
def all_reduce_ops(c):
    r, n = c.rank, c.size
    base = np.arange(5)
    per_rank = [(q + 1) * base + q for q in range(n)]
    for op, reduce in [("sum", sum), ("max", lambda v: np.maximum.reduce(v)),
                       ("min", lambda v: np.minimum.reduce(v)), ("product", lambda v: np.prod(v, axis=0))]:
        x = per_rank[r].astype(np.int64)
        c.all_reduce(x, op=op)
        expect(x, np.asarray(reduce([v.astype(np.int64) for v in per_rank])).astype(np.int64), op)
    # avg and premul_sum on floats, out of place: the input stays as it was.
    x = per_rank[r].astype(np.float32)
    out = np.zeros(5, np.float32)
    c.all_reduce(x, out, op="avg")
    expect(out, (sum(per_rank) / n).astype(np.float32), "avg")
    expect(x, per_rank[r].astype(np.float32), "avg input unchanged")
    y = np.zeros(5, np.float64)
    c.all_reduce(per_rank[r].astype(np.float64), y, op="premul_sum:0.5")
    expect(y, 0.5 * sum(per_rank).astype(np.float64), "premul_sum")
    # Bitwise ops on int32: bit r set on rank r.
    for op, want in [("bor", (1 << n) - 1), ("band", 0 if n > 1 else 1), ("bxor", (1 << n) - 1)]:
        b = np.full(3, 1 << r, np.int32)
        c.all_reduce(b, op=op)
        expect(b, np.full(3, want, np.int32), op)


@check
def all_reduce_dtypes(c):
    r, n = c.rank, c.size
    for dtype in (np.int8, np.uint8, np.int32, np.uint32, np.uint64, np.float16, np.float64):
        x = (np.arange(4) + r + 1).astype(dtype)
        c.all_reduce(x, op="sum")
        expect(x, sum((np.arange(4) + q + 1) for q in range(n)).astype(dtype), np.dtype(dtype).name)
    ba = bytearray([r + 1, 2 * r + 1])
    c.all_reduce(ba, op="max")
    expect(np.frombuffer(ba, np.uint8), np.array([n, 2 * n - 1], np.uint8), "bytearray")


@check
def reduce_and_broadcast(c):
    r, n = c.rank, c.size
    root = n - 1
    x = np.array([r * 10 + 1, -r, 7], np.int32)
    before = x.copy()
    c.reduce(x, root=root, op="max")
    if r == root:
        expect(x, np.array([(n - 1) * 10 + 1, 0, 7], np.int32), "reduce max at root")
    out = np.zeros(3, np.float64) if r == root else None
    c.reduce(np.array([r, 1.5, r * r], np.float64), out, root=root, op="sum")
    if r == root:
        expect(out, np.array([sum(range(n)), 1.5 * n, sum(q * q for q in range(n))], np.float64), "reduce sum")
    b = np.arange(6, dtype=np.float32) * 3 + 1 if r == root else np.zeros(6, np.float32)
    c.broadcast(b, root=root)
    expect(b, np.arange(6, dtype=np.float32) * 3 + 1, "broadcast")
    del before


@check
def all_gather(c):
    r, n = c.rank, c.size
    inp = (r * 100 + np.arange(3)).astype(np.int64)
    out = np.zeros(3 * n, np.int64)
    c.all_gather(inp, out)
    expect(out, np.concatenate([q * 100 + np.arange(3) for q in range(n)]).astype(np.int64), "all_gather")
    outs = [np.zeros(3, np.int64) for _ in range(n)]
    c.all_gather(inp, outs)
    for q in range(n):
        expect(outs[q], (q * 100 + np.arange(3)).astype(np.int64), "all_gather list[%d]" % q)
    counts = [q + 1 for q in range(n)]
    out_v = np.zeros(sum(counts), np.float32)
    c.all_gather_v((r * 10 + np.arange(r + 1)).astype(np.float32), out_v, counts)
    expect(out_v, np.concatenate([q * 10 + np.arange(q + 1) for q in range(n)]).astype(np.float32), "all_gather_v")


@check
def reduce_scatter(c):
    r, n = c.rank, c.size
    inp = (np.arange(2 * n) * (r + 1)).astype(np.float32)
    out = np.zeros(2, np.float32)
    c.reduce_scatter(inp, out, op="sum")
    scale = sum(q + 1 for q in range(n))
    expect(out, (np.arange(2 * r, 2 * r + 2) * scale).astype(np.float32), "reduce_scatter")
    counts = [q + 1 for q in range(n)]
    inp_v = (np.arange(sum(counts)) + r).astype(np.int32)
    out_v = np.zeros(r + 1, np.int32)
    c.reduce_scatter_v(inp_v, out_v, counts, op="max")
    start = sum(counts[:r])
    expect(out_v, (np.arange(start, start + r + 1) + n - 1).astype(np.int32), "reduce_scatter_v")


@check
def all_to_all(c):
    r, n = c.rank, c.size
    inp = np.concatenate([r * 100 + j * 10 + np.arange(2) for j in range(n)]).astype(np.int64)
    out = np.zeros(2 * n, np.int64)
    c.all_to_all(inp, out)
    expect(out, np.concatenate([j * 100 + r * 10 + np.arange(2) for j in range(n)]).astype(np.int64), "all_to_all")
    # Rank r sends j+1 elements to rank j and receives r+1 from each.
    inp_v = np.concatenate([r * 100 + j * 10 + np.arange(j + 1) for j in range(n)]).astype(np.float64)
    out_v = np.zeros(n * (r + 1), np.float64)
    c.all_to_all_v(inp_v, out_v, [j + 1 for j in range(n)], [r + 1] * n)
    expect(out_v, np.concatenate([j * 100 + r * 10 + np.arange(r + 1) for j in range(n)]).astype(np.float64),
           "all_to_all_v")


@check
def gather_scatter(c):
    r, n = c.rank, c.size
    out = np.zeros(2 * n, np.int32) if r == 0 else None
    c.gather(np.array([r, -r - 1], np.int32), out, root=0)
    if r == 0:
        expect(out, np.array([v for q in range(n) for v in (q, -q - 1)], np.int32), "gather")
    root = n - 1
    inp = (np.arange(3 * n) * 2 + 1).astype(np.float32) if r == root else None
    got = np.zeros(3, np.float32)
    c.scatter(inp, got, root=root)
    expect(got, (np.arange(3 * r, 3 * r + 3) * 2 + 1).astype(np.float32), "scatter")


@check
def point_to_point(c):
    r, n = c.rank, c.size
    if n == 1:
        return
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = np.zeros(4, np.int64)
    mine = np.arange(4, dtype=np.int64) + 10 * r
    # Ops on one comm run in issue order, so even ranks send first, odd ones
    # receive first (n is even here).
    if r % 2 == 0:
        c.send(mine, peer=nxt, tag=3)
        c.recv(got, peer=prv, tag=3)
    else:
        c.recv(got, peer=prv, tag=3)
        c.send(mine, peer=nxt, tag=3)
    expect(got, np.arange(4, dtype=np.int64) + 10 * prv, "send/recv ring")
    got2 = np.zeros(2, np.float32)
    c.batch_p2p([("send", np.array([r, r + 0.5], np.float32), prv), ("recv", got2, nxt)])
    expect(got2, np.array([nxt, nxt + 0.5], np.float32), "batch_p2p")


@check
def async_work(c):
    r, n = c.rank, c.size
    xs = [np.full(3, r + k, np.float64) for k in range(3)]
    works = [c.all_reduce(x, op="sum", async_op=True) for x in xs]
    for k, w in enumerate(works):
        w.wait()
        if not w.is_completed() or w.status != "ok":
            raise AssertionError("work %d: completed=%s status=%s" % (k, w.is_completed(), w.status))
        expect(xs[k], np.full(3, sum(q + k for q in range(n)), np.float64), "async %d" % k)
    c.barrier(async_op=True).wait()
    # A Work dropped at once waits for its op when it goes away, so the
    # buffer is complete (and was never freed under the op).
    dropped = np.full(2, r + 1, np.int64)
    c.all_reduce(dropped, op="sum", async_op=True)
    expect(dropped, np.full(2, n * (n + 1) // 2, np.int64), "dropped Work")


@check
def split(c):
    r, n = c.rank, c.size
    members = [0, n - 1] if n > 2 else list(range(n))
    sub = c.split(members if r in members else [], "pair")
    if r not in members:
        if sub is not None:
            raise AssertionError("a non-member got %r" % sub)
        return
    if sub.size != len(members) or sub.rank != members.index(r):
        raise AssertionError("split rank %d/%d" % (sub.rank, sub.size))
    x = np.array([r + 1], np.int64)
    sub.all_reduce(x)
    expect(x, np.array([sum(m + 1 for m in members)], np.int64), "split all_reduce")
    sub.finalize()


@check
def elastic_opt_in(c):
    # Elastic recovery is opt-in per comm: a plain comm refuses it (with the
    # way to turn it on) and keeps working; elastic=True shows in describe().
    expect(c.elastic, False, "a plain comm's elastic")
    if c.size > 1:
        try:
            comms.agree_on_failures(c)
            raise AssertionError("a plain comm agreed")
        except comms.Error as e:
            expect((e.code, "COMMS_ELASTIC=1" in str(e)), ("invalid_argument", True), "refusal: %s" % e)
    e = comms.new_comm(device="cpu", name="ops-elastic", elastic=True)
    expect((e.elastic, json.loads(e.describe())["elastic"]), (True, True), "elastic=True")
    x = np.array([e.rank + 1], np.int64)
    e.all_reduce(x)
    expect(x, np.array([e.size * (e.size + 1) // 2], np.int64), "elastic comm all_reduce")
    e.finalize()
    y = np.ones(2, np.int32)
    c.all_reduce(y)
    expect(y, np.full(2, c.size, np.int32), "plain comm usable after the refusal")


@check
def error_contents(c):
    # A bad peer is an invalid_argument error naming comm, op, seq and rank;
    # nothing is sent and the comm stays usable.
    try:
        c.send(np.zeros(2, np.float32), peer=c.size + 5)
        raise AssertionError("no error")
    except comms.Error as e:
        if (e.code, e.comm, e.op, e.rank) != ("invalid_argument", "ops", "send", c.rank) or not e.seq:
            raise AssertionError("error fields %r" % ((e.code, e.comm, e.op, e.seq, e.rank),))
        if not isinstance(e, RuntimeError):
            raise AssertionError("comms.Error is not a RuntimeError")
    try:
        c.all_reduce(np.ones(2, np.float32), op="median")
        raise AssertionError("op='median' was accepted")
    except comms.Error as e:
        if e.code != "invalid_argument" or "median" not in str(e):
            raise AssertionError("bad op error: %s %s" % (e.code, e))
    try:
        c.all_reduce(np.ones(2, np.float32), op=3)
        raise AssertionError("op=3 was accepted")
    except TypeError:
        pass
    x = np.ones(2, np.int32)
    c.all_reduce(x)
    expect(x, np.full(2, c.size, np.int32), "usable after the errors")


@check
def dlpack_dtypes(c):
    r, n = c.rank, c.size
    # numpy through __dlpack__ only (the output is written through it).
    out = np.zeros(3, np.float32)
    c.all_reduce(dl.DLOnly(np.array([r, 1, 2], np.float32)), dl.DLOnly(out), op="sum")
    expect(out, np.array([sum(range(n)), n, 2 * n], np.float32), "numpy __dlpack__")
    # bfloat16: rank r holds r+1 and 0.5; the sum is computed in bfloat16.
    bf = dl.bfloat16_bits([r + 1, 0.5])
    c.all_reduce(dl.DLTensor(bf, dl.BFLOAT, 16), op="sum")
    expect(bf, dl.bfloat16_bits([n * (n + 1) / 2, 0.5 * n]), "bfloat16")
    # float16 through DLPack's float code (the versioned layout).
    half = np.array([r + 1, -2], np.float16)
    c.all_reduce(dl.DLTensor(half.view(np.uint16), dl.FLOAT, 16, versioned=True), op="max")
    expect(half, np.array([n, -2], np.float16), "float16 via DLPack")
    for code in (dl.FLOAT8_E4M3FN, dl.FLOAT8_E5M2):
        f8 = np.full(2, dl.FLOAT8_ONE_TWO_FOUR[code][1], np.uint8)  # 1.0 on every rank
        c.all_reduce(dl.DLTensor(f8, code, 8), op="sum")
        expect(f8, np.full(2, dl.FLOAT8_ONE_TWO_FOUR[code][n], np.uint8), "float8 code %d" % code)


def _raises(kind, fn, words):
    try:
        fn()
    except kind as e:
        if words not in str(e):
            raise AssertionError("%s without %r: %s" % (kind.__name__, words, e))
        return
    raise AssertionError("no %s for %s" % (kind.__name__, words))


@check
def validation_nothing_sent(c):
    # Rank 0 makes every mistake; if any of them were sent, the valid op
    # after would pair with it and give other values (or hang).
    r, n = c.rank, c.size
    if r == 0:
        x = np.zeros(8, np.float32)
        _raises(ValueError, lambda: c.all_reduce(x[::2]), "not contiguous")
        ro = np.zeros(4, np.float32)
        ro.setflags(write=False)
        _raises(ValueError, lambda: c.all_reduce(ro), "read-only")
        _raises(ValueError, lambda: c.recv(b"abcd", peer=n - 1), "read-only")
        _raises(ValueError, lambda: c.all_reduce(dl.DLTensor(np.zeros(4, np.float32), dl.FLOAT, 32, versioned=True,
                                                             flags=dl.READ_ONLY)), "read-only")
        _raises(ValueError, lambda: c.all_reduce(dl.DLTensor(np.zeros(8, np.float32), dl.FLOAT, 32, strides=2,
                                                             count=4)), "not contiguous")
        _raises(TypeError, lambda: c.all_reduce(x, np.zeros(8, np.int32)), "dtype mismatch")
        _raises(TypeError, lambda: c.all_reduce(dl.DLTensor(np.zeros(4, np.float64), dl.COMPLEX, 64)), "no comms data type")
        _raises(TypeError, lambda: c.all_reduce([1.0, 2.0]), "neither the buffer protocol nor __dlpack__")
        _raises(TypeError, lambda: c.all_reduce(np.zeros(2, np.int16)), "no comms data type")
        _raises(ValueError, lambda: c.all_reduce(x, np.zeros(7, np.float32)), "needs 8")
        _raises(ValueError, lambda: c.all_gather(x, np.zeros(8 * n + 1, np.float32)), "needs %d" % (8 * n))
        _raises(ValueError, lambda: c.reduce_scatter(np.zeros(3 * n + 1, np.float32), np.zeros(3, np.float32)),
                "needs %d" % (3 * n))
        _raises(ValueError, lambda: c.all_gather_v(x, np.zeros(8, np.float32), [8] * (n + 1)), "entries")
        if n > 1:
            odd = np.zeros(4 * n + 1, np.float32)
            _raises(ValueError, lambda: c.all_to_all(odd, odd.copy()), "multiple")
    y = np.array([r + 1.0], np.float32)
    c.all_reduce(y, op="sum")
    expect(y, np.array([n * (n + 1) / 2], np.float32), "after the rejected calls")


def main():
    out_dir = sys.argv[1]
    only = set(sys.argv[2:])
    c = comms.new_comm(device="cpu", name="ops", op_timeout=20.0)
    results = {}
    for fn in CHECKS:
        if only and fn.__name__ not in only:
            continue
        try:
            fn(c)
            results[fn.__name__] = "ok"
        except Exception:  # recorded per check; the test reports it
            results[fn.__name__] = traceback.format_exc()
    c.finalize()
    with open(os.path.join(out_dir, "rank%d.json" % c.rank), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
