// The detector (src/ops/detect/mod.rs has the semantics and the CPU reference): ground levels,
// point classes, connected components of object cells, minimum-area boxes.
//
// Every result the CPU reference computes as a minimum, maximum, count or lowest index is reached
// here with integer atomics (floats through an order-preserving key), so scheduling changes no
// bit. Components come from a lock-free union-find whose roots may differ run to run; nothing
// read out depends on the root, only on the set. Candidates get their rank (= order of their
// label) by counting smaller labels, as nms_rank does, or for many candidates from a scan.
#include "common.cuh"

#define DET_BLOCK 256
#define DET_NONE 0xffffffffu
// Most headings a fit block handles (one thread per heading; DetectParams allows 1..=1024).
#define DET_MAX_ANGLES 1024

// Must match `DetectArgs` in src/ops/detect/cuda.rs.
struct DetectArgs {
    float range;
    float ground_cell;
    float cluster_cell;
    float height_tol;
    float max_height;
    float max_extent;
    float max_length;
    float max_width;
    float min_height;
    float score_half;
    unsigned int n;
    unsigned int stride;      // column stride of x, y, z
    unsigned int gg;          // ground grid side
    unsigned int gc;          // cluster grid side
    unsigned int window;
    unsigned int min_points;
    unsigned int max_points;
    unsigned int angles;
    unsigned int cand_capacity;
    float end_on_length;
    // Per window (car, car_end_on, pedestrian, cyclist): length, width, height, clearance as [min, max].
    float classes[4][8];
};
static_assert(sizeof(DetectArgs) == 208, "DetectArgs: size differs from src/ops/detect/cuda.rs");

// Must match `ClusterRecord` in src/ops/detect/cuda.rs.
struct ClusterRecord {
    float box[7];  // x y z length width height yaw
    float clearance;
    float score;
    unsigned int label;
    unsigned int points;
    int cls;
};
static_assert(sizeof(ClusterRecord) == 48, "ClusterRecord: size differs from src/ops/detect/cuda.rs");

// Counters: components, candidates, kept.
#define C_COMPONENTS 0
#define C_CANDIDATES 1
#define C_KEPT 2

// A float's IEEE totalOrder as an unsigned key (atomicMin/Max of keys = min/max of values).
__device__ __forceinline__ unsigned int det_key(float f) {
    const unsigned int b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float det_value(unsigned int k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// ops::detect::min_total / max_total.
__device__ __forceinline__ float det_min(float a, float b) { return det_key(b) < det_key(a) ? b : a; }
__device__ __forceinline__ float det_max(float a, float b) { return det_key(b) > det_key(a) ? b : a; }

// ops::detect::grid_cell: the cell of v, or DET_NONE off the grid.
__device__ __forceinline__ unsigned int det_cell(float v, float range, float cell, unsigned int g) {
    const float f = floorf(__fdiv_rn(__fadd_rn(v, range), cell));
    return (f >= 0.0f && f < (float)g) ? (unsigned int)f : DET_NONE;
}

__device__ __forceinline__ unsigned int det_cell2(float x, float y, float range, float cell, unsigned int g) {
    const unsigned int ix = det_cell(x, range, cell, g);
    const unsigned int iy = det_cell(y, range, cell, g);
    return (ix == DET_NONE || iy == DET_NONE) ? DET_NONE : ix * g + iy;
}

// Per-frame reset of the grids and the per-root statistics (stats: 9 words per cluster cell:
// count, label, lo x y z, hi x y z, clearance).
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_init(DetectArgs a, unsigned int* lowest, unsigned int* first, unsigned int* parent, unsigned int* stats,
         unsigned int* cand_of_root, unsigned int* counters) {
    const unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned int cg = a.gg * a.gg, cc = a.gc * a.gc;
    if (c < 4) counters[c] = 0;
    if (c < cg) lowest[c] = DET_NONE;
    if (c < cc) {
        first[c] = DET_NONE;
        parent[c] = c;
        cand_of_root[c] = DET_NONE;
        unsigned int* s = stats + 9ull * c;
        s[0] = 0;
        s[1] = DET_NONE;
        s[2] = s[3] = s[4] = DET_NONE;
        s[5] = s[6] = s[7] = 0;
        s[8] = DET_NONE;
    }
}

// Step 2's input: the lowest z of each ground cell.
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_lowest(DetectArgs a, const float* __restrict__ xyz, unsigned int* gcell, unsigned int* lowest) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n) return;
    const float x = xyz[i], y = xyz[a.stride + i], z = xyz[2ull * a.stride + i];
    const unsigned int c = det_cell2(x, y, a.range, a.ground_cell, a.gg);
    gcell[i] = c;
    if (c != DET_NONE) atomicMin(&lowest[c], det_key(z));
}

// Step 2, one axis: out[c] = min over |d| <= W of in[c +- d*pitch] + step[d], along y (pitch 1)
// or x (pitch gg). Empty ground cells hold DET_NONE in `lowest` (read as +inf).
template <bool KEYS>
__device__ __forceinline__ void det_envelope(const DetectArgs& a, const void* in, float* out, const float* steps,
                                             bool along_x) {
    const unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.gg * a.gg) return;
    const unsigned int i = along_x ? c / a.gg : c % a.gg;
    const unsigned int pitch = along_x ? a.gg : 1u;
    auto get = [&](unsigned int cell) {
        if (KEYS) {
            const unsigned int k = ((const unsigned int*)in)[cell];
            return k == DET_NONE ? __int_as_float(0x7f800000) : det_value(k);
        }
        return ((const float*)in)[cell];
    };
    float m = get(c);
    for (unsigned int d = 1; d <= a.window; ++d) {
        if (i >= d) m = det_min(m, __fadd_rn(get(c - d * pitch), steps[d]));
        if (i + d < a.gg) m = det_min(m, __fadd_rn(get(c + d * pitch), steps[d]));
    }
    out[c] = m;
}

extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_envelope_y(DetectArgs a, const unsigned int* lowest, float* rows, const float* steps) {
    det_envelope<true>(a, lowest, rows, steps, false);
}
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_envelope_x(DetectArgs a, const float* rows, float* level, const float* steps) {
    det_envelope<false>(a, rows, level, steps, true);
}

// Step 3 and the occupied cluster cells (first = lowest object point index).
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_classify(DetectArgs a, const float* __restrict__ xyz, const unsigned int* gcell, const float* level,
             unsigned char* pclass, float* above, unsigned int* ccell, unsigned int* first) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n) return;
    const unsigned int g = gcell[i];
    unsigned int cc = DET_NONE;
    if (g == DET_NONE) {
        pclass[i] = 3;
        above[i] = 0.0f;
    } else {
        const float z = xyz[2ull * a.stride + i];
        const float lv = level[g];
        unsigned char k = 2;
        if (z <= __fadd_rn(lv, a.height_tol)) {
            k = 1;
        } else if (z <= __fadd_rn(lv, a.max_height)) {
            k = 0;
            cc = det_cell2(xyz[i], xyz[a.stride + i], a.range, a.cluster_cell, a.gc);
            if (cc != DET_NONE) atomicMin(&first[cc], i);
        }
        pclass[i] = k;
        above[i] = __fsub_rn(z, lv);
    }
    ccell[i] = cc;
}

__device__ __forceinline__ unsigned int det_find(volatile unsigned int* parent, unsigned int a) {
    unsigned int p = parent[a];
    while (p != a) {
        // Path halving: any ancestor is a valid parent, so racing writes keep the forest valid.
        const unsigned int gp = parent[p];
        parent[a] = gp;
        a = gp;
        p = parent[a];
    }
    return a;
}

// Step 4: union of touching occupied cells (the 4 neighbours after c in a raster walk), hooking
// the larger root under the smaller with a CAS that retries when another thread moved it.
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_union(DetectArgs a, const unsigned int* first, unsigned int* parent) {
    const unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.gc * a.gc || first[c] == DET_NONE) return;
    const int g = (int)a.gc, ix = (int)(c / a.gc), iy = (int)(c % a.gc);
    const int d[4][2] = {{0, 1}, {1, -1}, {1, 0}, {1, 1}};
    for (int k = 0; k < 4; ++k) {
        const int nx = ix + d[k][0], ny = iy + d[k][1];
        if (nx < 0 || ny < 0 || nx >= g || ny >= g) continue;
        const unsigned int nc = (unsigned int)(nx * g + ny);
        if (first[nc] == DET_NONE) continue;
        unsigned int ra = det_find(parent, c), rb = det_find(parent, nc);
        while (ra != rb) {
            if (ra < rb) {
                const unsigned int t = ra;
                ra = rb;
                rb = t;
            }
            const unsigned int old = atomicCAS(&parent[ra], ra, rb);
            if (old == ra) break;
            ra = det_find(parent, old);
            rb = det_find(parent, rb);
        }
    }
}

// Every occupied cell's parent becomes its root. The walk does not halve paths: a halving write
// racing with this kernel's own root writes could leave a cell pointing at a non-root.
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_flatten(DetectArgs a, const unsigned int* first, unsigned int* parent) {
    const unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.gc * a.gc || first[c] == DET_NONE) return;
    volatile unsigned int* vp = parent;
    unsigned int r = vp[c];
    while (vp[r] != r) r = vp[r];
    vp[c] = r;
}

// Per component (at its root cell): point count, label, extent, clearance.
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_stats(DetectArgs a, const float* __restrict__ xyz, const unsigned int* ccell, const float* above,
          const unsigned int* parent, unsigned int* stats) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n || ccell[i] == DET_NONE) return;
    unsigned int* s = stats + 9ull * parent[ccell[i]];
    atomicAdd(&s[0], 1u);
    atomicMin(&s[1], i);
    for (int k = 0; k < 3; ++k) {
        const unsigned int key = det_key(xyz[(unsigned long long)k * a.stride + i]);
        atomicMin(&s[2 + k], key);
        atomicMax(&s[5 + k], key);
    }
    atomicMin(&s[8], det_key(above[i]));
}

// Step 4's candidates, appended in any order (ranked next).
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_candidates(DetectArgs a, const unsigned int* first, const unsigned int* parent, const unsigned int* stats,
               unsigned int* cand_label, unsigned int* cand_root, unsigned int* label_flag, unsigned int* counters) {
    const unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.gc * a.gc || first[c] == DET_NONE || parent[c] != c) return;
    atomicAdd(&counters[C_COMPONENTS], 1u);
    const unsigned int* s = stats + 9ull * c;
    const bool fits = s[0] >= a.min_points && s[0] <= a.max_points &&
                      __fsub_rn(det_value(s[5]), det_value(s[2])) <= a.max_extent &&
                      __fsub_rn(det_value(s[6]), det_value(s[3])) <= a.max_extent;
    if (!fits) return;
    label_flag[s[1]] = 1;
    const unsigned int slot = atomicAdd(&counters[C_CANDIDATES], 1u);
    if (slot < a.cand_capacity) {
        cand_label[slot] = s[1];
        cand_root[slot] = c;
    }
}

// Up to this many candidates, a candidate's rank is counted (k threads x k labels); beyond, it
// is read from an exclusive scan of the label flags over all points (one block, O(points)), so a
// cloud of scattered points with min_points 1 costs milliseconds, not k^2.
#define DET_RANK_COUNT_MAX 4096u

// One block: out[q] = sum of in[0..q) for q < k; returns the sum to every thread.
__device__ __forceinline__ unsigned int det_block_scan(const unsigned int* in, unsigned int* out, unsigned int k) {
    __shared__ unsigned int s_warp[32];
    unsigned int carry = 0;
    for (unsigned int base = 0; base < k; base += 1024) {
        const unsigned int q = base + threadIdx.x;
        const unsigned int v = q < k ? in[q] : 0u;
        unsigned int total;
        const unsigned int excl = lk_block_excl_scan<32>(v, s_warp, &total);
        if (q < k) out[q] = carry + excl;
        carry += total;
    }
    return carry;
}

// One block: out[q] = sum of in[0..q) for q < counters[which]; counters[total_to] = the sum.
extern "C" __global__ void __launch_bounds__(1024)
det_scan(const unsigned int* in, unsigned int* out, unsigned int* counters, unsigned int which,
         unsigned int total_to) {
    const unsigned int carry = det_block_scan(in, out, counters[which]);
    if (threadIdx.x == 0 && total_to < 4) counters[total_to] = carry;
}

// The ranks of many candidates: label_rank[i] = candidate labels below point i.
extern "C" __global__ void __launch_bounds__(1024)
det_label_ranks(DetectArgs a, const unsigned int* counters, const unsigned int* label_flag, unsigned int* label_rank) {
    if (counters[C_CANDIDATES] <= DET_RANK_COUNT_MAX) return;
    det_block_scan(label_flag, label_rank, a.n);
}

// Rank of each candidate = number of smaller labels (labels are distinct point indices).
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_rank(DetectArgs a, const unsigned int* cand_label, const unsigned int* cand_root, const unsigned int* stats,
         const unsigned int* counters, const unsigned int* label_rank, unsigned int* cand_of_root,
         unsigned int* root_by_rank, unsigned int* count_by_rank) {
    const unsigned int j = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned int k = counters[C_CANDIDATES];
    if (j >= k) return;
    const unsigned int mine = cand_label[j];
    unsigned int rank = 0;
    if (k <= DET_RANK_COUNT_MAX) {
        for (unsigned int q = 0; q < k; ++q) rank += cand_label[q] < mine;
    } else {
        rank = label_rank[mine];
    }
    const unsigned int root = cand_root[j];
    cand_of_root[root] = rank;
    root_by_rank[rank] = root;
    count_by_rank[rank] = stats[9ull * root];
}

// Candidate point lists (order within a list is free: the fit only takes minima and maxima).
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_scatter(DetectArgs a, const unsigned int* ccell, const unsigned int* parent, const unsigned int* cand_of_root,
            const unsigned int* offsets, unsigned int* cursor, unsigned int* members) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n || ccell[i] == DET_NONE) return;
    const unsigned int q = cand_of_root[parent[ccell[i]]];
    if (q == DET_NONE) return;
    members[offsets[q] + atomicAdd(&cursor[q], 1u)] = i;
}

__device__ __forceinline__ bool det_within(float v, const float* w) { return v >= w[0] && v <= w[1]; }

// Steps 5 and 6, one block per candidate, one thread per heading; headings = (yaw, sin, cos).
extern "C" __global__ void __launch_bounds__(DET_MAX_ANGLES)
det_fit(DetectArgs a, const float* __restrict__ xyz, const unsigned int* counters, const unsigned int* root_by_rank,
        const unsigned int* count_by_rank, const unsigned int* offsets, const unsigned int* members,
        const unsigned int* stats, const float* headings, ClusterRecord* records, unsigned int* kept) {
    __shared__ float s_area[DET_MAX_ANGLES];
    __shared__ float s_ext[DET_MAX_ANGLES][4];
    const unsigned int q = blockIdx.x;
    if (q >= counters[C_CANDIDATES]) return;
    const unsigned int t = threadIdx.x;
    const unsigned int begin = offsets[q], len = count_by_rank[q];
    if (t < a.angles) {
        const float s = headings[3 * t + 1], c = headings[3 * t + 2];
        const float inf = __int_as_float(0x7f800000);
        float r0 = inf, r1 = -inf, r2 = inf, r3 = -inf;
        for (unsigned int m = 0; m < len; ++m) {
            const unsigned int i = members[begin + m];
            const float x = xyz[i], y = xyz[a.stride + i];
            const float u = __fadd_rn(__fmul_rn(x, c), __fmul_rn(y, s));
            const float v = __fsub_rn(__fmul_rn(y, c), __fmul_rn(x, s));
            r0 = det_min(r0, u);
            r1 = det_max(r1, u);
            r2 = det_min(r2, v);
            r3 = det_max(r3, v);
        }
        s_area[t] = __fmul_rn(__fsub_rn(r1, r0), __fsub_rn(r3, r2));
        s_ext[t][0] = r0;
        s_ext[t][1] = r1;
        s_ext[t][2] = r2;
        s_ext[t][3] = r3;
    }
    __syncthreads();
    if (t != 0) return;
    unsigned int best = 0;
    for (unsigned int k = 1; k < a.angles; ++k)
        if (s_area[k] < s_area[best]) best = k;
    const float* r = s_ext[best];
    const float yaw = headings[3 * best], s = headings[3 * best + 1], c = headings[3 * best + 2];
    const unsigned int* st = stats + 9ull * root_by_rank[q];
    const float zmin = det_value(st[4]), zmax = det_value(st[7]);
    const float du = __fsub_rn(r[1], r[0]), dv = __fsub_rn(r[3], r[2]);
    const float cu = __fmul_rn(__fadd_rn(r[0], r[1]), 0.5f), cv = __fmul_rn(__fadd_rn(r[2], r[3]), 0.5f);
    ClusterRecord out;
    out.box[0] = __fsub_rn(__fmul_rn(cu, c), __fmul_rn(cv, s));
    out.box[1] = __fadd_rn(__fmul_rn(cu, s), __fmul_rn(cv, c));
    out.box[2] = __fmul_rn(__fadd_rn(zmin, zmax), 0.5f);
    const bool along = du >= dv;
    const float turned = __fadd_rn(yaw, 1.57079637f);  // fl(pi/2)
    out.box[3] = along ? du : dv;
    out.box[4] = along ? dv : du;
    out.box[5] = __fsub_rn(zmax, zmin);
    out.box[6] = along ? yaw : turned;
    out.clearance = det_value(st[8]);
    out.label = st[1];
    out.points = st[0];
    const float n = (float)st[0];
    out.score = __fdiv_rn(n, __fadd_rn(n, a.score_half));
    kept[q] = out.box[3] <= a.max_length && out.box[4] <= a.max_width && out.box[5] >= a.min_height;
    // Step 6: the first window that holds the box. The end-on car window counts only where the
    // box's long side faces the sensor (only then can the rest of a car hide behind it), and it
    // completes the box to a car behind that side.
    const float ax[2] = {along ? c : -s, along ? s : c};
    const float cx[2] = {along ? -s : c, along ? c : s};
    out.cls = 3;
    for (int k = 0; k < 4; ++k) {
        const float* w = a.classes[k];
        if (!(det_within(out.box[3], w) && det_within(out.box[4], w + 2) && det_within(out.box[5], w + 4) &&
              det_within(out.clearance, w + 6)))
            continue;
        if (k != 1) {
            out.cls = k == 0 ? 0 : k - 1;
            break;
        }
        const float toward = __fadd_rn(__fmul_rn(out.box[0], cx[0]), __fmul_rn(out.box[1], cx[1]));
        const float sideways = __fadd_rn(__fmul_rn(out.box[0], ax[0]), __fmul_rn(out.box[1], ax[1]));
        if (fabsf(toward) < fabsf(sideways)) continue;
        const float awx = toward < 0.0f ? -cx[0] : cx[0], awy = toward < 0.0f ? -cx[1] : cx[1];
        const float h = __fmul_rn(__fsub_rn(a.end_on_length, out.box[4]), 0.5f);
        out.box[0] = __fadd_rn(out.box[0], __fmul_rn(h, awx));
        out.box[1] = __fadd_rn(out.box[1], __fmul_rn(h, awy));
        out.box[4] = out.box[3];
        out.box[3] = a.end_on_length;
        out.box[6] = along ? turned : yaw;
        out.cls = 0;
        break;
    }
    records[q] = out;
}

// Step 7: each kept cluster's record at its id; each point's label.
extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_compact(const unsigned int* counters, const ClusterRecord* records, const unsigned int* kept,
            const unsigned int* ids, ClusterRecord* out) {
    const unsigned int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q < counters[C_CANDIDATES] && kept[q]) out[ids[q]] = records[q];
}

extern "C" __global__ void __launch_bounds__(DET_BLOCK)
det_labels(DetectArgs a, const unsigned int* ccell, const unsigned int* parent, const unsigned int* cand_of_root,
           const unsigned int* kept, const unsigned int* ids, int* labels) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.n) return;
    int label = -1;
    if (ccell[i] != DET_NONE) {
        const unsigned int q = cand_of_root[parent[ccell[i]]];
        if (q != DET_NONE && kept[q]) label = (int)ids[q];
    }
    labels[i] = label;
}
