"""Unchanged torch programs under commsrun: commsrun's store
goes by COMMS_STORE, so the program's own TCPStore gets MASTER_ADDR/MASTER_PORT
to itself. The same program with backend "comms" runs under commsrun and
launched by hand (env://), when comms.torch is built."""
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ["COMMS_BUILD_DIR"])
COMMSRUN = os.path.join(BUILD, "tools", "commsrun")
PROGRAM = os.path.join(HERE, "rank_torch_allreduce.py")
TIMEOUT = 90


def environment():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "COMMS_STORE")}
    env["PYTHONPATH"] = os.path.join(BUILD, "python")
    env.setdefault("COMMS_BACKEND", "cpu:gloo")
    return env


def comms_torch_built():
    """Whether comms.torch imports; where the build has it (COMMS_TORCH_BUILT=1,
    set by Meson), an import that fails is a failure, not a skip."""
    probe = subprocess.run([sys.executable, "-c", "import comms.torch"], env=environment(), capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0 and os.environ.get("COMMS_TORCH_BUILT") == "1":
        pytest.fail("comms.torch is built but does not import:\n" + probe.stderr)
    return probe.returncode == 0


def expect_ok(output, world, backend):
    for rank in range(world):
        line = "ok rank=%d world=%d backend=%s sum=%g max=%d" % (rank, world, backend, world * (world + 1) / 2,
                                                                 (world - 1) * 10 + 3)
        assert line in output, output


def under_commsrun(backend, n=2):
    p = subprocess.run([COMMSRUN, "-n", str(n), "--timeout", str(TIMEOUT), "--", sys.executable, PROGRAM, backend],
                       env=environment(), capture_output=True, text=True, timeout=TIMEOUT + 15)
    assert p.returncode == 0, p.stdout + p.stderr
    expect_ok(p.stdout, n, backend)


def by_hand(backend, n=2):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for rank in range(n):
        env = dict(environment(), RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        ranks.append(subprocess.Popen([sys.executable, PROGRAM, backend], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    output = ""
    try:
        for p in ranks:
            output += p.communicate(timeout=TIMEOUT)[0]
    finally:
        for p in ranks:
            p.kill()
    assert all(p.returncode == 0 for p in ranks), output
    expect_ok(output, n, backend)


def test_a_gloo_program_runs_under_commsrun():
    under_commsrun("gloo")


def test_a_comms_program_runs_under_commsrun():
    if not comms_torch_built():
        pytest.skip("comms.torch not built")
    under_commsrun("comms")


def test_a_comms_program_runs_launched_by_hand():
    if not comms_torch_built():
        pytest.skip("comms.torch not built")
    by_hand("comms")
