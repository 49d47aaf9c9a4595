"""One rank of the DTensor / DeviceMesh / functional collectives / FSDP2 /
DDP program that test_torch_dtensor.py runs at world size 4 over backend
"comms" and over torch's "gloo", then compares.

usage: rank_torch_dtensor.py OUT_DIR BACKEND   (BACKEND: comms or gloo)
DTENSOR_SECTIONS=funcol,fsdp runs only those sections (by hand, to debug).

A (dp=2, tp=2) DeviceMesh on the CPU over the world group of BACKEND, then:
  mesh          each rank's coordinate, its dp and tp groups' members and
                backend (for comms: the comms backend, and the device the
                split route binds)
  redistribute  Shard(0)->Replicate, Replicate->Shard(0), Partial(sum|max)->
                Replicate, Partial->Shard(0), Shard(0)->Shard(1) of seeded
                tensors (float32 even, int64 uneven, bfloat16) on the 2-D
                mesh and on each 1-D submesh; each rank's local tensor and
                the full tensor
  funcol        torch.distributed._functional_collectives over the dp and tp
                groups and the world: all_reduce (sum/max/min/avg),
                all_reduce_coalesced, all_gather (dims 0 and 1),
                reduce_scatter, all_to_all_single (even and uneven),
                broadcast from group rank 1
  tp_fsdp       a small MLP, ColwiseParallel/RowwiseParallel on tp,
                fully_shard (FSDP2) on dp, 3 SGD steps
  fsdp          fully_shard on a 1-D world mesh (per layer and root; the
                output layer's 5 rows leave rank 3 an empty shard), 3 SGD
                steps; each rank's shards and the full parameters
  ddp_dp        DistributedDataParallel on the dp subgroup (ranks seed their
                models differently: DDP's broadcast makes them agree)
Every input is a pure function of (seed, rank, step), defined here, so the
test recomputes the expectation from the same functions without any
collective. Each rank writes OUT_DIR/rank<R>.json: {section: results or
{"error": text}}. Sections run in order with a barrier after each, so one
that fails is reported and the others still run.
"""
import datetime
import json
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist

WORLD = 4
MESH_SHAPE = (2, 2)
DIM_NAMES = ("dp", "tp")
STEPS = 3
LR = 0.1
# The tensors redistributed: (name, shape, dtype). 7 rows and 5 columns do
# not divide by 2 or 4 (DTensor pads), bfloat16 goes through as bytes or as
# its own type depending on the backend.
TENSORS = [("f32", (8, 12), torch.float32), ("i64", (7, 5), torch.int64), ("bf16", (4, 6), torch.bfloat16)]
# (name, source placement, target placement) applied to every mesh dim.
REDISTRIBUTIONS = [
    ("shard0_to_replicate", "S0", "R"),
    ("replicate_to_shard0", "R", "S0"),
    ("partial_sum_to_replicate", "Psum", "R"),
    ("partial_max_to_replicate", "Pmax", "R"),
    ("partial_sum_to_shard0", "Psum", "S0"),
    ("shard0_to_shard1", "S0", "S1"),
]
MESHES = ["2d", "dp", "tp"]
MLP_SIZES = (6, 10, 5)  # in, hidden, out: hidden 10 and out 5 shard unevenly over 4


# --- the inputs, pure functions of their arguments (the test imports them) ---

def gen(*key):
    seed = 0
    for k in key:
        seed = seed * 1000003 + int(k)
    return torch.Generator().manual_seed(seed % (1 << 62))


def _spec(name):
    i = [t[0] for t in TENSORS].index(name)
    return i, TENSORS[i][1], TENSORS[i][2]


def global_tensor(name):
    """The seeded global tensor `name`: small integers, exact in its dtype
    and in every sum of 4 of them (so any reduction order gives the same)."""
    i, shape, dtype = _spec(name)
    return torch.randint(-9, 10, shape, generator=gen(11, i)).to(dtype)


def partial_local(name, rank):
    """Rank `rank`'s local value of a Partial DTensor: its own integers."""
    i, shape, dtype = _spec(name)
    return torch.randint(-9, 10, shape, generator=gen(12, i, rank)).to(dtype)


def funcol_input(rank, rows=4, cols=3, salt=0):
    return torch.randint(-20, 21, (rows, cols), generator=gen(13, rank, rows, salt)).to(torch.float32)


def a2a_split(i, j):
    """Rows group rank i sends to group rank j in the uneven all_to_all_single."""
    return (i + 2 * j) % 3 + 1


def mlp(seed):
    torch.manual_seed(seed)
    d_in, d_hidden, d_out = MLP_SIZES
    return torch.nn.Sequential(torch.nn.Linear(d_in, d_hidden), torch.nn.ReLU(), torch.nn.Linear(d_hidden, d_out))


def batch(step, who, rows=3):
    g = gen(14, step, who)
    x = torch.randn(rows, MLP_SIZES[0], generator=g)
    y = torch.randn(rows, MLP_SIZES[2], generator=g)
    return x, y


def mesh_groups(rank):
    """The members of `rank`'s group on each mesh view, as DeviceMesh lays a
    row-major (2, 2) mesh out: dp varies fastest across rows, tp within."""
    dp_coord, tp_coord = divmod(rank, MESH_SHAPE[1])
    return {"2d": list(range(WORLD)), "dp": [tp_coord + MESH_SHAPE[1] * i for i in range(MESH_SHAPE[0])],
            "tp": [dp_coord * MESH_SHAPE[1] + i for i in range(MESH_SHAPE[1])]}


def as_list(t):
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.tolist()


# --- the sections ---

def section_mesh(mesh, rank, backend):
    out = {"coordinate": mesh.get_coordinate(),
           "groups": {"dp": dist.get_process_group_ranks(mesh.get_group("dp")),
                      "tp": dist.get_process_group_ranks(mesh.get_group("tp"))},
           "group_backends": {d: str(dist.get_backend(mesh.get_group(d))) for d in DIM_NAMES}}
    if backend == "comms":
        import comms.torch
        out["comms_backends"] = {d: json.loads(comms.torch.describe(mesh.get_group(d)))["backend"]
                                 for d in DIM_NAMES}
        out["comms_backends"]["world"] = json.loads(comms.torch.describe())["backend"]
        # COMMS_ROUTE=split carves the subgroups from the world, which binds to the cpu
        out["comms_devices"] = {d: json.loads(comms.torch.describe(mesh.get_group(d)))["device"] for d in DIM_NAMES}
    return out


def placements(spec, ndim):
    from torch.distributed.tensor import Partial, Replicate, Shard
    one = {"S0": Shard(0), "S1": Shard(1), "R": Replicate(), "Psum": Partial("sum"), "Pmax": Partial("max")}[spec]
    return [one] * ndim


def section_redistribute(mesh, rank, backend):
    from torch.distributed.tensor import DTensor, distribute_tensor
    views = {"2d": mesh, "dp": mesh["dp"], "tp": mesh["tp"]}
    out = {}
    for view in MESHES:
        m = views[view]
        for name, _, _ in TENSORS:
            for case, src, dst in REDISTRIBUTIONS:
                if src.startswith("P"):
                    d = DTensor.from_local(partial_local(name, rank), m, placements(src, m.ndim), run_check=False)
                else:
                    d = distribute_tensor(global_tensor(name), m, placements(src, m.ndim))
                before = d.to_local().clone()
                r = d.redistribute(m, placements(dst, m.ndim))
                out["%s/%s/%s" % (view, name, case)] = {
                    "before": as_list(before), "local": as_list(r.to_local()), "full": as_list(r.full_tensor()),
                    "placements": [str(p) for p in r.placements]}
    return out


def section_funcol(mesh, rank, backend):
    import torch.distributed._functional_collectives as funcol
    # (mesh, dim) for dp, the 1-D submesh for tp, the ProcessGroup for the world.
    groups = {"dp": (mesh, 0), "tp": mesh["tp"], "world": dist.group.WORLD}
    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
    out = {}
    for gname, group in groups.items():
        members = mesh_groups(rank)["2d" if gname == "world" else gname]
        me, n = members.index(rank), len(members)
        x = funcol_input(rank)
        res = {}
        for op in ("sum", "max", "min", "avg"):
            res["all_reduce_" + op] = as_list(funcol.wait_tensor(funcol.all_reduce(x, op, group)))
        res["input_unchanged"] = torch.equal(x, funcol_input(rank))
        res["all_reduce_coalesced"] = [as_list(funcol.wait_tensor(t)) for t in funcol.all_reduce_coalesced(
            [x, funcol_input(rank, 2, 5, salt=1)], "sum", group)]
        res["all_gather_dim0"] = as_list(funcol.wait_tensor(gather(x, 0, group)))
        res["all_gather_dim1"] = as_list(funcol.wait_tensor(gather(x, 1, group)))
        res["reduce_scatter_sum"] = as_list(funcol.wait_tensor(scatter(x, "sum", 0, group)))
        res["all_to_all_even"] = as_list(funcol.wait_tensor(funcol.all_to_all_single(x, None, None, group)))
        inp = [a2a_split(me, j) for j in range(n)]
        outp = [a2a_split(i, me) for i in range(n)]
        y = funcol_input(rank, sum(inp), 3, salt=2)
        res["all_to_all_uneven"] = as_list(funcol.wait_tensor(funcol.all_to_all_single(y, outp, inp, group)))
        res["broadcast_from_1"] = as_list(funcol.wait_tensor(funcol.broadcast(x, 1, group)))  # src: group rank
        out[gname] = res
    return out


def _params_full(model):
    from torch.distributed.tensor import DTensor
    return {k: as_list(v.full_tensor() if isinstance(v, DTensor) else v) for k, v in model.named_parameters()}


def _params_local(model):
    from torch.distributed.tensor import DTensor
    return {k: as_list(v.to_local() if isinstance(v, DTensor) else v) for k, v in model.named_parameters()}


def _train(model, step_batch):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = step_batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def section_tp_fsdp(mesh, rank, backend):
    """Tensor parallel on tp, FSDP2 on dp: the tp ranks of one dp row see
    the same batch, the two rows different ones."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    model = mlp(seed=5)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    dp_coord = mesh.get_coordinate()[0]
    out = {"placements": {k: [str(p) for p in v.placements] for k, v in model.named_parameters()}}
    out["losses"] = _train(model, lambda step: batch(step, dp_coord, rows=4))
    out["params"] = _params_full(model)
    return out


def section_fsdp(mesh, rank, backend):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    world = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
    model = mlp(seed=6)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=world)
    fully_shard(model, mesh=world)
    out = {"initial_local": _params_local(model)}
    out["losses"] = _train(model, lambda step: batch(step, 100 + rank))
    out["local"] = _params_local(model)
    out["params"] = _params_full(model)
    return out


def section_ddp_dp(mesh, rank, backend):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(mlp(seed=7 + rank), process_group=mesh.get_group("dp"))
    out = {"losses": _train(model, lambda step: batch(step, 200 + rank))}
    out["params"] = {k: as_list(v) for k, v in model.module.named_parameters()}
    return out


SECTIONS = [section_mesh, section_redistribute, section_funcol, section_tp_fsdp, section_fsdp, section_ddp_dp]


def main():
    out_dir, backend = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)  # 4 ranks on 2 cores; also one summation order per matmul
    warnings.simplefilter("ignore", FutureWarning)
    if backend == "comms":
        import comms.torch  # noqa: F401  (the one line a trainer adds; the entry point would do too)
    dist.init_process_group(backend, init_method="file://" + os.path.join(out_dir, "store"),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    if dist.get_world_size() != WORLD:
        raise SystemExit("rank_torch_dtensor.py runs at world size %d" % WORLD)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", MESH_SHAPE, mesh_dim_names=DIM_NAMES)
    only = os.environ.get("DTENSOR_SECTIONS")
    results = {"backend": backend}
    for fn in SECTIONS:
        name = fn.__name__[len("section_"):]
        if only and name not in only.split(","):
            continue
        try:
            results[name] = fn(mesh, rank, backend)
        except Exception as e:  # noqa: BLE001  (reported with its section; the test fails on it)
            results[name] = {"error": "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-3000:])}
            print("rank %d: %s failed: %s" % (rank, name, results[name]["error"]), file=sys.stderr, flush=True)
        dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
