"""DTensor, DeviceMesh, functional collectives, FSDP2 and DDP over backend
"comms" against the same program over torch's "gloo" (issue item 3).

rank_torch_dtensor.py runs at world size 4 under commsrun on a (dp=2, tp=2)
CPU mesh, once over gloo and once over comms per comms backend (cpu:gloo,
cpu:ucx, and cpu:gloo with COMMS_ROUTE=split, where the mesh's subgroups are
split from the world comm). Every section of every run is checked two ways:
  - against an expectation computed here, without any collective, from the
    seeded inputs the rank script defines (the global tensor a
    redistribution must give back, the sum over the group's members, a
    single-process model trained on the whole batch);
  - for comms, against gloo's run: exactly where the math is exact (every
    collective and redistribution moves small integers), within 1e-6
    relative for training.
"""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import PYTHON, job_env, run_job  # noqa: E402

import rank_torch_dtensor as prog  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "rank_torch_dtensor.py")
# target: (torch backend, environment of the ranks). The split route carves
# DeviceMesh's subgroups from the world comm instead of bootstrapping each.
TARGETS = {"gloo": ("gloo", {}),
           "comms-cpu:gloo": ("comms", {"COMMS_BACKEND": "cpu:gloo"}),
           "comms-cpu:ucx": ("comms", {"COMMS_BACKEND": "cpu:ucx"}),
           "comms-cpu:gloo-split": ("comms", {"COMMS_BACKEND": "cpu:gloo", "COMMS_ROUTE": "split"})}
SECTIONS = ["mesh", "redistribute", "funcol", "tp_fsdp", "fsdp", "ddp_dp"]
TRAINING = {"tp_fsdp", "fsdp", "ddp_dp"}
# comms against gloo in training: the same algorithms on the same inputs;
# only a different summation order of 4 values could differ.
VS_GLOO = dict(rtol=1e-6, atol=1e-7)
# against the single-process reference: tensor parallelism and sharding add
# partial sums in another order than one matmul does.
VS_REFERENCE = dict(rtol=2e-5, atol=1e-6)

_runs = {}


def comms_torch_built():
    """Whether comms.torch imports; where the build has it (COMMS_TORCH_BUILT=1,
    set by Meson) an import that fails is a failure, not a skip."""
    probe = subprocess.run([sys.executable, "-c", "import comms.torch"], env=job_env(), capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0 and os.environ.get("COMMS_TORCH_BUILT") == "1":
        pytest.fail("comms.torch is built but does not import:\n" + probe.stderr)
    return probe.returncode == 0


def results(target, tmp_path_factory):
    """Every rank's results of one run (run once per target per session)."""
    if target not in _runs:
        if target.startswith("comms"):
            if not comms_torch_built():
                pytest.skip("comms.torch not built")
            if "ucx" in target and os.environ.get("COMMS_UCX_ENABLED") == "0":
                pytest.skip("UCX backend not built")
        backend, extra = TARGETS[target]
        out = tmp_path_factory.mktemp(target.replace(":", "_"))
        env = {k: v for k, v in job_env(**extra).items() if k != "COMMS_ROUTE" or "COMMS_ROUTE" in extra}
        proc = run_job(prog.WORLD, [PYTHON, SCRIPT, str(out), backend], env=env, timeout=150)
        runs = []
        for r in range(prog.WORLD):
            path = os.path.join(str(out), "rank%d.json" % r)
            if not os.path.exists(path):
                _runs[target] = "rank %d wrote no results (exit %d):\n%s\n%s" % (
                    r, proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
                break
            with open(path) as f:
                runs.append(json.load(f))
        else:
            _runs[target] = runs if proc.returncode == 0 else "exit %d:\n%s" % (proc.returncode,
                                                                                  proc.stderr[-3000:])
    if isinstance(_runs[target], str):
        pytest.fail("%s: %s" % (target, _runs[target]))
    return _runs[target]


def section(runs, name, target):
    out = []
    for rank, res in enumerate(runs):
        got = res.get(name)
        assert got is not None, "%s rank %d: no section %s" % (target, rank, name)
        assert "error" not in got, "%s rank %d, %s failed:\n%s" % (target, rank, name, got["error"])
        out.append(got)
    return out


# --- comparing ---

def same(a, b, where, tol=None):
    """a == b, recursively (dict keys, list shapes); floats within tol if given."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), "%s: keys %s vs %s" % (
            where, sorted(a), sorted(b) if isinstance(b, dict) else b)
        for k in a:
            same(a[k], b[k], "%s/%s" % (where, k), tol)
    elif isinstance(a, list) and tol is not None and a and not isinstance(a[0], (dict, str)):
        ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
        assert ta.shape == tb.shape, "%s: shape %s vs %s" % (where, list(ta.shape), list(tb.shape))
        assert torch.allclose(ta, tb, **tol), "%s: max difference %g\n%s\nvs\n%s" % (
            where, (ta - tb).abs().max().item(), a, b)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), "%s: %r vs %r" % (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (where, i), tol)
    elif tol is not None and isinstance(a, float):
        assert abs(a - b) <= tol["atol"] + tol["rtol"] * abs(b), "%s: %r vs %r" % (where, a, b)
    else:
        assert a == b, "%s: %r vs %r" % (where, a, b)


def exact(actual, expected, where):
    """A result (nested lists) equals a torch tensor exactly, shape included."""
    got = torch.tensor(actual, dtype=torch.float64)
    want = expected.to(torch.float64)
    if want.numel() == 0:  # json keeps no shape for an empty shard: [] (or [[], ...])
        assert got.numel() == 0, "%s: %s, expected nothing" % (where, got)
        return
    assert got.shape == want.shape, "%s: shape %s, expected %s" % (where, list(got.shape), list(want.shape))
    assert torch.equal(got, want), "%s:\n%s\nexpected\n%s" % (where, got, want)


def close(actual, expected, where, tol=VS_REFERENCE):
    got = torch.tensor(actual, dtype=torch.float64)
    want = torch.as_tensor(expected).detach().to(torch.float64)
    assert got.shape == want.shape, "%s: shape %s, expected %s" % (where, list(got.shape), list(want.shape))
    assert torch.allclose(got, want, **tol), "%s: max difference %g\n%s\nexpected\n%s" % (
        where, (got - want).abs().max().item(), got, want)


# --- the independent expectations ---

def coordinates(rank, view):
    dp, tp = divmod(rank, prog.MESH_SHAPE[1])
    return {"2d": (dp, tp), "dp": (dp,), "tp": (tp,)}[view]


def view_shape(view):
    return {"2d": prog.MESH_SHAPE, "dp": prog.MESH_SHAPE[:1], "tp": prog.MESH_SHAPE[1:]}[view]


def chunk(t, dim, n, i):
    """torch.chunk's i-th of n pieces along dim (DTensor's even sharding), or
    an empty one when torch.chunk gives fewer than n pieces."""
    pieces = torch.chunk(t, n, dim)
    if i < len(pieces):
        return pieces[i]
    shape = list(t.shape)
    shape[dim] = 0
    return t.new_empty(shape)


def local_of(full, spec, view, rank):
    """The rank's local piece of `full` laid out as `spec` on every dim of
    the view: mesh dim 0 splits first, mesh dim 1 splits its piece."""
    t = full
    if spec in ("S0", "S1"):
        for size, c in zip(view_shape(view), coordinates(rank, view)):
            t = chunk(t, int(spec[1]), size, c)
    return t


def redistribution_value(name, src, view, rank):
    """The global value of the DTensor before (and after) redistribution."""
    if not src.startswith("P"):
        return prog.global_tensor(name)
    locals_ = torch.stack([prog.partial_local(name, q) for q in prog.mesh_groups(rank)[view]])
    return locals_.sum(0) if src == "Psum" else locals_.max(0).values


# --- the checks, one per section: results of every rank -> AssertionError ---

def check_mesh(res, target):
    for rank, r in enumerate(res):
        assert r["coordinate"] == list(coordinates(rank, "2d")), "rank %d: coordinate %s" % (rank, r["coordinate"])
        groups = prog.mesh_groups(rank)
        assert r["groups"] == {"dp": groups["dp"], "tp": groups["tp"]}, "rank %d: groups %s" % (rank, r["groups"])
        backend, extra = TARGETS[target]
        assert r["group_backends"] == {"dp": backend, "tp": backend}, r["group_backends"]
        if backend == "comms":
            want = extra["COMMS_BACKEND"]
            assert r["comms_backends"] == {"dp": want, "tp": want, "world": want}, \
                "rank %d: %s" % (rank, r["comms_backends"])
            device = "cpu" if extra.get("COMMS_ROUTE") == "split" else None
            assert r["comms_devices"] == {"dp": device, "tp": device}, "rank %d: %s" % (rank, r["comms_devices"])


def check_redistribute(res, target):
    for rank, r in enumerate(res):
        for view in prog.MESHES:
            ndim = len(view_shape(view))
            for name, _, _ in prog.TENSORS:
                for case, src, dst in prog.REDISTRIBUTIONS:
                    key = "%s/%s/%s" % (view, name, case)
                    where = "rank %d %s" % (rank, key)
                    got = r[key]
                    value = redistribution_value(name, src, view, rank)
                    before = prog.partial_local(name, rank) if src.startswith("P") else local_of(value, src, view, rank)
                    exact(got["before"], before, where + " before")
                    exact(got["local"], local_of(value, dst, view, rank), where + " local")
                    exact(got["full"], value, where + " full_tensor")
                    assert got["placements"] == [str(p) for p in prog.placements(dst, ndim)], where


def check_funcol(res, target):
    for rank, r in enumerate(res):
        for gname in ("dp", "tp", "world"):
            members = prog.mesh_groups(rank)["2d" if gname == "world" else gname]
            me, n = members.index(rank), len(members)
            got = r[gname]
            where = "rank %d %s" % (rank, gname)
            xs = torch.stack([prog.funcol_input(q) for q in members])
            exact(got["all_reduce_sum"], xs.sum(0), where + " all_reduce sum")
            exact(got["all_reduce_max"], xs.max(0).values, where + " all_reduce max")
            exact(got["all_reduce_min"], xs.min(0).values, where + " all_reduce min")
            exact(got["all_reduce_avg"], xs.sum(0) / n, where + " all_reduce avg")
            assert got["input_unchanged"] is True, where + ": all_reduce changed its input"
            exact(got["all_reduce_coalesced"][0], xs.sum(0), where + " all_reduce_coalesced[0]")
            exact(got["all_reduce_coalesced"][1], sum(prog.funcol_input(q, 2, 5, salt=1) for q in members),
                  where + " all_reduce_coalesced[1]")
            exact(got["all_gather_dim0"], torch.cat(list(xs), 0), where + " all_gather dim 0")
            exact(got["all_gather_dim1"], torch.cat(list(xs), 1), where + " all_gather dim 1")
            exact(got["reduce_scatter_sum"], chunk(xs.sum(0), 0, n, me), where + " reduce_scatter")
            exact(got["all_to_all_even"], torch.cat([chunk(x, 0, n, me) for x in xs]), where + " all_to_all even")
            pieces = []
            for i, q in enumerate(members):
                splits = [prog.a2a_split(i, j) for j in range(n)]
                y = prog.funcol_input(q, sum(splits), 3, salt=2)
                pieces.append(torch.split(y, splits)[me])
            exact(got["all_to_all_uneven"], torch.cat(pieces), where + " all_to_all uneven")
            exact(got["broadcast_from_1"], xs[1], where + " broadcast from group rank 1")


def reference_training(model, batches_per_step):
    """Single-process SGD on the mean of the per-replica losses (what data
    parallelism with averaged gradients computes); returns the losses of
    each replica per step and the final parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=prog.LR)
    losses = []
    for step in range(prog.STEPS):
        per_replica = [torch.nn.functional.mse_loss(model(x), y) for x, y in batches_per_step(step)]
        opt.zero_grad()
        (sum(per_replica) / len(per_replica)).backward()
        opt.step()
        losses.append([loss.item() for loss in per_replica])
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


def names(model_params):
    return {k.replace("_fsdp_wrapped_module.", "").replace("module.", ""): v for k, v in model_params.items()}


def check_params(got, want, where):
    got = names(got)
    assert sorted(got) == sorted(want), "%s: parameters %s, expected %s" % (where, sorted(got), sorted(want))
    for k in want:
        close(got[k], want[k], "%s %s" % (where, k))


def check_tp_fsdp(res, target):
    dp_size = prog.MESH_SHAPE[0]
    losses, params = reference_training(prog.mlp(seed=5), lambda step: [prog.batch(step, c, rows=4)
                                                                       for c in range(dp_size)])
    for rank, r in enumerate(res):
        dp = coordinates(rank, "2d")[0]
        close(r["losses"], [step[dp] for step in losses], "rank %d losses" % rank)
        check_params(r["params"], params, "rank %d" % rank)
        # TP on tp and FSDP on dp: every parameter is sharded over both dims.
        for k, p in r["placements"].items():
            assert len(p) == 2 and "Replicate" not in "".join(p), "rank %d %s: placements %s" % (rank, k, p)


def check_fsdp(res, target):
    model = prog.mlp(seed=6)
    initial = {k: v.detach().clone() for k, v in model.named_parameters()}
    losses, params = reference_training(model, lambda step: [prog.batch(step, 100 + q) for q in range(prog.WORLD)])
    for rank, r in enumerate(res):
        close(r["losses"], [step[rank] for step in losses], "rank %d losses" % rank)
        check_params(r["params"], params, "rank %d" % rank)
        # FSDP2 shards dim 0 as torch.chunk does: a swapped shard fails here.
        init_local, final_local = names(r["initial_local"]), names(r["local"])
        for k in params:
            exact(init_local[k], chunk(initial[k], 0, prog.WORLD, rank), "rank %d initial shard of %s" % (rank, k))
            want = chunk(params[k], 0, prog.WORLD, rank)
            if want.numel():
                close(final_local[k], want, "rank %d final shard of %s" % (rank, k))
            else:
                assert torch.tensor(final_local[k]).numel() == 0, "rank %d: %s has a shard" % (rank, k)


def check_ddp_dp(res, target):
    for rank, r in enumerate(res):
        members = prog.mesh_groups(rank)["dp"]
        # DDP broadcasts the group's first rank's model (seeded 7 + that rank).
        losses, params = reference_training(prog.mlp(seed=7 + members[0]),
                                            lambda step: [prog.batch(step, 200 + q) for q in members])
        close(r["losses"], [step[members.index(rank)] for step in losses], "rank %d losses" % rank)
        check_params(r["params"], params, "rank %d" % rank)
        same(r["params"], res[members[0]]["params"], "rank %d vs rank %d params" % (rank, members[0]))


CHECKS = {"mesh": check_mesh, "redistribute": check_redistribute, "funcol": check_funcol,
          "tp_fsdp": check_tp_fsdp, "fsdp": check_fsdp, "ddp_dp": check_ddp_dp}


@pytest.mark.parametrize("name", SECTIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_section_matches_expectation(tmp_path_factory, target, name):
    """Each run, gloo's included (so the expectation itself is checked
    against torch's own backend), gives the values computed here."""
    CHECKS[name](section(results(target, tmp_path_factory), name, target), target)


@pytest.mark.parametrize("name", [s for s in SECTIONS if s != "mesh"])
@pytest.mark.parametrize("target", [t for t in TARGETS if t != "gloo"])
def test_section_over_comms_equals_gloo(tmp_path_factory, target, name):
    """The same program over comms gives gloo's results: exactly, except
    training, within 1e-6 relative."""
    comms = section(results(target, tmp_path_factory), name, target)
    gloo = section(results("gloo", tmp_path_factory), name, "gloo")
    tol = VS_GLOO if name in TRAINING else None
    for rank in range(prog.WORLD):
        same(comms[rank], gloo[rank], "%s vs gloo, rank %d %s" % (target, rank, name), tol)


# --- the checks can fail: wrong results, made from gloo's, must not pass ---

def _swap(a, b, key):
    a[key], b[key] = b[key], a[key]


def _as_if_summed(runs):
    """ddp_dp as a backend that sums gradients instead of averaging them
    would leave it: SGD at twice the rate on the mean loss."""
    lr = prog.LR
    prog.LR = lr * prog.MESH_SHAPE[0]
    try:
        _, params = reference_training(prog.mlp(seed=7), lambda step: [prog.batch(step, 200 + q) for q in (0, 2)])
    finally:
        prog.LR = lr
    runs[0]["params"] = {k: v.tolist() for k, v in params.items()}


MUTATIONS = {
    # a wrong member
    "mesh: rank 1's dp group holds rank 2": ("mesh", lambda s: s[1]["groups"].update(dp=[1, 2])),
    "redistribute: tp's partial sum taken over dp's members": (
        "redistribute", lambda s: s[0]["tp/f32/partial_sum_to_replicate"].update(
            full=s[0]["dp/f32/partial_sum_to_replicate"]["full"])),
    "funcol: dp's all_reduce over tp's members": ("funcol", lambda s: s[0]["dp"].update(
        all_reduce_sum=s[0]["tp"]["all_reduce_sum"])),
    "ddp_dp: rank 2 ends with the other dp group's parameters": (
        "ddp_dp", lambda s: s[2].update(params=s[1]["params"])),
    # a wrong reduction
    "redistribute: Partial(max) reduced as a sum": ("redistribute", lambda s: s[3]["2d/i64/partial_max_to_replicate"]
                                                    .update(full=s[3]["2d/i64/partial_sum_to_replicate"]["full"])),
    "funcol: avg not divided": ("funcol", lambda s: s[2]["world"].update(
        all_reduce_avg=s[2]["world"]["all_reduce_sum"])),
    "funcol: max is min": ("funcol", lambda s: s[1]["tp"].update(all_reduce_max=s[1]["tp"]["all_reduce_min"])),
    "ddp_dp: gradients summed, not averaged": ("ddp_dp", _as_if_summed),
    # a swapped shard or block
    "redistribute: dp's Shard(0) pieces swapped": ("redistribute", lambda s: _swap(
        s[0]["dp/f32/replicate_to_shard0"], s[2]["dp/f32/replicate_to_shard0"], "local")),
    "redistribute: 2-D Shard(1) pieces swapped": ("redistribute", lambda s: _swap(
        s[1]["2d/i64/shard0_to_shard1"], s[2]["2d/i64/shard0_to_shard1"], "local")),
    "funcol: all_gather blocks in the wrong order": ("funcol", lambda s: s[1]["world"].update(
        all_gather_dim0=s[1]["world"]["all_gather_dim0"][3:6] + s[1]["world"]["all_gather_dim0"][:3]
        + s[1]["world"]["all_gather_dim0"][6:])),
    "funcol: reduce_scatter gives the other rank's half": ("funcol", lambda s: _swap(
        s[0]["tp"], s[1]["tp"], "reduce_scatter_sum")),
    "fsdp: ranks 0 and 1 hold each other's shard": ("fsdp", lambda s: _swap(s[0]["local"], s[1]["local"], "0.weight")),
    # a small numeric error
    "tp_fsdp: one parameter off by 1e-4": ("tp_fsdp", lambda s: s[3]["params"].update(
        {"2.weight": (torch.tensor(s[3]["params"]["2.weight"]) * (1 + 1e-4)).tolist()})),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_wrong_result_fails_the_checks(tmp_path_factory, mutation):
    """A wrong member, a wrong reduction or a swapped shard, put into gloo's
    results, fails both the expectation and the comparison with gloo."""
    import copy
    name, mutate = MUTATIONS[mutation]
    original = section(results("gloo", tmp_path_factory), name, "gloo")
    wrong = copy.deepcopy(original)
    mutate(wrong)
    with pytest.raises(AssertionError):
        CHECKS[name](wrong, "gloo")
    with pytest.raises(AssertionError):
        same(wrong, original, name, VS_GLOO if name in TRAINING else None)
