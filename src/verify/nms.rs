//! NMS: GPU ([`crate::ops::nms::cuda`]) against the CPU reference on random boxes, the KITTI
//! detections and the fixed workloads, and the benchmarks.

use super::report::{BenchRow, CheckRow, Rng};
use super::VerifyError;
use crate::gpu::GpuContext;
use crate::ops::nms::cuda::{DeviceNms, Mask, Read};
use crate::ops::nms::{nms as cpu_nms, validate_input, Box3d, NmsKind, NmsParams};
use std::path::Path;

/// Random detector-like boxes: clusters of jittered duplicates, exact copies, a few zero-size
/// boxes, yaw mostly in [-pi, pi] but some up to |yaw| = 8192, scores quantised (many ties,
/// both signs of zero), classes 0..3.
pub fn random_boxes(seed: u64, n: usize) -> (Vec<Box3d>, Vec<f32>, Vec<i32>) {
    let mut r = Rng::new(seed ^ 0x6e6d_735f_6770_7521 ^ (n as u64).wrapping_mul(0x1000_0000_01b3));
    let objects = (n / 20).max(1);
    let centres: Vec<(f32, f32, f32, f32, f32)> = (0..objects)
        .map(|_| (r.f32(-60.0, 60.0), r.f32(-60.0, 60.0), r.f32(0.4, 5.0), r.f32(0.4, 2.5), r.f32(-3.2, 3.2)))
        .collect();
    let mut boxes: Vec<Box3d> = Vec::with_capacity(n);
    for i in 0..n {
        let u = r.unit();
        let b = if i > 0 && u < 0.08 {
            boxes[r.below(i as u64) as usize] // exact duplicate
        } else {
            let (cx, cy, l, w, yaw) = centres[r.below(objects as u64) as usize];
            let mut b = Box3d::new(
                cx + r.f32(-0.6, 0.6),
                cy + r.f32(-0.6, 0.6),
                r.f32(-1.5, 0.5),
                l * r.f32(0.85, 1.15),
                w * r.f32(0.85, 1.15),
                1.6,
                yaw + r.f32(-0.3, 0.3),
            );
            let v = r.unit();
            if v < 0.03 {
                b.yaw = r.f32(-8192.0, 8192.0);
            } else if v < 0.05 {
                b.yaw += 2.0 * std::f32::consts::PI * ((r.below(200_u64) as usize) as f32 - 100.0);
            } else if v < 0.06 {
                b.length = 0.0;
            }
            b
        };
        boxes.push(b);
    }
    let scores: Vec<f32> = (0..n)
        .map(|_| {
            let q = r.below(64) as usize;
            match q {
                0 => 0.0,
                1 => -0.0,
                _ => (q as f32) / 64.0 - 0.1,
            }
        })
        .collect();
    let classes: Vec<i32> = (0..n).map(|_| (r.below(3_u64) as usize) as i32).collect();
    (boxes, scores, classes)
}

/// `n` boxes in `clusters` tight clusters (centres within 2 cm, sizes within 1 %), distinct scores.
fn clustered_boxes(seed: u64, n: usize, clusters: usize, spread: f32) -> (Vec<Box3d>, Vec<f32>, Vec<i32>) {
    let mut r = Rng::new(seed ^ 0x636c_7573_7465_7273);
    let centres: Vec<(f32, f32, f32)> =
        (0..clusters).map(|_| (r.f32(-60.0, 60.0), r.f32(-60.0, 60.0), r.f32(-3.1, 3.1))).collect();
    let boxes = (0..n)
        .map(|i| {
            let (x, y, yaw) = centres[i % clusters];
            Box3d::new(
                x + r.f32(-spread, spread),
                y + r.f32(-spread, spread),
                0.0,
                4.0 * r.f32(0.995, 1.005),
                1.8 * r.f32(0.995, 1.005),
                1.6,
                yaw + r.f32(-spread, spread) * 0.2,
            )
        })
        .collect();
    let scores = (0..n).map(|i| 1.0 - i as f32 / n as f32).collect();
    (boxes, scores, vec![0; n])
}

/// Boxes of the suppression chain that check-gpu and bench run.
const CHAIN_BOXES: usize = 2000;

/// A suppression chain: `n` 4 m x 1.8 m boxes 1 m apart along x, scores falling along the line,
/// so each box suppresses only the next one at [`chain_threshold`] (IoU 0.6 with the next, 0.33
/// with the one after; centres 1 m and 2 m apart). The greedy sweep keeps every other box; the
/// GPU's fixed-point sweep needs one round per box, its worst case.
pub fn chain_boxes(n: usize) -> (Vec<Box3d>, Vec<f32>) {
    let boxes = (0..n).map(|i| Box3d::new(i as f32, 0.0, 0.0, 4.0, 1.8, 1.6, 0.0)).collect();
    let scores = (0..n).map(|i| 1.0 - i as f32 / n as f32).collect();
    (boxes, scores)
}

/// The threshold at which [`chain_boxes`] chain: IoU 0.5, or 1.5 m between centres.
pub fn chain_threshold(kind: NmsKind) -> f32 {
    match kind {
        NmsKind::Circle => 1.5,
        NmsKind::AxisAligned | NmsKind::RotatedBev => 0.5,
    }
}

fn compare_row(
    ctx: &GpuContext,
    dev: &mut DeviceNms,
    operator: &str,
    case: String,
    boxes: &[Box3d],
    scores: &[f32],
    classes: &[i32],
    params: &NmsParams,
) -> Result<CheckRow, VerifyError> {
    let cpu = cpu_nms(boxes, scores, classes, params);
    let row = |identical: bool, det: bool, detail: String| CheckRow {
        operator: operator.to_string(),
        case: case.clone(),
        points: boxes.len(),
        integers_identical: identical,
        max_rel_err: 0.0,
        float_tolerance: 0.0,
        deterministic: det,
        detail,
    };
    let cpu = match cpu {
        Ok(c) => c,
        Err(e) => {
            // Invalid input: the GPU must refuse it with the same error.
            let g = validate_input(boxes, scores, classes, params);
            let same = g.as_ref().err() == Some(&e);
            return Ok(row(same, true, format!("both refuse: {e}")));
        }
    };
    validate_input(boxes, scores, classes, params)?;
    let cls = if params.class_aware { classes } else { &[] };
    dev.upload(ctx, boxes, scores, cls)?;
    let reruns = dev.reruns;
    let g1 = dev.run(ctx, params)?;
    let g2 = dev.run(ctx, params)?;
    let identical = g1 == cpu;
    let mut detail = format!("kept {} of {} candidates, {:?} mask", cpu.keep.len(), cpu.candidates, dev.last_mask);
    if dev.reruns > reruns {
        detail += "; pair lists grown (rerun)";
    }
    if !identical {
        let first =
            g1.keep.iter().zip(&cpu.keep).position(|(a, b)| a != b).unwrap_or(g1.keep.len().min(cpu.keep.len()));
        detail += &format!(
            "; GPU kept {} of {} candidates, first difference at keep position {first}",
            g1.keep.len(),
            g1.candidates
        );
    }
    Ok(row(identical, g1 == g2, detail))
}

fn kind_name(k: NmsKind) -> &'static str {
    match k {
        NmsKind::AxisAligned => "nms_aa",
        NmsKind::RotatedBev => "nms_rot",
        NmsKind::Circle => "nms_circle",
    }
}

fn default_threshold(k: NmsKind) -> f32 {
    match k {
        NmsKind::AxisAligned => 0.5,
        NmsKind::RotatedBev => 0.3,
        NmsKind::Circle => 0.8,
    }
}

/// GPU vs CPU keep lists on random boxes from `seed` (0, 1, 2, hundreds, 4096, 20000 boxes; all
/// kinds; class-aware on and off; score threshold, pre_max_size, post_max_size), and the KITTI
/// PointPillars detections under `eval_dir/kitti_fov/*.pointpillars.txt` when present. Each GPU
/// run twice.
pub fn check(ctx: &GpuContext, seed: u64, eval_dir: Option<&Path>) -> Result<Vec<CheckRow>, VerifyError> {
    check_sizes(ctx, seed, &[0, 1, 2, 3, 317, 4096, 20000], eval_dir)
}

/// [`check`] with chosen random-set sizes (e.g. small ones under compute-sanitizer).
pub fn check_sizes(
    ctx: &GpuContext,
    seed: u64,
    sizes: &[usize],
    eval_dir: Option<&Path>,
) -> Result<Vec<CheckRow>, VerifyError> {
    let mut rows = Vec::new();
    let mut dev = DeviceNms::new(ctx)?;
    let kinds = [NmsKind::AxisAligned, NmsKind::RotatedBev, NmsKind::Circle];
    for (si, &n) in sizes.iter().enumerate() {
        let (boxes, scores, classes) = random_boxes(seed.wrapping_add(si as u64), n);
        for kind in kinds {
            let mut variants: Vec<(String, NmsParams)> = Vec::new();
            let base = NmsParams::new(kind, default_threshold(kind));
            variants.push(("plain".into(), base.clone()));
            let mut p = base.clone();
            p.class_aware = true;
            variants.push(("class_aware".into(), p));
            if n >= 3 {
                let mut p = base.clone();
                p.score_threshold = 0.3;
                p.pre_max_size = Some((n / 2).max(1));
                p.post_max_size = Some((n / 10).max(1));
                p.class_aware = true;
                variants.push((format!("score>=0.3 pre={} post={}", n / 2, (n / 10).max(1)), p));
                let mut p = base.clone();
                p.threshold = match kind {
                    NmsKind::Circle => 0.3,
                    _ => 0.1,
                };
                p.pre_max_size = Some(n.min(1000));
                variants.push((format!("thr={} pre={}", p.threshold, n.min(1000)), p));
                let mut p = base.clone();
                p.threshold = match kind {
                    NmsKind::Circle => 3.0,
                    _ => 0.9,
                };
                p.score_threshold = 0.0;
                variants.push((format!("thr={} score>=0", p.threshold), p));
            }
            for (name, params) in variants {
                rows.push(compare_row(
                    ctx,
                    &mut dev,
                    kind_name(kind),
                    format!("random seed {} n={n} {name}", seed.wrapping_add(si as u64)),
                    &boxes,
                    &scores,
                    &classes,
                    &params,
                )?);
            }
        }
    }
    // Dense clusters: every box of a cluster suppresses the cluster's lower-ranked boxes. 20000
    // copies of one box make all 313 groups interact, more pairs than the grouped mask's first
    // lists hold (a rerun with lists of the counted size); 3000 copies run on rank tiles.
    // Detector-like sets (300 objects, boxes spread over +-0.5 m, objects interleaved in score
    // order): chains of partial overlaps, so the sweep needs several rounds and every row tile
    // holds entries of rows that resolve in different rounds.
    for (n, clusters, spread) in
        [(20_000, 100, 0.01), (20_000, 1, 0.01), (3000, 1, 0.01), (20_000, 300, 0.5), (50_000, 300, 0.5)]
    {
        let (boxes, scores, classes) = clustered_boxes(seed, n, clusters, spread);
        for kind in kinds {
            let params = NmsParams::new(kind, default_threshold(kind));
            rows.push(compare_row(
                ctx,
                &mut dev,
                kind_name(kind),
                format!("{clusters} clusters of {} boxes, spread {spread} m", n / clusters),
                &boxes,
                &scores,
                &classes,
                &params,
            )?);
        }
    }
    // The sweep's worst case: one round per box of a suppression chain.
    {
        let n = CHAIN_BOXES;
        let (boxes, scores) = chain_boxes(n);
        for kind in kinds {
            rows.push(compare_row(
                ctx,
                &mut dev,
                kind_name(kind),
                format!("chain of {n} boxes 1 m apart, threshold {}", chain_threshold(kind)),
                &boxes,
                &scores,
                &vec![0; n],
                &NmsParams::new(kind, chain_threshold(kind)),
            )?);
        }
    }
    // Invalid input is refused with the CPU's error.
    {
        let (mut boxes, scores, classes) = random_boxes(seed, 8);
        boxes[3].yaw = 9000.0;
        rows.push(compare_row(
            ctx,
            &mut dev,
            "nms_rot",
            "invalid yaw".into(),
            &boxes,
            &scores,
            &classes,
            &NmsParams::new(NmsKind::RotatedBev, 0.5),
        )?);
    }
    if let Some(dir) = eval_dir {
        let kitti = dir.join("kitti_fov");
        let mut files: Vec<_> = std::fs::read_dir(&kitti)
            .map(|it| it.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.retain(|p| p.to_string_lossy().ends_with(".pointpillars.txt"));
        files.sort();
        for f in files {
            let (boxes, scores, classes) = match read_detections(&f) {
                Ok(v) => v,
                Err(e) => return Err(VerifyError::workload(&f, e)),
            };
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            for (kind, t, ca) in [
                (NmsKind::RotatedBev, 0.01, true),
                (NmsKind::RotatedBev, 0.1, false),
                (NmsKind::AxisAligned, 0.1, false),
                (NmsKind::Circle, 1.0, true),
            ] {
                let mut p = NmsParams::new(kind, t);
                p.class_aware = ca;
                rows.push(compare_row(
                    ctx,
                    &mut dev,
                    kind_name(kind),
                    format!("KITTI {name} thr={t} class_aware={ca}"),
                    &boxes,
                    &scores,
                    &classes,
                    &p,
                )?);
            }
        }
    }
    Ok(rows)
}

/// `cx cy cz length width height yaw class score` per line, '#' comments.
pub fn read_detections(path: &Path) -> Result<(Vec<Box3d>, Vec<f32>, Vec<i32>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (mut b, mut s, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for (ln, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let v: Vec<f32> = line
            .split_whitespace()
            .map(|t| t.parse::<f32>())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("line {}: {e}", ln + 1))?;
        if v.len() != 9 {
            return Err(format!("line {}: {} fields, expected 9", ln + 1, v.len()));
        }
        b.push(Box3d::new(v[0], v[1], v[2], v[3], v[4], v[5], v[6]));
        c.push(v[7] as i32);
        s.push(v[8]);
    }
    Ok((b, s, c))
}

// ---------------------------------------------------------------------------------------------
// Fixed workloads and bench.

/// One fixed workload: name, boxes, scores, params, target and peer figures, peer kept count.
pub struct Workload {
    pub name: String,
    pub boxes: Vec<Box3d>,
    pub scores: Vec<f32>,
    pub params: NmsParams,
    pub target_ms: Option<f64>,
    pub peer_ms: Option<f64>,
    pub peer_kept: Option<usize>,
}

/// The fixed NMS workloads present in `dir` (aa 10000/50000 at IoU 0.5, rotated 4096/20000 at
/// IoU 0.7, circle 0.5 m on the rotated boxes). Axis-aligned `x1 y1 x2 y2` become centre/size
/// boxes on the host; the CPU reference sees the same converted boxes.
pub fn load_workloads(dir: &Path) -> Result<Vec<Workload>, VerifyError> {
    let mut out = Vec::new();
    for (n, target, peer, peer_kept) in
        [(10000usize, Some(0.5), Some(4.86), Some(7474)), (50000, None, Some(86.7), None)]
    {
        let name = format!("aa_boxes_{n}");
        if !dir.join(format!("{name}.bin")).exists() {
            continue;
        }
        let (b, rows) = super::workload_f32(dir, &name, 4)?;
        let (scores, _) = super::workload_f32(dir, &format!("aa_scores_{n}"), 1)?;
        let boxes = (0..rows)
            .map(|i| {
                let (x1, y1, x2, y2) = (b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]);
                Box3d::new((x1 + x2) / 2.0, (y1 + y2) / 2.0, 0.0, x2 - x1, y2 - y1, 1.0, 0.0)
            })
            .collect();
        out.push(Workload {
            name: format!("{name} IoU 0.5"),
            boxes,
            scores,
            params: NmsParams::new(NmsKind::AxisAligned, 0.5),
            target_ms: target,
            peer_ms: peer,
            peer_kept,
        });
    }
    for (n, rot_target, rot_peer, rot_kept, c_target, c_peer, c_kept) in [
        (4096usize, None, None, Some(1518), None, None, Some(1029)),
        (20000, Some(1.0), Some(50.9), Some(2932), Some(0.5), Some(2.43), Some(1661)),
    ] {
        let name = format!("rot_boxes_{n}");
        if !dir.join(format!("{name}.bin")).exists() {
            continue;
        }
        let (b, rows) = super::workload_f32(dir, &name, 7)?;
        let (scores, _) = super::workload_f32(dir, &format!("rot_scores_{n}"), 1)?;
        let boxes: Vec<Box3d> = (0..rows)
            .map(|i| {
                let v = &b[7 * i..7 * i + 7];
                Box3d::new(v[0], v[1], v[2], v[3], v[4], v[5], v[6])
            })
            .collect();
        out.push(Workload {
            name: format!("{name} IoU 0.7"),
            boxes: boxes.clone(),
            scores: scores.clone(),
            params: NmsParams::new(NmsKind::RotatedBev, 0.7),
            target_ms: rot_target,
            peer_ms: rot_peer,
            peer_kept: rot_kept,
        });
        out.push(Workload {
            name: format!("{name} circle 0.5 m"),
            boxes,
            scores,
            params: NmsParams::new(NmsKind::Circle, 0.5),
            target_ms: c_target,
            peer_ms: c_peer,
            peer_kept: c_kept,
        });
    }
    Ok(out)
}

/// GPU vs CPU keep lists on the fixed workloads (each GPU run twice).
pub fn check_workloads(ctx: &GpuContext, dir: &Path) -> Result<Vec<CheckRow>, VerifyError> {
    let mut dev = DeviceNms::new(ctx)?;
    let mut rows = Vec::new();
    for w in load_workloads(dir)? {
        rows.push(compare_row(
            ctx,
            &mut dev,
            kind_name(w.params.kind),
            w.name.clone(),
            &w.boxes,
            &w.scores,
            &[],
            &w.params,
        )?);
    }
    Ok(rows)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// CUDA-event time of the whole device NMS (sort + prep + mask + sweep; boxes already on the
/// device, the keep list's read-back excluded), warm-up then the median of 60 runs, on the fixed
/// workloads in `workloads` and on a 2000-box suppression chain ([`chain_boxes`], axis-aligned and
/// circle). Each row's note has the per-stage medians and whether the keep list equals the CPU
/// reference.
pub fn bench(ctx: &GpuContext, workloads: &Path) -> Result<Vec<BenchRow>, VerifyError> {
    const RUNS: usize = 60;
    let mut rows = Vec::new();
    let mut dev = DeviceNms::new(ctx)?;
    let mut timer = ctx.stage_timer();
    // Beside the fixed workloads, the sweep's worst case (one round per box), to show its cost.
    let chain = [NmsKind::AxisAligned, NmsKind::Circle].map(|kind| {
        let (boxes, scores) = chain_boxes(CHAIN_BOXES);
        Workload {
            name: format!("chain of {CHAIN_BOXES} boxes, threshold {}", chain_threshold(kind)),
            boxes,
            scores,
            params: NmsParams::new(kind, chain_threshold(kind)),
            target_ms: None,
            peer_ms: None,
            peer_kept: None,
        }
    });
    for w in load_workloads(workloads)?.into_iter().chain(chain) {
        let n = w.boxes.len();
        let t0 = std::time::Instant::now();
        let cpu = cpu_nms(&w.boxes, &w.scores, &[], &w.params)?;
        let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
        dev.upload(ctx, &w.boxes, &w.scores, &[])?;
        let first = dev.run(ctx, &w.params)?; // warm-up; sizes the pair lists, chooses the mask
        for _ in 0..3 {
            dev.run(ctx, &w.params)?;
        }
        let mask = dev.last_mask;
        let mut totals = Vec::with_capacity(RUNS);
        let mut stages: Vec<Vec<f64>> = vec![Vec::new(); 4];
        let mut names: Vec<String> = Vec::new();
        let mut same = first == cpu;
        for _ in 0..RUNS {
            let reruns = dev.reruns;
            let l = dev.enqueue(ctx, &w.params, mask, Some(&mut timer))?;
            let st = timer.finish()?;
            let out = dev.read(ctx, l)?;
            if dev.reruns != reruns {
                return Err(VerifyError::PairListOverflow);
            }
            same &= out == Read::Done(cpu.clone());
            totals.push(st.iter().map(|(_, ms)| *ms as f64).sum());
            for (k, (name, ms)) in st.iter().enumerate() {
                if k < stages.len() {
                    stages[k].push(*ms as f64);
                }
                if names.len() <= k {
                    names.push(name.clone());
                }
            }
        }
        let med = median(&mut totals);
        // The other mask on the same boxes (for the choice in DeviceNms::first_mask).
        let other = if mask == Mask::Grouped { Mask::Dense } else { Mask::Grouped };
        let mut other_ms = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let l = dev.enqueue(ctx, &w.params, other, Some(&mut timer))?;
            other_ms.push(timer.finish()?.iter().map(|(_, ms)| *ms as f64).sum());
            let _ = dev.read(ctx, l)?;
        }
        let other_med = median(&mut other_ms);
        let stage_txt: Vec<String> =
            names.iter().zip(stages.iter_mut()).map(|(nm, v)| format!("{nm} {:.3}", median(v))).collect();
        let peer = w.peer_kept.map_or(String::new(), |k| format!(" (peers {k})"));
        rows.push(BenchRow {
            operator: kind_name(w.params.kind).to_string(),
            workload: w.name.clone(),
            points: n,
            median_ms: med,
            runs: RUNS,
            min_bytes: (n * (7 * 4 + 4) + 4 * first.keep.len()) as u64,
            target_ms: w.target_ms,
            peer_ms: w.peer_ms,
            note: format!(
                "kept {} of {}{peer}, keep == CPU: {}; {mask:?} mask; stages ms: {}; {other:?} mask {other_med:.3} ms; CPU ref {:.1} ms",
                first.keep.len(),
                first.candidates,
                if same { "yes" } else { "NO" },
                stage_txt.join(", "),
                cpu_ms
            ),
        });
    }
    Ok(rows)
}
