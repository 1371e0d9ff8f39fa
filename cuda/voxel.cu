// Voxelization kernels: hard (PointPillars / mmcv) and dynamic voxelization, scatter means,
// PointPillars point decoration. Must reproduce src/ops/voxel.rs bit for bit on every integer output
// (and on every float output whose arithmetic order the reference fixes).
//
// Pipeline (src/gpu/voxel.rs enqueues it; no host synchronization inside):
//   1. vox_hash_insert   one thread per point: voxel coordinate in f32 exactly as VoxelGrid::coord
//                        (one __fsub_rn, one __fdiv_rn, floorf, range test in f32); linear key
//                        (z*dy+y)*dx+x; open-addressing insert (linear probing, CAS on key+1), then
//                        atomicMax(first_enc[slot], ~i) = the smallest point index of the voxel.
//                        pslot[i] = table slot or -1.
//   2. vox_rank          single pass, decoupled look-back scan (as cuda/gather.cu) over the flags
//                        "point i is the first point of its voxel" in input order: the exclusive prefix
//                        is the voxel's rank = its output index (first-point order). Stored in
//                        table_vid[slot]; ranks < max_voxels write their [z,y,x] coordinate.
//   3. vox_point_key     one thread per point: sort key = rank if in range and rank < max_voxels,
//                        else key_max (sorts last); counts out-of-range / voxel-capacity drops;
//                        dynamic mode also writes point_voxel and point_coords.
//   4. LSD radix sort by key (stable; values = point indices, starting as the identity):
//                        vox_radix_hist (per-tile digit histogram), vox_radix_rowscan (per-digit
//                        exclusive scan over tiles), vox_radix_scatter (stable in-tile ranks with
//                        __match_any_sync, rounds in input order). Stable by key with the identity as
//                        input = sorted by (key, point index): the points of a voxel are contiguous
//                        and in input order, so slot = position - segment start (deterministic).
//   5. vox_segments      segment start/end of every voxel in the sorted order.
//   6. vox_hard_fill     one thread per (voxel, slot): copies the channels of the slot's point (or
//                        writes 0.0 padding), num_points = min(count, P), point-capacity drops; with
//                        the pillar flag it also writes the 9/10 PointPillars channels (fused).
//      vox_dyn_means     one thread per (voxel, channel): f64 sum in input order / count -> f32.
//      vox_pillar        PointPillars decoration of hard voxels already on the device.
//
// Every scan is an exact integer prefix; atomics only count (sums of integers) or take a min, so
// every output is a function of the input alone.
//
// Compile-time constants (kernel profile, -D NAME=value):
//   VOXEL_BLOCK  threads per block (multiple of 32, 256..=1024 for the radix kernels: the radix
//                kernels handle 256 digits with a strided loop, so any multiple of 32 works)
//   VOXEL_ITEMS  consecutive points per thread in the scan / radix tiles
//   HASH_LOAD_FACTOR  (used on the host to size the table)

#ifndef VOXEL_BLOCK
#define VOXEL_BLOCK 256
#endif
#ifndef VOXEL_ITEMS
#define VOXEL_ITEMS 4
#endif

#if (VOXEL_BLOCK % 32) != 0 || VOXEL_BLOCK > 1024 || VOXEL_BLOCK < 32
#error "VOXEL_BLOCK must be a multiple of 32 in 32..=1024"
#endif
#if VOXEL_ITEMS < 1 || VOXEL_ITEMS > 32
#error "VOXEL_ITEMS must be in 1..=32"
#endif

#define VOX_TILE (VOXEL_BLOCK * VOXEL_ITEMS)
#define VOX_WARPS (VOXEL_BLOCK / 32)
#define VOX_MAX_CHANNELS 16
#define RADIX_BINS 256

#define STATUS_AGGREGATE 1ull
#define STATUS_PREFIX 2ull

// Counter words (u32), see src/gpu/voxel.rs `CTR_*`.
#define CTR_TILE 0          // tile counter of vox_rank
#define CTR_VOXELS 1        // distinct in-range voxels (uncapped)
#define CTR_OUT_OF_RANGE 2
#define CTR_VOXEL_CAP 3     // in-range points of voxels not kept
#define CTR_POINT_CAP 4     // points of kept voxels past P
#define CTR_WORDS 8

// Must match `VoxParams` in src/gpu/voxel.rs (repr(C), 4-byte fields only).
struct VoxParams {
    float min[3];
    float size[3];
    float dimf[3];     // round_ties_even((max - min) / size) in f32
    unsigned int dim[3];
    unsigned int n;            // points
    unsigned int capacity;     // column stride of the cloud, in floats
    unsigned int num_ch;       // output channels C (x, y, z first)
    unsigned int max_voxels;   // voxel cap (0xffffffff: none)
    unsigned int max_points;   // P
    unsigned int key_max;      // sort key of points without a kept voxel (> every kept rank)
    unsigned int hash_mask;    // table size - 1 (power of two)
    unsigned int hash_shift;   // 64 - log2(table size)
    unsigned int flags;        // bit 0: write raw features, bit 1: pillar features, bit 2: with range
    unsigned int pad_;
    unsigned int ch[VOX_MAX_CHANNELS]; // cloud channel index of output channel k
};

#define FLAG_RAW 1u
#define FLAG_PILLAR 2u
#define FLAG_RANGE 4u

__device__ __forceinline__ const float* col(const float* cloud, const VoxParams& p, unsigned int k) {
    return cloud + (unsigned long long)p.ch[k] * p.capacity;
}

// VoxelGrid::coord: false when out of range (NaN included).
__device__ __forceinline__ bool voxel_coord(const VoxParams& p, float x, float y, float z, unsigned int c[3]) {
    const float v[3] = {x, y, z};
#pragma unroll
    for (int a = 0; a < 3; ++a) {
        const float q = floorf(__fdiv_rn(__fsub_rn(v[a], p.min[a]), p.size[a]));
        if (!(q >= 0.0f && q < p.dimf[a])) return false;
        c[a] = (unsigned int)q;
    }
    return true;
}

__device__ __forceinline__ unsigned long long linear_key(const VoxParams& p, const unsigned int c[3]) {
    return ((unsigned long long)c[2] * p.dim[1] + c[1]) * p.dim[0] + c[0];
}

__device__ __forceinline__ unsigned int hash_slot(const VoxParams& p, unsigned long long key) {
    return (unsigned int)((key * 0x9E3779B97F4A7C15ull) >> p.hash_shift) & p.hash_mask;
}

// 1. Keys and hash inserts. Table: keys (key + 1, 0 = empty), first_enc (~min index, 0 = none).
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_hash_insert(const float* __restrict__ cloud, unsigned long long* table_keys, unsigned int* table_first,
                int* __restrict__ pslot, const VoxParams p) {
    const unsigned int i = blockIdx.x * VOXEL_BLOCK + threadIdx.x;
    if (i >= p.n) return;
    const float x = cloud[i];
    const float y = cloud[(unsigned long long)p.capacity + i];
    const float z = cloud[2ull * p.capacity + i];
    unsigned int c[3];
    if (!voxel_coord(p, x, y, z, c)) {
        pslot[i] = -1;
        return;
    }
    const unsigned long long key1 = linear_key(p, c) + 1ull;
    unsigned int s = hash_slot(p, key1 - 1ull);
    while (true) {
        const unsigned long long cur = table_keys[s];
        if (cur == key1) break;
        if (cur == 0ull) {
            const unsigned long long prev = atomicCAS(&table_keys[s], 0ull, key1);
            if (prev == 0ull || prev == key1) break;
        }
        s = (s + 1u) & p.hash_mask;
    }
    atomicMax(&table_first[s], ~i);
    pslot[i] = (int)s;
}

__device__ __forceinline__ unsigned long long status_load(unsigned long long* s) {
    return atomicOr(s, 0ull);
}

// Block-wide exclusive scan of one value per thread; returns the thread's exclusive prefix and the
// block total in *total. Uses `warp_buf` (VOX_WARPS words). Deterministic.
__device__ __forceinline__ unsigned int block_scan(unsigned int v, unsigned int* warp_buf, unsigned int* total) {
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    unsigned int incl = v;
#pragma unroll
    for (unsigned int o = 1; o < 32; o <<= 1) {
        const unsigned int t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    if (lane == 31u) warp_buf[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        unsigned int w = lane < VOX_WARPS ? warp_buf[lane] : 0u;
#pragma unroll
        for (unsigned int o = 1; o < 32; o <<= 1) {
            const unsigned int t = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += t;
        }
        if (lane < VOX_WARPS) warp_buf[lane] = w;
    }
    __syncthreads();
    const unsigned int excl = (warp > 0 ? warp_buf[warp - 1] : 0u) + incl - v;
    *total = warp_buf[VOX_WARPS - 1];
    __syncthreads(); // warp_buf may be reused by the caller
    return excl;
}

__device__ __forceinline__ void write_coord(int* coords, unsigned int r, const VoxParams& p, unsigned long long key) {
    const unsigned long long dxy = (unsigned long long)p.dim[0] * p.dim[1];
    const unsigned int z = (unsigned int)(key / dxy);
    const unsigned long long rem = key - (unsigned long long)z * dxy;
    const unsigned int y = (unsigned int)(rem / p.dim[0]);
    const unsigned int x = (unsigned int)(rem - (unsigned long long)y * p.dim[0]);
    coords[3ull * r + 0] = (int)z;
    coords[3ull * r + 1] = (int)y;
    coords[3ull * r + 2] = (int)x;
}

// 2. Voxel ranks in first-point order (single-pass decoupled look-back scan).
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_rank(const int* __restrict__ pslot, const unsigned long long* __restrict__ table_keys,
         const unsigned int* __restrict__ table_first, unsigned int* table_vid, int* __restrict__ coords,
         unsigned long long* tile_status, unsigned int* counters, const VoxParams p) {
    __shared__ unsigned int s_tile;
    __shared__ unsigned int s_warp[VOX_WARPS];
    __shared__ unsigned int s_prefix;
    if (threadIdx.x == 0) s_tile = atomicAdd(&counters[CTR_TILE], 1u);
    __syncthreads();
    const unsigned int tile = s_tile;
    const unsigned int num_tiles = (p.n + VOX_TILE - 1) / VOX_TILE;
    const unsigned long long base = (unsigned long long)tile * VOX_TILE + (unsigned long long)threadIdx.x * VOXEL_ITEMS;

    unsigned int flags = 0u, count = 0u;
#pragma unroll
    for (int k = 0; k < VOXEL_ITEMS; ++k) {
        const unsigned long long idx = base + k;
        if (idx < p.n) {
            const int s = pslot[idx];
            if (s >= 0 && ~table_first[s] == (unsigned int)idx) {
                flags |= 1u << k;
                ++count;
            }
        }
    }
    unsigned int tile_total;
    const unsigned int thread_excl = block_scan(count, s_warp, &tile_total);

    if (threadIdx.x == 0) {
        unsigned int excl = 0u;
        if (tile == 0) {
            atomicExch(&tile_status[0], (STATUS_PREFIX << 32) | tile_total);
        } else {
            atomicExch(&tile_status[tile], (STATUS_AGGREGATE << 32) | tile_total);
            int j = (int)tile - 1;
            while (true) {
                const unsigned long long s = status_load(&tile_status[j]);
                const unsigned long long flag = s >> 32;
                if (flag == 0ull) continue;
                excl += (unsigned int)(s & 0xffffffffull);
                if (flag == STATUS_PREFIX) break;
                --j;
            }
            atomicExch(&tile_status[tile], (STATUS_PREFIX << 32) | (excl + tile_total));
        }
        s_prefix = excl;
        if (tile == num_tiles - 1) counters[CTR_VOXELS] = excl + tile_total;
    }
    __syncthreads();

    unsigned int r = s_prefix + thread_excl;
#pragma unroll
    for (int k = 0; k < VOXEL_ITEMS; ++k) {
        if (flags & (1u << k)) {
            const int s = pslot[base + k];
            table_vid[s] = r;
            if (r < p.max_voxels) write_coord(coords, r, p, table_keys[s] - 1ull);
            ++r;
        }
    }
}

// Block reduce (sum) then one atomicAdd.
__device__ __forceinline__ void block_count(unsigned int v, unsigned int* warp_buf, unsigned int* dst) {
    unsigned int total;
    block_scan(v, warp_buf, &total);
    if (threadIdx.x == 0 && total != 0u) atomicAdd(dst, total);
}

// 3. Sort keys; drop counters; dynamic per-point outputs (when point_voxel != null).
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_point_key(const int* __restrict__ pslot, const unsigned int* __restrict__ table_vid,
              const int* __restrict__ coords, unsigned int* __restrict__ keys, unsigned int* counters,
              int* __restrict__ point_voxel, int* __restrict__ point_coords, const VoxParams p) {
    __shared__ unsigned int s_warp[VOX_WARPS];
    const unsigned int i = blockIdx.x * VOXEL_BLOCK + threadIdx.x;
    unsigned int oor = 0u, vcap = 0u;
    if (i < p.n) {
        const int s = pslot[i];
        unsigned int key = p.key_max;
        if (s < 0) {
            oor = 1u;
        } else {
            const unsigned int r = table_vid[s];
            if (r < p.max_voxels) key = r; else vcap = 1u;
        }
        keys[i] = key;
        if (point_voxel != nullptr) {
            point_voxel[i] = key == p.key_max ? -1 : (int)key;
#pragma unroll
            for (int a = 0; a < 3; ++a) point_coords[3ull * i + a] = key == p.key_max ? -1 : coords[3ull * key + a];
        }
    }
    block_count(oor, s_warp, &counters[CTR_OUT_OF_RANGE]);
    block_count(vcap, s_warp, &counters[CTR_VOXEL_CAP]);
}

// 4a. Per-tile digit histogram: hist[d * num_tiles + tile].
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_radix_hist(const unsigned int* __restrict__ keys, unsigned int* __restrict__ hist, unsigned int n,
               unsigned int shift, unsigned int bits) {
    __shared__ unsigned int s_hist[RADIX_BINS];
    const unsigned int bins = 1u << bits;
    for (unsigned int d = threadIdx.x; d < bins; d += VOXEL_BLOCK) s_hist[d] = 0u;
    __syncthreads();
    const unsigned long long base = (unsigned long long)blockIdx.x * VOX_TILE;
#pragma unroll
    for (int r = 0; r < VOXEL_ITEMS; ++r) {
        const unsigned long long e = base + (unsigned long long)r * VOXEL_BLOCK + threadIdx.x;
        if (e < n) atomicAdd(&s_hist[(keys[e] >> shift) & (bins - 1u)], 1u);
    }
    __syncthreads();
    for (unsigned int d = threadIdx.x; d < bins; d += VOXEL_BLOCK)
        hist[(unsigned long long)d * gridDim.x + blockIdx.x] = s_hist[d];
}

// 4b. One block per digit: exclusive scan of its row over the tiles (in place); row total -> totals[d].
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_radix_rowscan(unsigned int* __restrict__ hist, unsigned int* __restrict__ totals, unsigned int num_tiles) {
    __shared__ unsigned int s_warp[VOX_WARPS];
    unsigned int* row = hist + (unsigned long long)blockIdx.x * num_tiles;
    unsigned int carry = 0u;
    for (unsigned int b = 0; b < num_tiles; b += VOXEL_BLOCK) {
        const unsigned int t = b + threadIdx.x;
        const unsigned int v = t < num_tiles ? row[t] : 0u;
        unsigned int total;
        const unsigned int ex = block_scan(v, s_warp, &total);
        if (t < num_tiles) row[t] = carry + ex;
        carry += total;
    }
    if (threadIdx.x == 0) totals[blockIdx.x] = carry;
}

// 4c. Stable scatter. Elements of a tile are taken in rounds of VOXEL_BLOCK consecutive elements
// (round r, thread t -> element tile*TILE + r*BLOCK + t), so (round, warp, lane) is input order.
// vals_in == null: the values are the element indices (first pass).
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_radix_scatter(const unsigned int* __restrict__ keys_in, const unsigned int* __restrict__ vals_in,
                  unsigned int* __restrict__ keys_out, unsigned int* __restrict__ vals_out,
                  const unsigned int* __restrict__ hist, const unsigned int* __restrict__ totals, unsigned int n,
                  unsigned int shift, unsigned int bits) {
    __shared__ unsigned int s_base[RADIX_BINS];
    __shared__ unsigned int s_warp[VOX_WARPS][RADIX_BINS];
    const unsigned int bins = 1u << bits;
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        unsigned int acc = 0u;
        for (unsigned int d = 0; d < bins; ++d) {
            s_base[d] = acc;
            acc += totals[d];
        }
    }
    __syncthreads();
    for (unsigned int d = threadIdx.x; d < bins; d += VOXEL_BLOCK)
        s_base[d] += hist[(unsigned long long)d * gridDim.x + blockIdx.x];
    const unsigned int lt_mask = (1u << lane) - 1u;
    const unsigned long long base = (unsigned long long)blockIdx.x * VOX_TILE;
    for (int r = 0; r < VOXEL_ITEMS; ++r) {
        for (unsigned int j = threadIdx.x; j < VOX_WARPS * bins; j += VOXEL_BLOCK) s_warp[j / bins][j % bins] = 0u;
        __syncthreads();
        const unsigned long long e = base + (unsigned long long)r * VOXEL_BLOCK + threadIdx.x;
        const bool valid = e < n;
        unsigned int key = 0u, val = 0u, d = 0xffffffffu;
        if (valid) {
            key = keys_in[e];
            val = vals_in ? vals_in[e] : (unsigned int)e;
            d = (key >> shift) & (bins - 1u);
        }
        const unsigned int peers = __match_any_sync(0xffffffffu, d);
        const unsigned int rank = __popc(peers & lt_mask);
        if (valid && rank == 0u) s_warp[warp][d] = __popc(peers);
        __syncthreads();
        for (unsigned int dd = threadIdx.x; dd < bins; dd += VOXEL_BLOCK) {
            unsigned int acc = s_base[dd];
            for (int w = 0; w < VOX_WARPS; ++w) {
                const unsigned int c = s_warp[w][dd];
                s_warp[w][dd] = acc;
                acc += c;
            }
            s_base[dd] = acc;
        }
        __syncthreads();
        if (valid) {
            const unsigned int pos = s_warp[warp][d] + rank;
            keys_out[pos] = key;
            vals_out[pos] = val;
        }
        __syncthreads();
    }
}

// 5. Segment bounds of every voxel with a kept key in the sorted keys.
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_segments(const unsigned int* __restrict__ keys, unsigned int* __restrict__ seg_start,
             unsigned int* __restrict__ seg_end, const VoxParams p) {
    const unsigned int s = blockIdx.x * VOXEL_BLOCK + threadIdx.x;
    if (s >= p.n) return;
    const unsigned int k = keys[s];
    if (k == p.key_max) return;
    if (s == 0 || keys[s - 1] != k) seg_start[k] = s;
    if (s + 1 == p.n || keys[s + 1] != k) seg_end[k] = s + 1;
}

__device__ __forceinline__ unsigned int kept_voxels(const unsigned int* counters, const VoxParams& p) {
    const unsigned int v = counters[CTR_VOXELS];
    return v < p.max_voxels ? v : p.max_voxels;
}

// 6. Hard voxels: one thread per (voxel, slot) of the kept voxels (grid-stride).
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_hard_fill(const float* __restrict__ cloud, const unsigned int* __restrict__ vals,
              const unsigned int* __restrict__ seg_start, const unsigned int* __restrict__ seg_end,
              const int* __restrict__ coords, unsigned int* counters, unsigned int* __restrict__ num_points,
              float* __restrict__ features, float* __restrict__ pillar, const VoxParams p) {
    const unsigned int P = p.max_points;
    const unsigned long long total = (unsigned long long)kept_voxels(counters, p) * P;
    const unsigned int C = p.num_ch;
    const unsigned int oc = (p.flags & FLAG_RANGE) ? 10u : 9u;
    for (unsigned long long t = (unsigned long long)blockIdx.x * VOXEL_BLOCK + threadIdx.x; t < total;
         t += (unsigned long long)gridDim.x * VOXEL_BLOCK) {
        const unsigned int v = (unsigned int)(t / P);
        const unsigned int s = (unsigned int)(t - (unsigned long long)v * P);
        const unsigned int start = seg_start[v];
        const unsigned int cnt = seg_end[v] - start;
        const unsigned int np = cnt < P ? cnt : P;
        if (s == 0) {
            num_points[v] = np;
            if (cnt > np) atomicAdd(&counters[CTR_POINT_CAP], cnt - np);
        }
        if (p.flags & FLAG_RAW) {
            float* dst = features + t * C;
            if (s < np) {
                const unsigned int i = vals[start + s];
                for (unsigned int k = 0; k < C; ++k) dst[k] = col(cloud, p, k)[i];
            } else {
                for (unsigned int k = 0; k < C; ++k) dst[k] = 0.0f;
            }
        }
        if (p.flags & FLAG_PILLAR) {
            float* dst = pillar + t * oc;
            if (s < np) {
                const float* X = col(cloud, p, 0);
                const float* Y = col(cloud, p, 1);
                const float* Z = col(cloud, p, 2);
                const float* I = col(cloud, p, 3);
                float sx = 0.0f, sy = 0.0f, sz = 0.0f;
                for (unsigned int j = 0; j < np; ++j) {
                    const unsigned int q = vals[start + j];
                    sx = __fadd_rn(sx, X[q]);
                    sy = __fadd_rn(sy, Y[q]);
                    sz = __fadd_rn(sz, Z[q]);
                }
                const float nf = (float)np;
                const unsigned int i = vals[start + s];
                const float x = X[i], y = Y[i], z = Z[i];
                const int cy = coords[3ull * v + 1], cx = coords[3ull * v + 2];
                const float ox = __fadd_rn(__fmul_rn(__fadd_rn((float)cx, 0.5f), p.size[0]), p.min[0]);
                const float oy = __fadd_rn(__fmul_rn(__fadd_rn((float)cy, 0.5f), p.size[1]), p.min[1]);
                dst[0] = x;
                dst[1] = y;
                dst[2] = z;
                dst[3] = I[i];
                dst[4] = __fsub_rn(x, __fdiv_rn(sx, nf));
                dst[5] = __fsub_rn(y, __fdiv_rn(sy, nf));
                dst[6] = __fsub_rn(z, __fdiv_rn(sz, nf));
                dst[7] = __fsub_rn(x, ox);
                dst[8] = __fsub_rn(y, oy);
                if (oc == 10u) dst[9] = __fsqrt_rn(__fadd_rn(__fadd_rn(__fmul_rn(x, x), __fmul_rn(y, y)), __fmul_rn(z, z)));
            } else {
                for (unsigned int k = 0; k < oc; ++k) dst[k] = 0.0f;
            }
        }
    }
}

// Dynamic voxels: one thread per (voxel, channel): f64 sum in input order, / count, -> f32.
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_dyn_means(const float* __restrict__ cloud, const unsigned int* __restrict__ vals,
              const unsigned int* __restrict__ seg_start, const unsigned int* __restrict__ seg_end,
              const unsigned int* counters, unsigned int* __restrict__ num_points, float* __restrict__ means,
              const VoxParams p) {
    const unsigned int C = p.num_ch;
    const unsigned long long total = (unsigned long long)kept_voxels(counters, p) * C;
    for (unsigned long long t = (unsigned long long)blockIdx.x * VOXEL_BLOCK + threadIdx.x; t < total;
         t += (unsigned long long)gridDim.x * VOXEL_BLOCK) {
        const unsigned int v = (unsigned int)(t / C);
        const unsigned int k = (unsigned int)(t - (unsigned long long)v * C);
        const unsigned int start = seg_start[v], end = seg_end[v];
        const float* X = col(cloud, p, k);
        double sum = 0.0;
        for (unsigned int j = start; j < end; ++j) sum = __dadd_rn(sum, (double)X[vals[j]]);
        means[t] = __double2float_rn(__ddiv_rn(sum, (double)(end - start)));
        if (k == 0) num_points[v] = end - start;
    }
}

// PointPillars decoration of hard voxels on the device: one thread per (voxel, slot).
// features: [V, P, C] with x, y, z, intensity in channels 0..4; out: [V, P, 9 or 10].
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_pillar(const float* __restrict__ features, const unsigned int* __restrict__ num_points,
           const int* __restrict__ coords, const unsigned int* counters, float* __restrict__ out, const VoxParams p) {
    const unsigned int P = p.max_points;
    const unsigned int C = p.num_ch;
    const unsigned int oc = (p.flags & FLAG_RANGE) ? 10u : 9u;
    const unsigned long long total = (unsigned long long)kept_voxels(counters, p) * P;
    for (unsigned long long t = (unsigned long long)blockIdx.x * VOXEL_BLOCK + threadIdx.x; t < total;
         t += (unsigned long long)gridDim.x * VOXEL_BLOCK) {
        const unsigned int v = (unsigned int)(t / P);
        const unsigned int s = (unsigned int)(t - (unsigned long long)v * P);
        const unsigned int np = num_points[v];
        float* dst = out + t * oc;
        if (s >= np) {
            for (unsigned int k = 0; k < oc; ++k) dst[k] = 0.0f;
            continue;
        }
        const float* blk = features + (unsigned long long)v * P * C;
        float sx = 0.0f, sy = 0.0f, sz = 0.0f;
        for (unsigned int j = 0; j < np; ++j) {
            sx = __fadd_rn(sx, blk[j * C + 0]);
            sy = __fadd_rn(sy, blk[j * C + 1]);
            sz = __fadd_rn(sz, blk[j * C + 2]);
        }
        const float nf = (float)np;
        const float x = blk[s * C], y = blk[s * C + 1], z = blk[s * C + 2];
        const int cy = coords[3ull * v + 1], cx = coords[3ull * v + 2];
        const float ox = __fadd_rn(__fmul_rn(__fadd_rn((float)cx, 0.5f), p.size[0]), p.min[0]);
        const float oy = __fadd_rn(__fmul_rn(__fadd_rn((float)cy, 0.5f), p.size[1]), p.min[1]);
        dst[0] = x;
        dst[1] = y;
        dst[2] = z;
        dst[3] = blk[s * C + 3];
        dst[4] = __fsub_rn(x, __fdiv_rn(sx, nf));
        dst[5] = __fsub_rn(y, __fdiv_rn(sy, nf));
        dst[6] = __fsub_rn(z, __fdiv_rn(sz, nf));
        dst[7] = __fsub_rn(x, ox);
        dst[8] = __fsub_rn(y, oy);
        if (oc == 10u) dst[9] = __fsqrt_rn(__fadd_rn(__fadd_rn(__fmul_rn(x, x), __fmul_rn(y, y)), __fmul_rn(z, z)));
    }
}
