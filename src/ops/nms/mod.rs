//! Non-maximum suppression of BEV boxes: axis-aligned IoU (torchvision), rotated BEV IoU and
//! CenterPoint's circle NMS.
//!
//! # Semantics of [`nms`]
//!
//! 1. **Checks.** `boxes` and `scores` must have the same length; `classes` must too, except that
//!    it may be empty when `class_aware` is false (otherwise [`NmsError::LengthMismatch`], naming
//!    the three lengths). A NaN score is an error ([`NmsError::NanScore`], with its index): NaN
//!    scores are never dropped silently. Every box is checked for the fields its kind reads
//!    ([`NmsError::InvalidBox`]): `x`, `y` finite (all kinds); `length`, `width` finite and `>= 0`
//!    (IoU kinds); `|yaw| <= MAX_ABS_YAW` (rotated only). `z` and `height` are never read.
//! 2. **Candidates.** The boxes with `score >= score_threshold`, sorted by score descending, ties
//!    broken by ascending input index (a stable descending sort, torchvision.ops.nms's order;
//!    `-0.0` and `+0.0` compare equal, so they tie). `pre_max_size` keeps the first that many.
//!    [`NmsOutput::candidates`] is the number left.
//! 3. **Greedy sweep.** In that order, a candidate is kept unless an earlier *kept* candidate
//!    suppresses it (only a kept box of the same class when `class_aware`). `suppresses(kept, c)`
//!    is the kind's test below, always evaluated with the higher-ranked kept box first. The sweep
//!    stops once `post_max_size` boxes are kept (the same as truncating the full keep list).
//! 4. **Output.** [`NmsOutput::keep`] holds the input indices of the kept boxes in rank order.
//!
//! There is no cap on the number of boxes (beyond `u32` indices). The CPU sweep visits only pairs
//! whose bounding intervals meet (a BEV grid); every pair it skips provably fails the test, so
//! the result is exactly the O(n^2) greedy one. For RotatedBev it also skips pairs whose IoU
//! bound `fl(m / fl(S - m))` (`m = min(a.area, b.area)`, `S = a.area + b.area`) is not above the
//! threshold: the computed IoU is non-decreasing in the clamped `inter <= m`, so the decision is
//! the same (a GPU kernel may use or omit this shortcut).
//!
//! # Overlap tests (exact f32 arithmetic)
//!
//! Every formula below is a fixed sequence of IEEE-754 binary32 operations, round to nearest
//! even, no fused multiply-add, no flush-to-zero, parenthesised exactly as written. `min`/`max`
//! are IEEE minNum/maxNum (Rust `f32::min`/`max`, CUDA `fminf`/`fmaxf`), `|v|` is the sign-bit
//! clear. A CUDA kernel reproduces the keep list bit for bit by transcribing them op for op with
//! `__fmul_rn`/`__fadd_rn`/`__fsub_rn`/`__fdiv_rn` (or nvrtc `--fmad=false --prec-div=true
//! --ftz=false`, never `--use_fast_math`), because nvcc contracts `a*b+c` into an FMA by default.
//!
//! **AxisAligned** (torchvision `box_iou`/`nms`, yaw ignored). Per box, once:
//! `hl = length*0.5`, `hw = width*0.5`, `x1 = x-hl`, `x2 = x+hl`, `y1 = y-hw`, `y2 = y+hw`,
//! `area = (x2-x1)*(y2-y1)`. Per pair (a kept, b candidate):
//! `w = max(0, min(a.x2,b.x2) - max(a.x1,b.x1))`, `h = max(0, min(a.y2,b.y2) - max(a.y1,b.y1))`,
//! `inter = w*h`, `union = (a.area+b.area) - inter`, `iou = inter/union` (`iou = 0` when
//! `union <= 0`, i.e. two zero-area boxes: torchvision gets NaN there, which suppresses nothing
//! either). Suppress iff `iou > threshold` (strict, as torchvision).
//!
//! **RotatedBev.** Per box, once: `(s, c) = sincos_f32(yaw)`, `hl = length*0.5`,
//! `hw = width*0.5`, `area = length*width`, `ex = |hl*c| + |hw*s|`, `ey = |hl*s| + |hw*c|`,
//! `xmin = x-ex`, `xmax = x+ex`, `ymin = y-ey`, `ymax = y+ey`. Per pair (a kept, b candidate),
//! see [`iou_rotated_bev`]:
//! 1. `iou = 0` if `a.area == 0` or `b.area == 0` (zero-area boxes never suppress nor are
//!    suppressed), or if the bounding rectangles do not overlap strictly:
//!    `!(min(a.xmax,b.xmax) > max(a.xmin,b.xmin))` or the same in y.
//! 2. b in a's frame: `dx = b.x-a.x`, `dy = b.y-a.y`, `px = dx*a.c + dy*a.s`,
//!    `py = dy*a.c - dx*a.s`, `cr = b.c*a.c + b.s*a.s`, `sr = b.s*a.c - b.c*a.s`,
//!    `ux = b.hl*cr`, `uy = b.hl*sr`, `vx = b.hw*sr`, `vy = b.hw*cr`; corners (counter-clockwise)
//!    `P0 = ((px+ux)-vx, (py+uy)+vy)`, `P1 = ((px-ux)-vx, (py-uy)+vy)`,
//!    `P2 = ((px-ux)+vx, (py-uy)-vy)`, `P3 = ((px+ux)+vx, (py+uy)-vy)`.
//! 3. Frame bound (decided before the clip, on both backends): `O(a, b) = ox*oy` with, in a's
//!    frame as in step 2, `ex = |b.hl*cr| + |b.hw*sr|`, `ey = |b.hl*sr| + |b.hw*cr|`,
//!    `ox = max(0, min(a.hl, px+ex) - max(-a.hl, px-ex))`, `oy` the same with `py`, `ey`, `a.hw`;
//!    `bound = min(O(a, b), O(b, a))`. The pair does not suppress unless
//!    `(bound / ((a.area+b.area) - bound)) * 1.0009765625 > threshold`. The intersection lies in
//!    a and in b's bounding rectangle in a's frame (and the same in b's), so up to rounding
//!    `bound >= inter` and the IoU cannot pass; the 2^-10 margin covers the rounding (the test
//!    `frame_bound_never_rejects_a_suppressing_pair` checks it). Most pairs of a cluster of
//!    jittered detections stop here instead of in the clip.
//! 4. Sutherland-Hodgman: clip `[P0..P3]` by `x <= a.hl`, then `y <= a.hw`, then `x >= -a.hl`,
//!    then `y >= -a.hw` (inside tests inclusive). One clip walks the edges `p -> q` with
//!    `p = V[(k+n-1)%n]`, `q = V[k]` for `k = 0..n`: if `inside(p) != inside(q)` emit the crossing
//!    of `p -> q` (for `x = X`: `t = (X-p.x)/(q.x-p.x)`, point `(X, p.y + t*(q.y-p.y))`; for
//!    `y = Y`: `t = (Y-p.y)/(q.y-p.y)`, point `(p.x + t*(q.x-p.x), Y)`); then if `inside(q)` emit
//!    `q`. At most 19 vertices can result, whatever the rounding (4 -> 6 -> 9 -> 13 -> 19).
//! 5. `inter = 0` if fewer than 3 vertices remain; else shoelace
//!    `acc = 0; for k in 0..n { acc = acc + (V[k].x*V[k1].y - V[k1].x*V[k].y) }` with
//!    `k1 = (k+1)%n`, and `inter = min(max(acc, 0)*0.5, min(a.area, b.area))`.
//! 6. `union = (a.area+b.area) - inter`, `iou = inter/union`. Suppress iff `iou > threshold`.
//!
//! **Circle** (CenterPoint `circle_nms`). `dx = a.x-b.x`, `dy = a.y-b.y`,
//! `d2 = dx*dx + dy*dy`, `t2 = threshold*threshold`; suppress iff `d2 <= t2`. CenterPoint's
//! `circle_nms(dets, thresh)` also suppresses when the *squared* distance is `<= thresh`, and its
//! config passes `min_radius` straight in as `thresh`: so its "radius" is really a squared
//! distance. Here `threshold` is a distance in metres; CenterPoint's `min_radius = r` is
//! `threshold = sqrt(r)`. (CenterPoint sorts with numpy's unstable argsort; ties here follow the
//! rule above.)

pub mod cuda;

use super::{ParamError, Validate};
use serde::{Deserialize, Serialize};

/// A 3D box: centre `(x, y, z)`, extents `length` along the box's own x axis (at `yaw`),
/// `width` along its y axis, `height` along z, and `yaw` about +z from +x (radians, CCW).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Box3d {
    pub x: f32,
    pub y: f32,
    pub z: f32,
    pub length: f32,
    pub width: f32,
    pub height: f32,
    pub yaw: f32,
}

// 7 f32, no padding: one box of the kernels' input (`nms_prep` in cuda/nms.cu reads `boxes + 7 * i`).
const _: () = assert!(std::mem::size_of::<Box3d>() == 28);

impl Box3d {
    pub const fn new(x: f32, y: f32, z: f32, length: f32, width: f32, height: f32, yaw: f32) -> Self {
        Self { x, y, z, length, width, height, yaw }
    }

    /// The axis-aligned BEV corner form `[x1, y1, x2, y2]` used by [`NmsKind::AxisAligned`]
    /// (yaw ignored): `x1 = x - length*0.5`, `x2 = x + length*0.5`, same in y with `width`.
    pub fn bev_xyxy(&self) -> [f32; 4] {
        let p = aa_prep(self);
        [p.x1, p.y1, p.x2, p.y2]
    }
}

/// Which overlap test suppresses (see the module documentation for the exact formulas).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NmsKind {
    /// BEV IoU of the axis-aligned rectangles (yaw ignored), torchvision's formula.
    AxisAligned,
    /// Exact BEV IoU of the rotated rectangles.
    RotatedBev,
    /// CenterPoint circle NMS on the BEV centre distance.
    Circle,
}

/// Parameters of [`nms`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NmsParams {
    pub kind: NmsKind,
    /// IoU kinds: suppress when IoU > threshold, in (0, 1]. Circle: suppress when the BEV centre
    /// distance is <= threshold, in metres, > 0.
    pub threshold: f32,
    /// Candidates are the boxes with `score >= score_threshold`. Default `-inf` (no threshold).
    #[serde(default = "neg_inf")]
    pub score_threshold: f32,
    /// Keep only the first this many candidates in score order (>= 1; default: all).
    #[serde(default)]
    pub pre_max_size: Option<usize>,
    /// Return at most this many boxes (>= 1; default: all).
    #[serde(default)]
    pub post_max_size: Option<usize>,
    /// Only boxes of the same class suppress each other.
    #[serde(default)]
    pub class_aware: bool,
}

fn neg_inf() -> f32 {
    f32::NEG_INFINITY
}

impl NmsParams {
    /// `kind` and `threshold`, no score threshold, no size caps, class-agnostic.
    pub fn new(kind: NmsKind, threshold: f32) -> Self {
        Self {
            kind,
            threshold,
            score_threshold: f32::NEG_INFINITY,
            pre_max_size: None,
            post_max_size: None,
            class_aware: false,
        }
    }
}

impl Validate for NmsParams {
    fn validate(&self) -> Result<(), ParamError> {
        let t = self.threshold;
        match self.kind {
            NmsKind::AxisAligned | NmsKind::RotatedBev => {
                if !(t > 0.0 && t <= 1.0) {
                    return Err(ParamError::new("threshold", t, "IoU threshold must be in (0, 1]"));
                }
            }
            NmsKind::Circle => {
                if !(t > 0.0 && t.is_finite()) {
                    return Err(ParamError::new(
                        "threshold",
                        t,
                        "circle distance threshold must be finite and > 0 (metres)",
                    ));
                }
            }
        }
        if self.score_threshold.is_nan() {
            return Err(ParamError::new("score_threshold", self.score_threshold, "must not be NaN"));
        }
        if self.pre_max_size == Some(0) {
            return Err(ParamError::new("pre_max_size", 0, "must be >= 1 or absent"));
        }
        if self.post_max_size == Some(0) {
            return Err(ParamError::new("post_max_size", 0, "must be >= 1 or absent"));
        }
        Ok(())
    }
}

/// Result of [`nms`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NmsOutput {
    /// Input indices of the kept boxes, in score order (rank order).
    pub keep: Vec<u32>,
    /// Number of candidates after the score threshold and `pre_max_size`.
    pub candidates: usize,
}

/// Why [`nms`] refused its input.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum NmsError {
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error(
        "length mismatch: {boxes} boxes, {scores} scores, {classes} classes \
         (classes may be empty only when class_aware is false)"
    )]
    LengthMismatch { boxes: usize, scores: usize, classes: usize },
    #[error("score {index} is NaN")]
    NanScore { index: usize },
    #[error("box {index} is invalid: {reason}")]
    InvalidBox { index: usize, reason: &'static str },
    #[error("{len} boxes: indices must fit in u32")]
    TooManyBoxes { len: usize },
}

/// Largest `|yaw|` accepted by [`NmsKind::RotatedBev`] and for which [`sincos_f32`]'s accuracy
/// bound holds (its range reduction is exact for quadrant numbers below 2^13).
pub const MAX_ABS_YAW: f32 = 8192.0;

// Cody-Waite split of pi/2: C1..C4 have at most 11 significant bits, so k*Ci is exact for
// |k| < 2^13; C5 is the f32 rounding of the rest (pi/2 - C1 - C2 - C3 - C4 ~ 6.1e-17).
const PIO2_C1: f32 = f32::from_bits(0x3fc9_0000); // 1.5703125
const PIO2_C2: f32 = f32::from_bits(0x39fd_a000); // 4.837512969970703e-4
const PIO2_C3: f32 = f32::from_bits(0x33a2_2000); // 7.549533620476723e-8
const PIO2_C4: f32 = f32::from_bits(0x2c34_6000); // 2.5632829192545614e-12
const PIO2_C5: f32 = f32::from_bits(0x248d_3132); // 6.123234262925839e-17
const TWO_OVER_PI: f32 = f32::from_bits(0x3f22_f983); // 0.63661975
                                                      // Taylor coefficients, f32-rounded: sin: -1/3!, 1/5!, -1/7!, 1/9!; cos: 1/4!, -1/6!, 1/8!, -1/10!.
const S3: f32 = f32::from_bits(0xbe2a_aaab);
const S5: f32 = f32::from_bits(0x3c08_8889);
const S7: f32 = f32::from_bits(0xb950_0d01);
const S9: f32 = f32::from_bits(0x3638_ef1d);
const K4: f32 = f32::from_bits(0x3d2a_aaab);
const K6: f32 = f32::from_bits(0xbab6_0b61);
const K8: f32 = f32::from_bits(0x37d0_0d01);
const K10: f32 = f32::from_bits(0xb493_f27e);

/// `(sin(yaw), cos(yaw))` from `+ - * /` and `floor` only, so that the GPU transcribes it op for
/// op (constants by bit pattern, `__int_as_float`) and gets the same bits; `sinf`/`cosf` differ
/// between libm and CUDA in the last bit.
///
/// Range reduction by pi/2 (a quadrant reduction rather than by 2*pi, which keeps the
/// polynomial's interval at +-pi/4 and its relative error small near the zeros of sin and cos):
/// ```text
/// k    = floor(yaw*TWO_OVER_PI + 0.5)
/// a    = (yaw - k*C1) - k*C2                  // exact: k*C1, k*C2 exact, Sterbenz
/// b    = k*C3                                 // exact
/// hi   = a - b;  v = hi - a;  lo = (a - (hi - v)) - (b + v)        // TwoSum, hi+lo = a-b
/// lo   = (lo - k*C4) - k*C5
/// r_hi = hi + lo;  v = r_hi - hi;  r_lo = (hi - (r_hi - v)) + (lo - v)   // TwoSum
/// q    = k - 4*floor(k*0.25)                  // quadrant 0..3
/// z    = r_hi*r_hi
/// sin_r = r_hi + (r_lo + (z*r_hi) * (S3 + z*(S5 + z*(S7 + z*S9))))
/// cos_r = 1 - (0.5*z - ((z*z) * (K4 + z*(K6 + z*(K8 + z*K10))) - r_hi*r_lo))
/// q=0: ( sin_r,  cos_r)   q=1: ( cos_r, -sin_r)   q=2: (-sin_r, -cos_r)   q=3: (-cos_r, sin_r)
/// ```
/// For `|yaw| <= MAX_ABS_YAW` the products `k*C1..k*C4` are exact and the error of either
/// output is below 1.02 ulp of the true value: measured against f64 `sin`/`cos` over every f32
/// in that range (max 1.0151 ulp for sin, 1.0169 ulp for cos; test/nms.rs `sincos_exhaustive`,
/// ignored by default, and a sampled version that always runs). Beyond that range the result is
/// still deterministic but its accuracy is unspecified; [`nms`] rejects such yaws for
/// [`NmsKind::RotatedBev`]. `sincos_f32(0.0) == (0.0, 1.0)` exactly.
pub fn sincos_f32(yaw: f32) -> (f32, f32) {
    let k = (yaw * TWO_OVER_PI + 0.5).floor();
    // exact for |k| < 2^13: k*C1, k*C2, k*C3, k*C4 are exact and so are both subtractions
    let a = (yaw - k * PIO2_C1) - k * PIO2_C2;
    let b = k * PIO2_C3;
    // TwoSum: hi + lo == a - b exactly
    let hi = a - b;
    let v = hi - a;
    let lo = (a - (hi - v)) - (b + v);
    let lo = (lo - k * PIO2_C4) - k * PIO2_C5;
    // TwoSum again: r_hi + r_lo == hi + lo, |r_lo| <= ulp(r_hi)/2
    let r_hi = hi + lo;
    let v = r_hi - hi;
    let r_lo = (hi - (r_hi - v)) + (lo - v);
    let q = k - 4.0 * (k * 0.25).floor();
    let z = r_hi * r_hi;
    let mut p = S9;
    p = S7 + z * p;
    p = S5 + z * p;
    p = S3 + z * p;
    let sin_r = r_hi + (r_lo + (z * r_hi) * p);
    let mut c = K10;
    c = K8 + z * c;
    c = K6 + z * c;
    c = K4 + z * c;
    let cos_r = 1.0 - (0.5 * z - ((z * z) * c - r_hi * r_lo));
    if q == 0.0 {
        (sin_r, cos_r)
    } else if q == 1.0 {
        (cos_r, -sin_r)
    } else if q == 2.0 {
        (-sin_r, -cos_r)
    } else {
        (-cos_r, sin_r)
    }
}

// ---------------------------------------------------------------------------------------------
// Per-box preparation and pair tests. The public pair functions below build the same
// preparation as `nms`, so they return exactly the values `nms` compares.

#[derive(Debug, Clone, Copy)]
struct AaPrep {
    x1: f32,
    y1: f32,
    x2: f32,
    y2: f32,
    area: f32,
}

#[inline]
fn aa_prep(b: &Box3d) -> AaPrep {
    let hl = b.length * 0.5;
    let hw = b.width * 0.5;
    let x1 = b.x - hl;
    let x2 = b.x + hl;
    let y1 = b.y - hw;
    let y2 = b.y + hw;
    AaPrep { x1, y1, x2, y2, area: (x2 - x1) * (y2 - y1) }
}

#[inline]
fn aa_iou(a: &AaPrep, b: &AaPrep) -> f32 {
    let w = (a.x2.min(b.x2) - a.x1.max(b.x1)).max(0.0);
    let h = (a.y2.min(b.y2) - a.y1.max(b.y1)).max(0.0);
    let inter = w * h;
    let union = (a.area + b.area) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

#[derive(Debug, Clone, Copy)]
struct RotPrep {
    x: f32,
    y: f32,
    s: f32,
    c: f32,
    hl: f32,
    hw: f32,
    area: f32,
    xmin: f32,
    xmax: f32,
    ymin: f32,
    ymax: f32,
}

#[inline]
fn rot_prep(b: &Box3d) -> RotPrep {
    let (s, c) = sincos_f32(b.yaw);
    let hl = b.length * 0.5;
    let hw = b.width * 0.5;
    let ex = (hl * c).abs() + (hw * s).abs();
    let ey = (hl * s).abs() + (hw * c).abs();
    RotPrep {
        x: b.x,
        y: b.y,
        s,
        c,
        hl,
        hw,
        area: b.length * b.width,
        xmin: b.x - ex,
        xmax: b.x + ex,
        ymin: b.y - ey,
        ymax: b.y + ey,
    }
}

/// Vertex capacity of the clipped polygon: 4 -> 6 -> 9 -> 13 -> 19 in the worst case (a clip
/// outputs at most `in + 2*min(in, out)` vertices, whatever the rounding).
const MAX_POLY: usize = 20;

struct Poly {
    x: [f32; MAX_POLY],
    y: [f32; MAX_POLY],
    n: usize,
}

/// One Sutherland-Hodgman step against the line `x = bound` (`on_x`) or `y = bound`, keeping
/// `v <= bound` (`keep_le`) or `v >= bound`.
#[inline(always)]
fn clip(inp: &Poly, out: &mut Poly, on_x: bool, bound: f32, keep_le: bool) {
    let n = inp.n;
    out.n = 0;
    if n == 0 {
        return;
    }
    let inside = |x: f32, y: f32| {
        let v = if on_x { x } else { y };
        if keep_le {
            v <= bound
        } else {
            v >= bound
        }
    };
    let mut px = inp.x[n - 1];
    let mut py = inp.y[n - 1];
    let mut pin = inside(px, py);
    let mut m = 0;
    for k in 0..n {
        let qx = inp.x[k];
        let qy = inp.y[k];
        let qin = inside(qx, qy);
        if pin != qin {
            if on_x {
                let t = (bound - px) / (qx - px);
                out.x[m] = bound;
                out.y[m] = py + t * (qy - py);
            } else {
                let t = (bound - py) / (qy - py);
                out.x[m] = px + t * (qx - px);
                out.y[m] = bound;
            }
            m += 1;
        }
        if qin {
            out.x[m] = qx;
            out.y[m] = qy;
            m += 1;
        }
        px = qx;
        py = qy;
        pin = qin;
    }
    out.n = m;
}

/// b in a's frame (RotatedBev step 2): its centre `(px, py)` and heading `(cr, sr)`.
#[inline]
fn in_frame_of(a: &RotPrep, b: &RotPrep) -> (f32, f32, f32, f32) {
    let dx = b.x - a.x;
    let dy = b.y - a.y;
    (dx * a.c + dy * a.s, dy * a.c - dx * a.s, b.c * a.c + b.s * a.s, b.s * a.c - b.c * a.s)
}

/// `O(a, b)` of the frame bound (module documentation, RotatedBev step 3): b's extent along a's
/// axes overlapped with a's, per axis.
#[inline]
fn rot_frame_overlap(a: &RotPrep, b: &RotPrep) -> f32 {
    let (px, py, cr, sr) = in_frame_of(a, b);
    let ex = (b.hl * cr).abs() + (b.hw * sr).abs();
    let ey = (b.hl * sr).abs() + (b.hw * cr).abs();
    let ox = (a.hl.min(px + ex) - (-a.hl).max(px - ex)).max(0.0);
    let oy = (a.hw.min(py + ey) - (-a.hw).max(py - ey)).max(0.0);
    ox * oy
}

/// RotatedBev step 3: whether the frame bound leaves the pair a chance to suppress (symmetric
/// in a and b; both areas non-zero).
#[inline]
fn rot_frame_bound_passes(a: &RotPrep, b: &RotPrep, t: f32) -> bool {
    let bound = rot_frame_overlap(a, b).min(rot_frame_overlap(b, a));
    (bound / ((a.area + b.area) - bound)) * FRAME_BOUND_MARGIN > t
}

/// `1 + 2^-10` (exact in f32): covers the rounding by which the clipped area may exceed the
/// frame bound.
const FRAME_BOUND_MARGIN: f32 = 1.0 + 1.0 / 1024.0;

#[inline]
fn rot_iou(a: &RotPrep, b: &RotPrep) -> f32 {
    if a.area == 0.0 || b.area == 0.0 {
        return 0.0;
    }
    if !(a.xmax.min(b.xmax) > a.xmin.max(b.xmin)) || !(a.ymax.min(b.ymax) > a.ymin.max(b.ymin)) {
        return 0.0;
    }
    let (px, py, cr, sr) = in_frame_of(a, b);
    let ux = b.hl * cr;
    let uy = b.hl * sr;
    let vx = b.hw * sr;
    let vy = b.hw * cr;
    let mut p = Poly { x: [0.0; MAX_POLY], y: [0.0; MAX_POLY], n: 4 };
    p.x[0] = (px + ux) - vx;
    p.y[0] = (py + uy) + vy;
    p.x[1] = (px - ux) - vx;
    p.y[1] = (py - uy) + vy;
    p.x[2] = (px - ux) + vx;
    p.y[2] = (py - uy) - vy;
    p.x[3] = (px + ux) + vx;
    p.y[3] = (py + uy) - vy;
    let mut q = Poly { x: [0.0; MAX_POLY], y: [0.0; MAX_POLY], n: 0 };
    clip(&p, &mut q, true, a.hl, true);
    clip(&q, &mut p, false, a.hw, true);
    clip(&p, &mut q, true, -a.hl, false);
    clip(&q, &mut p, false, -a.hw, false);
    let n = p.n;
    if n < 3 {
        return 0.0;
    }
    let mut acc = 0.0f32;
    for k in 0..n {
        let k1 = if k + 1 == n { 0 } else { k + 1 };
        acc += p.x[k] * p.y[k1] - p.x[k1] * p.y[k];
    }
    let inter = (acc.max(0.0) * 0.5).min(a.area.min(b.area));
    let union = (a.area + b.area) - inter;
    inter / union
}

#[derive(Debug, Clone, Copy)]
struct CirclePrep {
    x: f32,
    y: f32,
}

#[inline]
fn circle_d2(a: &CirclePrep, b: &CirclePrep) -> f32 {
    let dx = a.x - b.x;
    let dy = a.y - b.y;
    dx * dx + dy * dy
}

/// The AxisAligned IoU exactly as [`nms`] computes it (`kept` is the higher-ranked box).
pub fn iou_axis_aligned(kept: &Box3d, candidate: &Box3d) -> f32 {
    aa_iou(&aa_prep(kept), &aa_prep(candidate))
}

/// The RotatedBev IoU exactly as [`nms`] computes it (`kept` is the higher-ranked box; the
/// formula is not symmetric to the last bit).
pub fn iou_rotated_bev(kept: &Box3d, candidate: &Box3d) -> f32 {
    rot_iou(&rot_prep(kept), &rot_prep(candidate))
}

/// The Circle kind's squared BEV centre distance `dx*dx + dy*dy` with `dx = kept.x - candidate.x`
/// (f32); suppression is `d2 <= threshold*threshold`.
pub fn center_distance_sq(kept: &Box3d, candidate: &Box3d) -> f32 {
    circle_d2(&CirclePrep { x: kept.x, y: kept.y }, &CirclePrep { x: candidate.x, y: candidate.y })
}

// ---------------------------------------------------------------------------------------------
// The sweep.

/// A kind's pair test on ranked candidates, plus closed f64 intervals per rank such that two
/// ranks whose intervals do not intersect (in x or in y) can never suppress one another.
trait Overlap {
    fn bounds(&self, r: usize) -> [f64; 4]; // xlo, xhi, ylo, yhi
    fn suppresses(&self, kept: usize, cand: usize) -> bool;
    /// False when the intervals are not usable (overflow): the sweep then tests every pair.
    fn grid_ok(&self) -> bool {
        true
    }
}

struct AaOverlap {
    p: Vec<AaPrep>,
    t: f32,
}

impl Overlap for AaOverlap {
    // Suppression needs inter > 0, i.e. both extents overlapping strictly: the same f32 values
    // as closed intervals are conservative.
    fn bounds(&self, r: usize) -> [f64; 4] {
        let p = &self.p[r];
        [p.x1 as f64, p.x2 as f64, p.y1 as f64, p.y2 as f64]
    }
    #[inline]
    fn suppresses(&self, kept: usize, cand: usize) -> bool {
        aa_iou(&self.p[kept], &self.p[cand]) > self.t
    }
}

struct RotOverlap {
    p: Vec<RotPrep>,
    t: f32,
}

impl Overlap for RotOverlap {
    // Step 1 of the formula returns 0 unless these f32 rectangles overlap strictly.
    fn bounds(&self, r: usize) -> [f64; 4] {
        let p = &self.p[r];
        [p.xmin as f64, p.xmax as f64, p.ymin as f64, p.ymax as f64]
    }
    #[inline]
    fn suppresses(&self, kept: usize, cand: usize) -> bool {
        let (a, b) = (&self.p[kept], &self.p[cand]);
        if !(a.xmax.min(b.xmax) > a.xmin.max(b.xmin)) || !(a.ymax.min(b.ymax) > a.ymin.max(b.ymin)) {
            return false; // step 1 of the formula, checked first because it is the cheapest
        }
        // Shortcut, same decision: inter <= m = min(a.area, b.area) after the clamp, and
        // fl(inter / fl(S - inter)) is non-decreasing in inter (S = a.area + b.area), so
        // iou <= fl(m / fl(S - m)); when that bound is <= t the pair cannot suppress.
        let m = a.area.min(b.area);
        if !(m / ((a.area + b.area) - m) > self.t) {
            return false;
        }
        rot_frame_bound_passes(a, b, self.t) && rot_iou(a, b) > self.t
    }
}

struct CircleOverlap {
    p: Vec<CirclePrep>,
    t: f32,
    t2: f32,
}

impl Overlap for CircleOverlap {
    // If fl(dx*dx + dy*dy) <= t2 then fl(dx*dx) <= t2 (rounding is monotone), hence
    // |a.x - b.x| <= t*(1 + 2^-21) + 2^-74 (relative errors of three roundings, or underflow);
    // the same in y. Half-widths of 0.5005*t plus a margin for the f64 rounding of x +- R
    // therefore make every suppressing pair's intervals intersect.
    fn bounds(&self, r: usize) -> [f64; 4] {
        let p = &self.p[r];
        let (x, y) = (p.x as f64, p.y as f64);
        let rad = 0.5005 * self.t as f64 + 1e-12 * (1.0 + x.abs().max(y.abs()));
        [x - rad, x + rad, y - rad, y + rad]
    }
    #[inline]
    fn suppresses(&self, kept: usize, cand: usize) -> bool {
        circle_d2(&self.p[kept], &self.p[cand]) <= self.t2
    }
    fn grid_ok(&self) -> bool {
        self.t2.is_finite()
    }
}

/// Below this many candidates the sweep tests every pair.
const BRUTE_MAX: usize = 64;
/// A box covering more grid cells than this goes to a list every kept box scans.
const BIG_CELLS: usize = 16;
/// A kept box covering more grid cells than this scans every later candidate instead.
const QUERY_CELLS: usize = 64;

struct Grid {
    x0: f64,
    y0: f64,
    inv: f64,
    nx: usize,
    ny: usize,
    start: Vec<u32>,
    items: Vec<u32>,
    big: Vec<u32>,
    /// Per rank: first cell column and row of its range. A pair sharing cells is tested only in
    /// the cell (max of the two columns, max of the two rows), which both ranges contain.
    c0: Vec<(u32, u32)>,
}

impl Grid {
    /// Monotone non-decreasing in `v`, clamped to the grid.
    #[inline]
    fn cell(v: f64, v0: f64, inv: f64, n: usize) -> usize {
        let c = ((v - v0) * inv).floor();
        c.max(0.0).min((n - 1) as f64) as usize
    }

    #[inline]
    fn range(&self, b: &[f64; 4]) -> (usize, usize, usize, usize) {
        (
            Self::cell(b[0], self.x0, self.inv, self.nx),
            Self::cell(b[1], self.x0, self.inv, self.nx),
            Self::cell(b[2], self.y0, self.inv, self.ny),
            Self::cell(b[3], self.y0, self.inv, self.ny),
        )
    }

    /// None when some bound is not finite.
    fn build(bounds: &[[f64; 4]]) -> Option<Grid> {
        let m = bounds.len();
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        let mut ext = Vec::with_capacity(m);
        for b in bounds {
            if !b.iter().all(|v| v.is_finite()) {
                return None;
            }
            x0 = x0.min(b[0]);
            x1 = x1.max(b[1]);
            y0 = y0.min(b[2]);
            y1 = y1.max(b[3]);
            ext.push((b[1] - b[0]).max(b[3] - b[2]));
        }
        let span = (x1 - x0).max(y1 - y0);
        if !span.is_finite() {
            return None;
        }
        let mid = m / 2;
        ext.select_nth_unstable_by(mid, |a, b| a.total_cmp(b));
        let mut s = ext[mid].max(span / 4096.0).max(f64::MIN_POSITIVE);
        let max_cells = 4 * m + 64;
        let (nx, ny) = loop {
            let nx = ((x1 - x0) / s).floor() as usize + 1;
            let ny = ((y1 - y0) / s).floor() as usize + 1;
            if nx.saturating_mul(ny) <= max_cells {
                break (nx, ny);
            }
            s *= 1.5;
        };
        let mut g = Grid {
            x0,
            y0,
            inv: 1.0 / s,
            nx,
            ny,
            start: vec![0; nx * ny + 1],
            items: Vec::new(),
            big: Vec::new(),
            c0: Vec::with_capacity(m),
        };
        let mut ranges = Vec::with_capacity(m);
        for b in bounds {
            let r = g.range(b);
            g.c0.push((r.0 as u32, r.2 as u32));
            let cells = (r.1 - r.0 + 1) * (r.3 - r.2 + 1);
            if cells > BIG_CELLS {
                ranges.push(None);
            } else {
                for cy in r.2..=r.3 {
                    for cx in r.0..=r.1 {
                        g.start[cy * nx + cx + 1] += 1;
                    }
                }
                ranges.push(Some(r));
            }
        }
        for c in 0..nx * ny {
            g.start[c + 1] += g.start[c];
        }
        let mut fill: Vec<u32> = g.start[..nx * ny].to_vec();
        g.items = vec![0; g.start[nx * ny] as usize];
        for (rank, r) in ranges.iter().enumerate() {
            match r {
                None => g.big.push(rank as u32),
                Some(r) => {
                    for cy in r.2..=r.3 {
                        for cx in r.0..=r.1 {
                            let c = cy * nx + cx;
                            g.items[fill[c] as usize] = rank as u32;
                            fill[c] += 1;
                        }
                    }
                }
            }
        }
        Some(g)
    }
}

/// Greedy sweep over ranks `0..m`; returns the kept ranks.
fn sweep<O: Overlap>(o: &O, cls: Option<&[i32]>, m: usize, post: usize) -> Vec<usize> {
    let mut sup = vec![false; m];
    let mut keep = Vec::new();
    let same = |i: usize, j: usize| cls.is_none_or(|c| c[i] == c[j]);
    let test = |i: usize, j: usize, sup: &mut [bool]| {
        if !sup[j] && same(i, j) && o.suppresses(i, j) {
            sup[j] = true;
        }
    };
    let grid = if m > BRUTE_MAX && o.grid_ok() {
        let bounds: Vec<[f64; 4]> = (0..m).map(|r| o.bounds(r)).collect();
        Grid::build(&bounds).map(|g| (g, bounds))
    } else {
        None
    };
    for i in 0..m {
        if sup[i] {
            continue;
        }
        keep.push(i);
        if keep.len() >= post {
            break;
        }
        match &grid {
            None => {
                for j in i + 1..m {
                    test(i, j, &mut sup);
                }
            }
            Some((g, bounds)) => {
                let r = g.range(&bounds[i]);
                if (r.1 - r.0 + 1) * (r.3 - r.2 + 1) > QUERY_CELLS {
                    for j in i + 1..m {
                        test(i, j, &mut sup);
                    }
                    continue;
                }
                let (ix0, iy0) = g.c0[i];
                for cy in r.2..=r.3 {
                    for cx in r.0..=r.1 {
                        let c = cy * g.nx + cx;
                        let list = &g.items[g.start[c] as usize..g.start[c + 1] as usize];
                        let from = list.partition_point(|&j| j as usize <= i);
                        for &j in &list[from..] {
                            let (jx0, jy0) = g.c0[j as usize];
                            if ix0.max(jx0) as usize == cx && iy0.max(jy0) as usize == cy {
                                test(i, j as usize, &mut sup);
                            }
                        }
                    }
                }
                let from = g.big.partition_point(|&j| j as usize <= i);
                for &j in &g.big[from..] {
                    test(i, j as usize, &mut sup);
                }
            }
        }
    }
    keep
}

fn check_box(b: &Box3d, kind: NmsKind) -> Result<(), &'static str> {
    if !(b.x.is_finite() && b.y.is_finite()) {
        return Err("x and y must be finite");
    }
    if kind != NmsKind::Circle {
        if !(b.length.is_finite() && b.width.is_finite()) {
            return Err("length and width must be finite");
        }
        if !(b.length >= 0.0 && b.width >= 0.0) {
            return Err("length and width must be >= 0");
        }
    }
    if kind == NmsKind::RotatedBev && !(b.yaw.abs() <= MAX_ABS_YAW) {
        return Err("|yaw| must be <= MAX_ABS_YAW (8192) for rotated NMS");
    }
    Ok(())
}

/// The input checks of [`nms`], in order (parameters, lengths, NaN scores, each box's fields):
/// every backend refuses the same input with the same error.
pub fn validate_input(boxes: &[Box3d], scores: &[f32], classes: &[i32], params: &NmsParams) -> Result<(), NmsError> {
    params.validate()?;
    let n = boxes.len();
    let classes_ok = classes.len() == n || (classes.is_empty() && !params.class_aware);
    if scores.len() != n || !classes_ok {
        return Err(NmsError::LengthMismatch { boxes: n, scores: scores.len(), classes: classes.len() });
    }
    if n > u32::MAX as usize {
        return Err(NmsError::TooManyBoxes { len: n });
    }
    if let Some(index) = scores.iter().position(|s| s.is_nan()) {
        return Err(NmsError::NanScore { index });
    }
    for (index, b) in boxes.iter().enumerate() {
        check_box(b, params.kind).map_err(|reason| NmsError::InvalidBox { index, reason })?;
    }
    Ok(())
}

/// Non-maximum suppression; see the module documentation for the exact semantics.
pub fn nms(boxes: &[Box3d], scores: &[f32], classes: &[i32], params: &NmsParams) -> Result<NmsOutput, NmsError> {
    validate_input(boxes, scores, classes, params)?;
    let n = boxes.len();

    let st = params.score_threshold;
    let mut order: Vec<u32> = (0..n as u32).filter(|&i| scores[i as usize] >= st).collect();
    // Stable: equal scores (including -0.0 == +0.0) keep ascending index order.
    order.sort_by(|&a, &b| scores[b as usize].partial_cmp(&scores[a as usize]).expect("no NaN"));
    if let Some(pre) = params.pre_max_size {
        order.truncate(pre);
    }
    let m = order.len();
    let post = params.post_max_size.unwrap_or(usize::MAX);
    let cls: Option<Vec<i32>> = params.class_aware.then(|| order.iter().map(|&i| classes[i as usize]).collect());
    let cls = cls.as_deref();
    let t = params.threshold;
    let kept = match params.kind {
        NmsKind::AxisAligned => {
            let o = AaOverlap { p: order.iter().map(|&i| aa_prep(&boxes[i as usize])).collect(), t };
            sweep(&o, cls, m, post)
        }
        NmsKind::RotatedBev => {
            let o = RotOverlap { p: order.iter().map(|&i| rot_prep(&boxes[i as usize])).collect(), t };
            sweep(&o, cls, m, post)
        }
        NmsKind::Circle => {
            let p = order.iter().map(|&i| CirclePrep { x: boxes[i as usize].x, y: boxes[i as usize].y }).collect();
            sweep(&CircleOverlap { p, t, t2: t * t }, cls, m, post)
        }
    };
    tracing::trace!(candidates = m, kept = kept.len(), kind = ?params.kind, "nms");
    Ok(NmsOutput { keep: kept.into_iter().map(|r| order[r]).collect(), candidates: m })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(x: f32, y: f32) -> Box3d {
        Box3d::new(x, y, 0.0, 1.0, 1.0, 1.0, 0.0)
    }

    #[test]
    fn sincos_exact_points() {
        assert_eq!(sincos_f32(0.0), (0.0, 1.0));
        let (s, c) = sincos_f32(std::f32::consts::FRAC_PI_2);
        assert!((s - 1.0).abs() <= f32::EPSILON && c.abs() < 1e-7);
    }

    #[test]
    fn validate_names_key() {
        let mut p = NmsParams::new(NmsKind::AxisAligned, 1.5);
        assert_eq!(p.validate().unwrap_err().key, "threshold");
        p.threshold = 0.5;
        p.post_max_size = Some(0);
        assert_eq!(p.validate().unwrap_err().key, "post_max_size");
        let c = NmsParams::new(NmsKind::Circle, 3.0);
        assert!(c.validate().is_ok());
        assert_eq!(NmsParams::new(NmsKind::Circle, 0.0).validate().unwrap_err().key, "threshold");
        let mut s = NmsParams::new(NmsKind::RotatedBev, 0.7);
        s.score_threshold = f32::NAN;
        assert_eq!(s.validate().unwrap_err().key, "score_threshold");
    }

    #[test]
    fn flattens_into_a_larger_config() {
        #[derive(Debug, serde::Deserialize)]
        struct Stage {
            #[allow(dead_code)]
            enabled: bool,
            #[serde(flatten)]
            params: NmsParams,
        }
        let s: Stage = serde_yaml::from_str(
            "enabled: true\nkind: circle\nthreshold: 0.5\nscore_threshold: -.inf\npre_max_size: null\n",
        )
        .unwrap();
        assert_eq!(s.params, NmsParams::new(NmsKind::Circle, 0.5));
    }

    #[test]
    fn serde_defaults_and_snake_case() {
        let p: NmsParams = serde_yaml::from_str("kind: rotated_bev\nthreshold: 0.7\n").unwrap();
        assert_eq!(p, NmsParams::new(NmsKind::RotatedBev, 0.7));
        assert!(serde_yaml::from_str::<NmsParams>("kind: circle\nthreshold: 1\nbogus: 1\n").is_err());
    }

    #[test]
    fn errors() {
        let p = NmsParams::new(NmsKind::AxisAligned, 0.5);
        let b = [unit(0.0, 0.0); 2];
        assert_eq!(nms(&b, &[1.0], &[], &p), Err(NmsError::LengthMismatch { boxes: 2, scores: 1, classes: 0 }));
        assert_eq!(nms(&b, &[1.0, f32::NAN], &[], &p), Err(NmsError::NanScore { index: 1 }));
        let mut bad = b;
        bad[1].width = -1.0;
        assert!(matches!(nms(&bad, &[1.0, 0.5], &[], &p), Err(NmsError::InvalidBox { index: 1, .. })));
        let mut ca = p.clone();
        ca.class_aware = true;
        assert!(matches!(nms(&b, &[1.0, 0.5], &[], &ca), Err(NmsError::LengthMismatch { .. })));
    }

    #[test]
    fn grid_matches_brute() {
        // Deterministic pseudo-random boxes, enough to use the grid; compare with BRUTE sweep.
        let mut s = 12345u64;
        let mut rnd = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32) / (1u64 << 24) as f32
        };
        let n = 600;
        let boxes: Vec<Box3d> = (0..n)
            .map(|_| {
                Box3d::new(rnd() * 30.0, rnd() * 30.0, 0.0, 0.5 + rnd() * 4.0, 0.5 + rnd() * 2.0, 1.0, rnd() * 7.0)
            })
            .collect();
        let scores: Vec<f32> = (0..n).map(|_| (rnd() * 10.0).floor()).collect();
        for (kind, t) in [(NmsKind::AxisAligned, 0.3), (NmsKind::RotatedBev, 0.3), (NmsKind::Circle, 1.0)] {
            let p = NmsParams::new(kind, t);
            let out = nms(&boxes, &scores, &[], &p).unwrap();
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap());
            let mut kept: Vec<usize> = Vec::new();
            for &j in &order {
                let sup = kept.iter().any(|&i| match kind {
                    NmsKind::AxisAligned => iou_axis_aligned(&boxes[i], &boxes[j]) > t,
                    NmsKind::RotatedBev => iou_rotated_bev(&boxes[i], &boxes[j]) > t,
                    NmsKind::Circle => center_distance_sq(&boxes[i], &boxes[j]) <= t * t,
                });
                if !sup {
                    kept.push(j);
                }
            }
            let kept: Vec<u32> = kept.into_iter().map(|i| i as u32).collect();
            assert_eq!(out.keep, kept, "{kind:?}");
        }
    }
}
