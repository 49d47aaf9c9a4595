"""Megatron-core's own parallel_state over backend "comms" (rank_megatron.py
runs one scenario per commsrun job): every group of several layouts by value
at 4 and 8 ranks on cpu:gloo and cpu:ucx, on each COMMS_ROUTE; Megatron's NCCL
options reaching each group; ten destroy/reload cycles with flat counts; a
tensor-parallel MLP against one rank's."""
import os

import pytest

from conftest import BUILD, job_env, run_rank_script

pytest.importorskip("torch")
pytest.importorskip("megatron.core", reason="megatron-core is not in this environment (it needs Python 3.12)")
if not os.path.exists(os.path.join(BUILD, "python", "comms", "torch", "__init__.py")):
    pytest.skip("comms.torch is not built (meson option torch_backend)", allow_module_level=True)

UCX = os.environ.get("COMMS_UCX_ENABLED", "1") == "1"
BACKENDS = ["cpu:gloo"] + (["cpu:ucx"] if UCX else [])
ROUTES = {"direct": dict(COMMS_ROUTE="direct"), "split": dict(COMMS_ROUTE="split"),
          "device_id": dict(COMMS_ROUTE="direct", TORCH_DEVICE_ID="cpu:0")}
SCRIPT = os.path.join("megatron", "rank_megatron.py")


def run(tmp_path_factory, scenario, n, timeout, **env):
    out = tmp_path_factory.mktemp(scenario)
    proc, results = run_rank_script(n, SCRIPT, out, scenario, env=job_env(**env), timeout=timeout)
    for rank, result in enumerate(results):
        failed = {k: v for k, v in result["checks"].items() if v != "ok"}
        assert result["checks"] and not failed, "rank %d of %d (%s): %s" % (rank, n, env, failed)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results


# Every route at 4 ranks on gloo, the direct one on ucx; 8 ranks on the direct route.
GROUP_JOBS = [(4, "cpu:gloo", r) for r in ROUTES] + [(4, b, "direct") for b in BACKENDS[1:]] + \
             [(8, b, "direct") for b in BACKENDS]


@pytest.mark.parametrize("n,backend,route", GROUP_JOBS)
def test_every_group_by_value(tmp_path_factory, n, backend, route):
    results = run(tmp_path_factory, "groups", n, 400, COMMS_BACKEND=backend, **ROUTES[route])
    layouts = {k for k in results[0]["checks"] if k != "refuses_nccl_options_without_nccl"}
    assert len(layouts) == (5 if n == 4 else 4), results[0]["checks"]
    # Every rank proved the same groups: a group's members agree on its member list.
    for layout in layouts:
        for rank, result in enumerate(results):
            for name, members in result["members"][layout].items():
                assert rank in members, (layout, name, rank, members)
                for other in members:
                    assert results[other]["members"][layout][name] == members, (layout, name, rank, other)


@pytest.mark.parametrize("route", list(ROUTES))
def test_megatron_options_reach_the_nccl_backend(tmp_path_factory, route):
    # A lazy cuda:nccl beside cpu:gloo: the options show without a GPU.
    results = run(tmp_path_factory, "options", 4, 300, COMMS_BACKEND="cpu:gloo,cuda:nccl", **ROUTES[route])
    configured = results[0]["configuration"]
    assert configured["tp"]["hints"] == {"cga_cluster_size": "2", "max_ctas": "8", "min_ctas": "2",
                                         "high_priority_stream": "0"}
    assert configured["pp"]["priority"] == "high" and configured["tp"]["priority"] != "high"


@pytest.mark.parametrize("backend", BACKENDS)
def test_ten_destroy_and_reload_cycles_leave_counts_flat(tmp_path_factory, backend):
    results = run(tmp_path_factory, "cycles", 4, 500, COMMS_BACKEND=backend + ",cuda:nccl")
    counts = results[0]["counts"]
    print("%s rank 0 counts: start %s" % (backend, counts["start"]))
    for phase in ("without", "with"):
        print("  %s destroy_unreferenced_groups: %s" % (phase, [(r["comms"], r["fds"], r["threads"])
                                                          for r in counts[phase]]))
    assert counts["released_after_without"] > 0


def test_tensor_parallel_mlp_equals_one_rank(tmp_path_factory):
    run(tmp_path_factory, "mlp", 2, 200, COMMS_BACKEND="cpu:gloo")
