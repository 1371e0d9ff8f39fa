//! The CUDA backend: the family launchers (`ops::*::cuda`) over one context, with every scratch
//! buffer kept across frames. The gathered cloud stays on the device; FPS indices feed the query
//! selection on the device; only what is published is copied back, the large outputs straight into
//! page-locked message bytes (`gpu::output_pool`). Voxelization and the downsample run on streams
//! of their own, beside FPS and the neighbour search on the context's stream.
//!
//! Parameters are checked with the CPU reference's own checks before anything is launched, so a
//! bad value is the same [`ParamError`](crate::ops::ParamError) on both backends.

use super::{Backend, OpError};
use crate::cloud::{CloudMessage, CloudView, Header, SourceIndex};
use crate::gpu::{
    select_backend, upload_and_gather, BackendKind, DeviceCloud, DeviceXyz, FaultOp, FaultPlan, GpuContext, GpuError,
    GrowBuffer, PooledSlice, ProfileChoice,
};
use crate::ops::detect::cuda::DeviceDetector;
use crate::ops::detect::{keep_boxes, DetectParams, Detections};
use crate::ops::fps::cuda::{fps_enqueue, FpsScratch};
use crate::ops::fps::FpsParams;
use crate::ops::neighbors::cuda::{ball_query_enqueue, knn_enqueue, NeighborsScratch};
use crate::ops::neighbors::{neighborhoods_message_in, BallQueryParams, KnnParams, PublishedNeighbors};
use crate::ops::nms::cuda::DeviceNms;
use crate::ops::nms::{validate_input, Box3d, NmsOutput, NmsParams};
use crate::ops::voxel::cuda::GpuVoxelizer;
use crate::ops::voxel::{
    DynamicVoxels, FeaturesLayout, HardVoxelParams, HardVoxels, PillarFeatures, PublishedDownsample,
    PublishedHardVoxels, VoxelGrid,
};
use crate::ops::Validate;
use cudarc::driver::{result as drv, CudaFunction, DevicePtr, LaunchConfig, PushKernelArg};

/// CUDA state kept across frames.
pub struct CudaBackend {
    pub ctx: GpuContext,
    voxelizer: GpuVoxelizer,
    downsampler: GpuVoxelizer,
    fps: FpsScratch,
    neighbors: NeighborsScratch,
    nms: DeviceNms,
    detector: DeviceDetector,
    queries: GrowBuffer<f32>,
    select_xyz: CudaFunction,
    /// The `samples` records picked on the device.
    sample_records: GrowBuffer<u8>,
    select_records: CudaFunction,
    /// The `neighborhoods` records written on the device.
    records: GrowBuffer<u32>,
    nbr_records: CudaFunction,
    /// A test fault to make at the start of its operator in this frame (armed by the engine).
    pub(crate) armed_fault: Option<FaultPlan>,
}

/// A cloud on the device: the gathered input, or a downsampled cloud's x, y, z (stride = len).
pub enum DevicePoints {
    Gathered(DeviceCloud),
    Xyz { data: PooledSlice<f32>, len: usize, names: Vec<String> },
}

impl DevicePoints {
    fn xyz(&self) -> Result<DeviceXyz<'_>, GpuError> {
        match self {
            DevicePoints::Gathered(c) => Ok(DeviceXyz::from(c)),
            DevicePoints::Xyz { data, len, .. } => DeviceXyz::new(data, *len, *len),
        }
    }

    /// The gathered cloud; voxelization runs on it only (the stage table never feeds it the
    /// downsampled cloud).
    fn gathered(&self) -> &DeviceCloud {
        match self {
            DevicePoints::Gathered(c) => c,
            DevicePoints::Xyz { .. } => unreachable!("voxelization runs on the gathered cloud"),
        }
    }
}

impl CudaBackend {
    /// `Ok(None)` when `kind` and the machine say CPU (see [`select_backend`]).
    pub fn select(kind: BackendKind, profile: ProfileChoice) -> Result<Option<Self>, GpuError> {
        select_backend(kind, profile)?.map(Self::new).transpose()
    }

    pub fn new(ctx: GpuContext) -> Result<Self, GpuError> {
        // Voxelization and the downsample run on streams of their own: the stage sequence starts
        // FPS (the longest kernel, on a few SMs) first, and they run beside it, and the downsample
        // beside the voxel stage's copies. The neighbour grid (it needs the points only, not the
        // samples) is built on the voxel stream too.
        let side = ctx.ctx.new_stream()?;
        Ok(Self {
            voxelizer: GpuVoxelizer::on_stream(&ctx, side.clone())?,
            downsampler: GpuVoxelizer::on_stream(&ctx, ctx.ctx.new_stream()?)?,
            fps: FpsScratch::new(&ctx)?,
            neighbors: NeighborsScratch::with_grid_stream(&ctx, side)?,
            nms: DeviceNms::new(&ctx)?,
            detector: DeviceDetector::new(&ctx)?,
            queries: GrowBuffer::new(&ctx.stream, 3 * 4096)?,
            select_xyz: ctx.function("gather", "select_xyz")?,
            sample_records: GrowBuffer::new(&ctx.stream, 48 * 4096)?,
            select_records: ctx.function("gather", "select_records")?,
            records: GrowBuffer::new(&ctx.stream, 6 * 4096 * 32)?,
            nbr_records: ctx.function("neighbors", "nbr_records")?,
            armed_fault: None,
            ctx,
        })
    }

    /// The armed fault's error when `op` is its operator (once).
    fn fault_point(&mut self, op: FaultOp) -> Result<(), GpuError> {
        match self.armed_fault {
            Some(plan) if plan.op == op => {
                self.armed_fault = None;
                Err(self.ctx.inject_fault(plan.kind, &self.select_xyz))
            }
            _ => Ok(()),
        }
    }
}

/// An enqueued neighbour search: its results stay in the backend's scratch until fetched.
pub enum Search {
    Knn { k: usize },
    Ball { nsample: usize },
}

/// Device x, y, z of the first `m` samples of the last FPS (in `fps`), as the neighbour queries.
fn select_queries<'q>(
    ctx: &GpuContext,
    fps: &mut FpsScratch,
    queries: &'q mut GrowBuffer<f32>,
    select_xyz: &CudaFunction,
    points: &DevicePoints,
    m: usize,
) -> Result<DeviceXyz<'q>, GpuError> {
    let stream = &ctx.stream;
    let src = points.xyz()?;
    let out = queries.ensure(stream, 3 * m.max(1))?;
    if m > 0 {
        let idx = fps.indices(ctx)?;
        let (stride, m32) = (src.stride as u64, m as u32);
        let block = 256u32;
        let cfg = LaunchConfig { grid_dim: (m32.div_ceil(block), 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        let mut l = stream.launch_builder(select_xyz);
        l.arg(src.data).arg(&stride).arg(&idx).arg(&m32).arg(&mut *out);
        // SAFETY: matches select_xyz in cuda/gather.cu; idx holds >= m valid indices < src.len,
        // out holds 3 * m floats.
        unsafe { l.launch(cfg) }?;
    }
    DeviceXyz::new(out, m, m)
}

impl Backend for CudaBackend {
    type Points = DevicePoints;
    /// The indices stay in the backend's FPS scratch until the next FPS.
    type Samples = ();
    type Neighbors = Search;
    /// The dynamic voxels stay in the downsampler until they are published; with `keep`, the
    /// downsampled cloud's x, y, z columns.
    type Downsample = Option<PooledSlice<f32>>;

    fn describe(&self) -> String {
        let c = &self.ctx;
        format!("cuda {} ({}, profile {})", c.device_name, c.arch, c.profile.name)
    }

    fn gather(&mut self, view: &CloudView<'_>) -> Result<DevicePoints, OpError> {
        self.fault_point(FaultOp::Gather)?;
        Ok(DevicePoints::Gathered(upload_and_gather(&self.ctx, view)?))
    }
    fn len(&self, points: &DevicePoints) -> usize {
        match points {
            DevicePoints::Gathered(c) => c.len,
            DevicePoints::Xyz { len, .. } => *len,
        }
    }
    fn dropped_non_finite(&self, points: &DevicePoints) -> usize {
        match points {
            DevicePoints::Gathered(c) => c.dropped_non_finite,
            DevicePoints::Xyz { .. } => 0,
        }
    }
    fn channel_names<'p>(&self, points: &'p DevicePoints) -> &'p [String] {
        match points {
            DevicePoints::Gathered(c) => &c.names,
            DevicePoints::Xyz { names, .. } => names,
        }
    }

    fn voxelize_hard(
        &mut self,
        points: &DevicePoints,
        channels: &[usize],
        params: &HardVoxelParams,
    ) -> Result<HardVoxels, OpError> {
        params.validate()?;
        self.fault_point(FaultOp::Voxelize)?;
        self.voxelizer.hard_device(&self.ctx, points.gathered(), channels, params, true, None)?;
        Ok(self.voxelizer.hard_to_host(&self.ctx)?.0)
    }
    fn voxelize_hard_published(
        &mut self,
        points: &DevicePoints,
        channels: &[usize],
        params: &HardVoxelParams,
        layout: &FeaturesLayout<'_>,
    ) -> Result<PublishedHardVoxels, OpError> {
        params.validate()?;
        self.fault_point(FaultOp::Voxelize)?;
        self.voxelizer.hard_device(&self.ctx, points.gathered(), channels, params, true, None)?;
        Ok(self.voxelizer.hard_published(&self.ctx, layout)?)
    }
    fn voxelize_dynamic(
        &mut self,
        points: &DevicePoints,
        channels: &[usize],
        grid: &VoxelGrid,
    ) -> Result<DynamicVoxels, OpError> {
        grid.validate()?;
        self.fault_point(FaultOp::Voxelize)?;
        self.voxelizer.dynamic_device(&self.ctx, points.gathered(), channels, grid)?;
        Ok(self.voxelizer.dynamic_to_host(&self.ctx)?)
    }
    fn downsample(
        &mut self,
        points: &DevicePoints,
        grid: &VoxelGrid,
        keep: bool,
    ) -> Result<Option<PooledSlice<f32>>, OpError> {
        grid.validate()?;
        self.fault_point(FaultOp::Downsample)?;
        Ok(self.downsampler.downsample_device(&self.ctx, points.gathered(), grid, keep)?)
    }
    fn downsample_published(
        &mut self,
        points: &DevicePoints,
        view: &CloudView<'_>,
        _: &SourceIndex,
        xyz: Option<PooledSlice<f32>>,
    ) -> Result<(PublishedDownsample, Option<DevicePoints>), OpError> {
        let published = self.downsampler.downsampled_published(&self.ctx, view)?;
        let names = points.gathered().names.clone();
        let kept = xyz.map(|data| DevicePoints::Xyz { data, len: published.points, names });
        Ok((published, kept))
    }
    fn pillar_features(
        &mut self,
        points: &DevicePoints,
        channels: &[usize],
        params: &HardVoxelParams,
        with_range: bool,
    ) -> Result<(HardVoxels, PillarFeatures), OpError> {
        params.validate()?;
        self.fault_point(FaultOp::Voxelize)?;
        self.voxelizer.hard_device(&self.ctx, points.gathered(), channels, params, true, Some(with_range))?;
        let (voxels, features) = self.voxelizer.hard_to_host(&self.ctx)?;
        Ok((voxels, features.expect("pillar features were requested")))
    }

    fn fps(&mut self, points: &DevicePoints, params: &FpsParams) -> Result<(), OpError> {
        let n = self.len(points);
        params.check_cloud(n)?;
        self.fault_point(FaultOp::Fps)?;
        fps_enqueue(&self.ctx, &mut self.fps, points.xyz()?, &[0, n], params)?;
        Ok(())
    }
    fn samples_published(
        &mut self,
        points: &DevicePoints,
        _: &(),
        queries: usize,
        view: &CloudView<'_>,
        _: &SourceIndex,
        header: &Header,
    ) -> Result<(Vec<i32>, CloudMessage), OpError> {
        let ctx = &self.ctx;
        let stream = &ctx.stream;
        let l = &view.layout;
        let step = l.point_step as usize;
        let mut message = CloudMessage::in_bytes(header, 1, queries, &l.fields, l.point_step, l.big_endian, |len| {
            ctx.output_pool.take(len)
        });
        if queries > 0 && step > 0 {
            // The gathered cloud's records are the upload, found through the record index of each
            // point (written on this stream, so stream order covers the read and the next frame's
            // upload: no event needs to outlive the launch); the downsampled cloud's are the
            // `downsampled` records, one row in point order (their stream was synchronised when
            // they were published, before FPS ran on them).
            let (records, source, width, row_step) = match points {
                DevicePoints::Gathered(c) => {
                    let (r, _) = c.records.device_ptr(stream);
                    let (s, _) = c.source.device_ptr(stream);
                    (r, s, c.layout.width, c.layout.row_step)
                }
                DevicePoints::Xyz { len, .. } => {
                    (self.downsampler.downsampled_records()?, 0, *len as u32, (*len * step) as u32)
                }
            };
            let out = self.sample_records.ensure(stream, queries * step)?;
            let idx = self.fps.indices(ctx)?;
            let (m, step32) = (queries as u32, l.point_step);
            let block = 256u32;
            let grid = ((queries * step) as u64).div_ceil(block as u64).min(ctx.sm_count.max(1) as u64 * 16) as u32;
            let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
            let mut launch = stream.launch_builder(&self.select_records);
            launch.arg(&records).arg(&source).arg(&idx).arg(&m).arg(&step32).arg(&width).arg(&row_step);
            launch.arg(&mut *out);
            // SAFETY: matches select_records in cuda/gather.cu; idx holds >= queries indices of
            // points of `points`, whose records (through `source` for the gathered cloud) lie in
            // `records` in `view`'s layout; out holds queries * point_step bytes.
            unsafe { launch.launch(cfg) }.map_err(GpuError::from)?;
            drop(launch);
            let (out_ptr, _o) = out.device_ptr(stream);
            // SAFETY: `out` holds the message's bytes; they are not touched before the stream is
            // synchronised (by the download of the indices behind this copy).
            unsafe { drv::memcpy_dtoh_async(message.data_mut(), out_ptr, stream.cu_stream()) }
                .map_err(GpuError::from)?;
        }
        Ok((self.fps.download(ctx)?, message))
    }
    fn knn(&mut self, points: &DevicePoints, _: &(), queries: usize, params: &KnnParams) -> Result<Search, OpError> {
        params.validate()?;
        self.fault_point(FaultOp::Neighbors)?;
        let Self { ctx, fps, queries: buf, select_xyz, neighbors, .. } = self;
        let q = select_queries(ctx, fps, buf, select_xyz, points, queries)?;
        knn_enqueue(ctx, neighbors, points.xyz()?, q, params)?;
        Ok(Search::Knn { k: params.k })
    }
    fn ball_query(
        &mut self,
        points: &DevicePoints,
        _: &(),
        queries: usize,
        params: &BallQueryParams,
    ) -> Result<Search, OpError> {
        params.validate()?;
        self.fault_point(FaultOp::Neighbors)?;
        let Self { ctx, fps, queries: buf, select_xyz, neighbors, .. } = self;
        let q = select_queries(ctx, fps, buf, select_xyz, points, queries)?;
        ball_query_enqueue(ctx, neighbors, points.xyz()?, q, params)?;
        Ok(Search::Ball { nsample: params.nsample })
    }
    fn neighbors_published(
        &mut self,
        points: &DevicePoints,
        _: &(),
        search: Search,
        header: &Header,
    ) -> Result<PublishedNeighbors, OpError> {
        let ctx = &self.ctx;
        let stream = &ctx.stream;
        let (rows, width) = self.neighbors.shape();
        let slots = rows * width;
        let mut message = neighborhoods_message_in(header, rows, width, |len| ctx.output_pool.take(len));
        // The indices and (ball query) counts come back through page-locked buffers too, in the
        // same wait as the records.
        let mut indices_bytes = ctx.output_pool.take(4 * slots);
        let ball = matches!(search, Search::Ball { .. });
        let mut counts_bytes = ball.then(|| ctx.output_pool.take(4 * rows));
        if slots > 0 {
            if let Some(counts_bytes) = counts_bytes.as_mut() {
                let counts = self.neighbors.counts(ctx)?;
                let (counts_ptr, _c) = counts.device_ptr(stream);
                // SAFETY: the device buffer holds the search's 4 * rows count bytes; the host
                // buffer is not touched before the stream is synchronised below.
                unsafe { drv::memcpy_dtoh_async(&mut counts_bytes[..], counts_ptr, stream.cu_stream()) }
                    .map_err(GpuError::from)?;
            }
            let xyz = points.xyz()?;
            let out = self.records.ensure(stream, 6 * slots)?;
            let idx = self.neighbors.indices(ctx)?;
            let samples = self.fps.indices(ctx)?;
            let (stride, width32, slots64) = (xyz.stride as u64, width as u32, slots as u64);
            // nbr_records is compiled for NEIGHBORS_BLOCK threads (its launch bound and stride).
            let block = ctx.profile.block_size.neighbors;
            let grid = (slots as u64).div_ceil(block as u64).min(ctx.sm_count.max(1) as u64 * 16) as u32;
            let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
            let mut l = stream.launch_builder(&self.nbr_records);
            l.arg(xyz.data).arg(&stride).arg(&idx).arg(&samples).arg(&width32).arg(&slots64).arg(&mut *out);
            // SAFETY: matches nbr_records in cuda/neighbors.cu; idx holds the last search's
            // `slots` indices (< the searched cloud's length), samples its rows' FPS indices, out
            // 6 * slots words.
            unsafe { l.launch(cfg) }.map_err(GpuError::from)?;
            drop(l);
            let (records, _r) = out.device_ptr(stream);
            let (idx_ptr, _i) = idx.device_ptr(stream);
            // SAFETY: the device buffers hold the records' 24 * slots bytes and the 4 * slots
            // index bytes (little endian like the host); the host buffers are not touched before
            // the stream is synchronised below.
            unsafe {
                drv::memcpy_dtoh_async(message.data_mut(), records, stream.cu_stream()).map_err(GpuError::from)?;
                drv::memcpy_dtoh_async(&mut indices_bytes[..], idx_ptr, stream.cu_stream()).map_err(GpuError::from)?;
            }
            stream.synchronize().map_err(GpuError::from)?;
        }
        fn words(b: &[u8]) -> impl Iterator<Item = u32> + '_ {
            b.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
        }
        let indices: Vec<i32> = words(&indices_bytes).map(|w| w as i32).collect();
        let found = match &counts_bytes {
            Some(counts) => words(counts).map(|c| c as usize).sum(),
            None => indices.iter().filter(|&&i| i >= 0).count(),
        };
        message.set_dense(!indices.iter().any(|&i| i < 0));
        Ok(PublishedNeighbors { indices, width, found, message })
    }

    fn detect(&mut self, points: &DevicePoints, params: &DetectParams) -> Result<Detections, OpError> {
        params.validate()?;
        self.fault_point(FaultOp::Detect)?;
        let mut d = self.detector.run(&self.ctx, points.xyz()?, params)?;
        d.keep = keep_boxes(&d.clusters, params, |boxes, scores, classes, np| self.nms(boxes, scores, classes, np))?;
        Ok(d)
    }

    fn nms(
        &mut self,
        boxes: &[Box3d],
        scores: &[f32],
        classes: &[i32],
        params: &NmsParams,
    ) -> Result<NmsOutput, OpError> {
        validate_input(boxes, scores, classes, params)?;
        self.fault_point(FaultOp::Nms)?;
        let classes = if params.class_aware { classes } else { &[] };
        self.nms.upload(&self.ctx, boxes, scores, classes)?;
        Ok(self.nms.run(&self.ctx, params)?)
    }
}
