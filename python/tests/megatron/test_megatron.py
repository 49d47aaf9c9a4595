"""Megatron-core's own parallel_state over backend "comms" (rank_megatron.py
runs the scenarios of one commsrun job): every group of several layouts by
value at 4 ranks on cpu:gloo (each COMMS_ROUTE) and cpu:ucx, and at 8 ranks;
Megatron's NCCL options reaching each group; ten destroy/reload cycles with
flat counts; a tensor-parallel MLP against one rank's."""
import os

import pytest

from conftest import BUILD, job_env, run_rank_script

pytest.importorskip("torch")
pytest.importorskip("megatron.core", reason="megatron-core is not in this environment (it needs Python 3.12)")
if not os.path.exists(os.path.join(BUILD, "python", "comms", "torch", "__init__.py")):
    pytest.skip("comms.torch is not built (meson option torch_backend)", allow_module_level=True)

UCX = os.environ.get("COMMS_UCX_ENABLED", "1") == "1"
ROUTES = {"direct": dict(COMMS_ROUTE="direct"), "split": dict(COMMS_ROUTE="split"),
          "device_id": dict(COMMS_ROUTE="direct", TORCH_DEVICE_ID="cpu:0")}
SCRIPT = os.path.join("megatron", "rank_megatron.py")

# Each rank spends seconds of CPU importing Megatron (about 8 s here), more
# than most scenarios take, so one job runs several, and 8 ranks run once:
# on ucx where it is built, else on gloo. Every route at 4 ranks on gloo and
# the direct one on ucx. The options need a lazy
# cuda:nccl beside the CPU backend (they show without a GPU); NCCL options
# refused without it are checked on gloo at 4 ranks, direct.
JOBS = {  # id: (ranks, COMMS_BACKEND, route, scenarios in order)
    "gloo4-direct": (4, "cpu:gloo", "direct", ["groups"]),
    "gloo4-split": (4, "cpu:gloo,cuda:nccl", "split", ["groups", "options"]),
    "gloo4-device_id": (4, "cpu:gloo,cuda:nccl", "device_id", ["groups", "options"]),
    "gloo4-direct-nccl": (4, "cpu:gloo,cuda:nccl", "direct", ["cycles", "options"]),
    "gloo2-mlp": (2, "cpu:gloo", "direct", ["mlp"]),
}
if UCX:
    JOBS.update({"ucx4-direct": (4, "cpu:ucx,cuda:nccl", "direct", ["cycles", "groups"]),
                 "ucx8-direct": (8, "cpu:ucx", "direct", ["groups"])})
else:
    JOBS["gloo8-direct"] = (8, "cpu:gloo", "direct", ["groups"])
TIMEOUT = {"groups": 150, "options": 100, "cycles": 400, "mlp": 100}
_done = {}


def jobs_with(scenario):
    return [job for job, spec in JOBS.items() if scenario in spec[3]]


def results_of(tmp_path_factory, job, scenario):
    """The job's results (run on first use), with `scenario` passed on every rank."""
    if job not in _done:
        n, backend, route, scenarios = JOBS[job]
        out = tmp_path_factory.mktemp(job)
        _done[job] = run_rank_script(n, SCRIPT, out, ",".join(scenarios), timeout=sum(TIMEOUT[s] for s in scenarios),
                                     env=job_env(COMMS_BACKEND=backend, **ROUTES[route]))
    proc, results = _done[job]
    for rank, result in enumerate(results):
        checks = result["checks"].get(scenario)
        assert checks is not None, "rank %d of %s: %s did not run (%s)" % (rank, job, scenario, result["checks"])
        failed = {k: v for k, v in checks.items() if v != "ok"}
        assert checks and not failed, "rank %d of %s: %s" % (rank, job, failed)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results


@pytest.mark.parametrize("job", jobs_with("groups"))
def test_every_group_by_value(tmp_path_factory, job):
    n = JOBS[job][0]
    results = results_of(tmp_path_factory, job, "groups")
    layouts = set(results[0]["checks"]["groups"]) - {"refuses_nccl_options_without_nccl"}
    assert len(layouts) == (5 if n == 4 else 4), results[0]["checks"]
    if n == 4 and "cuda:" not in JOBS[job][1]:
        assert "refuses_nccl_options_without_nccl" in results[0]["checks"]["groups"]
    # Every rank proved the same groups: a group's members agree on its member list.
    for layout in layouts:
        for rank, result in enumerate(results):
            for name, members in result["members"][layout].items():
                assert rank in members, (layout, name, rank, members)
                for other in members:
                    assert results[other]["members"][layout][name] == members, (layout, name, rank, other)


@pytest.mark.parametrize("job", jobs_with("options"))
def test_megatron_options_reach_the_nccl_backend(tmp_path_factory, job):
    results = results_of(tmp_path_factory, job, "options")
    configured = results[0]["configuration"]
    assert configured["tp"]["hints"] == {"cga_cluster_size": "2", "max_ctas": "8", "min_ctas": "2",
                                         "high_priority_stream": "0"}
    assert configured["pp"]["priority"] == "high" and configured["tp"]["priority"] != "high"


@pytest.mark.parametrize("job", jobs_with("cycles"))
def test_ten_destroy_and_reload_cycles_leave_counts_flat(tmp_path_factory, job):
    counts = results_of(tmp_path_factory, job, "cycles")[0]["counts"]
    print("%s rank 0 counts: start %s" % (job, counts["start"]))
    for phase in ("without", "with"):
        print("  %s destroy_unreferenced_groups: %s" % (phase, [(r["comms"], r["fds"], r["threads"])
                                                          for r in counts[phase]]))
    assert counts["released_after_without"] > 0


def test_tensor_parallel_mlp_equals_one_rank(tmp_path_factory):
    results_of(tmp_path_factory, "gloo2-mlp", "mlp")
