//! `lidar-kernels eval`: the detector's boxes against ground-truth boxes.
//!
//! A frame is a scan `NAME.bin` (little-endian float32 rows: `x y z intensity`, plus `ring` in
//! nuScenes sweeps) beside its ground truth `NAME.gt.txt` (one box per line: `class cx cy
//! cz_bottom length width height yaw`, lidar frame; `#` starts a comment).
//!
//! # Scoring
//! Per frame and per class (car, pedestrian, cyclist), and once over every box whatever its class
//! (`all`): predictions of the class are taken in score order (ties by index), each matched to the
//! best still unmatched ground-truth box of the class that it *matches*: centre distance in BEV
//! `<= 1 m` (nearest wins), or, as a separate score, rotated BEV IoU `>= 0.5` (highest wins). A
//! matched prediction is a true positive, a ground-truth box left unmatched a false negative. An
//! unmatched prediction that matches a ground-truth box of another class (a van, a truck, a
//! barrier, a cyclist called a pedestrian) is not counted: it found an object, and that object's
//! own class scores the miss (KITTI's evaluation ignores vans for cars the same way); every other
//! unmatched prediction is a false positive. "Within 40 m" keeps the predictions and the
//! ground-truth boxes whose BEV centre is at most 40 m from the sensor.
//!
//! Ground-truth class names map to ours: car; pedestrian; cyclist, bicycle, motorcycle ->
//! cyclist; anything else (van, truck, bus, misc, barrier, traffic_cone, ...) is another class.

use crate::cloud::{Cloud, CloudView, Header, PointCloud2, PointLayout};
use crate::ops::detect::{Detections, CLASS_NAMES};
use crate::ops::nms::{iou_rotated_bev, Box3d};
use crate::pipeline::{FrameError, Pipeline};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("{path}: {message}")]
    Read { path: String, message: String },
    #[error("{path} line {line}: {message}")]
    BadBox { path: String, line: usize, message: String },
    #[error("no NAME.gt.txt with a NAME.bin beside it in {0} or its subfolders")]
    NoFrames(String),
    #[error("{path}: {source}")]
    Frame { path: String, source: FrameError },
}

/// One ground-truth box: its class name as written, and the box (z at its centre).
#[derive(Debug, Clone, PartialEq)]
pub struct GroundTruth {
    pub class_name: String,
    pub bbox: Box3d,
}

impl GroundTruth {
    /// Our class of this box (0 car, 1 pedestrian, 2 cyclist), or None for another class.
    pub fn class(&self) -> Option<i32> {
        match self.class_name.to_ascii_lowercase().as_str() {
            "car" => Some(0),
            "pedestrian" => Some(1),
            "cyclist" | "bicycle" | "motorcycle" => Some(2),
            _ => None,
        }
    }
}

/// Parses a `*.gt.txt` file's text (`path` labels errors).
pub fn parse_ground_truth(text: &str, path: &str) -> Result<Vec<GroundTruth>, EvalError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |message: String| EvalError::BadBox { path: path.into(), line: n + 1, message };
        let mut parts = line.split_whitespace();
        let class_name = parts.next().expect("non-empty line").to_string();
        let v: Vec<f32> =
            parts.map(|t| t.parse::<f32>().map_err(|e| bad(format!("'{t}': {e}")))).collect::<Result<_, _>>()?;
        if v.len() != 7 || v.iter().any(|x| !x.is_finite()) {
            return Err(bad(format!("expected 7 finite numbers after the class, found {}", v.len())));
        }
        let bbox = Box3d::new(v[0], v[1], v[2] + v[5] * 0.5, v[3], v[4], v[5], v[6]);
        out.push(GroundTruth { class_name, bbox });
    }
    Ok(out)
}

/// A scan with ground truth.
#[derive(Debug, Clone)]
pub struct EvalFrame {
    /// `folder/NAME`, e.g. `kitti_fov/000008`.
    pub name: String,
    pub scan: PathBuf,
    pub ground_truth: PathBuf,
    /// float32 values per point: 5 in a folder named nuscenes*, else 4.
    pub stride: usize,
}

/// Every frame under `dir` (the folder itself and its direct subfolders), sorted by name.
pub fn find_frames(dir: &Path) -> Result<Vec<EvalFrame>, EvalError> {
    let read = |d: &Path| {
        std::fs::read_dir(d).map_err(|e| EvalError::Read { path: d.display().to_string(), message: e.to_string() })
    };
    let mut folders = vec![dir.to_path_buf()];
    for e in read(dir)?.flatten() {
        if e.path().is_dir() {
            folders.push(e.path());
        }
    }
    let mut frames = Vec::new();
    for folder in folders {
        let folder_name = folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for e in read(&folder)?.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let Some(stem) = file.strip_suffix(".gt.txt") else { continue };
            let scan = folder.join(format!("{stem}.bin"));
            if scan.is_file() {
                let stride = if folder_name.starts_with("nuscenes") { 5 } else { 4 };
                frames.push(EvalFrame { name: format!("{folder_name}/{stem}"), scan, ground_truth: e.path(), stride });
            }
        }
    }
    frames.sort_by(|a, b| a.name.cmp(&b.name));
    if frames.is_empty() {
        return Err(EvalError::NoFrames(dir.display().to_string()));
    }
    Ok(frames)
}

/// A `.bin` scan of `stride` float32 per point as a cloud (x, y, z, intensity).
pub fn load_scan(path: &Path, stride: usize) -> Result<Cloud, EvalError> {
    let mut columns = crate::bag::sample::read_f32_columns(path, stride)
        .map_err(|e| EvalError::Read { path: path.display().to_string(), message: e.to_string() })?;
    let mut column = |k: usize| std::mem::take(&mut columns[k]);
    Ok(Cloud::from_xyz(column(0), column(1), column(2)).with_channel("intensity", column(3)))
}

/// How a prediction matches a ground-truth box.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Matcher {
    /// BEV centre distance at most this many metres.
    CentreDistance(f32),
    /// Rotated BEV IoU at least this.
    RotatedIou(f32),
}

impl Matcher {
    /// How well `p` matches `g` (higher is better), if it does.
    fn quality(self, p: &Box3d, g: &Box3d) -> Option<f32> {
        match self {
            Matcher::CentreDistance(d) => {
                let dist = (p.x - g.x).hypot(p.y - g.y);
                (dist <= d).then_some(-dist)
            }
            Matcher::RotatedIou(t) => {
                let iou = iou_rotated_bev(p, g);
                (iou >= t).then_some(iou)
            }
        }
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Matcher::CentreDistance(d) => write!(f, "centre <= {d} m"),
            Matcher::RotatedIou(t) => write!(f, "BEV IoU >= {t}"),
        }
    }
}

/// True positives, false positives, false negatives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub tp: usize,
    pub fp: usize,
    pub fn_: usize,
}

impl Counts {
    pub fn add(&mut self, o: Counts) {
        self.tp += o.tp;
        self.fp += o.fp;
        self.fn_ += o.fn_;
    }
    pub fn precision(&self) -> Option<f64> {
        (self.tp + self.fp > 0).then(|| self.tp as f64 / (self.tp + self.fp) as f64)
    }
    pub fn recall(&self) -> Option<f64> {
        (self.tp + self.fn_ > 0).then(|| self.tp as f64 / (self.tp + self.fn_) as f64)
    }
    pub fn f1(&self) -> Option<f64> {
        let d = 2 * self.tp + self.fp + self.fn_;
        (d > 0).then(|| 2.0 * self.tp as f64 / d as f64)
    }
}

/// A predicted box with its class and score.
#[derive(Debug, Clone, Copy)]
pub struct Prediction {
    pub bbox: Box3d,
    pub class: i32,
    pub score: f32,
}

/// Which boxes a score row covers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selection {
    /// A class (0..3), or None for every box whatever its class.
    pub class: Option<i32>,
    /// Only boxes with a BEV centre at most this far from the sensor.
    pub max_range: Option<f32>,
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.class.map_or("all", |c| CLASS_NAMES[c as usize]))?;
        if let Some(r) = self.max_range {
            write!(f, " within {r} m")?;
        }
        Ok(())
    }
}

/// Scores one frame's predictions (see the module documentation).
pub fn score_frame(preds: &[Prediction], truth: &[GroundTruth], sel: Selection, matcher: Matcher) -> Counts {
    let in_range = |b: &Box3d| sel.max_range.is_none_or(|r| b.x.hypot(b.y) <= r);
    let of_class = |c: Option<i32>| sel.class.is_none() || c == sel.class;
    let mut order: Vec<usize> =
        (0..preds.len()).filter(|&i| in_range(&preds[i].bbox) && of_class(Some(preds[i].class))).collect();
    order.sort_by(|&a, &b| preds[b].score.total_cmp(&preds[a].score).then(a.cmp(&b)));
    let targets: Vec<usize> =
        (0..truth.len()).filter(|&j| in_range(&truth[j].bbox) && of_class(truth[j].class())).collect();
    let mut taken = vec![false; truth.len()];
    let mut c = Counts::default();
    for i in order {
        let p = &preds[i].bbox;
        let best = targets
            .iter()
            .filter(|&&j| !taken[j])
            .filter_map(|&j| matcher.quality(p, &truth[j].bbox).map(|q| (q, j)))
            .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        match best {
            Some((_, j)) => {
                taken[j] = true;
                c.tp += 1;
            }
            // Another class's box (any range: its centre may sit just past the cut) found it.
            None if truth.iter().any(|g| !of_class(g.class()) && matcher.quality(p, &g.bbox).is_some()) => {}
            None => c.fp += 1,
        }
    }
    c.fn_ = targets.iter().filter(|&&j| !taken[j]).count();
    c
}

/// The score rows `eval` prints: every class over all ranges, and cars within 40 m.
pub fn selections() -> Vec<Selection> {
    let mut s = vec![Selection { class: None, max_range: None }];
    s.extend((0..3).map(|c| Selection { class: Some(c), max_range: None }));
    s.push(Selection { class: Some(0), max_range: Some(40.0) });
    s
}

pub const MATCHERS: [Matcher; 2] = [Matcher::CentreDistance(1.0), Matcher::RotatedIou(0.5)];

/// One evaluated frame.
#[derive(Debug, Clone)]
pub struct FrameResult {
    pub name: String,
    pub points: usize,
    /// The gathered cloud the detections index.
    pub cloud: Cloud,
    pub detections: Detections,
    pub truth: Vec<GroundTruth>,
    /// The detect stage's wall time.
    pub detect_time: Duration,
    /// Per matcher, per selection of [`selections`].
    pub counts: Vec<Vec<Counts>>,
}

/// The kept boxes of a frame's detections as predictions.
pub fn predictions(d: &Detections) -> Vec<Prediction> {
    d.kept().map(|c| Prediction { bbox: c.bbox, class: c.class, score: c.score }).collect()
}

/// Runs `pipeline` (its detect stage enabled) on one frame and scores it.
pub fn eval_frame(pipeline: &mut Pipeline, frame: &EvalFrame) -> Result<FrameResult, EvalError> {
    let path = frame.scan.display().to_string();
    let cloud = load_scan(&frame.scan, frame.stride)?;
    let text = std::fs::read_to_string(&frame.ground_truth)
        .map_err(|e| EvalError::Read { path: frame.ground_truth.display().to_string(), message: e.to_string() })?;
    let truth = parse_ground_truth(&text, &frame.ground_truth.display().to_string())?;
    let header = Header { stamp_sec: 0, stamp_nanosec: 0, frame_id: "lidar".into() };
    let msg = PointCloud2::from_cloud(header, &cloud, &PointLayout::packed_for(&cloud));
    let view = CloudView::new(msg).map_err(|e| EvalError::Frame { path: path.clone(), source: e.into() })?;
    let out = pipeline.process(view).map_err(|source| EvalError::Frame { path: path.clone(), source })?;
    let detections = out.results.detections.clone().expect("eval runs the detect stage");
    let detect_time = out.timings.iter().find(|(s, _)| *s == "detect").map_or(Duration::ZERO, |(_, d)| *d);
    let preds = predictions(&detections);
    let counts = MATCHERS
        .iter()
        .map(|&m| selections().into_iter().map(|s| score_frame(&preds, &truth, s, m)).collect())
        .collect();
    Ok(FrameResult {
        name: frame.name.clone(),
        points: out.results.points,
        cloud: out.view.gather().cloud,
        detections,
        truth,
        detect_time,
        counts,
    })
}

/// The score table of a set of frames (markdown).
pub fn summary_table(results: &[&FrameResult]) -> String {
    let mut s = String::from(
        "| match | boxes | TP | FP | FN | precision | recall | F1 |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    for (mi, m) in MATCHERS.iter().enumerate() {
        for (si, sel) in selections().iter().enumerate() {
            let mut c = Counts::default();
            for r in results {
                c.add(r.counts[mi][si]);
            }
            s += &format!(
                "| {m} | {sel} | {} | {} | {} | {} | {} | {} |\n",
                c.tp,
                c.fp,
                c.fn_,
                f(c.precision()),
                f(c.recall()),
                f(c.f1())
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gt(class: &str, x: f32, y: f32) -> GroundTruth {
        GroundTruth { class_name: class.into(), bbox: Box3d::new(x, y, 0.0, 4.0, 2.0, 1.5, 0.0) }
    }
    fn pred(class: i32, x: f32, y: f32, score: f32) -> Prediction {
        Prediction { bbox: Box3d::new(x, y, 0.0, 4.0, 2.0, 1.5, 0.0), class, score }
    }

    #[test]
    fn one_to_one_matching_and_ignored_classes() {
        let truth = [gt("Car", 10.0, 0.0), gt("Van", 20.0, 0.0), gt("Car", 50.0, 0.0)];
        // Two predictions on the first car: one TP, one FP. One on the van: ignored. One far off: FP.
        let preds =
            [pred(0, 10.2, 0.0, 0.9), pred(0, 10.0, 0.5, 0.8), pred(0, 20.0, 0.3, 0.7), pred(0, 30.0, 5.0, 0.6)];
        let all_cars = Selection { class: Some(0), max_range: None };
        let c = score_frame(&preds, &truth, all_cars, Matcher::CentreDistance(1.0));
        assert_eq!(c, Counts { tp: 1, fp: 2, fn_: 1 });
        let near = Selection { class: Some(0), max_range: Some(40.0) };
        assert_eq!(score_frame(&preds, &truth, near, Matcher::CentreDistance(1.0)), Counts { tp: 1, fp: 2, fn_: 0 });
        // IoU: the 0.2 m shift keeps IoU 0.9 (>= 0.5), the 0.5 m one 0.6 (but the car is taken).
        let c = score_frame(&preds, &truth, all_cars, Matcher::RotatedIou(0.5));
        assert_eq!(c, Counts { tp: 1, fp: 2, fn_: 1 });
    }

    #[test]
    fn ground_truth_file_parses_and_refuses_bad_lines() {
        let t = parse_ground_truth("# header\nCar 1 2 -1.5 4 2 1.6 0.1\n\n", "x").unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].bbox.z, -1.5 + 0.8);
        assert_eq!(t[0].class(), Some(0));
        let e = parse_ground_truth("Car 1 2 x 4 2 1.6 0.1\n", "f.gt.txt").unwrap_err().to_string();
        assert!(e.contains("f.gt.txt line 1") && e.contains("'x'"), "{e}");
        assert!(parse_ground_truth("Car 1 2 3\n", "f").is_err());
    }
}

/// `eval`: every frame under `dir` through `config` on `engine`; the report (markdown).
pub fn run(
    dir: &Path,
    config: crate::pipeline::PipelineConfig,
    engine: crate::pipeline::Engine,
    render: Option<&Path>,
) -> Result<String, anyhow::Error> {
    let frames = find_frames(dir)?;
    let backend = engine.describe();
    let mut pipeline = Pipeline::with_engine(config, engine);
    let mut results = Vec::new();
    let mut report = format!("eval of {} frames under {} (backend {backend})\n\n", frames.len(), dir.display());
    report += "| frame | points | ground | clusters | boxes | cars (GT) | car TP/FP/FN <= 40 m, centre | detect ms |\n|---|---:|---:|---:|---:|---:|---|---:|\n";
    for frame in &frames {
        let r = eval_frame(&mut pipeline, frame)?;
        let d = &r.detections;
        let c = r.counts[0][4];
        let cars = r.truth.iter().filter(|g| g.class() == Some(0)).count();
        report += &format!(
            "| {} | {} | {} | {} | {} | {} | {}/{}/{} | {:.2} |\n",
            r.name,
            r.points,
            d.count(crate::ops::detect::PointClass::Ground),
            d.clusters.len(),
            d.keep.len(),
            cars,
            c.tp,
            c.fp,
            c.fn_,
            r.detect_time.as_secs_f64() * 1e3
        );
        if let Some(dir) = render {
            render_frame(&r, dir)?;
        }
        results.push(r);
    }
    let mut sets: Vec<&str> = results.iter().map(|r| r.name.split('/').next().unwrap_or("")).collect();
    sets.dedup();
    for set in sets {
        let of_set: Vec<&FrameResult> = results.iter().filter(|r| r.name.split('/').next() == Some(set)).collect();
        let mut times: Vec<f64> = of_set.iter().map(|r| r.detect_time.as_secs_f64() * 1e3).collect();
        times.sort_by(f64::total_cmp);
        report += &format!(
            "\n{set}: {} frames, detect median {:.2} ms\n\n{}",
            of_set.len(),
            times[times.len() / 2],
            summary_table(&of_set)
        );
    }
    Ok(report)
}

/// The frame's picture, `DIR/<folder>_<name>.png`.
fn render_frame(r: &FrameResult, dir: &Path) -> Result<(), anyhow::Error> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{}.png", r.name.replace('/', "_")));
    let truth: Vec<Box3d> = r.truth.iter().map(|g| g.bbox).collect();
    let all = r.counts[0][0];
    let cars = r.counts[0][4];
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    let scene = crate::render::Scene {
        cloud: &r.cloud,
        detections: &r.detections,
        truth: &truth,
        lines: vec![
            r.name.clone(),
            crate::render::counts_line(&r.detections, r.points),
            format!(
                "all classes, centre <= 1 m: precision {} recall {} ({} ground-truth boxes)",
                f(all.precision()),
                f(all.recall()),
                r.truth.len()
            ),
            format!("cars within 40 m: precision {} recall {}", f(cars.precision()), f(cars.recall())),
        ],
    };
    crate::render::write_png(&scene, &path).with_context(|| format!("writing {}", path.display()))
}
