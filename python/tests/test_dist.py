"""comms.dist and comms.parallel at 1, 2 and 4 ranks, on both COMMS_ROUTE
values: one commsrun job per (route, size) runs every check of rank_dist.py."""
import pytest

import rank_dist
from conftest import job_env, run_rank_script

_jobs = {}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    def get(route, n):
        if (route, n) not in _jobs:
            out = tmp_path_factory.mktemp("dist-%s-%d" % (route, n))
            proc, results = run_rank_script(n, "rank_dist.py", out, env=job_env(COMMS_ROUTE=route))
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            _jobs[(route, n)] = results
        return _jobs[(route, n)]
    return get


@pytest.mark.parametrize("check", [fn.__name__ for fn in rank_dist.CHECKS] + ["destroyed"])
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("route", ["direct", "split"])
def test_dist(job, route, n, check):
    for rank, results in enumerate(job(route, n)):
        assert results.get(check) == "ok", "rank %d of %d (%s): %s" % (rank, n, route, results.get(check))
