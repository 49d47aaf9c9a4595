"""Every op at 1, 2 and 4 ranks: one commsrun job per world size runs all the
checks of rank_ops.py; each check is one test case here."""
import pytest

import rank_ops
from conftest import run_rank_script

_jobs = {}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    def get(n):
        if n not in _jobs:
            out = tmp_path_factory.mktemp("ops%d" % n)
            proc, results = run_rank_script(n, "rank_ops.py", out)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            _jobs[n] = results
        return _jobs[n]
    return get


@pytest.mark.parametrize("check", [fn.__name__ for fn in rank_ops.CHECKS])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_op(job, n, check):
    for rank, results in enumerate(job(n)):
        assert results.get(check) == "ok", "rank %d of %d: %s" % (rank, n, results.get(check))
