"""Registered buffers from Python: a backend that cannot register (Gloo on
CPU) says so, through the capability and a comms.Error; the NCCL path is
tested through its fake in C++ (nccl_unit) and on a GPU by gpu-check."""
import numpy as np
import pytest

import comms


def test_gloo_cannot_register_and_says_so():
    with comms.new_comm(backend="cpu:gloo", device="cpu", name="reg_py", rank=0, world_size=1) as c:
        assert comms.can_register_buffers(c, "cpu") is False
        x = np.ones(8, dtype=np.float32)
        with pytest.raises(comms.Error) as e:
            comms.register_buffer(c, x)
        assert e.value.code == "unsupported"
        assert "gloo backend for cpu cannot register" in str(e.value)
        c.all_reduce(x)  # the comm is still usable
        assert x.tolist() == [1.0] * 8
