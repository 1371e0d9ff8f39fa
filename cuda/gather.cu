// PointCloud2 gather: any field layout (datatype, offset, endianness, row padding) -> float32
// structure-of-arrays columns, with the points whose x, y or z is not finite dropped.
//
// Must match the CPU reference `cloud::gather` bit for bit:
//   - every value is converted to float32 the way Rust's `as f32` does (round to nearest even;
//     float64 NaN keeps its sign and top payload bits, quiet bit set, as x86 cvtsd2ss / aarch64 fcvt);
//   - surviving points keep their input order (deterministic compaction, see below).
//
// Compaction: ONE kernel, single pass, decoupled look-back scan (Merrill & Garland). Each block takes
// the next tile id from a counter (so every tile it waits on belongs to a block that already runs),
// counts its finite points, publishes the count, then sums its predecessors' published counts and
// inclusive prefixes. The result is an exact integer prefix: the output order is the input order,
// whatever the scheduling. No atomics decide where a point goes.
//
// Compile-time constants (from the kernel profile, `-D NAME=value`):
//   GATHER_BLOCK  threads per block (multiple of 32, <= 1024)
//   GATHER_ITEMS  consecutive points per thread

#include "common.cuh"

#ifndef GATHER_BLOCK
#define GATHER_BLOCK 256
#endif
#ifndef GATHER_ITEMS
#define GATHER_ITEMS 4
#endif

#define GATHER_TILE (GATHER_BLOCK * GATHER_ITEMS)
#define GATHER_WARPS (GATHER_BLOCK / 32)

#if (GATHER_BLOCK % 32) != 0 || GATHER_BLOCK > 1024 || GATHER_BLOCK < 32
#error "GATHER_BLOCK must be a multiple of 32 in 32..=1024"
#endif
#if GATHER_ITEMS < 1 || GATHER_ITEMS > 32
#error "GATHER_ITEMS must be in 1..=32"
#endif

// Tile status word: high 32 bits = flag, low 32 bits = value.
#define STATUS_AGGREGATE 1ull
#define STATUS_PREFIX 2ull

__device__ __forceinline__ float to_f32(unsigned long long v, unsigned int dt) {
    switch (dt) {
        case 1: return (float)(int)(signed char)(unsigned char)v;       // exact
        case 2: return (float)(unsigned int)(unsigned char)v;           // exact
        case 3: return (float)(int)(short)(unsigned short)v;            // exact
        case 4: return (float)(unsigned int)(unsigned short)v;          // exact
        case 5: return __int2float_rn((int)(unsigned int)v);
        case 6: return __uint2float_rn((unsigned int)v);
        case 7: return __uint_as_float((unsigned int)v);
        default: return lk_f64_to_f32_host(__longlong_as_double((long long)v));
    }
}

__device__ __forceinline__ float load_field(const unsigned char* point, const GatherParams& p, unsigned int c) {
    const unsigned int dt = p.datatype[c];
    return to_f32(lk_load_raw(point + p.offset[c], lk_dt_size(dt), p.big_endian != 0u), dt);
}

__device__ __forceinline__ unsigned long long status_load(unsigned long long* s) {
    return atomicOr(s, 0ull); // coherent L2 read
}

// data:        the raw PointCloud2 blob (row_step * height bytes, last row may lack its padding)
// out:         num_channels columns of `capacity` floats
// source:      for every surviving point, the index of its record (what the downsample's record
//              kernel reads the fields float32 cannot hold from)
// tile_status: one zeroed word per tile
// tile_counter: one zeroed word
// out_count:   number of surviving points (written by the last tile)
extern "C" __global__ void __launch_bounds__(GATHER_BLOCK)
gather_compact(const unsigned char* __restrict__ data, float* __restrict__ out,
               unsigned int* __restrict__ source, unsigned long long* tile_status, unsigned int* tile_counter,
               unsigned int* out_count, const GatherParams p) {
    __shared__ unsigned int s_tile;
    __shared__ unsigned int s_warp[GATHER_WARPS];
    __shared__ unsigned int s_prefix;

    if (threadIdx.x == 0) s_tile = atomicAdd(tile_counter, 1u);
    __syncthreads();
    const unsigned int tile = s_tile;
    const unsigned int num_tiles = (p.n + GATHER_TILE - 1) / GATHER_TILE;
    const unsigned long long base = (unsigned long long)tile * GATHER_TILE +
                                    (unsigned long long)threadIdx.x * GATHER_ITEMS;

    // 1. Finite flags of this thread's consecutive points.
    unsigned int flags = 0u;
    unsigned int count = 0u;
#pragma unroll 1
    for (int k = 0; k < GATHER_ITEMS; ++k) {
        const unsigned long long idx = base + k;
        if (idx < p.n) {
            const unsigned char* pt = lk_record(data, p, (unsigned int)idx);
            const float x = load_field(pt, p, 0), y = load_field(pt, p, 1), z = load_field(pt, p, 2);
            if (lk_finite3(x, y, z)) {
                flags |= 1u << k;
                ++count;
            }
        }
    }

    // 2. Block-wide exclusive scan of the counts (warp shuffles, then the warp totals).
    unsigned int tile_total;
    const unsigned int thread_excl = lk_block_excl_scan<GATHER_WARPS>(count, s_warp, &tile_total);

    // 3. Decoupled look-back for the tile's exclusive prefix.
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
                if (flag == 0ull) continue; // predecessor not published yet: its block is running
                excl += (unsigned int)(s & 0xffffffffull);
                if (flag == STATUS_PREFIX) break;
                --j;
            }
            atomicExch(&tile_status[tile], (STATUS_PREFIX << 32) | (excl + tile_total));
        }
        s_prefix = excl;
        if (tile == num_tiles - 1) *out_count = excl + tile_total;
    }
    __syncthreads();

    // 4. Write the surviving points, every channel, in input order.
    unsigned int pos = s_prefix + thread_excl;
#pragma unroll 1
    for (int k = 0; k < GATHER_ITEMS; ++k) {
        if (flags & (1u << k)) {
            const unsigned char* pt = lk_record(data, p, (unsigned int)(base + k));
#pragma unroll 1
            for (unsigned int c = 0; c < p.num_channels; ++c) {
                out[(unsigned long long)c * p.capacity + pos] = load_field(pt, p, c);
            }
            source[pos] = (unsigned int)(base + k);
            ++pos;
        }
    }
}

// The neighbour-search queries: x, y, z of m sampled points, in sample order, from the gathered
// columns (stride = column capacity). The FPS indices are read where FPS writes them, so the
// samples never go through the host between the two stages.
extern "C" __global__ void select_xyz(const float* __restrict__ cols, unsigned long long stride,
                                      const int* __restrict__ idx, unsigned int m,
                                      float* __restrict__ out) {
    const unsigned int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= m) return;
    // FPS may still be running: the pipeline launches a chunk of queries once the host has seen
    // the chunk's last index written; the earlier ones may not have landed yet (-1 before FPS).
    int v;
    while ((v = *(volatile const int*)(idx + q)) < 0) {
    }
    const unsigned long long i = (unsigned long long)v;
    out[q] = cols[i];
    out[m + q] = cols[stride + i];
    out[2ull * m + q] = cols[2ull * stride + i];
}

// The `samples` message's records: record source[idx[k]] of a message held on the device (the
// uploaded input; without `source`, idx[k] itself: the `downsampled` records), copied byte for
// byte, so the pass-through output keeps every field's datatype and value and the host never
// reads the input at random (a cache and TLB miss per sample, on the frame's critical path).
// One thread per output byte: the writes are coalesced whatever the point step.
extern "C" __global__ void select_records(const unsigned char* __restrict__ records,
                                          const unsigned int* __restrict__ source,
                                          const int* __restrict__ idx, unsigned int m,
                                          unsigned int point_step, unsigned int width,
                                          unsigned int row_step, unsigned char* __restrict__ out) {
    const unsigned long long total = (unsigned long long)m * point_step;
    for (unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned int k = (unsigned int)(t / point_step);
        const unsigned int b = (unsigned int)(t - (unsigned long long)k * point_step);
        const unsigned int i = source ? source[idx[k]] : (unsigned int)idx[k];
        const unsigned int row = i / width;
        const unsigned int col = i - row * width;
        out[t] = records[(unsigned long long)row * row_step + (unsigned long long)col * point_step + b];
    }
}
