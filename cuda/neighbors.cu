// Exact neighbour search on a uniform cell grid built on the device: k nearest neighbours (knn_*)
// and ball query (ball_*), reproducing src/ops/neighbors/mod.rs bit for bit.
//
// Grid build (no host round trip; the host sizes buffers for the worst-case cell count):
//   grid_bbox     bounding box of the valid (finite) points + their count (atomics on ordered bits)
//   grid_setup    one thread: cell edge h and dims (f64, same rules as the CPU grid), cell budget
//   grid_count    cell id per point (f64 floor, clamped), per-cell counts (atomics)
//   scan_tiles / scan_top / scan_apply   exclusive scan of the counts -> cell starts
//   grid_scatter  points (x, y, z, index) binned by cell; order inside a cell is arbitrary, which
//                 cannot change a result: KNN keeps the smallest (dist2, index) keys, ball query the
//                 smallest indices, both total orders on distinct keys.
// Queries: one warp per query for widths <= 32 (knn_warp_cells, ball_warp; the sorted list is
// spread over the lanes), one thread per query with the list in global memory above
// (knn_global, ball_global).
//   knn: rings of cells (Chebyshev shells) around the query's cell, a sorted top-k list of u64 keys
//        (dist2 bits << 32 | index), runs of cells whose conservative lower bound exceeds the k-th
//        distance skipped, stop when every unvisited cell is provably farther than the k-th
//        distance (same f64 bounds as the CPU).
//   ball: the cells overlapping the ball, candidates with rmin2 <= dist2 < r2, keeping the nsample
//        smallest indices (= the first nsample in input order) in a bounded sorted list.
//
// Compile-time constants: NEIGHBORS_BLOCK (threads per block for every kernel here).

#include "common.cuh"

#ifndef NEIGHBORS_BLOCK
#define NEIGHBORS_BLOCK 256
#endif
#if (NEIGHBORS_BLOCK % 32) != 0 || NEIGHBORS_BLOCK > 1024 || NEIGHBORS_BLOCK < 32
#error "NEIGHBORS_BLOCK must be a multiple of 32 in 32..=1024"
#endif
#define NB_WARPS (NEIGHBORS_BLOCK / 32)
#define SCAN_ITEMS 8
#define SCAN_TILE (NEIGHBORS_BLOCK * SCAN_ITEMS)

#define INVALID_CELL 0xffffffffu
#define KEY_NONE 0xffffffffffffffffull

// Written by grid_setup; read by the later kernels. Its size is GRID_PARAMS_BYTES in
// src/ops/neighbors/cuda.rs (the host allocates the buffer).
struct GridParams {
    double origin[3];
    double h;
    double inv_h;
    double margin;
    int dims[3];
    unsigned int ncells;
    unsigned int nvalid;
    unsigned int pad_;
};
static_assert(sizeof(GridParams) == 72, "GridParams: size differs from GRID_PARAMS_BYTES in src/ops/neighbors/cuda.rs");

// Order-preserving map float -> u32 (finite values).
__device__ __forceinline__ unsigned int ord_enc(float f) {
    const unsigned int b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float ord_dec(unsigned int e) {
    return __uint_as_float((e & 0x80000000u) ? (e & 0x7fffffffu) : ~e);
}

// bbox[0..3] = max of ~enc(v) (i.e. min), bbox[3..6] = max of enc(v), bbox[6] = valid count.
// All zero before the launch.
extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK)
grid_bbox(const float* __restrict__ xyz, unsigned long long stride, unsigned int n, unsigned int* bbox) {
    float lo[3] = {__int_as_float(0x7f800000), __int_as_float(0x7f800000), __int_as_float(0x7f800000)};
    float hi[3] = {__int_as_float(0xff800000), __int_as_float(0xff800000), __int_as_float(0xff800000)};
    unsigned int cnt = 0;
    for (unsigned int i = blockIdx.x * NEIGHBORS_BLOCK + threadIdx.x; i < n; i += gridDim.x * NEIGHBORS_BLOCK) {
        const float x = xyz[i], y = xyz[stride + i], z = xyz[2 * stride + i];
        if (lk_finite3(x, y, z)) {
            lo[0] = fminf(lo[0], x);
            lo[1] = fminf(lo[1], y);
            lo[2] = fminf(lo[2], z);
            hi[0] = fmaxf(hi[0], x);
            hi[1] = fmaxf(hi[1], y);
            hi[2] = fmaxf(hi[2], z);
            ++cnt;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            lo[a] = fminf(lo[a], __shfl_xor_sync(0xffffffffu, lo[a], o));
            hi[a] = fmaxf(hi[a], __shfl_xor_sync(0xffffffffu, hi[a], o));
        }
        cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
    }
    if ((threadIdx.x & 31u) == 0 && cnt > 0) {
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            atomicMax(&bbox[a], ~ord_enc(lo[a]));
            atomicMax(&bbox[3 + a], ord_enc(hi[a]));
        }
        atomicAdd(&bbox[6], cnt);
    }
}

// One thread. mode 0: KNN (h from k), mode 1: ball query (h = radius * 0.5).
// cells_per_point: the cell budget (the host sized the count arrays for max(cpp * n, 64) cells).
extern "C" __global__ void grid_setup(const unsigned int* bbox, GridParams* gp, unsigned int mode, unsigned int k,
                                      float radius, unsigned int max_cells) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    GridParams g;
    const unsigned int n = bbox[6];
    g.nvalid = n;
    g.pad_ = 0;
    if (n == 0) {
        for (int a = 0; a < 3; ++a) { g.origin[a] = 0.0; g.dims[a] = 1; }
        g.h = 1.0;
        g.inv_h = 1.0;
        g.margin = 0.0;
        g.ncells = 0;
        *gp = g;
        return;
    }
    double lo[3], hi[3], ext[3];
    for (int a = 0; a < 3; ++a) {
        lo[a] = (double)ord_dec(~bbox[a]);
        hi[a] = (double)ord_dec(bbox[3 + a]);
        ext[a] = hi[a] - lo[a];
    }
    const double emax = fmax(ext[0], fmax(ext[1], ext[2]));
    double h;
    if (mode == 1) {
        h = (double)radius * 0.5;
    } else {
        // Lidar points lie on surfaces: size cells for ~k/2 points per cell on the area of the two
        // largest extents. Speed only: any edge gives the same result.
        const double target = fmax((double)k * 0.5, 2.0);
        const double floor_e = fmax(emax * 1e-3, 1e-12);
        double e0 = fmax(ext[0], floor_e), e1 = fmax(ext[1], floor_e), e2 = fmax(ext[2], floor_e);
        const double smallest = fmin(e0, fmin(e1, e2));
        const double area = e0 * e1 * e2 / smallest;
        h = sqrt(area * target / (double)n);
    }
    const double budget = fmax((double)max_cells, 64.0);
    if (!(isfinite(h) && h > 0.0) || h < emax * 1e-7) h = fmax(emax * 1e-7, 2.2250738585072014e-308);
    double d[3];
    for (int iter = 0; iter < 100000; ++iter) {
        const double inv = 1.0 / h;
        for (int a = 0; a < 3; ++a) d[a] = floor(ext[a] * inv) + 1.0;
        const double total = d[0] * d[1] * d[2];
        if (total <= budget && isfinite(total)) break;
        h *= isfinite(total) ? fmax(cbrt(total / budget), 1.0001) : 2.0;
    }
    const double max_abs = fmax(fmax(fmax(fabs(lo[0]), fabs(hi[0])), fmax(fabs(lo[1]), fabs(hi[1]))),
                                fmax(fabs(lo[2]), fabs(hi[2])));
    for (int a = 0; a < 3; ++a) {
        g.origin[a] = lo[a];
        g.dims[a] = (int)d[a];
    }
    g.h = h;
    g.inv_h = 1.0 / h;
    g.margin = 1e-9 * (h + max_abs) + 1e-30;
    g.ncells = (unsigned int)(d[0] * d[1] * d[2]);
    *gp = g;
}

__device__ __forceinline__ int cell_coord(const GridParams& g, double v, int a) {
    const double c = floor((v - g.origin[a]) * g.inv_h);
    if (c <= 0.0) return 0;
    if (c >= (double)(g.dims[a] - 1)) return g.dims[a] - 1;
    return (int)c;
}

__device__ __forceinline__ unsigned int cell_id(const GridParams& g, int cx, int cy, int cz) {
    return (unsigned int)((cx * g.dims[1] + cy) * g.dims[2] + cz);
}

// counts: ncells + 1 zeroed words.
extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK)
grid_count(const float* __restrict__ xyz, unsigned long long stride, unsigned int n, const GridParams* __restrict__ gp,
           unsigned int* cell_of, unsigned int* counts) {
    const unsigned int i = blockIdx.x * NEIGHBORS_BLOCK + threadIdx.x;
    if (i >= n) return;
    const GridParams g = *gp;
    const float x = xyz[i], y = xyz[stride + i], z = xyz[2 * stride + i];
    unsigned int c = INVALID_CELL;
    if (lk_finite3(x, y, z)) {
        c = cell_id(g, cell_coord(g, (double)x, 0), cell_coord(g, (double)y, 1), cell_coord(g, (double)z, 2));
        atomicAdd(&counts[c], 1u);
    }
    cell_of[i] = c;
}

// Sums of SCAN_TILE consecutive counts (cells 0 ..= ncells: the extra zero entry gives start[ncells]).
extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK)
scan_tiles(const unsigned int* __restrict__ counts, const GridParams* __restrict__ gp, unsigned int* tile_sums) {
    __shared__ unsigned int s_warp[NB_WARPS];
    const unsigned int len = gp->ncells + 1u;
    const unsigned int base = blockIdx.x * SCAN_TILE;
    if (base >= len) return; // uniform per block
    unsigned int v = 0;
#pragma unroll
    for (int j = 0; j < SCAN_ITEMS; ++j) {
        const unsigned int c = base + j * NEIGHBORS_BLOCK + threadIdx.x;
        if (c < len) v += counts[c];
    }
    unsigned int total;
    lk_block_excl_scan<NB_WARPS>(v, s_warp, &total);
    if (threadIdx.x == 0) tile_sums[blockIdx.x] = total;
}

// One block: exclusive scan of the tile sums in place.
extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK)
scan_top(unsigned int* tile_sums, const GridParams* __restrict__ gp) {
    __shared__ unsigned int s_warp[NB_WARPS];
    const unsigned int ntiles = (gp->ncells + 1u + SCAN_TILE - 1u) / SCAN_TILE;
    unsigned int carry = 0;
    for (unsigned int base = 0; base < ntiles; base += NEIGHBORS_BLOCK) {
        const unsigned int t = base + threadIdx.x;
        const unsigned int v = t < ntiles ? tile_sums[t] : 0u;
        unsigned int total;
        const unsigned int ex = lk_block_excl_scan<NB_WARPS>(v, s_warp, &total);
        if (t < ntiles) tile_sums[t] = carry + ex;
        carry += total;
    }
}

// start[c] = exclusive prefix of counts (c in 0 ..= ncells).
extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK)
scan_apply(const unsigned int* __restrict__ counts, const GridParams* __restrict__ gp,
           const unsigned int* __restrict__ tile_sums, unsigned int* start) {
    __shared__ unsigned int s_warp[NB_WARPS];
    const unsigned int len = gp->ncells + 1u;
    const unsigned int base = blockIdx.x * SCAN_TILE;
    if (base >= len) return;
    // Each thread takes SCAN_ITEMS consecutive cells (blocked arrangement).
    unsigned int v[SCAN_ITEMS];
    unsigned int sum = 0;
    const unsigned int first = base + threadIdx.x * SCAN_ITEMS;
#pragma unroll
    for (int j = 0; j < SCAN_ITEMS; ++j) {
        const unsigned int c = first + j;
        v[j] = c < len ? counts[c] : 0u;
        sum += v[j];
    }
    unsigned int total;
    unsigned int run = tile_sums[blockIdx.x] + lk_block_excl_scan<NB_WARPS>(sum, s_warp, &total);
#pragma unroll
    for (int j = 0; j < SCAN_ITEMS; ++j) {
        const unsigned int c = first + j;
        if (c < len) start[c] = run;
        run += v[j];
    }
}

// counts is consumed (decremented to zero): each point takes a slot from the end of its cell.
extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK)
grid_scatter(const float* __restrict__ xyz, unsigned long long stride, unsigned int n,
             const unsigned int* __restrict__ cell_of, const unsigned int* __restrict__ start, unsigned int* counts,
             float4* sorted) {
    const unsigned int i = blockIdx.x * NEIGHBORS_BLOCK + threadIdx.x;
    if (i >= n) return;
    const unsigned int c = cell_of[i];
    if (c == INVALID_CELL) return;
    const unsigned int pos = start[c] + atomicSub(&counts[c], 1u) - 1u;
    sorted[pos] = make_float4(xyz[i], xyz[stride + i], xyz[2 * stride + i], __uint_as_float(i));
}

// ------------------------------------------------------------------------------------------------
// Sorted bounded lists of u64 keys (ascending), KEY_NONE = empty.

// Serial scans of one run of sorted points (one thread per query).
template <class L>
__device__ __forceinline__ void serial_knn_run(L& best, const float4* __restrict__ sorted, unsigned int a, unsigned int b,
                                               float qx, float qy, float qz) {
    for (unsigned int pos = a; pos < b; ++pos) {
        const float4 p = sorted[pos];
        const float d = lk_dist2(p.x, p.y, p.z, qx, qy, qz);
        const u64 key = ((u64)__float_as_uint(d) << 32) | (u64)__float_as_uint(p.w);
        if (key < best.kth) best.insert(key);
    }
}
template <class L>
__device__ __forceinline__ void serial_ball_run(L& best, const float4* __restrict__ sorted, unsigned int a, unsigned int b,
                                                float qx, float qy, float qz, float r2, float rmin2, unsigned int& found) {
    for (unsigned int pos = a; pos < b; ++pos) {
        const float4 p = sorted[pos];
        const float d = lk_dist2(p.x, p.y, p.z, qx, qy, qz);
        if (rmin2 <= d && d < r2) {
            ++found;
            const u64 key = (u64)__float_as_uint(p.w);
            if (key < best.kth) best.insert(key);
        }
    }
}
#define SERIAL_RUNS                                                                                             \
    __device__ __forceinline__ void knn_run(const float4* __restrict__ sorted, unsigned int a, unsigned int b,     \
                                            float qx, float qy, float qz) {                                      \
        serial_knn_run(*this, sorted, a, b, qx, qy, qz);                                                       \
    }                                                                                                          \
    __device__ __forceinline__ void ball_run(const float4* __restrict__ sorted, unsigned int a, unsigned int b,    \
                                             float qx, float qy, float qz, float r2, float rmin2,               \
                                             unsigned int& found) {                                             \
        serial_ball_run(*this, sorted, a, b, qx, qy, qz, r2, rmin2, found);                                    \
    }


struct GlobalList {
    u64* v;
    unsigned int k;
    u64 kth;
    __device__ __forceinline__ void init(unsigned int kk, u64* row) {
        v = row;
        k = kk;
        for (unsigned int j = 0; j < kk; ++j) v[j] = KEY_NONE;
        kth = KEY_NONE;
    }
    __device__ __forceinline__ void insert(u64 key) {
        unsigned int j = k - 1u;
        while (j > 0 && v[j - 1] > key) {
            v[j] = v[j - 1];
            --j;
        }
        v[j] = key;
        kth = v[k - 1];
    }
    SERIAL_RUNS
    __device__ __forceinline__ u64 first() const { return v[0]; }
    __device__ __forceinline__ void emit_knn(int* oi, float* od) const {
        for (unsigned int j = 0; j < k; ++j) {
            const u64 key = v[j];
            oi[j] = key == KEY_NONE ? -1 : (int)(unsigned int)(key & 0xffffffffull);
            od[j] = key == KEY_NONE ? __int_as_float(0x7f800000) : __uint_as_float((unsigned int)(key >> 32));
        }
    }
    __device__ __forceinline__ void emit_ball(int* oi, unsigned int cnt, int pad) const {
        for (unsigned int j = 0; j < k; ++j) oi[j] = j < cnt ? (int)(unsigned int)v[j] : pad;
    }
};


// Warp-distributed sorted list (one query per warp, k <= 32): lane j holds element j.
struct WarpList {
    u64 v;
    unsigned int k;
    unsigned int lane;
    u64 kth;
    __device__ __forceinline__ void init(unsigned int kk, u64* /*unused*/) {
        k = kk;
        lane = threadIdx.x & 31u;
        v = KEY_NONE;
        kth = KEY_NONE;
    }
    // Warp-uniform key < kth.
    __device__ __forceinline__ void insert(u64 key) {
        u64 up = __shfl_up_sync(0xffffffffu, v, 1);
        v = key < v ? ((lane == 0u || up < key) ? key : up) : v;
        kth = __shfl_sync(0xffffffffu, v, k - 1u);
    }
    __device__ __forceinline__ void ball_run(const float4* __restrict__ sorted, unsigned int a, unsigned int b,
                                             float qx, float qy, float qz, float r2, float rmin2, unsigned int& found) {
        for (unsigned int base = a; base < b; base += 32u) {
            const unsigned int pos = base + lane;
            bool in = false;
            u64 key = KEY_NONE;
            if (pos < b) {
                const float4 p = sorted[pos];
                const float d = lk_dist2(p.x, p.y, p.z, qx, qy, qz);
                in = rmin2 <= d && d < r2;
                key = (u64)__float_as_uint(p.w);
            }
            const unsigned int inmask = __ballot_sync(0xffffffffu, in);
            found += __popc(inmask);
            unsigned int mask = __ballot_sync(0xffffffffu, in && key < kth);
            while (mask) {
                const int src = __ffs(mask) - 1;
                mask &= mask - 1u;
                const u64 kk = __shfl_sync(0xffffffffu, key, src);
                if (kk < kth) insert(kk);
            }
        }
    }
    __device__ __forceinline__ u64 first() const { return __shfl_sync(0xffffffffu, v, 0); }
    __device__ __forceinline__ void emit_knn(int* oi, float* od) const {
        if (lane < k) {
            oi[lane] = v == KEY_NONE ? -1 : (int)(unsigned int)(v & 0xffffffffull);
            od[lane] = v == KEY_NONE ? __int_as_float(0x7f800000) : __uint_as_float((unsigned int)(v >> 32));
        }
    }
    __device__ __forceinline__ void emit_ball(int* oi, unsigned int cnt, int pad) const {
        if (lane < k) oi[lane] = lane < cnt ? (int)(unsigned int)v : pad;
    }
};

// Lower bound (metres, conservative) of the distance from q to cells lo ..= hi on axis a.
__device__ __forceinline__ double axis_gap(const GridParams& g, double q, int a, int lo, int hi) {
    const double l = g.origin[a] + (double)lo * g.h - g.margin;
    const double u = g.origin[a] + (double)(hi + 1) * g.h + g.margin;
    return q < l ? l - q : (q > u ? q - u : 0.0);
}

__device__ __forceinline__ double d2_lower_bound(double dist_sq) { return dist_sq * (1.0 - 1e-6) - 1e-37; }

template <class L>
__device__ __forceinline__ void knn_scan(const GridParams& g, const unsigned int* __restrict__ start,
                                         const float4* __restrict__ sorted, float qx, float qy, float qz,
                                         const double* qf, double gx, double gy, int cx, int cy, int cz0, int cz1,
                                         L& best) {
    const unsigned int a = start[cell_id(g, cx, cy, cz0)];
    const unsigned int b = start[cell_id(g, cx, cy, cz1) + 1u];
    if (a >= b) return;
    if (best.kth != KEY_NONE) {
        const double gz = axis_gap(g, qf[2], 2, cz0, cz1);
        const float kd = __uint_as_float((unsigned int)(best.kth >> 32));
        if ((double)kd < d2_lower_bound(gx * gx + gy * gy + gz * gz)) return;
    }
    best.knn_run(sorted, a, b, qx, qy, qz);
}

// Keys are never KEY_NONE (its distance bits would be a NaN), so `kth != KEY_NONE` means full.
template <class L>
__device__ __forceinline__ void knn_one(const GridParams& g, const unsigned int* __restrict__ start,
                                        const float4* __restrict__ sorted, float qx, float qy, float qz, L& best) {
    const double qf[3] = {(double)qx, (double)qy, (double)qz};
    const int qc[3] = {cell_coord(g, qf[0], 0), cell_coord(g, qf[1], 1), cell_coord(g, qf[2], 2)};
    int max_r = 0;
    for (int a = 0; a < 3; ++a) max_r = max(max_r, max(qc[a], g.dims[a] - 1 - qc[a]));
    for (int r = 0; r <= max_r; ++r) {
        const int x0 = max(qc[0] - r, 0), x1 = min(qc[0] + r, g.dims[0] - 1);
        const int y0 = max(qc[1] - r, 0), y1 = min(qc[1] + r, g.dims[1] - 1);
        const int z0 = max(qc[2] - r, 0), z1 = min(qc[2] + r, g.dims[2] - 1);
        for (int cx = x0; cx <= x1; ++cx) {
            const bool fx = abs(cx - qc[0]) == r;
            const double gx = axis_gap(g, qf[0], 0, cx, cx);
            for (int cy = y0; cy <= y1; ++cy) {
                const bool fy = abs(cy - qc[1]) == r;
                const double gy = axis_gap(g, qf[1], 1, cy, cy);
                if (fx || fy) {
                    knn_scan(g, start, sorted, qx, qy, qz, qf, gx, gy, cx, cy, z0, z1, best);
                } else {
                    if (qc[2] - r >= 0) knn_scan(g, start, sorted, qx, qy, qz, qf, gx, gy, cx, cy, qc[2] - r, qc[2] - r, best);
                    if (qc[2] + r < g.dims[2]) knn_scan(g, start, sorted, qx, qy, qz, qf, gx, gy, cx, cy, qc[2] + r, qc[2] + r, best);
                }
            }
        }
        if (best.kth != KEY_NONE) {
            double gap = __longlong_as_double(0x7ff0000000000000ll);
            for (int a = 0; a < 3; ++a) {
                if (qc[a] - r > 0) gap = fmin(gap, qf[a] - (g.origin[a] + (double)(qc[a] - r) * g.h));
                if (qc[a] + r < g.dims[a] - 1) gap = fmin(gap, (g.origin[a] + (double)(qc[a] + r + 1) * g.h) - qf[a]);
            }
            if (isinf(gap)) break;
            const double gg = fmax(gap - g.margin, 0.0);
            const float kd = __uint_as_float((unsigned int)(best.kth >> 32));
            if ((double)kd < d2_lower_bound(gg * gg)) break;
        }
    }
}

// One warp per query (k <= 32), cells enumerated 32 at a time: each lane takes one column (cx, cy)
// of the current shell, loads the start offsets of its run(s) (the full z-run for columns on the
// shell's xy boundary, the two z-planes qz -/+ r for interior columns) unless the run's lower bound
// already exceeds the k-th distance, then the points of all the lanes' runs are packed 32 per step
// (warp scan of the run lengths, owner lane found by binary search over the prefix) and inserted.
// Shell 0 (the query's cell) goes alone first, so that in dense cells (the grid is sized from the
// mean density; lidar cells near the sensor hold hundreds of points) the k-th distance prunes the
// runs of shell 1 before they are read. Once the shell reaches past both
// z ends, interior columns hold no cells and only the shell's xy perimeter is enumerated, so a
// query in a sparse region pays ~8r/32 warp steps per shell instead of one dependent load per cell.
// Same cells, same conservative bounds and same stop test as knn_one: the result is identical.
__device__ __forceinline__ void warp_knn_cells(const GridParams& g, const unsigned int* __restrict__ start,
                                               const float4* __restrict__ sorted, float qx, float qy, float qz,
                                               WarpList& best) {
    const unsigned int lane = best.lane;
    const double qf[3] = {(double)qx, (double)qy, (double)qz};
    const int qc[3] = {cell_coord(g, qf[0], 0), cell_coord(g, qf[1], 1), cell_coord(g, qf[2], 2)};
    int max_r = 0;
    for (int a = 0; a < 3; ++a) max_r = max(max_r, max(qc[a], g.dims[a] - 1 - qc[a]));
    for (int r = 0; r <= max_r; ++r) {
        const bool cube = r == 0; // the query's own cell
        const int x0 = max(qc[0] - r, 0), x1 = min(qc[0] + r, g.dims[0] - 1);
        const int y0 = max(qc[1] - r, 0), y1 = min(qc[1] + r, g.dims[1] - 1);
        const int z0 = max(qc[2] - r, 0), z1 = min(qc[2] + r, g.dims[2] - 1);
        const bool zlo = qc[2] - r >= 0, zhi = qc[2] + r < g.dims[2];
        const bool square = cube || zlo || zhi; // else only the xy perimeter holds cells
        const int W = x1 - x0 + 1, H = y1 - y0 + 1;
        const bool rx0 = qc[0] - r >= 0, rx1 = qc[0] + r < g.dims[0];
        const bool ry0 = qc[1] - r >= 0, ry1 = qc[1] + r < g.dims[1];
        const int xi0 = x0 + (int)rx0, xi1 = x1 - (int)rx1;
        const int Wi = max(xi1 - xi0 + 1, 0);
        const int nrowc = ((int)rx0 + (int)rx1) * H;
        const int ncol = square ? W * H : nrowc + ((int)ry0 + (int)ry1) * Wi;
        for (int base = 0; base < ncol; base += 32) {
            const int j = base + (int)lane;
            const float kd = __uint_as_float((unsigned int)(best.kth >> 32)); // NaN while not full
            const bool full = best.kth != KEY_NONE;
            unsigned int a0 = 0, l0 = 0, a1 = 0, l1 = 0;
            if (j < ncol) {
                int cx, cy;
                if (square) {
                    cx = x0 + j / H;
                    cy = y0 + j % H;
                } else if (j < nrowc) {
                    cx = (rx0 && j < H) ? x0 : x1;
                    cy = y0 + j % H;
                } else {
                    const int t = j - nrowc;
                    cy = (ry0 && t < Wi) ? y0 : y1;
                    cx = xi0 + t % Wi;
                }
                const double gx = axis_gap(g, qf[0], 0, cx, cx);
                const double gy = axis_gap(g, qf[1], 1, cy, cy);
                const double gxy = gx * gx + gy * gy;
                if (cube || abs(cx - qc[0]) == r || abs(cy - qc[1]) == r) {
                    const double gz = axis_gap(g, qf[2], 2, z0, z1);
                    if (!(full && (double)kd < d2_lower_bound(gxy + gz * gz))) {
                        a0 = start[cell_id(g, cx, cy, z0)];
                        l0 = start[cell_id(g, cx, cy, z1) + 1u] - a0;
                    }
                } else {
                    if (zlo) {
                        const double gz = axis_gap(g, qf[2], 2, qc[2] - r, qc[2] - r);
                        if (!(full && (double)kd < d2_lower_bound(gxy + gz * gz))) {
                            const unsigned int c = cell_id(g, cx, cy, qc[2] - r);
                            a0 = start[c];
                            l0 = start[c + 1u] - a0;
                        }
                    }
                    if (zhi) {
                        const double gz = axis_gap(g, qf[2], 2, qc[2] + r, qc[2] + r);
                        if (!(full && (double)kd < d2_lower_bound(gxy + gz * gz))) {
                            const unsigned int c = cell_id(g, cx, cy, qc[2] + r);
                            a1 = start[c];
                            l1 = start[c + 1u] - a1;
                        }
                    }
                }
            }
            const unsigned int cnt = l0 + l1;
            const unsigned int incl = lk_warp_incl_scan(cnt);
            const unsigned int total = __shfl_sync(0xffffffffu, incl, 31);
            for (unsigned int e0 = 0; e0 < total; e0 += 32u) {
                const unsigned int e = e0 + lane;
                // Owner: the first lane whose inclusive prefix exceeds e.
                int jl = 0;
#pragma unroll
                for (int step = 16; step > 0; step >>= 1) {
                    const unsigned int v = __shfl_sync(0xffffffffu, incl, jl + step - 1);
                    if (v <= e) jl += step;
                }
                const unsigned int inc_j = __shfl_sync(0xffffffffu, incl, jl);
                const unsigned int cnt_j = __shfl_sync(0xffffffffu, cnt, jl);
                const unsigned int a0_j = __shfl_sync(0xffffffffu, a0, jl);
                const unsigned int l0_j = __shfl_sync(0xffffffffu, l0, jl);
                const unsigned int a1_j = __shfl_sync(0xffffffffu, a1, jl);
                u64 key = KEY_NONE;
                if (e < total) {
                    const unsigned int off = e - (inc_j - cnt_j);
                    const unsigned int pos = off < l0_j ? a0_j + off : a1_j + (off - l0_j);
                    const float4 p = sorted[pos];
                    const float d = lk_dist2(p.x, p.y, p.z, qx, qy, qz);
                    key = ((u64)__float_as_uint(d) << 32) | (u64)__float_as_uint(p.w);
                }
                unsigned int mask = __ballot_sync(0xffffffffu, key < best.kth);
                while (mask) {
                    const int src = __ffs(mask) - 1;
                    mask &= mask - 1u;
                    const u64 kk = __shfl_sync(0xffffffffu, key, src);
                    if (kk < best.kth) best.insert(kk);
                }
            }
        }
        if (best.kth != KEY_NONE) {
            double gap = __longlong_as_double(0x7ff0000000000000ll);
            for (int a = 0; a < 3; ++a) {
                if (qc[a] - r > 0) gap = fmin(gap, qf[a] - (g.origin[a] + (double)(qc[a] - r) * g.h));
                if (qc[a] + r < g.dims[a] - 1) gap = fmin(gap, (g.origin[a] + (double)(qc[a] + r + 1) * g.h) - qf[a]);
            }
            if (isinf(gap)) break;
            const double gg = fmax(gap - g.margin, 0.0);
            const float kd = __uint_as_float((unsigned int)(best.kth >> 32));
            if ((double)kd < d2_lower_bound(gg * gg)) break;
        }
    }
}

extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK)
knn_warp_cells(const float* __restrict__ qxyz, unsigned long long qstride, unsigned int m,
               const GridParams* __restrict__ gp, const unsigned int* __restrict__ start,
               const float4* __restrict__ sorted, unsigned int k, int* __restrict__ out_idx, float* __restrict__ out_d,
               u64* /*scratch*/) {
    const unsigned int q = (blockIdx.x * NEIGHBORS_BLOCK + threadIdx.x) >> 5;
    if (q >= m) return; // warp-uniform
    const GridParams g = *gp;
    const float qx = qxyz[q], qy = qxyz[qstride + q], qz = qxyz[2 * qstride + q];
    WarpList best;
    best.init(k, nullptr);
    if (g.ncells > 0 && lk_finite3(qx, qy, qz)) warp_knn_cells(g, start, sorted, qx, qy, qz, best);
    best.emit_knn(out_idx + (u64)q * k, out_d + (u64)q * k);
}

template <class L>
__device__ __forceinline__ unsigned int query_index();
template <>
__device__ __forceinline__ unsigned int query_index<WarpList>() { return (blockIdx.x * NEIGHBORS_BLOCK + threadIdx.x) >> 5; }
template <class L>
__device__ __forceinline__ unsigned int query_index() { return blockIdx.x * NEIGHBORS_BLOCK + threadIdx.x; }

template <class L>
__device__ __forceinline__ void knn_kernel_body(const float* __restrict__ qxyz, unsigned long long qstride, unsigned int m,
                                                const GridParams* __restrict__ gp, const unsigned int* __restrict__ start,
                                                const float4* __restrict__ sorted, unsigned int k, int* __restrict__ out_idx,
                                                float* __restrict__ out_d, u64* scratch) {
    const unsigned int q = query_index<L>();
    if (q >= m) return;
    const GridParams g = *gp;
    const float qx = qxyz[q], qy = qxyz[qstride + q], qz = qxyz[2 * qstride + q];
    L best;
    best.init(k, scratch + (u64)q * k);
    if (g.ncells > 0 && lk_finite3(qx, qy, qz)) knn_one(g, start, sorted, qx, qy, qz, best);
    int* oi = out_idx + (u64)q * k;
    float* od = out_d + (u64)q * k;
    best.emit_knn(oi, od);
}

#define KNN_ARGS                                                                                             \
    const float *__restrict__ qxyz, unsigned long long qstride, unsigned int m, const GridParams *__restrict__ gp, \
        const unsigned int *__restrict__ start, const float4 *__restrict__ sorted, unsigned int k,                \
        int *__restrict__ out_idx, float *__restrict__ out_d, u64 *scratch
#define KNN_PASS qxyz, qstride, m, gp, start, sorted, k, out_idx, out_d, scratch

extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK) knn_global(KNN_ARGS) { knn_kernel_body<GlobalList>(KNN_PASS); }

// ------------------------------------------------------------------------------------------------
// Ball query. pad_first: 1 = FirstFound, 0 = Minus1.

template <class L>
__device__ __forceinline__ void ball_kernel_body(const float* __restrict__ qxyz, unsigned long long qstride, unsigned int m,
                                                 const GridParams* __restrict__ gp, const unsigned int* __restrict__ start,
                                                 const float4* __restrict__ sorted, unsigned int ns, float radius,
                                                 float r2, float rmin2, unsigned int pad_first, int* __restrict__ out_idx,
                                                 unsigned int* __restrict__ out_cnt, u64* scratch) {
    const unsigned int q = query_index<L>();
    if (q >= m) return;
    const GridParams g = *gp;
    const float qx = qxyz[q], qy = qxyz[qstride + q], qz = qxyz[2 * qstride + q];
    L best;
    best.init(ns, scratch + (u64)q * ns);
    unsigned int found = 0;
    if (g.ncells > 0 && lk_finite3(qx, qy, qz)) {
        const double qf[3] = {(double)qx, (double)qy, (double)qz};
        const double reach = (double)radius * (1.0 + 1e-5) + g.margin;
        int lo[3], hi[3];
        for (int a = 0; a < 3; ++a) {
            lo[a] = cell_coord(g, qf[a] - reach, a);
            hi[a] = cell_coord(g, qf[a] + reach, a);
        }
        const double reach2 = reach * reach;
        for (int cx = lo[0]; cx <= hi[0]; ++cx) {
            const double gx = axis_gap(g, qf[0], 0, cx, cx);
            for (int cy = lo[1]; cy <= hi[1]; ++cy) {
                const double gy = axis_gap(g, qf[1], 1, cy, cy);
                if (gx * gx + gy * gy > reach2) continue;
                const unsigned int a = start[cell_id(g, cx, cy, lo[2])];
                const unsigned int b = start[cell_id(g, cx, cy, hi[2]) + 1u];
                best.ball_run(sorted, a, b, qx, qy, qz, r2, rmin2, found);
            }
        }
    }
    const unsigned int cnt = found < ns ? found : ns;
    out_cnt[q] = cnt;
    int* oi = out_idx + (u64)q * ns;
    const int pad = (cnt > 0 && pad_first) ? (int)(unsigned int)best.first() : -1;
    best.emit_ball(oi, cnt, pad);
}

#define BALL_ARGS                                                                                            \
    const float *__restrict__ qxyz, unsigned long long qstride, unsigned int m, const GridParams *__restrict__ gp, \
        const unsigned int *__restrict__ start, const float4 *__restrict__ sorted, unsigned int ns, float radius,  \
        float r2, float rmin2, unsigned int pad_first, int *__restrict__ out_idx, unsigned int *__restrict__ out_cnt, \
        u64 *scratch
#define BALL_PASS qxyz, qstride, m, gp, start, sorted, ns, radius, r2, rmin2, pad_first, out_idx, out_cnt, scratch

extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK) ball_global(BALL_ARGS) { ball_kernel_body<GlobalList>(BALL_PASS); }
extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK) ball_warp(BALL_ARGS) { ball_kernel_body<WarpList>(BALL_PASS); }

// The `neighborhoods` message's records on the device, so the host copies them once into the
// published message instead of writing 24 bytes per slot itself. One thread per slot: x, y, z of
// the neighbour (the float32 point the search read; NaN, 0x7fc00000 like Rust's f32::NAN, in KNN
// padding), its index, the row (query) and the query's index in the searched cloud. Rows row0 ..
// row0 + slots / width of a search (idx, samples and out start at row0). Layout:
// `ops::neighbors::neighborhoods_message_in`.
extern "C" __global__ void __launch_bounds__(NEIGHBORS_BLOCK)
nbr_records(const float* __restrict__ cols, unsigned long long stride, const int* __restrict__ idx,
            const int* __restrict__ samples, unsigned int width, unsigned long long slots, unsigned int row0,
            unsigned int* __restrict__ out) {
    for (unsigned long long t = (unsigned long long)blockIdx.x * NEIGHBORS_BLOCK + threadIdx.x; t < slots;
         t += (unsigned long long)gridDim.x * NEIGHBORS_BLOCK) {
        const int i = idx[t];
        const unsigned long long q = t / width;
        unsigned int* rec = out + 6ull * t;
        if (i < 0) {
            rec[0] = rec[1] = rec[2] = 0x7fc00000u;
        } else {
            rec[0] = __float_as_uint(cols[i]);
            rec[1] = __float_as_uint(cols[stride + i]);
            rec[2] = __float_as_uint(cols[2ull * stride + i]);
        }
        rec[3] = (unsigned int)i;
        rec[4] = row0 + (unsigned int)q;
        rec[5] = (unsigned int)__ldcg(samples + q); // from L2: select_xyz saw it written there, FPS may still run
    }
}
