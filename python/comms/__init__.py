"""comms: collective communication over plugin backends (Gloo on CPU, NCCL on CUDA).

    import numpy as np, comms
    world = comms.new_comm(device="cpu", name="world")
    x = np.ones(1024, dtype=np.float32)
    world.all_reduce(x, op="sum")

See docs/PYTHON.md for the whole API.
"""
from ._comms import (BackendMemory, Comm, Error, RegisteredBuffer, Work, alloc_backend_memory, can_alloc_backend_memory,
                     can_register_buffers, format_hints, live_comm_names, new_comm, parse_hints, register_buffer)
from ._comms import (admit, agree_all, agree_on_failures, close_admissions, epoch, is_revoked, join, recover, revoke,
                     shrink)
from ._comms import Window, has_windows, register_window
from . import dist, parallel

__all__ = ["BackendMemory", "Comm", "Error", "RegisteredBuffer", "Work", "admit", "agree_all", "agree_on_failures",
           "alloc_backend_memory", "can_alloc_backend_memory", "can_register_buffers",
           "close_admissions", "dist",
           "epoch", "format_hints", "is_revoked", "join", "live_comm_names", "new_comm", "parallel", "parse_hints", "recover", "register_buffer",
           "revoke", "shrink", "Window", "has_windows", "register_window"]
