// Device helpers shared by the kernel files (cuda/*.cu `#include "common.cuh"`). NVRTC gets this
// file as a named header (src/gpu/kernels.rs `HEADERS`); its text is part of every cubin's cache
// key. Every helper here is integer-exact or rounds each operation explicitly (`__f*_rn`, and the
// kernels compile with --fmad=false), so moving a kernel's copy here changes no result bit.
#pragma once

typedef unsigned long long u64;

// Squared Euclidean distance in f32 exactly as the CPU reference's `ops::neighbors::dist2`:
// (dx*dx + dy*dy) + dz*dz, each operation rounded to nearest even, never contracted into an FMA.
__device__ __forceinline__ float lk_dist2(float ax, float ay, float az, float bx, float by, float bz) {
    const float dx = __fsub_rn(ax, bx);
    const float dy = __fsub_rn(ay, by);
    const float dz = __fsub_rn(az, bz);
    return __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
}

// Neither NaN nor infinite (exponent bits not all ones), as Rust's `f32::is_finite`.
__device__ __forceinline__ bool lk_finite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
}

__device__ __forceinline__ bool lk_finite3(float x, float y, float z) {
    return lk_finite(x) && lk_finite(y) && lk_finite(z);
}

// Inclusive prefix sum over the 32 lanes of a full warp.
__device__ __forceinline__ unsigned int lk_warp_incl_scan(unsigned int v) {
    const unsigned int lane = threadIdx.x & 31u;
#pragma unroll
    for (unsigned int o = 1; o < 32; o <<= 1) {
        const unsigned int t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    return v;
}

// Block-wide exclusive scan of one value per thread (a block of WARPS full warps): returns the
// thread's exclusive prefix and the block total in *total. `s_warp` holds WARPS shared words; every
// thread of the block must call it (barriers inside, the last one so that the caller may reuse
// s_warp at once). Deterministic: an exact integer prefix whatever the scheduling.
template <unsigned int WARPS>
__device__ __forceinline__ unsigned int lk_block_excl_scan(unsigned int v, unsigned int* s_warp, unsigned int* total) {
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned int warp = threadIdx.x >> 5;
    const unsigned int incl = lk_warp_incl_scan(v);
    if (lane == 31u) s_warp[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const unsigned int w = lk_warp_incl_scan(lane < WARPS ? s_warp[lane] : 0u);
        if (lane < WARPS) s_warp[lane] = w;
    }
    __syncthreads();
    const unsigned int excl = (warp > 0 ? s_warp[warp - 1] : 0u) + incl - v;
    *total = s_warp[WARPS - 1];
    __syncthreads();
    return excl;
}
