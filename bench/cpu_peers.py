#!/usr/bin/env python3
"""Our CPU operators beside the CPU peers a user can pip install, on the same inputs.

    pip install numpy scipy fpsample==0.3.3 open3d spconv-cu126==2.3.8   # open3d also needs libusb-1.0 (apt)
    python3 shared/bench/workloads.py --dump /tmp/wl --repo-root <dir holding shared/>
    lidar-kernels bench-cpu-ops /tmp/wl --outputs /tmp/ours --threads 1,2
    python3 bench/cpu_peers.py /tmp/wl /tmp/ours [--runs 9] [--out table.md]

`bench-cpu-ops` times our CPU reference (wall clock, median) and writes its indices; this script
times the peers the same way on the same arrays, compares the outputs where the semantics match
and prints one markdown table. Peers that are not installed are skipped, and the table says so.
"""
import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

from workload_io import DEFAULT_WORKLOADS_PY, emit, load, our_voxels, ours as our_indices, voxel_configs



def timed(fn, runs):
    fn()  # warm-up
    ms = []
    out = None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ms), out


def ball_rows(lists, nsample):
    """First `nsample` neighbours in index order, padded with the first found (mmcv's convention)."""
    rows = np.full((len(lists), nsample), -1, dtype=np.int64)
    for q, found in enumerate(lists):
        found = sorted(found)[:nsample]
        if found:
            rows[q, :] = found[0]
            rows[q, : len(found)] = found
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads")
    ap.add_argument("ours")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--out")
    ap.add_argument("--workloads-py", default=DEFAULT_WORKLOADS_PY,
                    help="shared/bench/workloads.py, for the W1 voxel configurations")
    a = ap.parse_args()

    scan0 = load(a.workloads, "scan0_xyz")
    w3a = load(a.workloads, "w3a_xyz")
    queries = scan0[load(a.workloads, "w3b_queries_idx")]
    ours_ms = {}
    for line in open(os.path.join(a.ours, "ours.tsv")).read().splitlines()[1:]:
        name, threads, _runs, ms = line.split("\t")
        ours_ms.setdefault(name, {})[int(threads)] = float(ms)
    ours = {name: our_indices(a.ours, name) for name in ours_ms}

    rows, versions, skipped = [], {"numpy": np.__version__}, []

    def add(name, peer, fn, compare):
        ms, out = timed(fn, a.runs)
        best = min(ours_ms[name].values())
        rows.append((name, peer, ours_ms[name], ms, ms / best, compare(out)))

    try:
        import fpsample
        from importlib.metadata import version

        versions["fpsample"] = version("fpsample")
        ref = ours["fps_w2a"]

        def same(out):
            out = np.asarray(out, dtype=np.int64)
            if np.array_equal(out, ref):
                return "yes"
            first = int(np.argmax(out != ref))
            common = len(set(out.tolist()) & set(ref.tolist()))
            return f"no: {int((out != ref).sum())} of {len(ref)} positions differ, the first at sample {first}; {common} points in common"

        add("fps_w2a", "fpsample.fps_sampling (exact)", lambda: fpsample.fps_sampling(scan0, 4096, start_idx=0), same)
        add("fps_w2a", "fpsample.bucket_fps_kdline_sampling h=7", lambda: fpsample.bucket_fps_kdline_sampling(scan0, 4096, h=7, start_idx=0), same)
    except ImportError:
        skipped.append("fpsample")

    try:
        import scipy
        from scipy.spatial import cKDTree

        versions["scipy"] = scipy.__version__

        def knn(points, q, k, name):
            ref = ours[name].reshape(len(q), k)
            def compare(out):
                idx = out[1]
                rows_equal = int((idx == ref).all(axis=1).sum())
                sets_equal = sum(set(r) == set(s) for r, s in zip(idx.tolist(), ref.tolist()))
                return f"{rows_equal}/{len(q)} rows identical, {sets_equal}/{len(q)} as sets"
            add(name, "scipy cKDTree build + query", lambda: cKDTree(points).query(q, k=k), compare)

        knn(w3a, w3a, 16, "knn_w3a")
        knn(scan0, queries, 32, "knn_w3b")
        ref = ours["ball_w4"].reshape(len(queries), 32)
        add(
            "ball_w4",
            "scipy cKDTree build + query_ball_point r=1",
            lambda: cKDTree(scan0).query_ball_point(queries, r=1.0),
            lambda out: f"{int((ball_rows(out, 32) == ref).all(axis=1).sum())}/{len(queries)} rows identical (theirs r <= 1 in f64, ours d^2 < 1 in f32)",
        )
    except ImportError:
        skipped.append("scipy")

    try:
        import open3d as o3d

        versions["open3d"] = o3d.__version__
        pcd = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(scan0.astype(np.float64)))
        ours_count = int(ours["downsample_w1"].max()) + 1
        add(
            "downsample_w1",
            "open3d voxel_down_sample 0.2 m",
            lambda: pcd.voxel_down_sample(0.2),
            lambda out: f"{len(out.points)} points vs our {ours_count} (other grid origin: counts only)",
        )
    except ImportError:
        skipped.append("open3d")

    try:
        import spconv
        from cumm import tensorview as tv
        from spconv.utils import Point2VoxelCPU3d

        versions["spconv"] = spconv.__version__
        for cloud in ("scan0", "large"):
            pts = np.ascontiguousarray(load(a.workloads, f"{cloud}_xyzr"))
            for cfg_name, cfg in voxel_configs(a.workloads_py).items():
                name = f"voxels_{cfg_name}_{cloud}"
                width = 4 * cfg["max_points"]
                ref = our_voxels(a.ours, name, cfg["max_points"])
                gen = Point2VoxelCPU3d(cfg["vsize"], cfg["rng"], 4, cfg["max_voxels"], cfg["max_points"])

                def same(out, ref=ref, width=width):
                    vox, idx, npv = (t.numpy_view() for t in out)
                    rows = np.concatenate([idx, npv[:, None]], axis=1)
                    if rows.shape != ref[:, :4].shape:
                        return f"no: V {len(rows)} vs our {len(ref)}"
                    same_rows = int((rows == ref[:, :4]).all(axis=1).sum())
                    same_features = int((vox.reshape(len(vox), width).view(np.int32) == ref[:, 4:]).all(axis=1).sum())
                    if same_rows == len(ref) and same_features == len(ref):
                        return f"yes: V {len(ref)}, coordinates, counts and features bit for bit, in order"
                    return f"no: {same_rows}/{len(ref)} voxels with the same coordinates and count, {same_features} with the same features"

                add(name, "spconv Point2VoxelCPU3d", lambda gen=gen, pts=pts: gen.point_to_voxel(tv.from_numpy(pts)), same)
    except ImportError:
        skipped.append("spconv")

    threads = sorted({t for v in ours_ms.values() for t in v})
    head = " | ".join(f"ours {t} thr ms" for t in threads)
    lines = [
        f"CPU peers, {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, " + ", ".join(f"{k} {v}" for k, v in versions.items())
        + (f"; not installed: {', '.join(skipped)}" if skipped else ""),
        "",
        f"| operator | peer | {head} | peer ms | peer / our best | equal? |",
        "|---|---|" + "---:|" * len(threads) + "---:|---:|---|",
    ]
    for name, peer, o, ms, ratio, eq in rows:
        lines.append(f"| {name} | {peer} | " + " | ".join(f"{o.get(t, float('nan')):.2f}" for t in threads) + f" | {ms:.2f} | {ratio:.2f} | {eq} |")
    emit(lines, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
