"""What the peer scripts share: reading a workloads.py dump, and writing their table."""
import importlib.util
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


# shared/bench/workloads.py, beside this repository's folder.
DEFAULT_WORKLOADS_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench",
                                    "workloads.py")


def voxel_configs(workloads_py):
    """W1's hard-voxelization configurations (`VOXEL_CFGS` of shared/bench/workloads.py)."""
    spec = importlib.util.spec_from_file_location("workloads", workloads_py)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VOXEL_CFGS


def our_voxels(outputs, name, max_points):
    """Our hard voxels of `name` (4-channel points), a row per voxel: z, y, x, num_points, then
    the max_points x 4 features' float32 bits, as `bench-cpu-ops` wrote them."""
    return ours(outputs, name).reshape(-1, 4 + 4 * max_points)


def emit(lines, out):
    """Prints the table and writes it to `out` when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        open(out, "w").write(text)
