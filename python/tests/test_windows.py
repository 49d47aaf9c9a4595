"""One-sided windows from Python: on cpu:ucx at 2 ranks (rank_windows.py
runs every check in one commsrun job), and Gloo saying it has none."""
import numpy as np
import pytest

import comms
import rank_windows
from conftest import run_rank_script


def test_gloo_has_no_windows_and_says_so():
    with comms.new_comm(backend="cpu:gloo", device="cpu", name="win_py", rank=0, world_size=1) as c:
        assert comms.has_windows(c, "cpu") is False
        with pytest.raises(comms.Error) as e:
            comms.register_window(c, np.zeros(8, np.float32))
        assert e.value.code == "unsupported"
        assert "the gloo backend for cpu has no one-sided windows" in str(e.value)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("windows")
    proc, results = run_rank_script(2, "rank_windows.py", out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results


@pytest.mark.parametrize("check", [fn.__name__ for fn in rank_windows.CHECKS])
def test_window_on_ucx_at_2_ranks(job, check):
    for rank, results in enumerate(job):
        assert results.get(check) == "ok", "rank %d: %s" % (rank, results.get(check))
