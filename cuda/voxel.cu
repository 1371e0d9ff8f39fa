// Voxelization kernels: hard (PointPillars / mmcv) and dynamic voxelization, scatter means,
// PointPillars point decoration. Must reproduce src/ops/voxel/mod.rs bit for bit on every integer output
// (and on every float output whose arithmetic order the reference fixes).
//
// Pipeline (src/ops/voxel/cuda.rs enqueues it; no memset, no host synchronization inside). Hard
// voxels with P <= 32 (PointPillars, spconv) take 3 launches (1, 2, 4s); dynamic voxels and P > 32
// sort (1, 2, 3 per 8-bit digit, 4). Steps 2 and 4s are launched to start before the kernel ahead
// of them ends (sm_90+, src/gpu/launch.rs): their blocks are resident when it ends and wait for it
// in their first instruction, so the gap between the launches no longer adds to the chain:
//   1. vox_insert        one thread per point: voxel coordinate in f32 exactly as VoxelGrid::coord
//                        (one __fsub_rn, one __fdiv_rn, floorf, range test in f32); linear key
//                        (z*dy+y)*dx+x. Table slot: DIRECT mode (small grids, e.g. 640 x 640 x 1
//                        pillars) slot = linear key, one entry per cell; HASH mode: open addressing
//                        (linear probing, CAS on key+1 into a table kept all-zero between calls).
//                        The lanes of a warp that share a slot elect their lowest lane (= lowest
//                        point index), which does atomicMax(first[slot], gen << 32 | ~i) = the voxel's
//                        smallest point index, tagged with this call's generation `gen` (entries of
//                        earlier calls compare smaller and read as stale: the table is never cleared),
//                        and in select mode one atomicAdd of the lanes' count on count[slot]: each
//                        point's position in its voxel's segment (an order the atomics choose; the
//                        select kernel sorts it away). pslot[i] = slot or -1.
//                        Block 0 zeroes the counters (all but the rank kernel's tile ticket, which
//                        vox_rank_keys draws before it waits and resets itself) and the global
//                        radix histograms.
//   2. vox_rank_keys     single-pass decoupled look-back scan (generation-tagged tile status, warp-wide
//                        look-back) over the flags "point i is the first point of its voxel", in input
//                        order: the exclusive prefix is the voxel's rank = its output index
//                        (first-point order). The first point's thread writes vid[slot] = rank and the
//                        voxel coordinate, clears the hash key (HASH mode), then the tile publishes
//                        DONE. Every other point reads its voxel's rank once the tile holding the
//                        voxel's first point (an earlier or the same tile) is DONE. Sort mode: each
//                        point writes its sort key = rank (flag bit 31 on the voxel's first point) or
//                        key_max (dropped: out of range / voxel capacity), the per-pass digit
//                        histograms (onesweep) and the drop counters; dynamic mode also writes
//                        point_voxel. Select mode: the first points take their voxels' segments
//                        (one atomicAdd per tile on a cursor, before the look-back: placement does
//                        not reach the output), reset count[slot] (the table stays all-zero), put
//                        the segment start in vid[slot] and, for kept voxels, seg_start / seg_len
//                        by rank; every point of a kept voxel writes its index into its segment
//                        at its insert position.
//   3. vox_sort_pass     stable LSD radix pass (one launch per <= 8-bit digit; values = point indices,
//                        the identity on the first pass): per-warp match_any ranks in input order,
//                        per-digit decoupled look-back across tiles (generation-tagged status) on top
//                        of the global digit offsets from step 2. Stable by key with the identity as
//                        input = sorted by (rank, point index): the points of a voxel are contiguous
//                        and in input order, so slot = position - segment start (deterministic). The
//                        last pass writes only the values of kept points and, for the flagged first
//                        point of each voxel, seg_start[rank] = its position (segments fused in).
//   4. vox_hard_fill     one thread per (voxel, slot): segment [seg_start[v], seg_start[v + 1]) (the
//                        last one ends at the number of kept points), num_points = min(count, P),
//                        point-capacity drops, raw channels or 0.0 padding; with the pillar flag also
//                        the 9/10 PointPillars channels (fused).
//   4s. vox_hard_select  P <= 32: one warp per kept voxel takes the min(count, P) smallest point
//                        indices of its unordered segment in ascending order (= the slots of the
//                        sorted path: input order) and writes the same outputs as vox_hard_fill,
//                        the zero padding only in slots an earlier call may have filled.
//      vox_dyn_means     one thread per (voxel, channel): f64 sum in input order / count -> f32.
//      vox_ds_records    the `downsampled` message's records from the means and the input records.
//      vox_means_xyz     the downsampled cloud's x, y, z columns.
//      vox_centroids     hard voxels' centroids; vox_voxels_records the `voxels` message's records.
//      vox_pillar        PointPillars decoration of hard voxels already on the device.
//
// Every scan is an exact integer prefix; atomics only count (sums of integers) or take a max, so
// every output is a function of the input alone.
//
// Compile-time constants (kernel profile, -D NAME=value):
//   VOXEL_BLOCK  threads per block (multiple of 32, 32..=1024; the radix kernels handle 256 digits
//                with strided loops)
//   VOXEL_ITEMS  consecutive points per thread in the rank / radix tiles
// (The profile's hash_load_factor sizes the hash table on the host: hash_mask / hash_shift.)

#include "common.cuh"

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
#define RADIX_MAX_PASSES 4

// Status words (u64): gen << 32 | flag << 30 | value (value < 2^30: at most 2^30 - 1 points).
#define ST_AGG 1u     // the tile's own count
#define ST_PREFIX 2u  // inclusive prefix up to and including the tile
#define ST_DONE 3u    // prefix, and (vox_rank_keys) the tile's first points have written their vid
#define ST_VALUE 0x3fffffffu

// Counter words (u32), see src/ops/voxel/cuda.rs `CTR_*`. Zeroed by vox_insert (block 0), all but
// CTR_RANK_TILE, which vox_rank_keys resets itself (the buffer is zeroed when allocated).
#define CTR_RANK_TILE 0     // tile counter of vox_rank_keys
#define CTR_VOXELS 1        // distinct in-range voxels (uncapped)
#define CTR_OUT_OF_RANGE 2
#define CTR_VOXEL_CAP 3     // in-range points of voxels not kept
#define CTR_POINT_CAP 4     // points of kept voxels past P
#define CTR_SORT_TILE 5     // 5..8: tile counter of sort pass q
#define CTR_SEG_POINTS 9    // select mode: segment cursor (points of every in-range voxel)
#define CTR_WORDS 16
#define CTR_HIST CTR_WORDS  // RADIX_MAX_PASSES x RADIX_BINS global digit counts
#define CTR_TOTAL (CTR_WORDS + RADIX_MAX_PASSES * RADIX_BINS)

#define KEY_FIRST 0x80000000u // sort-key flag: the voxel's first point
#define KEY_MASK 0x7fffffffu

// Must match `VoxParams` in src/ops/voxel/cuda.rs (repr(C), 4-byte fields only; same size asserted there).
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
    unsigned int flags;        // FLAG_*
    unsigned int gen;          // generation of this call (>= 1), tags the table and status words
    unsigned int sort_passes;  // radix passes (1..=4)
    unsigned int sort_bits;    // bits per pass (pass q: shift q * sort_bits)
    unsigned int sort_total;   // key bits covered (the last pass may have fewer)
    unsigned int pad_;
    unsigned int ch[VOX_MAX_CHANNELS]; // cloud channel index of output channel k
};
static_assert(sizeof(VoxParams) == 168, "VoxParams: size differs from src/ops/voxel/cuda.rs");

#define FLAG_RAW 1u
#define FLAG_PILLAR 2u
#define FLAG_RANGE 4u
#define FLAG_DIRECT 8u

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

__device__ __forceinline__ unsigned long long st_make(unsigned int gen, unsigned int flag, unsigned int v) {
    return ((unsigned long long)gen << 32) | ((unsigned long long)flag << 30) | (unsigned long long)v;
}

// Status word store. Publish = a release at gpu scope: it also publishes what the block wrote
// before its last __syncthreads (the release is cumulative over what happens before it), which is
// how vox_rank_keys hands its segment starts and ranks to later tiles without a __threadfence
// (fence.sc, the costliest fence) in every thread. The radix passes' words carry their whole
// message and store relaxed.
template <bool Publish>
__device__ __forceinline__ void st_store(u64* p, u64 v) {
    if (Publish)
        asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    else
        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Spins until the status word carries generation `gen` and a flag >= min_flag; returns its low
// 32 bits (flag << 30 | value). Acquire: pairs with st_store<true> (the writer's block's writes are
// visible to this thread, and to its block after a __syncthreads).
template <bool Acquire>
__device__ __forceinline__ unsigned int st_wait(const u64* p, unsigned int gen, unsigned int min_flag) {
    while (true) {
        u64 s;
        if (Acquire)
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(s) : "l"(p) : "memory");
        else
            asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(s) : "l"(p) : "memory");
        if ((unsigned int)(s >> 32) == gen && ((unsigned int)s >> 30) >= min_flag) return (unsigned int)s;
        __nanosleep(20);
    }
}

__device__ __forceinline__ unsigned int warp_sum(unsigned int v) {
#pragma unroll
    for (unsigned int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
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

// Digit of `key` in radix pass q.
__device__ __forceinline__ unsigned int radix_digit(const VoxParams& p, unsigned int key, unsigned int q) {
    const unsigned int shift = q * p.sort_bits;
    const unsigned int bits = min(p.sort_bits, p.sort_total - shift);
    return (key >> shift) & ((1u << bits) - 1u);
}

// 1. Table inserts (+ zeroing of the counters and histograms). point_coords != null: dynamic mode,
// also writes each point's [z, y, x] (or -1). table_count != null: select mode, point_pos[i] = the
// point's position in its voxel's segment.
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_insert(const float* __restrict__ cloud, unsigned long long* table_keys, unsigned long long* table_first,
           unsigned int* table_count, int* __restrict__ pslot, unsigned int* __restrict__ point_pos,
           unsigned int* __restrict__ ctr, int* __restrict__ point_coords, const VoxParams p) {
    lk_let_next_start(); // vox_rank_keys waits for this kernel's end itself
    if (blockIdx.x == 0) // all but the rank kernel's tile ticket, which that kernel resets itself
        for (unsigned int w = threadIdx.x; w < CTR_TOTAL; w += VOXEL_BLOCK)
            if (w != CTR_RANK_TILE) ctr[w] = 0u;
    const unsigned int i = blockIdx.x * VOXEL_BLOCK + threadIdx.x;
    const unsigned int lane = threadIdx.x & 31u;
    bool in = false;
    unsigned int s = 0xffffffffu;
    if (i < p.n) {
        const float x = cloud[i];
        const float y = cloud[(unsigned long long)p.capacity + i];
        const float z = cloud[2ull * p.capacity + i];
        unsigned int c[3] = {0u, 0u, 0u};
        in = voxel_coord(p, x, y, z, c);
        if (in) {
            const unsigned long long key = linear_key(p, c);
            if (p.flags & FLAG_DIRECT) {
                s = (unsigned int)key;
            } else {
                const unsigned long long key1 = key + 1ull;
                s = hash_slot(p, key);
                while (true) {
                    const unsigned long long cur = table_keys[s];
                    if (cur == key1) break;
                    if (cur == 0ull) {
                        const unsigned long long prev = atomicCAS(&table_keys[s], 0ull, key1);
                        if (prev == 0ull || prev == key1) break;
                    }
                    s = (s + 1u) & p.hash_mask;
                }
            }
        }
        pslot[i] = in ? (int)s : -1;
        if (point_coords != nullptr) {
            point_coords[3ull * i + 0] = in ? (int)c[2] : -1;
            point_coords[3ull * i + 1] = in ? (int)c[1] : -1;
            point_coords[3ull * i + 2] = in ? (int)c[0] : -1;
        }
    }
    // One atomic per slot and warp: lanes hold consecutive points, so the lowest lane of a slot
    // holds its lowest index (slots are < 2^31: 0xffffffff groups the lanes with no slot).
    const unsigned int peers = __match_any_sync(0xffffffffu, s);
    const unsigned int leader = (unsigned int)(__ffs(peers) - 1);
    unsigned int base = 0u;
    if (in && lane == leader) {
        atomicMax(&table_first[s], ((unsigned long long)p.gen << 32) | (unsigned long long)(~i));
        if (table_count != nullptr) base = atomicAdd(&table_count[s], (unsigned int)__popc(peers));
    }
    base = __shfl_sync(0xffffffffu, base, (int)leader);
    if (in && table_count != nullptr) point_pos[i] = base + (unsigned int)__popc(peers & ((1u << lane) - 1u));
}

// 2. Voxel ranks in first-point order, drop counters; sort mode (seg_points == null): sort keys and
// digit histograms; select mode: the voxels' segments, filled. In select mode table_vid holds, per
// slot, the start of the voxel's segment, which is all a point needs; seg_start / seg_len are
// written by rank (kept voxels) for the select kernel.
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_rank_keys(const int* __restrict__ pslot, unsigned long long* table_keys, const unsigned long long* __restrict__ table_first,
              unsigned int* table_vid, unsigned int* table_count, const unsigned int* __restrict__ point_pos,
              int* __restrict__ coords, unsigned long long* status, unsigned int* ctr, unsigned int* __restrict__ keys,
              int* __restrict__ point_voxel, unsigned int* __restrict__ seg_points, unsigned int* __restrict__ seg_start,
              unsigned int* __restrict__ seg_len, const VoxParams p) {
    __shared__ unsigned int s_tile;
    __shared__ unsigned int s_prefix;
    __shared__ unsigned int s_min_tile;
    __shared__ unsigned int s_warp[VOX_WARPS];
    __shared__ unsigned int s_seg_base;
    __shared__ unsigned int s_drop[2]; // out of range, voxel capacity
    __shared__ unsigned int s_hist[RADIX_MAX_PASSES * RADIX_BINS];
    lk_let_next_start(); // vox_hard_select waits for this kernel's end itself
    const unsigned int num_tiles = (p.n + VOX_TILE - 1) / VOX_TILE;
    // The tile ticket is drawn before the wait, while vox_insert still runs, so it is not on the
    // chain. vox_insert leaves the ticket alone, and the block that draws the last one resets it
    // for the next call: every other ticket is drawn by then (the buffer starts zeroed).
    if (threadIdx.x == 0) {
        const unsigned int t = atomicAdd(&ctr[CTR_RANK_TILE], 1u);
        if (t == num_tiles - 1) ctr[CTR_RANK_TILE] = 0u;
        s_tile = t;
    }
    lk_wait_prior_grid(); // launched early (src/gpu/launch.rs): vox_insert must have ended
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    const bool select = seg_points != nullptr;
    if (threadIdx.x == 0) {
        s_drop[0] = 0u;
        s_drop[1] = 0u;
    }
    if (!select)
        for (unsigned int w = threadIdx.x; w < p.sort_passes * RADIX_BINS; w += VOXEL_BLOCK) s_hist[w] = 0u;
    __syncthreads();
    const unsigned int tile = s_tile;
    if (threadIdx.x == 0) s_min_tile = tile;
    const unsigned int base = tile * VOX_TILE + threadIdx.x * VOXEL_ITEMS;
    const bool direct = (p.flags & FLAG_DIRECT) != 0u;

    int slot[VOXEL_ITEMS];
    // Select mode: a first point's voxel size and segment start; every point's segment place.
    unsigned int voxel_len[VOXEL_ITEMS], voxel_start[VOXEL_ITEMS], pos[VOXEL_ITEMS];
    unsigned int flags = 0u, count = 0u, oor = 0u, min_tile = tile, seg_points_mine = 0u;
#pragma unroll
    for (int k = 0; k < VOXEL_ITEMS; ++k) {
        const unsigned int idx = base + k;
        slot[k] = -1;
        voxel_len[k] = 0u;
        voxel_start[k] = 0u;
        pos[k] = 0u;
        if (idx < p.n) {
            const int s = pslot[idx];
            slot[k] = s;
            if (s >= 0) {
                const unsigned int j = ~(unsigned int)table_first[s];
                unsigned int c = 0u;
                if (select) {
                    pos[k] = point_pos[idx];
                    c = table_count[s]; // loaded beside table_first: one dependent step, not two
                }
                if (j == idx) {
                    flags |= 1u << k;
                    ++count;
                    voxel_len[k] = c;
                    seg_points_mine += c;
                } else {
                    min_tile = min(min_tile, j / VOX_TILE);
                }
            } else {
                ++oor;
            }
        }
    }
    // Select mode: this tile's voxels take their segments first (placement is free: one cursor
    // atomic per tile; voxels found past max_voxels below leave theirs unused, at most n entries in
    // all) and publish their starts by slot before the tile's aggregate: once a tile's look-back
    // ends, every earlier tile has published at least its aggregate (a prefix needs the
    // predecessors' aggregates, by induction), so every segment this tile's points need is
    // written, with no further wait.
    if (select) {
        unsigned int tile_points;
        unsigned int seg_excl = lk_block_excl_scan<VOX_WARPS>(seg_points_mine, s_warp, &tile_points);
        if (threadIdx.x == 0) s_seg_base = tile_points ? atomicAdd(&ctr[CTR_SEG_POINTS], tile_points) : 0u;
        __syncthreads();
        seg_excl += s_seg_base;
#pragma unroll
        for (int k = 0; k < VOXEL_ITEMS; ++k) {
            if (flags & (1u << k)) {
                table_vid[slot[k]] = seg_excl;
                table_count[slot[k]] = 0u; // the table stays all-zero between calls
                voxel_start[k] = seg_excl;
                seg_excl += voxel_len[k];
            }
        }
    }
    unsigned int tile_total;
    const unsigned int thread_excl = lk_block_excl_scan<VOX_WARPS>(count, s_warp, &tile_total); // ends with a barrier
    if (!select && min_tile < tile) atomicMin(&s_min_tile, min_tile); // for the DONE wait

    // Decoupled look-back by warp 0, 32 predecessors at a time.
    if (warp == 0) {
        unsigned int excl = 0u;
        if (tile > 0) {
            if (lane == 0) st_store<true>(&status[tile], st_make(p.gen, ST_AGG, tile_total));
            int top = (int)tile - 1;
            while (true) {
                const int j = top - (int)lane;
                unsigned int flag = ST_PREFIX, val = 0u;
                if (j >= 0) {
                    const unsigned int w = st_wait<true>(&status[j], p.gen, ST_AGG);
                    flag = w >> 30;
                    val = w & ST_VALUE;
                }
                const unsigned int pm = __ballot_sync(0xffffffffu, flag >= ST_PREFIX);
                const unsigned int stop = pm ? (unsigned int)(__ffs(pm) - 1) : 31u;
                excl += warp_sum(lane <= stop ? val : 0u);
                if (pm) break;
                top -= 32;
            }
            __syncwarp(); // the lanes' acquires happen before lane 0's release of the prefix
        }
        if (lane == 0) {
            st_store<true>(&status[tile], st_make(p.gen, ST_PREFIX, excl + tile_total));
            s_prefix = excl;
            if (tile == num_tiles - 1) ctr[CTR_VOXELS] = excl + tile_total;
        }
    }
    __syncthreads();

    // First points: rank -> coordinates (kept voxels), vid[slot] = rank (sort mode) or the kept
    // voxel's segment by rank (select mode); clear the hash key (the table stays all-zero).
    const unsigned int first_rank = s_prefix + thread_excl;
    unsigned int vcap = 0u;
    unsigned int r = first_rank;
#pragma unroll
    for (int k = 0; k < VOXEL_ITEMS; ++k) {
        if (flags & (1u << k)) {
            const int s = slot[k];
            const bool kept = r < p.max_voxels;
            if (select) {
                if (kept) {
                    seg_start[r] = voxel_start[k];
                    seg_len[r] = voxel_len[k];
                } else {
                    vcap += voxel_len[k]; // every in-range point of a dropped voxel, once
                }
            } else {
                table_vid[s] = r;
            }
            if (direct) {
                if (kept) write_coord(coords, r, p, (unsigned long long)s);
            } else {
                if (kept) write_coord(coords, r, p, table_keys[s] - 1ull);
                table_keys[s] = 0ull;
            }
            ++r;
        }
    }
    if (select) {
        // Every point writes its index into its voxel's segment (dropped voxels' too: unread).
#pragma unroll
        for (int k = 0; k < VOXEL_ITEMS; ++k) {
            if (slot[k] >= 0) {
                const unsigned int start = (flags >> k) & 1u ? voxel_start[k] : __ldcg(&table_vid[slot[k]]);
                seg_points[start + pos[k]] = base + k;
            }
        }
    } else {
        __syncthreads();
        if (threadIdx.x == 0) st_store<true>(&status[tile], st_make(p.gen, ST_DONE, s_prefix + tile_total));
        // Wait until every earlier tile holding a first point of this tile's voxels is DONE.
        const unsigned int mt = s_min_tile;
        for (unsigned int jt = mt + threadIdx.x; jt < tile; jt += VOXEL_BLOCK)
            st_wait<true>(&status[jt], p.gen, ST_DONE);
        __syncthreads();
        r = first_rank;
#pragma unroll
        for (int k = 0; k < VOXEL_ITEMS; ++k) {
            const unsigned int idx = base + k;
            if (idx < p.n) {
                const bool is_first = (flags >> k) & 1u;
                unsigned int key = p.key_max;
                if (slot[k] >= 0) {
                    const unsigned int vr = is_first ? r++ : __ldcg(&table_vid[slot[k]]);
                    if (vr < p.max_voxels) key = vr; else ++vcap;
                }
                keys[idx] = key | (is_first && key != p.key_max ? KEY_FIRST : 0u);
                if (point_voxel != nullptr) point_voxel[idx] = key == p.key_max ? -1 : (int)key;
                for (unsigned int q = 0; q < p.sort_passes; ++q) atomicAdd(&s_hist[q * RADIX_BINS + radix_digit(p, key, q)], 1u);
            }
        }
    }
    // Drop counters: warp sums into shared counters, one global atomic per tile and counter.
    const unsigned int oor_w = warp_sum(oor), vcap_w = warp_sum(vcap);
    if (lane == 0u) {
        if (oor_w) atomicAdd(&s_drop[0], oor_w);
        if (vcap_w) atomicAdd(&s_drop[1], vcap_w);
    }
    __syncthreads(); // s_drop and s_hist complete
    if (threadIdx.x == 0) {
        if (s_drop[0]) atomicAdd(&ctr[CTR_OUT_OF_RANGE], s_drop[0]);
        if (s_drop[1]) atomicAdd(&ctr[CTR_VOXEL_CAP], s_drop[1]);
    }
    if (select) return;
    for (unsigned int w = threadIdx.x; w < p.sort_passes * RADIX_BINS; w += VOXEL_BLOCK) {
        const unsigned int c = s_hist[w];
        if (c != 0u) atomicAdd(&ctr[CTR_HIST + w], c);
    }
}

// 3. One stable LSD radix pass. Warp w of a tile takes VOXEL_ITEMS rounds of 32 consecutive
// elements of its own chunk (tile*TILE + w*32*ITEMS + round*32 + lane), so (warp, round, lane) is
// input order. vals_in == null: the values are the element indices (first pass). Last pass:
// writes the values of kept keys only (no keys) and seg_start[rank] for flagged first points.
// status: this pass's tiles x RADIX_BINS words.
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_sort_pass(const unsigned int* __restrict__ keys_in, const unsigned int* __restrict__ vals_in,
              unsigned int* __restrict__ keys_out, unsigned int* __restrict__ vals_out, unsigned long long* status,
              unsigned int* ctr, unsigned int* __restrict__ seg_start, const VoxParams p, unsigned int pass) {
    __shared__ unsigned int s_tile;
    __shared__ unsigned int s_cnt[VOX_WARPS][RADIX_BINS];
    __shared__ unsigned int s_base[RADIX_BINS];
    __shared__ unsigned int s_warp[VOX_WARPS];
    const unsigned int shift = pass * p.sort_bits;
    const unsigned int bits = min(p.sort_bits, p.sort_total - shift);
    const unsigned int bins = 1u << bits;
    const unsigned int mask = bins - 1u;
    const bool last = pass + 1u == p.sort_passes;
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) s_tile = atomicAdd(&ctr[CTR_SORT_TILE + pass], 1u);
    for (unsigned int j = threadIdx.x; j < VOX_WARPS * RADIX_BINS; j += VOXEL_BLOCK) (&s_cnt[0][0])[j] = 0u;
    // Global exclusive digit offsets of this pass.
    const unsigned int* hist = ctr + CTR_HIST + pass * RADIX_BINS;
    unsigned int carry = 0u;
    for (unsigned int b = 0; b < bins; b += VOXEL_BLOCK) {
        const unsigned int d = b + threadIdx.x;
        const unsigned int v = d < bins ? hist[d] : 0u;
        unsigned int total;
        const unsigned int ex = lk_block_excl_scan<VOX_WARPS>(v, s_warp, &total); // barriers inside
        if (d < bins) s_base[d] = carry + ex;
        carry += total;
    }
    __syncthreads();
    const unsigned int tile = s_tile;
    const unsigned long long chunk = (unsigned long long)tile * VOX_TILE + (unsigned long long)warp * (32u * VOXEL_ITEMS);
    const unsigned int lt_mask = (1u << lane) - 1u;
    unsigned int key[VOXEL_ITEMS], val[VOXEL_ITEMS], rk[VOXEL_ITEMS];
#pragma unroll
    for (int k = 0; k < VOXEL_ITEMS; ++k) {
        const unsigned long long e = chunk + (unsigned long long)k * 32u + lane;
        const bool valid = e < p.n;
        key[k] = valid ? keys_in[e] : 0u;
        val[k] = valid ? (vals_in != nullptr ? vals_in[e] : (unsigned int)e) : 0u;
        const unsigned int d = valid ? (key[k] >> shift) & mask : 0xffffffffu;
        const unsigned int peers = __match_any_sync(0xffffffffu, d);
        const unsigned int leader = (unsigned int)(__ffs(peers) - 1);
        unsigned int old = 0u;
        if (valid && lane == leader) {
            old = s_cnt[warp][d];
            s_cnt[warp][d] = old + __popc(peers);
        }
        rk[k] = __shfl_sync(0xffffffffu, old, leader) + __popc(peers & lt_mask);
        __syncwarp();
    }
    __syncthreads();
    // Per digit: exclusive over the warps, the tile's count; publish, then look back.
    for (unsigned int d = threadIdx.x; d < bins; d += VOXEL_BLOCK) {
        unsigned int acc = 0u;
        for (int w = 0; w < VOX_WARPS; ++w) {
            const unsigned int c = s_cnt[w][d];
            s_cnt[w][d] = acc;
            acc += c;
        }
        st_store<false>(&status[(unsigned long long)tile * RADIX_BINS + d],
                        st_make(p.gen, tile == 0 ? ST_PREFIX : ST_AGG, acc));
    }
    if (tile > 0) {
        for (unsigned int d = threadIdx.x; d < bins; d += VOXEL_BLOCK) {
            unsigned int excl = 0u;
            for (int j = (int)tile - 1;; --j) {
                const unsigned int w = st_wait<false>(&status[(unsigned long long)j * RADIX_BINS + d], p.gen, ST_AGG);
                excl += w & ST_VALUE;
                if ((w >> 30) >= ST_PREFIX) break;
            }
            unsigned long long* mine = &status[(unsigned long long)tile * RADIX_BINS + d];
            const unsigned int own = (unsigned int)*(volatile unsigned long long*)mine & ST_VALUE;
            st_store<false>(mine, st_make(p.gen, ST_PREFIX, excl + own));
            s_base[d] += excl;
        }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < VOXEL_ITEMS; ++k) {
        const unsigned long long e = chunk + (unsigned long long)k * 32u + lane;
        if (e < p.n) {
            const unsigned int d = (key[k] >> shift) & mask;
            const unsigned int pos = s_base[d] + s_cnt[warp][d] + rk[k];
            if (!last) {
                keys_out[pos] = key[k];
                vals_out[pos] = val[k];
            } else {
                const unsigned int kk = key[k] & KEY_MASK;
                if (kk != p.key_max) {
                    vals_out[pos] = val[k];
                    if (key[k] & KEY_FIRST) seg_start[kk] = pos;
                }
            }
        }
    }
}

__device__ __forceinline__ unsigned int kept_voxels(const unsigned int* counters, const VoxParams& p) {
    const unsigned int v = counters[CTR_VOXELS];
    return v < p.max_voxels ? v : p.max_voxels;
}

// Points sorted into kept voxels (the end of the last segment).
__device__ __forceinline__ unsigned int kept_sorted(const unsigned int* counters, const VoxParams& p) {
    return p.n - counters[CTR_OUT_OF_RANGE] - counters[CTR_VOXEL_CAP];
}

// The oc PointPillars channels of one slot (point x, y, z, intensity; sums over the voxel's np
// points in slot order): the arithmetic of the CPU reference `ops::voxel::pillar_features`.
__device__ __forceinline__ void pillar_row(float* dst, unsigned int oc, float x, float y, float z, float intensity,
                                           float sx, float sy, float sz, unsigned int np, const int* coords,
                                           unsigned int v, const VoxParams& p) {
    const float nf = (float)np;
    const int cy = coords[3ull * v + 1], cx = coords[3ull * v + 2];
    const float ox = __fadd_rn(__fmul_rn(__fadd_rn((float)cx, 0.5f), p.size[0]), p.min[0]);
    const float oy = __fadd_rn(__fmul_rn(__fadd_rn((float)cy, 0.5f), p.size[1]), p.min[1]);
    dst[0] = x;
    dst[1] = y;
    dst[2] = z;
    dst[3] = intensity;
    dst[4] = __fsub_rn(x, __fdiv_rn(sx, nf));
    dst[5] = __fsub_rn(y, __fdiv_rn(sy, nf));
    dst[6] = __fsub_rn(z, __fdiv_rn(sz, nf));
    dst[7] = __fsub_rn(x, ox);
    dst[8] = __fsub_rn(y, oy);
    if (oc == 10u) dst[9] = __fsqrt_rn(__fadd_rn(__fadd_rn(__fmul_rn(x, x), __fmul_rn(y, y)), __fmul_rn(z, z)));
}

// Slot s of voxel v holds point i (has) or padding: the raw row and/or the pillar row.
__device__ __forceinline__ void write_slot(const float* __restrict__ cloud, float* __restrict__ features,
                                           float* __restrict__ pillar, const int* __restrict__ coords, unsigned int v,
                                           unsigned int s, bool has, unsigned int i, float sx, float sy, float sz,
                                           unsigned int np, const VoxParams& p) {
    const unsigned long long row = (unsigned long long)v * p.max_points + s;
    if (p.flags & FLAG_RAW) {
        const unsigned int C = p.num_ch;
        float* dst = features + row * C;
        for (unsigned int k = 0; k < C; ++k) dst[k] = has ? col(cloud, p, k)[i] : 0.0f;
    }
    if (p.flags & FLAG_PILLAR) {
        const unsigned int oc = (p.flags & FLAG_RANGE) ? 10u : 9u;
        float* dst = pillar + row * oc;
        if (has) {
            pillar_row(dst, oc, col(cloud, p, 0)[i], col(cloud, p, 1)[i], col(cloud, p, 2)[i], col(cloud, p, 3)[i], sx,
                       sy, sz, np, coords, v, p);
        } else {
            for (unsigned int k = 0; k < oc; ++k) dst[k] = 0.0f;
        }
    }
}

// 4. Hard voxels from sorted segments (P > 32): one thread per (voxel, slot) of the kept voxels
// (grid-stride).
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_hard_fill(const float* __restrict__ cloud, const unsigned int* __restrict__ vals,
              const unsigned int* __restrict__ seg_start, const int* __restrict__ coords, unsigned int* counters,
              unsigned int* __restrict__ num_points, float* __restrict__ features, float* __restrict__ pillar,
              const VoxParams p) {
    const unsigned int P = p.max_points;
    const unsigned int V = kept_voxels(counters, p);
    const unsigned int K = kept_sorted(counters, p);
    const unsigned long long total = (unsigned long long)V * P;
    const float* X = col(cloud, p, 0);
    const float* Y = col(cloud, p, 1);
    const float* Z = col(cloud, p, 2);
    unsigned int pcap = 0u;
    for (unsigned long long t = (unsigned long long)blockIdx.x * VOXEL_BLOCK + threadIdx.x; t < total;
         t += (unsigned long long)gridDim.x * VOXEL_BLOCK) {
        const unsigned int v = (unsigned int)(t / P);
        const unsigned int s = (unsigned int)(t - (unsigned long long)v * P);
        const unsigned int start = seg_start[v];
        const unsigned int end = v + 1u < V ? seg_start[v + 1u] : K;
        const unsigned int cnt = end - start;
        const unsigned int np = cnt < P ? cnt : P;
        if (s == 0u) {
            num_points[v] = np;
            pcap += cnt - np;
        }
        const bool has = s < np;
        float sx = 0.0f, sy = 0.0f, sz = 0.0f;
        if (has && (p.flags & FLAG_PILLAR)) {
            for (unsigned int j = 0; j < np; ++j) {
                const unsigned int q = vals[start + j];
                sx = __fadd_rn(sx, X[q]);
                sy = __fadd_rn(sy, Y[q]);
                sz = __fadd_rn(sz, Z[q]);
            }
        }
        write_slot(cloud, features, pillar, coords, v, s, has, has ? vals[start + s] : 0u, sx, sy, sz, np, p);
    }
    pcap = warp_sum(pcap);
    if ((threadIdx.x & 31u) == 0u && pcap != 0u) atomicAdd(&counters[CTR_POINT_CAP], pcap);
}

// Ascending bitonic sort of one value per lane across the 32 lanes of a full warp.
__device__ __forceinline__ unsigned int warp_sort_asc(unsigned int v) {
    const unsigned int lane = threadIdx.x & 31u;
#pragma unroll
    for (unsigned int k = 2; k <= 32; k <<= 1) {
#pragma unroll
        for (unsigned int j = k >> 1; j > 0; j >>= 1) {
            const unsigned int o = __shfl_xor_sync(0xffffffffu, v, (int)j);
            v = (((lane & j) == 0u) == ((lane & k) == 0u)) ? min(v, o) : max(v, o);
        }
    }
    return v;
}

// 4s. Hard voxels, P <= 32, from unordered segments: one warp per kept voxel (grid-stride). Lane s
// ends with the s-th smallest point index of the segment (ascending index = input order, the
// reference's slots): the first 32 entries sorted (a segment of at most 32, the usual case: each
// entry's place is the number of smaller entries, one shuffle per entry), then every further chunk of 32 that has an entry
// below the running P-th smallest is sorted and merged in (the running list against the reversed
// chunk, elementwise min, is bitonic and holds the 32 smallest of both; five steps sort it). A
// chunk with no such entry costs one load and one ballot. The pillar sums run over shuffles in
// slot order.
// Rows are written only up to max(points, the row's filled slots): the output buffers keep their
// rows between calls, and features_fill / pillar_fill (per row: slots an earlier call may have
// left non-zero, 0xffffffff when not known) say which padding slots still need their zeros. Most
// pillars hold a few points of 32 slots, and the padding's bytes, not the selection, set this
// kernel's time.
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_hard_select(const float* __restrict__ cloud, const unsigned int* __restrict__ seg_points,
                const unsigned int* __restrict__ seg_start, const unsigned int* __restrict__ seg_len,
                const int* __restrict__ coords, unsigned int* counters, unsigned int* __restrict__ num_points,
                float* __restrict__ features, float* __restrict__ pillar, unsigned int* __restrict__ features_fill,
                unsigned int* __restrict__ pillar_fill, const VoxParams p) {
    // One row buffer per warp: 32 slots x max(VOX_MAX_CHANNELS, 10 pillar channels).
    __shared__ float s_rows[VOX_WARPS][32 * VOX_MAX_CHANNELS];
    __shared__ unsigned int s_order[VOX_WARPS][32];
    lk_wait_prior_grid(); // launched early (src/gpu/launch.rs): vox_rank_keys must have ended
    const unsigned int P = p.max_points;
    const unsigned int V = kept_voxels(counters, p);
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    const unsigned int warps = gridDim.x * VOX_WARPS;
    unsigned int pcap = 0u;
    for (unsigned int v = blockIdx.x * VOX_WARPS + warp; v < V; v += warps) {
        const unsigned int* seg = seg_points + seg_start[v];
        const unsigned int cnt = seg_len[v];
        const unsigned int np = cnt < P ? cnt : P;
        const unsigned int raw_filled = (p.flags & FLAG_RAW) ? features_fill[v] : 0u;
        const unsigned int pillar_filled = (p.flags & FLAG_PILLAR) ? pillar_fill[v] : 0u;
        const unsigned int head = lane < cnt ? seg[lane] : 0xffffffffu;
        unsigned int best;
        if (cnt <= 32u) {
            unsigned int place = 0u;
            for (unsigned int j = 0; j < cnt; ++j) place += __shfl_sync(0xffffffffu, head, (int)j) < head ? 1u : 0u;
            if (lane < cnt) s_order[warp][place] = head;
            __syncwarp();
            best = lane < cnt ? s_order[warp][lane] : 0xffffffffu;
            __syncwarp();
        } else {
            best = warp_sort_asc(head);
        }
        for (unsigned int c0 = 32u; c0 < cnt; c0 += 32u) {
            unsigned int e = c0 + lane < cnt ? seg[c0 + lane] : 0xffffffffu;
            const unsigned int bar = __shfl_sync(0xffffffffu, best, (int)P - 1);
            if (__ballot_sync(0xffffffffu, e < bar) == 0u) continue;
            e = warp_sort_asc(e);
            best = min(best, __shfl_sync(0xffffffffu, e, 31 - (int)lane));
#pragma unroll
            for (unsigned int j = 16; j > 0; j >>= 1) {
                const unsigned int o = __shfl_xor_sync(0xffffffffu, best, (int)j);
                best = (lane & j) == 0u ? min(best, o) : max(best, o);
            }
        }
        if (lane == 0u) {
            num_points[v] = np;
            pcap += cnt - np;
        }
        // Rows are written up to `slots`: the voxel's points, then the padding slots an earlier call
        // filled. Lane s builds slot s's row in the warp's shared buffer (its loads all in flight at
        // once), then the warp copies those slots out at consecutive addresses; C == 4 rows go out
        // unstaged.
        float* buf = s_rows[warp];
        const bool has = lane < np;
        if (p.flags & FLAG_RAW) {
            const unsigned int C = p.num_ch, slots = min(P, max(np, raw_filled)), total = slots * C;
            float* blk = features + (unsigned long long)v * P * C;
            if (C == 4u) {
                // x, y, z, intensity: a slot's row is one 16-byte store and the warp's stores are
                // contiguous, so the row needs no staging (rows start 16-byte aligned: P * 16 bytes).
                if (lane < slots)
                    reinterpret_cast<float4*>(blk)[lane] =
                        has ? make_float4(col(cloud, p, 0)[best], col(cloud, p, 1)[best], col(cloud, p, 2)[best],
                                          col(cloud, p, 3)[best])
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            } else {
                if (lane < slots)
                    for (unsigned int k = 0; k < C; ++k) buf[lane * C + k] = has ? col(cloud, p, k)[best] : 0.0f;
                __syncwarp();
                for (unsigned int e = lane; e < total; e += 32u) blk[e] = buf[e];
                __syncwarp();
            }
            if (lane == 0u) features_fill[v] = np;
        }
        if (p.flags & FLAG_PILLAR) {
            const float x = has ? col(cloud, p, 0)[best] : 0.0f;
            const float y = has ? col(cloud, p, 1)[best] : 0.0f;
            const float z = has ? col(cloud, p, 2)[best] : 0.0f;
            const float in = has ? col(cloud, p, 3)[best] : 0.0f;
            float sx = 0.0f, sy = 0.0f, sz = 0.0f;
            for (unsigned int j = 0; j < np; ++j) {
                sx = __fadd_rn(sx, __shfl_sync(0xffffffffu, x, (int)j));
                sy = __fadd_rn(sy, __shfl_sync(0xffffffffu, y, (int)j));
                sz = __fadd_rn(sz, __shfl_sync(0xffffffffu, z, (int)j));
            }
            const unsigned int oc = (p.flags & FLAG_RANGE) ? 10u : 9u;
            const unsigned int slots = min(P, max(np, pillar_filled)), total = slots * oc;
            if (has) {
                pillar_row(buf + lane * oc, oc, x, y, z, in, sx, sy, sz, np, coords, v, p);
            } else if (lane < slots) {
                for (unsigned int k = 0; k < oc; ++k) buf[lane * oc + k] = 0.0f;
            }
            __syncwarp();
            float* blk = pillar + (unsigned long long)v * P * oc;
            for (unsigned int e = lane; e < total; e += 32u) blk[e] = buf[e];
            if (lane == 0u) pillar_fill[v] = np;
            __syncwarp();
        }
    }
    if (lane == 0u && pcap != 0u) atomicAdd(&counters[CTR_POINT_CAP], pcap);
}

// Dynamic voxels: one thread per (voxel, channel): f64 sum in input order, / count, -> f32, each
// step as the host does it (NaN bits included).
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_dyn_means(const float* __restrict__ cloud, const unsigned int* __restrict__ vals,
              const unsigned int* __restrict__ seg_start, const unsigned int* counters,
              unsigned int* __restrict__ num_points, float* __restrict__ means, const VoxParams p) {
    const unsigned int C = p.num_ch;
    const unsigned int V = kept_voxels(counters, p);
    const unsigned int K = kept_sorted(counters, p);
    const unsigned long long total = (unsigned long long)V * C;
    for (unsigned long long t = (unsigned long long)blockIdx.x * VOXEL_BLOCK + threadIdx.x; t < total;
         t += (unsigned long long)gridDim.x * VOXEL_BLOCK) {
        const unsigned int v = (unsigned int)(t / C);
        const unsigned int k = (unsigned int)(t - (unsigned long long)v * C);
        const unsigned int start = seg_start[v];
        const unsigned int end = v + 1u < V ? seg_start[v + 1u] : K;
        const float* X = col(cloud, p, k);
        double sum = 0.0;
        for (unsigned int j = start; j < end; ++j) sum = lk_dadd_host(sum, lk_f32_to_f64_host(X[vals[j]]));
        means[t] = lk_f64_to_f32_host(lk_mean_host(sum, end - start));
        if (k == 0) num_points[v] = end - start;
    }
}

// The `downsampled` message's records (the input's layout, one per voxel in voxel order), written
// on the device so that the host copies them once instead of walking the points; the CPU
// reference is `ops::voxel::downsampled_message`. One thread per voxel writes every byte of its
// record (message buffers are reused): FLOAT32 fields and every x, y, z from the float32 means,
// INT32, UINT32 and FLOAT64 fields from the f64 mean of the records' own values (float32 cannot
// hold them) summed in input order (the voxel's sorted segment), bytes of no single-element field
// zero. Runs after vox_dyn_means over every channel of the cloud.
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_ds_records(const unsigned char* __restrict__ records, const unsigned int* __restrict__ source,
               const unsigned int* __restrict__ vals, const unsigned int* __restrict__ seg_start,
               const unsigned int* counters, const float* __restrict__ means, unsigned char* __restrict__ out,
               const GatherParams lay, const VoxParams p) {
    const unsigned int C = p.num_ch;
    const unsigned int V = kept_voxels(counters, p);
    const unsigned int K = kept_sorted(counters, p);
    const bool be = lay.big_endian != 0u;
    for (unsigned int v = blockIdx.x * VOXEL_BLOCK + threadIdx.x; v < V; v += gridDim.x * VOXEL_BLOCK) {
        unsigned char* rec = out + (unsigned long long)v * lay.point_step;
        for (unsigned int b = 0; b < lay.point_step; ++b) rec[b] = 0;
        const unsigned int start = seg_start[v];
        const unsigned int end = v + 1u < V ? seg_start[v + 1u] : K;
        for (unsigned int k = 0; k < C; ++k) {
            const unsigned int c = p.ch[k]; // the cloud's channel = the message's field
            const unsigned int dt = lay.datatype[c];
            unsigned char* field = rec + lay.offset[c];
            const float mean = means[(unsigned long long)v * C + k];
            if (dt == 7u) {
                lk_store_raw(field, __float_as_uint(mean), 4u, be);
                continue;
            }
            double value = (double)mean;
            if (k >= 3u && (dt == 5u || dt == 6u || dt == 8u)) {
                double sum = 0.0;
                for (unsigned int j = start; j < end; ++j) {
                    const unsigned char* r = lk_record(records, lay, source[vals[j]]);
                    sum = lk_dadd_host(sum, lk_load_wide(r + lay.offset[c], dt, be));
                }
                value = lk_mean_host(sum, end - start);
            }
            lk_store_raw(field, lk_host_bits(value, dt), lk_dt_size(dt), be);
        }
    }
}

// The downsampled cloud's x, y, z as device columns of stride V (channels 0..3 of the means), for
// the stages that run on it (`fps.input: downsampled`).
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_means_xyz(const float* __restrict__ means, const unsigned int* counters, float* __restrict__ xyz,
              const VoxParams p) {
    const unsigned int V = kept_voxels(counters, p);
    const unsigned long long total = 3ull * V;
    for (unsigned long long t = (unsigned long long)blockIdx.x * VOXEL_BLOCK + threadIdx.x; t < total;
         t += (unsigned long long)gridDim.x * VOXEL_BLOCK) {
        const unsigned int a = (unsigned int)(t / V);
        const unsigned int v = (unsigned int)(t - (unsigned long long)a * V);
        xyz[t] = means[(unsigned long long)v * p.num_ch + a];
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
        pillar_row(dst, oc, blk[s * C], blk[s * C + 1], blk[s * C + 2], blk[s * C + 3], sx, sy, sz, np, coords, v, p);
    }
}

// Centroids of hard voxels for the `voxels` topic, on the device so that the [V, P, C] features are
// only copied back into the published message, never read by the host. One thread per
// (voxel, channel); the f64 sum runs in slot order from -0.0 (the neutral element of Rust's float
// Sum), each step as the host does it, so the bits equal the CPU reference `ops::voxel::hard_centroids`.
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_centroids(const float* __restrict__ features, const unsigned int* __restrict__ num_points,
              const unsigned int* counters, float* __restrict__ out, const VoxParams p) {
    const unsigned int P = p.max_points;
    const unsigned int C = p.num_ch;
    const unsigned long long total = (unsigned long long)kept_voxels(counters, p) * C;
    for (unsigned long long t = (unsigned long long)blockIdx.x * VOXEL_BLOCK + threadIdx.x; t < total;
         t += (unsigned long long)gridDim.x * VOXEL_BLOCK) {
        const unsigned int v = (unsigned int)(t / C);
        const unsigned int k = (unsigned int)(t - (unsigned long long)v * C);
        const unsigned int np = num_points[v];
        const float* blk = features + (unsigned long long)v * P * C + k;
        double sum = -0.0;
        for (unsigned int j = 0; j < np; ++j) sum = lk_dadd_host(sum, lk_f32_to_f64_host(blk[(unsigned long long)j * C]));
        out[t] = lk_f64_to_f32_host(lk_mean_host(sum, np > 0u ? np : 1u));
    }
}

// The `voxels` message's records (`ops::voxel::voxels_message`): per kept voxel, little-endian
// words centroid x, y, z, [the centroid of channel `intensity` when it is not -1], num_points,
// voxel z, y, x. Written on the device so that the host copies the message instead of building it.
extern "C" __global__ void __launch_bounds__(VOXEL_BLOCK)
vox_voxels_records(const float* __restrict__ centroids, const unsigned int* __restrict__ num_points,
                   const int* __restrict__ coords, const unsigned int* counters, unsigned int* __restrict__ out,
                   const int intensity, const VoxParams p) {
    const unsigned int C = p.num_ch;
    const unsigned int words = intensity >= 0 ? 8u : 7u;
    const unsigned int V = kept_voxels(counters, p);
    for (unsigned int v = blockIdx.x * VOXEL_BLOCK + threadIdx.x; v < V; v += gridDim.x * VOXEL_BLOCK) {
        const float* c = centroids + (unsigned long long)v * C;
        unsigned int* rec = out + (unsigned long long)v * words;
        unsigned int k = 0;
        rec[k++] = __float_as_uint(c[0]);
        rec[k++] = __float_as_uint(c[1]);
        rec[k++] = __float_as_uint(c[2]);
        if (intensity >= 0) rec[k++] = __float_as_uint(c[intensity]);
        rec[k++] = num_points[v];
        for (unsigned int a = 0; a < 3u; ++a) rec[k++] = (unsigned int)coords[3ull * v + a];
    }
}

// fp16 copies of voxel features for fp16 networks (Jetson). cvt.rn rounds to nearest even, the
// rounding of half::f16::from_f32 on the host, so the CPU reference gives the same bits. Inline PTX
// keeps NVRTC free of the cuda_fp16.h header.
extern "C" __global__ void vox_to_half(const float* __restrict__ in, unsigned short* __restrict__ out, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(in[i]));
        out[i] = h;
    }
}
