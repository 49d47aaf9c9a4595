"""comms.join and comms.admit at 3 members + 1 newcomer on cpu:gloo, through
commsrun (rank_grow.py); then comms.close_admissions turns a late join away."""
import os

from conftest import HERE, PYTHON, job_env, run_job


def test_a_newcomer_joins_and_the_members_admit_it():
    env = job_env(COMMS_OP_TIMEOUT="20s", COMMS_INIT_TIMEOUT="20s")
    proc = run_job(3, [PYTHON, os.path.join(HERE, "rank_grow.py")], env=env, timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for r in range(3):
        assert "PYIDLE rank %d same 1\n" % r in out, out[-4000:]
    for r in range(4):
        line = "PYGROWN rank %d name world@e1 epoch 1 size 4 sum 15 newcomer %d\n" % (r, 1 if r == 3 else 0)
        assert line in out, out[-4000:]
    assert "PYLATE exit 0 code aborted in time\n" in out, out[-4000:]
