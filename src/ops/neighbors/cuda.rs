//! GPU exact neighbour search (`cuda/neighbors.cu`): [`knn`] and [`ball_query`] with the semantics
//! of [`super`] (the CPU reference), bit for bit (indices, counts and dist2).
//!
//! A uniform cell grid is built on the device for every call (bounding box, cell edge and dims in
//! f64 like the CPU grid, cell counts, exclusive scan, binning), then the queries search it: KNN
//! visits rings of cells outward with a sorted top-k list of (dist2, index) keys (one warp per
//! query for k <= 32, one thread per query with the list in global memory above) and stops when
//! every unvisited cell is provably farther than the k-th distance; ball query visits the cells
//! overlapping the ball and keeps the nsample lowest indices. The whole call is enqueued without a host synchronisation (buffers are sized for the
//! worst-case cell count), until the copy back.
//!
//! KNN with k <= 32 runs one warp per query (`knn_warp_cells`): the lanes take 32 cells (columns
//! of a shell) at a time, and the points of all non-pruned runs are packed 32 per step, so a query
//! in a sparse region does not pay one dependent load per empty cell.

use super::{BallPadding, BallQuery, BallQueryParams, KnnParams, Neighbors};
use crate::gpu::{DeviceXyz, GpuContext, GpuError, GrowBuffer};
use crate::ops::Validate;
use cudarc::driver::{CudaStream, CudaView, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// Cells allowed per point (worst-case size of the count and start arrays).
const CELLS_PER_POINT: usize = 2;
const SCAN_ITEMS: usize = 8;
/// Size of `struct GridParams` in cuda/neighbors.cu (`static_assert` there): written on the device
/// by `grid_setup` into a buffer of [`GRID_PARAMS_WORDS`] u64 words, read by the later kernels.
const GRID_PARAMS_BYTES: usize = 72;
const GRID_PARAMS_WORDS: usize = GRID_PARAMS_BYTES.div_ceil(8);

/// Grow-only device buffers of the neighbour kernels (reuse across frames).
pub struct NeighborsScratch {
    bbox: GrowBuffer<u32>,
    gp: GrowBuffer<u64>,
    counts: GrowBuffer<u32>,
    start: GrowBuffer<u32>,
    cell_of: GrowBuffer<u32>,
    tile_sums: GrowBuffer<u32>,
    sorted: GrowBuffer<f32>,
    list: GrowBuffer<u64>,
    out_idx: GrowBuffer<i32>,
    out_d: GrowBuffer<f32>,
    out_cnt: GrowBuffer<u32>,
    rows: usize,
    width: usize,
    /// The stream the grid is built on (the pipeline's queries run on it too, beside FPS; other
    /// callers' queries on the context's stream, ordered by the buffers' events).
    grid_stream: Arc<CudaStream>,
    /// Kernel of the last query launch.
    pub last_kernel: String,
}

impl NeighborsScratch {
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
        Self::with_grid_stream(ctx, ctx.stream.clone())
    }

    /// Scratch whose grid is built on `grid_stream`: the pipeline builds it beside FPS, which only
    /// the queries have to wait for.
    pub fn with_grid_stream(ctx: &GpuContext, grid_stream: Arc<CudaStream>) -> Result<Self, GpuError> {
        let s = &ctx.stream;
        Ok(Self {
            bbox: GrowBuffer::new(s, 8)?,
            gp: GrowBuffer::new(s, GRID_PARAMS_WORDS)?,
            counts: GrowBuffer::new(s, 0)?,
            start: GrowBuffer::new(s, 0)?,
            cell_of: GrowBuffer::new(s, 0)?,
            tile_sums: GrowBuffer::new(s, 0)?,
            sorted: GrowBuffer::new(s, 0)?,
            list: GrowBuffer::new(s, 0)?,
            out_idx: GrowBuffer::new(s, 0)?,
            out_d: GrowBuffer::new(s, 0)?,
            out_cnt: GrowBuffer::new(s, 0)?,
            rows: 0,
            width: 0,
            grid_stream,
            last_kernel: String::new(),
        })
    }

    pub(crate) fn grid_stream(&self) -> &Arc<CudaStream> {
        &self.grid_stream
    }

    /// `(M, width)` of the last enqueue.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.width)
    }
    /// Device results of the last enqueue: `[M, width]` indices.
    pub fn indices(&mut self, ctx: &GpuContext) -> Result<CudaView<'_, i32>, GpuError> {
        let n = self.rows * self.width;
        Ok(self.out_idx.ensure(&ctx.stream, n.max(1))?.slice(..n))
    }
    /// `[M, k]` dist2 of the last [`knn_enqueue`].
    pub fn dist2(&mut self, ctx: &GpuContext) -> Result<CudaView<'_, f32>, GpuError> {
        let n = self.rows * self.width;
        Ok(self.out_d.ensure(&ctx.stream, n.max(1))?.slice(..n))
    }
    /// `[M]` counts of the last [`ball_query_enqueue`].
    pub fn counts(&mut self, ctx: &GpuContext) -> Result<CudaView<'_, u32>, GpuError> {
        let n = self.rows;
        Ok(self.out_cnt.ensure(&ctx.stream, n.max(1))?.slice(..n))
    }
}

fn blocks(n: usize, b: usize) -> u32 {
    n.div_ceil(b).max(1) as u32
}

/// Builds the cell grid of `points` on the device, on the scratch's grid stream. mode 0: KNN
/// (cell edge from k), 1: ball query.
pub(crate) fn build_grid(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    points: DeviceXyz<'_>,
    mode: u32,
    k: u32,
    radius: f32,
) -> Result<(), GpuError> {
    let stream = &s.grid_stream.clone();
    let b = ctx.profile.block_size.neighbors as usize;
    let n = points.len;
    if n >= u32::MAX as usize / 2 {
        return Err(GpuError::TooLarge {
            what: "neighbour grid points",
            value: n as u64,
            limit: (u32::MAX / 2 - 1) as u64,
        });
    }
    let max_cells = (CELLS_PER_POINT * n).max(64);
    let tile = b * SCAN_ITEMS;
    let ntiles = (max_cells + 1).div_ceil(tile);
    let stride = points.stride as u64;
    let n32 = n as u32;

    let bbox = s.bbox.ensure(stream, 8)?;
    stream.memset_zeros(&mut bbox.slice_mut(..8))?;
    let gp = s.gp.ensure(stream, GRID_PARAMS_WORDS)?;
    let counts = s.counts.ensure(stream, max_cells + 1)?;
    stream.memset_zeros(&mut counts.slice_mut(..max_cells + 1))?;
    let start = s.start.ensure(stream, max_cells + 1)?;
    let cell_of = s.cell_of.ensure(stream, n.max(1))?;
    let tile_sums = s.tile_sums.ensure(stream, ntiles)?;
    let sorted = s.sorted.ensure(stream, 4 * n.max(1))?;

    let cfg = |grid: u32| LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (b as u32, 1, 1), shared_mem_bytes: 0 };
    // SAFETY (every launch below): argument order and types match the kernels in
    // cuda/neighbors.cu; counts/start hold max_cells + 1 words and the setup kernel keeps the
    // cell count within max_cells; cell_of and sorted hold n entries; tile_sums ntiles.
    unsafe {
        let f = ctx.function("neighbors", "grid_bbox")?;
        let grid = blocks(n, b).min(ctx.sm_count.max(1) as u32 * 4);
        let mut l = stream.launch_builder(&f);
        l.arg(points.data).arg(&stride).arg(&n32).arg(&mut *bbox);
        l.launch(cfg(grid))?;

        let f = ctx.function("neighbors", "grid_setup")?;
        let mc = max_cells as u32;
        let mut l = stream.launch_builder(&f);
        l.arg(&*bbox).arg(&mut *gp).arg(&mode).arg(&k).arg(&radius).arg(&mc);
        l.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 })?;

        if n > 0 {
            let f = ctx.function("neighbors", "grid_count")?;
            let mut l = stream.launch_builder(&f);
            l.arg(points.data).arg(&stride).arg(&n32).arg(&*gp).arg(&mut *cell_of).arg(&mut *counts);
            l.launch(cfg(blocks(n, b)))?;
        }
        let f = ctx.function("neighbors", "scan_tiles")?;
        let mut l = stream.launch_builder(&f);
        l.arg(&*counts).arg(&*gp).arg(&mut *tile_sums);
        l.launch(cfg(ntiles as u32))?;

        let f = ctx.function("neighbors", "scan_top")?;
        let mut l = stream.launch_builder(&f);
        l.arg(&mut *tile_sums).arg(&*gp);
        l.launch(cfg(1))?;

        let f = ctx.function("neighbors", "scan_apply")?;
        let mut l = stream.launch_builder(&f);
        l.arg(&*counts).arg(&*gp).arg(&*tile_sums).arg(&mut *start);
        l.launch(cfg(ntiles as u32))?;

        if n > 0 {
            let f = ctx.function("neighbors", "grid_scatter")?;
            let mut l = stream.launch_builder(&f);
            l.arg(points.data).arg(&stride).arg(&n32).arg(&*cell_of).arg(&*start).arg(&mut *counts).arg(&mut *sorted);
            l.launch(cfg(blocks(n, b)))?;
        }
    }
    Ok(())
}

/// The query kernel: one warp per query for widths <= 32 (`knn_warp_cells`, `ball_warp`), else
/// one thread per query with the list in global memory (`knn_global`, `ball_global`).
fn list_kernel(prefix: &str, width: usize) -> String {
    match (prefix, width) {
        ("knn", 0..=32) => "knn_warp_cells".into(),
        (_, 0..=32) => format!("{prefix}_warp"),
        _ => format!("{prefix}_global"),
    }
}

fn check_sizes(points: usize, queries: usize, width: usize) -> Result<(), GpuError> {
    let limits = [
        ("neighbour search points (32-bit indexing)", points, i32::MAX as usize),
        ("neighbour search queries (32-bit indexing)", queries, u32::MAX as usize - 1),
        ("neighbour search row width, k or nsample (32-bit indexing)", width, u32::MAX as usize),
    ];
    if let Some(&(what, value, limit)) = limits.iter().find(|(_, v, l)| v > l) {
        return Err(GpuError::TooLarge { what, value: value as u64, limit: limit as u64 });
    }
    Ok(())
}

/// A search's kind and its kernel parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) enum QueryKind {
    Knn { k: usize },
    Ball { nsample: usize, radius: f32, r2: f32, rmin2: f32, padding: BallPadding },
}

impl QueryKind {
    pub(crate) fn knn(params: &KnnParams) -> Result<Self, GpuError> {
        params.validate()?;
        Ok(QueryKind::Knn { k: params.k })
    }

    pub(crate) fn ball(params: &BallQueryParams) -> Result<Self, GpuError> {
        params.validate()?;
        Ok(QueryKind::Ball {
            nsample: params.nsample,
            radius: params.radius,
            r2: params.radius * params.radius,
            rmin2: params.min_radius * params.min_radius,
            padding: params.padding,
        })
    }

    /// Slots per row: k, or nsample.
    pub(crate) fn width(&self) -> usize {
        match *self {
            QueryKind::Knn { k } => k,
            QueryKind::Ball { nsample, .. } => nsample,
        }
    }
}

/// Sizes the scratch for `rows` queries of `kind` into `points` and builds the cell grid; the rows
/// are then searched by [`launch_query`], all at once or in chunks.
pub(crate) fn prepare(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    points: DeviceXyz<'_>,
    rows: usize,
    kind: QueryKind,
) -> Result<(), GpuError> {
    let width = kind.width();
    check_sizes(points.len, rows, width)?;
    s.rows = rows;
    s.width = width;
    if rows == 0 {
        return Ok(());
    }
    match kind {
        QueryKind::Knn { k } => {
            build_grid(ctx, s, points, 0, k as u32, 0.0)?;
            s.last_kernel = list_kernel("knn", width);
        }
        QueryKind::Ball { radius, .. } => {
            build_grid(ctx, s, points, 1, 0, radius)?;
            s.last_kernel = list_kernel("ball", width);
        }
    }
    Ok(())
}

/// Searches rows `q0 .. q0 + m` of the prepared search on `stream`: their queries' x, y, z at
/// `qxyz` (columns `qstride` apart), their results into those rows of the scratch's outputs (sized
/// for every row, so that chunks of one search never reallocate them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_query(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    stream: &Arc<CudaStream>,
    qxyz: &CudaView<'_, f32>,
    qstride: usize,
    q0: usize,
    m: usize,
    kind: QueryKind,
) -> Result<(), GpuError> {
    if m == 0 {
        return Ok(());
    }
    let b = ctx.profile.block_size.neighbors as usize;
    let (rows, width) = (s.rows, s.width);
    let name = s.last_kernel.clone();
    let warp = name.ends_with("_warp") || name.ends_with("_warp_cells");
    let NeighborsScratch { gp, start, sorted, list, out_idx, out_d, out_cnt, .. } = s;
    let gp = gp.ensure(stream, GRID_PARAMS_WORDS)?;
    let start = start.ensure(stream, 1)?;
    let sorted = sorted.ensure(stream, 4)?;
    let cells = q0 * width..(q0 + m) * width;
    let list = list.ensure(stream, if width > 32 { rows * width } else { 1 })?;
    let mut list = if width > 32 { list.slice_mut(cells.clone()) } else { list.slice_mut(..) };
    let mut oi = out_idx.ensure(stream, rows * width)?.slice_mut(cells.clone());
    // Row width within u32: checked by `prepare`.
    let (qs, m32, width32) = (qstride as u64, m as u32, width as u32);
    let threads = if warp { m * 32 } else { m };
    let cfg = LaunchConfig { grid_dim: (blocks(threads, b), 1, 1), block_dim: (b as u32, 1, 1), shared_mem_bytes: 0 };
    let f = ctx.function("neighbors", &name)?;
    let mut l = stream.launch_builder(&f);
    l.arg(qxyz).arg(&qs).arg(&m32).arg(&*gp).arg(&*start).arg(&*sorted);
    match kind {
        QueryKind::Knn { .. } => {
            let mut od = out_d.ensure(stream, rows * width)?.slice_mut(cells);
            l.arg(&width32).arg(&mut oi).arg(&mut od).arg(&mut list);
            // SAFETY: matches `knn_*` in cuda/neighbors.cu; the outputs hold the m rows of k
            // (list too when k > 32), qxyz 3 columns of m queries.
            unsafe { l.launch(cfg) }?;
        }
        QueryKind::Ball { radius, r2, rmin2, padding, .. } => {
            let mut oc = out_cnt.ensure(stream, rows)?.slice_mut(q0..q0 + m);
            let pad_first = (padding == BallPadding::FirstFound) as u32;
            l.arg(&width32).arg(&radius).arg(&r2).arg(&rmin2).arg(&pad_first).arg(&mut oi).arg(&mut oc).arg(&mut list);
            // SAFETY: matches `ball_*` in cuda/neighbors.cu; the outputs hold the m rows of ns
            // and m counts (list m * ns when ns > 32), qxyz 3 columns of m queries.
            unsafe { l.launch(cfg) }?;
        }
    }
    Ok(())
}

/// Prepares and searches every query on the context's stream.
fn enqueue(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    points: DeviceXyz<'_>,
    queries: DeviceXyz<'_>,
    kind: QueryKind,
) -> Result<(), GpuError> {
    prepare(ctx, s, points, queries.len, kind)?;
    launch_query(ctx, s, &ctx.stream, &queries.data.slice(..), queries.stride, 0, queries.len, kind)
}

/// Enqueues KNN; results stay in `scratch` ([`NeighborsScratch::indices`], [`NeighborsScratch::dist2`]).
pub fn knn_enqueue(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    points: DeviceXyz<'_>,
    queries: DeviceXyz<'_>,
    params: &KnnParams,
) -> Result<(), GpuError> {
    enqueue(ctx, s, points, queries, QueryKind::knn(params)?)
}

/// Enqueues a ball query; results stay in `scratch` ([`NeighborsScratch::indices`], [`NeighborsScratch::counts`]).
pub fn ball_query_enqueue(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    points: DeviceXyz<'_>,
    queries: DeviceXyz<'_>,
    params: &BallQueryParams,
) -> Result<(), GpuError> {
    enqueue(ctx, s, points, queries, QueryKind::ball(params)?)
}

/// [`crate::ops::neighbors::knn`] on the device.
pub fn knn(
    ctx: &GpuContext,
    points: DeviceXyz<'_>,
    queries: DeviceXyz<'_>,
    params: &KnnParams,
) -> Result<Neighbors, GpuError> {
    let mut s = NeighborsScratch::new(ctx)?;
    knn_with(ctx, &mut s, points, queries, params)
}

pub fn knn_with(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    points: DeviceXyz<'_>,
    queries: DeviceXyz<'_>,
    params: &KnnParams,
) -> Result<Neighbors, GpuError> {
    knn_enqueue(ctx, s, points, queries, params)?;
    knn_download(ctx, s, params.k)
}

/// The results of the last [`knn_enqueue`] (of `k` neighbours) on the host; waits for the stream.
pub fn knn_download(ctx: &GpuContext, s: &mut NeighborsScratch, k: usize) -> Result<Neighbors, GpuError> {
    if s.rows * s.width == 0 {
        return Ok(Neighbors { indices: Vec::new(), dist2: Vec::new(), width: k });
    }
    let indices = ctx.stream.clone_dtoh(&s.indices(ctx)?)?;
    let dist2 = ctx.stream.clone_dtoh(&s.dist2(ctx)?)?;
    ctx.stream.synchronize()?;
    Ok(Neighbors { indices, dist2, width: k })
}

/// [`crate::ops::neighbors::ball_query`] on the device.
pub fn ball_query(
    ctx: &GpuContext,
    points: DeviceXyz<'_>,
    queries: DeviceXyz<'_>,
    params: &BallQueryParams,
) -> Result<BallQuery, GpuError> {
    let mut s = NeighborsScratch::new(ctx)?;
    ball_query_with(ctx, &mut s, points, queries, params)
}

pub fn ball_query_with(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    points: DeviceXyz<'_>,
    queries: DeviceXyz<'_>,
    params: &BallQueryParams,
) -> Result<BallQuery, GpuError> {
    ball_query_enqueue(ctx, s, points, queries, params)?;
    ball_query_download(ctx, s, params.nsample)
}

/// The results of the last [`ball_query_enqueue`] (`nsample` wide) on the host; waits for the
/// stream.
pub fn ball_query_download(ctx: &GpuContext, s: &mut NeighborsScratch, nsample: usize) -> Result<BallQuery, GpuError> {
    if s.rows == 0 {
        return Ok(BallQuery { indices: Vec::new(), counts: Vec::new(), width: nsample });
    }
    let indices = ctx.stream.clone_dtoh(&s.indices(ctx)?)?;
    let counts = ctx.stream.clone_dtoh(&s.counts(ctx)?)?;
    ctx.stream.synchronize()?;
    Ok(BallQuery { indices, counts, width: nsample })
}

#[cfg(test)]
mod tests {
    use super::list_kernel;

    /// Every width routes to a product kernel that cuda/neighbors.cu defines: one warp per query
    /// for 1..=32, the global-list kernel above.
    #[test]
    fn list_kernel_routes_to_product_kernels() {
        let src = crate::gpu::kernels::kernel("neighbors").unwrap().source;
        let defined = |name: &str| src.contains(&format!(") {name}(")) || src.contains(&format!("\n{name}("));
        for w in (1..=80).chain([100, 128, 1000, u32::MAX as usize]) {
            let (knn, ball) = (list_kernel("knn", w), list_kernel("ball", w));
            if w <= 32 {
                assert_eq!((knn.as_str(), ball.as_str()), ("knn_warp_cells", "ball_warp"), "width {w}");
            } else {
                assert_eq!((knn.as_str(), ball.as_str()), ("knn_global", "ball_global"), "width {w}");
            }
            assert!(defined(&knn) && defined(&ball), "width {w}: {knn} / {ball} not in cuda/neighbors.cu");
        }
        assert!(!src.contains("_reg_"), "comparison kernels are gone");
    }
}
