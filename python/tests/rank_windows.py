"""One rank of the window checks (run under commsrun by test_windows.py, on
cpu:ucx): puts of numpy buffers land byte for byte, signals are counted
exactly, bad offsets raise before anything moves, and the window is released
with its comm. Writes {check: "ok" | error text} to OUT_DIR/rank<R>.json."""
import json
import os
import sys
import traceback

import numpy as np

import comms


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def puts_and_signals(c):
    r, n = c.rank, c.size
    right, left = (r + 1) % n, (r - 1) % n
    inbox = np.zeros(4096, np.float32)
    with comms.register_window(c, inbox) as w:
        expect(w.registered, "registered after register_window")
        expect(w.size_of(right) == inbox.nbytes, "size_of(right) is %d" % w.size_of(right))
        src = np.arange(1000, dtype=np.float32) + 1000 * r
        w.put(src, right, 16 * 4, signal=True)
        w.wait_signal(left, 1)
        expect(np.array_equal(inbox[16:1016], np.arange(1000, dtype=np.float32) + 1000 * left),
               "inbox[16:1016] holds rank %d's values: %r" % (left, inbox[16:20].tolist()))
        expect(not inbox[:16].any() and not inbox[1016:].any(), "bytes outside the put are untouched")
        # Two signals to every rank, one wait for all of them.
        for _ in range(2):
            for p in range(n):
                w.signal(p)
        w.wait_signal([2] * n)
        work = w.flush(async_op=True)
        work.wait()
        try:
            w.wait_signal(left, 1, timeout=0.2)
            raise AssertionError("a wait for a signal nobody sent returned")
        except comms.Error as e:
            expect(e.code == "timeout", "the extra wait failed with %s: %s" % (e.code, e))
        c.barrier()


def bad_offsets_raise(c):
    r, n = c.rank, c.size
    right = (r + 1) % n
    inbox = np.zeros(64, np.uint8)
    w = comms.register_window(c, inbox)
    try:
        w.put(np.ones(8, np.uint8), right, 60)
        raise AssertionError("a put past the end was accepted")
    except comms.Error as e:
        expect(e.code == "invalid_argument" and "do not fit" in str(e), "past the end: %s: %s" % (e.code, e))
    try:
        w.wait_signal([1] * (n + 1))
        raise AssertionError("a wait with size()+1 counts was accepted")
    except ValueError:
        pass
    c.barrier()
    expect(not inbox.any(), "a refused put moved nothing")
    w.deregister()
    expect(not w.registered, "not registered after deregister()")


def finalize_releases(c):
    sub = c.split(list(range(c.size)), "windows-sub")
    w = comms.register_window(sub, np.zeros(16, np.uint8))
    sub.finalize()
    expect(not w.registered, "not registered after the comm's finalize")
    try:
        w.signal(0)
        raise AssertionError("a signal after finalize was accepted")
    except comms.Error as e:
        expect(e.code == "invalid_argument" and "finalized" in str(e), "after finalize: %s: %s" % (e.code, e))


CHECKS = [puts_and_signals, bad_offsets_raise, finalize_releases]


def main():
    out_dir = sys.argv[1]
    c = comms.new_comm(backend="cpu:ucx", device="cpu", name="windows", op_timeout=20.0)
    results = {}
    for fn in CHECKS:
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
