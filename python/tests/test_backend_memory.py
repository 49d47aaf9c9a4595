"""Memory from a comm's allocator in Python (comms.alloc_backend_memory): on
cpu:ucx a writable buffer that numpy views without a copy, freed exactly once
when its last view is gone, valid after the comm's finalize; Gloo has no
allocator and says so. Leaks are seen as comms' memfds open in this process
and their mappings (backends/ucx/host_shared_memory.h names them
"comms-ucx")."""
import gc

import numpy as np
import pytest

import comms
from ucx_memory import comms_mappings, comms_memfds


def comms_memory():
    """(memfds, mappings) of comms' UCX allocator in this process."""
    return comms_memfds(), comms_mappings()


def ucx_comm(name):
    return comms.new_comm(backend="cpu:ucx", device="cpu", name=name, rank=0, world_size=1)


def test_gloo_has_no_allocator_and_says_so():
    with comms.new_comm(backend="cpu:gloo", device="cpu", name="mem_gloo", rank=0, world_size=1) as c:
        assert comms.can_alloc_backend_memory(c, "cpu") is False
        with pytest.raises(comms.Error) as e:
            comms.alloc_backend_memory(c, "cpu", 64)
        assert e.value.code == "unsupported"
        assert "the gloo backend for cpu has no allocator of its own" in str(e.value)


def test_ucx_memory_is_a_writable_buffer_numpy_views_without_a_copy():
    with ucx_comm("mem_view") as c:
        assert comms.can_alloc_backend_memory(c, "cpu") is True
        before = comms_memory()
        mem = comms.alloc_backend_memory(c, "cpu", 4096 * 4 + 12)
        assert (mem.nbytes, len(mem), mem.device) == (4096 * 4 + 12, 4096 * 4 + 12, "cpu")
        assert comms_memory() == (before[0] + 1, before[1] + 1)
        x = np.frombuffer(mem, dtype=np.float32, count=4096)
        assert x.flags.writeable and x.ctypes.data == mem.address
        assert not x.any()  # fresh memory reads as zeros
        x[:] = np.arange(4096, dtype=np.float32)
        assert memoryview(mem).cast("f")[4095] == 4095.0  # the same bytes, seen through another view
        c.all_reduce(x)  # one rank: the sum is the input, in place in that memory
        assert np.array_equal(x, np.arange(4096, dtype=np.float32))


def test_memory_lives_while_a_view_does_and_is_freed_once_with_the_last():
    with ucx_comm("mem_life") as c:
        base = comms_memory()
        mem = comms.alloc_backend_memory(c, "cpu", 1 << 16)
        view = np.frombuffer(mem, dtype=np.int64)
        view[:] = 7
        del mem  # the view holds it
        gc.collect()
        assert comms_memory() == (base[0] + 1, base[1] + 1)
        assert int(view.sum()) == 7 * (1 << 13)
        del view
        assert comms_memory() == base
        # 20 cycles leave nothing behind; a leak of one per cycle would show as 20.
        for i in range(20):
            m = comms.alloc_backend_memory(c, "cpu", 4096 * (i + 1))
            np.frombuffer(m, dtype=np.uint8)[:] = i
            assert comms_memory() == (base[0] + 1, base[1] + 1)
            del m
        assert comms_memory() == base


def test_memory_stays_valid_after_the_comm_is_finalized():
    c = ucx_comm("mem_after")
    base = comms_memory()
    x = np.frombuffer(comms.alloc_backend_memory(c, "cpu", 1024), dtype=np.int32)
    x[:] = np.arange(256, dtype=np.int32)
    c.finalize()
    del c
    gc.collect()
    x += 1  # still mapped and writable
    assert np.array_equal(x, np.arange(1, 257, dtype=np.int32))
    assert comms_memory() == (base[0] + 1, base[1] + 1)
    del x
    assert comms_memory() == base


def test_python_takes_cpu_memory_only():
    with ucx_comm("mem_cuda") as c:
        with pytest.raises(ValueError, match="cpu memory only"):
            comms.alloc_backend_memory(c, "cuda:0", 64)


def test_torch_views_it_without_a_copy_and_keeps_it_alive():
    torch = pytest.importorskip("torch")
    with ucx_comm("mem_torch") as c:
        base = comms_memory()
        mem = comms.alloc_backend_memory(c, "cpu", 4096)
        t = torch.frombuffer(mem, dtype=torch.float32)
        assert (t.data_ptr(), t.numel()) == (mem.address, 1024)
        del mem
        gc.collect()
        t.fill_(2.5)
        c.all_reduce(t)
        assert t.sum().item() == 2.5 * 1024
        del t
        gc.collect()
        assert comms_memory() == base
