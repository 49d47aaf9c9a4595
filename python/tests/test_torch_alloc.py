"""CPU tensors allocated through comms.torch (torch's allocate_tensor and
comms.torch.empty) at 2 ranks: on cpu:ucx every collective gives the bits of
ordinary tensors and takes the zero-copy path, memory is freed with the
tensor and outlives the group; on cpu:gloo allocation is refused. One
commsrun job per backend runs rank_torch_alloc.py."""
import pytest

pytest.importorskip("torch")

import rank_torch_alloc  # noqa: E402
from conftest import job_env, run_rank_script  # noqa: E402

_jobs = {}


def job(tmp_path_factory, backend):
    if backend not in _jobs:
        out = tmp_path_factory.mktemp("torch_alloc")
        proc, results = run_rank_script(2, "rank_torch_alloc.py", out, env=job_env(COMMS_BACKEND=backend),
                                        timeout=150)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        _jobs[backend] = results
    return _jobs[backend]


@pytest.mark.parametrize("backend,check", [(backend, fn.__name__) for backend, checks in rank_torch_alloc.CHECKS.items()
                                           for fn in checks])
def test_allocated_tensors_at_2_ranks(tmp_path_factory, backend, check):
    for rank, results in enumerate(job(tmp_path_factory, backend)):
        assert results.get(check) == "ok", "rank %d (%s): %s" % (rank, backend, results.get(check))
