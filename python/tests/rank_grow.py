"""One process of test_grow.py under commsrun: the members make an elastic
comm "world"; rank 0 starts this script again as a newcomer ("newcomer"),
which calls comms.join("world"); the members call comms.admit at every step
until the comm grew. Every rank of the grown comm prints one line. Then
rank 0 closes the admissions and a late newcomer's join raises "aborted"."""
import os
import subprocess
import sys
import time

import numpy as np

import comms


def power_sum(c):
    x = np.full(64, float(2 ** c.rank), np.float64)
    c.all_reduce(x, op="sum")
    return int(x[0])


def report(c, newcomer):
    # One write: the newcomer shares rank 0's stdout.
    os.write(1, ("PYGROWN rank %d name %s epoch %d size %d sum %d newcomer %d\n"
                 % (c.rank, c.name, comms.epoch(c), c.size, power_sum(c), newcomer)).encode())


def member():
    c = comms.new_comm(device="cpu", name="world", elastic=True)
    idle = comms.admit(c)
    os.write(1, ("PYIDLE rank %d same %d\n" % (c.rank, idle is c)).encode())
    child = None
    if c.rank == 0:
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "newcomer"])
    steps = 0
    grown = c
    while grown is c:  # every member sees the same decision at the same call
        power_sum(c)
        time.sleep(0.05)
        grown = comms.admit(c)
        steps += 1
        if steps > 600:
            sys.exit(5)
    report(grown, 0)
    grown.barrier()
    if child is not None and child.wait(timeout=60) != 0:
        sys.exit(6)
    if grown.rank == 0:
        comms.close_admissions(grown)
        late = subprocess.run([sys.executable, os.path.abspath(__file__), "late"], capture_output=True, text=True,
                              timeout=60)
        os.write(1, ("PYLATE exit %d %s\n" % (late.returncode, late.stdout.strip())).encode())


def newcomer():
    c = comms.join("world", timeout=60.0)
    report(c, 1)
    c.barrier()


def late_newcomer():
    start = time.monotonic()
    try:
        comms.join("world", timeout=60.0)
    except comms.Error as e:
        print("code %s in %s" % (e.code, "time" if time.monotonic() - start < 30 else "its timeout"))
        return
    print("admitted")


if __name__ == "__main__":
    {"newcomer": newcomer, "late": late_newcomer}.get(sys.argv[1] if sys.argv[1:] else "", member)()
