"""What the torch rank scripts share: registering checks, and running them
all on one rank under a group of backend "comms" initialised through
torch's FileStore (independent of the store commsrun hosts), each check's
outcome ("ok" or its error) written to OUT_DIR/rank<R>.json."""
import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

import comms.torch  # noqa: F401  (registers "comms")


def expect(actual, expected, what):
    if actual != expected:
        raise AssertionError("%s: got %r, expected %r" % (what, actual, expected))


def run(checks, extra=None):
    """Runs every check (with a barrier after each, so a failed one cannot
    leave ranks in different ops); `extra(results)` adds entries at the end."""
    out_dir = sys.argv[1]
    # TORCH_DEVICE_ID (e.g. cpu:0): init_process_group(device_id=...), which
    # binds the world eagerly and makes torch split every new_group from it.
    device_id = os.environ.get("TORCH_DEVICE_ID")
    dist.init_process_group("comms", init_method="file://" + os.path.join(out_dir, "store"),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=60),
                            device_id=torch.device(device_id) if device_id else None)
    rank, size = dist.get_rank(), dist.get_world_size()
    results = {}
    for fn in checks:
        try:
            fn(rank, size)
            results[fn.__name__] = "ok"
        except Exception as e:  # noqa: BLE001  (every failure is reported with its check)
            results[fn.__name__] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()[-1500:])
            print("rank %d: %s failed: %s" % (rank, fn.__name__, results[fn.__name__]), file=sys.stderr, flush=True)
        dist.barrier()
    if extra is not None:
        extra(results)
    dist.destroy_process_group()
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(results, f)
