"""How the GPU FPS's work per step spreads over the SMs (numpy, no GPU): runs the CPU reference's
FPS on a workload, applies the kernels' warp skip (FpsBox in cuda/fps.cu: a warp of 32 x PPT
consecutive points skips when its bounding box is farther from the sample than its largest min
distance) and reports, per step, the updating warps on the busiest scheduler of the busiest block
(warp w on scheduler w % 4), for contiguous blocks and for warp chunks dealt over the blocks.

    python bench/fps_skip_sim.py /tmp/wl scan0_xyz 4096 16 512 14      # W2a, fps_cl_512_14 x16
    python bench/fps_skip_sim.py /tmp/wl w2b_xyz 1024 8 256 8 16384    # W2b, its first cloud
    python bench/fps_skip_sim.py /tmp/wl w2c_xyz 16384 123 1024 8      # W2c, fps_reg_8 x123

--morton first puts the points in Morton (z-curve) order, as a kernel would that sorted them before
sampling (the samples are the same points; ties among equal distances aside, the same sequence).
"""
import argparse

import numpy as np

import workload_io


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", help="folder written by shared/bench/workloads.py --dump")
    ap.add_argument("array", help="xyz array of the dump, e.g. scan0_xyz")
    ap.add_argument("k", type=int, help="samples")
    ap.add_argument("blocks", type=int, help="G: blocks of the cloud")
    ap.add_argument("block", type=int, help="threads per block")
    ap.add_argument("ppt", type=int, help="points per thread")
    ap.add_argument("points", type=int, nargs="?", help="only the first this many points (one cloud of a batch)")
    ap.add_argument("--morton", action="store_true", help="the points in Morton order, from the same first sample")
    a = ap.parse_args()

    xyz = workload_io.load(a.workloads, a.array).reshape(-1, 3)[: a.points]
    first = 0
    if a.morton:
        order = morton_order(xyz)
        xyz = xyz[order]
        first = int(np.nonzero(order == 0)[0][0])
    n, wc = len(xyz), 32 * a.ppt
    nw = -(-n // wc)
    pts = np.concatenate([xyz, np.zeros((nw * wc - n, 3), np.float32)]).astype(np.float32)
    valid = (np.arange(nw * wc) < n).reshape(nw, wc)
    w_pts = pts.reshape(nw, wc, 3)
    lo = np.where(valid[..., None], w_pts, np.inf).min(1)
    hi = np.where(valid[..., None], w_pts, -np.inf).max(1)
    mind = np.where(valid, np.float32(np.inf), np.float32(-1)).astype(np.float32)
    wmax = np.full(nw, np.inf, np.float32)
    warps = np.arange(nw)
    per_block = a.block // 32
    layouts = {"contiguous": (warps // per_block, warps % per_block % 4), "dealt": (warps % a.blocks, warps // a.blocks % 4)}
    busiest = {k: [] for k in layouts}
    s = first
    for _ in range(1, a.k):
        q = pts[s]
        far = ((np.clip(q, lo, hi) - q) ** 2).sum(1) > wmax
        upd = np.nonzero(~far)[0]
        d = ((w_pts[upd] - q) ** 2).sum(2)
        mind[upd] = np.where(valid[upd], np.minimum(mind[upd], d), -1)
        mind.reshape(-1)[s] = -1
        wmax[upd] = mind[upd].max(1)
        wmax[s // wc] = mind[s // wc].max()
        s = int(np.argmax(mind))
        u = np.zeros(nw)
        u[upd] = 1
        for name, (blk, sched) in layouts.items():
            count = np.zeros((a.blocks, 4))
            np.add.at(count, (blk, sched), u)
            busiest[name].append(count.max())
    print(f"{a.array}{' (Morton order)' if a.morton else ''} n={n} K={a.k} G={a.blocks} block={a.block} PPT={a.ppt}: {nw} warps; updating warps on the "
          f"busiest scheduler per step (mean, at most {per_block // 4}): "
          + ", ".join(f"{k} {np.mean(v):.2f}" for k, v in busiest.items()))


def morton_order(xyz, bits=10):
    """The permutation that sorts the points by their Morton code on a 2^bits grid per axis over
    their bounding box (NaN coordinates at cell 0)."""
    lo, hi = np.nanmin(xyz, 0), np.nanmax(xyz, 0)
    cell = np.nan_to_num((xyz - lo) / np.maximum(hi - lo, 1e-9) * ((1 << bits) - 1)).astype(np.uint64)
    code = np.zeros(len(xyz), np.uint64)
    for b in range(bits):
        for axis in range(3):
            code |= ((cell[:, axis] >> np.uint64(b)) & np.uint64(1)) << np.uint64(3 * b + axis)
    return np.argsort(code, kind="stable")


if __name__ == "__main__":
    main()
