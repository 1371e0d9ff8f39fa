// Farthest point sampling (FPS), exact: the same selection as the CPU reference src/ops/fps/mod.rs.
//
// dist2 = (dx*dx + dy*dy) + dz*dz in f32, each operation rounded (no FMA: explicit __f*_rn and
// --fmad=false); min_dist update `d < m`; selected points hold -1; arg-max of min_dist with ties to
// the lowest index.
//
// Layout: one launch handles B clouds stored back to back (ragged, `offsets[b] .. offsets[b+1]`),
// G blocks per cloud ("cloud group"). Block g of a cloud owns a contiguous chunk of its points
// (the cluster path below deals warp chunks over its blocks instead).
//  - register path (fps_reg_PPT): each thread keeps PPT consecutive points (x, y, z, min_dist) in
//    registers, so that a warp's points are near each other in a scan-ordered cloud (see FpsBox);
//  - memory path (fps_mem): the chunk is re-read from global memory every iteration (L2-resident)
//    and min_dist lives in a global scratch array (any cloud size).
// Every iteration: each thread updates its min distances (register path: unless its warp skips,
// FpsBox) and keeps its best key (min_dist bits << 32 | ~index: larger distance first, then lower
// index; selected points key 0); warp reductions and one shared-memory step give the block's best.
// With G == 1 that is the sample. With G > 1 the blocks of a cloud atomicMax their key into the
// step's exchange slot, add one to the slot's arrival count and spin until all G have arrived (all
// blocks are co-resident: the host launches cooperatively). Key and count share 16 bytes, so the
// load that sees the last arrival also brings the final key; then each block reads the winner's
// coordinates. A board of G (key, x, y, z) entries read by every block was slower on W2c
// (BENCHMARKS.md 2026-12-06 (later)). The result is independent of scheduling: keys are unique and
// max is associative.
//
// sm_90+ adds a thread-block-cluster path (fps_cl_BLOCK_PPT, below), exchanging through distributed
// shared memory instead of global memory.
//
// Compile-time constants: FPS_BLOCK (threads per block of fps_reg_* and fps_mem, multiple of 32,
// <= 1024). The cluster kernels carry their own block size in their names.

#include "common.cuh"

#ifndef FPS_BLOCK
#define FPS_BLOCK 1024
#endif
#if (FPS_BLOCK % 32) != 0 || FPS_BLOCK > 1024 || FPS_BLOCK < 32
#error "FPS_BLOCK must be a multiple of 32 in 32..=1024"
#endif
#define FPS_WARPS (FPS_BLOCK / 32)

// Must match `FpsKernelParams` in src/ops/fps/cuda.rs (repr(C), same size asserted there).
struct FpsKernelParams {
    unsigned long long stride; // column stride of xyz, in floats (y = xyz + stride, z = xyz + 2 stride)
    unsigned int num_clouds;
    unsigned int group;        // G: blocks per cloud
    unsigned int k;            // samples per cloud (row width)
    unsigned int start;        // first sample, local index
    unsigned int chunk;        // points per block (memory path; register path: FPS_BLOCK * PPT)
    unsigned int pad_;
};
static_assert(sizeof(FpsKernelParams) == 32, "FpsKernelParams: size differs from src/ops/fps/cuda.rs");

// m is never NaN; selected and absent points (m < 0) get key 0 (below every candidate).
__device__ __forceinline__ u64 fps_key(float m, unsigned int i) {
    return m < 0.0f ? 0ull : (((u64)__float_as_uint(m) << 32) | (u64)(0xffffffffu - i));
}

// Max over a full warp. sm_80+ has a 32-bit warp max (redux.sync): the high words, then the low
// words of the lanes that hold the high max; older GPUs (Xavier) shuffle.
__device__ __forceinline__ u64 warp_max_u64(u64 v) {
#if __CUDA_ARCH__ >= 800
    const unsigned int hi = (unsigned int)(v >> 32);
    const unsigned int hmax = __reduce_max_sync(0xffffffffu, hi);
    const unsigned int lmax = __reduce_max_sync(0xffffffffu, hi == hmax ? (unsigned int)v : 0u);
    return ((u64)hmax << 32) | lmax;
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u64 w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
#endif
}

// Exchange slots per cloud, 16 bytes each: (key, arrival count). Step s reduces into slot
// s % FPS_SLOTS. Block 0 clears slot s + 1 before it arrives at step s: with three or more slots,
// every block has read that slot (at step s + 1 - FPS_SLOTS <= s - 2) before arriving at step s - 1,
// and no block adds to it before leaving step s's wait. With two, block 0 would clear the slot
// that slower blocks still spin on. The host zeroes all of them and sizes them with the same
// constant (EXCHANGE_SLOTS in src/ops/fps/cuda.rs, passed by src/gpu/nvrtc.rs).
#ifndef FPS_SLOTS
#error "FPS_SLOTS is passed to NVRTC by src/gpu/nvrtc.rs"
#endif
#if FPS_SLOTS < 3
#error "FPS_SLOTS must be at least 3 (see above)"
#endif

// Arrive on a slot and wait for the cloud group: the release add orders this block's atomicMax
// (and block 0's clearing) before its arrival. The spin reads key and count with one aligned
// 16-byte load, which L2 serves from one sector at one time, so when it shows all G arrivals it
// shows the key they left: one round trip where reading the key after the count took two (W2c
// 44.5 -> 34.2 ms on an H100). The PTX memory model promises this per element only (a vector
// access is a set of scalar ones); the hardware's sector access is what is relied on, and
// check-gpu's grid rows (thousands of exchanges, lattice ties decided across blocks) test it.
__device__ __forceinline__ u64 fps_slot_arrive_wait(u64* slot, unsigned int G) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(slot + 1) : "memory");
    u64 key, count;
    do {
        asm volatile("ld.acquire.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(key), "=l"(count) : "l"(slot) : "memory");
    } while ((unsigned int)count < G);
    return key;
}

// A warp's points lie in an axis-aligned box. lk_dist2 from the selected point to the box's nearest
// point is at most the distance of every point in the box, computed the same way (each rounding is
// monotonic). While it exceeds the largest min distance of the warp, no min distance of the warp can
// change, so the warp skips its update and keeps its arg-max: exact, whatever the points' order, and
// on scan-ordered clouds most warps are far from most samples. A NaN sample or bound compares
// false: no skip. Points with a NaN coordinate are left out of the box (fminf / fmaxf), which is
// exact too: their distance is NaN, so their min distance never changes.
struct FpsBox {
    float lx, ly, lz, hx, hy, hz;
};

// The box of the points a warp holds, each thread passing the bounds of its own (+inf / -inf for
// none).
__device__ __forceinline__ FpsBox fps_warp_box(FpsBox b) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        b.lx = fminf(b.lx, __shfl_xor_sync(0xffffffffu, b.lx, o));
        b.ly = fminf(b.ly, __shfl_xor_sync(0xffffffffu, b.ly, o));
        b.lz = fminf(b.lz, __shfl_xor_sync(0xffffffffu, b.lz, o));
        b.hx = fmaxf(b.hx, __shfl_xor_sync(0xffffffffu, b.hx, o));
        b.hy = fmaxf(b.hy, __shfl_xor_sync(0xffffffffu, b.hy, o));
        b.hz = fmaxf(b.hz, __shfl_xor_sync(0xffffffffu, b.hz, o));
    }
    return b;
}

__device__ __forceinline__ void fps_box_add(FpsBox& b, float x, float y, float z) {
    b.lx = fminf(b.lx, x);
    b.ly = fminf(b.ly, y);
    b.lz = fminf(b.lz, z);
    b.hx = fmaxf(b.hx, x);
    b.hy = fmaxf(b.hy, y);
    b.hz = fmaxf(b.hz, z);
}

__device__ __forceinline__ FpsBox fps_box_empty() {
    const float inf = __int_as_float(0x7f800000);
    return FpsBox{inf, inf, inf, -inf, -inf, -inf};
}

__device__ __forceinline__ bool fps_box_far(const FpsBox& b, float sx, float sy, float sz, float wmax) {
    const float cx = fminf(fmaxf(sx, b.lx), b.hx);
    const float cy = fminf(fmaxf(sy, b.ly), b.hy);
    const float cz = fminf(fmaxf(sz, b.lz), b.hz);
    return lk_dist2(sx, sy, sz, cx, cy, cz) > wmax;
}

template <int PPT, bool MEM>
__device__ __forceinline__ void fps_body(const float* __restrict__ xyz, const unsigned int* __restrict__ offsets,
                                         int* __restrict__ out, float* __restrict__ md, u64* exchange,
                                         const FpsKernelParams& p) {
    __shared__ u64 s_key[FPS_WARPS];
    __shared__ float4 s_xyz[FPS_WARPS];
    __shared__ float4 s_sel;

    const unsigned int G = p.group;
    const unsigned int cloud = blockIdx.x / G;
    const unsigned int g = blockIdx.x - cloud * G;
    const unsigned int tid = threadIdx.x;
    const unsigned int lane = tid & 31u;
    const unsigned int warp = tid >> 5;
    const unsigned int off = offsets[cloud];
    const unsigned int len = offsets[cloud + 1] - off;
    const unsigned int K = p.k;
    int* row = out + (u64)cloud * K;

    if (g == 0) {
        for (unsigned int j = (len < K ? len : K) + tid; j < K; j += FPS_BLOCK) row[j] = -1;
    }
    if (len == 0) return;
    const unsigned int steps = len < K ? len : K;
    if (g == 0 && tid == 0) row[0] = (int)p.start;

    const float* X = xyz + off;
    const float* Y = xyz + p.stride + off;
    const float* Z = xyz + 2ull * p.stride + off;
    float* M = md + off;
    u64* slots = exchange + (u64)cloud * FPS_SLOTS * 2u;

    const unsigned int chunk = MEM ? p.chunk : (unsigned int)(FPS_BLOCK * PPT);
    const unsigned int c0 = g * chunk;
    const unsigned int c1 = c0 + chunk < len ? c0 + chunk : len; // c0 may exceed len: empty block

    unsigned int last = p.start;
    const unsigned int t0 = c0 + tid * (unsigned int)PPT; // register path: this thread's first point
    float px[MEM ? 1 : PPT], py[MEM ? 1 : PPT], pz[MEM ? 1 : PPT], pm[MEM ? 1 : PPT];
    FpsBox box = fps_box_empty();
    if (!MEM) {
#pragma unroll
        for (int s = 0; s < PPT; ++s) {
            const unsigned int i = t0 + (unsigned int)s;
            if (i < c1) {
                px[s] = X[i];
                py[s] = Y[i];
                pz[s] = Z[i];
                pm[s] = i == last ? -1.0f : __int_as_float(0x7f800000); // +inf
                fps_box_add(box, px[s], py[s], pz[s]);
            } else {
                px[s] = 0.0f;
                py[s] = 0.0f;
                pz[s] = 0.0f;
                pm[s] = -1.0f; // not a point of this block
            }
        }
    }

    if (!MEM) box = fps_warp_box(box);

    float sx = X[last], sy = Y[last], sz = Z[last];
    // This thread's best key and its warp's, kept while the warp skips (register path); +inf
    // makes the first step update.
    u64 best = 0ull, wbest = 0ull;
    float wmax = __int_as_float(0x7f800000);

    for (unsigned int step = 1; step < steps; ++step) {
        // Min-distance update and this thread's arg-max (strict >: its points are visited in
        // index order, so ties go to the lowest index). fminf(d, m) = `d < m ? d : m` (m is never
        // NaN, fminf(NaN, m) = m); -1 (selected, absent) stays below every d >= 0.
        if (!MEM) {
            if (!fps_box_far(box, sx, sy, sz, wmax)) {
                float bm = -1.0f;
                unsigned int bi = 0u;
#pragma unroll
                for (int s = 0; s < PPT; ++s) {
                    const float m = fminf(lk_dist2(px[s], py[s], pz[s], sx, sy, sz), pm[s]);
                    pm[s] = m;
                    if (m > bm) {
                        bm = m;
                        bi = t0 + (unsigned int)s;
                    }
                }
                best = fps_key(bm, bi);
                wbest = warp_max_u64(best);
                wmax = wbest == 0ull ? -1.0f : __uint_as_float((unsigned int)(wbest >> 32));
            }
        } else {
            float bm = -1.0f;
            unsigned int bi = 0u;
            for (unsigned int i = c0 + tid; i < c1; i += FPS_BLOCK) {
                const float d = lk_dist2(X[i], Y[i], Z[i], sx, sy, sz);
                const float m = i == last ? -1.0f : fminf(d, step == 1 ? __int_as_float(0x7f800000) : M[i]);
                M[i] = m;
                if (m > bm) {
                    bm = m;
                    bi = i;
                }
            }
            best = fps_key(bm, bi);
            wbest = warp_max_u64(best);
        }
        // Block arg-max. With G == 1 it is the sample, and its coordinates come from the winner's
        // registers (a global read would add a round trip to every step of every batched cloud).
        if (lane == 0) s_key[warp] = wbest;
        if (!MEM && G == 1 && best == wbest && wbest != 0ull) {
            const unsigned int bi = 0xffffffffu - (unsigned int)(best & 0xffffffffull);
            float bx = 0.0f, by = 0.0f, bz = 0.0f;
#pragma unroll
            for (int s = 0; s < PPT; ++s) {
                if (t0 + (unsigned int)s == bi) {
                    bx = px[s];
                    by = py[s];
                    bz = pz[s];
                }
            }
            s_xyz[warp] = make_float4(bx, by, bz, 0.0f);
        }
        __syncthreads();
        if (warp == 0) {
            const u64 v = lane < FPS_WARPS ? s_key[lane] : 0ull;
            u64 gbest = warp_max_u64(v);
            if (G > 1 && lane == 0) {
                // One atomic max into the step's slot, arrive, wait for the cloud group and the
                // key; the coordinates are one more L2 round trip.
                u64* slot = slots + 2u * (step % FPS_SLOTS);
                if (gbest != 0ull) atomicMax(slot, gbest);
                if (g == 0) {
                    ulonglong2* next = reinterpret_cast<ulonglong2*>(slots + 2u * ((step + 1u) % FPS_SLOTS));
                    __stcg(next, make_ulonglong2(0ull, 0ull));
                }
                gbest = fps_slot_arrive_wait(slot, G);
            }
            const unsigned int win = __ballot_sync(0xffffffffu, lane < FPS_WARPS && v == gbest);
            if (lane == 0) {
                const unsigned int idx = 0xffffffffu - (unsigned int)(gbest & 0xffffffffull);
                float4 c;
                if (!MEM && G == 1) {
                    c = s_xyz[win != 0u ? __ffs(win) - 1 : 0];
                } else {
                    c = make_float4(__ldg(X + idx), __ldg(Y + idx), __ldg(Z + idx), 0.0f);
                }
                c.w = __uint_as_float(idx);
                s_sel = c;
            }
        }
        __syncthreads();
        const float4 sel = s_sel;
        sx = sel.x;
        sy = sel.y;
        sz = sel.z;
        last = __float_as_uint(sel.w);
        if (g == 0 && tid == 0) row[step] = (int)last;
        if (!MEM) {
            const unsigned int rel = last - c0; // the selected point leaves the candidates
            if (rel < chunk && rel / (unsigned int)PPT == tid) {
#pragma unroll
                for (int s = 0; s < PPT; ++s)
                    if ((unsigned int)s == rel % (unsigned int)PPT) pm[s] = -1.0f;
            }
        }
    }
}

#define FPS_ARGS                                                                                        \
    const float* __restrict__ xyz, const unsigned int* __restrict__ offsets, int* __restrict__ out,    \
        float* __restrict__ md, u64* exchange, const FpsKernelParams p
#define FPS_PASS xyz, offsets, out, md, exchange, p

extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_reg_1(FPS_ARGS) { fps_body<1, false>(FPS_PASS); }
extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_reg_2(FPS_ARGS) { fps_body<2, false>(FPS_PASS); }
extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_reg_4(FPS_ARGS) { fps_body<4, false>(FPS_PASS); }
extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_reg_8(FPS_ARGS) { fps_body<8, false>(FPS_PASS); }
// 16 points (64 registers of points) per thread only fit blocks of at most 512 threads (128
// registers each); they halve the blocks a cloud needs, so that a 107k-point scan fits 16 SMs.
#if FPS_BLOCK <= 512
extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_reg_16(FPS_ARGS) { fps_body<16, false>(FPS_PASS); }
#endif
extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_mem(FPS_ARGS) { fps_body<1, true>(FPS_PASS); }

// ------------------------------------------------------------------------------------------------
// sm_90+: one thread-block cluster per cloud (fps_cl_BLOCK_PPT), G = cluster size <= 16 blocks
// (launched with a cluster-dimension attribute, no co-residency needed between clusters). A step's
// time is mostly the latency of its reductions and exchange, which grows with the warps per block,
// so these kernels use small blocks (256 or 512 threads) with up to 16 points per thread; the
// host's cost model (src/ops/fps/cuda.rs) picks the block size, PPT and G. Block r (cluster
// rank r) holds BLOCK * PPT points in registers, PPT consecutive points per thread in warp chunks
// dealt over the blocks (fps_dealt_first), and a float4 copy of them in dynamic shared memory (the
// winner's coordinates). Per iteration:
//  1. min-distance update, which warps far from the sample skip where PPT >= 12 (FpsBox)
//     (fminf(d, m) = `d < m ? d : m`: m is never NaN, fminf(NaN, m) = m;
//     selected / absent points hold -1, which every d >= 0 keeps) and per-thread arg-max (strict >:
//     lowest slot);
//  2. warp: max of the float bits as int (m >= 0 or -1, so int order = float order, selected/absent
//     lose), ties to the lowest lane (= lowest index); the winner lane writes (value, index);
//     __syncthreads;
//  3. warp 0 reduces the warps (ties to the lowest warp), reads the coordinates from shared memory
//     and lane q < G stores (value, index, x, y, z) with st.async into slot [rank] of block q
//     (distributed shared memory; no remote atomics), completing the transaction bytes of block
//     q's mbarrier of this step's parity;
//  4. each block waits on its own mbarrier for the G slot writes into its shared memory (no
//     cluster barrier, no fence per iteration);
//  5. every warp reduces the G slots of its own block (ties to the lowest index) and
//     takes the winner: the next selected point; its owner thread sets its min distance to -1.
// Slots and mbarriers are double-buffered by step parity: a block writes the slots of step s + 2
// only after its own wait of step s + 1, which needs every block's writes of step s + 1, which
// each block issues after reading the slots of step s.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)

#define FPS_CL_MAX 16

__device__ __forceinline__ unsigned int cl_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cl_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ unsigned int cl_map(const void* local, unsigned int rank) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(local);
    unsigned int r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}

// st.async: store into a cluster block's shared memory and complete-tx its mbarrier (no fence).
__device__ __forceinline__ void cl_st_async_v4(unsigned int addr, int a, int b, int c, int d, unsigned int mbar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(addr),
                 "r"(a), "r"(b), "r"(c), "r"(d), "r"(mbar)
                 : "memory");
}

__device__ __forceinline__ void cl_st_async_b32(unsigned int addr, int a, unsigned int mbar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr), "r"(a), "r"(mbar)
                 : "memory");
}

__device__ __forceinline__ void mbar_init(u64* bar, unsigned int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned int)__cvta_generic_to_shared(bar)), "r"(count)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"((unsigned int)__cvta_generic_to_shared(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(u64* bar, unsigned int parity) {
    asm volatile("{\n\t.reg .pred p;\n"
                 "FPS_MBAR_WAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra FPS_MBAR_WAIT;\n}" ::"r"((unsigned int)__cvta_generic_to_shared(bar)),
                 "r"(parity)
                 : "memory");
}

// The first of the PPT consecutive points that thread (warp, lane) of cluster block g holds.
// Warps take chunks of 32 * PPT points dealt round-robin over the G blocks: warp w of block g
// holds chunk w * G + g. In a scan-ordered cloud the warps that a new sample makes update (the
// others skip, FpsBox) hold neighbouring chunks; dealt out, they run on different SMs instead of
// queueing on one block's schedulers. W2a: 4.02 -> 3.68 ms on an H100 (BENCHMARKS.md 2026-12-06,
// late). The grid path keeps contiguous blocks: dealt, W2c took 2 % longer (31.25 -> 31.87 ms).
template <int PPT>
__device__ __forceinline__ unsigned int fps_dealt_first(unsigned int g, unsigned int G, unsigned int warp,
                                                        unsigned int lane) {
    return ((warp * G + g) * 32u + lane) * (unsigned int)PPT;
}

template <int BLOCK, int PPT>
__device__ __forceinline__ void fps_cluster_body(const float* __restrict__ xyz, const unsigned int* __restrict__ offsets,
                                                 int* __restrict__ out, const FpsKernelParams& p) {
    constexpr unsigned int WARPS = (unsigned int)(BLOCK / 32);
    // The box test adds its latency to every step: it paid on W2a (14 points per thread, 4.26 ->
    // 4.02 ms on an H100) and cost on W2b when every PPT skipped (8 points, 0.655 -> 0.698 ms),
    // BENCHMARKS.md 2026-12-06 (later).
    constexpr bool SKIP = PPT >= 12;
    extern __shared__ float4 s_pts[]; // BLOCK * PPT entries, warp w's chunk at w * 32 * PPT
    __shared__ int s_wv[2][WARPS];
    __shared__ unsigned int s_wi[2][WARPS];
    __shared__ __align__(8) u64 s_mbar[2];
    __shared__ int4 s_slot[2][FPS_CL_MAX];    // (value, index, x bits, y bits), written by rank
    __shared__ float s_slot_z[2][FPS_CL_MAX]; // z

    const unsigned int G = p.group;
    const unsigned int cloud = blockIdx.x / G;
    const unsigned int rank = cl_rank();
    const unsigned int tid = threadIdx.x;
    const unsigned int lane = tid & 31u;
    const unsigned int warp = tid >> 5;
    const unsigned int off = offsets[cloud];
    const unsigned int len = offsets[cloud + 1] - off;
    const unsigned int K = p.k;
    int* row = out + (u64)cloud * K;

    if (rank == 0) {
        for (unsigned int j = (len < K ? len : K) + tid; j < K; j += BLOCK) row[j] = -1;
    }
    if (len == 0) return; // the whole cluster returns (one cloud per cluster)
    const unsigned int steps = len < K ? len : K;
    if (rank == 0 && tid == 0) row[0] = (int)p.start;

    const float* X = xyz + off;
    const float* Y = xyz + p.stride + off;
    const float* Z = xyz + 2ull * p.stride + off;
    constexpr unsigned int WCHUNK = 32u * (unsigned int)PPT; // points of one warp
    const unsigned int t0 = fps_dealt_first<PPT>(rank, G, warp, lane); // index of this thread's slot 0

    float px[PPT], py[PPT], pz[PPT], pm[PPT];
    FpsBox box = fps_box_empty();
#pragma unroll
    for (int s = 0; s < PPT; ++s) {
        const unsigned int i = t0 + (unsigned int)s;
        if (i < len) {
            px[s] = X[i];
            py[s] = Y[i];
            pz[s] = Z[i];
            pm[s] = __int_as_float(0x7f800000); // +inf
            if (SKIP) fps_box_add(box, px[s], py[s], pz[s]);
        } else {
            px[s] = 0.0f;
            py[s] = 0.0f;
            pz[s] = 0.0f;
            pm[s] = -1.0f; // not a point
        }
        s_pts[tid * (unsigned int)PPT + (unsigned int)s] = make_float4(px[s], py[s], pz[s], 0.0f);
    }

    unsigned int last = p.start;
    float sx = X[last], sy = Y[last], sz = Z[last];
#pragma unroll
    for (int s = 0; s < PPT; ++s)
        if ((unsigned int)s == last - t0) pm[s] = -1.0f;
    if (tid == 0) {
        mbar_init(&s_mbar[0], 1u);
        mbar_init(&s_mbar[1], 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (SKIP) box = fps_warp_box(box);
    cl_sync(); // every block of the cluster has started; s_pts and the mbarriers are initialized
    unsigned int phase = 0u; // bit b: parity of the current phase of s_mbar[b]
    // This thread's arg-max and the warp's (value bits, lowest lane holding it), kept while the
    // warp skips; +inf makes the first step update.
    float bm = -1.0f;
    unsigned int bs = 0u;
    int wv = 0x7f800000;
    unsigned int wlane = 0u;

    for (unsigned int step = 1; step < steps; ++step) {
        const unsigned int buf = step & 1u;
        // This block's own arrival on this step's mbarrier, expecting G slot writes (20 bytes each).
        if (tid == 0) mbar_arrive_expect_tx(&s_mbar[buf], G * 20u);
        if (!SKIP || !fps_box_far(box, sx, sy, sz, __int_as_float(wv))) {
            bm = -1.0f;
            bs = 0u;
#pragma unroll
            for (int s = 0; s < PPT; ++s) {
                const float d = lk_dist2(px[s], py[s], pz[s], sx, sy, sz);
                const float m = fminf(d, pm[s]);
                pm[s] = m;
                if (m > bm) {
                    bm = m;
                    bs = (unsigned int)s;
                }
            }
            // Warp arg-max: value, then lowest lane.
            const int v = __float_as_int(bm);
            wv = __reduce_max_sync(0xffffffffu, v);
            wlane = (unsigned int)(__ffs(__ballot_sync(0xffffffffu, v == wv)) - 1);
        }
        if (lane == wlane) {
            s_wv[buf][warp] = wv;
            s_wi[buf][warp] = t0 + bs;
        }
        __syncthreads();
        if (warp == 0) {
            const int v2 = lane < WARPS ? s_wv[buf][lane] : (int)0x80000000;
            const int bv = __reduce_max_sync(0xffffffffu, v2);
            const unsigned int bt = __ballot_sync(0xffffffffu, v2 == bv);
            const unsigned int bw = (unsigned int)(__ffs(bt) - 1);
            const unsigned int bi = s_wi[buf][bw];
            // bi's place in warp bw's chunk of s_pts.
            const float4 c = s_pts[bi - (bw * G + rank) * WCHUNK + bw * WCHUNK];

            if (lane < G) {
                const unsigned int mb = cl_map(&s_mbar[buf], lane);
                cl_st_async_v4(cl_map(&s_slot[buf][rank], lane), bv, (int)bi, __float_as_int(c.x), __float_as_int(c.y), mb);
                cl_st_async_b32(cl_map(&s_slot_z[buf][rank], lane), __float_as_int(c.z), mb);
            }
        }
        mbar_wait(&s_mbar[buf], (phase >> buf) & 1u);
        phase ^= 1u << buf;
        // Cluster arg-max over the G slots: value, then lowest index (dealt chunks: rank order is
        // not index order).
        const int2 e3 = lane < G ? make_int2(s_slot[buf][lane].x, s_slot[buf][lane].y) : make_int2((int)0x80000000, -1);
        const int gv = __reduce_max_sync(0xffffffffu, e3.x);
        const unsigned int gi = __reduce_min_sync(0xffffffffu, e3.x == gv ? (unsigned int)e3.y : 0xffffffffu);
        const unsigned int wr =
            (unsigned int)(__ffs(__ballot_sync(0xffffffffu, e3.x == gv && (unsigned int)e3.y == gi)) - 1);
        const int4 sl = s_slot[buf][wr];
        last = (unsigned int)sl.y;
        sx = __int_as_float(sl.z);
        sy = __int_as_float(sl.w);
        sz = s_slot_z[buf][wr];
        if (rank == 0 && tid == 0) row[step] = (int)last;
#pragma unroll
        for (int s = 0; s < PPT; ++s)
            if ((unsigned int)s == last - t0) pm[s] = -1.0f;
    }
    cl_sync(); // no block exits while cluster shared-memory traffic may be in flight (once)
}

#define FPS_CL_ARGS                                                                                     \
    const float* __restrict__ xyz, const unsigned int* __restrict__ offsets, int* __restrict__ out,    \
        const FpsKernelParams p
// Must match CLUSTER_BLOCKS x CLUSTER_PPT in src/ops/fps/cuda.rs.
#define FPS_CL(BLOCK, PPT)                                                                              \
    extern "C" __global__ void __launch_bounds__(BLOCK, 1) fps_cl_##BLOCK##_##PPT(FPS_CL_ARGS) {          \
        fps_cluster_body<BLOCK, PPT>(xyz, offsets, out, p);                                             \
    }
#define FPS_CL_PPTS(BLOCK)                                                                              \
    FPS_CL(BLOCK, 1) FPS_CL(BLOCK, 2) FPS_CL(BLOCK, 4) FPS_CL(BLOCK, 6) FPS_CL(BLOCK, 8) FPS_CL(BLOCK, 10) \
    FPS_CL(BLOCK, 12) FPS_CL(BLOCK, 14) FPS_CL(BLOCK, 16)
FPS_CL_PPTS(256)
FPS_CL_PPTS(512)

#endif // __CUDA_ARCH__ >= 900
