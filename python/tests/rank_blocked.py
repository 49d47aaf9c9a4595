"""A rank 0 blocked in recv from rank 1, which never sends.

mode "sigint": a thread sends this process SIGINT 0.5 s into the recv; the
recv must end in KeyboardInterrupt within 1 s of it. "sigint_wait": the same
for Work.wait() of an async recv, which leaves the op in flight.
mode "timeout": the recv has a 0.5 s timeout and must raise comms.Error
with code "timeout"; a Python thread keeps running meanwhile (the GIL is
released).
Rank 0 writes {"ok": bool, ...} to OUT_DIR/rank0.json; rank 1 waits for
rank 0 to finish (through a file) and exits.
"""
import json
import os
import signal
import sys
import threading
import time

import numpy as np

import comms


def main():
    out_dir, mode = sys.argv[1], sys.argv[2]
    # Python leaves SIGINT ignored when it starts with it ignored, as a job
    # started in the background of a non-interactive shell does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    c = comms.new_comm(device="cpu", name="blocked", op_timeout=30.0)
    done_flag = os.path.join(out_dir, "rank0.json")
    if c.rank != 0:
        deadline = time.monotonic() + 20
        while not os.path.exists(done_flag) and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(os.path.join(out_dir, "rank%d.json" % c.rank), "w") as f:
            json.dump({"ok": True}, f)
        os._exit(0)  # rank 0's comm is aborted; nothing left to finalize together
    result = {"ok": False}
    buf = np.zeros(4, np.float32)
    if mode in ("sigint", "sigint_wait"):
        sent = {}

        def interrupt():
            time.sleep(0.5)
            sent["at"] = time.monotonic()
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        work = c.recv(buf, peer=1, async_op=True) if mode == "sigint_wait" else None
        try:
            if work:
                work.wait()
            else:
                c.recv(buf, peer=1)
            result["error"] = "recv returned"
        except KeyboardInterrupt:
            latency = time.monotonic() - sent["at"]
            result.update(ok=latency < 1.0, latency=latency, comm_failed=c.is_failed())
        if work:
            # Work.wait() leaves the op in flight; abort() then ends it.
            result["pending_after_interrupt"] = not work.is_completed()
            c.abort("test over")
            deadline = time.monotonic() + 5
            while not work.is_completed() and time.monotonic() < deadline:
                time.sleep(0.01)
            result["status_after_abort"] = work.status
    else:
        # A pure-Python thread counts while the recv blocks: it can only run
        # if the recv released the GIL.
        ran_at, stop = [], threading.Event()

        def count():
            n = 0
            while not stop.is_set():
                n += 1
                if n % 1000 == 0:
                    ran_at.append(time.monotonic())

        counter = threading.Thread(target=count)
        start = time.monotonic()
        counter.start()
        try:
            c.recv(buf, peer=1, timeout=0.5)
            result["error"] = "recv returned"
        except comms.Error as e:
            took = time.monotonic() - start
            stop.set()
            counter.join()
            # Ran in the middle of the recv, away from its start and end.
            mid = sum(1 for t in ran_at if start + 0.15 < t < start + 0.35)
            result.update(ok=e.code == "timeout" and e.op == "recv" and e.rank == 0 and e.comm == "blocked"
                          and 0.4 < took < 5 and mid > 10, code=e.code, op=e.op, rank=e.rank,
                          took=took, python_ran_while_blocked=mid, message=str(e))
    tmp = done_flag + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.rename(tmp, done_flag)
    os._exit(0)


if __name__ == "__main__":
    main()
