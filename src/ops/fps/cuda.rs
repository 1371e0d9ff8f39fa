//! GPU farthest point sampling (`cuda/fps.cu`): the same selection as [`super`] (the CPU
//! reference), bit for bit, on device-resident points.
//!
//! One launch samples one cloud or a batch of ragged clouds. Each cloud gets G blocks: with G = 1 a
//! block runs the whole FPS of its cloud (the batched case); with G > 1 the G blocks of a cloud are
//! co-resident (cooperative launch) and exchange their block arg-max each iteration through one
//! 16-byte slot per step: an atomic-max key and the count of blocks that have arrived. Points (x,
//! y, z, min distance) stay in registers (up to 8 per thread, 16 in blocks of at most 512
//! threads), else the kernel re-reads them from global memory (L2) with the min distances in a
//! global scratch array.
//!
//! On sm_90+ a cloud of up to `16 * 512 * 16` points instead runs as one thread-block cluster
//! (`fps_cl_BLOCK_PPT`): the blocks exchange their arg-max through distributed shared memory
//! (st.async + mbarrier), with no global-memory traffic per iteration. The cluster kernels choose
//! their own block size (256 or 512 threads, see [`cluster_plan`]); the profile's
//! `block_size.fps` sets the other paths'.

use super::{BatchedFps, FpsOutput, FpsParams};
use crate::gpu::{DeviceXyz, GpuContext, GpuError, GrowBuffer, PinnedWord};
use crate::ops::{ParamError, Validate};
use cudarc::driver::{
    result as drv, sys, CudaEvent, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;

/// Must match `struct FpsKernelParams` in cuda/fps.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct FpsKernelParams {
    stride: u64,
    num_clouds: u32,
    group: u32,
    k: u32,
    start: u32,
    chunk: u32,
    pad_: u32,
}
// SAFETY: repr(C), plain integers, layout identical to the CUDA struct (8 + 6 * 4 bytes).
unsafe impl DeviceRepr for FpsKernelParams {}
// Same size as the CUDA struct (`static_assert` in cuda/fps.cu).
const _: () = assert!(std::mem::size_of::<FpsKernelParams>() == 32);

/// Exchange slots per cloud of the grid path, each a (key, arrival count) pair of u64; NVRTC gets
/// it as `FPS_SLOTS` (cuda/fps.cu).
pub const EXCHANGE_SLOTS: usize = 3;

/// Grow-only device buffers of the FPS launches (reuse one across frames: nothing is allocated in
/// steady state). After [`fps_enqueue`], [`FpsScratch::indices`] holds the `[B, K]` result.
pub struct FpsScratch {
    md: GrowBuffer<f32>,
    /// [`EXCHANGE_SLOTS`] (key, arrival count) slots per cloud, zeroed per launch.
    exchange: GrowBuffer<u64>,
    offsets: GrowBuffer<u32>,
    out: GrowBuffer<i32>,
    uploaded_offsets: Vec<u32>,
    out_len: usize,
    /// The last launch: kernel name, blocks per cloud.
    pub last_plan: (String, u32),
    /// Cluster plans already chosen: (clouds, longest cloud, profile block size) -> plan.
    cluster_plans: Vec<((usize, usize, usize), Option<ClusterShape>)>,
    /// Recorded behind the last launch.
    done: CudaEvent,
    /// Recorded behind the clearing of a single-cloud launch's indices, which `poll` waits for;
    /// `indices_cleared`: the last launch's were cleared (a batch's are not).
    cleared: CudaEvent,
    indices_cleared: bool,
    /// [`FpsScratch::wait_written`] copies one index at a time on `poll` into `probe` while FPS
    /// runs (the kernels do not publish their progress: any extra work in their loop slowed every
    /// step, see BENCHMARKS.md 2026-12-03 evening).
    poll: Arc<CudaStream>,
    probe: PinnedWord<i32>,
}

/// One launch shape of the cluster path: `fps_cl_{block}_{ppt}` in clusters of `group` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterShape {
    pub block: usize,
    pub ppt: usize,
    pub group: usize,
}

/// Block sizes and points per thread of the cluster kernels (`FPS_CL_PPTS` in cuda/fps.cu).
pub const CLUSTER_BLOCKS: [usize; 2] = [256, 512];
pub const CLUSTER_PPT: [usize; 9] = [1, 2, 4, 6, 8, 10, 12, 14, 16];

impl FpsScratch {
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
        let s = &ctx.stream;
        Ok(Self {
            md: GrowBuffer::new(s, 0)?,
            exchange: GrowBuffer::new(s, 0)?,
            offsets: GrowBuffer::new(s, 0)?,
            out: GrowBuffer::new(s, 0)?,
            uploaded_offsets: Vec::new(),
            out_len: 0,
            last_plan: (String::new(), 0),
            cluster_plans: Vec::new(),
            done: ctx.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
            cleared: ctx.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
            indices_cleared: false,
            poll: ctx.ctx.new_stream()?,
            probe: PinnedWord::new(&ctx.ctx)?,
        })
    }

    /// Waits until the last launch (of a single cloud) has written its first `n` indices, or has
    /// finished; returns how many it has written, all of them once it has finished. Until it has
    /// finished, the indices before the n-th may still be on their way: a kernel that reads them
    /// waits while one is -1 (the launch cleared them to -1 first). Polls: FPS writes an index
    /// every microsecond or so, one probe copy takes about ten, and the waiting thread has
    /// nothing else to do.
    pub fn wait_written(&mut self, ctx: &GpuContext, n: usize) -> Result<usize, GpuError> {
        let Some(last) = n.min(self.out_len).checked_sub(1) else { return Ok(0) };
        if !self.indices_cleared {
            // A batch: a stale index would pass for a written one; wait for the end.
            self.done.synchronize()?;
            return Ok(self.out_len);
        }
        let addr = {
            let v = self.indices(ctx)?;
            // No event: reading an index while FPS writes the others is the point.
            let (ptr, _record) = v.device_ptr(&ctx.stream);
            ptr + 4 * last as u64
        };
        loop {
            if self.done.try_is_complete()? {
                return Ok(self.out_len);
            }
            if self.probe.fetch(addr, &self.poll)? >= 0 {
                return Ok(last + 1);
            }
        }
    }

    /// Before a launch of `nb` clouds of `k` samples: a single cloud's indices are set to -1 (in
    /// `stream` order) and `poll` waits for that, so an index [`Self::wait_written`] or a reader
    /// sees is this launch's once it is not -1.
    fn clear_indices(&mut self, stream: &Arc<CudaStream>, nb: usize, k: usize) -> Result<(), GpuError> {
        self.indices_cleared = nb == 1;
        if nb == 1 {
            let out = self.out.ensure(stream, k.max(1))?;
            let (ptr, _write) = out.device_ptr_mut(stream);
            // SAFETY: `out` holds at least k indices.
            unsafe { drv::memset_d8_async(ptr, 0xff, 4 * k, stream.cu_stream()) }?;
            self.cleared.record(stream)?;
            self.poll.wait(&self.cleared)?;
        }
        Ok(())
    }

    /// The device result of the last [`fps_enqueue`]: `[B, K]` row-major local indices, -1 padded.
    pub fn indices(&mut self, ctx: &GpuContext) -> Result<cudarc::driver::CudaView<'_, i32>, GpuError> {
        let n = self.out_len;
        Ok(self.out.ensure(&ctx.stream, n.max(1))?.slice(..n))
    }

    pub fn download(&mut self, ctx: &GpuContext) -> Result<Vec<i32>, GpuError> {
        let n = self.out_len;
        if n == 0 {
            return Ok(Vec::new());
        }
        let v = ctx.stream.clone_dtoh(&self.out.ensure(&ctx.stream, n)?.slice(..n))?;
        ctx.stream.synchronize()?;
        Ok(v)
    }
}

/// Enqueues FPS of the clouds `offsets[b] .. offsets[b + 1]` of `points` (validated lengths; no
/// host synchronisation). The result stays in `scratch` (see [`FpsScratch::indices`]).
pub fn fps_enqueue(
    ctx: &GpuContext,
    scratch: &mut FpsScratch,
    points: DeviceXyz<'_>,
    offsets: &[usize],
    params: &FpsParams,
) -> Result<(), GpuError> {
    params.validate()?;
    let nb = offsets.len().saturating_sub(1);
    let k = params.num_samples;
    let total = *offsets.last().unwrap_or(&0);
    if total > points.len {
        return Err(GpuError::OffsetsBeyondCloud { covered: total, points: points.len });
    }
    if total >= u32::MAX as usize {
        return Err(GpuError::TooLarge {
            what: "FPS points (32-bit indices)",
            value: total as u64,
            limit: u32::MAX as u64 - 1,
        });
    }
    if k > i32::MAX as usize {
        return Err(GpuError::TooLarge {
            what: "FPS num_samples (32-bit indices)",
            value: k as u64,
            limit: i32::MAX as u64,
        });
    }
    if nb * k > (i32::MAX as usize) * 4 {
        return Err(GpuError::TooLarge {
            what: "FPS samples of all clouds (clouds x num_samples, 32-bit indices)",
            value: (nb * k) as u64,
            limit: (i32::MAX as u64) * 4,
        });
    }
    let mut maxlen = 0usize;
    for (b, w) in offsets.windows(2).enumerate() {
        let l = w[1].checked_sub(w[0]).ok_or(GpuError::OffsetsDecrease { cloud: b, start: w[0], end: w[1] })?;
        if l > 0 && params.start_index >= l {
            return Err(ParamError::new(
                "start_index",
                params.start_index,
                &format!("must be less than the number of points of every non-empty cloud (cloud {b} has {l})"),
            )
            .into());
        }
        maxlen = maxlen.max(l);
    }
    scratch.out_len = nb * k;
    if nb == 0 {
        return Ok(());
    }

    let b = ctx.profile.block_size.fps as usize;
    // sm_90+: one thread-block cluster per cloud, when the clouds fit (<= 16 blocks of b * 8 points).
    let key = (nb, maxlen, b);
    let plan = match scratch.cluster_plans.iter().find(|(k, _)| *k == key) {
        Some((_, p)) => *p,
        None => {
            let p = cluster_plan(ctx, nb, maxlen, b);
            scratch.cluster_plans.push((key, p));
            p
        }
    };
    match plan {
        Some(shape) => launch_cluster(ctx, scratch, points, offsets, params, shape),
        None => launch_grid(ctx, scratch, points, offsets, params),
    }
}

/// The register or memory path, on every device (on sm_90+ for what the cluster path does not
/// take): the fewest blocks per cloud that hold the points in registers, else the memory path.
/// [`fps_enqueue`] calls it after validating; check-gpu also calls it on sm_90+, where the planner
/// would take clusters for the clouds that pre-sm_90 GPUs run here.
pub fn launch_grid(
    ctx: &GpuContext,
    scratch: &mut FpsScratch,
    points: DeviceXyz<'_>,
    offsets: &[usize],
    params: &FpsParams,
) -> Result<(), GpuError> {
    let stream = &ctx.stream;
    let nb = offsets.len().saturating_sub(1);
    let k = params.num_samples;
    let total = *offsets.last().unwrap_or(&0);
    let maxlen = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let b = ctx.profile.block_size.fps as usize;
    scratch.out_len = nb * k;
    let max_ppt = register_max_ppt(b);
    let gmin = maxlen.div_ceil(b * max_ppt).max(1);
    let ppt = [1usize, 2, 4, 8, 16].into_iter().find(|p| b * p * gmin >= maxlen).unwrap_or(max_ppt);
    let mut name = format!("fps_reg_{ppt}");
    let mut group = gmin;
    let mut chunk = b * ppt;
    if gmin > 1 {
        let func = ctx.function("fps", &name)?;
        let per_sm = func.occupancy_max_active_blocks_per_multiprocessor(b as u32, 0, None)? as usize;
        let resident = per_sm * ctx.sm_count as usize;
        if nb * gmin > resident {
            let fm = ctx.function("fps", "fps_mem")?;
            let per_sm = fm.occupancy_max_active_blocks_per_multiprocessor(b as u32, 0, None)? as usize;
            let resident = (per_sm * ctx.sm_count as usize).max(1);
            name = "fps_mem".into();
            group = (resident / nb).clamp(1, gmin);
            chunk = maxlen.div_ceil(group);
        }
    }
    let cooperative = group > 1;
    scratch.last_plan = (name.clone(), group as u32);

    scratch.clear_indices(stream, nb, k)?;
    let offs: Vec<u32> = offsets.iter().map(|&o| o as u32).collect();
    let offs_dev = scratch.offsets.ensure(stream, offs.len())?;
    if scratch.uploaded_offsets != offs {
        stream.memcpy_htod(&offs, &mut offs_dev.slice_mut(..offs.len()))?;
        scratch.uploaded_offsets = offs;
    }
    let md = scratch.md.ensure(stream, if name == "fps_mem" { total.max(1) } else { 1 })?;
    let exchange_len = nb * EXCHANGE_SLOTS * 2;
    let exchange = scratch.exchange.ensure(stream, exchange_len)?;
    stream.memset_zeros(&mut exchange.slice_mut(..exchange_len))?;
    let out = scratch.out.ensure(stream, (nb * k).max(1))?;
    let p = FpsKernelParams {
        stride: points.stride as u64,
        num_clouds: nb as u32,
        group: group as u32,
        k: k as u32,
        start: params.start_index as u32,
        chunk: chunk as u32,
        pad_: 0,
    };
    let func = ctx.function("fps", &name)?;
    let cfg = LaunchConfig { grid_dim: ((nb * group) as u32, 1, 1), block_dim: (b as u32, 1, 1), shared_mem_bytes: 0 };
    let mut l = stream.launch_builder(&func);
    l.arg(points.data);
    l.arg(&*offs_dev);
    l.arg(&mut *out);
    l.arg(&mut *md);
    l.arg(&mut *exchange);
    l.arg(&p);
    // SAFETY: argument order and types match `fps_*` in cuda/fps.cu; buffers: out >= nb * k,
    // offsets nb + 1, exchange nb * EXCHANGE_SLOTS * 2 (zeroed), md >= total (memory path),
    // points cover `total` with `stride`. Cooperative launches guarantee the co-residency the
    // per-cloud spin wait needs.
    unsafe {
        if cooperative {
            l.launch_cooperative(cfg)?;
        } else {
            l.launch(cfg)?;
        }
    }
    scratch.done.record(stream)?;
    Ok(())
}

/// Points per thread the register path can hold with `b` threads per block: `fps_reg_16` exists
/// for blocks of at most 512 threads only (cuda/fps.cu).
fn register_max_ppt(b: usize) -> usize {
    if b <= 512 {
        16
    } else {
        8
    }
}

/// Clusters of `g` blocks of `b` threads of `func` that can be resident at once (0 when none or
/// on error).
fn max_active_clusters(
    ctx: &GpuContext,
    func: &cudarc::driver::CudaFunction,
    g: usize,
    b: usize,
    nb: usize,
    smem: usize,
) -> u32 {
    // SAFETY: a plain-data attribute and config; the driver only reads them.
    unsafe {
        let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attr.value.clusterDim.x = g as u32;
        attr.value.clusterDim.y = 1;
        attr.value.clusterDim.z = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: (g * nb.max(1)) as u32,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: b as u32,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem as u32,
            hStream: ctx.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut n: std::ffi::c_int = 0;
        match sys::cuOccupancyMaxActiveClusters(&mut n, func.cu_function(), &cfg) {
            sys::CUresult::CUDA_SUCCESS => n.max(0) as u32,
            _ => 0,
        }
    }
}

/// Dynamic shared memory of a cluster kernel: a float4 per point the block holds.
fn cluster_smem(shape: ClusterShape) -> usize {
    shape.block * shape.ppt * 16
}

/// Modelled time of one FPS step of the cluster path, in ns, for `block` threads per block, `ppt`
/// points per thread and `group` blocks per cluster: a least-squares fit of the step times
/// measured on the H200 over nine shapes (BENCHMARKS.md, 2026-12-02 "FPS cluster shapes"; within
/// 7 % of every one). A step is mostly latency (block reduce, exchange, cluster reduce), which grows
/// with the warps per block and the cluster size; the points per thread add the update's chain.
fn cluster_step_ns(block: usize, ppt: usize, group: usize) -> f64 {
    97.0 + 18.3 * (block / 32) as f64 + 25.3 * ppt as f64 + 24.9 * group as f64
}

/// The cluster shape (sm_90+) of the lowest modelled time for `nb` clouds of at most `maxlen`
/// points, or None (then the register or memory path runs). `b` is the profile's block size,
/// that of the single-block register path.
fn cluster_plan(ctx: &GpuContext, nb: usize, maxlen: usize, b: usize) -> Option<ClusterShape> {
    if ctx.compute_capability.0 < 9 || b == 0 || maxlen == 0 {
        return None;
    }
    let mut best: Option<(f64, ClusterShape)> = None;
    for block in CLUSTER_BLOCKS {
        for ppt in CLUSTER_PPT {
            let group = maxlen.div_ceil(block * ppt).max(1);
            // g = 1 is no cluster (compute-sanitizer rejects DSMEM/st.async in 1-block clusters): the
            // single-block register path does it without any exchange.
            if !(2..=16).contains(&group) {
                continue;
            }
            let shape = ClusterShape { block, ppt, group };
            let Ok(active) = cluster_capacity(ctx, shape, nb) else { return None };
            if active == 0 {
                continue;
            }
            let waves = nb.div_ceil(active);
            // Clouds that fit one block already run without exchange on the register path: take
            // clusters for them only when they all run at once.
            if maxlen <= b * register_max_ppt(b) && waves > 1 {
                continue;
            }
            let cost = waves as f64 * cluster_step_ns(block, ppt, group);
            if best.is_none_or(|(c, _)| cost < c) {
                best = Some((cost, shape));
            }
        }
    }
    best.map(|(_, shape)| shape)
}

/// Clusters of `shape` that can be resident at once (0 when the shape cannot launch). Sets the
/// kernel's dynamic shared memory and non-portable cluster size attributes it needs.
pub fn cluster_capacity(ctx: &GpuContext, shape: ClusterShape, nb: usize) -> Result<usize, GpuError> {
    let func = ctx.function("fps", &cluster_kernel(shape))?;
    let smem = cluster_smem(shape);
    if func
        .set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
        .is_err()
    {
        return Ok(0);
    }
    if shape.group > 8
        && func
            .set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
            .is_err()
    {
        return Ok(0);
    }
    Ok(max_active_clusters(ctx, &func, shape.group, shape.block, nb, smem) as usize)
}

fn cluster_kernel(shape: ClusterShape) -> String {
    format!("fps_cl_{}_{}", shape.block, shape.ppt)
}

/// The cluster path: `nb` clusters of `shape` (cuLaunchKernelEx). The planner calls it with the
/// shape it chose; check-gpu also calls it with every shape, to compare each kernel with the CPU.
pub fn launch_cluster(
    ctx: &GpuContext,
    scratch: &mut FpsScratch,
    points: DeviceXyz<'_>,
    offsets: &[usize],
    params: &FpsParams,
    shape: ClusterShape,
) -> Result<(), GpuError> {
    let stream = &ctx.stream;
    let nb = offsets.len().saturating_sub(1);
    let k = params.num_samples;
    let name = cluster_kernel(shape);
    let g = shape.group;
    scratch.last_plan = (name.clone(), g as u32);
    scratch.out_len = nb * k;
    scratch.clear_indices(stream, nb, k)?;
    let offs: Vec<u32> = offsets.iter().map(|&o| o as u32).collect();
    let offs_dev = scratch.offsets.ensure(stream, offs.len())?;
    if scratch.uploaded_offsets != offs {
        stream.memcpy_htod(&offs, &mut offs_dev.slice_mut(..offs.len()))?;
        scratch.uploaded_offsets = offs;
    }
    let out = scratch.out.ensure(stream, (nb * k).max(1))?;
    let p = FpsKernelParams {
        stride: points.stride as u64,
        num_clouds: nb as u32,
        group: g as u32,
        k: k as u32,
        start: params.start_index as u32,
        chunk: (shape.block * shape.ppt) as u32,
        pad_: 0,
    };
    let func = ctx.function("fps", &name)?;
    let (xyz_ptr, _gx) = points.data.device_ptr(stream);
    let (off_ptr, _go) = offs_dev.device_ptr(stream);
    let (out_ptr, _gu) = out.device_ptr_mut(stream);
    let mut args: [*mut std::ffi::c_void; 4] = [
        &xyz_ptr as *const sys::CUdeviceptr as *mut std::ffi::c_void,
        &off_ptr as *const sys::CUdeviceptr as *mut std::ffi::c_void,
        &out_ptr as *const sys::CUdeviceptr as *mut std::ffi::c_void,
        &p as *const FpsKernelParams as *mut std::ffi::c_void,
    ];
    // SAFETY: argument order and types match `fps_cl_*` in cuda/fps.cu (xyz, offsets,
    // out, params); out >= nb * k, offsets nb + 1 entries, points cover offsets[nb] with `stride`;
    // the grid is nb clusters of g blocks (g <= 16, non-portable sizes and the dynamic shared memory
    // (block * ppt float4) enabled by cluster_capacity, which the caller ran for this shape); the
    // argument values outlive the call (the driver copies them).
    unsafe {
        let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attr.value.clusterDim.x = g as u32;
        attr.value.clusterDim.y = 1;
        attr.value.clusterDim.z = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: (nb * g) as u32,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: shape.block as u32,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: cluster_smem(shape) as u32,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let r = sys::cuLaunchKernelEx(&cfg, func.cu_function(), args.as_mut_ptr(), std::ptr::null_mut());
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(GpuError::ClusterLaunch { kernel: name, cluster: g, source: cudarc::driver::DriverError(r) });
        }
    }
    scratch.done.record(stream)?;
    Ok(())
}

/// [`crate::ops::fps::farthest_point_sample`] on the device.
pub fn farthest_point_sample(
    ctx: &GpuContext,
    points: DeviceXyz<'_>,
    params: &FpsParams,
) -> Result<FpsOutput, GpuError> {
    let mut s = FpsScratch::new(ctx)?;
    farthest_point_sample_with(ctx, &mut s, points, params)
}

pub fn farthest_point_sample_with(
    ctx: &GpuContext,
    scratch: &mut FpsScratch,
    points: DeviceXyz<'_>,
    params: &FpsParams,
) -> Result<FpsOutput, GpuError> {
    // The CPU reference's own checks (same ParamError on both backends).
    params.check_cloud(points.len)?;
    fps_enqueue(ctx, scratch, points, &[0, points.len], params)?;
    Ok(FpsOutput { indices: scratch.download(ctx)? })
}

/// [`crate::ops::fps::farthest_point_sample_batched`] on the device: cloud b is points
/// `offsets[b] .. offsets[b] + lengths[b]` of `points`.
pub fn farthest_point_sample_batched(
    ctx: &GpuContext,
    points: DeviceXyz<'_>,
    lengths: &[usize],
    params: &FpsParams,
) -> Result<BatchedFps, GpuError> {
    let mut s = FpsScratch::new(ctx)?;
    farthest_point_sample_batched_with(ctx, &mut s, points, lengths, params)
}

pub fn farthest_point_sample_batched_with(
    ctx: &GpuContext,
    scratch: &mut FpsScratch,
    points: DeviceXyz<'_>,
    lengths: &[usize],
    params: &FpsParams,
) -> Result<BatchedFps, GpuError> {
    params.validate()?;
    let mut offsets = vec![0usize];
    for &l in lengths {
        let next = offsets.last().unwrap().checked_add(l);
        offsets.push(next.ok_or_else(|| ParamError::new("lengths", "overflow", "sum of lengths = number of points"))?);
    }
    if *offsets.last().unwrap() != points.len {
        return Err(ParamError::new(
            "lengths",
            format!("sum {}", offsets.last().unwrap()),
            &format!("sum of lengths = number of points ({})", points.len),
        )
        .into());
    }
    if let Some(&l) = lengths.iter().find(|&&l| l > crate::ops::neighbors::MAX_POINTS) {
        return Err(ParamError::new("lengths", l, "each at most 2147483647 (2^31 - 1) points, indices are i32").into());
    }
    fps_enqueue(ctx, scratch, points, &offsets, params)?;
    Ok(BatchedFps { indices: scratch.download(ctx)?, offsets, num_samples: params.num_samples })
}
