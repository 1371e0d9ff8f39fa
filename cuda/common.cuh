// Device helpers shared by the kernel files (cuda/*.cu `#include "common.cuh"`). NVRTC gets this
// file as a named header (src/gpu/kernels.rs `HEADERS`); its text is part of every cubin's cache
// key. Every helper here is integer-exact or rounds each operation explicitly (`__f*_rn`, and the
// kernels compile with --fmad=false), so moving a kernel's copy here changes no result bit.
#pragma once

typedef unsigned long long u64;

// Programmatic dependent launch (src/gpu/launch.rs, sm_90+). A kernel launched to start before the
// previous kernel of its stream has ended calls lk_wait_prior_grid() before it touches anything that
// kernel reads or writes (it returns once that kernel has ended and its writes are visible). A
// kernel calls lk_let_next_start() to let such a next kernel be scheduled while it still runs. On
// older devices the launch orders the kernels as usual and both compile to nothing.
__device__ __forceinline__ void lk_wait_prior_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void lk_let_next_start() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Grid barrier for co-resident blocks (cooperative launches): one thread per block counts its
// block's arrival and spins until `target` blocks have arrived. The arrival is a release and the
// spin an acquire (PTX memory model, gpu scope), so the writes a block made before arriving are
// visible to every block that leaves the wait, without the two full fences of __threadfence.
// Callers barrier their own block around it (__syncthreads or __syncwarp).
__device__ __forceinline__ void lk_grid_arrive_wait(unsigned int* ctr, unsigned int target) {
    asm volatile("red.release.gpu.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
    unsigned int seen;
    do {
        asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(seen) : "l"(ctr) : "memory");
    } while (seen < target);
}

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

// ---- PointCloud2 records -------------------------------------------------------------------

#define LK_MAX_CHANNELS 32

// A cloud message's record layout (and the gather's sizes): the gather reads the records through
// it, the downsample writes records of the same layout. Must match `GatherParams` in
// src/gpu/gather.rs (repr(C), all u32; same size asserted there).
struct GatherParams {
    unsigned int num_channels;
    unsigned int point_step;
    unsigned int row_step;
    unsigned int width;
    unsigned int n;          // height * width
    unsigned int capacity;   // column stride of the gathered columns, in floats
    unsigned int big_endian;
    unsigned int pad_;
    unsigned int offset[LK_MAX_CHANNELS];
    unsigned int datatype[LK_MAX_CHANNELS]; // sensor_msgs/PointField datatype 1..=8
};
static_assert(sizeof(GatherParams) == 288, "GatherParams: size differs from src/gpu/gather.rs");

__device__ __forceinline__ unsigned int lk_dt_size(unsigned int dt) {
    return dt <= 2u ? 1u : (dt <= 4u ? 2u : (dt <= 7u ? 4u : 8u));
}

// Byte-wise loads and stores: fields may be unaligned (any offset, any point_step, row padding).
// Not unrolled: the size is a run-time value and unrolling every datatype bloats the cubin.
__device__ __forceinline__ unsigned long long lk_load_raw(const unsigned char* p, unsigned int size, bool be) {
    unsigned long long v = 0;
#pragma unroll 1
    for (unsigned int i = 0; i < size; ++i) {
        const unsigned long long b = (unsigned long long)p[i];
        v = be ? ((v << 8) | b) : (v | (b << (8u * i)));
    }
    return v;
}

__device__ __forceinline__ void lk_store_raw(unsigned char* p, unsigned long long v, unsigned int size, bool be) {
#pragma unroll 1
    for (unsigned int i = 0; i < size; ++i) p[be ? size - 1u - i : i] = (unsigned char)(v >> (8u * i));
}

// Record `idx` of the message (row-major; rows may carry padding after the points).
__device__ __forceinline__ const unsigned char* lk_record(const unsigned char* data, const GatherParams& p,
                                                          unsigned int idx) {
    const unsigned int row = idx / p.width;
    const unsigned int col = idx - row * p.width;
    return data + (unsigned long long)row * p.row_step + (unsigned long long)col * p.point_step;
}

// A field float32 cannot hold exactly (INT32, UINT32, FLOAT64), widened to f64 exactly (the CPU's
// `cloud::read_f64` for those datatypes).
__device__ __forceinline__ double lk_load_wide(const unsigned char* field, unsigned int dt, bool be) {
    const unsigned long long v = lk_load_raw(field, lk_dt_size(dt), be);
    switch (dt) {
        case 5: return (double)(int)(unsigned int)v;
        case 6: return (double)(unsigned int)v;
        default: return __longlong_as_double((long long)v);
    }
}

// a + b for a running f64 sum a, as the CPU reference sums (`ops::voxel::add_keeping_nan`): a NaN
// sum stays as it is (so a sum is its first NaN), a NaN b is returned quieted (the device's own add
// returns its canonical NaN), and inf - inf is the host's default NaN (LK_HOST_DEFAULT_NAN, set by
// src/gpu/nvrtc.rs from the host's architecture: x86 sets the sign bit, aarch64 does not).
#ifndef LK_HOST_DEFAULT_NAN
#define LK_HOST_DEFAULT_NAN 0xfff8000000000000ull
#endif
__device__ __forceinline__ double lk_dadd_host(double a, double b) {
    if (a != a) return a;
    if (b != b) return __longlong_as_double(__double_as_longlong(b) | 0x0008000000000000ll);
    const double s = __dadd_rn(a, b);
    return s != s ? __longlong_as_double((long long)LK_HOST_DEFAULT_NAN) : s;
}

// f as f64 the way Rust's `as f64` does on the host: a NaN keeps its sign and payload with the
// quiet bit set (x86 cvtss2sd, aarch64 fcvt), where the device's conversion returns its canonical NaN.
__device__ __forceinline__ double lk_f32_to_f64_host(float f) {
    if (f != f) {
        const unsigned long long u = __float_as_uint(f);
        return __longlong_as_double((long long)(((u & 0x80000000ull) << 32) | 0x7ff8000000000000ull |
                                                ((u & 0x003fffffull) << 29)));
    }
    return (double)f;
}

// d as float32 the way Rust's `as f32` does on the host: round to nearest even; a NaN keeps its
// sign and top payload bits with the quiet bit set (x86 cvtsd2ss, aarch64 fcvt), where the
// device's conversion returns its canonical NaN.
__device__ __forceinline__ float lk_f64_to_f32_host(double d) {
    if (d != d) {
        const unsigned long long v = (unsigned long long)__double_as_longlong(d);
        return __uint_as_float((unsigned int)((v >> 32) & 0x80000000ull) | 0x7fc00000u |
                               (unsigned int)((v >> 29) & 0x003fffffull));
    }
    return __double2float_rn(d);
}

// The mean sum / count as the host divides (a NaN sum is returned as is: the device's division
// would return its canonical NaN).
__device__ __forceinline__ double lk_mean_host(double sum, unsigned int count) {
    return sum != sum ? sum : __ddiv_rn(sum, (double)count);
}

// The bits of v written as PointField datatype dt (1..=6, 8) the way the CPU reference's
// `cloud::write_value` does: integers as Rust's `v.round() as T` (half away from zero,
// saturating, NaN -> 0), FLOAT64 as is. (FLOAT32 fields are written from float32 values.)
__device__ __forceinline__ unsigned long long lk_host_bits(double v, unsigned int dt) {
    if (dt == 8u) return (unsigned long long)__double_as_longlong(v);
    const double r = round(v);
    if (r != r) return 0ull;
    double lo = 0.0, hi;
    switch (dt) {
        case 1: lo = -128.0; hi = 127.0; break;
        case 2: hi = 255.0; break;
        case 3: lo = -32768.0; hi = 32767.0; break;
        case 4: hi = 65535.0; break;
        case 5: lo = -2147483648.0; hi = 2147483647.0; break;
        default: hi = 4294967295.0; break;
    }
    return (unsigned long long)(long long)fmin(fmax(r, lo), hi);
}
