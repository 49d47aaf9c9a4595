"""comms.dist.recover and comms.parallel.recover_model_parallel at 4 ranks on
cpu:gloo, through commsrun --keep-going (rank_dist_elastic.py kills rank 1)."""
import os
import subprocess

import pytest

from conftest import COMMSRUN, HERE, PYTHON, job_env


def job(*args):
    cmd = [COMMSRUN, "-n", "4", "--keep-going", "--timeout", "50", "--", PYTHON,
           os.path.join(HERE, "rank_dist_elastic.py")] + list(args)
    env = job_env(COMMS_ELASTIC=1, COMMS_OP_TIMEOUT="20s", COMMS_INIT_TIMEOUT="20s")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=65)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "lost ranks [1]" in out, out[-4000:]
    return out


def expect_lines(out, lines):
    for line in lines:
        assert line + "\n" in out, "missing %r in\n%s" % (line, out[-4000:])


def test_groups_holding_the_lost_rank_are_rebuilt_and_others_kept():
    out = job("groups")
    # Old ranks 0, 2, 3 become 0, 1, 2. A = [0,1,2] -> [0,2] old; B = [2,3] kept.
    expect_lines(out, ["PYRESULT old %d new %d world 3 lost [1] rebuilt ['A'] kept ['B']" % (o, n)
                       for o, n in ((0, 0), (2, 1), (3, 2))])
    expect_lines(out, ["PYGROUP 0 A ranks [0, 1] sum 5 same_comm 0", "PYGROUP 2 A ranks [0, 1] sum 5 same_comm 0",
                       "PYGROUP 3 A none", "PYGROUP 0 B none", "PYGROUP 2 B ranks [1, 2] sum 12 same_comm 1",
                       "PYGROUP 3 B ranks [1, 2] sum 12 same_comm 1"])


@pytest.mark.parametrize("rule", ["drop_replicas", "callable"])
def test_model_parallel_layout_drops_the_replica_of_the_lost_rank(rule):
    out = job("mp", rule)
    # tp=2 at 4 ranks, rank 1 lost: its partner 0 is dropped; 2, 3 are a world of 2, dp 1.
    expect_lines(out, ["PYEXCLUDED 0 dropped [0] initialized 0",
                       "PYMP 2 new 0 world 2 dp_size 1 tp [0, 1] dp [0] tp_sum 12 dp_sum 4",
                       "PYMP 3 new 1 world 2 dp_size 1 tp [0, 1] dp [1] tp_sum 12 dp_sum 8"])


def test_model_parallel_layout_without_a_rule_raises_why():
    out = job("mp", "none")
    for o in (0, 2, 3):
        assert ("PYREFUSED %d invalid_argument" % o) in out, out[-4000:]
        assert ("PYWORLD %d size 3 sum 13" % o) in out, out[-4000:]
    assert "losing ranks [1] of 4 leaves 3 ranks" in out and "not divisible by tp*pp*cp = 2*1*1 = 2" in out, out
