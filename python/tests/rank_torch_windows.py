"""One rank of torch's one-sided windows on backend "comms" (run by
test_torch_windows.py under commsrun on cpu:ucx): torch.distributed's
_new_window, put, signal and wait_signal. Writes {check: "ok" | error} to
OUT_DIR/rank<R>.json."""
import torch
import torch.distributed as dist

import torch_rank
from torch_rank import expect


def put_then_signal_lands_at_the_element_offset(rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    expect(dist.distributed_c10d._supports_window(), True, "supports_window")
    inbox = torch.zeros(64, dtype=torch.float32)
    w = dist.distributed_c10d._new_window(inbox)
    w.put(torch.arange(8, dtype=torch.float32) + 100 * rank, right, 4, False)
    w.signal(right, False)
    w.wait_signal(left, False)
    expect(inbox[4:12].tolist(), (torch.arange(8, dtype=torch.float32) + 100 * left).tolist(), "inbox[4:12]")
    expect(bool(inbox[:4].any()) or bool(inbox[12:].any()), False, "elements outside the put")
    dist.barrier()
    w.tensor_deregister()


def a_put_past_the_end_is_refused(rank, size):
    right = (rank + 1) % size
    w = dist.distributed_c10d._new_window(torch.zeros(16, dtype=torch.int32))
    try:
        w.put(torch.ones(2, dtype=torch.int32), right, 15, False)
        raise AssertionError("a put past the registered tensor's end was accepted")
    except ValueError as e:
        if "do not fit" not in str(e):
            raise
    dist.barrier()
    w.tensor_deregister()


CHECKS = [put_then_signal_lands_at_the_element_offset, a_put_past_the_end_is_refused]

if __name__ == "__main__":
    torch_rank.run(CHECKS)
