//! GPU farthest point sampling (`cuda/fps.cu`): the same selection as [`crate::ops::fps`], bit for
//! bit, on device-resident points.
//!
//! One launch samples one cloud or a batch of ragged clouds. Each cloud gets G blocks: with G = 1 a
//! block runs the whole FPS of its cloud (the batched case); with G > 1 the G blocks of a cloud are
//! co-resident (cooperative launch) and exchange their block arg-max through a double-buffered board
//! and a per-cloud arrival counter each iteration. Points (x, y, z, min distance) stay in registers
//! (up to 8 per thread, `FPS_BLOCK * 8 * G` points per cloud), else the kernel re-reads them from
//! global memory (L2) with the min distances in a global scratch array.
//!
//! On sm_90+ a cloud of up to `16 * FPS_BLOCK * 8` points instead runs as one thread-block cluster
//! (`fps_cl_PPT`): the blocks exchange their arg-max through distributed shared memory (st.async +
//! mbarrier), with no global-memory traffic per iteration. `LIDAR_FPS_NO_CLUSTER=1` turns it off;
//! `LIDAR_FPS_CLUSTER_SYNC=barrier` uses the cluster-barrier variant (`fps_clb_PPT`) instead.

use super::context::GrowBuffer;
use super::report::{BenchRow, CheckRow, Rng};
use super::{upload_and_gather, DeviceCloud, GpuContext, GpuError};
use crate::cloud::{Cloud, Header, PointCloud2, PointLayout};
use crate::ops::fps::{self as cpu_fps, BatchedFps, FpsOutput, FpsParams};
use crate::ops::{ParamError, Validate};
use cudarc::driver::{sys, CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};
use std::path::Path;

/// Device x, y, z columns: `x = data[0..len]`, `y = data[stride..stride + len]`,
/// `z = data[2 * stride..2 * stride + len]` (the layout of a [`DeviceCloud`]).
#[derive(Clone, Copy)]
pub struct DeviceXyz<'a> {
    pub data: &'a CudaSlice<f32>,
    pub stride: usize,
    pub len: usize,
}

impl<'a> DeviceXyz<'a> {
    pub fn new(data: &'a CudaSlice<f32>, stride: usize, len: usize) -> Result<Self, GpuError> {
        if len > stride || (len > 0 && data.len() < 2 * stride + len) {
            return Err(GpuError::Unsupported(format!(
                "device xyz: {len} points with stride {stride} need {} floats, buffer has {}",
                2 * stride + len,
                data.len()
            )));
        }
        Ok(Self { data, stride, len })
    }
}

impl<'a> From<&'a DeviceCloud> for DeviceXyz<'a> {
    fn from(c: &'a DeviceCloud) -> Self {
        Self { data: &c.data, stride: c.capacity, len: c.len }
    }
}

/// Uploads host x, y, z columns as one device buffer (stride = len).
pub fn upload_xyz(ctx: &GpuContext, x: &[f32], y: &[f32], z: &[f32]) -> Result<CudaSlice<f32>, GpuError> {
    let n = x.len();
    let mut all = Vec::with_capacity(3 * n.max(1));
    all.extend_from_slice(x);
    all.extend_from_slice(&y[..n]);
    all.extend_from_slice(&z[..n]);
    if all.is_empty() {
        all.push(0.0);
    }
    Ok(ctx.stream.clone_htod(&all)?)
}

pub(crate) fn param_err(e: ParamError) -> GpuError {
    GpuError::Unsupported(format!("invalid parameter: {e}"))
}

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

/// Grow-only device buffers of the FPS launches (reuse one across frames: nothing is allocated in
/// steady state). After [`fps_enqueue`], [`FpsScratch::indices`] holds the `[B, K]` result.
pub struct FpsScratch {
    md: GrowBuffer<f32>,
    board_key: GrowBuffer<u64>,
    board_xyz: GrowBuffer<f32>,
    counters: GrowBuffer<u32>,
    offsets: GrowBuffer<u32>,
    out: GrowBuffer<i32>,
    uploaded_offsets: Vec<u32>,
    out_len: usize,
    /// The last launch: kernel name, blocks per cloud.
    pub last_plan: (String, u32),
    /// Cluster plans already chosen: (clouds, longest cloud, block size) -> (PPT, cluster size).
    cluster_plans: Vec<ClusterPlan>,
}

/// (clouds, longest cloud, block size) -> (points per thread, cluster size) or None.
type ClusterPlan = ((usize, usize, usize), Option<(usize, usize)>);

impl FpsScratch {
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
        let s = &ctx.stream;
        Ok(Self {
            md: GrowBuffer::new(s, 0)?,
            board_key: GrowBuffer::new(s, 0)?,
            board_xyz: GrowBuffer::new(s, 0)?,
            counters: GrowBuffer::new(s, 0)?,
            offsets: GrowBuffer::new(s, 0)?,
            out: GrowBuffer::new(s, 0)?,
            uploaded_offsets: Vec::new(),
            out_len: 0,
            last_plan: (String::new(), 0),
            cluster_plans: Vec::new(),
        })
    }

    /// The device result of the last [`fps_enqueue`]: `[B, K]` row-major local indices, -1 padded.
    pub fn indices(&mut self, ctx: &GpuContext) -> Result<cudarc::driver::CudaView<'_, i32>, GpuError> {
        let n = self.out_len;
        Ok(self.out.ensure(&ctx.stream, n.max(1))?.slice(..n))
    }

    fn download(&mut self, ctx: &GpuContext) -> Result<Vec<i32>, GpuError> {
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
    params.validate().map_err(param_err)?;
    let nb = offsets.len().saturating_sub(1);
    let k = params.num_samples;
    let total = *offsets.last().unwrap_or(&0);
    if total > points.len {
        return Err(GpuError::Unsupported(format!(
            "offsets cover {total} points, the device cloud has {}",
            points.len
        )));
    }
    if total >= u32::MAX as usize || k > i32::MAX as usize || nb * k > (i32::MAX as usize) * 4 {
        return Err(GpuError::Unsupported("FPS: too many points or samples for 32-bit indices".into()));
    }
    let mut maxlen = 0usize;
    for (b, w) in offsets.windows(2).enumerate() {
        let l = w[1].checked_sub(w[0]).ok_or_else(|| GpuError::Unsupported("offsets must not decrease".into()))?;
        if l > 0 && params.start_index >= l {
            return Err(param_err(ParamError::new(
                "start_index",
                params.start_index,
                &format!("< number of points of every non-empty cloud (cloud {b} has {l})"),
            )));
        }
        maxlen = maxlen.max(l);
    }
    let stream = &ctx.stream;
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
    if let Some((ppt, g)) = plan {
        return launch_cluster(ctx, scratch, points, offsets, params, nb, ppt, g);
    }

    // Plan: fewest blocks per cloud with points in registers, else the memory path.
    let gmin = maxlen.div_ceil(b * 8).max(1);
    let ppt = [1usize, 2, 4, 8].into_iter().find(|p| b * p * gmin >= maxlen).unwrap_or(8);
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

    let offs: Vec<u32> = offsets.iter().map(|&o| o as u32).collect();
    let offs_dev = scratch.offsets.ensure(stream, offs.len())?;
    if scratch.uploaded_offsets != offs {
        stream.memcpy_htod(&offs, &mut offs_dev.slice_mut(..offs.len()))?;
        scratch.uploaded_offsets = offs;
    }
    let md = scratch.md.ensure(stream, if name == "fps_mem" { total.max(1) } else { 1 })?;
    let entries = nb * 2 * group;
    let board_key = scratch.board_key.ensure(stream, entries)?;
    let board_xyz = scratch.board_xyz.ensure(stream, entries * 4)?;
    let counters = scratch.counters.ensure(stream, nb)?;
    stream.memset_zeros(&mut counters.slice_mut(..nb))?;
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
    l.arg(&mut *board_key);
    l.arg(&mut *board_xyz);
    l.arg(&mut *counters);
    l.arg(&p);
    // SAFETY: argument order and types match `fps_*` in cuda/fps.cu; buffers: out >= nb * k,
    // offsets nb + 1, board nb * 2 * group entries, counters nb (zeroed), md >= total (memory path),
    // points cover `total` with `stride`. Cooperative launches guarantee the co-residency the
    // per-cloud spin barrier needs.
    unsafe {
        if cooperative {
            l.launch_cooperative(cfg)?;
        } else {
            l.launch(cfg)?;
        }
    }
    Ok(())
}

/// `LIDAR_FPS_NO_CLUSTER=1` keeps sm_90+ on the cooperative (board and counter) path.
fn clusters_disabled() -> bool {
    static D: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *D.get_or_init(|| std::env::var("LIDAR_FPS_NO_CLUSTER").is_ok_and(|v| !v.is_empty() && v != "0"))
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

/// Kernel name prefix of the cluster path: `fps_cl_` (st.async + mbarrier exchange, default) or
/// `fps_clb_` (`LIDAR_FPS_CLUSTER_SYNC=barrier`: DSMEM stores + cluster barrier, a GPU-scope fence
/// per iteration; kept for comparison).
fn cluster_prefix() -> &'static str {
    static P: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        if std::env::var("LIDAR_FPS_CLUSTER_SYNC").is_ok_and(|v| v == "barrier") {
            "fps_clb_"
        } else {
            "fps_cl_"
        }
    })
}

/// Dynamic shared memory of `fps_cl*_{ppt}`: a float4 per point of the block's chunk.
fn cluster_smem(b: usize, ppt: usize) -> usize {
    b * ppt * 16
}

/// Points per thread and cluster size of the cluster path (sm_90+), or None: the fewest waves of
/// clusters times the per-iteration cost (about PPT point updates plus a fixed exchange cost of
/// ~6 updates).
fn cluster_plan(ctx: &GpuContext, nb: usize, maxlen: usize, b: usize) -> Option<(usize, usize)> {
    if ctx.compute_capability.0 < 9 || clusters_disabled() || b == 0 || maxlen == 0 {
        return None;
    }
    let mut best: Option<(f64, usize, usize)> = None;
    for ppt in 1..=8usize {
        let g = maxlen.div_ceil(b * ppt).max(1);
        // g = 1 is no cluster (compute-sanitizer rejects DSMEM/st.async in 1-block clusters): the
        // single-block register path does it without any exchange.
        if !(2..=16).contains(&g) {
            continue;
        }
        let Ok(func) = ctx.function("fps", &format!("{}{ppt}", cluster_prefix())) else { return None };
        let smem = cluster_smem(b, ppt);
        if func
            .set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .is_err()
        {
            continue;
        }
        if g > 8
            && func
                .set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                .is_err()
        {
            continue;
        }
        let active = max_active_clusters(ctx, &func, g, b, nb, smem) as usize;
        if active == 0 {
            continue;
        }
        let waves = nb.div_ceil(active);
        // Clouds that fit one block (maxlen <= b * 8) already run without exchange on the register
        // path: take clusters for them only when they all run at once.
        if maxlen <= b * 8 && waves > 1 {
            continue;
        }
        let cost = waves as f64 * (ppt as f64 + 6.0);
        if best.is_none_or(|(c, _, _)| cost < c) {
            best = Some((cost, ppt, g));
        }
    }
    best.map(|(_, ppt, g)| (ppt, g))
}

/// The cluster path: `fps_cl_{ppt}` over `nb` clusters of `g` blocks (cuLaunchKernelEx).
#[allow(clippy::too_many_arguments)]
fn launch_cluster(
    ctx: &GpuContext,
    scratch: &mut FpsScratch,
    points: DeviceXyz<'_>,
    offsets: &[usize],
    params: &FpsParams,
    nb: usize,
    ppt: usize,
    g: usize,
) -> Result<(), GpuError> {
    let stream = &ctx.stream;
    let k = params.num_samples;
    let name = format!("{}{ppt}", cluster_prefix());
    scratch.last_plan = (name.clone(), g as u32);
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
        chunk: (ctx.profile.block_size.fps as usize * ppt) as u32,
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
    // SAFETY: argument order and types match `fps_cl_*` / `fps_clb_*` in cuda/fps.cu (xyz, offsets,
    // out, params); out >= nb * k, offsets nb + 1 entries, points cover offsets[nb] with `stride`;
    // the grid is nb clusters of g blocks (g <= 16, non-portable sizes and the dynamic shared memory
    // (b * ppt float4) enabled by cluster_plan and checked with cuOccupancyMaxActiveClusters); the
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
            blockDimX: ctx.profile.block_size.fps,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: cluster_smem(ctx.profile.block_size.fps as usize, ppt) as u32,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let r = sys::cuLaunchKernelEx(&cfg, func.cu_function(), args.as_mut_ptr(), std::ptr::null_mut());
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(GpuError::Unsupported(format!("{name}: cuLaunchKernelEx with {g}-block clusters: {r:?}")));
        }
    }
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
    params.validate().map_err(param_err)?;
    if points.len > 0 && params.start_index >= points.len {
        return Err(param_err(ParamError::new(
            "start_index",
            params.start_index,
            &format!("< number of points ({})", points.len),
        )));
    }
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
    params.validate().map_err(param_err)?;
    let mut offsets = vec![0usize];
    for &l in lengths {
        offsets.push(offsets.last().unwrap() + l);
    }
    if *offsets.last().unwrap() != points.len {
        return Err(param_err(ParamError::new(
            "lengths",
            format!("sum {}", offsets.last().unwrap()),
            &format!("sum of lengths = number of points ({})", points.len),
        )));
    }
    fps_enqueue(ctx, scratch, points, &offsets, params)?;
    Ok(BatchedFps { indices: scratch.download(ctx)?, offsets, num_samples: params.num_samples })
}

// ------------------------------------------------------------------------------------------------
// Checks and benchmarks

/// Uploads a host cloud through the PointCloud2 gather path; returns the device cloud and the
/// host cloud the CPU reference must see (the gathered one).
pub(crate) fn upload_cloud(ctx: &GpuContext, cloud: &Cloud) -> Result<(DeviceCloud, Cloud), GpuError> {
    let msg = PointCloud2::from_cloud(Header::default(), cloud, &PointLayout::packed_f32(&["x", "y", "z"]));
    let cpu = crate::cloud::gather(&msg)?;
    let dev = upload_and_gather(ctx, &msg)?;
    Ok((dev, cpu.cloud))
}

pub(crate) fn load_scan(ctx: &GpuContext, path: &Path) -> Result<(DeviceCloud, Cloud), GpuError> {
    let scan = crate::bag::sample::load_ouster_bin(path)
        .map_err(|e| GpuError::Unsupported(format!("{}: {e}", path.display())))?;
    let msg = PointCloud2::from_cloud(Header::default(), &scan, &PointLayout::ouster());
    let cpu = crate::cloud::gather(&msg)?;
    let dev = upload_and_gather(ctx, &msg)?;
    Ok((dev, cpu.cloud))
}

fn first_diff<T: PartialEq + std::fmt::Debug>(a: &[T], b: &[T]) -> String {
    if a.len() != b.len() {
        return format!("lengths differ: gpu {} cpu {}", a.len(), b.len());
    }
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("first difference at {i}: gpu {:?} cpu {:?}", a[i], b[i]),
        None => String::new(),
    }
}

fn row(operator: &str, case: &str, points: usize, same: bool, det: bool, detail: String) -> CheckRow {
    CheckRow {
        operator: operator.into(),
        case: case.into(),
        points,
        integers_identical: same,
        max_rel_err: 0.0,
        float_tolerance: 0.0,
        deterministic: det,
        detail,
    }
}

const SCAN0_PREFIX: [i32; 10] = [0, 45184, 45610, 39325, 45611, 6407, 54302, 48405, 64409, 41877];

/// GPU vs CPU FPS over the Ouster scans in `ouster_dir` and random clouds from `seed`.
pub fn check(ctx: &GpuContext, seed: u64, ouster_dir: &Path) -> Result<Vec<CheckRow>, GpuError> {
    let mut rows = Vec::new();
    let mut scratch = FpsScratch::new(ctx)?;
    let mut single = |rows: &mut Vec<CheckRow>,
                      case: &str,
                      dev: DeviceXyz<'_>,
                      host: &Cloud,
                      params: &FpsParams|
     -> Result<Vec<i32>, GpuError> {
        let cpu = cpu_fps::farthest_point_sample(host, params).map_err(param_err)?;
        let g1 = farthest_point_sample_with(ctx, &mut scratch, dev, params)?;
        let plan = scratch.last_plan.clone();
        let g2 = farthest_point_sample_with(ctx, &mut scratch, dev, params)?;
        let same = g1.indices == cpu.indices;
        let mut detail = format!("K={} start={} via {} x{}", params.num_samples, params.start_index, plan.0, plan.1);
        if !same {
            detail += &format!("; {}", first_diff(&g1.indices, &cpu.indices));
        }
        rows.push(row("fps", case, host.len(), same, g1 == g2, detail));
        Ok(g1.indices)
    };

    // Real scans through the PointCloud2 gather path.
    let mut files: Vec<_> = std::fs::read_dir(ouster_dir)
        .map_err(|e| GpuError::Unsupported(format!("{}: {e}", ouster_dir.display())))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    files.sort();
    for f in &files {
        let name = f.file_stem().unwrap().to_string_lossy().to_string();
        let (dev, host) = load_scan(ctx, f)?;
        let p = FpsParams { num_samples: 4096, start_index: 0 };
        let got = single(&mut rows, &name, (&dev).into(), &host, &p)?;
        if name == "os1-128_scan0" {
            let ok = got.len() >= 10 && got[..10] == SCAN0_PREFIX;
            rows.push(row(
                "fps",
                "os1-128_scan0 published prefix",
                host.len(),
                ok,
                true,
                format!("{:?}", &got[..10.min(got.len())]),
            ));
        }
    }

    // Random clouds.
    let mut rng = Rng::new(seed);
    let cases: Vec<(String, Cloud, FpsParams)> = vec![
        ("empty".into(), Cloud::from_xyz(vec![], vec![], vec![]), FpsParams { num_samples: 5, start_index: 0 }),
        ("one point, K=3".into(), rng.cloud(1, 10.0), FpsParams { num_samples: 3, start_index: 0 }),
        ("300 random, K=300".into(), rng.cloud(300, 10.0), FpsParams { num_samples: 300, start_index: 17 }),
        ("300 random, K=400 (-1 pad)".into(), rng.cloud(300, 10.0), FpsParams { num_samples: 400, start_index: 299 }),
        (
            "all identical 1000, K=1200".into(),
            Cloud::from_points(&vec![[1.5f32, -2.0, 0.25]; 1000]),
            FpsParams { num_samples: 1200, start_index: 3 },
        ),
        ("lattice dups 20000, K=2048".into(), rng.lattice(20000, 12), FpsParams { num_samples: 2048, start_index: 5 }),
        ("100k random, K=1024".into(), rng.cloud(100_000, 50.0), FpsParams { num_samples: 1024, start_index: 12345 }),
        ("1.2M random, K=48".into(), rng.cloud(1_200_000, 80.0), FpsParams { num_samples: 48, start_index: 7 }),
    ];
    for (case, cloud, p) in &cases {
        let (dev, host) = upload_cloud(ctx, cloud)?;
        single(&mut rows, case, (&dev).into(), &host, p)?;
    }

    // Batched ragged clouds (one device cloud, clouds back to back).
    let mut batched = |case: &str, clouds: &[Cloud], p: &FpsParams| -> Result<(), GpuError> {
        let lengths: Vec<usize> = clouds.iter().map(|c| c.len()).collect();
        let mut x = Vec::new();
        let mut y = Vec::new();
        let mut z = Vec::new();
        for c in clouds {
            x.extend_from_slice(c.x());
            y.extend_from_slice(c.y());
            z.extend_from_slice(c.z());
        }
        let all = Cloud::from_xyz(x, y, z);
        let (dev, host) = upload_cloud(ctx, &all)?;
        let cpu = cpu_fps::farthest_point_sample_batched(&host, &lengths, p).map_err(param_err)?;
        let g1 = farthest_point_sample_batched_with(ctx, &mut scratch, (&dev).into(), &lengths, p)?;
        let plan = scratch.last_plan.clone();
        let g2 = farthest_point_sample_batched_with(ctx, &mut scratch, (&dev).into(), &lengths, p)?;
        let same = g1 == cpu;
        let mut detail =
            format!("B={} lengths {:?} K={} via {} x{}", lengths.len(), lengths, p.num_samples, plan.0, plan.1);
        if !same {
            detail += &format!("; {}", first_diff(&g1.indices, &cpu.indices));
        }
        rows.push(row("fps_batched", case, host.len(), same, g1 == g2, detail));
        Ok(())
    };
    let ragged: Vec<Cloud> = vec![
        rng.cloud(5000, 20.0),
        Cloud::from_xyz(vec![], vec![], vec![]),
        rng.cloud(1, 1.0),
        rng.lattice(16384, 10),
        rng.cloud(300, 5.0),
        rng.cloud(20000, 30.0),
    ];
    batched("ragged 6 clouds (one empty), K=512", &ragged, &FpsParams { num_samples: 512, start_index: 0 })?;
    if let Some(f) = files.iter().find(|f| f.ends_with("os1-128_scan0.bin")) {
        let scan = crate::bag::sample::load_ouster_bin(f).map_err(|e| GpuError::Unsupported(e.to_string()))?;
        let clouds: Vec<Cloud> = (0..8)
            .map(|b| {
                let idx: Vec<usize> = (0..16384).map(|j| (j * 6 + b) % scan.len()).collect();
                let s = scan.select(&idx);
                Cloud::from_xyz(s.x().to_vec(), s.y().to_vec(), s.z().to_vec())
            })
            .collect();
        batched("scan0 8 x 16384, K=1024", &clouds, &FpsParams { num_samples: 1024, start_index: 0 })?;
    }
    Ok(rows)
}

/// A few small FPS cases (single and batched, every path the planner picks for them) for
/// compute-sanitizer runs.
pub fn check_quick(ctx: &GpuContext, seed: u64) -> Result<Vec<CheckRow>, GpuError> {
    let mut rows = Vec::new();
    let mut scratch = FpsScratch::new(ctx)?;
    let mut rng = Rng::new(seed);
    for (case, cloud, p) in [
        ("300 random, K=40", rng.cloud(300, 10.0), FpsParams { num_samples: 40, start_index: 17 }),
        ("4000 random, K=64", rng.cloud(4000, 20.0), FpsParams { num_samples: 64, start_index: 123 }),
        ("lattice 20000, K=64", rng.lattice(20000, 12), FpsParams { num_samples: 64, start_index: 5 }),
    ] {
        let (dev, host) = upload_cloud(ctx, &cloud)?;
        let cpu = cpu_fps::farthest_point_sample(&host, &p).map_err(param_err)?;
        let g = farthest_point_sample_with(ctx, &mut scratch, (&dev).into(), &p)?;
        let same = g.indices == cpu.indices;
        let detail =
            format!("via {} x{} {}", scratch.last_plan.0, scratch.last_plan.1, first_diff(&g.indices, &cpu.indices));
        rows.push(row("fps", case, host.len(), same, true, detail));
    }
    let clouds =
        [rng.cloud(5000, 20.0), Cloud::from_xyz(vec![], vec![], vec![]), rng.cloud(1, 1.0), rng.cloud(17000, 30.0)];
    let lengths: Vec<usize> = clouds.iter().map(|c| c.len()).collect();
    let (mut x, mut y, mut z) = (Vec::new(), Vec::new(), Vec::new());
    for c in &clouds {
        x.extend_from_slice(c.x());
        y.extend_from_slice(c.y());
        z.extend_from_slice(c.z());
    }
    let (dev, host) = upload_cloud(ctx, &Cloud::from_xyz(x, y, z))?;
    let p = FpsParams { num_samples: 64, start_index: 0 };
    let cpu = cpu_fps::farthest_point_sample_batched(&host, &lengths, &p).map_err(param_err)?;
    let g = farthest_point_sample_batched_with(ctx, &mut scratch, (&dev).into(), &lengths, &p)?;
    let detail =
        format!("via {} x{} {}", scratch.last_plan.0, scratch.last_plan.1, first_diff(&g.indices, &cpu.indices));
    rows.push(row("fps_batched", "ragged 4 clouds, K=64", host.len(), g == cpu, true, detail));
    Ok(rows)
}

/// Reads `name.bin` of a workloads directory (raw little-endian) with its shape from manifest.json.
pub(crate) fn read_workload(dir: &Path, name: &str) -> Result<(Vec<u8>, Vec<usize>), GpuError> {
    let man = std::fs::read_to_string(dir.join("manifest.json"))
        .map_err(|e| GpuError::Unsupported(format!("manifest.json: {e}")))?;
    let key = format!("\"{name}\"");
    let at = man.find(&key).ok_or_else(|| GpuError::Unsupported(format!("{name} not in manifest.json")))?;
    let rest = &man[at..];
    let s = rest.find("\"shape\"").ok_or_else(|| GpuError::Unsupported(format!("{name}: no shape")))?;
    let open = rest[s..].find('[').unwrap() + s;
    let close = rest[open..].find(']').unwrap() + open;
    let shape: Vec<usize> = rest[open + 1..close].split(',').filter_map(|t| t.trim().parse().ok()).collect();
    let bytes = std::fs::read(dir.join(format!("{name}.bin")))
        .map_err(|e| GpuError::Unsupported(format!("{name}.bin: {e}")))?;
    Ok((bytes, shape))
}

/// An `[N, 3]` float32 workload as x, y, z columns.
pub(crate) fn workload_xyz(dir: &Path, name: &str) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>), GpuError> {
    let (bytes, _shape) = read_workload(dir, name)?;
    let v: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let n = v.len() / 3;
    Ok((
        (0..n).map(|i| v[3 * i]).collect(),
        (0..n).map(|i| v[3 * i + 1]).collect(),
        (0..n).map(|i| v[3 * i + 2]).collect(),
    ))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// GPU time (CUDA events) of `f`, median of `runs` after `warm` warm-up runs.
pub(crate) fn time_ms(
    ctx: &GpuContext,
    warm: usize,
    runs: usize,
    mut f: impl FnMut() -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    for _ in 0..warm {
        f()?;
    }
    ctx.synchronize()?;
    let mut t = ctx.stage_timer();
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs {
        t.start()?;
        f()?;
        t.stage("op")?;
        v.push(t.finish()?[0].1 as f64);
    }
    Ok(median(v))
}

/// FPS benchmarks on the fixed workloads (W2a, W2b, W2c).
pub fn bench(ctx: &GpuContext, workloads: &Path) -> Result<Vec<BenchRow>, GpuError> {
    let mut rows = Vec::new();
    let mut scratch = FpsScratch::new(ctx)?;
    let mut one = |name: &str,
                   wl: &str,
                   clouds: usize,
                   k: usize,
                   runs: usize,
                   target: Option<f64>,
                   peer: Option<f64>|
     -> Result<(), GpuError> {
        let (x, y, z) = workload_xyz(workloads, wl)?;
        let n = x.len();
        let buf = upload_xyz(ctx, &x, &y, &z)?;
        let pts = DeviceXyz::new(&buf, n, n)?;
        let per = n / clouds;
        let offsets: Vec<usize> = (0..=clouds).map(|b| b * per).collect();
        let p = FpsParams { num_samples: k, start_index: 0 };
        let ms = time_ms(ctx, 2, runs, || fps_enqueue(ctx, &mut scratch, pts, &offsets, &p))?;
        rows.push(BenchRow {
            operator: "fps".into(),
            workload: name.into(),
            points: n,
            median_ms: ms,
            runs,
            min_bytes: (n * 12 + clouds * k * 4) as u64,
            target_ms: target,
            peer_ms: peer,
            note: format!("{} clouds, K={k}, {} x{} blocks/cloud", clouds, scratch.last_plan.0, scratch.last_plan.1),
        });
        Ok(())
    };
    one("W2a scan0 107,647 -> 4096", "scan0_xyz", 1, 4096, 20, Some(3.0), Some(291.0))?;
    one("W2b 8 x 16384 -> 1024", "w2b_xyz", 8, 1024, 20, Some(1.0), Some(11.5))?;
    one("W2c 1M -> 16384", "w2c_xyz", 1, 16384, 5, None, Some(10526.0))?;
    Ok(rows)
}
