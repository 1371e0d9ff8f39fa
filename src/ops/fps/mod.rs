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
    let mut min_dist = Vec::new();
    fps_slices(points.x(), points.y(), points.z(), params.start_index, &mut indices, &mut min_dist);
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
        let mut min_dist = Vec::new();
        for (j, row) in rows.chunks_mut(k).enumerate() {
            let r = offsets[b0 + j]..offsets[b0 + j + 1];
            fps_slices(&x[r.clone()], &y[r.clone()], &z[r], params.start_index, row, &mut min_dist);
        }
    });
    Ok(BatchedFps { indices, offsets, num_samples: k })
}

/// `min_dist` value marking a selected point: below every distance, never lowered.
const SELECTED: f32 = -1.0;

/// FPS of one cloud into `out` (pre-filled with -1, length K). `start < x.len()` unless empty.
fn fps_slices(x: &[f32], y: &[f32], z: &[f32], start: usize, out: &mut [i32], min_dist: &mut Vec<f32>) {
    let n = x.len();
    if n == 0 || out.is_empty() {
        return;
    }
    min_dist.clear();
    min_dist.resize(n, f32::INFINITY);
    let (y, z) = (&y[..n], &z[..n]);
    let mut last = start;
    out[0] = last as i32;
    min_dist[last] = SELECTED;
    for slot in out.iter_mut().take(n).skip(1) {
        let p = [x[last], y[last], z[last]];
        last = fps_step(x, y, z, min_dist, p);
        min_dist[last] = SELECTED;
        *slot = last as i32;
    }
}

const LANES: usize = 8;

/// Lowers `min_dist` with the distances to `p` and returns the argmax (ties to the lowest index)
/// over the unselected points. Two passes that vectorize: (1) update and maximum value, (2) the
/// first index holding that value. `min_dist` is never NaN, selected points hold -1 and at least
/// one point is unselected (its value is >= 0), so the first index equal to the maximum is the
/// lowest-index unselected argmax.
#[inline(never)]
fn fps_step(x: &[f32], y: &[f32], z: &[f32], min_dist: &mut [f32], p: [f32; 3]) -> usize {
    let n = x.len();
    let (y, z, min_dist) = (&y[..n], &z[..n], &mut min_dist[..n]);
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut xc = x.chunks_exact(LANES);
    let mut yc = y.chunks_exact(LANES);
    let mut zc = z.chunks_exact(LANES);
    let mut mc = min_dist.chunks_exact_mut(LANES);
    for (((xs, ys), zs), ms) in (&mut xc).zip(&mut yc).zip(&mut zc).zip(&mut mc) {
        for l in 0..LANES {
            let d = dist2([xs[l], ys[l], zs[l]], p);
            let m = if d < ms[l] { d } else { ms[l] };
            ms[l] = m;
            best[l] = if m > best[l] { m } else { best[l] };
        }
    }
    for (((xv, yv), zv), mv) in xc.remainder().iter().zip(yc.remainder()).zip(zc.remainder()).zip(mc.into_remainder()) {
        let d = dist2([*xv, *yv, *zv], p);
        let m = if d < *mv { d } else { *mv };
        *mv = m;
        best[0] = if m > best[0] { m } else { best[0] };
    }
    let mut bv = f32::NEG_INFINITY;
    for v in best {
        bv = if v > bv { v } else { bv };
    }
    first_equal(min_dist, bv)
}

/// Index of the first element equal to `v` (present).
#[inline(always)]
fn first_equal(a: &[f32], v: f32) -> usize {
    let mut chunks = a.chunks_exact(LANES * 4);
    let mut base = 0;
    for c in &mut chunks {
        let mut any = false;
        for e in c {
            any |= *e == v;
        }
        if any {
            return base + c.iter().position(|e| *e == v).unwrap();
        }
        base += LANES * 4;
    }
    base + chunks.remainder().iter().position(|e| *e == v).expect("an unselected point")
}
