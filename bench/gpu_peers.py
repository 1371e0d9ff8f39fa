#!/usr/bin/env python3
"""Our GPU operators beside torchvision and torch on the GPU machine, on the same inputs.

    python3 shared/bench/workloads.py --dump /tmp/wl --repo-root <dir holding shared/>
    lidar-kernels bench /tmp/wl --out /tmp/bench.md          # our GPU medians (CUDA events)
    lidar-kernels bench-cpu-ops /tmp/wl --outputs /tmp/ours   # our outputs (the CPU reference's;
                                                              # check-gpu shows the GPU's are the same bits)
    python3 bench/gpu_peers.py /tmp/wl /tmp/ours /tmp/bench.md [--runs 60] [--out table.md]

Peers: torchvision.ops.nms (axis-aligned NMS, W5a) and torch.cdist + topk (KNN, W3a / W3b),
timed with CUDA events (median after warm-up), their outputs compared with ours.
"""
import argparse
import statistics
import sys
import time

import numpy as np
import torch
import torchvision
from workload_io import emit, load, ours as our_indices



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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads")
    ap.add_argument("ours")
    ap.add_argument("bench_md")
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--out")
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
