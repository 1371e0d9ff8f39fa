//! GPU exact neighbour search (`cuda/neighbors.cu`): [`knn`] and [`ball_query`] with the semantics
//! of [`crate::ops::neighbors`], bit for bit (indices, counts and dist2).
//!
//! A uniform cell grid is built on the device for every call (bounding box, cell edge and dims in
//! f64 like the CPU grid, cell counts, exclusive scan, binning), then one thread per query searches
//! it: KNN visits rings of cells outward with a sorted top-k list of (dist2, index) keys (registers
//! for k <= 32, global memory above) and stops when every unvisited cell is provably farther than
//! the k-th distance; ball query visits the cells overlapping the ball and keeps the nsample lowest
//! indices. The whole call is enqueued without a host synchronisation (buffers are sized for the
//! worst-case cell count), until the copy back.
//!
//! KNN with k <= 32 runs one warp per query (`knn_warp_cells`): the lanes take 32 cells (columns
//! of a shell) at a time, and the points of all non-pruned runs are packed 32 per step, so a query
//! in a sparse region no longer pays one dependent load per empty cell (H200, grid build included:
//! W3a k=16 2.26 -> 0.18 ms, W3b k=32 FPS queries 8.78 -> 0.25 ms). The previous cell-by-cell warp
//! kernel stays behind [`NeighborsScratch::knn_cell_by_cell`] for comparison.

use super::context::GrowBuffer;
pub use super::fps::DeviceXyz;
use super::fps::{load_scan, param_err, read_workload, time_ms, upload_cloud, upload_xyz, workload_xyz};
use super::report::{BenchRow, CheckRow, Rng};
use super::{GpuContext, GpuError};
use crate::cloud::Cloud;
use crate::ops::neighbors::{
    ball_query as cpu_ball, knn as cpu_knn, BallPadding, BallQuery, BallQueryParams, KnnParams, Neighbors,
};
use crate::ops::Validate;
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use std::path::Path;

/// Cells allowed per point (worst-case size of the count and start arrays).
const CELLS_PER_POINT: usize = 2;
const SCAN_ITEMS: usize = 8;
/// `struct GridParams` in cuda/neighbors.cu is 80 bytes.
const GRID_PARAMS_WORDS: usize = 16;

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
    /// Kernel of the last query launch.
    pub last_kernel: String,
    /// Use the one-thread-per-query kernels (`*_reg_*`) instead of one warp per query for
    /// widths <= 32 (slower; kept for comparison and checks).
    pub thread_per_query: bool,
    /// KNN with k <= 32: the previous one-warp-per-query kernel that visits the cells of each
    /// shell one by one (`knn_warp`) instead of 32 at a time (`knn_warp_cells`); for comparison.
    pub knn_cell_by_cell: bool,
    /// KNN grid sized as if for this k (cells for ~k/2 points) instead of the query's k; speed
    /// only, any cell edge gives the same result (bench experiments).
    pub knn_grid_k: Option<u32>,
}

impl NeighborsScratch {
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
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
            last_kernel: String::new(),
            thread_per_query: false,
            knn_cell_by_cell: false,
            knn_grid_k: None,
        })
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

/// Builds the cell grid of `points` on the device. mode 0: KNN (cell edge from k), 1: ball query.
fn build_grid(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    points: DeviceXyz<'_>,
    mode: u32,
    k: u32,
    radius: f32,
) -> Result<(), GpuError> {
    let stream = &ctx.stream;
    let b = ctx.profile.block_size.neighbors as usize;
    let n = points.len;
    if n >= u32::MAX as usize / 2 {
        return Err(GpuError::Unsupported(format!("{n} points: too many for the neighbour grid")));
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

fn list_kernel(prefix: &str, width: usize, thread_per_query: bool) -> String {
    if width <= 32 && !thread_per_query {
        return format!("{prefix}_warp");
    }
    match width {
        0..=8 => format!("{prefix}_reg_8"),
        9..=16 => format!("{prefix}_reg_16"),
        17..=32 => format!("{prefix}_reg_32"),
        _ => format!("{prefix}_global"),
    }
}

fn check_sizes(points: &DeviceXyz<'_>, queries: &DeviceXyz<'_>, width: usize) -> Result<(), GpuError> {
    if points.len > i32::MAX as usize || queries.len >= u32::MAX as usize || width > u32::MAX as usize {
        return Err(GpuError::Unsupported("neighbour search: sizes exceed 32-bit indexing".into()));
    }
    Ok(())
}

/// Enqueues KNN; results stay in `scratch` ([`NeighborsScratch::indices`], [`NeighborsScratch::dist2`]).
pub fn knn_enqueue(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    points: DeviceXyz<'_>,
    queries: DeviceXyz<'_>,
    params: &KnnParams,
) -> Result<(), GpuError> {
    params.validate().map_err(param_err)?;
    check_sizes(&points, &queries, params.k)?;
    let (m, k) = (queries.len, params.k);
    s.rows = m;
    s.width = k;
    if m == 0 {
        return Ok(());
    }
    let grid_k = s.knn_grid_k.unwrap_or(k.min(u32::MAX as usize) as u32);
    build_grid(ctx, s, points, 0, grid_k, 0.0)?;
    s.last_kernel = list_kernel("knn", k, s.thread_per_query);
    if s.last_kernel == "knn_warp" && !s.knn_cell_by_cell {
        s.last_kernel = "knn_warp_cells".into();
    }
    launch_query(ctx, s, queries, QueryKind::Knn { k: k as u32 })
}

enum QueryKind {
    Knn { k: u32 },
    Ball { ns: u32, radius: f32, r2: f32, rmin2: f32, pad_first: u32 },
}

fn launch_query(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    queries: DeviceXyz<'_>,
    kind: QueryKind,
) -> Result<(), GpuError> {
    let stream = &ctx.stream;
    let m = queries.len;
    let b = ctx.profile.block_size.neighbors as usize;
    let width = s.width;
    let name = s.last_kernel.clone();
    let warp = name.ends_with("_warp") || name.ends_with("_warp_cells");
    let NeighborsScratch { gp, start, sorted, list, out_idx, out_d, out_cnt, .. } = s;
    let gp = gp.ensure(stream, GRID_PARAMS_WORDS)?;
    let start = start.ensure(stream, 1)?;
    let sorted = sorted.ensure(stream, 4)?;
    let list = list.ensure(stream, if width > 32 { m * width } else { 1 })?;
    let oi = out_idx.ensure(stream, m * width)?;
    let (qs, m32) = (queries.stride as u64, m as u32);
    let threads = if warp { m * 32 } else { m };
    let cfg = LaunchConfig { grid_dim: (blocks(threads, b), 1, 1), block_dim: (b as u32, 1, 1), shared_mem_bytes: 0 };
    match kind {
        QueryKind::Knn { k } => {
            let od = out_d.ensure(stream, m * width)?;
            let f = ctx.function("neighbors", &name)?;
            let mut l = stream.launch_builder(&f);
            l.arg(queries.data)
                .arg(&qs)
                .arg(&m32)
                .arg(&*gp)
                .arg(&*start)
                .arg(&*sorted)
                .arg(&k)
                .arg(&mut *oi)
                .arg(&mut *od)
                .arg(&mut *list);
            // SAFETY: matches `knn_*` in cuda/neighbors.cu; outputs hold m * k, list m * k when k > 32.
            unsafe { l.launch(cfg) }?;
        }
        QueryKind::Ball { ns, radius, r2, rmin2, pad_first } => {
            let oc = out_cnt.ensure(stream, m)?;
            let f = ctx.function("neighbors", &name)?;
            let mut l = stream.launch_builder(&f);
            l.arg(queries.data)
                .arg(&qs)
                .arg(&m32)
                .arg(&*gp)
                .arg(&*start)
                .arg(&*sorted)
                .arg(&ns)
                .arg(&radius)
                .arg(&r2)
                .arg(&rmin2)
                .arg(&pad_first)
                .arg(&mut *oi)
                .arg(&mut *oc)
                .arg(&mut *list);
            // SAFETY: matches `ball_*` in cuda/neighbors.cu; outputs hold m * ns and m, list m * ns when ns > 32.
            unsafe { l.launch(cfg) }?;
        }
    }
    Ok(())
}

/// Enqueues a ball query; results stay in `scratch` ([`NeighborsScratch::indices`], [`NeighborsScratch::counts`]).
pub fn ball_query_enqueue(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    points: DeviceXyz<'_>,
    queries: DeviceXyz<'_>,
    params: &BallQueryParams,
) -> Result<(), GpuError> {
    params.validate().map_err(param_err)?;
    check_sizes(&points, &queries, params.nsample)?;
    let (m, ns) = (queries.len, params.nsample);
    s.rows = m;
    s.width = ns;
    if m == 0 {
        return Ok(());
    }
    build_grid(ctx, s, points, 1, 0, params.radius)?;
    s.last_kernel = list_kernel("ball", ns, s.thread_per_query);
    let kind = QueryKind::Ball {
        ns: ns as u32,
        radius: params.radius,
        r2: params.radius * params.radius,
        rmin2: params.min_radius * params.min_radius,
        pad_first: (params.padding == BallPadding::FirstFound) as u32,
    };
    launch_query(ctx, s, queries, kind)
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
    let n = s.rows * s.width;
    if n == 0 {
        return Ok(Neighbors { indices: Vec::new(), dist2: Vec::new(), width: params.k });
    }
    let indices = ctx.stream.clone_dtoh(&s.indices(ctx)?)?;
    let dist2 = ctx.stream.clone_dtoh(&s.dist2(ctx)?)?;
    ctx.stream.synchronize()?;
    Ok(Neighbors { indices, dist2, width: params.k })
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
    if s.rows == 0 {
        return Ok(BallQuery { indices: Vec::new(), counts: Vec::new(), width: params.nsample });
    }
    let indices = ctx.stream.clone_dtoh(&s.indices(ctx)?)?;
    let counts = ctx.stream.clone_dtoh(&s.counts(ctx)?)?;
    ctx.stream.synchronize()?;
    Ok(BallQuery { indices, counts, width: params.nsample })
}

// ------------------------------------------------------------------------------------------------
// Checks and benchmarks

fn knn_row(case: &str, n: usize, cpu: &Neighbors, g1: &Neighbors, g2: &Neighbors, kernel: &str) -> CheckRow {
    let same_i = g1.indices == cpu.indices;
    let same_d =
        g1.dist2.len() == cpu.dist2.len() && g1.dist2.iter().zip(&cpu.dist2).all(|(a, b)| a.to_bits() == b.to_bits());
    let det = g1.indices == g2.indices && g1.dist2.iter().zip(&g2.dist2).all(|(a, b)| a.to_bits() == b.to_bits());
    let mut max_rel = 0.0f64;
    for (a, b) in g1.dist2.iter().zip(&cpu.dist2) {
        if a.to_bits() != b.to_bits() {
            let r = if a.is_finite() && b.is_finite() {
                ((a - b).abs() as f64) / (b.abs() as f64).max(1e-30)
            } else {
                f64::INFINITY
            };
            max_rel = max_rel.max(r);
        }
    }
    let mut detail = format!(
        "M={} k={} via {kernel}; dist2 bit-identical: {}",
        cpu.indices.len() / cpu.width.max(1),
        cpu.width,
        same_d
    );
    if !same_i {
        if let Some(i) = g1.indices.iter().zip(&cpu.indices).position(|(a, b)| a != b) {
            detail += &format!("; first index difference at {i}: gpu {} cpu {}", g1.indices[i], cpu.indices[i]);
        }
    }
    CheckRow {
        operator: "knn".into(),
        case: case.into(),
        points: n,
        integers_identical: same_i,
        max_rel_err: max_rel,
        float_tolerance: 0.0,
        deterministic: det,
        detail,
    }
}

fn ball_row(
    case: &str,
    n: usize,
    p: &BallQueryParams,
    cpu: &BallQuery,
    g1: &BallQuery,
    g2: &BallQuery,
    kernel: &str,
) -> CheckRow {
    let same = g1 == cpu;
    let mut detail = format!(
        "M={} r={} rmin={} ns={} {:?} via {kernel}; mean count {:.1}",
        cpu.counts.len(),
        p.radius,
        p.min_radius,
        p.nsample,
        p.padding,
        cpu.counts.iter().map(|&c| c as f64).sum::<f64>() / cpu.counts.len().max(1) as f64
    );
    if !same {
        if let Some(i) = g1.counts.iter().zip(&cpu.counts).position(|(a, b)| a != b) {
            detail += &format!("; counts differ at query {i}: gpu {} cpu {}", g1.counts[i], cpu.counts[i]);
        } else if let Some(i) = g1.indices.iter().zip(&cpu.indices).position(|(a, b)| a != b) {
            detail += &format!("; indices differ at {i}: gpu {} cpu {}", g1.indices[i], cpu.indices[i]);
        }
    }
    CheckRow {
        operator: "ball_query".into(),
        case: case.into(),
        points: n,
        integers_identical: same,
        max_rel_err: 0.0,
        float_tolerance: 0.0,
        deterministic: g1 == g2,
        detail,
    }
}

/// Runs KNN and ball-query cases over one (points, queries) pair, appending rows.
fn check_pair(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    rows: &mut Vec<CheckRow>,
    case: &str,
    pts: (DeviceXyz<'_>, &Cloud),
    qs: (DeviceXyz<'_>, &Cloud),
    ks: &[usize],
    balls: &[BallQueryParams],
) -> Result<(), GpuError> {
    for &k in ks {
        let p = KnnParams { k };
        let cpu = cpu_knn(pts.1, qs.1, &p).map_err(param_err)?;
        let g1 = knn_with(ctx, s, pts.0, qs.0, &p)?;
        let kernel = s.last_kernel.clone();
        let g2 = knn_with(ctx, s, pts.0, qs.0, &p)?;
        rows.push(knn_row(case, pts.1.len(), &cpu, &g1, &g2, &kernel));
    }
    for p in balls {
        let cpu = cpu_ball(pts.1, qs.1, p).map_err(param_err)?;
        let g1 = ball_query_with(ctx, s, pts.0, qs.0, p)?;
        let kernel = s.last_kernel.clone();
        let g2 = ball_query_with(ctx, s, pts.0, qs.0, p)?;
        rows.push(ball_row(case, pts.1.len(), p, &cpu, &g1, &g2, &kernel));
    }
    Ok(())
}

fn bq(radius: f32, min_radius: f32, nsample: usize, padding: BallPadding) -> BallQueryParams {
    BallQueryParams { radius, min_radius, nsample, padding }
}

/// Uploads a cloud as-is (non-finite values kept: the gather path would drop them).
fn raw_upload(ctx: &GpuContext, c: &Cloud) -> Result<CudaSlice<f32>, GpuError> {
    upload_xyz(ctx, c.x(), c.y(), c.z())
}

/// GPU vs CPU KNN and ball query over the Ouster scans and random clouds from `seed`.
pub fn check(ctx: &GpuContext, seed: u64, ouster_dir: &Path) -> Result<Vec<CheckRow>, GpuError> {
    let mut rows = Vec::new();
    let mut s = NeighborsScratch::new(ctx)?;
    let ff = BallPadding::FirstFound;
    let m1 = BallPadding::Minus1;

    // Real scans (gather path); queries: every 7th point, and the scan's own FPS-like subset.
    for name in ["os1-128_scan0", "os1-32_scan0", "os2-128_scan0"] {
        let f = ouster_dir.join(format!("{name}.bin"));
        if !f.exists() {
            continue;
        }
        let (dev, host) = load_scan(ctx, &f)?;
        let qidx: Vec<usize> = (0..host.len()).step_by(7).collect();
        let qh = host.select(&qidx);
        let qh = Cloud::from_xyz(qh.x().to_vec(), qh.y().to_vec(), qh.z().to_vec());
        let qd = raw_upload(ctx, &qh)?;
        let qdx = DeviceXyz::new(&qd, qh.len(), qh.len())?;
        let balls = if name == "os1-128_scan0" {
            vec![bq(1.0, 0.0, 32, ff), bq(2.0, 0.0, 32, m1), bq(0.5, 0.2, 16, ff), bq(1.0, 0.0, 64, m1)]
        } else {
            vec![bq(1.0, 0.0, 32, ff)]
        };
        let ks: &[usize] = if name == "os1-128_scan0" { &[1, 16, 32, 48] } else { &[16] };
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            &format!("{name}, queries every 7th"),
            ((&dev).into(), &host),
            (qdx, &qh),
            ks,
            &balls,
        )?;
        if name == "os1-128_scan0" {
            s.thread_per_query = true;
            check_pair(
                ctx,
                &mut s,
                &mut rows,
                &format!("{name}, queries every 7th, thread/query"),
                ((&dev).into(), &host),
                (qdx, &qh),
                &[16, 32],
                &balls[..2],
            )?;
            s.thread_per_query = false;
            s.knn_cell_by_cell = true;
            check_pair(
                ctx,
                &mut s,
                &mut rows,
                &format!("{name}, queries every 7th, cell by cell"),
                ((&dev).into(), &host),
                (qdx, &qh),
                &[16, 32],
                &[],
            )?;
            s.knn_cell_by_cell = false;
        }
    }

    let mut rng = Rng::new(seed ^ 0x5eed);
    // Random volume cloud, queries partly outside its box.
    {
        let pts = rng.cloud(20000, 10.0);
        let (dev, host) = upload_cloud(ctx, &pts)?;
        let q = rng.cloud(3000, 14.0);
        let qd = raw_upload(ctx, &q)?;
        let qdx = DeviceXyz::new(&qd, q.len(), q.len())?;
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            "random 20000, 3000 queries",
            ((&dev).into(), &host),
            (qdx, &q),
            &[1, 5, 16, 32, 40],
            &[bq(0.7, 0.0, 32, ff), bq(1.5, 0.3, 8, m1), bq(1.0, 0.0, 100, ff)],
        )?;
    }
    // Lattice with many duplicates: ties in dist2 everywhere.
    {
        let pts = rng.lattice(8000, 9);
        let (dev, host) = upload_cloud(ctx, &pts)?;
        let q = rng.lattice(1000, 11);
        let qd = raw_upload(ctx, &q)?;
        let qdx = DeviceXyz::new(&qd, q.len(), q.len())?;
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            "lattice duplicates 8000",
            ((&dev).into(), &host),
            (qdx, &q),
            &[8, 32, 64],
            &[bq(1.0, 0.0, 32, ff), bq(2.0, 1.0, 16, m1)],
        )?;
    }
    // All identical points.
    {
        let pts = Cloud::from_points(&vec![[3.0f32, -1.0, 0.5]; 500]);
        let (dev, host) = upload_cloud(ctx, &pts)?;
        let q = Cloud::from_points(&[[3.0, -1.0, 0.5], [3.5, -1.0, 0.5], [100.0, 0.0, 0.0]]);
        let qd = raw_upload(ctx, &q)?;
        let qdx = DeviceXyz::new(&qd, q.len(), q.len())?;
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            "500 identical points",
            ((&dev).into(), &host),
            (qdx, &q),
            &[4, 32],
            &[bq(1.0, 0.0, 8, ff), bq(1.0, 0.0, 8, m1)],
        )?;
    }
    // Tiny clouds: k > N, empty, one point; non-finite points and queries (uploaded raw).
    for (case, n) in [("empty cloud", 0usize), ("one point", 1), ("10 points, k > N", 10), ("300 points", 300)] {
        let pts = rng.cloud(n, 3.0);
        let pd = raw_upload(ctx, &pts)?;
        let pdx = DeviceXyz::new(&pd, n, n)?;
        let mut q = rng.cloud(50, 3.5);
        if n == 300 {
            let mut x = q.x().to_vec();
            x[3] = f32::NAN;
            x[9] = f32::INFINITY;
            q = Cloud::from_xyz(x, q.y().to_vec(), q.z().to_vec());
        }
        let qd = raw_upload(ctx, &q)?;
        let qdx = DeviceXyz::new(&qd, q.len(), q.len())?;
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            case,
            (pdx, &pts),
            (qdx, &q),
            &[3, 16],
            &[bq(1.0, 0.0, 16, ff), bq(1.0, 0.0, 4, m1)],
        )?;
    }
    {
        let mut pts = rng.cloud(2000, 4.0);
        let mut x = pts.x().to_vec();
        let mut z = pts.z().to_vec();
        for i in (0..x.len()).step_by(13) {
            x[i] = f32::NAN;
        }
        for i in (5..z.len()).step_by(29) {
            z[i] = f32::NEG_INFINITY;
        }
        pts = Cloud::from_xyz(x, pts.y().to_vec(), z);
        let pd = raw_upload(ctx, &pts)?;
        let pdx = DeviceXyz::new(&pd, pts.len(), pts.len())?;
        let q = rng.cloud(500, 4.0);
        let qd = raw_upload(ctx, &q)?;
        let qdx = DeviceXyz::new(&qd, q.len(), q.len())?;
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            "2000 with non-finite points (raw upload)",
            (pdx, &pts),
            (qdx, &q),
            &[16],
            &[bq(1.0, 0.0, 32, ff)],
        )?;
    }
    Ok(rows)
}

fn same_as_cpu(g: &Neighbors, c: &Neighbors) -> bool {
    g.indices == c.indices
        && g.dist2.len() == c.dist2.len()
        && g.dist2.iter().zip(&c.dist2).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// KNN and ball-query benchmarks on the fixed workloads (W3a, W3b, W4).
pub fn bench(ctx: &GpuContext, workloads: &Path) -> Result<Vec<BenchRow>, GpuError> {
    let mut rows = Vec::new();
    let mut s = NeighborsScratch::new(ctx)?;
    let runs = 50;
    // W3a: queries = points.
    let (x, y, z) = workload_xyz(workloads, "w3a_xyz")?;
    let n = x.len();
    let a = upload_xyz(ctx, &x, &y, &z)?;
    let ad = DeviceXyz::new(&a, n, n)?;
    let p = KnnParams { k: 16 };
    let w3a_cloud = Cloud::from_xyz(x.clone(), y.clone(), z.clone());
    let w3a_cpu = cpu_knn(&w3a_cloud, &w3a_cloud, &p).map_err(param_err)?;
    for cell_by_cell in [false, true] {
        s.knn_cell_by_cell = cell_by_cell;
        let ms = time_ms(ctx, 3, runs, || knn_enqueue(ctx, &mut s, ad, ad, &p))?;
        let same = same_as_cpu(&knn_with(ctx, &mut s, ad, ad, &p)?, &w3a_cpu);
        rows.push(BenchRow {
            operator: "knn".into(),
            workload: format!(
                "W3a k=16, 16384 queries = points{}",
                if cell_by_cell { " (previous kernel)" } else { "" }
            ),
            points: n,
            median_ms: ms,
            runs,
            min_bytes: (n * 12 * 2 + n * 16 * 8) as u64,
            target_ms: Some(0.5),
            peer_ms: Some(2.10),
            note: format!("grid build + {}; identical to CPU: {same}", s.last_kernel),
        });
    }
    s.knn_cell_by_cell = false;

    // W3b / W4: queries = scan0_xyz[w3b_queries_idx] into scan0_xyz.
    let (x, y, z) = workload_xyz(workloads, "scan0_xyz")?;
    let n = x.len();
    let pbuf = upload_xyz(ctx, &x, &y, &z)?;
    let pd = DeviceXyz::new(&pbuf, n, n)?;
    let (ib, _) = read_workload(workloads, "w3b_queries_idx")?;
    let qi: Vec<usize> = ib.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap()) as usize).collect();
    let m = qi.len();
    let qb = upload_xyz(
        ctx,
        &qi.iter().map(|&i| x[i]).collect::<Vec<_>>(),
        &qi.iter().map(|&i| y[i]).collect::<Vec<_>>(),
        &qi.iter().map(|&i| z[i]).collect::<Vec<_>>(),
    )?;
    let qd = DeviceXyz::new(&qb, m, m)?;
    let p = KnnParams { k: 32 };
    let w3b_cpu = cpu_knn(
        &Cloud::from_xyz(x.clone(), y.clone(), z.clone()),
        &Cloud::from_xyz(
            qi.iter().map(|&i| x[i]).collect(),
            qi.iter().map(|&i| y[i]).collect(),
            qi.iter().map(|&i| z[i]).collect(),
        ),
        &p,
    )
    .map_err(param_err)?;
    for cell_by_cell in [false, true] {
        s.knn_cell_by_cell = cell_by_cell;
        let ms = time_ms(ctx, 3, runs, || knn_enqueue(ctx, &mut s, pd, qd, &p))?;
        let same = same_as_cpu(&knn_with(ctx, &mut s, pd, qd, &p)?, &w3b_cpu);
        rows.push(BenchRow {
            operator: "knn".into(),
            workload: format!(
                "W3b k=32, 4096 FPS queries into scan0{}",
                if cell_by_cell { " (previous kernel)" } else { "" }
            ),
            points: n,
            median_ms: ms,
            runs,
            min_bytes: (n * 12 + m * 12 + m * 32 * 8) as u64,
            target_ms: Some(0.5),
            peer_ms: Some(8.47),
            note: format!("grid build + {}; identical to CPU: {same}", s.last_kernel),
        });
    }
    s.knn_cell_by_cell = false;
    // Grid-size experiments (speed only): cells sized for ~gk/2 points.
    for gk in [4u32, 8, 16, 64, 128] {
        s.knn_grid_k = Some(gk);
        for (wl, pts, qs, k, cpu) in [("W3a k=16", ad, ad, 16usize, &w3a_cpu), ("W3b k=32", pd, qd, 32, &w3b_cpu)] {
            let p = KnnParams { k };
            let ms = time_ms(ctx, 3, runs, || knn_enqueue(ctx, &mut s, pts, qs, &p))?;
            let same = same_as_cpu(&knn_with(ctx, &mut s, pts, qs, &p)?, cpu);
            rows.push(BenchRow {
                operator: "knn (grid experiment)".into(),
                workload: format!("{wl}, grid sized for k={gk}"),
                points: pts.len,
                median_ms: ms,
                runs,
                min_bytes: 0,
                target_ms: Some(0.5),
                peer_ms: None,
                note: format!("grid build + {}; identical to CPU: {same}", s.last_kernel),
            });
        }
    }
    s.knn_grid_k = None;
    let ms = time_ms(ctx, 3, runs, || build_grid(ctx, &mut s, pd, 0, 32, 0.0))?;
    rows.push(BenchRow {
        operator: "knn grid build only".into(),
        workload: "scan0 grid for k=32 (included in the rows above/below)".into(),
        points: n,
        median_ms: ms,
        runs,
        min_bytes: (n * 12 * 2 + n * 16) as u64,
        target_ms: None,
        peer_ms: None,
        note: "bbox, setup, count, 3-kernel scan, scatter".into(),
    });
    s.thread_per_query = true;
    let ms = time_ms(ctx, 3, runs, || knn_enqueue(ctx, &mut s, pd, qd, &p))?;
    rows.push(BenchRow {
        operator: "knn".into(),
        workload: "W3b k=32 (one thread per query, for comparison)".into(),
        points: n,
        median_ms: ms,
        runs,
        min_bytes: (n * 12 + m * 12 + m * 32 * 8) as u64,
        target_ms: Some(0.5),
        peer_ms: Some(8.47),
        note: format!("grid build + {}", s.last_kernel),
    });
    s.thread_per_query = false;
    for r in [1.0f32, 2.0] {
        let p = bq(r, 0.0, 32, BallPadding::FirstFound);
        let ms = time_ms(ctx, 3, runs, || ball_query_enqueue(ctx, &mut s, pd, qd, &p))?;
        rows.push(BenchRow {
            operator: "ball_query".into(),
            workload: format!("W4 r={r} m, 32 samples, 4096 FPS queries into scan0"),
            points: n,
            median_ms: ms,
            runs,
            min_bytes: (n * 12 + m * 12 + m * 32 * 4 + m * 4) as u64,
            target_ms: Some(0.5),
            peer_ms: Some(28.1),
            note: format!("grid build + {}", s.last_kernel),
        });
    }
    Ok(rows)
}
