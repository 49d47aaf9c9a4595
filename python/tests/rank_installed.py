"""One rank of the install test: the package and libcomms must both come
from DESTDIR; a 2-rank all_reduce must give the sum."""
import json
import os
import sys

import numpy as np

import comms


def main():
    out_dir, dest = sys.argv[1], os.path.realpath(sys.argv[2])
    c = comms.new_comm(device="cpu", name="installed", op_timeout=20.0)
    x = np.array([c.rank + 1, 10 * c.rank], np.float64)
    c.all_reduce(x, op="sum")
    with open("/proc/self/maps") as f:
        libcomms = sorted({line.split()[-1] for line in f if "libcomms.so" in line})
    result = {"package": os.path.realpath(comms.__file__), "libcomms": libcomms, "values": x.tolist(),
              "size": c.size}
    result["ok"] = (result["package"].startswith(dest + os.sep) and len(libcomms) == 1
                    and os.path.realpath(libcomms[0]).startswith(dest + os.sep)
                    and x.tolist() == [3.0, 10.0] and c.size == 2)
    c.finalize()
    with open(os.path.join(out_dir, "rank%d.json" % c.rank), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
