// Farthest point sampling (FPS), exact: the same selection as the CPU reference src/ops/fps.rs.
//
// dist2 = (dx*dx + dy*dy) + dz*dz in f32, each operation rounded (no FMA: explicit __f*_rn and
// --fmad=false); min_dist update `d < m`; selected points hold -1; arg-max of min_dist with ties to
// the lowest index.
//
// Layout: one launch handles B clouds stored back to back (ragged, `offsets[b] .. offsets[b+1]`),
// G blocks per cloud ("cloud group"). Block g of a cloud owns a contiguous chunk of its points.
//  - register path (fps_reg_PPT): each thread keeps PPT points (x, y, z, min_dist) in registers,
//    point i of the chunk at slot i / FPS_BLOCK, thread i % FPS_BLOCK (coalesced load once);
//  - memory path (fps_mem): the chunk is re-read from global memory every iteration (L2-resident)
//    and min_dist lives in a global scratch array (any cloud size).
// Every iteration: each thread updates its min distances and keeps its best key
// (min_dist bits << 32 | ~index: larger distance first, then lower index; selected points key 0);
// warp shuffles and one shared-memory step give the block's best. With G == 1 that is the sample.
// With G > 1 the blocks of a cloud publish (key, x, y, z) to a double-buffered board, arrive on a
// per-cloud counter and spin until all G have arrived (all blocks are co-resident: the host launches
// cooperatively); then every block reduces the G board entries itself (one L2 round trip).
// The result is independent of scheduling: keys are unique and the max is associative.
//
// Compile-time constants: FPS_BLOCK (threads per block, multiple of 32, <= 1024).

#ifndef FPS_BLOCK
#define FPS_BLOCK 1024
#endif
#if (FPS_BLOCK % 32) != 0 || FPS_BLOCK > 1024 || FPS_BLOCK < 32
#error "FPS_BLOCK must be a multiple of 32 in 32..=1024"
#endif
#define FPS_WARPS (FPS_BLOCK / 32)

typedef unsigned long long u64;

// Must match `FpsKernelParams` in src/gpu/fps.rs (repr(C)).
struct FpsKernelParams {
    unsigned long long stride; // column stride of xyz, in floats (y = xyz + stride, z = xyz + 2 stride)
    unsigned int num_clouds;
    unsigned int group;        // G: blocks per cloud
    unsigned int k;            // samples per cloud (row width)
    unsigned int start;        // first sample, local index
    unsigned int chunk;        // points per block (memory path; register path: FPS_BLOCK * PPT)
    unsigned int pad_;
};

__device__ __forceinline__ float fps_dist2(float ax, float ay, float az, float bx, float by, float bz) {
    const float dx = __fsub_rn(ax, bx);
    const float dy = __fsub_rn(ay, by);
    const float dz = __fsub_rn(az, bz);
    return __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
}

// m is never NaN; selected points (m < 0) get key 0 (below every candidate).
__device__ __forceinline__ u64 fps_key(float m, unsigned int i) {
    return m < 0.0f ? 0ull : (((u64)__float_as_uint(m) << 32) | (u64)(0xffffffffu - i));
}

__device__ __forceinline__ u64 warp_max_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u64 w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

template <int PPT, bool MEM>
__device__ __forceinline__ void fps_body(const float* __restrict__ xyz, const unsigned int* __restrict__ offsets,
                                         int* __restrict__ out, float* __restrict__ md,
                                         u64* board_key, float4* board_xyz, unsigned int* counters,
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

    const unsigned int chunk = MEM ? p.chunk : (unsigned int)(FPS_BLOCK * PPT);
    const unsigned int c0 = g * chunk;
    const unsigned int c1 = c0 + chunk < len ? c0 + chunk : len; // c0 may exceed len: empty block

    float px[MEM ? 1 : PPT], py[MEM ? 1 : PPT], pz[MEM ? 1 : PPT], pm[MEM ? 1 : PPT];
    if (!MEM) {
#pragma unroll
        for (int s = 0; s < PPT; ++s) {
            const unsigned int i = c0 + (unsigned int)s * FPS_BLOCK + tid;
            if (i < c1) {
                px[s] = X[i];
                py[s] = Y[i];
                pz[s] = Z[i];
                pm[s] = __int_as_float(0x7f800000); // +inf
            } else {
                px[s] = 0.0f;
                py[s] = 0.0f;
                pz[s] = 0.0f;
                pm[s] = -1.0f; // not a point of this block
            }
        }
    }

    unsigned int last = p.start;
    float sx = X[last], sy = Y[last], sz = Z[last];
    const unsigned int board_base = cloud * 2u * G;

    for (unsigned int step = 1; step < steps; ++step) {
        u64 best = 0ull;
        float bx = 0.0f, by = 0.0f, bz = 0.0f;
        if (!MEM) {
#pragma unroll
            for (int s = 0; s < PPT; ++s) {
                const unsigned int i = c0 + (unsigned int)s * FPS_BLOCK + tid;
                const float d = fps_dist2(px[s], py[s], pz[s], sx, sy, sz);
                float m = pm[s];
                m = (i == last) ? -1.0f : (d < m ? d : m);
                pm[s] = m;
                const u64 key = fps_key(m, i);
                if (key > best) {
                    best = key;
                    bx = px[s];
                    by = py[s];
                    bz = pz[s];
                }
            }
        } else {
            for (unsigned int i = c0 + tid; i < c1; i += FPS_BLOCK) {
                const float x = X[i], y = Y[i], z = Z[i];
                const float d = fps_dist2(x, y, z, sx, sy, sz);
                float m = step == 1 ? __int_as_float(0x7f800000) : M[i];
                m = (i == last) ? -1.0f : (d < m ? d : m);
                M[i] = m;
                const u64 key = fps_key(m, i);
                if (key > best) {
                    best = key;
                    bx = x;
                    by = y;
                    bz = z;
                }
            }
        }
        // Block arg-max.
        const u64 wbest = warp_max_u64(best);
        if (lane == 0) s_key[warp] = wbest;
        if (best == wbest && wbest != 0ull) s_xyz[warp] = make_float4(bx, by, bz, 0.0f);
        __syncthreads();
        if (warp == 0) {
            u64 v = lane < FPS_WARPS ? s_key[lane] : 0ull;
            const u64 bmax = warp_max_u64(v);
            const unsigned int win = __ballot_sync(0xffffffffu, v == bmax && bmax != 0ull);
            float4 c = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (win != 0u) c = s_xyz[__ffs(win) - 1];
            u64 gbest = bmax;
            if (G > 1) {
                // Publish, arrive, wait for the cloud group, reduce the board.
                const unsigned int slot = board_base + (step & 1u) * G;
                if (lane == 0) {
                    __stcg(&board_key[slot + g], bmax);
                    __stcg(&board_xyz[slot + g], c);
                    __threadfence();
                    atomicAdd(&counters[cloud], 1u);
                    const unsigned int target = step * G;
                    while (*((volatile unsigned int*)&counters[cloud]) < target) {
                    }
                    __threadfence();
                }
                __syncwarp();
                u64 mine = 0ull;
                float4 mc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                for (unsigned int e = lane; e < G; e += 32u) {
                    const u64 kk = __ldcg(&board_key[slot + e]);
                    const float4 cc = __ldcg(&board_xyz[slot + e]);
                    if (kk > mine) {
                        mine = kk;
                        mc = cc;
                    }
                }
                gbest = warp_max_u64(mine);
                const unsigned int w2 = __ballot_sync(0xffffffffu, mine == gbest && gbest != 0ull);
                const int src = w2 != 0u ? __ffs(w2) - 1 : 0;
                c.x = __shfl_sync(0xffffffffu, mc.x, src);
                c.y = __shfl_sync(0xffffffffu, mc.y, src);
                c.z = __shfl_sync(0xffffffffu, mc.z, src);
            }
            if (lane == 0) {
                c.w = __uint_as_float(0xffffffffu - (unsigned int)(gbest & 0xffffffffull));
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
    }
}

#define FPS_ARGS                                                                                        \
    const float* __restrict__ xyz, const unsigned int* __restrict__ offsets, int* __restrict__ out,    \
        float* __restrict__ md, u64* board_key, float4* board_xyz, unsigned int* counters,             \
        const FpsKernelParams p
#define FPS_PASS xyz, offsets, out, md, board_key, board_xyz, counters, p

extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_reg_1(FPS_ARGS) { fps_body<1, false>(FPS_PASS); }
extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_reg_2(FPS_ARGS) { fps_body<2, false>(FPS_PASS); }
extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_reg_4(FPS_ARGS) { fps_body<4, false>(FPS_PASS); }
extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_reg_8(FPS_ARGS) { fps_body<8, false>(FPS_PASS); }
extern "C" __global__ void __launch_bounds__(FPS_BLOCK) fps_mem(FPS_ARGS) { fps_body<1, true>(FPS_PASS); }
