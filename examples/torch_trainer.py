#!/usr/bin/env python3
"""A small DDP trainer on torch.distributed, over backend "comms" or torch's
"gloo" (docs/TORCH.md). Against a plain torch trainer it changes two lines:
`import comms.torch` and the backend name.

    commsrun -n 2 -- python3 examples/torch_trainer.py --backend comms
    commsrun -n 2 -- python3 examples/torch_trainer.py --backend gloo --init-method file:///tmp/store

Every rank trains on its own shard of a fixed synthetic regression task;
DDP averages the gradients, so every backend ends with the same parameters.
"""
import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import comms.torch  # noqa: F401  (registers the backend "comms")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="comms", help="comms (this library) or gloo (torch's own)")
    p.add_argument("--init-method", default="env://",
                   help="torch's init_method: env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), tcp://, file://")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--save", help="rank 0 writes the final parameters here (torch.save)")
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(args.backend, init_method=args.init_method, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=datetime.timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.nn.Linear(16, 4)  # the function to learn, seeded above
    data = torch.Generator().manual_seed(1000 + rank)  # this rank's shard
    for step in range(args.steps):
        x = torch.randn(args.batch, 16, generator=data)
        with torch.no_grad():
            y = target(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print("step %d loss %.5f" % (step, loss.item()), flush=True)
    if rank == 0 and args.save:
        torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()}, args.save)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("done: %d ranks, backend %s" % (size, args.backend))


if __name__ == "__main__":
    main()
