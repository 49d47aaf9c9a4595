"""torch.distributed over backend "comms" (python/comms/torch): every call
checked by value at 1, 2 and 4 ranks over cpu:gloo and cpu:ucx, groups and
options at 4 ranks on both COMMS_ROUTE values, DDP against torch's gloo, a
killed rank. One commsrun job per configuration runs a rank script."""
import json
import os
import re
import subprocess
import time

import pytest

from conftest import BUILD, COMMSRUN, PYTHON, SOURCE_ROOT, job_env, run_job, run_rank_script

pytest.importorskip("torch")
if not os.path.exists(os.path.join(BUILD, "python", "comms", "torch", "__init__.py")):
    pytest.skip("comms.torch is not built (meson option torch_backend)", allow_module_level=True)

import rank_torch  # noqa: E402
import rank_torch_groups  # noqa: E402

_jobs = {}


def job(script, out, n, **env):
    key = (script, n) + tuple(sorted(env.items()))
    if key not in _jobs:
        proc, results = run_rank_script(n, script, out, env=job_env(**env), timeout=150)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        _jobs[key] = results
    return _jobs[key]


@pytest.mark.parametrize("check", [fn.__name__ for fn in rank_torch.CHECKS])
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("backend", ["cpu:gloo", "cpu:ucx"])
def test_every_call_by_value(tmp_path_factory, backend, n, check):
    out = tmp_path_factory.mktemp("ops")
    for rank, results in enumerate(job("rank_torch.py", out, n, COMMS_BACKEND=backend)):
        assert results.get(check) == "ok", "rank %d of %d (%s): %s" % (rank, n, backend, results.get(check))
        assert results["backend"] == backend, "rank %d ran on %s" % (rank, results["backend"])


@pytest.mark.parametrize("check", [fn.__name__ for fn in rank_torch_groups.CHECKS])
@pytest.mark.parametrize("route", ["direct", "split", "device_id"])
def test_groups_options_lifecycle(tmp_path_factory, route, check):
    out = tmp_path_factory.mktemp("groups")
    # A lazy cuda:nccl shows its configuration without a device (the Megatron
    # tests run it on every route); a split needs a bound parent, and the
    # split routes bind the world's cpu backend. device_id: the direct route
    # with init_process_group(device_id=cpu:0), where torch itself splits.
    backend = "cpu:gloo,cuda:nccl" if route == "direct" else "cpu:gloo"
    env = dict(COMMS_ROUTE="direct", TORCH_DEVICE_ID="cpu:0") if route == "device_id" else dict(COMMS_ROUTE=route)
    for rank, results in enumerate(job("rank_torch_groups.py", out, 4, COMMS_BACKEND=backend, **env)):
        assert results.get(check) == "ok", "rank %d (%s): %s" % (rank, route, results.get(check))


def test_import_registers_the_backend_once():
    code = ("import importlib, torch.distributed as d, comms.torch as t; importlib.reload(t); "
            "print(d.Backend('comms'), d.Backend._plugins['COMMS'].extended_api)")
    proc = subprocess.run([PYTHON, "-c", code], env=job_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["comms", "True"]


def test_options_take_every_knob_of_comms_dist_table_and_give_its_hint():
    # comms.torch.Options reads comms.dist.option_spellings(), the C++ table:
    # every name there is an option here, of its type, and becomes its hint.
    code = ("import json, comms.dist, comms.torch as t\n"
            "sample = {'int': 3, 'bool': True, 'str': 'IB'}\n"
            "out = {}\n"
            "for name, (backend, kind, hint) in comms.dist.option_spellings().items():\n"
            "    o = t.Options(**{name: sample[kind]})\n"
            "    try:\n"
            "        t.Options(**{name: 'x' if kind != 'str' else 3})\n"
            "        wrong = 'accepted'\n"
            "    except ValueError:\n"
            "        wrong = 'refused'\n"
            "    out[name] = [backend, hint, o.to_hints(), getattr(o, name), wrong]\n"
            "print(json.dumps(out))")
    proc = subprocess.run([PYTHON, "-c", code], env=job_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert rows["cga_cluster_size"] == ["nccl", "nccl.cga_cluster_size", {"nccl.cga_cluster_size": "3"}, 3, "refused"]
    assert rows["is_high_priority_stream"] == ["nccl", "nccl.high_priority_stream",
                                               {"nccl.high_priority_stream": "1"}, True, "refused"]
    assert rows["busy_poll"] == ["gloo", "gloo.busy_poll", {"gloo.busy_poll": "1"}, True, "refused"]
    assert rows["net_name"][2] == {"nccl.net_name": "IB"}
    for name, (backend, hint, hints, value, wrong) in rows.items():
        assert list(hints) == [hint] and hint.startswith(backend + "."), (name, hints)
        assert value is not None and wrong == "refused", (name, value, wrong)
    assert len(rows) >= 16, sorted(rows)


def test_a_fresh_interpreter_finds_the_backend_through_its_entry_point(tmp_path):
    # No import of comms: torch loads the registrar named by the entry-point
    # group torch.distributed.backends (build/python/comms.dist-info).
    code = ("import sys, torch, torch.distributed as d; "
            "d.init_process_group('comms', init_method='file://%s', rank=0, world_size=1); "
            "t = torch.full((3,), 2.0); d.all_reduce(t); "
            "print(d.get_backend(), 'comms.torch' in sys.modules, t.tolist()); d.destroy_process_group()"
            % (tmp_path / "store"))
    proc = subprocess.run([PYTHON, "-c", code], env=job_env(COMMS_BACKEND="cpu:gloo"), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[0] == "comms True [2.0, 2.0, 2.0]", proc.stdout


def test_ddp_over_comms_ends_with_gloos_parameters(tmp_path):
    example = os.path.join(SOURCE_ROOT, "examples", "torch_trainer.py")
    finals = {}
    for backend in ("comms", "gloo"):
        path = str(tmp_path / ("%s.pt" % backend))
        store = "file://" + str(tmp_path / ("%s.store" % backend))
        proc = run_job(2, [PYTHON, example, "--backend", backend, "--steps", "8", "--save", path,
                           "--init-method", store], timeout=120)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        finals[backend] = path
    import torch
    comms_params, gloo_params = torch.load(finals["comms"]), torch.load(finals["gloo"])
    assert list(comms_params) == list(gloo_params)
    for name in comms_params:
        assert torch.allclose(comms_params[name], gloo_params[name], rtol=1e-5, atol=1e-6), name
    assert any(not torch.equal(p, torch.zeros_like(p)) for p in comms_params.values())


BY_HAND = r"""
import sys, torch, torch.distributed as dist, comms.torch
dist.init_process_group("comms", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=2)
t = torch.full((3,), dist.get_rank() + 1.0)
dist.all_reduce(t)
g = dist.new_group([1])
if dist.get_rank() == 1:
    dist.all_reduce(t, group=g)
assert t.tolist() == [3.0] * 3, t
dist.barrier()  # rank 0 hosts the TCPStore: nobody may still be using it when it exits
dist.destroy_process_group()
"""


@pytest.mark.parametrize("init", ["env://", "tcp://"])
def test_torch_rendezvous_started_by_hand(tmp_path, init):
    """Two ranks started without a launcher, through torch's TCPStore: env://
    (MASTER_ADDR/MASTER_PORT) and tcp://."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "by_hand.py"
    script.write_text(BY_HAND)
    env = job_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=2)
    url = init if init == "env://" else "tcp://127.0.0.1:%d" % port
    procs = [subprocess.Popen([PYTHON, str(script), url, str(r)], env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    for r, p in enumerate(procs):
        out = p.communicate(timeout=60)[0]
        assert p.returncode == 0, "rank %d: %s" % (r, out[-3000:])


KILLED = r"""
import datetime, os, signal, sys, time, torch, torch.distributed as dist, comms.torch
dist.init_process_group("comms", init_method="file://" + sys.argv[2], rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]), timeout=datetime.timedelta(seconds=float(sys.argv[1])))
t = torch.ones(1 << 16)
start = time.monotonic()
try:
    dist.all_reduce(t)
    if dist.get_rank() == 1:  # the others may still be finishing this op with it
        os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(100):
        dist.all_reduce(t)
    print("rank %d: no error" % dist.get_rank(), flush=True)
except Exception as e:
    print("rank %d: error after %.1f s: %s" % (dist.get_rank(), time.monotonic() - start, e), flush=True)
    os._exit(3)
"""


@pytest.mark.parametrize("backend", ["cpu:gloo", "cpu:ucx"])
def test_a_killed_rank_gives_an_error_on_the_others_not_a_hang(tmp_path, backend):
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    start = time.monotonic()
    # --keep-going: the survivors run on after rank 1 died, to show what they see.
    proc = subprocess.run([COMMSRUN, "-n", "3", "--keep-going", "--timeout", "60", "--", PYTHON, str(script), "5",
                           str(tmp_path / "store")], env=job_env(COMMS_BACKEND=backend), capture_output=True, text=True,
                          timeout=75)
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    for rank in (0, 2):
        # comms' message: comm, rank, op and its sequence number, the failure.
        line = re.search(r"rank %d: error after .*" % rank, out)
        assert line, out[-3000:]
        assert re.search(r"comms\[torch\d+\.0 rank %d/3\] all_reduce #\d+: (peer_failure|timeout|aborted)" % rank,
                         line.group(0)), line.group(0)
    assert "no error" not in out, out[-3000:]
    assert elapsed < 45, "the survivors took %.1f s" % elapsed
