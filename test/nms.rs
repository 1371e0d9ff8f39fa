mod common;

// NMS against independent oracles: an O(n^2) greedy written here (its own sort, its own
// suppression loop), torchvision's axis-aligned IoU and CenterPoint's circle test transcribed
// literally, and an f64 rotated-rectangle intersection by a different method (vertex collection
// and angular sort instead of Sutherland-Hodgman clipping).

use lidar_kernels::ops::nms::{
    center_distance_sq, iou_axis_aligned, iou_rotated_bev, nms, sincos_f32, Box3d, NmsError, NmsKind, NmsOutput,
    NmsParams, MAX_ABS_YAW,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::f64::consts::PI;

// ------------------------------------------------------------------------------------------
// Oracle: order and greedy sweep.

/// Monotone integer key of a score, with -0.0 mapped to +0.0 (they tie).
fn score_key(s: f32) -> i32 {
    let s = if s == 0.0 { 0.0f32 } else { s };
    let b = s.to_bits() as i32;
    if b >= 0 {
        b
    } else {
        b ^ 0x7fff_ffff
    }
}

fn oracle_order(scores: &[f32], score_threshold: f32, pre: Option<usize>) -> Vec<usize> {
    let mut v: Vec<(i64, usize)> = (0..scores.len())
        .filter(|&i| scores[i] >= score_threshold)
        .map(|i| (-(score_key(scores[i]) as i64), i))
        .collect();
    v.sort_unstable();
    let mut order: Vec<usize> = v.into_iter().map(|(_, i)| i).collect();
    if let Some(p) = pre {
        order.truncate(p);
    }
    order
}

/// torchvision-style greedy: a suppressed flag per position, each kept box flags the later ones.
fn oracle_nms(
    scores: &[f32],
    classes: &[i32],
    p: &NmsParams,
    suppress: &mut dyn FnMut(usize, usize) -> bool,
) -> NmsOutput {
    let order = oracle_order(scores, p.score_threshold, p.pre_max_size);
    let mut flag = vec![false; order.len()];
    let mut keep = Vec::new();
    for a in 0..order.len() {
        if flag[a] {
            continue;
        }
        let i = order[a];
        keep.push(i as u32);
        for b in a + 1..order.len() {
            let j = order[b];
            if flag[b] || (p.class_aware && classes[i] != classes[j]) {
                continue;
            }
            if suppress(i, j) {
                flag[b] = true;
            }
        }
    }
    if let Some(post) = p.post_max_size {
        keep.truncate(post);
    }
    NmsOutput { keep, candidates: order.len() }
}

// ------------------------------------------------------------------------------------------
// Oracle: overlap tests.

/// torchvision: boxes converted cxcywh -> xyxy (`x1 = cx - 0.5*w`), then nms_kernel's IoU.
fn torchvision_iou(a: &Box3d, b: &Box3d) -> f32 {
    let xyxy = |b: &Box3d| [b.x - 0.5 * b.length, b.y - 0.5 * b.width, b.x + 0.5 * b.length, b.y + 0.5 * b.width];
    let (ia, ib) = (xyxy(a), xyxy(b));
    let area = |v: &[f32; 4]| (v[2] - v[0]) * (v[3] - v[1]);
    let xx1 = ia[0].max(ib[0]);
    let yy1 = ia[1].max(ib[1]);
    let xx2 = ia[2].min(ib[2]);
    let yy2 = ia[3].min(ib[3]);
    let w = (xx2 - xx1).max(0.0);
    let h = (yy2 - yy1).max(0.0);
    let inter = w * h;
    inter / (area(&ia) + area(&ib) - inter) // NaN for two empty boxes: NaN > t is false
}

/// CenterPoint circle_nms: `(x[i]-x[j])**2 + (y[i]-y[j])**2 <= thresh`, float32, with the
/// squared threshold since `threshold` here is in metres.
fn centerpoint_suppress(a: &Box3d, b: &Box3d, t: f32) -> bool {
    let dx = a.x - b.x;
    let dy = a.y - b.y;
    dx * dx + dy * dy <= t * t
}

type P2 = (f64, f64);

fn corners64(b: &Box3d) -> [P2; 4] {
    let (s, c) = (b.yaw as f64).sin_cos();
    let (l, w) = (b.length as f64 / 2.0, b.width as f64 / 2.0);
    let (x, y) = (b.x as f64, b.y as f64);
    let mut out = [(0.0, 0.0); 4];
    for (k, (a, d)) in [(1.0, 1.0), (-1.0, 1.0), (-1.0, -1.0), (1.0, -1.0)].iter().enumerate() {
        out[k] = (x + a * l * c - d * w * s, y + a * l * s + d * w * c);
    }
    out
}

fn cross(o: P2, a: P2, b: P2) -> f64 {
    (a.0 - o.0) * (b.1 - o.1) - (a.1 - o.1) * (b.0 - o.0)
}

fn inside_ccw(p: P2, poly: &[P2; 4]) -> bool {
    (0..4).all(|k| cross(poly[k], poly[(k + 1) % 4], p) >= -1e-12)
}

/// Rotated-rectangle IoU in f64: the intersection's vertices are the corners of each rectangle
/// inside the other plus the proper edge crossings; sorted by angle about their mean.
fn rotated_iou64(a: &Box3d, b: &Box3d) -> f64 {
    let area_a = a.length as f64 * a.width as f64;
    let area_b = b.length as f64 * b.width as f64;
    if area_a == 0.0 || area_b == 0.0 {
        return 0.0;
    }
    let (dx, dy) = (a.x as f64 - b.x as f64, a.y as f64 - b.y as f64);
    let ra = (a.length as f64).hypot(a.width as f64) / 2.0;
    let rb = (b.length as f64).hypot(b.width as f64) / 2.0;
    if dx.hypot(dy) > ra + rb + 1e-9 {
        return 0.0;
    }
    let (ca, cb) = (corners64(a), corners64(b));
    let mut pts: Vec<P2> = Vec::new();
    pts.extend(ca.iter().copied().filter(|&p| inside_ccw(p, &cb)));
    pts.extend(cb.iter().copied().filter(|&p| inside_ccw(p, &ca)));
    for i in 0..4 {
        let (p, p2) = (ca[i], ca[(i + 1) % 4]);
        for j in 0..4 {
            let (q, q2) = (cb[j], cb[(j + 1) % 4]);
            let r = (p2.0 - p.0, p2.1 - p.1);
            let s = (q2.0 - q.0, q2.1 - q.1);
            let den = r.0 * s.1 - r.1 * s.0;
            if den.abs() < 1e-300 {
                continue;
            }
            let t = ((q.0 - p.0) * s.1 - (q.1 - p.1) * s.0) / den;
            let u = ((q.0 - p.0) * r.1 - (q.1 - p.1) * r.0) / den;
            if (0.0..=1.0).contains(&t) && (0.0..=1.0).contains(&u) {
                pts.push((p.0 + t * r.0, p.1 + t * r.1));
            }
        }
    }
    if pts.len() < 3 {
        return 0.0;
    }
    let n = pts.len() as f64;
    let m = (pts.iter().map(|p| p.0).sum::<f64>() / n, pts.iter().map(|p| p.1).sum::<f64>() / n);
    pts.sort_by(|p, q| (p.1 - m.1).atan2(p.0 - m.0).total_cmp(&(q.1 - m.1).atan2(q.0 - m.0)));
    let mut acc = 0.0;
    for k in 0..pts.len() {
        let (p, q) = (pts[k], pts[(k + 1) % pts.len()]);
        acc += p.0 * q.1 - q.0 * p.1;
    }
    let inter = (acc / 2.0).abs().min(area_a.min(area_b));
    inter / (area_a + area_b - inter)
}

/// Tolerance between the library's f32 rotated IoU and the f64 oracle; pairs whose f64 IoU lies
/// within it of the threshold take the library's decision (its value having been checked).
const ROT_TOL: f64 = 1e-4;

/// The oracle keep list for `p.kind`. For RotatedBev it also asserts, for every pair the greedy
/// evaluates, that the library IoU is within ROT_TOL of the f64 one, and returns how many
/// decisions fell within ROT_TOL of the threshold.
fn oracle(boxes: &[Box3d], scores: &[f32], classes: &[i32], p: &NmsParams) -> (NmsOutput, usize) {
    let t = p.threshold;
    let mut near = 0usize;
    let out = match p.kind {
        NmsKind::AxisAligned => oracle_nms(scores, classes, p, &mut |i, j| torchvision_iou(&boxes[i], &boxes[j]) > t),
        NmsKind::Circle => oracle_nms(scores, classes, p, &mut |i, j| centerpoint_suppress(&boxes[i], &boxes[j], t)),
        NmsKind::RotatedBev => oracle_nms(scores, classes, p, &mut |i, j| {
            let v = rotated_iou64(&boxes[i], &boxes[j]);
            let lib = iou_rotated_bev(&boxes[i], &boxes[j]);
            assert!(
                (lib as f64 - v).abs() <= ROT_TOL,
                "rotated IoU {lib} vs f64 {v} for {:?} / {:?}",
                boxes[i],
                boxes[j]
            );
            if (v - t as f64).abs() < ROT_TOL {
                near += 1;
                lib > t
            } else {
                v > t as f64
            }
        }),
    };
    (out, near)
}

/// The greedy over the library's own pair functions: checks the sweep (grid, caps, order)
/// exactly, whatever the overlap formula.
fn pairwise_oracle(boxes: &[Box3d], scores: &[f32], classes: &[i32], p: &NmsParams) -> NmsOutput {
    let t = p.threshold;
    oracle_nms(scores, classes, p, &mut |i, j| match p.kind {
        NmsKind::AxisAligned => iou_axis_aligned(&boxes[i], &boxes[j]) > t,
        NmsKind::RotatedBev => iou_rotated_bev(&boxes[i], &boxes[j]) > t,
        NmsKind::Circle => center_distance_sq(&boxes[i], &boxes[j]) <= t * t,
    })
}

// ------------------------------------------------------------------------------------------
// Random scenes.

const SCORE_SET: [f32; 8] = [0.0, -0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0];

struct Scene {
    boxes: Vec<Box3d>,
    scores: Vec<f32>,
    classes: Vec<i32>,
}

fn scene(n: usize, seed: u64) -> Scene {
    let mut rng = StdRng::seed_from_u64(seed);
    let half = [2.0f32, 8.0, 50.0][rng.random_range(0..3)];
    let discrete = rng.random_bool(0.6);
    let mut boxes: Vec<Box3d> = Vec::with_capacity(n);
    let mut scores = Vec::with_capacity(n);
    let mut classes = Vec::with_capacity(n);
    for _ in 0..n {
        let roll: f32 = rng.random();
        let b = if !boxes.is_empty() && roll < 0.2 {
            boxes[rng.random_range(0..boxes.len())] // exact duplicate
        } else if !boxes.is_empty() && roll < 0.3 {
            let mut b = boxes[rng.random_range(0..boxes.len())];
            b.x += rng.random_range(-0.05..0.05);
            b.y += rng.random_range(-0.05..0.05);
            b.yaw += rng.random_range(-0.1..0.1);
            b
        } else {
            let snap = rng.random_bool(0.15); // grid-aligned unit boxes: touching edges
            let (x, y) = if snap {
                ((rng.random_range(-8..8) as f32) * 0.5, (rng.random_range(-8..8) as f32) * 0.5)
            } else {
                (rng.random_range(-half..half), rng.random_range(-half..half))
            };
            let (mut l, mut w) =
                if snap { (1.0, 1.0) } else { (rng.random_range(0.1f32..5.0), rng.random_range(0.1f32..3.0)) };
            if rng.random_bool(0.03) {
                l = 0.0;
            }
            if rng.random_bool(0.03) {
                w = 0.0;
            }
            let yaw = match rng.random_range(0..10) {
                0 => 0.0,
                1 => (rng.random_range(-8..8) as f32) * std::f32::consts::FRAC_PI_2,
                2 => rng.random_range(-MAX_ABS_YAW..MAX_ABS_YAW),
                _ => rng.random_range(-7.0f32..7.0),
            };
            Box3d::new(x, y, rng.random_range(-2.0..1.0), l, w, rng.random_range(0.5..3.0), yaw)
        };
        boxes.push(b);
        scores.push(if discrete { SCORE_SET[rng.random_range(0..SCORE_SET.len())] } else { rng.random() });
        classes.push(rng.random_range(0..3));
    }
    Scene { boxes, scores, classes }
}

#[derive(Debug, Clone)]
struct Knobs {
    iou_t: f32,
    circle_t: f32,
    class_aware: bool,
    score_threshold: Option<usize>,
    pre: Option<usize>,
    post: Option<usize>,
}

fn knobs(n: usize) -> impl Strategy<Value = Knobs> {
    (
        prop_oneof![4 => 0.05f32..0.95, 1 => Just(1.0f32), 1 => Just(0.5f32)],
        0.05f32..3.0,
        any::<bool>(),
        proptest::option::weighted(0.3, 0..SCORE_SET.len()),
        proptest::option::weighted(0.3, 1..n + 5),
        proptest::option::weighted(0.3, 1..n + 5),
    )
        .prop_map(|(iou_t, circle_t, class_aware, score_threshold, pre, post)| Knobs {
            iou_t,
            circle_t,
            class_aware,
            score_threshold,
            pre,
            post,
        })
}

fn params(kind: NmsKind, k: &Knobs) -> NmsParams {
    let mut p = NmsParams::new(kind, if kind == NmsKind::Circle { k.circle_t } else { k.iou_t });
    p.class_aware = k.class_aware;
    p.score_threshold = k.score_threshold.map_or(f32::NEG_INFINITY, |i| SCORE_SET[i]);
    p.pre_max_size = k.pre;
    p.post_max_size = k.post;
    p
}

fn check_scene(s: &Scene, k: &Knobs) -> Result<(), TestCaseError> {
    for kind in [NmsKind::AxisAligned, NmsKind::RotatedBev, NmsKind::Circle] {
        let p = params(kind, k);
        let got = nms(&s.boxes, &s.scores, &s.classes, &p).unwrap();
        let (want, _) = oracle(&s.boxes, &s.scores, &s.classes, &p);
        prop_assert_eq!(&got, &want, "{:?} vs independent oracle", p);
        let pw = pairwise_oracle(&s.boxes, &s.scores, &s.classes, &p);
        prop_assert_eq!(&got, &pw, "{:?} vs pairwise greedy", p);
        if !p.class_aware {
            // classes may be omitted when class-agnostic
            prop_assert_eq!(&nms(&s.boxes, &s.scores, &[], &p).unwrap(), &got);
        }
    }
    Ok(())
}

fn sized(lo: usize, hi: usize) -> impl Strategy<Value = (usize, u64, Knobs)> {
    (lo..=hi, any::<u64>()).prop_flat_map(|(n, seed)| (Just(n), Just(seed), knobs(n)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn random_small_scenes_match_oracle((n, seed, k) in sized(0, 12)) {
        check_scene(&scene(n, seed), &k)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn random_medium_scenes_match_oracle((n, seed, k) in sized(60, 400)) {
        check_scene(&scene(n, seed), &k)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]
    #[test]
    fn random_large_scenes_match_oracle((n, seed, k) in sized(1800, 2200)) {
        check_scene(&scene(n, seed), &k)?;
    }
}

// ------------------------------------------------------------------------------------------
// sincos_f32 against f64.

/// |got - exact| in units of the f32 ulp at `exact` (2^(e-23) for |exact| in [2^e, 2^(e+1))).
fn ulp_err(got: f32, exact: f64) -> f64 {
    let a = exact.abs();
    let ulp = if a < f32::MIN_POSITIVE as f64 {
        2f64.powi(-149)
    } else {
        let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        2f64.powi(e - 23)
    };
    (got as f64 - exact).abs() / ulp
}

/// sincos_f32's documented accuracy: below 1.02 ulp (exhaustive maximum 1.0169 ulp).
const SINCOS_ULP_BOUND: f64 = 1.02;

fn sincos_err(yaw: f32) -> (f64, f64) {
    let (s, c) = sincos_f32(yaw);
    let (es, ec) = (yaw as f64).sin_cos();
    (ulp_err(s, es), ulp_err(c, ec))
}

#[test]
fn sincos_f32_within_ulp_bound() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut angles: Vec<f32> = Vec::new();
    for _ in 0..300_000 {
        angles.push(rng.random_range(-MAX_ABS_YAW..=MAX_ABS_YAW));
        angles.push(rng.random_range(-10.0f32..10.0));
        angles.push(f32::from_bits(rng.random_range(0..0x3f80_0000u32)) * if rng.random() { 1.0 } else { -1.0 });
    }
    // Neighbours of multiples of pi/4 (zeros of sin/cos and the polynomial's interval ends).
    let mut k = -(MAX_ABS_YAW as f64 / (PI / 4.0)).floor();
    while k * PI / 4.0 <= MAX_ABS_YAW as f64 {
        let c = (k * PI / 4.0) as f32;
        let b = c.to_bits() as i64;
        for d in -3i64..=3 {
            let v = f32::from_bits((b + d).max(0) as u32);
            if v.is_finite() && v.abs() <= MAX_ABS_YAW {
                angles.push(v);
            }
        }
        k += 1.0;
    }
    angles.extend([0.0, -0.0, MAX_ABS_YAW, -MAX_ABS_YAW, f32::MIN_POSITIVE, 1e-30, -1e-45]);
    let (mut ms, mut mc) = (0.0f64, 0.0f64);
    for &a in &angles {
        let (es, ec) = sincos_err(a);
        assert!(es <= SINCOS_ULP_BOUND && ec <= SINCOS_ULP_BOUND, "yaw {a:e}: sin {es} ulp, cos {ec} ulp");
        ms = ms.max(es);
        mc = mc.max(ec);
    }
    println!("sincos_f32 over {} angles: max sin error {ms:.3} ulp, max cos error {mc:.3} ulp", angles.len());
    assert_eq!(sincos_f32(0.0), (0.0, 1.0));
}

/// Every f32 with |yaw| <= MAX_ABS_YAW (about 2.3e9 values; minutes in release). Run with
/// `cargo test --release --test nms -- --ignored sincos_exhaustive --nocapture`.
#[test]
#[ignore]
fn sincos_exhaustive() {
    let limit = MAX_ABS_YAW.to_bits();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let (mut ms, mut mc) = ((0.0f64, 0.0f32), (0.0f64, 0.0f32));
                let mut bits = t;
                while bits <= limit {
                    for sign in [0u32, 0x8000_0000] {
                        let a = f32::from_bits(bits | sign);
                        let (es, ec) = sincos_err(a);
                        if es > ms.0 {
                            ms = (es, a);
                        }
                        if ec > mc.0 {
                            mc = (ec, a);
                        }
                    }
                    bits += threads;
                }
                (ms, mc)
            })
        })
        .collect();
    let (mut ms, mut mc) = ((0.0f64, 0.0f32), (0.0f64, 0.0f32));
    for h in handles {
        let (s, c) = h.join().unwrap();
        if s.0 > ms.0 {
            ms = s;
        }
        if c.0 > mc.0 {
            mc = c;
        }
    }
    println!(
        "exhaustive |yaw| <= {MAX_ABS_YAW}: max sin error {:.4} ulp at {:e}, max cos error {:.4} ulp at {:e}",
        ms.0, ms.1, mc.0, mc.1
    );
    assert!(ms.0 <= SINCOS_ULP_BOUND && mc.0 <= SINCOS_ULP_BOUND);
}

// ------------------------------------------------------------------------------------------
// Hand-checked cases.

fn bx(x: f32, y: f32, l: f32, w: f32, yaw: f32) -> Box3d {
    Box3d::new(x, y, 0.0, l, w, 1.0, yaw)
}

fn keep(kind: NmsKind, t: f32, boxes: &[Box3d], scores: &[f32]) -> Vec<u32> {
    nms(boxes, scores, &[], &NmsParams::new(kind, t)).unwrap().keep
}

const IOU_KINDS: [NmsKind; 2] = [NmsKind::AxisAligned, NmsKind::RotatedBev];

#[test]
fn half_overlapping_unit_squares_have_iou_one_third() {
    // a = [-0.5, 0.5] x [-0.5, 0.5], b = [0, 1] x [-0.5, 0.5]. Intersection [0, 0.5] x [-0.5, 0.5]
    // has area 0.5; union = 1 + 1 - 0.5 = 1.5; IoU = 0.5 / 1.5 = 1/3. Every intermediate value
    // is exact in f32 (yaw 0 gives sincos exactly (0, 1)), so both kinds return fl(1/3).
    let (a, b) = (bx(0.0, 0.0, 1.0, 1.0, 0.0), bx(0.5, 0.0, 1.0, 1.0, 0.0));
    assert_eq!(sincos_f32(0.0), (0.0, 1.0));
    assert_eq!(iou_axis_aligned(&a, &b), 1.0 / 3.0);
    assert_eq!(iou_rotated_bev(&a, &b), 1.0 / 3.0);
    assert_eq!(iou_rotated_bev(&b, &a), 1.0 / 3.0);
    assert_eq!(torchvision_iou(&a, &b), 1.0 / 3.0);
    assert!((rotated_iou64(&a, &b) - 1.0 / 3.0).abs() < 1e-12);
    for kind in IOU_KINDS {
        assert_eq!(keep(kind, 0.33, &[a, b], &[0.9, 0.8]), [0]);
        // strict >: a threshold of exactly fl(1/3) does not suppress
        assert_eq!(keep(kind, 1.0 / 3.0, &[a, b], &[0.9, 0.8]), [0, 1]);
        assert_eq!(keep(kind, 0.34, &[a, b], &[0.8, 0.9]), [1, 0]);
    }
}

#[test]
fn square_rotated_45_degrees_vs_axis_aligned() {
    // Unit square vs the same square turned 45 degrees: the turned one is the diamond
    // |x| + |y| <= sqrt(2)/2. It cuts a right triangle with legs 1/2 + 1/2 - sqrt(2)/2 =
    // 1 - sqrt(2)/2 off each of the 4 corners: cut = 4 * (1 - sqrt(2)/2)^2 / 2 = 3 - 2*sqrt(2).
    // inter = 1 - (3 - 2 sqrt 2) = 2 (sqrt 2 - 1), union = 2 - inter = 2 (2 - sqrt 2),
    // IoU = (sqrt 2 - 1) / (2 - sqrt 2) = (sqrt 2 - 1) / (sqrt 2 (sqrt 2 - 1)) = 1/sqrt 2.
    let a = bx(10.0, -3.0, 1.0, 1.0, 0.0);
    let b = bx(10.0, -3.0, 1.0, 1.0, std::f32::consts::FRAC_PI_4);
    let want = std::f64::consts::FRAC_1_SQRT_2;
    assert!((rotated_iou64(&a, &b) - want).abs() < 1e-7);
    for (k, c) in [(a, b), (b, a)] {
        let got = iou_rotated_bev(&k, &c) as f64;
        assert!((got - want).abs() < 2e-6, "{got} vs {want}");
    }
    assert_eq!(iou_axis_aligned(&a, &b), 1.0); // yaw ignored: identical rectangles
    assert_eq!(keep(NmsKind::RotatedBev, 0.7, &[a, b], &[0.5, 0.6]), [1]);
    assert_eq!(keep(NmsKind::RotatedBev, 0.71, &[a, b], &[0.5, 0.6]), [1, 0]);
}

#[test]
fn identical_boxes() {
    for yaw in [0.0f32, 0.3, 1.0, -2.5, 100.0, 5000.0] {
        let a = bx(-20.0, 13.5, 4.2, 1.8, yaw);
        let iou = iou_rotated_bev(&a, &a);
        assert!(iou <= 1.0 && iou > 1.0 - 1e-6, "yaw {yaw}: {iou}");
        assert_eq!(iou_axis_aligned(&a, &a), 1.0);
        for kind in IOU_KINDS {
            assert_eq!(keep(kind, 0.9, &[a, a, a], &[0.5, 0.5, 0.5]), [0]);
            // IoU can never exceed 1, so threshold 1 suppresses nothing.
            assert_eq!(keep(kind, 1.0, &[a, a, a], &[0.5, 0.5, 0.5]), [0, 1, 2]);
        }
    }
}

#[test]
fn box_inside_another() {
    // 1 x 1 box (turned 0.5 rad, half-diagonal 0.71, offset 0.22) inside a 2 x 2 box: IoU 1/4.
    let big = bx(0.0, 0.0, 2.0, 2.0, 0.0);
    let small = bx(0.2, 0.1, 1.0, 1.0, 0.5);
    for (k, c) in [(big, small), (small, big)] {
        assert!((iou_rotated_bev(&k, &c) - 0.25).abs() < 1e-6);
        assert!((rotated_iou64(&k, &c) - 0.25).abs() < 1e-12);
    }
    assert_eq!(keep(NmsKind::RotatedBev, 0.24, &[big, small], &[0.1, 0.2]), [1]);
    assert_eq!(keep(NmsKind::RotatedBev, 0.26, &[big, small], &[0.1, 0.2]), [1, 0]);
}

#[test]
fn touching_and_zero_area_boxes_never_suppress() {
    let a = bx(0.0, 0.0, 1.0, 1.0, 0.0);
    let b = bx(1.0, 0.0, 1.0, 1.0, 0.0); // shares the edge x = 0.5
    assert_eq!(iou_axis_aligned(&a, &b), 0.0);
    assert_eq!(iou_rotated_bev(&a, &b), 0.0);
    let turn = std::f32::consts::FRAC_PI_2; // sincos(fl(pi/2)) is not exactly (1, 0)
    let (c, d) = (bx(0.0, 0.0, 1.0, 1.0, turn), bx(0.0, 1.0, 1.0, 1.0, turn));
    assert!(iou_rotated_bev(&c, &d) < 1e-6);
    // c is a itself (turned 90 degrees) and is suppressed; d only touches a and c.
    for kind in IOU_KINDS {
        assert_eq!(keep(kind, 0.01, &[a, b, c, d], &[0.4, 0.3, 0.2, 0.1]), [0, 1, 3]);
    }
    for z in [bx(0.0, 0.0, 0.0, 1.0, 0.3), bx(0.0, 0.0, 2.0, 0.0, 0.0), bx(0.0, 0.0, 0.0, 0.0, 0.0)] {
        assert_eq!(iou_axis_aligned(&z, &z), 0.0);
        assert_eq!(iou_rotated_bev(&z, &z), 0.0);
        assert_eq!(iou_rotated_bev(&a, &z), 0.0);
        for kind in IOU_KINDS {
            assert_eq!(keep(kind, 0.01, &[z, z, a], &[0.3, 0.2, 0.1]), [0, 1, 2]);
        }
    }
}

#[test]
fn class_aware_separation() {
    let a = bx(5.0, 5.0, 4.0, 2.0, 0.4);
    for kind in [NmsKind::AxisAligned, NmsKind::RotatedBev, NmsKind::Circle] {
        let mut p = NmsParams::new(kind, 0.5);
        assert_eq!(nms(&[a, a, a], &[0.9, 0.8, 0.7], &[0, 1, 0], &p).unwrap().keep, [0]);
        p.class_aware = true;
        assert_eq!(nms(&[a, a, a], &[0.9, 0.8, 0.7], &[0, 1, 0], &p).unwrap().keep, [0, 1]);
        assert_eq!(nms(&[a, a, a], &[0.9, 0.8, 0.7], &[2, 1, 0], &p).unwrap().keep, [0, 1, 2]);
        // Only kept boxes suppress. Boxes 4 x 2 at x = 5, 6.5, 8: IoU(0,1) = IoU(1,2) =
        // (2.5*2)/(16-5) = 5/11 > 0.4 and IoU(0,2) = 2/14 < 0.4 (centre distances 1.5, 1.5, 3
        // against 1.6 m): 0 suppresses 1, and 1, being suppressed, does not suppress 2.
        let (b, c) = (bx(6.5, 5.0, 4.0, 2.0, 0.0), bx(8.0, 5.0, 4.0, 2.0, 0.0));
        let q = NmsParams::new(kind, if kind == NmsKind::Circle { 1.6 } else { 0.4 });
        assert_eq!(nms(&[bx(5.0, 5.0, 4.0, 2.0, 0.0), b, c], &[0.9, 0.8, 0.7], &[], &q).unwrap().keep, [0, 2]);
    }
}

#[test]
fn score_threshold_and_size_caps() {
    let far: Vec<Box3d> = (0..4).map(|i| bx(10.0 * i as f32, 0.0, 1.0, 1.0, 0.0)).collect();
    let scores = [0.3, 0.9, 0.5, 0.7];
    for kind in [NmsKind::AxisAligned, NmsKind::RotatedBev, NmsKind::Circle] {
        let mut p = NmsParams::new(kind, 0.5);
        assert_eq!(nms(&far, &scores, &[], &p).unwrap(), NmsOutput { keep: vec![1, 3, 2, 0], candidates: 4 });
        p.score_threshold = 0.5; // >=
        assert_eq!(nms(&far, &scores, &[], &p).unwrap(), NmsOutput { keep: vec![1, 3, 2], candidates: 3 });
        p.score_threshold = 2.0;
        assert_eq!(nms(&far, &scores, &[], &p).unwrap(), NmsOutput { keep: vec![], candidates: 0 });
        p.score_threshold = f32::NEG_INFINITY;
        p.pre_max_size = Some(2);
        assert_eq!(nms(&far, &scores, &[], &p).unwrap(), NmsOutput { keep: vec![1, 3], candidates: 2 });
        p.pre_max_size = None;
        p.post_max_size = Some(1);
        assert_eq!(nms(&far, &scores, &[], &p).unwrap(), NmsOutput { keep: vec![1], candidates: 4 });
        // post_max_size counts kept boxes, not candidates: 0 suppresses its duplicate 1.
        let dup = [far[0], far[0], far[2]];
        p.post_max_size = Some(2);
        assert_eq!(nms(&dup, &[0.9, 0.8, 0.7], &[], &p).unwrap(), NmsOutput { keep: vec![0, 2], candidates: 3 });
    }
}

#[test]
fn ties_follow_input_index() {
    let far: Vec<Box3d> = (0..4).map(|i| bx(10.0 * i as f32, 0.0, 1.0, 1.0, 0.0)).collect();
    let a = far[0];
    for kind in [NmsKind::AxisAligned, NmsKind::RotatedBev, NmsKind::Circle] {
        assert_eq!(keep(kind, 0.5, &far, &[0.5, 1.0, 0.5, 0.5]), [1, 0, 2, 3]);
        assert_eq!(keep(kind, 0.5, &[a, a, a], &[0.5, 0.5, 0.5]), [0]);
        assert_eq!(keep(kind, 0.5, &[a, a, a], &[0.5, 0.7, 0.7]), [1]);
        // -0.0 and +0.0 are equal scores
        assert_eq!(keep(kind, 0.5, &[a, a], &[-0.0, 0.0]), [0]);
        assert_eq!(keep(kind, 0.5, &[a, a], &[0.0, -0.0]), [0]);
        assert_eq!(keep(kind, 0.5, &[a, a], &[f32::NEG_INFINITY, f32::INFINITY]), [1]);
    }
}

#[test]
fn circle_matches_centerpoint_distance_rule() {
    // CenterPoint suppresses when the squared distance is <= its threshold: equality suppresses.
    let (a, b) = (bx(0.0, 0.0, 4.0, 2.0, 0.0), bx(3.0, 4.0, 4.0, 2.0, 1.0));
    assert_eq!(center_distance_sq(&a, &b), 25.0);
    assert_eq!(keep(NmsKind::Circle, 5.0, &[a, b], &[0.9, 0.8]), [0]);
    assert_eq!(keep(NmsKind::Circle, 4.99, &[a, b], &[0.9, 0.8]), [0, 1]);
    // the distance is in the BEV plane only
    let c = Box3d::new(0.0, 0.0, 50.0, 1.0, 1.0, 1.0, 0.0);
    assert_eq!(keep(NmsKind::Circle, 0.1, &[a, c], &[0.9, 0.8]), [0]);
}

#[test]
fn errors_name_their_cause() {
    let a = bx(0.0, 0.0, 1.0, 1.0, 0.0);
    let p = NmsParams::new(NmsKind::RotatedBev, 0.5);
    let e = nms(&[a, a, a], &[0.1, 0.2], &[0, 0, 0], &p).unwrap_err();
    assert_eq!(e, NmsError::LengthMismatch { boxes: 3, scores: 2, classes: 3 });
    assert!(e.to_string().contains("3 boxes, 2 scores, 3 classes"), "{e}");
    let mut ca = p.clone();
    ca.class_aware = true;
    assert!(matches!(nms(&[a], &[0.1], &[], &ca), Err(NmsError::LengthMismatch { classes: 0, .. })));
    assert_eq!(nms(&[a, a], &[0.1, f32::NAN], &[], &p), Err(NmsError::NanScore { index: 1 }));
    let mut bad = NmsParams::new(NmsKind::AxisAligned, 0.0);
    assert!(matches!(nms(&[a], &[0.1], &[], &bad), Err(NmsError::Param(e)) if e.key == "threshold"));
    bad.threshold = 0.5;
    bad.pre_max_size = Some(0);
    assert!(matches!(nms(&[a], &[0.1], &[], &bad), Err(NmsError::Param(e)) if e.key == "pre_max_size"));
    let huge_yaw = bx(0.0, 0.0, 1.0, 1.0, 9000.0);
    assert!(matches!(nms(&[a, huge_yaw], &[0.1, 0.2], &[], &p), Err(NmsError::InvalidBox { index: 1, .. })));
    // yaw is not read by the other kinds
    assert!(nms(&[a, huge_yaw], &[0.1, 0.2], &[], &NmsParams::new(NmsKind::AxisAligned, 0.5)).is_ok());
    let nan_x = bx(f32::NAN, 0.0, 1.0, 1.0, 0.0);
    assert!(matches!(
        nms(&[nan_x], &[0.1], &[], &NmsParams::new(NmsKind::Circle, 1.0)),
        Err(NmsError::InvalidBox { index: 0, .. })
    ));
    // empty input
    assert_eq!(nms(&[], &[], &[], &p).unwrap(), NmsOutput { keep: vec![], candidates: 0 });
}

#[test]
fn pathological_scenes_match_oracles() {
    let mut s = scene(900, 99);
    // a giant box over everything, and a far-away cluster
    s.boxes.push(bx(0.0, 0.0, 500.0, 400.0, 0.2));
    s.scores.push(0.3);
    s.classes.push(1);
    for i in 0..50 {
        s.boxes.push(bx(1e6 + i as f32 * 0.25, -1e6, 1.0, 1.0, 0.0));
        s.scores.push(0.5);
        s.classes.push(0);
    }
    for kind in [NmsKind::AxisAligned, NmsKind::RotatedBev, NmsKind::Circle] {
        for t in [0.05f32, 0.5, 1.0] {
            let p = NmsParams::new(kind, t);
            let got = nms(&s.boxes, &s.scores, &s.classes, &p).unwrap();
            assert_eq!(got, oracle(&s.boxes, &s.scores, &s.classes, &p).0, "{p:?}");
        }
    }
    // extremes: coordinates whose bounds overflow, a tiny and a huge circle threshold
    let mut x = scene(300, 5);
    for b in x.boxes.iter_mut().take(40) {
        b.x = 3.3e38;
        b.length = 2e38;
    }
    for (kind, t) in [
        (NmsKind::AxisAligned, 0.3),
        (NmsKind::RotatedBev, 0.3),
        (NmsKind::Circle, 1e-30),
        (NmsKind::Circle, 1e20),
        (NmsKind::Circle, 0.7),
    ] {
        let p = NmsParams::new(kind, t);
        let got = nms(&x.boxes, &x.scores, &x.classes, &p).unwrap();
        assert_eq!(got, pairwise_oracle(&x.boxes, &x.scores, &x.classes, &p), "{p:?}");
        if kind != NmsKind::RotatedBev {
            assert_eq!(got, oracle(&x.boxes, &x.scores, &x.classes, &p).0, "{p:?}");
        }
    }
}

// ------------------------------------------------------------------------------------------
// Real PointPillars detections (KITTI, read in place from ../shared).

fn load_detections(path: &std::path::Path) -> Scene {
    let text = std::fs::read_to_string(path).expect("read detections");
    let (mut boxes, mut scores, mut classes) = (Vec::new(), Vec::new(), Vec::new());
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let v: Vec<f32> = line.split_whitespace().map(|t| t.parse().expect("number")).collect();
        assert_eq!(v.len(), 9, "cx cy cz length width height yaw class score: {line}");
        boxes.push(Box3d::new(v[0], v[1], v[2], v[3], v[4], v[5], v[6]));
        classes.push(v[7] as i32);
        scores.push(v[8]);
    }
    Scene { boxes, scores, classes }
}

#[test]
fn pointpillars_detections_match_oracle() {
    let Some(eval) = common::eval_dir() else {
        println!("SKIPPED pointpillars_detections_match_oracle: no evaluation folder (../shared/data/eval or LIDAR_KERNELS_EVAL_DIR)");
        return;
    };
    let mut files: Vec<_> = std::fs::read_dir(eval.join("kitti_fov"))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.to_string_lossy().ends_with(".pointpillars.txt"));
    files.sort();
    if files.is_empty() {
        println!("SKIPPED pointpillars_detections_match_oracle: no kitti_fov/*.pointpillars.txt in {}", eval.display());
        return;
    }
    let (mut boxes, mut runs, mut suppressed, mut near) = (0, 0, 0, 0);
    for f in &files {
        let s = load_detections(f);
        assert!(!s.boxes.is_empty(), "{}", f.display());
        boxes += s.boxes.len();
        for (kind, ts) in [
            (NmsKind::AxisAligned, &[0.01f32, 0.1, 0.5][..]),
            (NmsKind::RotatedBev, &[0.01, 0.1, 0.5, 0.7][..]),
            (NmsKind::Circle, &[0.5, 2.0, 4.0][..]),
        ] {
            for &t in ts {
                for class_aware in [false, true] {
                    let mut p = NmsParams::new(kind, t);
                    p.class_aware = class_aware;
                    let got = nms(&s.boxes, &s.scores, &s.classes, &p).unwrap();
                    let (want, nr) = oracle(&s.boxes, &s.scores, &s.classes, &p);
                    assert_eq!(got, want, "{} {p:?}", f.display());
                    assert_eq!(got, pairwise_oracle(&s.boxes, &s.scores, &s.classes, &p));
                    runs += 1;
                    near += nr;
                    suppressed += got.candidates - got.keep.len();
                }
            }
        }
    }
    println!(
        "pointpillars: {} files, {boxes} detections, {runs} NMS runs agree with the oracle \
         ({suppressed} suppressions in total, {near} rotated decisions within {ROT_TOL} of the threshold)",
        files.len()
    );
    assert!(suppressed > 0, "the real-data check should exercise suppression");
}

// ------------------------------------------------------------------------------------------
// Determinism.

#[test]
fn deterministic_and_permutation_equivariant() {
    let s = scene(5000, 2024);
    // distinct scores so that the rank order does not depend on input positions
    let scores: Vec<f32> = (0..s.boxes.len()).map(|i| 1.0 - i as f32 * 1e-4).collect();
    let perm: Vec<usize> = (0..s.boxes.len()).rev().collect();
    let pb: Vec<Box3d> = perm.iter().map(|&i| s.boxes[i]).collect();
    let ps: Vec<f32> = perm.iter().map(|&i| scores[i]).collect();
    let pc: Vec<i32> = perm.iter().map(|&i| s.classes[i]).collect();
    for kind in [NmsKind::AxisAligned, NmsKind::RotatedBev, NmsKind::Circle] {
        for class_aware in [false, true] {
            let mut p = NmsParams::new(kind, if kind == NmsKind::Circle { 0.8 } else { 0.3 });
            p.class_aware = class_aware;
            let a = nms(&s.boxes, &s.scores, &s.classes, &p).unwrap();
            let b = nms(&s.boxes, &s.scores, &s.classes, &p).unwrap();
            assert_eq!(a, b);
            let c = nms(&s.boxes, &scores, &s.classes, &p).unwrap();
            let d = nms(&pb, &ps, &pc, &p).unwrap();
            let d_mapped: Vec<u32> = d.keep.iter().map(|&k| perm[k as usize] as u32).collect();
            assert_eq!(c.keep, d_mapped, "{p:?}");
        }
    }
}

// ------------------------------------------------------------------------------------------
// Timing (not a check): `cargo test --release --test nms -- --ignored timing --nocapture`.

#[test]
#[ignore]
fn timing() {
    let bench = |kind: NmsKind, n: usize, t: f32| {
        let mut rng = StdRng::seed_from_u64(n as u64);
        let boxes: Vec<Box3d> = (0..n)
            .map(|_| {
                bx(
                    rng.random_range(-50.0..50.0),
                    rng.random_range(-50.0..50.0),
                    rng.random_range(1.0..5.0),
                    rng.random_range(1.0..5.0),
                    rng.random_range(-3.2..3.2),
                )
            })
            .collect();
        let scores: Vec<f32> = (0..n).map(|_| rng.random()).collect();
        let classes: Vec<i32> = (0..n).map(|_| rng.random_range(0..3)).collect();
        let p = NmsParams::new(kind, t);
        let mut times = Vec::new();
        let mut kept = 0;
        for _ in 0..9 {
            let t0 = std::time::Instant::now();
            let out = nms(&boxes, &scores, &classes, &p).unwrap();
            times.push(t0.elapsed().as_secs_f64() * 1e3);
            kept = out.keep.len();
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{kind:?} n={n} threshold={t}: median {:.2} ms (min {:.2}, max {:.2}) over 9 runs, kept {kept}",
            times[4], times[0], times[8]
        );
    };
    bench(NmsKind::AxisAligned, 10_000, 0.5);
    bench(NmsKind::RotatedBev, 20_000, 0.7);
    bench(NmsKind::Circle, 20_000, 0.5);
}

/// The frame bound (RotatedBev step 2a) never rejects a pair that the IoU suppresses: random
/// pairs of a box and a jittered copy (near copies to disjoint neighbours), each at the largest
/// threshold below its own IoU, where the bound's margin is thinnest.
#[test]
fn frame_bound_never_rejects_a_suppressing_pair() {
    let mut rng = StdRng::seed_from_u64(0x6672_616d_65);
    let mut tested = 0;
    for i in 0..30_000 {
        let (l, w) = (rng.random_range(0.2f32..6.0), rng.random_range(0.2f32..3.0));
        let a = bx(rng.random_range(-60.0..60.0), rng.random_range(-60.0..60.0), l, w, rng.random_range(-3.1..3.1));
        let jitter = [0.01f32, 0.1, 0.5][i % 3];
        let mut j = |scale: f32| rng.random_range(-jitter..jitter) * scale;
        let b = bx(a.x + j(l), a.y + j(l), l * (1.0 + j(0.3)), w * (1.0 + j(0.3)), a.yaw + j(2.0));
        let iou = iou_rotated_bev(&a, &b);
        if !(iou > 0.0) {
            continue;
        }
        let t = f32::from_bits(iou.to_bits() - 1);
        assert_eq!(keep(NmsKind::RotatedBev, t, &[a, b], &[1.0, 0.5]), vec![0], "{a:?} / {b:?}: IoU {iou}, t {t}");
        tested += 1;
    }
    assert!(tested > 20_000, "only {tested} overlapping pairs");
}

// check-gpu's and bench's worst case for the fixed-point sweep is a chain only if each box
// suppresses exactly the next: IoU (4 - 1) / (4 + 1) = 0.6 with the box 1 m on, 2 / 6 with the
// one 2 m on, centres 1 m and 2 m apart against 1.5 m. Then the greedy sweep keeps every other box.
#[test]
fn chain_boxes_suppress_only_the_next_box() {
    let n = 101;
    let (boxes, scores) = lidar_kernels::verify::nms::chain_boxes(n);
    let every_other: Vec<u32> = (0..n as u32).step_by(2).collect();
    for kind in [NmsKind::AxisAligned, NmsKind::RotatedBev, NmsKind::Circle] {
        let t = lidar_kernels::verify::nms::chain_threshold(kind);
        let p = NmsParams::new(kind, t);
        let (oracle_out, _) = oracle(&boxes, &scores, &[], &p);
        assert_eq!(oracle_out.keep, every_other, "{kind:?}: the oracle's greedy sweep");
        assert_eq!(keep(kind, t, &boxes, &scores), every_other, "{kind:?}");
    }
}
