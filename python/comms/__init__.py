"""comms: collective communication over plugin backends (Gloo on CPU, NCCL on CUDA).

    import numpy as np, comms
    world = comms.new_comm(device="cpu", name="world")
    x = np.ones(1024, dtype=np.float32)
    world.all_reduce(x, op="sum")

See docs/PYTHON.md for the whole API.
"""
from ._comms import (Comm, Error, RegisteredBuffer, Work, can_register_buffers, format_hints, new_comm,
                     parse_hints, register_buffer)
from . import dist, parallel

__all__ = ["Comm", "Error", "RegisteredBuffer", "Work", "can_register_buffers", "dist", "format_hints", "new_comm",
           "parallel", "parse_hints", "register_buffer"]
