"""A torch program as people write it, for the launch tests: env://
rendezvous from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, then all_reduce
checked by value. usage: rank_torch_allreduce.py BACKEND ("comms" imports
comms.torch first, the one line a trainer adds). Prints "ok rank=R ..."."""
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1]
if backend == "comms":
    import comms.torch  # noqa: F401 - registers the backend

dist.init_process_group(backend)  # env://
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.arange(1000, dtype=torch.float32) * (rank + 1)
dist.all_reduce(x)
expected = torch.arange(1000, dtype=torch.float32) * (world * (world + 1) / 2)
assert torch.equal(x, expected), "sum: got %s, want %s" % (x[:4].tolist(), expected[:4].tolist())
y = torch.tensor([rank * 10 + 3], dtype=torch.int64)
dist.all_reduce(y, op=dist.ReduceOp.MAX)
assert y.item() == (world - 1) * 10 + 3, "max: got %d" % y.item()
dist.barrier()
dist.destroy_process_group()
print("ok rank=%d world=%d backend=%s sum=%g max=%d" % (rank, world, backend, x[1].item(), y.item()), flush=True)
