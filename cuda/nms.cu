// Non-maximum suppression on the device: sort, suppression bitmask, greedy sweep, keep list.
// Semantics and every formula: src/ops/nms/mod.rs (the CPU reference). Host side: src/ops/nms/cuda.rs.
//
// Pipeline (one stream, no host round trip):
//   nms_keys        per input box: 64-bit key (descending score bits << 32 | index) for candidates
//                   (score >= score_threshold), all-ones otherwise; counts candidates.
//   nms_sort_tiles  sorts each tile of 1024 keys in a block (bitonic);
//   nms_merge_rank  a key's rank = its place in its tile + a binary search in every other tile
//                   (keys are unique, so the ranks are a permutation: an exact, deterministic sort
//                   in n * tiles * log(1024) steps instead of the n^2 of pairwise counting).
//   nms_prep        candidates with rank < pre_max_size: order[rank] = i and the kind's per-box
//                   preparation (exact f32, see ops/nms/mod.rs) stored by rank; the bounds of the
//                   box centres.
//   Groups of 64 boxes: spatially compact ones (the default; src/ops/nms/cuda.rs says when the
//   rank tiles are used instead):
//     nms_morton       a Morton key of each candidate's centre, sorted with the two kernels above,
//     nms_groups       so that groups of 64 consecutive boxes in that order are spatially compact:
//                      each group's culling rectangle, its boxes' prep and score ranks in that order.
//     nms_group_pairs  the pairs of groups whose rectangles can hold a suppressing pair (two boxes
//                      far apart never suppress each other, and the score order alone gives no
//                      such locality); with rank tiles, every pair of tiles.
//   nms_mask_*      blocks stride over those pairs: a 64 x 64 bit block per pair, where row b
//                   holds the boxes of the other group that suppress box b (each pair tested once,
//                   as (higher rank, lower rank)); the blocks with a bit set are listed.
//   nms_sweep       the greedy keep list as a fixed point, in rounds over the whole grid (a
//                   cooperative launch): a box suppressed by a kept box is removed, a box that no
//                   kept or unresolved box suppresses is kept. Writes the keep list (input indices).
//
// The live blocks' order depends on scheduling, but the sweep only ORs over them, so the keep
// list is a function of the input alone. All arithmetic of the overlap tests uses
// __fadd_rn/__fsub_rn/__fmul_rn/__fdiv_rn (never contracted into FMA, whatever the flags) in the
// exact order of the CPU reference.

#include "common.cuh"

// 64 boxes per tile: one u64 suppression word per (row, column tile); the mask kernel runs one
// thread per row of a tile (TILE in src/ops/nms/cuda.rs).
#define NMS_TILE 64
#define NMS_BLOCK NMS_TILE

typedef unsigned int u32;

#define NMS_AUX_BLOCK 256
// Per-box preparation: PREP_STRIDE floats per rank; the class id (int bits) is the last one.
#define PREP_STRIDE 12
#define PREP_CLS 11
#define KIND_AA 0
#define KIND_ROT 1
#define KIND_CIRCLE 2
// Sweep: threads per block of the cooperative sweep.
#define SWEEP_THREADS 512

#define FULL_MASK 0xffffffffu
#define NMS_INF __int_as_float(0x7f800000)

// ------------------------------------------------------------------------------------------
// Portable sincos, op for op as ops::nms::sincos_f32.

__device__ __forceinline__ void sincos_portable(float yaw, float* s_out, float* c_out) {
    const float PIO2_C1 = __int_as_float(0x3fc90000);
    const float PIO2_C2 = __int_as_float(0x39fda000);
    const float PIO2_C3 = __int_as_float(0x33a22000);
    const float PIO2_C4 = __int_as_float(0x2c346000);
    const float PIO2_C5 = __int_as_float(0x248d3132);
    const float TWO_OVER_PI = __int_as_float(0x3f22f983);
    const float S3 = __int_as_float(0xbe2aaaab);
    const float S5 = __int_as_float(0x3c088889);
    const float S7 = __int_as_float(0xb9500d01);
    const float S9 = __int_as_float(0x3638ef1d);
    const float K4 = __int_as_float(0x3d2aaaab);
    const float K6 = __int_as_float(0xbab60b61);
    const float K8 = __int_as_float(0x37d00d01);
    const float K10 = __int_as_float(0xb493f27e);

    float k = floorf(__fadd_rn(__fmul_rn(yaw, TWO_OVER_PI), 0.5f));
    float a = __fsub_rn(__fsub_rn(yaw, __fmul_rn(k, PIO2_C1)), __fmul_rn(k, PIO2_C2));
    float b = __fmul_rn(k, PIO2_C3);
    float hi = __fsub_rn(a, b);
    float v = __fsub_rn(hi, a);
    float lo = __fsub_rn(__fsub_rn(a, __fsub_rn(hi, v)), __fadd_rn(b, v));
    lo = __fsub_rn(__fsub_rn(lo, __fmul_rn(k, PIO2_C4)), __fmul_rn(k, PIO2_C5));
    float r_hi = __fadd_rn(hi, lo);
    v = __fsub_rn(r_hi, hi);
    float r_lo = __fadd_rn(__fsub_rn(hi, __fsub_rn(r_hi, v)), __fsub_rn(lo, v));
    float q = __fsub_rn(k, __fmul_rn(4.0f, floorf(__fmul_rn(k, 0.25f))));
    float z = __fmul_rn(r_hi, r_hi);
    float p = S9;
    p = __fadd_rn(S7, __fmul_rn(z, p));
    p = __fadd_rn(S5, __fmul_rn(z, p));
    p = __fadd_rn(S3, __fmul_rn(z, p));
    float sin_r = __fadd_rn(r_hi, __fadd_rn(r_lo, __fmul_rn(__fmul_rn(z, r_hi), p)));
    float c = K10;
    c = __fadd_rn(K8, __fmul_rn(z, c));
    c = __fadd_rn(K6, __fmul_rn(z, c));
    c = __fadd_rn(K4, __fmul_rn(z, c));
    float cos_r = __fsub_rn(1.0f, __fsub_rn(__fmul_rn(0.5f, z), __fsub_rn(__fmul_rn(__fmul_rn(z, z), c), __fmul_rn(r_hi, r_lo))));
    if (q == 0.0f) {
        *s_out = sin_r; *c_out = cos_r;
    } else if (q == 1.0f) {
        *s_out = cos_r; *c_out = -sin_r;
    } else if (q == 2.0f) {
        *s_out = -sin_r; *c_out = -cos_r;
    } else {
        *s_out = -cos_r; *c_out = sin_r;
    }
}

// ------------------------------------------------------------------------------------------
// Pair tests (a = higher-ranked, b = lower-ranked), exactly as ops/nms/mod.rs.

// AA prep: 0 x1, 1 y1, 2 x2, 3 y2, 4 area.
__device__ __forceinline__ bool aa_suppresses(const float* a, const float* b, float t) {
    float w = fmaxf(__fsub_rn(fminf(a[2], b[2]), fmaxf(a[0], b[0])), 0.0f);
    // BEV pre-filter: w == 0 or h == 0 gives inter == 0 (or NaN), hence iou == 0 (or NaN), never > t.
    if (!(w > 0.0f)) return false;
    float h = fmaxf(__fsub_rn(fminf(a[3], b[3]), fmaxf(a[1], b[1])), 0.0f);
    if (!(h > 0.0f)) return false;
    float inter = __fmul_rn(w, h);
    float uni = __fsub_rn(__fadd_rn(a[4], b[4]), inter);
    float iou = uni > 0.0f ? __fdiv_rn(inter, uni) : 0.0f;
    return iou > t;
}

// ROT prep: 0 x, 1 y, 2 s, 3 c, 4 hl, 5 hw, 6 area, 7 xmin, 8 xmax, 9 ymin, 10 ymax.
#define MAX_POLY 20

template <bool ON_X, bool KEEP_LE>
__device__ __forceinline__ int clip_poly(const float* ix, const float* iy, int n, float* ox, float* oy, float bound) {
    if (n == 0) return 0;
    float px = ix[n - 1];
    float py = iy[n - 1];
    float pv = ON_X ? px : py;
    bool pin = KEEP_LE ? (pv <= bound) : (pv >= bound);
    int m = 0;
    for (int k = 0; k < n; ++k) {
        float qx = ix[k];
        float qy = iy[k];
        float qv = ON_X ? qx : qy;
        bool qin = KEEP_LE ? (qv <= bound) : (qv >= bound);
        if (pin != qin) {
            if (ON_X) {
                float t = __fdiv_rn(__fsub_rn(bound, px), __fsub_rn(qx, px));
                ox[m] = bound;
                oy[m] = __fadd_rn(py, __fmul_rn(t, __fsub_rn(qy, py)));
            } else {
                float t = __fdiv_rn(__fsub_rn(bound, py), __fsub_rn(qy, py));
                ox[m] = __fadd_rn(px, __fmul_rn(t, __fsub_rn(qx, px)));
                oy[m] = bound;
            }
            ++m;
        }
        if (qin) {
            ox[m] = qx;
            oy[m] = qy;
            ++m;
        }
        px = qx;
        py = qy;
        pin = qin;
    }
    return m;
}

// b in a's frame (step 2 of RotatedBev, ops::nms::in_frame_of): centre (px, py), heading (cr, sr).
__device__ __forceinline__ void in_frame_of(const float* a, const float* b, float& px, float& py, float& cr,
                                            float& sr) {
    const float dx = __fsub_rn(b[0], a[0]);
    const float dy = __fsub_rn(b[1], a[1]);
    const float as = a[2], ac = a[3], bs = b[2], bc = b[3];
    px = __fadd_rn(__fmul_rn(dx, ac), __fmul_rn(dy, as));
    py = __fsub_rn(__fmul_rn(dy, ac), __fmul_rn(dx, as));
    cr = __fadd_rn(__fmul_rn(bc, ac), __fmul_rn(bs, as));
    sr = __fsub_rn(__fmul_rn(bs, ac), __fmul_rn(bc, as));
}

__device__ __noinline__ float rot_iou_exact(const float* a, const float* b) {
    // Step 1 (area and bounding rectangles) was checked by the caller, as in RotOverlap.
    float px, py, cr, sr;
    in_frame_of(a, b, px, py, cr, sr);
    float ux = __fmul_rn(b[4], cr);
    float uy = __fmul_rn(b[4], sr);
    float vx = __fmul_rn(b[5], sr);
    float vy = __fmul_rn(b[5], cr);
    float X0[MAX_POLY], Y0[MAX_POLY], X1[MAX_POLY], Y1[MAX_POLY];
    X0[0] = __fsub_rn(__fadd_rn(px, ux), vx);
    Y0[0] = __fadd_rn(__fadd_rn(py, uy), vy);
    X0[1] = __fsub_rn(__fsub_rn(px, ux), vx);
    Y0[1] = __fadd_rn(__fsub_rn(py, uy), vy);
    X0[2] = __fadd_rn(__fsub_rn(px, ux), vx);
    Y0[2] = __fsub_rn(__fsub_rn(py, uy), vy);
    X0[3] = __fadd_rn(__fadd_rn(px, ux), vx);
    Y0[3] = __fsub_rn(__fadd_rn(py, uy), vy);
    float ahl = a[4], ahw = a[5];
    int n = 4;
    n = clip_poly<true, true>(X0, Y0, n, X1, Y1, ahl);
    n = clip_poly<false, true>(X1, Y1, n, X0, Y0, ahw);
    n = clip_poly<true, false>(X0, Y0, n, X1, Y1, -ahl);
    n = clip_poly<false, false>(X1, Y1, n, X0, Y0, -ahw);
    if (n < 3) return 0.0f;
    float acc = 0.0f;
    for (int k = 0; k < n; ++k) {
        int k1 = (k + 1 == n) ? 0 : k + 1;
        acc = __fadd_rn(acc, __fsub_rn(__fmul_rn(X0[k], Y0[k1]), __fmul_rn(X0[k1], Y0[k])));
    }
    float inter = fminf(__fmul_rn(fmaxf(acc, 0.0f), 0.5f), fminf(a[6], b[6]));
    float uni = __fsub_rn(__fadd_rn(a[6], b[6]), inter);
    return __fdiv_rn(inter, uni);
}

// O(a, b) of the frame bound (ops::nms::rot_frame_overlap): b's extent along a's axes overlapped
// with a's, per axis.
#define FRAME_BOUND_MARGIN 1.0009765625f
__device__ __forceinline__ float rot_frame_overlap(const float* a, const float* b) {
    float px, py, cr, sr;
    in_frame_of(a, b, px, py, cr, sr);
    const float ex = __fadd_rn(fabsf(__fmul_rn(b[4], cr)), fabsf(__fmul_rn(b[5], sr)));
    const float ey = __fadd_rn(fabsf(__fmul_rn(b[4], sr)), fabsf(__fmul_rn(b[5], cr)));
    const float ox = fmaxf(__fsub_rn(fminf(a[4], __fadd_rn(px, ex)), fmaxf(-a[4], __fsub_rn(px, ex))), 0.0f);
    const float oy = fmaxf(__fsub_rn(fminf(a[5], __fadd_rn(py, ey)), fmaxf(-a[5], __fsub_rn(py, ey))), 0.0f);
    return __fmul_rn(ox, oy);
}

// The tests of RotOverlap::suppresses before the exact IoU, in its order (the mask kernels queue
// the pairs that pass for rot_iou_exact). Symmetric in a and b.
__device__ __forceinline__ bool rot_prefilter(const float* a, const float* b, float t) {
    // Bounding rectangles must overlap strictly (the BEV pre-filter; IoU is 0 otherwise).
    if (!(fminf(a[8], b[8]) > fmaxf(a[7], b[7])) || !(fminf(a[10], b[10]) > fmaxf(a[9], b[9]))) return false;
    // Exact area bound (same decision).
    float m = fminf(a[6], b[6]);
    if (!(__fdiv_rn(m, __fsub_rn(__fadd_rn(a[6], b[6]), m)) > t)) return false;
    if (a[6] == 0.0f || b[6] == 0.0f) return false;
    // The frame bound (step 3 of RotatedBev): most pairs of a cluster stop here, not in the clip.
    const float bound = fminf(rot_frame_overlap(a, b), rot_frame_overlap(b, a));
    return __fmul_rn(__fdiv_rn(bound, __fsub_rn(__fadd_rn(a[6], b[6]), bound)), FRAME_BOUND_MARGIN) > t;
}

// Columns per chunk of the rotated mask: the pairs that pass the cheap tests of a chunk are queued
// in shared memory and the exact polygon clips are then run by all threads together (a clip
// per lane instead of one clipping lane per warp).
#define ROT_CHUNK 16

// The rotated pairs of one 64 x 64 block of the mask: this thread's row `a` (class acls; none when
// !row_ok) against columns k0.. of `cols`, ROT_CHUNK columns at a time; clip(row, k) is called,
// spread over the block, for every pair that passes rot_prefilter. Every thread of the block
// must call it (barriers inside).
template <typename Clip>
__device__ __forceinline__ void rot_pairs(const float* a, int acls, bool row_ok, const float* cols, int ncols, int k0,
                                          float t, unsigned short* queue, u32* s_qn, Clip clip) {
    const int tid = threadIdx.x;
    for (int cb = 0; cb < ncols; cb += ROT_CHUNK) {
        if (row_ok) {
            const int ke = min(cb + ROT_CHUNK, ncols);
            for (int k = max(k0, cb); k < ke; ++k) {
                const float* bb = &cols[k * PREP_STRIDE];
                if (__float_as_int(bb[PREP_CLS]) != acls || !rot_prefilter(a, bb, t)) continue;
                queue[atomicAdd(s_qn, 1u)] = (unsigned short)((tid << 6) | k);
            }
        }
        __syncthreads();
        const u32 qn = *s_qn;
        for (u32 q = tid; q < qn; q += NMS_BLOCK) clip(queue[q] >> 6, queue[q] & 63);
        __syncthreads();
        if (tid == 0) *s_qn = 0;
        __syncthreads();
    }
}

// CIRCLE prep: 0 x, 1 y. `t` is threshold*threshold (f32).
__device__ __forceinline__ bool circle_suppresses(const float* a, const float* b, float t2) {
    float dx = __fsub_rn(a[0], b[0]);
    float dy = __fsub_rn(a[1], b[1]);
    float d2 = __fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy));
    return d2 <= t2;
}

// ------------------------------------------------------------------------------------------
// Sort.

// Order-preserving map of non-NaN floats onto u32 (and back), for sort keys and atomicMax on floats.
__device__ __forceinline__ u32 ord_f32(float v) {
    const u32 u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float unord_f32(u32 o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

__device__ __forceinline__ u32 desc_score_key(float s) {
    return ~ord_f32(__uint_as_float(s == 0.0f ? 0u : __float_as_uint(s)));  // -0.0 and +0.0 tie
}

// counters (zeroed by the host): [0] candidates, [1] live pair blocks of the mask, [2] listed
// group pairs, [3] spare, [4..7] bounds of the candidates' centres
// as ordered words (see ord_f32): [4] ~min x, [5] max x, [6] ~min y, [7] max y (0 = none yet, so
// every bound is an atomicMax).
#define CTR_LIVE 1
#define CTR_PAIRS 2
#define CTR_BOUNDS 4

extern "C" __global__ void __launch_bounds__(NMS_AUX_BLOCK)
nms_keys(const float* __restrict__ scores, int n, float score_threshold, u64* __restrict__ keys,
         u32* __restrict__ counters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    bool cand = false;
    if (i < n) {
        float s = scores[i];
        cand = s >= score_threshold;
        keys[i] = cand ? (((u64)desc_score_key(s) << 32) | (u64)(u32)i) : ~0ull;
    }
    unsigned bal = __ballot_sync(FULL_MASK, cand);
    if ((threadIdx.x & 31) == 0 && bal) atomicAdd(&counters[0], (u32)__popc(bal));
}

// Keys per sorted tile = threads of the sort block (SORT_TILE in src/ops/nms/cuda.rs).
#define SORT_TILE 1024

// Block b sorts keys [b * SORT_TILE, (b + 1) * SORT_TILE) ascending into `sorted`; keys at or past
// `len` (min(*count, n) when count is given, else n) are padding (all ones). Bitonic, one key per
// thread: the exchanges within a warp (partner distance < 32) go through shuffles, so only 15 of
// the 55 steps need a barrier.
extern "C" __global__ void __launch_bounds__(SORT_TILE)
nms_sort_tiles(const u64* __restrict__ keys, const u32* __restrict__ count, int n, u64* __restrict__ sorted) {
    __shared__ u64 s[SORT_TILE];
    const int len = count != nullptr ? min((int)*count, n) : n;
    const int tid = threadIdx.x;
    const int i = blockIdx.x * SORT_TILE + tid;
    u64 v = i < len ? keys[i] : ~0ull;
    for (int k = 2; k <= SORT_TILE; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            u64 w;
            if (j >= 32) {
                s[tid] = v;
                __syncthreads();
                w = s[tid ^ j];
                __syncthreads();
            } else {
                w = __shfl_xor_sync(FULL_MASK, v, j);
            }
            // The lower index of a pair takes the minimum in an ascending run (tid & k == 0).
            const bool take_min = ((tid & j) == 0) == ((tid & k) == 0);
            v = take_min ? (w < v ? w : v) : (w > v ? w : v);
        }
    }
    sorted[i] = v;
}

#define RANK_OF_LOW 0  // out[low 32 bits of the key] = rank (score keys carry the box index)
#define LOW_BY_RANK 1  // out[rank] = low 32 bits of the key (Morton keys carry the score rank)

// One warp per sorted slot: the rank of its key among all keys (padding skipped); lane l
// searches tiles l, l + 32, ... so that the dependent loads of the searches overlap.
extern "C" __global__ void __launch_bounds__(NMS_AUX_BLOCK)
nms_merge_rank(const u64* __restrict__ sorted, int ntiles, int mode, u32* __restrict__ out) {
    const long long e = ((long long)blockIdx.x * NMS_AUX_BLOCK + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (e >= (long long)ntiles * SORT_TILE) return;  // uniform over the warp
    const u64 k = sorted[e];
    if (k == ~0ull) return;
    const int t = (int)(e / SORT_TILE);
    u32 r = 0;
    for (int o = lane; o < ntiles; o += 32) {
        if (o == t) continue;
        const u64* tile = sorted + (size_t)o * SORT_TILE;
        // Keys of tile o below k: its binary digits from the top (tile[0..pos) < k throughout).
        int pos = 0;
        for (int step = SORT_TILE; step > 0; step >>= 1)
            if (pos + step <= SORT_TILE && tile[pos + step - 1] < k) pos += step;
        r += (u32)pos;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(FULL_MASK, r, o);
    if (lane != 0) return;
    r += (u32)(e - (long long)t * SORT_TILE);
    if (mode == RANK_OF_LOW) out[(u32)k] = r;
    else out[r] = (u32)k;
}

__device__ __forceinline__ u32 warp_max_u32(u32 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Per input box: candidates ranked below pre_max_size get order[rank] = i and their prep; the
// centres' bounds go to counters[CTR_BOUNDS..] (one atomic per warp and bound).
extern "C" __global__ void __launch_bounds__(NMS_AUX_BLOCK)
nms_prep(const float* __restrict__ boxes, const int* __restrict__ classes, int class_aware, int kind, int n,
         int pre, const u64* __restrict__ keys, const u32* __restrict__ rank, u32* __restrict__ order,
         float* __restrict__ prep, u32* __restrict__ counters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    u32 bx0 = 0, bx1 = 0, by0 = 0, by1 = 0;
    if (i < n && keys[i] != ~0ull && (int)rank[i] < pre) {
        int r = (int)rank[i];
        order[r] = (u32)i;
        const float* b = boxes + (size_t)i * 7;
        float x = b[0], y = b[1], length = b[3], width = b[4], yaw = b[6];
        bx0 = ~ord_f32(x);
        bx1 = ord_f32(x);
        by0 = ~ord_f32(y);
        by1 = ord_f32(y);
        float* p = prep + (size_t)r * PREP_STRIDE;
        if (kind == KIND_AA) {
            float hl = __fmul_rn(length, 0.5f);
            float hw = __fmul_rn(width, 0.5f);
            float x1 = __fsub_rn(x, hl), x2 = __fadd_rn(x, hl);
            float y1 = __fsub_rn(y, hw), y2 = __fadd_rn(y, hw);
            p[0] = x1; p[1] = y1; p[2] = x2; p[3] = y2;
            p[4] = __fmul_rn(__fsub_rn(x2, x1), __fsub_rn(y2, y1));
        } else if (kind == KIND_ROT) {
            float s, c;
            sincos_portable(yaw, &s, &c);
            float hl = __fmul_rn(length, 0.5f);
            float hw = __fmul_rn(width, 0.5f);
            float ex = __fadd_rn(fabsf(__fmul_rn(hl, c)), fabsf(__fmul_rn(hw, s)));
            float ey = __fadd_rn(fabsf(__fmul_rn(hl, s)), fabsf(__fmul_rn(hw, c)));
            p[0] = x; p[1] = y; p[2] = s; p[3] = c; p[4] = hl; p[5] = hw;
            p[6] = __fmul_rn(length, width);
            p[7] = __fsub_rn(x, ex); p[8] = __fadd_rn(x, ex);
            p[9] = __fsub_rn(y, ey); p[10] = __fadd_rn(y, ey);
        } else {
            p[0] = x; p[1] = y;
        }
        p[PREP_CLS] = __int_as_float(class_aware ? classes[i] : 0);
    }
    bx0 = warp_max_u32(bx0);
    bx1 = warp_max_u32(bx1);
    by0 = warp_max_u32(by0);
    by1 = warp_max_u32(by1);
    if ((threadIdx.x & 31) == 0 && bx1 != 0u) {
        atomicMax(&counters[CTR_BOUNDS + 0], bx0);
        atomicMax(&counters[CTR_BOUNDS + 1], bx1);
        atomicMax(&counters[CTR_BOUNDS + 2], by0);
        atomicMax(&counters[CTR_BOUNDS + 3], by1);
    }
}

// ------------------------------------------------------------------------------------------
// Spatial order for the grouped mask. Only the speed depends on it: any order finds every pair.

__device__ __forceinline__ u32 spread_bits16(u32 v) {
    v = (v | (v << 8)) & 0x00ff00ffu;
    v = (v | (v << 4)) & 0x0f0f0f0fu;
    v = (v | (v << 2)) & 0x33333333u;
    return (v | (v << 1)) & 0x55555555u;
}

// 16-bit cell of v in [lo, hi] (f64, so a span near the f32 range does not overflow).
__device__ __forceinline__ u32 morton_cell(float v, float lo, float hi) {
    const double span = (double)hi - (double)lo;
    const double f = span > 0.0 ? ((double)v - (double)lo) / span * 65535.0 : 0.0;
    return (u32)fmin(fmax(f, 0.0), 65535.0);
}

// Per candidate rank r < m: skeys[r] = morton(centre) << 32 | r (unique keys).
extern "C" __global__ void __launch_bounds__(NMS_AUX_BLOCK)
nms_morton(const float* __restrict__ boxes, const u32* __restrict__ order, const u32* __restrict__ counters, int pre,
           u64* __restrict__ skeys) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= min((int)counters[0], pre)) return;
    const float* b = boxes + (size_t)order[r] * 7;
    const float x0 = unord_f32(~counters[CTR_BOUNDS + 0]), x1 = unord_f32(counters[CTR_BOUNDS + 1]);
    const float y0 = unord_f32(~counters[CTR_BOUNDS + 2]), y1 = unord_f32(counters[CTR_BOUNDS + 3]);
    const u32 code = spread_bits16(morton_cell(b[0], x0, x1)) | (spread_bits16(morton_cell(b[1], y0, y1)) << 1);
    skeys[r] = ((u64)code << 32) | (u64)(u32)r;
}

// The rectangle a box can interact within: the BEV bounding rectangle (aa, rotated: both pre-filters
// need a strict overlap of it) or the centre (circle).
__device__ __forceinline__ float4 cull_rect(const float* p, int kind) {
    if (kind == KIND_AA) return make_float4(p[0], p[2], p[1], p[3]);
    if (kind == KIND_ROT) return make_float4(p[7], p[8], p[9], p[10]);
    return make_float4(p[0], p[0], p[1], p[1]);
}

// Block g (64 threads): the boxes at spatial positions 64g.. : prep and score rank in that order,
// the group's rectangle (x lo, x hi, y lo, y hi over its boxes).
extern "C" __global__ void __launch_bounds__(NMS_TILE)
nms_groups(const float* __restrict__ prep, const u32* __restrict__ sp, const u32* __restrict__ counters, int pre,
           int kind, float* __restrict__ sprep, u32* __restrict__ srank, float4* __restrict__ gbox) {
    __shared__ float4 s_rect[NMS_TILE / 32];
    const int m = min((int)counters[0], pre);
    const int pos = blockIdx.x * NMS_TILE + threadIdx.x;
    float4 q = make_float4(NMS_INF, -NMS_INF, NMS_INF, -NMS_INF);
    if (pos < m) {
        const u32 r = sp[pos];
        srank[pos] = r;
        const float* p = prep + (size_t)r * PREP_STRIDE;
        float* d = sprep + (size_t)pos * PREP_STRIDE;
#pragma unroll
        for (int k = 0; k < PREP_STRIDE; ++k) d[k] = p[k];
        q = cull_rect(p, kind);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        q.x = fminf(q.x, __shfl_xor_sync(FULL_MASK, q.x, o));
        q.y = fmaxf(q.y, __shfl_xor_sync(FULL_MASK, q.y, o));
        q.z = fminf(q.z, __shfl_xor_sync(FULL_MASK, q.z, o));
        q.w = fmaxf(q.w, __shfl_xor_sync(FULL_MASK, q.w, o));
    }
    if ((threadIdx.x & 31) == 0) s_rect[threadIdx.x >> 5] = q;
    __syncthreads();
    if (threadIdx.x == 0 && blockIdx.x * NMS_TILE < m) {
        const float4 a = s_rect[0], b = s_rect[1];
        gbox[blockIdx.x] = make_float4(fminf(a.x, b.x), fmaxf(a.y, b.y), fminf(a.z, b.z), fmaxf(a.w, b.w));
    }
}

// ------------------------------------------------------------------------------------------
// Mask: one 64 x 64 block of the suppression relation per pair of groups.

// Whether two groups' rectangles can hold a suppressing pair. aa / rotated: both pre-filters need
// fminf(a.hi, b.hi) > fmaxf(a.lo, b.lo) on each axis, impossible when one group's lowest lo is not
// below the other's highest hi (comparisons only: exact). Circle (rectangles of centres): a gap
// above tt = threshold * 1.0001 (infinite when threshold^2 overflows) gives d2 > threshold^2
// after rounding, since each of the 4 roundings of d2 costs at most 2^-24 relative.
template <int KIND>
__device__ __forceinline__ bool groups_interact(float4 g, float4 h, float tt) {
    if (KIND == KIND_CIRCLE)
        return !(__fsub_rn(h.x, g.y) > tt) && !(__fsub_rn(g.x, h.y) > tt) && !(__fsub_rn(h.z, g.w) > tt) &&
               !(__fsub_rn(g.z, h.w) > tt);
    return g.x < h.y && h.x < g.y && g.z < h.w && h.z < g.w;
}

// Thread (g, h >= g): appends the pair to `pairs` (at most `cap`; counters[CTR_PAIRS] counts them
// all) when the two groups' rectangles interact, or always (`all`: rank-order groups, no
// rectangles), so that the mask's blocks are spread over the pairs rather than over the groups.
extern "C" __global__ void __launch_bounds__(NMS_AUX_BLOCK)
nms_group_pairs(const float4* __restrict__ gbox, u32* __restrict__ counters, int pre, int kind, float tt, int all,
                u32 cap, uint2* __restrict__ pairs) {
    const int ng = (min((int)counters[0], pre) + NMS_TILE - 1) / NMS_TILE;
    const int h = blockIdx.x * NMS_AUX_BLOCK + threadIdx.x;
    const int g = blockIdx.y;
    bool near = false;
    if (h < ng && g <= h) {
        if (all) near = true;
        else {
            const float4 a = gbox[g], b = gbox[h];
            near = kind == KIND_CIRCLE ? groups_interact<KIND_CIRCLE>(a, b, tt) : groups_interact<KIND_AA>(a, b, tt);
        }
    }
    const unsigned bal = __ballot_sync(FULL_MASK, near);
    const int lane = threadIdx.x & 31;
    u32 base = 0;
    if (lane == 0 && bal) base = atomicAdd(&counters[CTR_PAIRS], (u32)__popc(bal));
    base = __shfl_sync(FULL_MASK, base, 0);
    const u32 at = base + __popc(bal & ((1u << lane) - 1u));
    if (near && at < cap) pairs[at] = make_uint2((u32)g, (u32)h);
}

// Blocks stride over the listed group pairs (g, h): g's 64 boxes (one per thread) against h's
// (h == g: each pair once). A pair is tested as (higher rank, lower rank); the lower-ranked box's
// row gets the higher one's bit. A pair block with any bit set is appended to the live blocks
// (at most `cap`; counters[CTR_LIVE] counts them all): header (g, h), then 128 words, rows of g
// (bits over h's boxes) and rows of h (bits over g's; zero when h == g). `srank` null: the groups
// are rank tiles (position = rank).
template <int KIND>
__device__ __forceinline__ void mask_pairs(const float* __restrict__ sprep, const u32* __restrict__ srank,
                                           const uint2* __restrict__ pairs, u32* __restrict__ counters, int pre,
                                           float t, u32 cap, uint2* __restrict__ live, u64* __restrict__ words) {
    __shared__ float rows[NMS_TILE * PREP_STRIDE];
    __shared__ float cols[NMS_TILE * PREP_STRIDE];
    __shared__ u32 rrank[NMS_TILE];
    __shared__ u32 crank[NMS_TILE];
    __shared__ u64 s_g[NMS_TILE];
    __shared__ u64 s_h[NMS_TILE];
    __shared__ unsigned short queue[NMS_TILE * ROT_CHUNK];
    __shared__ u32 s_qn;
    __shared__ u32 s_slot;
    const int m = min((int)counters[0], pre);
    const u32 npairs = min(counters[CTR_PAIRS], cap);
    const int tid = threadIdx.x;
    const float* a = &rows[tid * PREP_STRIDE];
    for (u32 p = blockIdx.x; p < npairs; p += gridDim.x) {  // uniform over the block
        const uint2 gh = pairs[p];
        const int g = (int)gh.x, h = (int)gh.y;
        const int nrows = min(NMS_TILE, m - g * NMS_TILE);
        const int ncols = min(NMS_TILE, m - h * NMS_TILE);
        __syncthreads();  // the previous pair is done with the shared arrays
        for (int e = tid; e < nrows * PREP_STRIDE; e += NMS_BLOCK) rows[e] = sprep[(size_t)g * NMS_TILE * PREP_STRIDE + e];
        for (int e = tid; e < ncols * PREP_STRIDE; e += NMS_BLOCK) cols[e] = sprep[(size_t)h * NMS_TILE * PREP_STRIDE + e];
        if (tid < nrows) rrank[tid] = srank ? srank[g * NMS_TILE + tid] : (u32)(g * NMS_TILE + tid);
        if (tid < ncols) crank[tid] = srank ? srank[h * NMS_TILE + tid] : (u32)(h * NMS_TILE + tid);
        s_g[tid] = 0;
        s_h[tid] = 0;
        if (tid == 0) s_qn = 0;
        __syncthreads();
        u64* lo_rows = h == g ? s_g : s_h;  // where the row of a lower-ranked box of h lives
        const int k0 = h == g ? tid + 1 : 0;
        const bool row_ok = tid < nrows;
        const int acls = row_ok ? __float_as_int(a[PREP_CLS]) : 0;
        const u32 ra = row_ok ? rrank[tid] : 0u;
        if (KIND == KIND_ROT) {
            rot_pairs(a, acls, row_ok, cols, ncols, k0, t, queue, &s_qn, [&](int row, int k) {
                const bool row_hi = rrank[row] < crank[k];
                const float* hi = row_hi ? &rows[row * PREP_STRIDE] : &cols[k * PREP_STRIDE];
                const float* lo = row_hi ? &cols[k * PREP_STRIDE] : &rows[row * PREP_STRIDE];
                if (rot_iou_exact(hi, lo) > t) {
                    if (row_hi) atomicOr(&lo_rows[k], 1ull << row);
                    else atomicOr(&s_g[row], 1ull << k);
                }
            });
        } else if (row_ok) {
            u64 mine = 0;
            for (int k = k0; k < ncols; ++k) {
                const float* bb = &cols[k * PREP_STRIDE];
                if (__float_as_int(bb[PREP_CLS]) != acls) continue;
                const bool row_hi = ra < crank[k];
                const float* hi = row_hi ? a : bb;
                const float* lo = row_hi ? bb : a;
                const bool s = KIND == KIND_AA ? aa_suppresses(hi, lo, t) : circle_suppresses(hi, lo, t);
                if (s) {
                    if (row_hi) atomicOr(&lo_rows[k], 1ull << tid);
                    else mine |= 1ull << k;
                }
            }
            if (mine) atomicOr(&s_g[tid], mine);
        }
        __syncthreads();
        if (__syncthreads_or(s_g[tid] != 0 || s_h[tid] != 0)) {
            if (tid == 0) s_slot = atomicAdd(&counters[CTR_LIVE], 1u);
            __syncthreads();
            const u32 slot = s_slot;
            if (slot < cap) {
                if (tid == 0) live[slot] = gh;
                words[(size_t)slot * 2 * NMS_TILE + tid] = s_g[tid];
                words[(size_t)slot * 2 * NMS_TILE + NMS_TILE + tid] = s_h[tid];
            }
        }
    }
}

#define MASK_KERNEL(NAME, KIND)                                                                                \
    extern "C" __global__ void __launch_bounds__(NMS_BLOCK)                                                    \
    NAME(const float* __restrict__ sprep, const u32* __restrict__ srank, const uint2* __restrict__ pairs,       \
         u32* __restrict__ counters, int pre, float t, u32 cap, uint2* __restrict__ live, u64* __restrict__ words) { \
        mask_pairs<KIND>(sprep, srank, pairs, counters, pre, t, cap, live, words);                             \
    }

MASK_KERNEL(nms_mask_aa, KIND_AA)
MASK_KERNEL(nms_mask_rot, KIND_ROT)
MASK_KERNEL(nms_mask_circle, KIND_CIRCLE)

// ------------------------------------------------------------------------------------------
// Sweep: the greedy keep list as a fixed point, resolved in rounds by the whole grid.
//
// A box is kept iff no kept higher-ranked box suppresses it. Each round resolves, from the state
// the last round left, every box that no kept or unresolved box suppresses (kept) and every box
// that a kept box suppresses (removed); the others wait. This is the fixed point of the greedy
// rule, which is unique, so the keep list is the serial sweep's whatever the scheduling; only the
// number of rounds depends on the input: the depth of its chains of unresolved suppressors (5-8
// on the bench's circle and axis-aligned sets; one block walking the rank tiles took ~0.9 us per
// tile instead). The worst case is a chain in which each box suppresses only the next one in
// score order (boxes along a line, scores falling along it): one round per box.
//
// Round r: one warp per live pair block whose groups have unresolved boxes ORs, per row, whether a
// kept / an unresolved box of the other group suppresses it into hitk / hitu of the row's group
// (buffer r % 3), from the groups' states after round r - 1. Each warp derives those states from
// the states after round r - 2 and round r - 1's hit words itself, so one grid-wide barrier per
// round suffices (a cooperative launch, so every block is resident); one thread per group stores
// its state (buffer r % 2) and counts the unresolved groups, which ends the rounds.
//
// Global scratch (u64 words per group, zeroed by the host): kept[2][wt], unres[2][wt],
// hitk[3][wt], hitu[3][wt], by_rank[wt] (the kept boxes as rank bits), then 2 words of u32
// counters: [0] the barrier, [1..3] unresolved groups of a round (round mod 3, zeroed one round
// ahead of their use).

__device__ __forceinline__ void sweep_grid_barrier(u32* ctr, u32& target) {
    __syncthreads();
    target += gridDim.x;
    if (threadIdx.x == 0) lk_grid_arrive_wait(ctr, target);
    __syncthreads();
}

__device__ __forceinline__ u64 tile_valid(int T, int m) {
    const int rows = min(NMS_TILE, m - T * NMS_TILE);
    return rows >= 64 ? ~0ull : ((1ull << rows) - 1ull);
}

// Rows (of the group whose unresolved rows are `unres`) that a kept / an unresolved box of the other
// group suppresses: lane l holds rows l and l + 32 of the block half `w`.
__device__ __forceinline__ void sweep_pull(const u64* w, u64 unres, u64 other_kept, u64 other_unres, u64* hitk,
                                           u64* hitu) {
    const int lane = threadIdx.x & 31;
    const u64 w0 = __ldcg(&w[lane]), w1 = __ldcg(&w[32 + lane]);
    const u64 k = ((u64)__ballot_sync(FULL_MASK, (w0 & other_kept) != 0) |
                   ((u64)__ballot_sync(FULL_MASK, (w1 & other_kept) != 0) << 32)) & unres;
    const u64 u = ((u64)__ballot_sync(FULL_MASK, (w0 & other_unres) != 0) |
                   ((u64)__ballot_sync(FULL_MASK, (w1 & other_unres) != 0) << 32)) & unres & ~k;
    if (lane == 0) {
        if (k) atomicOr(hitk, k);
        if (u) atomicOr(hitu, u);
    }
}

// The state round r pulls with (r = 0: nothing resolved): the state round r - 1 pulled with
// (stored in buffer (r - 1) % 2 during round r - 1) updated by round r - 1's hit words.
struct SweepState {
    u64 kept, unres;
};

__device__ __forceinline__ SweepState sweep_state(int g, int r, int m, const u64* kept, const u64* unres,
                                                  const u64* hitk, const u64* hitu, int wt) {
    if (r == 0) return {0ull, tile_valid(g, m)};
    const int sb = ((r - 1) & 1) * wt, hb = ((r - 1) % 3) * wt;
    const u64 u = __ldcg(&unres[sb + g]), k = __ldcg(&hitk[hb + g]), w = __ldcg(&hitu[hb + g]);
    return {__ldcg(&kept[sb + g]) | (u & ~k & ~w), u & ~k & w};
}

extern "C" __global__ void __launch_bounds__(SWEEP_THREADS)
nms_sweep(const u32* __restrict__ counters, int pre, int post, const uint2* __restrict__ live,
          const u64* __restrict__ words, u32 cap, const u32* __restrict__ srank, const u32* __restrict__ order,
          u64* scratch, int wt, u32* __restrict__ out) {
    __shared__ u32 s_warp[SWEEP_THREADS / 32];
    __shared__ u32 s_total;
    u64* kept = scratch;          // [2][wt]
    u64* unres = kept + 2 * wt;   // [2][wt]
    u64* hitk = unres + 2 * wt;   // [3][wt]
    u64* hitu = hitk + 3 * wt;    // [3][wt]
    u64* by_rank = hitu + 3 * wt;
    u32* sync = reinterpret_cast<u32*>(by_rank + wt);
    u32* unresolved = sync + 1;  // [3]

    const int tid = threadIdx.x;
    const int m = min((int)counters[0], pre);
    const int nt = (m + NMS_TILE - 1) / NMS_TILE;
    const u32 nlive = min(counters[CTR_LIVE], cap);
    const int gthread = blockIdx.x * SWEEP_THREADS + tid;
    const int nthreads = gridDim.x * SWEEP_THREADS;
    const int gwarp = gthread >> 5;
    const int nwarps = nthreads >> 5;
    u32 target = 0;
    int round = 0;
    for (;; ++round) {
        const int hb = (round % 3) * wt;
        for (u32 p = gwarp; p < nlive; p += nwarps) {
            const uint2 gh = live[p];
            const SweepState sg = sweep_state(gh.x, round, m, kept, unres, hitk, hitu, wt);
            const SweepState sh = sweep_state(gh.y, round, m, kept, unres, hitk, hitu, wt);
            if ((sg.unres | sh.unres) == 0) continue;  // uniform over the warp
            const u64* w = words + (size_t)p * 2 * NMS_TILE;
            if (sg.unres) sweep_pull(w, sg.unres, sh.kept, sh.unres, &hitk[hb + gh.x], &hitu[hb + gh.x]);
            if (sh.unres && gh.y != gh.x)
                sweep_pull(w + NMS_TILE, sh.unres, sg.kept, sg.unres, &hitk[hb + gh.y], &hitu[hb + gh.y]);
        }
        for (int g = gthread; g < nt; g += nthreads) {
            const SweepState st = sweep_state(g, round, m, kept, unres, hitk, hitu, wt);
            __stcg(&kept[(round & 1) * wt + g], st.kept);
            __stcg(&unres[(round & 1) * wt + g], st.unres);
            const int zb = ((round + 1) % 3) * wt;  // read in round - 1, written in round + 1
            __stcg(&hitk[zb + g], 0ull);
            __stcg(&hitu[zb + g], 0ull);
            if (st.unres) atomicAdd(&unresolved[round % 3], 1u);
        }
        if (gthread == 0) unresolved[(round + 1) % 3] = 0;
        sweep_grid_barrier(sync, target);
        if (*((volatile u32*)&unresolved[round % 3]) == 0) break;
    }
    // The states stored in the last round are final.
    const u64* final_kept = kept + (round & 1) * wt;
    // The kept boxes as rank bits, then block 0 writes the first `post` of them in rank order.
    for (int g = gthread; g < nt; g += nthreads) {
        u64 k = __ldcg(&final_kept[g]);
        while (k) {
            const int row = __ffsll((long long)k) - 1;
            k &= k - 1ull;
            const u32 r = srank ? srank[g * NMS_TILE + row] : (u32)(g * NMS_TILE + row);
            atomicOr(&by_rank[r / NMS_TILE], 1ull << (r % NMS_TILE));
        }
    }
    sweep_grid_barrier(sync, target);
    if (blockIdx.x != 0) return;
    u32 base = 0;
    for (int T0 = 0; T0 < nt; T0 += SWEEP_THREADS) {
        const int T = T0 + tid;
        const u64 k = T < nt ? __ldcg(&by_rank[T]) : 0ull;
        const u32 pos = base + lk_block_excl_scan<SWEEP_THREADS / 32>((u32)__popcll(k), s_warp, &s_total);
        u64 left = k;
        for (u32 q = pos; left && q < (u32)post; ++q) {
            const int row = __ffsll((long long)left) - 1;
            left &= left - 1ull;
            out[4 + q] = order[T * NMS_TILE + row];
        }
        base += s_total;
    }
    if (tid == 0) {
        out[0] = min(base, (u32)post);
        out[1] = (u32)m;
    }
}
