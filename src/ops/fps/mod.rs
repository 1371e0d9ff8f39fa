//! Farthest point sampling (FPS), single cloud and batched ragged clouds.
//!
//! Distances are [`dist2`] (squared Euclidean in f32, `(dx*dx + dy*dy) + dz*dz`, no FMA); see
//! [`crate::ops::neighbors`] for the exact arithmetic a GPU port must reproduce.

pub mod cuda;

pub use super::neighbors::dist2;
use super::neighbors::{for_each_row_block, MAX_POINTS};
use super::{ParamError, Validate};
use crate::cloud::Cloud;
use serde::{Deserialize, Serialize};

/// Parameters of [`farthest_point_sample`] and [`farthest_point_sample_batched`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FpsParams {
    /// Samples per cloud (K), >= 1. May exceed the cloud size (the rest is -1).
    pub num_samples: usize,
    /// First sample (index local to each cloud). Default 0.
    #[serde(default)]
    pub start_index: usize,
}

impl FpsParams {
    /// The parameters are valid for a cloud of `n` points (every backend checks this first).
    pub fn check_cloud(&self, n: usize) -> Result<(), ParamError> {
        self.validate()?;
        if n > MAX_POINTS {
            return Err(ParamError::new("points", n, "at most 2147483647 (2^31 - 1) points, indices are i32"));
        }
        if n > 0 && self.start_index >= n {
            return Err(ParamError::new(
                "start_index",
                self.start_index,
                &format!("must be less than the number of points ({n})"),
            ));
        }
        Ok(())
    }
}

impl Validate for FpsParams {
    fn validate(&self) -> Result<(), ParamError> {
        if self.num_samples == 0 || self.num_samples > MAX_POINTS {
            return Err(ParamError::new("num_samples", self.num_samples, "1 ..= 2147483647"));
        }
        Ok(())
    }
}

/// Output of [`farthest_point_sample`].
#[derive(Debug, Clone, PartialEq)]
pub struct FpsOutput {
    /// `num_samples` point indices in selection order; -1 after all N points are taken.
    pub indices: Vec<i32>,
}

/// Output of [`farthest_point_sample_batched`].
#[derive(Debug, Clone, PartialEq)]
pub struct BatchedFps {
    /// `[B, num_samples]` row-major; row b holds indices local to cloud b (add `offsets[b]` for
    /// an index into the whole cloud), -1 padded.
    pub indices: Vec<i32>,
    /// `B + 1` prefix sums of `lengths`: cloud b is points `offsets[b] .. offsets[b + 1]`.
    pub offsets: Vec<usize>,
    /// Row width (= num_samples).
    pub num_samples: usize,
}

/// Farthest point sampling over x, y, z of `points` (other channels ignored).
///
/// With N points and K = `num_samples`:
/// - `indices[0] = start_index`; `min_dist[i] = +inf` for every i initially.
/// - For j = 1 .. min(K, N): with `s = indices[j - 1]`, for every point i set
///   `min_dist[i] = d` if `d < min_dist[i]`, where `d = dist2(points[i], points[s])` ([`dist2`]);
///   then `indices[j]` = the not-yet-selected point with the largest `min_dist`, ties to the
///   lowest index (comparisons of f32 values; `min_dist` is never NaN because NaN distances never
///   replace it).
/// - `indices[j] = -1` for j >= N (K > N: all N points are taken first, the PyTorch3D convention).
///
/// Selected indices are therefore distinct. Same rules as PyTorch3D's `sample_farthest_points`
/// CPU code (same distance expression, strict `<` update, first maximum) with the same start
/// index, except: PyTorch3D gives selected points distance 0 and takes the first maximum over
/// all points, so once only duplicates of selected points remain (largest `min_dist` 0) it may
/// return an already selected index, where we take the lowest unselected one; and it starts
/// `min_dist` at `f32::MAX`, not `+inf` (differs only for distances that overflow). mmcv's
/// `furthest_point_sample` starts at 0 but skips points with `x^2 + y^2 + z^2 <= 1e-3`; this
/// operator does not.
///
/// Non-finite coordinates are not rejected: their distances are NaN (never lower `min_dist`) or
/// `+inf`, so such points keep `min_dist = +inf` and are taken right after the start point; drop
/// them beforehand.
///
/// Errors: `N > 0` and `start_index >= N`; more than 2^31 - 1 points; invalid `params`.
/// `N == 0` gives K times -1.
pub fn farthest_point_sample(points: &Cloud, params: &FpsParams) -> Result<FpsOutput, ParamError> {
    params.check_cloud(points.len())?;
    let mut indices = vec![-1i32; params.num_samples];
    let mut blocks = SpatialBlocks::default();
    fps_slices(points.x(), points.y(), points.z(), params.start_index, &mut indices, &mut blocks);
    Ok(FpsOutput { indices })
}

/// [`farthest_point_sample`] on each of several clouds stored back to back in `points`.
///
/// Cloud b is points `offsets[b] .. offsets[b] + lengths[b]` with `offsets` the prefix sums of
/// `lengths`; it is sampled exactly as [`farthest_point_sample`] would sample it alone, with
/// `start_index` local to the cloud; its row of `indices` holds local indices. Empty clouds give
/// rows of -1. Clouds are processed in parallel (results do not depend on the thread count).
///
/// Errors: `sum(lengths) != points.len()`; a non-empty cloud with `start_index >= lengths[b]`
/// (key `start_index`, names the cloud); a cloud of more than 2^31 - 1 points; invalid `params`.
pub fn farthest_point_sample_batched(
    points: &Cloud,
    lengths: &[usize],
    params: &FpsParams,
) -> Result<BatchedFps, ParamError> {
    params.validate()?;
    let mut offsets = Vec::with_capacity(lengths.len() + 1);
    offsets.push(0usize);
    for &l in lengths {
        let next = offsets.last().unwrap().checked_add(l);
        offsets.push(next.ok_or_else(|| ParamError::new("lengths", "overflow", "sum of lengths = number of points"))?);
    }
    let total = *offsets.last().unwrap();
    if total != points.len() {
        return Err(ParamError::new(
            "lengths",
            format!("sum {total}"),
            &format!("sum of lengths = number of points ({})", points.len()),
        ));
    }
    for (b, &l) in lengths.iter().enumerate() {
        if l > MAX_POINTS {
            return Err(ParamError::new("lengths", l, "each at most 2147483647 (2^31 - 1) points, indices are i32"));
        }
        if l > 0 && params.start_index >= l {
            return Err(ParamError::new(
                "start_index",
                params.start_index,
                &format!("must be less than the number of points of every non-empty cloud (cloud {b} has {l})"),
            ));
        }
    }
    let k = params.num_samples;
    let nb = lengths.len();
    let mut indices = vec![-1i32; nb * k];
    let (x, y, z) = (points.x(), points.y(), points.z());
    let mut unit = vec![(); nb];
    for_each_row_block(nb, &mut indices, k, &mut unit, 1, 1, |b0, rows, _| {
        let mut blocks = SpatialBlocks::default();
        for (j, row) in rows.chunks_mut(k).enumerate() {
            let r = offsets[b0 + j]..offsets[b0 + j + 1];
            fps_slices(&x[r.clone()], &y[r.clone()], &z[r], params.start_index, row, &mut blocks);
        }
    });
    Ok(BatchedFps { indices, offsets, num_samples: k })
}

/// `min_dist` value marking a selected point: below every distance, never lowered.
const SELECTED: f32 = -1.0;

/// Points per block of the spatial order: small enough that a block's box is tight, large enough
/// that the per-block bookkeeping stays a small part of a pass.
const BLOCK: usize = 128;
/// Blocks per group: groups are tested first, so that a pass visits a few dozen groups and the
/// blocks of the few groups the sample can reach (on a 107k scan 2 % of the blocks are computed).
const GROUP: usize = 32;

/// FPS of one cloud into `out` (pre-filled with -1, length K). `start < x.len()` unless empty.
///
/// The rules of [`farthest_point_sample`], computed with less work: the points are put in Morton
/// order and cut into blocks of [`BLOCK`] (and groups of [`GROUP`] blocks) with their bounding
/// boxes, each knowing its largest `min_dist` and where. A new sample can lower no `min_dist` of a
/// block whose box is at least that far from it: the box distance (per axis the gap to the box, squared and summed like [`dist2`])
/// is, in f32 too, at most the distance to any point inside (subtraction, squaring and addition
/// round monotonically), and the update is a strict `<`. Such blocks are skipped, which late in a
/// sampling is most of them. The result is the same as the plain pass over every point: the same
/// distances, the same updates, the same argmax with ties to the lowest original index.
fn fps_slices(x: &[f32], y: &[f32], z: &[f32], start: usize, out: &mut [i32], blocks: &mut SpatialBlocks) {
    let n = x.len();
    if n == 0 || out.is_empty() {
        return;
    }
    blocks.build(x, &y[..n], &z[..n]);
    let mut last = start;
    out[0] = last as i32;
    blocks.select(last);
    for slot in out.iter_mut().take(n).skip(1) {
        last = blocks.step([x[last], y[last], z[last]]);
        blocks.select(last);
        *slot = last as i32;
    }
}

/// The points of one cloud in Morton order, in blocks with bounding boxes and per-block maxima of
/// `min_dist` (reused across clouds and frames).
#[derive(Default)]
pub(crate) struct SpatialBlocks {
    /// Point data in block order: x, y, z, then min_dist and the original index.
    xyz: [Vec<f32>; 3],
    min_dist: Vec<f32>,
    index: Vec<u32>,
    /// Position in block order of each original index.
    position: Vec<u32>,
    /// Per block: box corners, largest min_dist and its lowest original index.
    lo: Vec<[f32; 3]>,
    hi: Vec<[f32; 3]>,
    best: Vec<f32>,
    best_index: Vec<u32>,
    /// The same per group of blocks.
    group_lo: Vec<[f32; 3]>,
    group_hi: Vec<[f32; 3]>,
    group_best: Vec<f32>,
    group_best_index: Vec<u32>,
    keys: Vec<u64>,
}

/// Interleaves the low 10 bits of `v` with two zero bits between each.
fn spread10(v: u32) -> u32 {
    let mut v = v & 0x3ff;
    v = (v | (v << 16)) & 0x0300_00ff;
    v = (v | (v << 8)) & 0x0300_f00f;
    v = (v | (v << 4)) & 0x030c_30c3;
    (v | (v << 2)) & 0x0924_9249
}

/// The largest of `values` and, among its equals, the lowest of `indices` (the maxima of blocks or
/// groups with their lowest original indices: the argmax rule of [`farthest_point_sample`]).
fn top(values: &[f32], indices: &[u32]) -> (f32, u32) {
    values.iter().zip(indices).fold((f32::NEG_INFINITY, u32::MAX), |(v, i), (&w, &j)| {
        if w > v || (w == v && j < i) {
            (w, j)
        } else {
            (v, i)
        }
    })
}

/// [`top`] of a block, in [`TOP_LANES`] interleaved partial results and then over them. The order
/// it maximises (larger value, then lower index) is total on values that are not NaN, so any
/// grouping finds the same entry; the lanes let the compiler keep them in vector registers (the
/// test is branch-free, `|` and `&` rather than `||` and `&&`, or it stays scalar).
#[inline(always)]
fn top_lanes(values: &[f32], indices: &[u32]) -> (f32, u32) {
    let mut value = [f32::NEG_INFINITY; TOP_LANES];
    let mut index = [u32::MAX; TOP_LANES];
    for (vs, is) in values.chunks_exact(TOP_LANES).zip(indices.chunks_exact(TOP_LANES)) {
        for l in 0..TOP_LANES {
            let take = (vs[l] > value[l]) | ((vs[l] == value[l]) & (is[l] < index[l]));
            value[l] = if take { vs[l] } else { value[l] };
            index[l] = if take { is[l] } else { index[l] };
        }
    }
    let whole = values.len() / TOP_LANES * TOP_LANES;
    let (lv, li) = top(&value, &index);
    let (rv, ri) = top(&values[whole..], &indices[whole..]);
    top(&[lv, rv], &[li, ri])
}

/// Lanes of [`top_lanes`].
const TOP_LANES: usize = 8;

/// Squared distance from `q` to the box `[lo, hi]` (0 inside), arranged as [`dist2`].
#[inline(always)]
fn box_dist2(q: [f32; 3], lo: [f32; 3], hi: [f32; 3]) -> f32 {
    let gap = |a: usize| {
        let below = lo[a] - q[a];
        let above = q[a] - hi[a];
        if below > 0.0 {
            below
        } else if above > 0.0 {
            above
        } else {
            0.0
        }
    };
    let (gx, gy, gz) = (gap(0), gap(1), gap(2));
    (gx * gx + gy * gy) + gz * gz
}

impl SpatialBlocks {
    fn build(&mut self, x: &[f32], y: &[f32], z: &[f32]) {
        let n = x.len();
        let finite = |i: usize| x[i].is_finite() && y[i].is_finite() && z[i].is_finite();
        let (mut lo, mut hi) = ([f32::INFINITY; 3], [f32::NEG_INFINITY; 3]);
        for i in (0..n).filter(|&i| finite(i)) {
            for (a, v) in [x[i], y[i], z[i]].into_iter().enumerate() {
                lo[a] = lo[a].min(v);
                hi[a] = hi[a].max(v);
            }
        }
        // 10 bits per axis over the cloud's box; non-finite points sort last.
        let scale: [f32; 3] = std::array::from_fn(|a| if hi[a] > lo[a] { 1023.0 / (hi[a] - lo[a]) } else { 0.0 });
        self.keys.clear();
        self.keys.extend((0..n).map(|i| {
            let code = if finite(i) {
                let q = |a: usize, v: f32| (((v - lo[a]) * scale[a]) as u32).min(1023);
                spread10(q(0, x[i])) | spread10(q(1, y[i])) << 1 | spread10(q(2, z[i])) << 2
            } else {
                u32::MAX
            };
            (u64::from(code) << 32) | i as u64
        }));
        self.keys.sort_unstable();
        for c in &mut self.xyz {
            c.clear();
        }
        self.index.clear();
        self.position.clear();
        self.position.resize(n, 0);
        for (p, &k) in self.keys.iter().enumerate() {
            let i = k as u32 as usize;
            self.xyz[0].push(x[i]);
            self.xyz[1].push(y[i]);
            self.xyz[2].push(z[i]);
            self.index.push(i as u32);
            self.position[i] = p as u32;
        }
        self.min_dist.clear();
        self.min_dist.resize(n, f32::INFINITY);
        let blocks = n.div_ceil(BLOCK);
        self.lo.clear();
        self.hi.clear();
        for b in 0..blocks {
            let r = b * BLOCK..((b + 1) * BLOCK).min(n);
            let (mut l, mut h) = ([f32::INFINITY; 3], [f32::NEG_INFINITY; 3]);
            for p in r {
                for a in 0..3 {
                    let v = self.xyz[a][p];
                    // A NaN coordinate opens the box to everything: such a block is never skipped.
                    l[a] = if v.is_nan() { f32::NEG_INFINITY } else { l[a].min(v) };
                    h[a] = if v.is_nan() { f32::INFINITY } else { h[a].max(v) };
                }
            }
            self.lo.push(l);
            self.hi.push(h);
        }
        self.best.clear();
        self.best_index.clear();
        self.best.resize(blocks, 0.0);
        self.best_index.resize(blocks, 0);
        for b in 0..blocks {
            self.refresh(b);
        }
        let groups = blocks.div_ceil(GROUP);
        self.group_lo.clear();
        self.group_hi.clear();
        for g in 0..groups {
            let r = g * GROUP..((g + 1) * GROUP).min(blocks);
            let lo = self.lo[r.clone()].iter().fold([f32::INFINITY; 3], |a, l| std::array::from_fn(|k| a[k].min(l[k])));
            let hi = self.hi[r].iter().fold([f32::NEG_INFINITY; 3], |a, h| std::array::from_fn(|k| a[k].max(h[k])));
            self.group_lo.push(lo);
            self.group_hi.push(hi);
        }
        self.group_best.clear();
        self.group_best_index.clear();
        self.group_best.resize(groups, 0.0);
        self.group_best_index.resize(groups, 0);
        for g in 0..groups {
            self.refresh_group(g);
        }
    }

    /// Recomputes group `g`'s largest `min_dist` and its lowest original index from its blocks.
    fn refresh_group(&mut self, g: usize) {
        let r = g * GROUP..((g + 1) * GROUP).min(self.best.len());
        (self.group_best[g], self.group_best_index[g]) = top_lanes(&self.best[r.clone()], &self.best_index[r]);
    }

    /// Recomputes block `b`'s largest `min_dist` and its lowest original index.
    #[inline(always)]
    fn refresh(&mut self, b: usize) {
        let r = b * BLOCK..((b + 1) * BLOCK).min(self.min_dist.len());
        (self.best[b], self.best_index[b]) = top_lanes(&self.min_dist[r.clone()], &self.index[r]);
    }

    /// Marks original point `i` selected.
    fn select(&mut self, i: usize) {
        let p = self.position[i] as usize;
        self.min_dist[p] = SELECTED;
        self.refresh(p / BLOCK);
        self.refresh_group(p / BLOCK / GROUP);
    }

    /// Lowers `min_dist` with the distances to `q` and returns the unselected point with the
    /// largest `min_dist`, ties to the lowest original index (one exists: `min_dist` is never NaN,
    /// selected points hold -1 and unselected ones at least 0).
    fn step(&mut self, q: [f32; 3]) -> usize {
        let n = self.min_dist.len();
        let blocks = self.best.len();
        for g in 0..self.group_best.len() {
            // A box at least as far as the largest min_dist inside cannot lower any of them. `>=`
            // is false for a NaN bound (a NaN sample): the group is then computed, which changes
            // nothing (NaN distances never lower min_dist).
            if box_dist2(q, self.group_lo[g], self.group_hi[g]) >= self.group_best[g] {
                continue;
            }
            for b in g * GROUP..((g + 1) * GROUP).min(blocks) {
                if box_dist2(q, self.lo[b], self.hi[b]) >= self.best[b] {
                    continue;
                }
                let r = b * BLOCK..((b + 1) * BLOCK).min(n);
                let [xs, ys, zs] = &self.xyz;
                let (xs, ys, zs) = (&xs[r.clone()], &ys[r.clone()], &zs[r.clone()]);
                for (((m, &px), &py), &pz) in self.min_dist[r].iter_mut().zip(xs).zip(ys).zip(zs) {
                    let d = dist2([px, py, pz], q);
                    *m = if d < *m { d } else { *m };
                }
                self.refresh(b);
            }
            self.refresh_group(g);
        }
        top(&self.group_best, &self.group_best_index).1 as usize
    }
}

#[cfg(test)]
mod tests {
    use super::{top, top_lanes};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    // The lanes must find the entry the sequential fold finds, ties (-0.0 == 0.0 included) to the
    // lowest index, at every length around the lane count.
    #[test]
    fn top_lanes_is_top() {
        let mut rng = StdRng::seed_from_u64(9);
        let pool = [-1.0f32, -0.0, 0.0, 0.5, 2.0, 2.0, f32::INFINITY];
        for len in 0..300 {
            let values: Vec<f32> = (0..len).map(|_| pool[rng.random_range(0..pool.len())]).collect();
            let mut indices: Vec<u32> = (0..len as u32).map(|i| i * 7 + 3).collect();
            for i in (1..indices.len()).rev() {
                indices.swap(i, rng.random_range(0..=i));
            }
            let (a, b) = (top(&values, &indices), top_lanes(&values, &indices));
            assert_eq!((a.0.to_bits(), a.1), (b.0.to_bits(), b.1), "length {len}");
        }
    }
}
