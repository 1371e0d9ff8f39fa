"""What the peer scripts share: reading a workloads.py dump, and writing their table."""
import json
import os

import numpy as np


def load(workloads, name):
    """Array `name` of a `workloads.py --dump` folder, with the dtype and shape of its manifest."""
    meta = json.load(open(os.path.join(workloads, "manifest.json")))[name]
    return np.fromfile(os.path.join(workloads, name + ".bin"), dtype=np.dtype(meta["dtype"]).newbyteorder("<")).reshape(meta["shape"])


def ours(outputs, name):
    """Our indices of operator `name`, as `lidar-kernels bench-cpu-ops --outputs` wrote them."""
    return np.fromfile(os.path.join(outputs, name + ".bin"), dtype="<i4")


def emit(lines, out):
    """Prints the table and writes it to `out` when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        open(out, "w").write(text)
