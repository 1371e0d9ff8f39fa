//! The CUDA backend: the family launchers (`ops::*::cuda`) over one context, with every scratch
//! buffer kept across frames. The gathered cloud stays on the device; FPS indices feed the query
//! selection on the device; only what is published is copied back, the large outputs straight into
//! page-locked message bytes (`gpu::output_pool`). FPS runs on the context's stream; voxelization,
//! the downsample and the neighbour search run on streams of their own beside it, the search in
//! chunks of the samples FPS has written so far ([`PendingSearch`]).
//!
//! Parameters are checked with the CPU reference's own checks before anything is launched, so a
//! bad value is the same [`ParamError`](crate::ops::ParamError) on both backends.

use super::{Backend, OpError};
use crate::cloud::MessageBytes;
use crate::cloud::{CloudMessage, CloudView, Header, SourceIndex};
use crate::gpu::{
    select_backend, upload_and_gather, BackendKind, DeviceCloud, DeviceXyz, FaultOp, FaultPlan, GpuContext, GpuError,
    GrowBuffer, PooledSlice, ProfileChoice,
};
use crate::ops::detect::cuda::DeviceDetector;
use crate::ops::detect::{keep_boxes, DetectParams, Detections};
use crate::ops::fps::cuda::{fps_enqueue, FpsScratch};
use crate::ops::fps::FpsParams;
use crate::ops::neighbors::cuda::{launch_query, prepare, NeighborsScratch, QueryKind};
use crate::ops::neighbors::{ball_row_full, neighborhoods_message_in, BallQueryParams, KnnParams, PublishedNeighbors};
use crate::ops::nms::cuda::DeviceNms;
use crate::ops::nms::{validate_input, Box3d, NmsOutput, NmsParams};
use crate::ops::voxel::cuda::GpuVoxelizer;
use crate::ops::voxel::{
    DynamicVoxels, FeaturesLayout, HardVoxelParams, HardVoxels, PillarFeatures, PublishedDownsample,
    PublishedHardVoxels, VoxelGrid,
};
use crate::ops::Validate;
use cudarc::driver::{result as drv, CudaFunction, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use std::sync::Arc;

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
    /// The neighbour search asked for behind the last FPS, launched as FPS writes its samples.
    search: Option<PendingSearch>,
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
        // samples) is built on the voxel stream too, and the search runs there, after the voxel
        // stage's copies, chunk by chunk behind FPS.
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
            search: None,
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

/// Queries searched per launch while FPS goes on (the last chunk, after FPS, is what is left
/// of the frame's neighbour stage); each chunk costs a few launches and copies.
const SEARCH_CHUNK: usize = 256;

/// A neighbour search around the samples of the FPS in flight, launched in chunks of rows on the
/// neighbour grid's stream as FPS writes the samples (while the host waits for FPS anyway), so
/// that only the last chunk's search, records and copy are left when FPS ends. The published
/// bytes are copied into page-locked buffers chunk by chunk.
struct PendingSearch {
    kind: QueryKind,
    rows: usize,
    /// Rows launched so far.
    launched: usize,
    /// Work on `stream` may still write into the buffers below.
    in_flight: bool,
    stream: Arc<CudaStream>,
    message: Option<CloudMessage>,
    /// What the host needs besides the message, to count the real neighbours and tell is_dense:
    /// the per-row counts of a ball query, the indices of KNN (its -1 padding).
    tally: MessageBytes,
}

impl Drop for PendingSearch {
    /// Copies may still be writing into the buffers (a frame that failed half way): they go back
    /// to the pool only after the stream's work.
    fn drop(&mut self) {
        if self.in_flight {
            self.stream.context().record_err(self.stream.synchronize());
        }
    }
}

impl CudaBackend {
    /// Prepares a search of the first `queries` samples of the FPS in flight: the cell grid is
    /// built now (it needs the points only); the rows are launched by [`Self::launch_search`].
    fn start_search(&mut self, points: &DevicePoints, queries: usize, kind: QueryKind) -> Result<(), OpError> {
        self.fault_point(FaultOp::Neighbors)?;
        self.search = None;
        prepare(&self.ctx, &mut self.neighbors, points.xyz()?, queries, kind)?;
        let pool = &self.ctx.output_pool;
        self.search = Some(PendingSearch {
            kind,
            rows: queries,
            launched: 0,
            in_flight: false,
            stream: self.neighbors.grid_stream().clone(),
            message: None,
            tally: pool.take(4 * queries * if matches!(kind, QueryKind::Ball { .. }) { 1 } else { kind.width() }),
        });
        Ok(())
    }

    /// Launches every row of the pending search not launched yet, each chunk once FPS has
    /// written its samples (waiting for them), with the `neighborhoods` records and the copies of
    /// the published bytes; `points` is the cloud FPS ran on and the search searches.
    fn launch_search(&mut self, points: &DevicePoints, header: &Header) -> Result<(), OpError> {
        let Self { ctx, fps, neighbors, queries, records, select_xyz, nbr_records, search, .. } = self;
        let Some(p) = search.as_mut() else { return Ok(()) };
        let (rows, width) = (p.rows, p.kind.width());
        let message = p
            .message
            .get_or_insert_with(|| neighborhoods_message_in(header, rows, width, |len| ctx.output_pool.take(len)));
        if p.launched == rows || width == 0 {
            p.launched = rows;
            return Ok(());
        }
        let stream = p.stream.clone();
        let xyz = points.xyz()?;
        let stride = xyz.stride as u64;
        // The samples' device address, read by kernels on the search's stream while FPS may still
        // be writing later samples: no event may order the two (that would wait for all of FPS).
        let samples = {
            let v = fps.indices(ctx)?;
            let (ptr, _record) = v.device_ptr(&ctx.stream);
            ptr
        };
        let qbuf = queries.ensure(&stream, 3 * rows)?;
        let recs = records.ensure(&stream, 6 * rows * width)?;
        let block = ctx.profile.block_size.neighbors;
        while p.launched < rows {
            let (q0, q1) = (p.launched, fps.wait_written(ctx, (p.launched + SEARCH_CHUNK).min(rows))?.min(rows));
            let (m, cells) = (q1 - q0, q0 * width..q1 * width);
            p.in_flight = true;
            let mut q = qbuf.slice_mut(3 * q0..3 * q1);
            let (idx0, m32) = (samples + 4 * q0 as u64, m as u32);
            let cfg = LaunchConfig { grid_dim: (m32.div_ceil(256), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let mut l = stream.launch_builder(select_xyz);
            l.arg(xyz.data).arg(&stride).arg(&idx0).arg(&m32).arg(&mut q);
            // SAFETY: matches select_xyz in cuda/gather.cu; FPS has written samples q0 .. q1
            // (indices < the cloud's length; the kernel waits for each to land, -1 until then);
            // q holds 3 * m floats.
            unsafe { l.launch(cfg) }.map_err(GpuError::from)?;
            drop(l);
            launch_query(ctx, neighbors, &stream, &q.as_view(), m, q0, m, p.kind)?;
            if matches!(p.kind, QueryKind::Ball { .. }) {
                let c = neighbors.counts(ctx)?.slice(q0..q1);
                let (c_ptr, _c) = c.device_ptr(&stream);
                // SAFETY: the device range holds these rows' counts (4 bytes each, little endian);
                // the host buffer is not read before the stream is synchronised.
                unsafe { drv::memcpy_dtoh_async(&mut p.tally[4 * q0..4 * q1], c_ptr, stream.cu_stream()) }
                    .map_err(GpuError::from)?;
            }
            let idx = neighbors.indices(ctx)?.slice(cells.clone());
            let mut out = recs.slice_mut(6 * cells.start..6 * cells.end);
            let (slots, row0, width32) = ((m * width) as u64, q0 as u32, width as u32);
            let grid = slots.div_ceil(block as u64).min(ctx.sm_count.max(1) as u64 * 16) as u32;
            let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
            // nbr_records is compiled for NEIGHBORS_BLOCK threads (its launch bound and stride).
            let mut l = stream.launch_builder(nbr_records);
            l.arg(xyz.data).arg(&stride).arg(&idx).arg(&idx0).arg(&width32).arg(&slots).arg(&row0).arg(&mut out);
            // SAFETY: matches nbr_records in cuda/neighbors.cu; idx holds rows q0 .. q1 of the
            // search (indices < the searched cloud's length), idx0 their samples, out 6 words per slot.
            unsafe { l.launch(cfg) }.map_err(GpuError::from)?;
            drop(l);
            let (out_ptr, _o) = out.device_ptr(&stream);
            let (idx_ptr, _i) = idx.device_ptr(&stream);
            // SAFETY: the device ranges hold these rows' records (24 bytes per slot) and indices (4
            // bytes, little endian like the host); the host buffers are not read before the
            // stream is synchronised (`neighbors_published`, or the drop of the search).
            unsafe {
                let bytes = &mut message.data_mut()[24 * cells.start..24 * cells.end];
                drv::memcpy_dtoh_async(bytes, out_ptr, stream.cu_stream()).map_err(GpuError::from)?;
                if matches!(p.kind, QueryKind::Knn { .. }) {
                    let bytes = &mut p.tally[4 * cells.start..4 * cells.end];
                    drv::memcpy_dtoh_async(bytes, idx_ptr, stream.cu_stream()).map_err(GpuError::from)?;
                }
            }
            p.launched = q1;
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Points = DevicePoints;
    /// The indices stay in the backend's FPS scratch until the next FPS.
    type Samples = ();
    /// The search stays in the backend ([`PendingSearch`]) until it is published.
    type Neighbors = ();
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
        // The neighbour search behind this FPS is launched while FPS writes the samples.
        self.launch_search(points, header)?;
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
    fn knn(&mut self, points: &DevicePoints, _: &(), queries: usize, params: &KnnParams) -> Result<(), OpError> {
        self.start_search(points, queries, QueryKind::knn(params)?)
    }
    fn ball_query(
        &mut self,
        points: &DevicePoints,
        _: &(),
        queries: usize,
        params: &BallQueryParams,
    ) -> Result<(), OpError> {
        self.start_search(points, queries, QueryKind::ball(params)?)
    }
    fn neighbors_published(
        &mut self,
        points: &DevicePoints,
        _: &(),
        _: (),
        header: &Header,
    ) -> Result<PublishedNeighbors, OpError> {
        self.launch_search(points, header)?;
        let Some(mut p) = self.search.take() else {
            return Err(GpuError::NoResult { op: "neighbors_published", result: "neighbour search" }.into());
        };
        p.stream.synchronize().map_err(GpuError::from)?;
        p.in_flight = false;
        let words = p.tally.chunks_exact(4).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")));
        let (found, dense) = match p.kind {
            QueryKind::Ball { nsample, padding, .. } => words
                .fold((0, true), |(found, dense), c| (found + c as usize, dense && ball_row_full(c, nsample, padding))),
            QueryKind::Knn { .. } => {
                let found = words.filter(|&i| (i as i32) >= 0).count();
                (found, found == p.rows * p.kind.width())
            }
        };
        let Some(mut message) = p.message.take() else {
            return Err(GpuError::NoResult { op: "neighbors_published", result: "neighborhoods message" }.into());
        };
        message.set_dense(dense);
        Ok(PublishedNeighbors { rows: p.rows, width: p.kind.width(), found, message })
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
