#!/usr/bin/env python3
"""The CUDA checks of backend "comms" at world size 1, each against torch's
own "nccl" (run by scripts/gpu_check_torch.py with the package it built).

  gpu_torch_checks.py RESULTS.json
"""
import datetime
import json
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist

import comms.torch

RESULTS = []


def check(fn):
    start = time.monotonic()
    try:
        details = fn() or "ok"
        status = "pass"
    except Exception as e:  # noqa: BLE001  (each check reports its own failure)
        status, details = "fail", "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-2000:])
    RESULTS.append({"check": "torch_" + fn.__name__, "status": status, "details": details,
                    "seconds": round(time.monotonic() - start, 1)})
    print("%s %s: %s" % (fn.__name__, status, details.splitlines()[0]), flush=True)


def same(a, b, what):
    if not torch.allclose(a.float().cpu(), b.float().cpu(), rtol=1e-3, atol=1e-3):
        raise AssertionError("%s: comms %s, nccl %s" % (what, a.flatten()[:8].tolist(), b.flatten()[:8].tolist()))


def each_call(group):
    """Every call on CUDA tensors through `group`; returns the outputs."""
    dev = torch.device("cuda", 0)
    x = lambda n, dt=torch.float32: (torch.arange(n, device=dev) % 7 + 1).to(dt)  # noqa: E731
    out = {}
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
            t = x(33, dt)
            dist.all_reduce(t, op=op, group=group)
            out["all_reduce %s %s" % (dt, op)] = t
    t = x(33)
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=group)
    out["all_reduce avg"] = t
    t = x(33)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0), group=group)
    out["all_reduce premul_sum"] = t
    t = x(9)
    dist.reduce(t, dst=0, group=group)
    out["reduce"] = t
    t = x(9)
    dist.broadcast(t, src=0, group=group)
    out["broadcast"] = t
    outs = [torch.zeros(9, device=dev)]
    dist.all_gather(outs, x(9), group=group)
    out["all_gather"] = outs[0]
    t = torch.zeros(9, device=dev)
    dist.all_gather_into_tensor(t, x(9), group=group)
    out["all_gather_into_tensor"] = t
    t = torch.zeros(9, device=dev)
    dist.reduce_scatter(t, [x(9)], group=group)
    out["reduce_scatter"] = t
    t = torch.zeros(9, device=dev)
    dist.reduce_scatter_tensor(t, x(9), group=group)
    out["reduce_scatter_tensor"] = t
    outs = [torch.zeros(9, device=dev)]
    dist.all_to_all(outs, [x(9)], group=group)
    out["all_to_all"] = outs[0]
    t = torch.zeros(9, device=dev)
    dist.all_to_all_single(t, x(9), group=group)
    out["all_to_all_single"] = t
    t = torch.zeros(9, device=dev)
    dist.all_to_all_single(t, x(9), output_split_sizes=[9], input_split_sizes=[9], group=group)
    out["all_to_all_single splits"] = t
    outs = [torch.zeros(9, device=dev)]
    dist.gather(x(9), gather_list=outs, dst=0, group=group)
    out["gather"] = outs[0]
    t = torch.zeros(9, device=dev)
    dist.scatter(t, scatter_list=[x(9)], src=0, group=group)
    out["scatter"] = t
    dist.barrier(group=group)
    work = dist.all_reduce(x(1 << 20), group=group, async_op=True)
    out["future"] = work.get_future().wait()[0]
    return out


def calls():
    mine, theirs = each_call(COMMS), each_call(NCCL)
    for key in mine:
        same(mine[key], theirs[key], key)
    return "%d calls on CUDA tensors equal torch's nccl" % len(mine)


def device_id():
    state = json.loads(comms.torch.describe())["backends"]["cuda"]["state"]
    if state != "ready":
        raise AssertionError("after init_process_group(device_id=cuda:0) the cuda backend is %s, not ready" % state)
    return "cuda backend ready when init_process_group returned (eager)"


def side_stream():
    side = torch.cuda.Stream()
    t = torch.zeros(1 << 22, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~tens of ms of queued work before the fill
        t.fill_(3.0)
        dist.all_reduce(t, group=COMMS)  # must see the fill: ordered after the side stream's work
        t.mul_(2.0)
    side.synchronize()
    if not torch.all(t == 6.0):
        raise AssertionError("the all_reduce ran before the side stream's fill: %s" % t[:4].tolist())
    return "all_reduce on a side stream saw the fill queued before it"


def ddp():
    finals = []
    for group in (COMMS, NCCL):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda(),
            device_ids=[0], process_group=group)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator(device="cuda").manual_seed(1)
        for _ in range(10):
            x = torch.randn(16, 32, device="cuda", generator=gen)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        finals.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*finals):
        same(a, b, "DDP parameter")
    return "DDP over comms ends with DDP over nccl's parameters (10 steps)"


def priority():
    g = dist.new_group([0], backend="comms", pg_options=comms.torch.Options(is_high_priority_stream=True))
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t, group=g)
    described = json.loads(comms.torch.describe(g))["backends"]["cuda"]["config"]["stream_priority"]
    if described.get("class") != "high" or described.get("read_back") is None:
        raise AssertionError("stream priority not read back as high: %s" % described)
    return "stream priority read back: %s" % described


def p50():
    rows = []
    for nbytes in (8, 4096, 1 << 20):
        t = torch.ones(max(nbytes // 4, 1), device="cuda")
        times = {"comms": [], "nccl": []}
        for i in range(400):
            for name, group in (("comms", COMMS), ("nccl", NCCL)) if i % 2 == 0 else (("nccl", NCCL), ("comms", COMMS)):
                torch.cuda.synchronize()
                start = time.perf_counter()
                dist.all_reduce(t, group=group)
                torch.cuda.synchronize()
                if i >= 50:
                    times[name].append((time.perf_counter() - start) * 1e6)
        rows.append("%d B: comms p50 %.1f us, nccl p50 %.1f us" % (
            nbytes, statistics.median(times["comms"]), statistics.median(times["nccl"])))
    return "; ".join(rows)


def main():
    global COMMS, NCCL
    torch.cuda.set_device(0)
    kwargs = {"device_id": torch.device("cuda", 0)}
    dist.init_process_group("cpu:gloo,cuda:comms", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120), **kwargs)
    COMMS = dist.group.WORLD
    NCCL = dist.new_group([0], backend="nccl")
    for fn in (device_id, calls, side_stream, ddp, priority, p50):
        check(fn)
    dist.destroy_process_group()
    with open(sys.argv[1], "w") as f:
        json.dump(RESULTS, f, indent=1)


if __name__ == "__main__":
    main()
