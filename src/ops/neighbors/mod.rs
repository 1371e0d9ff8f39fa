//! Neighbour search: exact k nearest neighbours ([`knn`]) and ball query ([`ball_query`]).
//!
//! Both are defined by brute force over every (query, point) pair (see each function's doc
//! comment); the CPU implementation reaches the same result faster through a uniform cell grid
//! (cell list) whose search bounds are conservative, so the grid never changes a result.
//!
//! # Distance
//!
//! Every distance in [`crate::ops::fps`] and here is [`dist2`]: squared Euclidean distance in f32,
//! evaluated as `(dx*dx + dy*dy) + dz*dz` with `dx = a.x - b.x` etc., each operation rounded to
//! nearest-even, without fused multiply-add. A GPU port must forbid contraction (`-fmad=false`, or
//! `__fsub_rn`/`__fmul_rn`/`__fadd_rn`) to reproduce it bit for bit. `dist2(a, b) == dist2(b, a)`
//! bitwise (negation is exact), and the result is never `-0.0`; for finite inputs it is never NaN
//! (it may overflow to `+inf`).
//!
//! # Non-finite coordinates
//!
//! A point (or query) with a NaN or infinite x, y or z is *invalid*. Invalid points are never
//! neighbours, and invalid queries have no neighbours (all padding). For the ball query this is
//! what the distance test gives anyway (NaN and `+inf` are never `< radius^2`); for KNN it is a rule.
//!
//! Channels other than x, y, z are ignored.

pub mod cuda;

use super::{ParamError, Validate};
use crate::cloud::{Cloud, CloudMessage, Datatype, Header, MessageBytes, PointField};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Squared Euclidean distance in f32, exactly `(dx*dx + dy*dy) + dz*dz` with `dx = a[0] - b[0]`,
/// `dy = a[1] - b[1]`, `dz = a[2] - b[2]`, every operation separately rounded (no FMA).
#[inline(always)]
pub fn dist2(a: [f32; 3], b: [f32; 3]) -> f32 {
    let dx = a[0] - b[0];
    let dy = a[1] - b[1];
    let dz = a[2] - b[2];
    (dx * dx + dy * dy) + dz * dz
}

/// Largest point or sample count the i32 outputs can index.
pub(crate) const MAX_POINTS: usize = i32::MAX as usize;

fn check_count(key: &str, n: usize) -> Result<(), ParamError> {
    if n > MAX_POINTS {
        return Err(ParamError::new(key, n, "at most 2147483647 (2^31 - 1) points, indices are i32"));
    }
    Ok(())
}

fn is_valid(p: [f32; 3]) -> bool {
    p[0].is_finite() && p[1].is_finite() && p[2].is_finite()
}

/// Sort key of a candidate: `(dist2, index)` in lexicographic order is the order of
/// `(dist2.to_bits() << 32) | index` because dist2 is never negative (and never -0.0).
#[inline(always)]
fn key(d: f32, index: u32) -> u64 {
    ((d.to_bits() as u64) << 32) | index as u64
}

#[inline(always)]
fn key_dist(k: u64) -> f32 {
    f32::from_bits((k >> 32) as u32)
}

// ------------------------------------------------------------------------------------------------
// Parameters and outputs
// ------------------------------------------------------------------------------------------------

/// Parameters of [`knn`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnnParams {
    /// Neighbours per query, >= 1. May exceed the number of points (the rest is padding).
    pub k: usize,
}

impl Default for KnnParams {
    fn default() -> Self {
        Self { k: 16 }
    }
}

impl Validate for KnnParams {
    fn validate(&self) -> Result<(), ParamError> {
        if self.k == 0 || self.k > MAX_POINTS {
            return Err(ParamError::new("k", self.k, "1 ..= 2147483647"));
        }
        Ok(())
    }
}

/// Output of [`knn`]: row-major `[M, width]` arrays, one row per query, `width == k`.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighbors {
    /// Point indices (into `points`), -1 for padding.
    pub indices: Vec<i32>,
    /// [`dist2`] of each neighbour, `+inf` for padding.
    pub dist2: Vec<f32>,
    /// Row width (= k).
    pub width: usize,
}

/// What fills a ball-query row after the neighbours found, when fewer than `nsample` are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BallPadding {
    /// Repeat the first (lowest-index) neighbour found: the PointNet++ / mmcv `ball_query`
    /// convention (`idx[l] = k` for every slot when the first neighbour `k` is found).
    #[serde(rename = "first_found")]
    FirstFound,
    /// Pad with -1: the PyTorch3D `ball_query` convention.
    #[serde(rename = "minus_one")]
    Minus1,
}

/// Parameters of [`ball_query`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BallQueryParams {
    /// Outer radius (exclusive), finite and > 0.
    pub radius: f32,
    /// Inner radius (inclusive), finite, 0 <= min_radius < radius. Default 0.
    #[serde(default)]
    pub min_radius: f32,
    /// Neighbours kept per query (row width), >= 1.
    pub nsample: usize,
    /// How a row is padded when fewer than `nsample` neighbours are found.
    pub padding: BallPadding,
}

impl Default for BallQueryParams {
    fn default() -> Self {
        Self { radius: 1.0, min_radius: 0.0, nsample: 32, padding: BallPadding::FirstFound }
    }
}

impl Validate for BallQueryParams {
    fn validate(&self) -> Result<(), ParamError> {
        if !(self.radius.is_finite() && self.radius > 0.0) {
            return Err(ParamError::new("radius", self.radius, "finite and > 0"));
        }
        if !(self.min_radius.is_finite() && self.min_radius >= 0.0 && self.min_radius < self.radius) {
            return Err(ParamError::new("min_radius", self.min_radius, "finite, >= 0 and < radius"));
        }
        if self.nsample == 0 || self.nsample > MAX_POINTS {
            return Err(ParamError::new("nsample", self.nsample, "1 ..= 2147483647"));
        }
        Ok(())
    }
}

/// Output of [`ball_query`]: `indices` is row-major `[M, width]`, `width == nsample`.
#[derive(Debug, Clone, PartialEq)]
pub struct BallQuery {
    /// Point indices (into `points`); padding per [`BallPadding`]; all -1 for a query with no
    /// neighbour, in both padding modes.
    pub indices: Vec<i32>,
    /// Per query, the number of real neighbours written at the start of its row
    /// (`min(found, nsample)`); the rest of the row is padding.
    pub counts: Vec<u32>,
    /// Row width (= nsample).
    pub width: usize,
}

// ------------------------------------------------------------------------------------------------
// Operators
// ------------------------------------------------------------------------------------------------

/// Exact k nearest neighbours of every query among `points` (x, y, z only).
///
/// For query `q` (row `m` of the output), let `C` be the valid points `i` (all of x, y, z finite)
/// with `d_i = dist2(points[i], q)` ([`dist2`]). Sort `C` by `(d_i, i)` ascending (distance
/// compared as f32 values, which for these non-negative numbers is the order of their bit
/// patterns; ties broken by the lower point index). Row `m` holds the first `min(k, |C|)` of them
/// (`indices` = `i`, `dist2` = `d_i`), then padding `-1` / `+inf` up to `k`. An invalid query
/// (non-finite coordinate) gets a row of padding. `d_i` may be `+inf` (overflow) for a valid
/// point; it is then distinguished from padding by its index.
///
/// Exact for every `k`, including `k > N`; `N == 0` gives all padding; `M == 0` gives empty arrays.
/// Errors: invalid `params`, or more than 2^31 - 1 points.
pub fn knn(points: &Cloud, queries: &Cloud, params: &KnnParams) -> Result<Neighbors, ParamError> {
    params.validate()?;
    check_count("points", points.len())?;
    let k = params.k;
    let m = queries.len();
    let mut indices = vec![-1i32; m * k];
    let mut dists = vec![f32::INFINITY; m * k];
    let out = Neighbors { indices: Vec::new(), dist2: Vec::new(), width: k };
    if m == 0 || points.is_empty() {
        return Ok(Neighbors { indices, dist2: dists, ..out });
    }
    let valid: Vec<u32> = (0..points.len()).filter(|&i| is_valid(points.point(i))).map(|i| i as u32).collect();
    let (qx, qy, qz) = (queries.x(), queries.y(), queries.z());

    if valid.len() <= k.max(BRUTE_FORCE_MAX) {
        // Few points (or k covers all of them): brute force over the valid points.
        let px: Vec<[f32; 3]> = valid.iter().map(|&i| points.point(i as usize)).collect();
        for_each_row_block(m, &mut indices, k, &mut dists, k, 64, |row0, ind, dd| {
            let mut keys: Vec<u64> = Vec::with_capacity(px.len());
            for r in 0..ind.len() / k {
                let q = [qx[row0 + r], qy[row0 + r], qz[row0 + r]];
                if !is_valid(q) {
                    continue;
                }
                keys.clear();
                keys.extend(px.iter().zip(&valid).map(|(&p, &i)| key(dist2(p, q), i)));
                if keys.len() > k {
                    keys.select_nth_unstable(k - 1);
                    keys.truncate(k);
                }
                keys.sort_unstable();
                write_knn_row(&keys, &mut ind[r * k..(r + 1) * k], &mut dd[r * k..(r + 1) * k]);
            }
        });
        return Ok(Neighbors { indices, dist2: dists, ..out });
    }

    let grid = Grid::build_for_knn(points, &valid, k);
    for_each_row_block(m, &mut indices, k, &mut dists, k, 64, |row0, ind, dd| {
        let mut best: Vec<u64> = Vec::with_capacity(k + 1);
        for r in 0..ind.len() / k {
            let q = [qx[row0 + r], qy[row0 + r], qz[row0 + r]];
            if !is_valid(q) {
                continue;
            }
            grid.knn_query(q, k, &mut best);
            write_knn_row(&best, &mut ind[r * k..(r + 1) * k], &mut dd[r * k..(r + 1) * k]);
        }
    });
    Ok(Neighbors { indices, dist2: dists, ..out })
}

/// At most this many valid points: KNN by brute force instead of the grid.
const BRUTE_FORCE_MAX: usize = 64;

fn write_knn_row(keys: &[u64], ind: &mut [i32], dd: &mut [f32]) {
    for (j, &kk) in keys.iter().enumerate() {
        ind[j] = (kk & 0xffff_ffff) as i32;
        dd[j] = key_dist(kk);
    }
}

/// Ball query: for every query, the first `nsample` points in input order inside a spherical shell.
///
/// With `r2 = radius * radius` and `rmin2 = min_radius * min_radius` (each one f32 multiply), point
/// `i` is a neighbour of query `q` iff `d = dist2(points[i], q)` ([`dist2`]) satisfies
/// `rmin2 <= d && d < r2` (NaN never does, so invalid points and queries have no neighbours).
/// Row `m` holds the `min(found, nsample)` neighbours with the lowest indices, in increasing index
/// order (the first ones met scanning `points` from index 0), then padding up to `nsample`:
/// - [`BallPadding::FirstFound`]: the first neighbour's index repeated (PointNet++ / mmcv);
/// - [`BallPadding::Minus1`]: -1 (PyTorch3D).
///
/// A query with no neighbour gets a row of -1 in **both** modes (PointNet++ / mmcv leave the
/// zero-initialised row, i.e. index 0, there; we do not). `counts[m]` = number of real neighbours
/// in row `m`.
///
/// Differences from the libraries, besides the empty row: mmcv's `ball_query(min_radius,
/// max_radius, ...)` also accepts every point with `d == 0` whatever `min_radius` is, we do not;
/// the original PointNet++ and PyTorch3D have no inner radius (`min_radius = 0` is the same test).
/// PyTorch3D returns `dists` too; use [`dist2`] on the indices if needed.
///
/// Errors: invalid `params`, or more than 2^31 - 1 points.
pub fn ball_query(points: &Cloud, queries: &Cloud, params: &BallQueryParams) -> Result<BallQuery, ParamError> {
    params.validate()?;
    check_count("points", points.len())?;
    let ns = params.nsample;
    let m = queries.len();
    let mut indices = vec![-1i32; m * ns];
    let mut counts = vec![0u32; m];
    let out = BallQuery { indices: Vec::new(), counts: Vec::new(), width: ns };
    if m == 0 || points.is_empty() {
        return Ok(BallQuery { indices, counts, ..out });
    }
    let r2 = params.radius * params.radius;
    let rmin2 = params.min_radius * params.min_radius;
    let valid: Vec<u32> = (0..points.len()).filter(|&i| is_valid(points.point(i))).map(|i| i as u32).collect();
    if valid.is_empty() {
        return Ok(BallQuery { indices, counts, ..out });
    }
    let grid = Grid::build(points, &valid, params.radius as f64 * BALL_CELL_FACTOR);
    let (qx, qy, qz) = (queries.x(), queries.y(), queries.z());
    // Reach of the cell search: covers every point whose computed dist2 can be < r2 (f32 rounding
    // of r2 and of dist2 together stay far below 1e-5 relative).
    let reach = params.radius as f64 * (1.0 + 1e-5) + grid.margin;
    let padding = params.padding;
    for_each_row_block(m, &mut indices, ns, &mut counts, 1, 64, |row0, ind, cnt| {
        let mut cand: Vec<u32> = Vec::new();
        for r in 0..cnt.len() {
            let q = [qx[row0 + r], qy[row0 + r], qz[row0 + r]];
            if !is_valid(q) {
                continue;
            }
            cand.clear();
            grid.ball_candidates(q, reach, rmin2, r2, &mut cand);
            if cand.is_empty() {
                continue;
            }
            if cand.len() > ns {
                cand.select_nth_unstable(ns - 1);
                cand.truncate(ns);
            }
            cand.sort_unstable();
            let row = &mut ind[r * ns..(r + 1) * ns];
            for (j, &c) in cand.iter().enumerate() {
                row[j] = c as i32;
            }
            if padding == BallPadding::FirstFound {
                let first = cand[0] as i32;
                row[cand.len()..].fill(first);
            }
            cnt[r] = cand.len() as u32;
        }
    });
    Ok(BallQuery { indices, counts, ..out })
}

/// Ball-query cell edge, in radii.
const BALL_CELL_FACTOR: f64 = 0.5;

// ------------------------------------------------------------------------------------------------
// Uniform cell grid
// ------------------------------------------------------------------------------------------------

/// A uniform grid over the bounding box of the valid points. Points are binned by cell with a
/// stable counting sort (input order within a cell); cell ids are `(cx * dy + cy) * dz + cz`, so
/// the cells of one (cx, cy) column with consecutive cz are one contiguous run of points.
struct Grid {
    origin: [f64; 3],
    h: f64,
    inv_h: f64,
    dims: [i64; 3],
    /// Conservative slack (metres) for rounding in the cell computations.
    margin: f64,
    /// `start[c] .. start[c + 1]` are the points of cell c (positions in xs/ys/zs/idx).
    start: Vec<u32>,
    xs: Vec<f32>,
    ys: Vec<f32>,
    zs: Vec<f32>,
    idx: Vec<u32>,
}

/// Cells allowed per valid point (bounds memory and the cost of empty cells).
const CELLS_PER_POINT: f64 = 4.0;

impl Grid {
    fn bbox(points: &Cloud, valid: &[u32]) -> ([f64; 3], [f64; 3]) {
        let mut lo = [f64::INFINITY; 3];
        let mut hi = [f64::NEG_INFINITY; 3];
        for &i in valid {
            let p = points.point(i as usize);
            for a in 0..3 {
                lo[a] = lo[a].min(p[a] as f64);
                hi[a] = hi[a].max(p[a] as f64);
            }
        }
        (lo, hi)
    }

    /// Grid dimensions for cell edge `h`, growing `h` until the cell count is within the budget.
    fn dims_for(lo: [f64; 3], hi: [f64; 3], n: usize, mut h: f64) -> (f64, [i64; 3]) {
        let extent = [hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]];
        let emax = extent[0].max(extent[1]).max(extent[2]);
        let budget = (CELLS_PER_POINT * n as f64).max(64.0);
        if !(h.is_finite() && h > 0.0) || h < emax * 1e-7 {
            h = (emax * 1e-7).max(f64::MIN_POSITIVE);
        }
        loop {
            let inv = 1.0 / h;
            let d: Vec<f64> = extent.iter().map(|e| (e * inv).floor() + 1.0).collect();
            let total = d[0] * d[1] * d[2];
            if total <= budget && total.is_finite() {
                return (h, [d[0] as i64, d[1] as i64, d[2] as i64]);
            }
            h *= if total.is_finite() { (total / budget).cbrt().max(1.0001) } else { 2.0 };
        }
    }

    fn build(points: &Cloud, valid: &[u32], h: f64) -> Grid {
        let (lo, hi) = Self::bbox(points, valid);
        let (h, dims) = Self::dims_for(lo, hi, valid.len(), h);
        Self::build_with(points, valid, lo, hi, h, dims)
    }

    /// Picks the cell edge from the data: about `k * KNN_CELL_TARGET` points per occupied cell,
    /// first assuming a volume fill, then (up to twice) shrinking the edge as if the points lay on
    /// surfaces (typical of lidar) while occupied cells hold too many points. Speed only: any edge
    /// gives the same result.
    fn build_for_knn(points: &Cloud, valid: &[u32], k: usize) -> Grid {
        let (lo, hi) = Self::bbox(points, valid);
        let n = valid.len();
        let target = (k as f64 * KNN_CELL_TARGET).max(2.0);
        let ext: Vec<f64> = (0..3).map(|a| hi[a] - lo[a]).collect();
        let emax = ext.iter().cloned().fold(0.0, f64::max);
        let floor_e = (emax * 1e-3).max(1e-12);
        let vol: f64 = ext.iter().map(|e| e.max(floor_e)).product();
        let mut h = (vol * target / n as f64).cbrt();
        let mut grid = None;
        for _ in 0..3 {
            let (hh, dims) = Self::dims_for(lo, hi, n, h);
            let g = Self::build_with(points, valid, lo, hi, hh, dims);
            let occupied = g.start.windows(2).filter(|w| w[1] > w[0]).count().max(1);
            let mean = n as f64 / occupied as f64;
            let shrink = hh == h && mean > 2.0 * target;
            grid = Some(g);
            if !shrink {
                break;
            }
            h = hh * (target / mean).sqrt();
        }
        grid.unwrap()
    }

    fn build_with(points: &Cloud, valid: &[u32], lo: [f64; 3], hi: [f64; 3], h: f64, dims: [i64; 3]) -> Grid {
        let inv_h = 1.0 / h;
        let max_abs = (0..3).map(|a| lo[a].abs().max(hi[a].abs())).fold(0.0, f64::max);
        let margin = 1e-9 * (h + max_abs) + 1e-30;
        let ncells = (dims[0] * dims[1] * dims[2]) as usize;
        let mut grid = Grid {
            origin: lo,
            h,
            inv_h,
            dims,
            margin,
            start: vec![0u32; ncells + 1],
            xs: Vec::new(),
            ys: Vec::new(),
            zs: Vec::new(),
            idx: Vec::new(),
        };
        let cell_ids: Vec<u32> = valid
            .iter()
            .map(|&i| {
                let p = points.point(i as usize);
                let c = [grid.cell(p[0] as f64, 0), grid.cell(p[1] as f64, 1), grid.cell(p[2] as f64, 2)];
                grid.cell_id(c[0], c[1], c[2]) as u32
            })
            .collect();
        for &c in &cell_ids {
            grid.start[c as usize + 1] += 1;
        }
        for c in 0..ncells {
            grid.start[c + 1] += grid.start[c];
        }
        let mut fill: Vec<u32> = grid.start[..ncells].to_vec();
        let n = valid.len();
        let (mut xs, mut ys, mut zs, mut idx) = (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0u32; n]);
        for (&i, &c) in valid.iter().zip(&cell_ids) {
            let pos = fill[c as usize] as usize;
            fill[c as usize] += 1;
            let p = points.point(i as usize);
            xs[pos] = p[0];
            ys[pos] = p[1];
            zs[pos] = p[2];
            idx[pos] = i;
        }
        grid.xs = xs;
        grid.ys = ys;
        grid.zs = zs;
        grid.idx = idx;
        grid
    }

    /// Cell coordinate of `v` on axis `a`, clamped into the grid (queries may lie outside; NaN
    /// gives 0). `floor(q)`, clamped to `[0, dims - 1]`, without a `floor`: below 1 the clamp
    /// gives 0 anyway, at or above the integer `dims - 1` the top cell, and in between truncation
    /// is floor (without SSE4.1, `floor` is a libm call per axis per point).
    #[inline]
    fn cell(&self, v: f64, a: usize) -> i64 {
        let q = (v - self.origin[a]) * self.inv_h;
        if !(q >= 1.0) {
            0
        } else if q >= (self.dims[a] - 1) as f64 {
            self.dims[a] - 1
        } else {
            q as i64
        }
    }

    #[inline]
    fn cell_id(&self, cx: i64, cy: i64, cz: i64) -> usize {
        ((cx * self.dims[1] + cy) * self.dims[2] + cz) as usize
    }

    /// Points of column (cx, cy), cells cz0 ..= cz1: a contiguous range of positions.
    #[inline]
    fn run(&self, cx: i64, cy: i64, cz0: i64, cz1: i64) -> std::ops::Range<usize> {
        let a = self.cell_id(cx, cy, cz0);
        let b = self.cell_id(cx, cy, cz1) + 1;
        self.start[a] as usize..self.start[b] as usize
    }

    /// Lower bound (metres, conservative) of the distance from `q` to cells lo ..= hi on axis a.
    #[inline]
    fn axis_gap(&self, q: f64, a: usize, lo: i64, hi: i64) -> f64 {
        let l = self.origin[a] + lo as f64 * self.h - self.margin;
        let u = self.origin[a] + (hi + 1) as f64 * self.h + self.margin;
        if q < l {
            l - q
        } else if q > u {
            q - u
        } else {
            0.0
        }
    }

    /// Converts a conservative lower bound on the true distance into a lower bound on the
    /// computed f32 [`dist2`] (which is within a few ulps of the true squared distance).
    #[inline]
    fn computed_d2_lower_bound(dist_sq: f64) -> f64 {
        dist_sq * (1.0 - 1e-6) - 1e-37
    }

    /// Exact k nearest valid points of `q`, as sorted keys in `best` (`best.len() == k`; the grid
    /// holds more than k points). Visits rings of cells (Chebyshev shells in cell coordinates)
    /// around the query's (clamped) cell until every unvisited cell is provably farther than the
    /// current k-th distance; skips runs of cells provably farther than it.
    fn knn_query(&self, q: [f32; 3], k: usize, best: &mut Vec<u64>) {
        best.clear();
        let qf = [q[0] as f64, q[1] as f64, q[2] as f64];
        let qc = [self.cell(qf[0], 0), self.cell(qf[1], 1), self.cell(qf[2], 2)];
        let max_r = (0..3).map(|a| qc[a].max(self.dims[a] - 1 - qc[a])).max().unwrap();
        let mut kth = f32::INFINITY; // k-th distance once best is full
        for r in 0..=max_r {
            let x0 = (qc[0] - r).max(0);
            let x1 = (qc[0] + r).min(self.dims[0] - 1);
            let y0 = (qc[1] - r).max(0);
            let y1 = (qc[1] + r).min(self.dims[1] - 1);
            let z0 = (qc[2] - r).max(0);
            let z1 = (qc[2] + r).min(self.dims[2] - 1);
            for cx in x0..=x1 {
                let fx = (cx - qc[0]).abs() == r;
                let gx = self.axis_gap(qf[0], 0, cx, cx);
                for cy in y0..=y1 {
                    let fy = (cy - qc[1]).abs() == r;
                    let gy = self.axis_gap(qf[1], 1, cy, cy);
                    if fx || fy {
                        self.scan_knn(q, qf, gx, gy, cx, cy, z0, z1, k, best, &mut kth);
                    } else {
                        if qc[2] - r >= 0 {
                            self.scan_knn(q, qf, gx, gy, cx, cy, qc[2] - r, qc[2] - r, k, best, &mut kth);
                        }
                        if qc[2] + r < self.dims[2] {
                            self.scan_knn(q, qf, gx, gy, cx, cy, qc[2] + r, qc[2] + r, k, best, &mut kth);
                        }
                    }
                }
            }
            if best.len() == k {
                // Every unvisited cell lies beyond one face of the box of rings 0..=r.
                let mut gap = f64::INFINITY;
                for a in 0..3 {
                    if qc[a] - r > 0 {
                        let face = self.origin[a] + (qc[a] - r) as f64 * self.h;
                        gap = gap.min(qf[a] - face);
                    }
                    if qc[a] + r < self.dims[a] - 1 {
                        let face = self.origin[a] + (qc[a] + r + 1) as f64 * self.h;
                        gap = gap.min(face - qf[a]);
                    }
                }
                if gap == f64::INFINITY {
                    break;
                }
                let g = (gap - self.margin).max(0.0);
                if (kth as f64) < Self::computed_d2_lower_bound(g * g) {
                    break;
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn scan_knn(
        &self,
        q: [f32; 3],
        qf: [f64; 3],
        gx: f64,
        gy: f64,
        cx: i64,
        cy: i64,
        cz0: i64,
        cz1: i64,
        k: usize,
        best: &mut Vec<u64>,
        kth: &mut f32,
    ) {
        let range = self.run(cx, cy, cz0, cz1);
        if range.is_empty() {
            return;
        }
        if best.len() == k {
            let gz = self.axis_gap(qf[2], 2, cz0, cz1);
            if (*kth as f64) < Self::computed_d2_lower_bound(gx * gx + gy * gy + gz * gz) {
                return;
            }
        }
        for pos in range {
            let d = dist2([self.xs[pos], self.ys[pos], self.zs[pos]], q);
            if d > *kth {
                continue;
            }
            let kk = key(d, self.idx[pos]);
            if best.len() == k {
                if kk >= best[k - 1] {
                    continue;
                }
                best.pop();
            }
            let at = best.partition_point(|&b| b < kk);
            best.insert(at, kk);
            if best.len() == k {
                *kth = key_dist(best[k - 1]);
            }
        }
    }

    /// Appends to `cand` the indices of the points with `rmin2 <= dist2 < r2`, visiting only the
    /// cells within `reach` of `q` (in cell order; the caller orders them by index).
    fn ball_candidates(&self, q: [f32; 3], reach: f64, rmin2: f32, r2: f32, cand: &mut Vec<u32>) {
        let qf = [q[0] as f64, q[1] as f64, q[2] as f64];
        let lo = [self.cell(qf[0] - reach, 0), self.cell(qf[1] - reach, 1), self.cell(qf[2] - reach, 2)];
        let hi = [self.cell(qf[0] + reach, 0), self.cell(qf[1] + reach, 1), self.cell(qf[2] + reach, 2)];
        let reach2 = reach * reach;
        for cx in lo[0]..=hi[0] {
            let gx = self.axis_gap(qf[0], 0, cx, cx);
            for cy in lo[1]..=hi[1] {
                let gy = self.axis_gap(qf[1], 1, cy, cy);
                if gx * gx + gy * gy > reach2 {
                    continue;
                }
                for pos in self.run(cx, cy, lo[2], hi[2]) {
                    let d = dist2([self.xs[pos], self.ys[pos], self.zs[pos]], q);
                    if rmin2 <= d && d < r2 {
                        cand.push(self.idx[pos]);
                    }
                }
            }
        }
    }
}

/// KNN cell sizing: points aimed at per occupied cell, in multiples of k.
const KNN_CELL_TARGET: f64 = 0.5;

// ------------------------------------------------------------------------------------------------
// Parallel rows
// ------------------------------------------------------------------------------------------------

/// Runs `f(first_row, a_rows, b_rows)` over blocks of `block` rows of two row-major arrays (row
/// widths `wa`, `wb`) on the current rayon pool. Each row is computed independently, so the
/// result does not depend on the thread count or scheduling.
pub(crate) fn for_each_row_block<A: Send, B: Send>(
    rows: usize,
    a: &mut [A],
    wa: usize,
    b: &mut [B],
    wb: usize,
    block: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    debug_assert!(a.len() == rows * wa && b.len() == rows * wb);
    let block = block.max(1);
    // Zero-width rows have no chunks to pair up: one call takes them all.
    if rows <= block || wa == 0 || wb == 0 || rayon::current_num_threads() == 1 {
        f(0, a, b);
        return;
    }
    a.par_chunks_mut(block * wa)
        .zip(b.par_chunks_mut(block * wb))
        .enumerate()
        .for_each(|(k, (ha, hb))| f(k * block, ha, hb));
}

/// A neighbour search's result of either kind.
#[derive(Debug, Clone, PartialEq)]
pub enum NeighborResult {
    Knn(Neighbors),
    Ball(BallQuery),
}

impl NeighborResult {
    /// The indices (`width` per row) and the real neighbours among them (padding excluded:
    /// KNN pads with -1, ball query's `first_found` repeats an index, so its counts say).
    pub fn into_published(self) -> (Vec<i32>, usize, usize) {
        match self {
            NeighborResult::Knn(n) => {
                let found = n.indices.iter().filter(|&&i| i >= 0).count();
                (n.indices, n.width, found)
            }
            NeighborResult::Ball(b) => {
                let found = b.counts.iter().map(|&c| c as usize).sum();
                (b.indices, b.width, found)
            }
        }
    }
}

/// A neighbour search as the pipeline publishes it: its shape (`rows` of `width` slots), the real
/// neighbours among the slots and the `neighborhoods` message ([`neighborhoods_message`]).
#[derive(Debug, Clone)]
pub struct PublishedNeighbors {
    pub rows: usize,
    pub width: usize,
    pub found: usize,
    pub message: CloudMessage,
}

/// Whether a ball-query row with `count` real neighbours holds no -1 (see [`ball_query`]): full,
/// or padded with its first neighbour. Tells a message's is_dense from the counts alone.
pub fn ball_row_full(count: u32, nsample: usize, padding: BallPadding) -> bool {
    count as usize == nsample || (padding == BallPadding::FirstFound && count > 0)
}

/// Records written per task by [`for_each_record`].
const RECORDS_PER_TASK: usize = 4096;

/// `f(i, record i)` for every `step`-byte record of `data` (a message's records), on the current
/// rayon pool as the row blocks of the searches. Each record is written on its own, so the bytes
/// do not depend on the threads.
pub(crate) fn for_each_record(data: &mut [u8], step: usize, f: impl Fn(usize, &mut [u8]) + Sync) {
    if step == 0 {
        return;
    }
    let rows = data.len() / step;
    for_each_row_block(rows, data, step, &mut vec![(); rows], 1, RECORDS_PER_TASK, |first, block, _| {
        for (j, rec) in block.chunks_exact_mut(step).enumerate() {
            f(first + j, rec);
        }
    });
}

/// `neighborhoods` of `rows` x `width` slots (records not yet written, left as `alloc` gives
/// them): an organized cloud, the grouping a PointNet++ layer consumes. Row q holds the neighbours
/// of sample q (`samples` point q): x, y, z (float32, the point as the search saw it, NaN in KNN
/// padding slots), `index` (INT32, the neighbour's index in the searched cloud, -1 in KNN padding
/// slots), `query` (INT32, q) and `query_index` (INT32, the sample's own index in the searched
/// cloud); little endian, dense unless a slot is padding.
/// `rows` x `width` records, not yet written; dense until the caller says otherwise.
pub fn neighborhoods_message_in(
    header: &Header,
    rows: usize,
    width: usize,
    alloc: impl FnOnce(usize) -> MessageBytes,
) -> CloudMessage {
    use Datatype::{Float32, Int32};
    let (fields, step) = PointField::packed([
        ("x", Float32),
        ("y", Float32),
        ("z", Float32),
        ("index", Int32),
        ("query", Int32),
        ("query_index", Int32),
    ]);
    CloudMessage::in_bytes(header, rows, width, &fields, step, false, alloc)
}

/// The `neighborhoods` message (see [`neighborhoods_message_in`]) of `indices` (`width` per row)
/// around `samples`, with `xyz(i)` point i of the searched cloud.
pub fn neighborhoods_message(
    header: &Header,
    xyz: impl Fn(usize) -> [f32; 3] + Sync,
    samples: &[i32],
    indices: &[i32],
    width: usize,
) -> CloudMessage {
    let rows = indices.len().checked_div(width).unwrap_or(0);
    let mut msg = neighborhoods_message_in(header, rows, width, MessageBytes::zeroed);
    msg.set_dense(!indices.iter().any(|&i| i < 0));
    for_each_record(msg.data_mut(), 24, |slot, rec| {
        let (i, q) = (indices[slot], slot / width);
        let p = if i < 0 { [f32::NAN; 3] } else { xyz(i as usize) };
        let words = [p[0].to_bits(), p[1].to_bits(), p[2].to_bits(), i as u32, q as u32, samples[q] as u32];
        for (dst, w) in rec.chunks_exact_mut(4).zip(words) {
            dst.copy_from_slice(&w.to_le_bytes());
        }
    });
    msg
}
