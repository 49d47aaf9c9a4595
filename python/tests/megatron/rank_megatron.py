"""One rank of Megatron-core's own parallel_state over backend "comms".

    rank_megatron.py OUT_DIR SCENARIO[,SCENARIO...]

groups   every group of several layouts proved by value (an all_reduce of
         2**rank), against Megatron's rank lists and comms.parallel's; the
         all-gather twins; NCCL options refused on a world without NCCL
         (at 4 ranks, when COMMS_BACKEND names no cuda:nccl).
options  Megatron's nccl_communicator_config_path and high_priority_stream_groups
         reach each group's NCCL backend as hints (COMMS_BACKEND names cuda:nccl).
cycles   ten build / op / offload+reload / destroy+replay / destroy_model_parallel
         cycles without, then with, comms.torch.destroy_unreferenced_groups():
         live comms, fds and threads per cycle.
mlp      a 2-way tensor-parallel MLP forward and backward against one rank's.

The scenarios run in the order given, in one world (importing Megatron costs
each rank seconds of CPU, so one job serves several), and stop at the first
that fails. Writes {"checks": {scenario: {name: "ok" | error}}, ...} to
OUT_DIR/rank<R>.json. The
world comes from COMMS_ROUTE and TORCH_DEVICE_ID (device_id=), as in
test_torch.py."""
import datetime
import gc
import json
import os
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist

import comms
import comms.parallel
import comms.torch

warnings.filterwarnings("ignore")
from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402

TIMEOUT_MINUTES = 7  # not torch's default (30) nor NCCL Options' (10): a lost timeout shows

# Megatron's names in ProcessGroupCollection, which are comms.parallel's.
COMMS_GROUPS = ["tp", "pp", "mp", "cp", "tp_cp", "dp", "dp_cp", "tp_dp", "tp_dp_cp", "ep", "expt_tp", "tp_ep",
                "tp_ep_pp", "expt_dp", "embd", "pos_embd", "dp_cp_ag", "expt_dp_ag"]
GLOO_GROUPS = {"dp_gloo": lambda: ps.get_data_parallel_group_gloo(),
               "dp_cp_gloo": lambda: ps.get_data_parallel_group_gloo(with_context_parallel=True),
               "expt_dp_gloo": lambda: ps.get_expert_data_parallel_group_gloo()}
# The key of a group in Megatron's nccl_communicator_config_path YAML.
YAML_NAME = {"expt_tp": "ep_tp", "expt_dp": "ep_dp", "tp_ep": "tp_ep_mp", "dp_cp_ag": "dp_cp", "expt_dp_ag": "ep_dp"}

LAYOUTS = {
    4: [dict(tensor_model_parallel_size=2),
        dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, order="tp-pp-dp"),
        dict(tensor_model_parallel_size=2, context_parallel_size=2),
        dict(tensor_model_parallel_size=2, expert_model_parallel_size=2, expert_tensor_parallel_size=1),
        dict(pipeline_model_parallel_size=4, order="tp-cp-ep-pp-dp")],
    8: [dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, context_parallel_size=2),
        dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, order="tp-ep-pp-dp",
             expert_model_parallel_size=2, expert_tensor_parallel_size=1),
        dict(tensor_model_parallel_size=2, context_parallel_size=2, expert_model_parallel_size=4,
             expert_tensor_parallel_size=1),
        dict(tensor_model_parallel_size=4, pipeline_model_parallel_size=2, expert_model_parallel_size=2,
             expert_tensor_parallel_size=2, order="tp-ep-dp-pp")],
}
DEFAULT_ORDER = "tp-cp-ep-dp-pp"


def expect(actual, expected, what):
    if actual != expected:
        raise AssertionError("%s: got %r, expected %r" % (what, actual, expected))


def label(layout):
    short = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
             "context_parallel_size": "cp", "expert_model_parallel_size": "ep",
             "expert_tensor_parallel_size": "etp", "order": "order"}
    return ",".join("%s=%s" % (short[k], v) for k, v in layout.items())


def members(group):
    """The group's members as an all_reduce proves them: each rank adds 2**rank."""
    t = torch.tensor([float(2 ** dist.get_rank())], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    bits = int(t.item())
    return [r for r in range(dist.get_world_size()) if bits >> r & 1]


def comms_plan(layout, world_size):
    config = comms.parallel.ParallelConfig()
    config.tp = layout.get("tensor_model_parallel_size", 1)
    config.pp = layout.get("pipeline_model_parallel_size", 1)
    config.cp = layout.get("context_parallel_size", 1)
    config.ep = layout.get("expert_model_parallel_size", 1)
    config.expert_tp = layout.get("expert_tensor_parallel_size", config.tp)
    config.order = layout.get("order", DEFAULT_ORDER)
    return comms.parallel.plan_model_parallel(config, world_size)["groups"]


def megatron_groups(for_experts, nccl_comm_cfgs=None):
    """Every group Megatron made that this rank is in, by name (None where not
    a member), with the all-gather twins made as its docstring shows."""
    dp_cp_ag, expt_dp_ag = ps.create_all_gather_groups(for_expert_parallelism=for_experts,
                                                       timeout=datetime.timedelta(minutes=TIMEOUT_MINUTES),
                                                       nccl_comm_cfgs=nccl_comm_cfgs)
    collection = ProcessGroupCollection.use_mpu_process_groups()
    collection.dp_cp_ag, collection.expt_dp_ag = dp_cp_ag, expt_dp_ag
    found = {name: getattr(collection, name, None) for name in COMMS_GROUPS}
    found["tp_dp"] = ps.get_tensor_and_data_parallel_group()  # not in the collection
    found.update({name: get() for name, get in GLOO_GROUPS.items()})
    return found


def check_layout(layout, report):
    rank, size = dist.get_rank(), dist.get_world_size()
    ps.initialize_model_parallel(**layout, distributed_timeout_minutes=TIMEOUT_MINUTES, create_gloo_process_groups=True)
    experts = layout.get("expert_model_parallel_size", 1) > 1
    groups = megatron_groups(experts)
    plan = comms_plan(layout, size)
    proven = {}
    for name in sorted(groups):
        group = groups[name]
        base = name.replace("_gloo", "").replace("_ag", "")
        plan_lists = [ranks for ranks in plan.get(base, []) if rank in ranks]
        if name == "expt_dp_ag" and not experts:
            expect(group, None, "expt_dp_ag without expert parallelism")
            continue
        if group is None:
            expect(plan_lists, [], "%s: Megatron made no group for rank %d; comms.parallel's lists" % (name, rank))
            continue
        got = members(group)
        expect(got, dist.get_process_group_ranks(group), "%s: members by value vs Megatron's rank list" % name)
        twin_of_other_order = name.endswith("_ag") and layout.get("order", DEFAULT_ORDER) != DEFAULT_ORDER
        if not twin_of_other_order:  # Megatron builds the twins in its default order only
            expect([got], plan_lists, "%s: members by value vs comms.parallel" % name)
        expect(dist.get_backend(group), "gloo" if name.endswith("_gloo") else "comms", "%s: backend" % name)
        proven[name] = got
    check_twins(groups, layout, proven)
    report[label(layout)] = proven


def check_twins(groups, layout, proven):
    """dp_cp_ag and expt_dp_ag: their own comms, all_gather on the twin while
    reduce_scatter runs on the main group, both results by value."""
    for twin, main in (("dp_cp_ag", "dp_cp"), ("expt_dp_ag", "expt_dp")):
        if groups.get(twin) is None:
            continue
        twin_name = json.loads(comms.torch.describe(groups[twin]))["name"]
        main_name = json.loads(comms.torch.describe(groups[main]))["name"]
        if twin_name == main_name:
            raise AssertionError("%s and %s share the comm %s" % (twin, main, twin_name))
        if layout.get("order", DEFAULT_ORDER) == DEFAULT_ORDER:
            expect(proven[twin], proven[main], "%s members vs %s" % (twin, main))
        rank = dist.get_rank()
        gathered_ranks, scattered_ranks = proven[twin], proven[main]
        n_twin, n_main = len(gathered_ranks), len(scattered_ranks)
        shard = torch.arange(4, dtype=torch.float32) + 100 * rank
        gathered = torch.empty(4 * n_twin)
        full = torch.arange(4 * n_main, dtype=torch.float32) * (rank + 1)
        scattered = torch.empty(4)
        work_ag = dist.all_gather_into_tensor(gathered, shard, group=groups[twin], async_op=True)
        work_rs = dist.reduce_scatter_tensor(scattered, full, group=groups[main], async_op=True)
        work_rs.wait()
        work_ag.wait()
        expect(gathered.tolist(), [float(x + 100 * r) for r in gathered_ranks for x in range(4)],
               "all_gather on %s" % twin)
        me = scattered_ranks.index(rank)
        weight = sum(r + 1 for r in scattered_ranks)
        expect(scattered.tolist(), [float((4 * me + x) * weight) for x in range(4)], "reduce_scatter on %s" % main)


def comms_names_megatron_holds():
    """The comms of the groups parallel_state's globals still hold: its
    destroy_model_parallel() leaves _INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP
    set, which the next initialize overwrites."""
    held = [v for v in vars(ps).values() if isinstance(v, dist.ProcessGroup) and comms.torch._backend_of(v)]
    return {json.loads(comms.torch.describe(g))["name"] for g in held}


def refuses_nccl_options_without_nccl(out_dir, report):
    """On a world without a CUDA backend, Megatron's NCCL options are refused,
    naming what is missing; the refused group leaves no comm, and the job
    goes on."""
    path = os.path.join(out_dir, "mp-only-rank%d.yaml" % dist.get_rank())
    with open(path, "w") as f:
        f.write("mp:\n  max_ctas: 4\n")
    before = set(comms.live_comm_names())
    refused = None
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                     nccl_communicator_config_path=path, create_gloo_process_groups=False)
    except (RuntimeError, ValueError) as e:
        refused = str(e)
    if refused is None:
        raise AssertionError("NCCL options on a world without NCCL were accepted")
    for word in ("'nccl'", "does not have", os.environ["COMMS_BACKEND"]):
        if word not in refused:
            raise AssertionError("the refusal does not say %r: %s" % (word, refused))
    report["refusal"] = refused.splitlines()[0][:300]
    refused_comm = refused.split("which comm '")[1].split("'")[0]
    if refused_comm in comms.live_comm_names():
        raise AssertionError("the refused group's comm %s is alive" % refused_comm)
    ps.destroy_model_parallel()
    comms.torch.destroy_unreferenced_groups()
    left = set(comms.live_comm_names()) - before - comms_names_megatron_holds()
    expect(sorted(left), [], "comms left by the refused initialize_model_parallel")
    check_layout(dict(tensor_model_parallel_size=2), {})  # and the job goes on
    ps.destroy_model_parallel()


def scenario_groups(out_dir, report):
    size = dist.get_world_size()
    checks = {}
    for layout in LAYOUTS[size]:
        try:
            check_layout(layout, report.setdefault("members", {}))
            ps.destroy_model_parallel()
            comms.torch.destroy_unreferenced_groups()  # here: check_layout's frame held groups
            checks[label(layout)] = "ok"
        except Exception as e:  # noqa: BLE001  (every failure is reported with its layout)
            checks[label(layout)] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-2000:])
            print("rank %d: %s failed: %s" % (dist.get_rank(), label(layout), checks[label(layout)]),
                  file=sys.stderr, flush=True)
            return checks  # the ranks may be in different ops: stop here
        dist.barrier()
    if size == 4 and "cuda:" not in os.environ.get("COMMS_BACKEND", ""):
        try:
            refuses_nccl_options_without_nccl(out_dir, report)
            checks["refuses_nccl_options_without_nccl"] = "ok"
        except Exception as e:  # noqa: BLE001
            checks["refuses_nccl_options_without_nccl"] = "%s: %s" % (type(e).__name__, e)
    return checks


# --- options --------------------------------------------------------------

YAML_CONFIG = {"tp": {"cga_cluster_size": 2, "max_ctas": 8, "min_ctas": 2},
               "dp": {"net_name": "Socket", "max_ctas": 4},
               "pp": {"cga_cluster_size": 1, "min_ctas": 1},
               "ep_dp": {"max_ctas": 2}}
HIGH_PRIORITY = ["pp", "ep"]
HINT_OF = {"cga_cluster_size": "cga_cluster_size", "max_ctas": "max_ctas", "min_ctas": "min_ctas",
           "net_name": "net_name"}


def write_yaml(out_dir):
    path = os.path.join(out_dir, "nccl-rank%d.yaml" % dist.get_rank())  # ranks write at the same time
    with open(path, "w") as f:
        for group, values in YAML_CONFIG.items():
            f.write("%s:\n" % group)
            for key, value in values.items():
                f.write("  %s: %s\n" % (key, value))
    return path


def expected_hints(name):
    """Megatron gives a group ProcessGroupNCCL.Options when the YAML or
    high_priority_stream_groups names it; its is_high_priority_stream is then
    always set (False unless named), and comms keeps that as "0"."""
    key = YAML_NAME.get(name, name)
    if key not in YAML_CONFIG and key not in HIGH_PRIORITY:
        return {}
    hints = {HINT_OF[k]: str(v) for k, v in YAML_CONFIG.get(key, {}).items()}
    hints["high_priority_stream"] = "1" if key in HIGH_PRIORITY else "0"
    return hints


def group_configuration(group):
    return configuration(comms.torch.describe(group))


def configuration(described):
    """What describe() says of a group's options (not its name or state)."""
    d = json.loads(described)
    cuda = d["backends"]["cuda"]
    nccl = cuda["config"]["nccl_config"]
    return {"hints": cuda["hints"], "cpu_hints": d["backends"]["cpu"]["hints"],
            "nccl_config": {k: nccl[k] for k in ("cga_cluster_size", "max_ctas", "min_ctas", "net_name")},
            "priority": cuda["config"]["stream_priority"]["class"], "op_timeout_ms": d["op_timeout_ms"],
            "init_timeout_ms": d["init_timeout_ms"], "nccl_communicator": cuda["config"]["initialized"]}


def check_options(groups):
    seen = {}
    for name, group in sorted(groups.items()):
        if group is None or name.endswith("_gloo"):
            continue
        got = group_configuration(group)
        hints = expected_hints(name)
        expect(got["hints"], hints, "%s: hints of its cuda backend" % name)
        expect(got["cpu_hints"], {}, "%s: hints of its cpu backend" % name)
        expect({k: v for k, v in got["nccl_config"].items() if v is not None},
               {k: (v if k == "net_name" else int(v)) for k, v in hints.items() if k != "high_priority_stream"},
               "%s: nccl_config" % name)
        expect(got["priority"] == "high", hints.get("high_priority_stream") == "1", "%s: high priority stream" % name)
        expect(got["op_timeout_ms"], TIMEOUT_MINUTES * 60000, "%s: op timeout (distributed_timeout_minutes)" % name)
        expect(got["init_timeout_ms"], TIMEOUT_MINUTES * 60000, "%s: init timeout" % name)
        expect(got["nccl_communicator"], False, "%s: no NCCL communicator (no CUDA op ran)" % name)
        seen[name] = got
    return seen


def initialize_with_options(out_dir, layout):
    ps.initialize_model_parallel(**layout, distributed_timeout_minutes=TIMEOUT_MINUTES,
                                 nccl_communicator_config_path=write_yaml(out_dir),
                                 high_priority_stream_groups=HIGH_PRIORITY, create_gloo_process_groups=True)
    # The twins take the configuration as a dict, as Megatron's training loads it.
    configs = {group: dict(values) for group, values in YAML_CONFIG.items()}
    for group in HIGH_PRIORITY:
        configs.setdefault(group, {})["is_high_priority_stream"] = True
    return megatron_groups(layout.get("expert_model_parallel_size", 1) > 1, configs)


OPTIONS_LAYOUT = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, expert_model_parallel_size=2,
                      expert_tensor_parallel_size=1)


def scenario_options(out_dir, report):
    groups = initialize_with_options(out_dir, OPTIONS_LAYOUT)
    report["configuration"] = check_options(groups)
    for name, group in groups.items():  # the CPU side still works, and leaves the CUDA side lazy
        if group is not None:
            expect(members(group), dist.get_process_group_ranks(group), "%s: members by value" % name)
    check_options(groups)
    ps.destroy_model_parallel()
    del groups
    comms.torch.destroy_unreferenced_groups()
    return {"options_reach_every_group": "ok"}


# --- cycles ---------------------------------------------------------------

def open_files():
    """What this process's fds point at (the listing's own fd is gone by readlink)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink("/proc/self/fd/" + fd))
        except OSError:
            pass
    return sorted(targets)


def counts(like=None):
    """Live comms, fds and threads. Process groups in reference cycles go with
    a collection, and torch's Gloo may close a socket from its own thread just
    after the call that dropped it; so with `like` given, a differing count gets
    up to two seconds to return to it. A leak stays; `files` names the fds."""
    gc.collect()
    for _ in range(20):
        files = open_files()
        row = {"comms": len(comms.live_comm_names()), "fds": len(files), "threads": len(os.listdir("/proc/self/task"))}
        if like is None or all(row[k] == like[k] for k in ("comms", "fds", "threads")):
            break
        time.sleep(0.1)
    row["files"] = files
    return row


class Recorder:
    """Records Megatron's new_group calls, as an RL framework does to replay them."""

    def __init__(self):
        self.calls, self._new_group = [], dist.new_group

    def __enter__(self):
        def recording(*args, **kwargs):
            group = self._new_group(*args, **kwargs)
            self.calls.append((args, kwargs, group))
            return group
        dist.new_group = recording
        return self

    def __exit__(self, *exc):
        dist.new_group = self._new_group


def comms_groups_of(groups):
    return {n: g for n, g in groups.items() if g is not None and not n.endswith("_gloo")}


def is_group(group):
    return group is not None and group is not dist.GroupMember.NON_GROUP_MEMBER


def offload_and_reload(groups, mine):
    """Every comms backend released and recreated, every option kept."""
    described = {n: comms.torch.describe(g) for n, g in mine.items()}
    released = comms.torch.offload_groups(["cpu"])
    if released < len(set(map(id, mine.values()))):
        raise AssertionError("offload released %d backends for %d groups" % (released, len(mine)))
    expect(comms.torch.offload_groups(["cpu"]), 0, "a second offload")
    try:
        dist.all_reduce(torch.ones(1), group=mine["tp"])
    except Exception as e:  # noqa: BLE001
        if "offload" not in str(e):
            raise
    else:
        raise AssertionError("an op on an offloaded group ran")
    expect(comms.torch.reload_groups(["cpu"]), released, "reload")
    expect(comms.torch.reload_groups(["cpu"]), 0, "a second reload")
    for name, group in groups.items():
        if group is not None:
            expect(members(group), dist.get_process_group_ranks(group), "%s: members after reload" % name)
    expect({n: comms.torch.describe(g) for n, g in mine.items()}, described, "describe() after reload")


def destroy_and_replay(recorder, mine):
    """Megatron's groups destroyed and made again from the recorded new_group
    arguments, on every rank in the same order, as an RL framework reloads
    them: the same members and options. The replayed groups are left to the
    caller to release."""
    described = {n: comms.torch.describe(g) for n, g in mine.items()}
    ranks = {n: dist.get_process_group_ranks(g) for n, g in mine.items()}
    for _, _, group in recorder.calls:
        if is_group(group) and comms.torch._backend_of(group):
            dist.destroy_process_group(group)
    replayed = [dist.new_group(*args, **kwargs) for args, kwargs, _ in recorder.calls]
    by_old = {id(old): new for (_, _, old), new in zip(recorder.calls, replayed)}
    for name, group in mine.items():
        new = by_old[id(group)]
        expect(members(new), ranks[name], "%s: members after replay" % name)
        expect(group_configuration(new), configuration(described[name]), "%s: options after replay" % name)
    for (_, kwargs, _), group in zip(recorder.calls, replayed):
        if is_group(group) and kwargs.get("backend") == "gloo":
            dist.destroy_process_group(group)  # Megatron's own, not comms': it destroys those itself


def one_cycle(out_dir, replay):
    """Megatron's groups built, used, offloaded and reloaded, (replayed), and
    dropped by destroy_model_parallel()."""
    with Recorder() as recorder:
        groups = initialize_with_options(out_dir, OPTIONS_LAYOUT)
    mine = comms_groups_of(groups)
    for name, group in groups.items():
        if group is not None:
            expect(members(group), dist.get_process_group_ranks(group), "%s: members after build" % name)
    offload_and_reload(groups, mine)
    if replay:
        destroy_and_replay(recorder, mine)
    del mine, groups, recorder
    ps.destroy_model_parallel()


def scenario_cycles(out_dir, report):
    """Ten cycles as Megatron alone leaves them, then ten that replay the
    groups and end with destroy_unreferenced_groups(): the first grow, the
    second stay flat."""
    report["counts"] = {"start": counts()}
    rows = []
    for _ in range(10):
        one_cycle(out_dir, replay=False)
        rows.append(counts())
    report["counts"]["without"] = rows
    report["counts"]["released_after_without"] = comms.torch.destroy_unreferenced_groups()
    report["counts"]["after_release"] = counts()
    rows = []
    for _ in range(10):
        one_cycle(out_dir, replay=True)
        expect(comms.torch.destroy_unreferenced_groups() > 0, True, "destroy_unreferenced_groups released the replay")
        expect(comms.torch.destroy_unreferenced_groups(), 0, "a second destroy_unreferenced_groups")
        # The first cycle is given time to settle to the counts after the
        # release, the later ones to the first's.
        rows.append(counts(like=rows[0] if rows else report["counts"]["after_release"]))
    report["counts"]["with"] = rows
    for key in ("comms", "fds", "threads"):
        values = [row[key] for row in rows]
        if max(values) != min(values):
            changed = [sorted(set(row["files"]) ^ set(rows[0]["files"])) for row in rows]
            raise AssertionError("%s not flat over ten cycles with destroy_unreferenced_groups: %s; fds that differ "
                                 "from the first cycle's: %s" % (key, values, changed))
    expect(rows[0]["comms"], report["counts"]["start"]["comms"], "live comms after a cycle vs before the first")
    without = [row["comms"] for row in report["counts"]["without"]]
    if not without[-1] > without[0] > report["counts"]["start"]["comms"]:
        raise AssertionError("Megatron's destroy_model_parallel alone released every comm: %s" % without)
    return {"ten_cycles_flat_with_the_release_call": "ok"}


# --- mlp ------------------------------------------------------------------

def scenario_mlp(out_dir, report):
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    ps.initialize_model_parallel(tensor_model_parallel_size=dist.get_world_size())
    config = ModelParallelConfig(tensor_model_parallel_size=dist.get_world_size(), use_cpu_initialization=True,
                                 perform_initialization=True, params_dtype=torch.float64,
                                 gradient_accumulation_fusion=False)
    hidden, ffn, batch = 8, 16, 4
    torch.manual_seed(0)
    fc1 = ColumnParallelLinear(hidden, ffn, config=config, init_method=torch.nn.init.normal_, bias=False,
                               gather_output=False)
    fc2 = RowParallelLinear(ffn, hidden, config=config, init_method=torch.nn.init.normal_, bias=False,
                            input_is_parallel=True, skip_bias_add=True)
    x = torch.arange(batch * hidden, dtype=torch.float64).reshape(batch, hidden) / 10
    x.requires_grad_(True)
    y, _ = fc2(torch.nn.functional.gelu(fc1(x)[0]))
    y.sum().backward()
    # One rank's MLP with the same weights: the shards put together.
    tp, r = dist.get_world_size(), dist.get_rank()
    shards1 = [torch.empty_like(fc1.weight) for _ in range(tp)]
    shards2 = [torch.empty_like(fc2.weight) for _ in range(tp)]
    dist.all_gather(shards1, fc1.weight.detach().contiguous())
    dist.all_gather(shards2, fc2.weight.detach().contiguous())
    w1 = torch.cat(shards1, dim=0).requires_grad_(True)  # ffn x hidden, split by rows
    w2 = torch.cat(shards2, dim=1).requires_grad_(True)  # hidden x ffn, split by columns
    xr = x.detach().clone().requires_grad_(True)
    yr = torch.nn.functional.gelu(xr @ w1.t()) @ w2.t()
    yr.sum().backward()
    rows = ffn // tp

    def close(a, b, what):
        if not torch.allclose(a, b, rtol=1e-12, atol=1e-12):
            raise AssertionError("%s differs: %s vs %s" % (what, a, b))
    expect(list(w1.shape), [ffn, hidden], "the gathered fc1 weight")
    close(y.detach(), yr.detach(), "forward")
    close(x.grad, xr.grad, "input gradient")
    close(fc1.weight.grad, w1.grad[r * rows:(r + 1) * rows], "fc1 weight gradient")
    close(fc2.weight.grad, w2.grad[:, r * rows:(r + 1) * rows], "fc2 weight gradient")
    if torch.equal(shards1[0], shards1[-1]):
        raise AssertionError("every rank holds the same fc1 shard: the layer was not split")
    report["output"] = y.detach().flatten().tolist()[:4]
    ps.destroy_model_parallel()
    comms.torch.destroy_unreferenced_groups()
    return {"tensor_parallel_mlp_equals_one_rank": "ok"}


SCENARIOS = {"groups": scenario_groups, "options": scenario_options, "cycles": scenario_cycles,
             "mlp": scenario_mlp}


def main():
    out_dir, scenario = sys.argv[1], sys.argv[2]
    device_id = os.environ.get("TORCH_DEVICE_ID")
    dist.init_process_group("comms", init_method="file://" + os.path.join(out_dir, "store"),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=120),
                            device_id=torch.device(device_id) if device_id else None)
    report = {"checks": {}}
    for name in scenario.split(","):
        try:
            checks = SCENARIOS[name](out_dir, report)
        except Exception as e:  # noqa: BLE001  (reported with the scenario)
            checks = {name: "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-2500:])}
            print("rank %d: %s" % (dist.get_rank(), checks[name]), file=sys.stderr, flush=True)
        report["checks"][name] = checks
        if any(v != "ok" for v in checks.values()):
            break  # the ranks may be in different ops
    rank = dist.get_rank()
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
