"""What comms' UCX allocator holds in this process, for leak checks: its
allocations are memfds named comms-ucx (backends/ucx/host_shared_memory.cc);
peers' allocations are mapped, never held open."""
import os


def comms_memfds():
    """comms' UCX allocations open in this process."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink("/proc/self/fd/" + fd).startswith("/memfd:comms-ucx")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return count


def comms_mappings():
    """Mappings of comms' UCX allocations (this process's own and peers')."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "/memfd:comms-ucx" in line)
