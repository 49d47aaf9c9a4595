#!/usr/bin/env python3
"""all_reduce float32 through torch.distributed over torch's "gloo" and over
"comms" (comms.torch, with COMMS_BACKEND cpu:ucx underneath), and through
comms' own Python binding on the same buffer, in one run, alternating
(docs/BENCHMARKS.md#torch-level). Started by commsrun on 2 ranks:

  PYTHONPATH=build/python build/tools/commsrun -n 2 -- tools/dev python scripts/torch_bench.py [--json OUT]

(`tools/dev torch-bench` does this.) Rows: "torch gloo" always; "torch comms"
when comms.torch imports; "comms direct" (comms.new_comm) when the comms
package imports. Per row: p50 (and p10/p90) of one op at --small-bytes
(4 KiB), and the bus bandwidth at --large-bytes (64 MiB). Each timing is the
slowest rank's. Every row's result is checked by value before it is timed.
Rank 0 prints the table and writes OUT.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small-bytes", type=int, default=4096)
    p.add_argument("--large-bytes", type=int, default=64 << 20)
    p.add_argument("--small-iters", type=int, default=2000, help="ops per row and round at the small size")
    p.add_argument("--large-iters", type=int, default=5, help="ops per row and round at the large size")
    p.add_argument("--rounds", type=int, default=5, help="rounds; each times every row in turn")
    p.add_argument("--comms-backend", default="cpu:ucx", help="COMMS_BACKEND of the comms rows")
    p.add_argument("--json", help="where rank 0 writes the results")
    return p.parse_args()


def import_comms():
    """(comms module or None, comms.torch imported?, why not)"""
    try:
        import comms
    except ImportError as e:
        return None, False, "comms not importable: %s" % e
    try:
        import comms.torch  # noqa: F401 - registers backend "comms"
    except ImportError as e:
        return comms, False, "comms.torch not built: %s" % e
    return comms, True, ""


def rows(args, comms, have_comms_torch):
    """name -> all_reduce(tensor) callable, in the order they alternate."""
    out = {"torch gloo": lambda t: dist.all_reduce(t)}
    if have_comms_torch:
        group = dist.new_group(backend="comms")
        out["torch comms"] = lambda t: dist.all_reduce(t, group=group)
    if comms is not None:
        direct = comms.new_comm(backend=args.comms_backend, device="cpu", name="torch_bench_direct")
        out["comms direct"] = direct.all_reduce
    return out


def check_by_value(name, op, elements, world):
    """Each rank gives rank+1 per element: every element must come back as the sum."""
    t = torch.full((elements,), float(dist.get_rank() + 1), dtype=torch.float32)
    op(t)
    want = world * (world + 1) / 2
    if not bool((t == want).all()):
        raise SystemExit("torch_bench: %s gave %s, expected %g everywhere" % (name, t[:4].tolist(), want))


def time_ops(op, tensor, iters):
    """Seconds of each op, one after the other, started together."""
    dist.barrier()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        op(tensor)
        samples.append(time.perf_counter() - start)
    return samples


def percentile(samples, q):
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def slowest_rank(value):
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def measure(args, ops, world):
    small = {name: [] for name in ops}
    large = {name: [] for name in ops}
    # Zeros: a sum of zeros stays zero over thousands of in-place ops.
    small_t = torch.zeros(args.small_bytes // 4, dtype=torch.float32)
    large_t = torch.zeros(args.large_bytes // 4, dtype=torch.float32)
    for name, op in ops.items():  # warm up: connections, buffers, page faults
        time_ops(op, small_t, min(args.small_iters, 100))
        time_ops(op, large_t, 1)
    for _ in range(args.rounds):
        for name, op in ops.items():
            small[name] += time_ops(op, small_t, args.small_iters)
            large[name] += time_ops(op, large_t, args.large_iters)
    results = {}
    for name in ops:
        p50_large = slowest_rank(percentile(large[name], 0.5))
        results[name] = {
            "p10_us": slowest_rank(percentile(small[name], 0.1)) * 1e6,
            "p50_us": slowest_rank(percentile(small[name], 0.5)) * 1e6,
            "p90_us": slowest_rank(percentile(small[name], 0.9)) * 1e6,
            "large_p50_ms": p50_large * 1e3,
            # all_reduce's bus bandwidth: each byte crosses 2(n-1)/n links.
            "busbw_GBps": args.large_bytes * 2 * (world - 1) / world / p50_large / 1e9,
            "small_samples": len(small[name]),
            "large_samples": len(large[name]),
        }
    return results


def ratios(results):
    out = {}
    if "torch comms" in results:
        comms_row, gloo_row = results["torch comms"], results["torch gloo"]
        out["p50_comms_over_gloo"] = comms_row["p50_us"] / gloo_row["p50_us"]
        out["busbw_comms_over_gloo"] = comms_row["busbw_GBps"] / gloo_row["busbw_GBps"]
        if "comms direct" in results:
            out["torch_layer_us"] = comms_row["p50_us"] - results["comms direct"]["p50_us"]
    return out


def report(args, world, results, missing):
    print("all_reduce float32, %d ranks, comms rows on %s (p50 over %d x %d ops at %d B; busbw at %d B)"
          % (world, args.comms_backend, args.rounds, args.small_iters, args.small_bytes, args.large_bytes))
    print("%-13s %10s %10s %10s %14s" % ("row", "p10 us", "p50 us", "p90 us", "busbw GB/s"))
    for name, r in results.items():
        print("%-13s %10.1f %10.1f %10.1f %14.3f" % (name, r["p10_us"], r["p50_us"], r["p90_us"], r["busbw_GBps"]))
    for key, value in ratios(results).items():
        print("%s = %.3f" % (key, value))
    if missing:
        print("not measured: %s" % missing)


def main():
    args = parse_args()
    os.environ["COMMS_BACKEND"] = args.comms_backend  # for the "comms" process group
    comms, have_comms_torch, missing = import_comms()
    dist.init_process_group("gloo")  # env://, MASTER_ADDR/MASTER_PORT
    world = dist.get_world_size()
    ops = rows(args, comms, have_comms_torch)
    for name, op in ops.items():
        check_by_value(name, op, args.small_bytes // 4, world)
        check_by_value(name, op, args.large_bytes // 4, world)
    results = measure(args, ops, world)
    if dist.get_rank() == 0:
        report(args, world, results, missing)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"op": "all_reduce", "dtype": "float32", "world_size": world,
                           "comms_backend": args.comms_backend, "small_bytes": args.small_bytes,
                           "large_bytes": args.large_bytes, "rounds": args.rounds, "torch": torch.__version__,
                           "rows": results, "ratios": ratios(results), "not_measured": missing}, f, indent=1)
                f.write("\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
