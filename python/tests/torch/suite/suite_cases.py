"""torch's distributed suite as one unittest class, the way torch's own
test/distributed/test_distributed_spawn.py builds it (that file is in torch's
source tree only, not in the wheel or in Debian's package). Imported by
torch_suite.py in the driver and again, by pickle, in every rank process that
torch's MultiProcessTestCase spawns: what a rank needs (the backend's
registration, the features it declares) happens here, at import.

BACKEND and WORLD_SIZE must be in the environment before the import
(distributed_test reads them at import); the driver sets them. INIT_METHOD is
left unset, so distributed_test takes env:// as torch's "env init_method" run
does (the ranks themselves rendezvous through a file, TestDistBackend's
init_method); TEMP_DIR is set by TestDistBackend.setUp for every test.
"""
import os

import torch

BACKEND = os.environ["BACKEND"]


class CommsTorchNotBuilt(ImportError):
    pass


def _register_comms():
    """Imports comms.torch (it registers backend "comms" with torch) and
    declares to torch's suite what comms implements, as a third-party backend
    joins it: through DistTestCases' feature sets."""
    try:
        import comms.torch  # noqa: F401 - registers the backend
    except ModuleNotFoundError as e:
        if e.name in ("comms", "comms.torch"):
            raise CommsTorchNotBuilt("comms.torch not built (%s)" % e) from e
        raise
    from torch.testing._internal.common_distributed import DistTestCases
    # "plugin": require_backend_is_available counts it available (it asks
    # dist.is_*_available() for torch's own backends only).
    DistTestCases.backend_feature["plugin"].add("comms")
    # What gloo's entry in these sets stands for, comms does too: DDP, process
    # subgroups, CUDA tensors (cuda:nccl).
    for feature in ("ddp", "subgroup", "cuda", "gpu"):
        DistTestCases.backend_feature[feature].add("comms")
    # What it does not: a recv from any source (comms names the peer of every recv).
    # Not declared, because comms has them: "reduce", "allgather_coalesced" and
    # "cpu barrier" (skip_collective's other sets).
    DistTestCases.skip_collective["sendrecv anysource"].add("comms")


if BACKEND == "comms":
    _register_comms()

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402 - after the registration
    DistributedTest, TestDistBackend)


# How the ranks start: "spawn" as torch runs the suite (each rank a fresh
# interpreter that imports all of the above), or "fork" (a copy of the
# driver, seconds faster per test on a loaded machine). The driver sets it.
start_method = "spawn"


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._start_processes(torch.multiprocessing.get_context(start_method).Process)
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()
