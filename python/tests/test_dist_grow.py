"""comms.dist.join_process_group and comms.parallel.admit_model_parallel at 4
ranks on cpu:gloo, through commsrun --keep-going (rank_dist_grow.py kills
rank 3 and starts its replacement)."""
import os
import subprocess

from conftest import COMMSRUN, HERE, PYTHON, job_env


def test_a_replacement_joins_the_world_and_the_collection_grows_back():
    cmd = [COMMSRUN, "-n", "4", "--keep-going", "--timeout", "80", "--", PYTHON,
           os.path.join(HERE, "rank_dist_grow.py")]
    env = job_env(COMMS_ELASTIC=1, COMMS_OP_TIMEOUT="20s", COMMS_INIT_TIMEOUT="20s")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=95)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # A = [1, 3] lost rank 3 in the recovery: [1] since, and the newcomer is no member.
    expected = ["PYGROWN rank 0 newcomer 0 joined [3] world [0, 1, 2, 3] 15 dp [0, 1, 2, 3] 15 A none new none",
                "PYGROWN rank 1 newcomer 0 joined [3] world [0, 1, 2, 3] 15 dp [0, 1, 2, 3] 15 A [1] 2 new 10",
                "PYGROWN rank 2 newcomer 0 joined [3] world [0, 1, 2, 3] 15 dp [0, 1, 2, 3] 15 A none new none",
                "PYGROWN rank 3 newcomer 1 joined [3] world [0, 1, 2, 3] 15 dp [0, 1, 2, 3] 15 A none new 10"]
    expected += ["PYIDLE rank %d grown 0 world 4" % r for r in range(4)]
    for line in expected:
        assert line + "\n" in out, "missing %r in\n%s" % (line, out[-4000:])
