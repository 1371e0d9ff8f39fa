//! Voxelization: the voxel grid, hard (PointPillars / mmcv) voxelization, dynamic voxelization
//! with scatter means, voxel-grid downsampling and the PointPillars point encoding.
//!
//! Every operator here maps points to voxels through ONE definition, [`VoxelGrid::coord`] (and
//! [`VoxelGrid::dims`]); the CUDA kernels must use exactly that arithmetic. All float arithmetic
//! below is IEEE-754 with round-to-nearest-even, every operation rounded separately: no fused
//! multiply-add (in CUDA use `__fadd_rn`, `__fsub_rn`, `__fmul_rn`, `__fdiv_rn`, or compile with
//! `--fmad=false`), no reciprocal multiply in place of a division, no `--use_fast_math`.
//!
//! Every operator is deterministic: the output depends only on the input values and order. Voxels
//! are numbered in the order of the input index of their first point, and the points inside a
//! voxel keep their input order. (The voxel numbering tables are only looked up, never iterated.)

pub mod cuda;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::{ParamError, Validate};
use crate::cloud::{
    write_field, Cloud, CloudMessage, CloudView, Datatype, Header, MessageBytes, PointField, SourceIndex,
    INTENSITY_NAMES,
};
use crate::ops::neighbors::for_each_record;

/// Largest number of voxels allowed along one axis (2^20). Keeps every voxel coordinate exact in
/// f32 and the linear voxel index `(z * dim_y + y) * dim_x + x` below 2^60 (fits u64 / i64).
pub const MAX_GRID_DIM: i32 = 1 << 20;

/// Largest `max_points_per_voxel` accepted.
pub const MAX_POINTS_PER_VOXEL_LIMIT: u32 = 1 << 16;

/// A regular 3-D voxel grid over an axis-aligned box.
///
/// `voxel_size = [sx, sy, sz]`, `point_cloud_range = [min_x, min_y, min_z, max_x, max_y, max_z]`.
///
/// Grid dimensions ([`VoxelGrid::dims`]), per axis `a` in x, y, z order, all in f32:
/// `dim[a] = round_ties_even((max[a] - min[a]) / size[a])` as an integer (the mmcv
/// `torch.round(grid_size)`; torch rounds half to even; CUDA `rintf`).
///
/// Voxel coordinate of a point `p` ([`VoxelGrid::coord`]), per axis, all in f32:
/// `c[a] = floor((p[a] - min[a]) / size[a])` (one f32 subtraction, one true f32 division, floor).
/// The point is in range iff `c[a] >= 0 && c[a] < dim[a]` for all three axes, compared in f32
/// before any conversion to integer; otherwise (including NaN and infinite coordinates) it is out
/// of range. Points exactly on an inner voxel border go to the upper voxel when the f32 quotient
/// is exactly an integer; that the quotient can round across the border is part of the definition.
///
/// Defaults (PointPillars KITTI car config): voxel `[0.16, 0.16, 4]`, range
/// `[0, -39.68, -3, 69.12, 39.68, 1]` (dims 432 x 496 x 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VoxelGrid {
    pub voxel_size: [f32; 3],
    pub point_cloud_range: [f32; 6],
}

impl Default for VoxelGrid {
    fn default() -> Self {
        Self { voxel_size: [0.16, 0.16, 4.0], point_cloud_range: [0.0, -39.68, -3.0, 69.12, 39.68, 1.0] }
    }
}

impl Validate for VoxelGrid {
    /// Every `voxel_size[a]` finite and > 0; every `point_cloud_range[i]` finite;
    /// `point_cloud_range[a + 3] > point_cloud_range[a]`; every `dims()[a]` in `1..=MAX_GRID_DIM`.
    fn validate(&self) -> Result<(), ParamError> {
        for (a, &s) in self.voxel_size.iter().enumerate() {
            if !(s.is_finite() && s > 0.0) {
                return Err(ParamError::new(&format!("voxel_size[{a}]"), s, "finite and > 0"));
            }
        }
        for (i, &r) in self.point_cloud_range.iter().enumerate() {
            if !r.is_finite() {
                return Err(ParamError::new(&format!("point_cloud_range[{i}]"), r, "finite"));
            }
        }
        for a in 0..3 {
            let (lo, hi) = (self.point_cloud_range[a], self.point_cloud_range[a + 3]);
            if hi <= lo {
                return Err(ParamError::new(
                    &format!("point_cloud_range[{}]", a + 3),
                    hi,
                    &format!("> point_cloud_range[{a}] = {lo} (max must exceed min)"),
                ));
            }
        }
        for a in 0..3 {
            let d = self.dim_f32(a);
            if !(d >= 1.0 && d <= MAX_GRID_DIM as f32) {
                return Err(ParamError::new(
                    &format!("voxel_size[{a}]"),
                    self.voxel_size[a],
                    &format!(
                        "round((point_cloud_range[{}] - point_cloud_range[{a}]) / voxel_size[{a}]) = {d} voxels; \
                         must be in 1..={MAX_GRID_DIM}",
                        a + 3
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl VoxelGrid {
    /// `round_ties_even((max[a] - min[a]) / size[a])` in f32 (may be NaN or out of range when
    /// the grid is not valid).
    fn dim_f32(&self, a: usize) -> f32 {
        ((self.point_cloud_range[a + 3] - self.point_cloud_range[a]) / self.voxel_size[a]).round_ties_even()
    }

    /// Number of voxels along x, y, z (see the type's documentation). On a grid that fails
    /// validation the values saturate (`as i32`) and may be <= 0.
    pub fn dims(&self) -> [i32; 3] {
        [self.dim_f32(0) as i32, self.dim_f32(1) as i32, self.dim_f32(2) as i32]
    }

    /// Voxel coordinate `[x, y, z]` of `p`, or `None` when out of range (see the type's
    /// documentation for the exact f32 arithmetic).
    pub fn coord(&self, p: [f32; 3]) -> Option<[i32; 3]> {
        Indexer::new(self).coord(p)
    }

    /// Voxel centre along axis `a` (0 = x, 1 = y, 2 = z) of voxel coordinate `c`, in f32:
    /// `(c as f32 + 0.5) * size[a] + min[a]` (three separately rounded operations, no FMA).
    pub fn centre(&self, a: usize, c: i32) -> f32 {
        (c as f32 + 0.5) * self.voxel_size[a] + self.point_cloud_range[a]
    }
}

/// The grid with its dims precomputed, for the per-point loops.
#[derive(Clone, Copy)]
struct Indexer {
    min: [f32; 3],
    size: [f32; 3],
    dim_f: [f32; 3],
    dim: [u64; 3],
}

impl Indexer {
    fn new(grid: &VoxelGrid) -> Self {
        let dim_f = [grid.dim_f32(0), grid.dim_f32(1), grid.dim_f32(2)];
        Self {
            min: [grid.point_cloud_range[0], grid.point_cloud_range[1], grid.point_cloud_range[2]],
            size: grid.voxel_size,
            dim_f,
            dim: dim_f.map(|d| if d >= 1.0 { d as u64 } else { 0 }),
        }
    }

    #[inline]
    fn coord(&self, p: [f32; 3]) -> Option<[i32; 3]> {
        let mut out = [0i32; 3];
        for a in 0..3 {
            let q = (p[a] - self.min[a]) / self.size[a];
            // floor(q) >= 0 iff q >= 0, and floor(q) < dim iff q < dim (an integer), so the range
            // test needs no floor; then truncation is the floor. Written so that NaN is out.
            if !(q >= 0.0 && q < self.dim_f[a]) {
                return None;
            }
            out[a] = q as i32;
        }
        Some(out)
    }

    /// Every point's voxel: its `[z, y, x]` coordinate and linear key, or `[-1, -1, -1]` and
    /// [`OUT_OF_RANGE`] (computed in parallel; each point on its own).
    fn point_voxels(&self, cloud: &Cloud) -> (Vec<[i32; 3]>, Vec<u64>) {
        const CHUNK: usize = 16384;
        let (xs, ys, zs) = (cloud.x(), cloud.y(), cloud.z());
        let n = cloud.len();
        let mut coords = vec![[0i32; 3]; n];
        let mut keys = vec![0u64; n];
        coords.par_chunks_mut(CHUNK).zip(keys.par_chunks_mut(CHUNK)).enumerate().for_each(|(b, (cs, ks))| {
            for (j, (c, k)) in cs.iter_mut().zip(ks).enumerate() {
                let i = b * CHUNK + j;
                (*c, *k) = match self.coord([xs[i], ys[i], zs[i]]) {
                    Some(xyz) => (zyx(xyz), self.linear(xyz)),
                    None => ([-1; 3], OUT_OF_RANGE),
                };
            }
        });
        (coords, keys)
    }

    fn cells(&self) -> u64 {
        self.dim[0] * self.dim[1] * self.dim[2]
    }

    /// Linear index `(z * dim_y + y) * dim_x + x`; < 2^60 on a validated grid.
    #[inline]
    fn linear(&self, c: [i32; 3]) -> u64 {
        (c[2] as u64 * self.dim[1] + c[1] as u64) * self.dim[0] + c[0] as u64
    }
}

/// The key of a point outside the grid (linear keys are below 2^60).
const OUT_OF_RANGE: u64 = u64::MAX;

/// Largest grid numbered through a table with a slot per cell (16 MB) instead of a hash table.
const TABLE_MAX_CELLS: u64 = 1 << 22;

/// How far ahead of the point being numbered a later point's slot is prefetched: the numbering
/// walks the points in input order, one table lookup each, and without the prefetch each lookup
/// waits for memory in turn.
const LOOKAHEAD: usize = 16;

/// A hint that `*r` will be read soon. Unlike a load, a prefetch does not hold up the instructions
/// after it until memory answers, so the lookups of the next `LOOKAHEAD` points overlap.
#[inline(always)]
fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache; `r` is a valid reference.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((r as *const T).cast());
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM only hints the cache and never faults; `r` is a valid reference.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) r as *const T, options(nostack, readonly, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = r;
}

/// The number given to each voxel key, in the order the keys are first seen: a table over the
/// cells when the grid is small next to the cloud (the PointPillars grids), else an open-addressing
/// hash table (linear probing, at most half full). Either way only lookups are made, so the
/// numbering cannot depend on which one it is.
enum VoxelNumbers {
    Table(Vec<u32>),
    Hashed { keys: Vec<u64>, numbers: Vec<u32>, shift: u32 },
}

impl VoxelNumbers {
    const FREE: u32 = u32::MAX;

    fn new(ix: &Indexer, points: usize) -> Self {
        let cells = ix.cells();
        if cells <= TABLE_MAX_CELLS && cells <= 8 * points as u64 + 65536 {
            return Self::Table(vec![Self::FREE; cells as usize]);
        }
        let bits = (2 * points.max(8)).next_power_of_two().trailing_zeros();
        Self::Hashed { keys: vec![OUT_OF_RANGE; 1 << bits], numbers: vec![Self::FREE; 1 << bits], shift: 64 - bits }
    }

    /// The slot where a probe for `key` starts (Fibonacci hashing).
    #[inline]
    fn home(key: u64, shift: u32) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
    }

    /// Prefetches the first slot of `keys[i + LOOKAHEAD]` (key and number), if any, so that its
    /// lookup finds it in cache.
    #[inline]
    fn preload(&self, keys: &[u64], i: usize) {
        let Some(&key) = keys.get(i + LOOKAHEAD) else { return };
        if key == OUT_OF_RANGE {
            return;
        }
        match self {
            Self::Table(t) => {
                if let Some(slot) = t.get(key as usize) {
                    prefetch(slot);
                }
            }
            Self::Hashed { keys, numbers, shift } => {
                let at = Self::home(key, *shift);
                prefetch(&keys[at]);
                prefetch(&numbers[at]);
            }
        }
    }

    /// The number of `key` (not [`OUT_OF_RANGE`]), given by `new()` when the key is new (never
    /// [`Self::FREE`]).
    #[inline]
    fn get_or_insert_with(&mut self, key: u64, new: impl FnOnce() -> u32) -> u32 {
        let slot = match self {
            Self::Table(t) => &mut t[key as usize],
            Self::Hashed { keys, numbers, shift } => {
                let mask = keys.len() - 1;
                let mut at = Self::home(key, *shift);
                while keys[at] != key && keys[at] != OUT_OF_RANGE {
                    at = (at + 1) & mask;
                }
                keys[at] = key;
                &mut numbers[at]
            }
        };
        if *slot == Self::FREE {
            *slot = new();
        }
        *slot
    }
}

fn zyx(c: [i32; 3]) -> [i32; 3] {
    [c[2], c[1], c[0]]
}

// ---------------------------------------------------------------------------------------------
// Hard voxelization
// ---------------------------------------------------------------------------------------------

/// Parameters of [`voxelize_hard`]. The grid's keys sit at the same level (`serde(flatten)`):
/// `voxel_size`, `point_cloud_range`, `max_points_per_voxel`, `max_voxels`; missing keys take the
/// defaults.
///
/// Defaults (PointPillars KITTI, test-time): the [`VoxelGrid`] default, 32 points per voxel,
/// 40000 voxels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
// No deny_unknown_fields here (removed for the pipeline config, which flattens this struct into
// its `voxelize` stage and reports unknown keys itself, src/pipeline/config.rs). Consequence: a
// HardVoxelParams parsed on its own ignores unknown keys (VoxelGrid's deny_unknown_fields does not
// act through `flatten`); a VoxelGrid parsed on its own refuses them.
#[serde(default)]
pub struct HardVoxelParams {
    #[serde(flatten)]
    pub grid: VoxelGrid,
    /// `P`: points kept per voxel, `1..=65536`.
    pub max_points_per_voxel: u32,
    /// Voxels kept, `1..=2^31 - 1`.
    pub max_voxels: u32,
}

impl Default for HardVoxelParams {
    fn default() -> Self {
        Self { grid: VoxelGrid::default(), max_points_per_voxel: 32, max_voxels: 40000 }
    }
}

impl Validate for HardVoxelParams {
    fn validate(&self) -> Result<(), ParamError> {
        self.grid.validate()?;
        if !(1..=MAX_POINTS_PER_VOXEL_LIMIT).contains(&self.max_points_per_voxel) {
            return Err(ParamError::new(
                "max_points_per_voxel",
                self.max_points_per_voxel,
                &format!("1..={MAX_POINTS_PER_VOXEL_LIMIT}"),
            ));
        }
        if !(1..=i32::MAX as u32).contains(&self.max_voxels) {
            return Err(ParamError::new("max_voxels", self.max_voxels, &format!("1..={}", i32::MAX)));
        }
        Ok(())
    }
}

/// Output of [`voxelize_hard`] (mmcv / PointPillars layout). `V = coords.len()`,
/// `P = max_points`, `C = num_channels`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HardVoxels {
    /// `[V, P, C]` row-major: `features[(v * P + s) * C + k]` is channel `k` (cloud channel order)
    /// of the `s`-th kept point of voxel `v`; slots `s >= num_points[v]` are 0.0.
    pub features: Vec<f32>,
    /// `[V]` voxel coordinates as `[z, y, x]`.
    pub coords: Vec<[i32; 3]>,
    /// `[V]` kept points per voxel, `1..=P`.
    pub num_points: Vec<u32>,
    /// `C`: the cloud's channel count (x, y, z, then its other channels in cloud order).
    pub num_channels: usize,
    /// `P`: `max_points_per_voxel`.
    pub max_points: usize,
    /// Points with no voxel (see [`VoxelGrid::coord`]).
    pub dropped_out_of_range: usize,
    /// In-range points of a kept voxel that came after its first `P` points.
    pub dropped_point_capacity: usize,
    /// In-range points whose voxel was not kept (its first point came after `max_voxels` voxels
    /// had been opened).
    pub dropped_voxel_capacity: usize,
}

impl HardVoxels {
    /// `V`, the number of kept voxels.
    pub fn voxel_count(&self) -> usize {
        self.coords.len()
    }
    /// The `[P, C]` block of voxel `v`.
    pub fn voxel_features(&self, v: usize) -> &[f32] {
        let block = self.max_points * self.num_channels;
        &self.features[v * block..(v + 1) * block]
    }
    /// The `C` channels of slot `s` of voxel `v`.
    pub fn point(&self, v: usize, s: usize) -> &[f32] {
        let c = self.num_channels;
        let start = (v * self.max_points + s) * c;
        &self.features[start..start + c]
    }
    /// Total kept points, `sum(num_points)`. Always
    /// `kept + dropped_out_of_range + dropped_point_capacity + dropped_voxel_capacity == N`.
    pub fn kept_points(&self) -> usize {
        self.num_points.iter().map(|&n| n as usize).sum()
    }
}

/// Hard voxelization (mmcv `hard_voxelize` / PointPillars), exact semantics:
///
/// Walk the points in input order `i = 0..N`. Compute `c = grid.coord(point i)`; if `None`, count
/// it in `dropped_out_of_range`. Otherwise, if `c`'s voxel is already kept with `n < P` points,
/// copy all `C` channels of point `i` into slot `n` and increment `n`; if it is kept with `P`
/// points, count `dropped_point_capacity`; if it is not kept yet and fewer than `max_voxels`
/// voxels are kept, keep it as voxel `V` (next index) with point `i` in slot 0; otherwise count
/// `dropped_voxel_capacity` (and every later point of that voxel is counted there too).
///
/// Hence voxels are ordered by the input index of their first point, points in a voxel keep
/// input order, and the voxels dropped for capacity are the ones whose first point comes last.
/// No arithmetic is done on the feature values (bit-exact copies).
pub fn voxelize_hard(cloud: &Cloud, params: &HardVoxelParams) -> Result<HardVoxels, ParamError> {
    params.validate()?;
    let ix = Indexer::new(&params.grid);
    let p = params.max_points_per_voxel as usize;
    let max_voxels = params.max_voxels as usize;
    let cols = cloud.columns();
    let c = cols.len();
    let n = cloud.len();

    // Voxel numbers are below max_voxels <= 2^31 - 1, so this is neither one nor FREE.
    const NOT_KEPT: u32 = u32::MAX - 1;
    let (coords, keys) = ix.point_voxels(cloud);
    let mut numbers = VoxelNumbers::new(&ix, n);
    let mut out = HardVoxels { num_channels: c, max_points: p, ..Default::default() };
    // Pass 1, in input order: voxel and slot of every kept point (as its row `v * P + slot`).
    let mut kept: Vec<(usize, usize)> = Vec::with_capacity(n);
    for (i, &key) in keys.iter().enumerate() {
        numbers.preload(&keys, i);
        if key == OUT_OF_RANGE {
            out.dropped_out_of_range += 1;
            continue;
        }
        let next = out.coords.len();
        let v = numbers.get_or_insert_with(key, || if next < max_voxels { next as u32 } else { NOT_KEPT });
        if v == NOT_KEPT {
            out.dropped_voxel_capacity += 1;
            continue;
        }
        let v = v as usize;
        if v == next {
            out.coords.push(coords[i]);
            out.num_points.push(0);
        }
        let slot = out.num_points[v] as usize;
        if slot == p {
            out.dropped_point_capacity += 1;
            continue;
        }
        out.num_points[v] += 1;
        kept.push((i, v * p + slot));
    }
    // Pass 2: one zeroed allocation, then copy the kept points' channels into their rows.
    out.features = vec![0.0f32; out.coords.len() * p * c];
    for &(i, row) in &kept {
        let dst = &mut out.features[row * c..(row + 1) * c];
        for (d, col) in dst.iter_mut().zip(cols) {
            *d = col[i];
        }
    }
    tracing::trace!(
        voxels = out.coords.len(),
        out_of_range = out.dropped_out_of_range,
        point_capacity = out.dropped_point_capacity,
        voxel_capacity = out.dropped_voxel_capacity,
        "voxelize_hard"
    );
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Dynamic voxelization
// ---------------------------------------------------------------------------------------------

/// Output of [`voxelize_dynamic`]. `N` points, `V = voxel_coords.len()`, `C = num_channels`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DynamicVoxels {
    /// `[N]` voxel coordinate of each point as `[z, y, x]`, `[-1, -1, -1]` when out of range.
    pub point_coords: Vec<[i32; 3]>,
    /// `[N]` index of each point's voxel in `voxel_coords`, -1 when out of range.
    pub point_voxel: Vec<i32>,
    /// `[V]` distinct occupied voxels as `[z, y, x]`, ordered by the input index of their first
    /// point.
    pub voxel_coords: Vec<[i32; 3]>,
    /// `[V]` points per voxel (>= 1).
    pub num_points: Vec<u32>,
    /// `[V, C]` row-major: `means[v * C + k]` is the mean of channel `k` over the voxel's points.
    pub means: Vec<f32>,
    /// `C`: the cloud's channel count.
    pub num_channels: usize,
    /// Points with no voxel.
    pub dropped_out_of_range: usize,
}

impl DynamicVoxels {
    /// `V`, the number of occupied voxels.
    pub fn voxel_count(&self) -> usize {
        self.voxel_coords.len()
    }
    /// The `C` channel means of voxel `v`.
    pub fn mean(&self, v: usize) -> &[f32] {
        &self.means[v * self.num_channels..(v + 1) * self.num_channels]
    }
}

/// Dynamic voxelization (no capacity limits) with a scatter mean of every channel. Exact
/// semantics:
///
/// - `point_coords[i]` = `grid.coord(point i)` as `[z, y, x]`, or `[-1, -1, -1]`;
///   `point_voxel[i]` = index of that voxel, or -1.
/// - Voxels are numbered in the order of the input index of their first point.
/// - `means[v * C + k]`: `sum = 0.0f64`, then for the voxel's points in increasing input index
///   `sum += value as f64` (f64 additions, each rounded), then `(sum / count as f64) as f32`
///   (one f64 division, one round-to-nearest-even conversion to f32). NaN or infinite channel
///   values propagate into their voxel's mean.
///
/// # Panics
/// When `grid` fails [`Validate::validate`] (a programming error: configs are validated when
/// they load).
pub fn voxelize_dynamic(cloud: &Cloud, grid: &VoxelGrid) -> DynamicVoxels {
    if let Err(e) = grid.validate() {
        panic!("voxelize_dynamic: {e}");
    }
    let ix = Indexer::new(grid);
    let n = cloud.len();
    let cols = cloud.columns();
    let c = cols.len();

    let (point_coords, keys) = ix.point_voxels(cloud);
    let mut out = DynamicVoxels { point_voxel: Vec::with_capacity(n), num_channels: c, ..Default::default() };
    let mut numbers = VoxelNumbers::new(&ix, n);
    // In input order: the voxel numbers.
    for (i, &key) in keys.iter().enumerate() {
        numbers.preload(&keys, i);
        if key == OUT_OF_RANGE {
            out.dropped_out_of_range += 1;
            out.point_voxel.push(-1);
            continue;
        }
        let next = out.voxel_coords.len() as u32;
        let v = numbers.get_or_insert_with(key, || next);
        if v == next {
            out.voxel_coords.push(point_coords[i]);
            out.num_points.push(0);
        }
        out.num_points[v as usize] += 1;
        out.point_voxel.push(v as i32);
    }
    out.point_coords = point_coords;

    // f64 sums per voxel, a channel per task: each sum still adds its points in increasing input
    // index, so the means do not depend on the thread count.
    let nv = out.voxel_coords.len();
    let sums: Vec<Vec<f64>> = cols
        .par_iter()
        .map(|col| {
            let mut sum = vec![0.0f64; nv];
            for (&v, &val) in out.point_voxel.iter().zip(col.iter()) {
                if v >= 0 {
                    add_keeping_nan(&mut sum[v as usize], val as f64);
                }
            }
            sum
        })
        .collect();
    // A voxel's row at a time (a cloud has x, y, z, so C >= 3): indexing each value by `j / C`
    // and `j % C` cost two integer divisions per value, more than the mean itself.
    out.means = vec![0.0f32; nv * c];
    out.means.par_chunks_mut(c).zip(&out.num_points).enumerate().for_each(|(v, (mean, &count))| {
        for (m, sum) in mean.iter_mut().zip(&sums) {
            *m = (sum[v] / count as f64) as f32;
        }
    });
    tracing::trace!(voxels = nv, out_of_range = out.dropped_out_of_range, "voxelize_dynamic");
    out
}

// ---------------------------------------------------------------------------------------------
// Voxel-grid downsampling
// ---------------------------------------------------------------------------------------------

/// Output of [`voxel_grid_downsample`].
#[derive(Debug, Clone, PartialEq)]
pub struct Downsampled {
    /// One point per occupied voxel, same channel names and order as the input cloud.
    pub cloud: Cloud,
    /// Input points with no voxel (not represented in `cloud`).
    pub dropped_out_of_range: usize,
}

/// Voxel-grid downsampling (PCL `VoxelGrid` semantics: one point per occupied voxel, the centroid
/// of x, y, z and the mean of every other channel). Exactly [`voxelize_dynamic`]'s `means`: output
/// point `v` has channel `k` = `means[v * C + k]`, points in the order of the voxels (input index
/// of their first point). Differences from PCL: the voxel is this crate's [`VoxelGrid::coord`]
/// (a bounded grid, true division, not PCL's reciprocal multiply from an unbounded origin), the
/// means are accumulated in f64, and the output is in first-point order, not sorted by voxel index.
///
/// # Panics
/// When `grid` fails validation (see [`voxelize_dynamic`]).
pub fn voxel_grid_downsample(cloud: &Cloud, grid: &VoxelGrid) -> Downsampled {
    Downsampled::from_dynamic(&voxelize_dynamic(cloud, grid), cloud.names())
}

impl Downsampled {
    /// The downsampled cloud of dynamic voxels: output point `v` has channel `k` =
    /// `dv.means[v * C + k]`. `names` names the `C` channels in order (x, y, z first; only the
    /// names of channels `3..C` are used, extra names are ignored). Shared by
    /// [`voxel_grid_downsample`] and the GPU path ([`cuda`]), which builds `dv` on the device.
    pub fn from_dynamic(dv: &DynamicVoxels, names: &[String]) -> Downsampled {
        let cloud = Cloud::from_row_major(&dv.means, dv.num_channels, names);
        Downsampled { cloud, dropped_out_of_range: dv.dropped_out_of_range }
    }
}

// ---------------------------------------------------------------------------------------------
// PointPillars point encoding
// ---------------------------------------------------------------------------------------------

/// Output of [`pillar_features`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PillarFeatures {
    /// `[V, P, num_channels]` row-major, same `V` and `P` as the input voxels; padding slots 0.0.
    pub features: Vec<f32>,
    /// 9, or 10 with range.
    pub num_channels: usize,
    /// `P`, the input's `max_points`.
    pub max_points: usize,
}

/// PointPillars (mmdet3d `PillarFeatureNet`) point decoration of hard voxels whose channels 0..4
/// are x, y, z, intensity (channels past the 4th are ignored). For voxel `v` with
/// `n = num_points[v]` points and coordinate `[cz, cy, cx]`, every slot `s < n` holding
/// `x, y, z, i` gets, all in f32 with every operation rounded separately (no FMA):
///
/// `[x, y, z, i, x - mx, y - my, z - mz, x - ox, y - oy]` and, when `with_range`,
/// `sqrt((x * x + y * y) + z * z)` as a 10th channel (correctly rounded sqrt),
///
/// where `mx = (((0 + x_0) + x_1) + ... + x_{n-1}) / (n as f32)` (f32 sum over slots 0..n in slot
/// order, then one f32 division; likewise `my`, `mz`), and `ox = (cx as f32 + 0.5) * size_x + min_x`,
/// `oy = (cy as f32 + 0.5) * size_y + min_y` ([`VoxelGrid::centre`]). Slots `s >= n` are all 0.0.
///
/// `grid` must be the grid the voxels were built with. Differs from mmdet3d's arithmetic (which
/// uses `cx * size_x + (size_x / 2 + min_x)` and `torch.norm`) only in rounding.
///
/// Errors: `grid` invalid, `voxels.num_channels < 4` (key `voxels.num_channels`), or inconsistent
/// shapes (key `voxels.features`, `voxels.num_points`).
pub fn pillar_features(voxels: &HardVoxels, grid: &VoxelGrid, with_range: bool) -> Result<PillarFeatures, ParamError> {
    grid.validate()?;
    let c = voxels.num_channels;
    if c < 4 {
        return Err(ParamError::new("voxels.num_channels", c, ">= 4 (x, y, z, intensity)"));
    }
    let p = voxels.max_points;
    let nv = voxels.coords.len();
    if voxels.num_points.len() != nv {
        return Err(ParamError::new(
            "voxels.num_points",
            voxels.num_points.len(),
            &format!("length = coords length {nv}"),
        ));
    }
    if voxels.features.len() != nv * p * c {
        return Err(ParamError::new(
            "voxels.features",
            voxels.features.len(),
            &format!("length = V * P * C = {nv} * {p} * {c}"),
        ));
    }
    if let Some(&bad) = voxels.num_points.iter().find(|&&n| n as usize > p) {
        return Err(ParamError::new("voxels.num_points", bad, &format!("<= max_points {p}")));
    }
    let oc = if with_range { 10 } else { 9 };
    let mut features = vec![0.0f32; nv * p * oc];
    for v in 0..nv {
        let n = voxels.num_points[v] as usize;
        let block = &voxels.features[v * p * c..(v + 1) * p * c];
        let mut sum = [0.0f32; 3];
        for s in 0..n {
            for a in 0..3 {
                sum[a] += block[s * c + a];
            }
        }
        let nf = n as f32;
        let mean = sum.map(|t| t / nf);
        let [_, cy, cx] = voxels.coords[v];
        let ox = grid.centre(0, cx);
        let oy = grid.centre(1, cy);
        for s in 0..n {
            let (x, y, z, i) = (block[s * c], block[s * c + 1], block[s * c + 2], block[s * c + 3]);
            let dst = &mut features[(v * p + s) * oc..(v * p + s + 1) * oc];
            dst[..9].copy_from_slice(&[x, y, z, i, x - mean[0], y - mean[1], z - mean[2], x - ox, y - oy]);
            if with_range {
                dst[9] = (x * x + y * y + z * z).sqrt();
            }
        }
    }
    Ok(PillarFeatures { features, num_channels: oc, max_points: p })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_grid_dims() {
        let g = VoxelGrid::default();
        g.validate().unwrap();
        assert_eq!(g.dims(), [432, 496, 1]);
    }

    #[test]
    fn nan_and_inf_are_out_of_range() {
        let g = VoxelGrid::default();
        assert_eq!(g.coord([f32::NAN, 0.0, 0.0]), None);
        assert_eq!(g.coord([f32::INFINITY, 0.0, 0.0]), None);
        assert_eq!(g.coord([f32::NEG_INFINITY, 0.0, 0.0]), None);
        // Quotients 0.5, 248.5, 0.5: far from any border, so the floor is unambiguous.
        assert_eq!(g.coord([0.08, 0.08, -1.0]), Some([0, 248, 0]));
    }
}

/// How the published `voxel_features` carries the [V, P, C] values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FeaturesDtype {
    /// FLOAT32 fields.
    #[default]
    Float32,
    /// IEEE binary16 for fp16 networks, rounded to nearest even ([`features_f16`]), in UINT16
    /// fields (PointCloud2 has no half-float datatype).
    Float16,
}

impl FeaturesDtype {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            FeaturesDtype::Float32 => 4,
            FeaturesDtype::Float16 => 2,
        }
    }
}

/// `*sum += v`, except that a NaN sum stays as it is, so that a voxel's sum is its first NaN
/// (quieted): with two NaN operands x86 returns one or the other depending on the operand order
/// the compiler picks. The CUDA kernels' f64 sums (`lk_dadd_host`) give the same bits.
#[inline]
pub(crate) fn add_keeping_nan(sum: &mut f64, v: f64) {
    if !sum.is_nan() {
        *sum += v;
    }
}

/// The downsample stage as the pipeline publishes it: the `downsampled` message of
/// [`downsampled_message`] (the CUDA backend writes its records on the device) and its counts.
#[derive(Debug, Clone)]
pub struct PublishedDownsample {
    /// Points of the downsampled cloud: occupied voxels.
    pub points: usize,
    /// Input points outside the grid.
    pub dropped_out_of_range: usize,
    pub message: CloudMessage,
}

/// `downsampled` of `points` records in `view`'s layout (height 1), the records left as `alloc`
/// gives them.
pub fn downsampled_message_in(
    header: &Header,
    view: &CloudView<'_>,
    points: usize,
    alloc: impl FnOnce(usize) -> MessageBytes,
) -> CloudMessage {
    let layout = &view.layout;
    CloudMessage::in_bytes(header, 1, points, &layout.fields, layout.point_step, layout.big_endian, alloc)
}

/// `downsampled`: one point per occupied voxel in the input's own layout. x, y, z are the
/// float32 centroids; every other field is the mean of its points, written in the field's
/// datatype (integers rounded to nearest): from the float32 channel for types float32 holds
/// exactly, from the records' f64 values (summed in input order) for INT32, UINT32 and FLOAT64,
/// so absolute FLOAT64 stamps and 32-bit counters keep their precision. Fields that are not
/// channels (count > 1, padding placeholders) are zero.
pub fn downsampled_message(
    header: &Header,
    view: &CloudView<'_>,
    source: &SourceIndex,
    dv: &DynamicVoxels,
    channel_names: &[String],
) -> CloudMessage {
    let layout = &view.layout;
    let (step, c, nv) = (layout.point_step as usize, dv.num_channels, dv.voxel_count());
    let mut m = downsampled_message_in(header, view, nv, MessageBytes::zeroed);
    let be = layout.big_endian;
    // Each channel's datatype, offset, and where its mean comes from: the float32 means, or (for
    // the wide fields) column j of per-voxel f64 sums of the records, in input order.
    let mut wide: Vec<(Datatype, usize)> = Vec::new();
    let channels: Vec<(Datatype, usize, Option<usize>)> = layout
        .channels()
        .into_iter()
        .enumerate()
        .take(c)
        .map(|(k, f)| {
            debug_assert_eq!(f.name, channel_names[k]);
            let (dt, off) = (Datatype::from_u8(f.datatype).expect("validated"), f.offset as usize);
            let sum_column = (k >= 3 && dt.wider_than_f32()).then(|| {
                wide.push((dt, off));
                wide.len() - 1
            });
            (dt, off, sum_column)
        })
        .collect();
    let nw = wide.len();
    let mut sums = vec![0f64; nv * nw];
    if nw > 0 && nv > 0 {
        // Each task owns a range of voxels and walks every point in input order, summing only the
        // points of its voxels: per voxel the order of the sum is the input order, whatever the
        // threads.
        let per_task = nv.div_ceil(rayon::current_num_threads().max(1)).max(1024);
        sums.par_chunks_mut(per_task * nw).enumerate().for_each(|(task, sums)| {
            let first = task * per_task;
            let voxels = first..first + sums.len() / nw;
            for (p, &vox) in dv.point_voxel.iter().enumerate() {
                if vox >= 0 && voxels.contains(&(vox as usize)) {
                    let sum = &mut sums[(vox as usize - first) * nw..][..nw];
                    for (s, &(dt, off)) in sum.iter_mut().zip(&wide) {
                        add_keeping_nan(s, view.value_at(dt, off, source.get(p)));
                    }
                }
            }
        });
    }
    for_each_record(m.data_mut(), step, |v, rec| {
        for (k, &(dt, off, sum_column)) in channels.iter().enumerate() {
            let value = match sum_column {
                Some(j) => sums[v * nw + j] / dv.num_points[v] as f64,
                None => dv.means[v * c + k] as f64,
            };
            write_field(rec, dt, off, value, be);
        }
    });
    m
}

/// What a hard voxelization kept and dropped: the counts the pipeline reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HardVoxelCounts {
    /// `V`, the kept voxels.
    pub voxels: usize,
    /// Points in the kept voxels' slots.
    pub kept_points: usize,
    pub dropped_out_of_range: usize,
    pub dropped_point_capacity: usize,
    pub dropped_voxel_capacity: usize,
}

impl HardVoxels {
    pub fn counts(&self) -> HardVoxelCounts {
        HardVoxelCounts {
            voxels: self.voxel_count(),
            kept_points: self.num_points.iter().map(|&n| n as usize).sum(),
            dropped_out_of_range: self.dropped_out_of_range,
            dropped_point_capacity: self.dropped_point_capacity,
            dropped_voxel_capacity: self.dropped_voxel_capacity,
        }
    }
}

/// Hard voxels as the pipeline publishes them: the `voxels` message ([`voxels_message`] of the
/// centroids) and the `voxel_features` message holding the [V, P, C] values (the CUDA backend
/// writes both on the device and copies them into the messages' bytes, once).
#[derive(Debug, Clone)]
pub struct PublishedHardVoxels {
    pub counts: HardVoxelCounts,
    pub voxels: CloudMessage,
    pub features: CloudMessage,
}

/// The `voxels` message's fields for voxels of the channels `names[..num_channels]` (x, y, z
/// first), packed little-endian 4-byte words: centroid `x`, `y`, `z`, the mean `intensity` when a
/// channel is one ([`INTENSITY_NAMES`], in that order of preference), `num_points` (UINT32) and
/// `voxel_z`, `voxel_y`, `voxel_x` (INT32); with the point step and the intensity's channel.
pub fn voxels_fields(names: &[String], num_channels: usize) -> (Vec<PointField>, u32, Option<usize>) {
    let channels = &names[..num_channels.min(names.len())];
    let intensity = INTENSITY_NAMES.iter().find_map(|n| (3..channels.len()).find(|&k| channels[k] == *n));
    let mut fields = vec![("x", Datatype::Float32), ("y", Datatype::Float32), ("z", Datatype::Float32)];
    if intensity.is_some() {
        fields.push(("intensity", Datatype::Float32));
    }
    fields.extend([
        ("num_points", Datatype::Uint32),
        ("voxel_z", Datatype::Int32),
        ("voxel_y", Datatype::Int32),
        ("voxel_x", Datatype::Int32),
    ]);
    let (fields, step) = PointField::packed(fields);
    (fields, step, intensity)
}

/// `voxels`: one point per voxel, in voxel order (row v of `voxel_features` for hard voxels), with
/// the fields of [`voxels_fields`]; `means` is `[V, C]` (hard voxels' centroids, dynamic voxels'
/// means).
pub fn voxels_message(
    header: &Header,
    means: &[f32],
    names: &[String],
    num_points: &[u32],
    coords: &[[i32; 3]],
) -> CloudMessage {
    let v = num_points.len();
    let c = if v == 0 { names.len() } else { means.len() / v };
    let (fields, step, intensity) = voxels_fields(names, c);
    let mut m = CloudMessage::new(header, 1, v, &fields, step, false);
    for_each_record(m.data_mut(), step as usize, |i, rec| {
        let mean = &means[i * c..(i + 1) * c];
        let [z, y, x] = coords[i].map(|a| a as u32);
        let words = [mean[0].to_bits(), mean[1].to_bits(), mean[2].to_bits()]
            .into_iter()
            .chain(intensity.map(|k| mean[k].to_bits()))
            .chain([num_points[i], z, y, x]);
        for (w, at) in words.zip(rec.chunks_exact_mut(4)) {
            at.copy_from_slice(&w.to_le_bytes());
        }
    });
    m
}

/// What the `voxel_features` message of [`PublishedHardVoxels`] is made of.
#[derive(Debug, Clone, Copy)]
pub struct FeaturesLayout<'a> {
    pub header: &'a Header,
    /// Channel names, x, y, z first (one field each).
    pub names: &'a [String],
    pub dtype: FeaturesDtype,
}

impl FeaturesLayout<'_> {
    /// The fields: one per channel, FLOAT32, or with `Float16` the binary16 bits in UINT16 fields,
    /// packed; and the point step.
    fn fields(&self, num_channels: usize) -> (Vec<PointField>, u32) {
        let field_type = match self.dtype {
            FeaturesDtype::Float32 => Datatype::Float32,
            FeaturesDtype::Float16 => Datatype::Uint16,
        };
        PointField::packed(self.names.iter().take(num_channels).map(|n| (n.as_str(), field_type)))
    }

    /// `voxel_features` for `v` (features not yet written): an organized cloud, height V (one row
    /// per voxel), width P (`max_points_per_voxel`), one field per channel, little endian; the
    /// record bytes (the [V, P, C] array itself) are left as `alloc` gives them. Slots past a
    /// voxel's `num_points` are zero, as a PointPillars network expects them, and make the
    /// message not dense.
    pub fn message(
        &self,
        counts: &HardVoxelCounts,
        (num_channels, max_points): (usize, usize),
        alloc: impl FnOnce(usize) -> MessageBytes,
    ) -> CloudMessage {
        let (fields, step) = self.fields(num_channels);
        let mut m = CloudMessage::in_bytes(self.header, counts.voxels, max_points, &fields, step, false, alloc);
        // Dense when no voxel has an empty (zero) slot.
        m.set_dense(counts.kept_points == counts.voxels * max_points);
        m
    }
}

impl PublishedHardVoxels {
    /// From hard voxels on the host (the CPU backend): the features, in the layout's datatype,
    /// become the `voxel_features` message's records (one copy), the centroids the `voxels`
    /// message.
    pub fn from_host(voxels: &HardVoxels, layout: &FeaturesLayout<'_>) -> Self {
        let centroids = hard_centroids(voxels);
        let converted: Vec<u8>;
        let records: &[u8] = match layout.dtype {
            FeaturesDtype::Float32 if cfg!(target_endian = "little") => bytemuck::cast_slice(&voxels.features),
            FeaturesDtype::Float32 => {
                converted = voxels.features.iter().flat_map(|f| f.to_le_bytes()).collect();
                &converted
            }
            FeaturesDtype::Float16 => {
                converted = features_f16(&voxels.features).iter().flat_map(|h| h.to_bits().to_le_bytes()).collect();
                &converted
            }
        };
        let counts = voxels.counts();
        let (fields, step) = layout.fields(voxels.num_channels);
        let dims = (voxels.voxel_count(), voxels.max_points);
        let mut features = CloudMessage::from_records(layout.header, dims, &fields, step, false, records);
        features.set_dense(counts.kept_points == counts.voxels * voxels.max_points);
        let names = &layout.names[..voxels.num_channels.min(layout.names.len())];
        let voxels_message = voxels_message(layout.header, &centroids, names, &voxels.num_points, &voxels.coords);
        Self { counts, voxels: voxels_message, features }
    }
}

/// `[V, C]` centroids of hard voxels: per voxel and channel, the f64 sum of its kept slots in
/// slot order (starting from -0.0, the neutral element of Rust's float `Sum`; NaN as
/// [`add_keeping_nan`]), divided by the
/// count in f64 and rounded to f32. The CUDA kernel `vox_centroids` computes the same bits.
pub fn hard_centroids(v: &HardVoxels) -> Vec<f32> {
    let (c, p) = (v.num_channels, v.max_points);
    let mut means = vec![0.0f32; v.num_points.len() * c];
    if c > 0 {
        means.par_chunks_mut(c).zip(&v.num_points).enumerate().for_each(|(vi, (mean, &n))| {
            for (ch, m) in mean.iter_mut().enumerate() {
                let mut sum = -0.0f64;
                for slot in 0..n as usize {
                    add_keeping_nan(&mut sum, v.features[(vi * p + slot) * c + ch] as f64);
                }
                *m = (sum / n.max(1) as f64) as f32;
            }
        });
    }
    means
}

/// fp16 copies of float features (round to nearest even, `half::f16::from_f32`) for fp16 networks,
/// as the GPU backend emits them ([`cuda::GpuVoxelizer::hard_features_f16`]); geometry and
/// distances stay f32.
pub fn features_f16(features: &[f32]) -> Vec<half::f16> {
    features.iter().map(|&v| half::f16::from_f32(v)).collect()
}
