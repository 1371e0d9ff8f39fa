#!/usr/bin/env python3
"""Our GPU operators beside torchvision and torch on the GPU machine, on the same inputs.

    python3 shared/bench/workloads.py --dump /tmp/wl --repo-root <dir holding shared/>
    lidar-kernels bench /tmp/wl --out /tmp/bench.md          # our GPU medians (CUDA events)
    lidar-kernels bench-cpu-ops /tmp/wl --outputs /tmp/ours   # our outputs (the CPU reference's;
                                                              # check-gpu shows the GPU's are the same bits)
    python3 bench/gpu_peers.py /tmp/wl /tmp/ours /tmp/bench.md [--runs 60] [--out table.md]

Peers: torchvision.ops.nms (axis-aligned NMS, W5a), torch.cdist + topk (KNN, W3a / W3b) and,
when it imports, spconv's PointToVoxel (hard voxelization, W1, with the configurations of
shared/bench/workloads.py: pass --workloads-py when it is not at ../shared/bench/ beside the
repository), timed with CUDA events (median after warm-up), their outputs compared with ours.
"""
import argparse
import statistics
import sys
import time

import numpy as np
import torch
import torchvision
from workload_io import DEFAULT_WORKLOADS_PY, emit, load, our_voxels, ours as our_indices, voxel_configs



def cuda_ms(fn, runs):
    for _ in range(3):
        out = fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms), out


def our_gpu_ms(bench_md):
    """(operator, workload) -> our GPU median, from `lidar-kernels bench`'s table."""
    out = {}
    for line in open(bench_md):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 4:
            try:
                out[(cells[0], cells[1])] = float(cells[3])
            except ValueError:
                pass
    return out


def spconv_rows(a, dev, gpu):
    """spconv PointToVoxel beside our hard voxelization. Equal: the same voxels (coordinates) with
    the same point counts; PointToVoxel's voxel order and the order of points in a voxel come from
    its hash table and atomics, so they are not compared."""
    try:
        import spconv
        from spconv.pytorch.utils import PointToVoxel
    except ImportError as e:
        print(f"spconv: not compared ({e})", file=sys.stderr)
        return []
    rows = []
    for name in ("scan0", "large"):
        pts = torch.from_numpy(load(a.workloads, f"{name}_xyzr")).to(dev)
        for cfg_name, cfg in voxel_configs(a.workloads_py).items():
            gen = PointToVoxel(vsize_xyz=cfg["vsize"], coors_range_xyz=cfg["rng"], num_point_features=4,
                               max_num_voxels=cfg["max_voxels"], max_num_points_per_voxel=cfg["max_points"],
                               device=dev)
            ms, (_, coords, npts) = cuda_ms(lambda: gen(pts), a.runs)
            theirs = np.concatenate([coords.cpu().numpy(), npts.cpu().numpy()[:, None]], axis=1).astype(np.int64)
            ref = our_voxels(a.ours, f"voxels_{cfg_name}_{name}", cfg["max_points"])[:, :4].astype(np.int64)
            t_set = {tuple(r) for r in theirs.tolist()}
            o_set = {tuple(r) for r in ref.tolist()}
            common = len({tuple(r[:3]) for r in t_set} & {tuple(r[:3]) for r in o_set})
            eq = ("yes" if t_set == o_set else
                  f"no: V {len(theirs)} vs our {len(ref)}, {common} coordinates in common, "
                  f"{len(t_set & o_set)} with the same count")
            workload = f"W1 {cfg_name} {name}_xyzr"
            rows.append((f"voxelize_hard {workload}", f"spconv {spconv.__version__} PointToVoxel",
                         gpu.get(("voxelize_hard", workload)), ms, eq))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads")
    ap.add_argument("ours")
    ap.add_argument("bench_md")
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--out")
    ap.add_argument("--workloads-py", default=DEFAULT_WORKLOADS_PY,
                    help="shared/bench/workloads.py, for the W1 voxel configurations")
    a = ap.parse_args()
    dev = torch.device("cuda")
    gpu = our_gpu_ms(a.bench_md)
    rows = []

    for n in (10000, 50000):
        boxes = torch.from_numpy(load(a.workloads, f"aa_boxes_{n}")).to(dev)
        scores = torch.from_numpy(load(a.workloads, f"aa_scores_{n}")).to(dev)
        ms, keep = cuda_ms(lambda: torchvision.ops.nms(boxes, scores, 0.5), a.runs)
        keep = keep.cpu().numpy()
        ref = our_indices(a.ours, f"nms_aa_{n}")
        eq = "yes" if np.array_equal(keep, ref) else f"no: {len(keep)} kept vs our {len(ref)}, {len(set(keep.tolist()) & set(ref.tolist()))} in common"
        rows.append((f"nms_aa {n} IoU 0.5", "torchvision.ops.nms", gpu.get(("nms_aa", f"aa_boxes_{n} IoU 0.5")), ms, eq))

    scan0 = torch.from_numpy(load(a.workloads, "scan0_xyz")).to(dev)
    w3a = torch.from_numpy(load(a.workloads, "w3a_xyz")).to(dev)
    queries = scan0[torch.from_numpy(load(a.workloads, "w3b_queries_idx")).to(dev)]
    for name, pts, q, k, op_workload in [
        ("knn_w3a", w3a, w3a, 16, ("knn", "W3a k=16, 16384 queries = points")),
        ("knn_w3b", scan0, queries, 32, ("knn", "W3b k=32, 4096 FPS queries into scan0")),
    ]:
        ref = our_indices(a.ours, name).reshape(len(q), k)
        for mode in ("use_mm_for_euclid_dist_if_necessary", "donot_use_mm_for_euclid_dist"):
            ms, idx = cuda_ms(lambda: torch.cdist(q, pts, compute_mode=mode).topk(k, largest=False).indices, a.runs)
            idx = idx.cpu().numpy()
            same_rows = int((idx == ref).all(axis=1).sum())
            same_sets = sum(set(r) == set(s) for r, s in zip(idx.tolist(), ref.tolist()))
            rows.append((f"{name} k={k}", f"torch.cdist ({mode}) + topk", gpu.get(op_workload), ms,
                         f"{same_rows}/{len(q)} rows identical, {same_sets}/{len(q)} as sets"))

    rows.extend(spconv_rows(a, dev, gpu))

    head = (f"GPU peers, {time.strftime('%Y-%m-%d')}, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
            f"torchvision {torchvision.__version__}; CUDA events, medians of {a.runs} after warm-up")
    lines = [head, "", "| operator | peer | ours ms | peer ms | peer / ours | equal? |", "|---|---|---:|---:|---:|---|"]
    for op, peer, o, p, eq in rows:
        ratio = f"{p / o:.1f}" if o else "-"
        lines.append(f"| {op} | {peer} | {o if o is not None else '-'} | {p:.4f} | {ratio} | {eq} |")
    emit(lines, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
