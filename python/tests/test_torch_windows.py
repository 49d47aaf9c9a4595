"""torch.distributed's one-sided windows (C10D_BACKEND_HAS_WINDOW) on
backend "comms" over cpu:ucx at 2 ranks: rank_torch_windows.py runs every
check in one commsrun job."""
import pytest

pytest.importorskip("torch")

import rank_torch_windows  # noqa: E402
from conftest import job_env, run_rank_script  # noqa: E402


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch_windows")
    proc, results = run_rank_script(2, "rank_torch_windows.py", out, env=job_env(COMMS_BACKEND="cpu:ucx"),
                                    timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results


@pytest.mark.parametrize("check", [fn.__name__ for fn in rank_torch_windows.CHECKS])
def test_torch_window_on_ucx_at_2_ranks(job, check):
    for rank, results in enumerate(job):
        assert results.get(check) == "ok", "rank %d: %s" % (rank, results.get(check))
