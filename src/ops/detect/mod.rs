//! Objects from points without a network: ground segmentation, clustering of what stands on the
//! ground, an oriented box per cluster with a coarse class, then rotated BEV NMS: the classical
//! pipeline (Autoware's ground filter + euclidean clustering + shape estimation), as operators that
//! give the same integer outputs on every backend.
//!
//! # Semantics of [`detect`]
//!
//! Every float operation is one IEEE-754 binary32 operation, rounded to nearest even, no FMA, in
//! the order written. `min`/`max` of coordinates follow IEEE totalOrder (`-0.0 < +0.0`; the
//! gathered coordinates are finite), so they do not depend on the order points are visited in;
//! no result below depends on it, which is what lets a GPU reach it with atomics.
//!
//! 1. **Grids.** Two BEV grids centred on the sensor over `[-range_m, range_m)` in x and y: the
//!    ground grid of `ground.cell_m` cells and the cluster grid of `cluster.cell_m` cells, each
//!    `G = ceil(fl(2*range_m / cell))` cells a side. A point's cell is
//!    `(floor(fl(fl(x + range_m) / cell)), floor(fl(fl(y + range_m) / cell)))`; a point outside
//!    `0..G` on either axis of the ground grid is *out of range* (counted, never ground, never
//!    clustered).
//! 2. **Ground level.** `m[c]` = the lowest z of the cell's points (+inf if none). The level is
//!    the lower envelope of cones of slope `ground.max_slope` over the cells within
//!    `W = ground.window_cells` on each axis, L1 distance: with `rise = fl(max_slope * cell_m)` and
//!    `step[d] = fl(d * rise)`, first `r[ix][iy] = min over |d| <= W of fl(m[ix][iy+d] + step[|d|])`,
//!    then `level[ix][iy] = min over |d| <= W of fl(r[ix+d][iy] + step[|d|])` (cells off the grid
//!    skipped; these minima are totalOrder minima too). The ground under a car is at most `step` above the ground seen around it.
//! 3. **Point classes.** A point in range is *ground* iff `z <= fl(level + ground.height_tol_m)`;
//!    otherwise an *object* point iff `z <= fl(level + ground.max_height_m)`; otherwise *overhead*
//!    (canopies, signs: counted, not clustered).
//! 4. **Clusters.** Object points mark their cluster cell occupied. Two occupied cells are
//!    connected when they touch (8-neighbourhood); a cluster is a connected component, and its
//!    *label* is the lowest point index among its points. A cluster is a *candidate* when its point
//!    count is in `cluster.min_points ..= cluster.max_points` and both sides of its axis-aligned BEV
//!    extent (`fl(max x - min x)`, same in y) are at most `fl(hypot(boxes.max_length_m,
//!    boxes.max_width_m))` (no box that passes step 6 has a wider extent, so this only skips work).
//! 5. **Box fit** (minimum-area rectangle over `A = boxes.angles` headings in [0, pi/2)). Heading
//!    `k`: `yaw_k = fl(k * fl(fl(pi/2) / A))`, `(s, c) = nms::sincos_f32(yaw_k)`; every point's
//!    `u = fl(fl(x*c) + fl(y*s))`, `v = fl(fl(y*c) - fl(x*s))`; `area_k = fl(fl(umax - umin) *
//!    fl(vmax - vmin))`. The first `k` with the least area wins. With `du = fl(umax - umin)`,
//!    `dv = fl(vmax - vmin)`, `cu = fl(fl(umin + umax) * 0.5)`, `cv` likewise, the box is
//!    `x = fl(fl(cu*c) - fl(cv*s))`, `y = fl(fl(cu*s) + fl(cv*c))`, `z = fl(fl(zmin + zmax) * 0.5)`,
//!    `height = fl(zmax - zmin)`, and `length = du, width = dv, yaw = yaw_k` if `du >= dv`, else
//!    `length = dv, width = du, yaw = fl(yaw_k + fl(pi/2))`. The box's unit axes come from the
//!    same table: `along = (c, s)` and `across = (-s, c)` (at yaw `fl(yaw_k + fl(pi/2))`) if
//!    `du >= dv`, else `along = (-s, c)` and `across = (c, s)` (at yaw `yaw_k`).
//! 6. **Keep and class.** A fitted cluster is kept iff `length <= boxes.max_length_m`,
//!    `width <= boxes.max_width_m` and `height >= boxes.min_height_m`. Its *clearance* is the
//!    least `fl(z - level)` of its points (how high its lowest point floats above the ground: a
//!    car's is its bumper's, a hedge top's or a wall's far side's is more). Its class comes from
//!    the first window of [`ClassWindows`], in the order car, car_end_on, pedestrian, cyclist,
//!    that holds `(length, width, height, clearance)`, else unknown (3). The `car_end_on` window
//!    holds a car of which only one end is seen, and it only counts when that end faces the
//!    sensor: with `t = fl(fl(x*across.0) + fl(y*across.1))` and `l` likewise with `along`,
//!    `|t| >= |l|`. The box is then completed behind its end to a car: with `a = across` (negated
//!    if `t < 0`) and `h = fl(fl(boxes.end_on_length_m - width) * 0.5)`, `x = fl(x + fl(h*a.0))`,
//!    `y = fl(y + fl(h*a.1))`, `length = end_on_length_m`, `width` = the old length, `yaw` = the
//!    yaw of `across`; z and height stay. Its score is `fl(n / fl(n + boxes.score_half_points))` for its `n` points.
//! 7. **Ids.** Kept clusters are numbered 0.. in ascending label order: `clusters[i]` and
//!    `labels[p] = i` for each of its points; every other point's label is -1.
//! 8. **NMS.** Rotated BEV NMS of the boxes (`ops::nms`, threshold `nms_iou`, class-agnostic);
//!    `keep` lists the surviving cluster ids in score order.

pub mod cuda;

use super::backend::OpError;
use super::nms::{nms, sincos_f32, Box3d, NmsKind, NmsParams};
use super::{ParamError, Validate};
use crate::cloud::Cloud;
use serde::{Deserialize, Serialize};

/// The coarse classes of [`detect`], by label.
pub const CLASS_NAMES: [&str; 4] = ["car", "pedestrian", "cyclist", "unknown"];
pub const CLASS_UNKNOWN: i32 = 3;

/// Largest grid side of either BEV grid: 4096 x 4096 cells (with 80 m of range, cells down to
/// 4 cm). The per-cell state is ~40 bytes on the GPU (9 statistics words), so one such cluster
/// grid is ~670 MB; the defaults use 534 x 534 cells (~11 MB).
pub const MAX_GRID: u32 = 4096;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetectParams {
    /// Half side of the square BEV area around the sensor that is segmented and clustered (m).
    pub range_m: f32,
    pub ground: GroundParams,
    pub cluster: ClusterParams,
    pub boxes: BoxParams,
    /// Rotated BEV IoU above which a box is suppressed by a better-scored one.
    pub nms_iou: f32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroundParams {
    /// Side of a ground cell (m).
    pub cell_m: f32,
    /// Cells on each side over which the lowest points bound a cell's ground level.
    pub window_cells: u32,
    /// Steepest ground slope (rise over run) followed from a cell to its neighbours.
    pub max_slope: f32,
    /// Points at most this far above the ground level are ground (m).
    pub height_tol_m: f32,
    /// Points higher than this above the ground level are overhead, not clustered (m).
    pub max_height_m: f32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterParams {
    /// Side of a cluster cell (m): object points in touching cells are one cluster.
    pub cell_m: f32,
    /// Fewest points of a cluster that gets a box.
    pub min_points: u32,
    /// Most points of a cluster that gets a box.
    pub max_points: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoxParams {
    /// Headings tried in [0, 90) degrees by the minimum-area fit.
    pub angles: u32,
    /// Longest box kept (m).
    pub max_length_m: f32,
    /// Widest box kept (m).
    pub max_width_m: f32,
    /// Lowest box kept (m).
    pub min_height_m: f32,
    /// A cluster of this many points scores 0.5.
    pub score_half_points: f32,
    /// Length a car seen end-on is completed to, behind its visible end (m).
    pub end_on_length_m: f32,
    /// The size windows of the classes.
    pub classes: ClassWindows,
}

/// `[min, max]` of length, width and height (m) that give a box a class; the first window that
/// holds a box wins, in the order written here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassWindows {
    pub car: SizeWindow,
    /// A car of which only one end is seen (its rear or front: the box is the car's width long
    /// and its rounded end deep); such a box is completed to a car (step 6).
    pub car_end_on: SizeWindow,
    pub pedestrian: SizeWindow,
    pub cyclist: SizeWindow,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SizeWindow {
    pub length: [f32; 2],
    pub width: [f32; 2],
    pub height: [f32; 2],
    /// Height of the cluster's lowest point above the ground level.
    pub clearance: [f32; 2],
}

impl SizeWindow {
    fn holds(&self, b: &Box3d, clearance: f32) -> bool {
        let within = |v: f32, w: [f32; 2]| v >= w[0] && v <= w[1];
        within(b.length, self.length)
            && within(b.width, self.width)
            && within(b.height, self.height)
            && within(clearance, self.clearance)
    }
}

impl Default for DetectParams {
    /// Works on 32- to 128-beam scans with the sensor 1.5-2 m above a road.
    fn default() -> Self {
        Self {
            range_m: 80.0,
            ground: GroundParams {
                cell_m: 0.5,
                window_cells: 6,
                max_slope: 0.12,
                height_tol_m: 0.2,
                max_height_m: 2.5,
            },
            cluster: ClusterParams { cell_m: 0.3, min_points: 10, max_points: 20000 },
            boxes: BoxParams {
                angles: 90,
                max_length_m: 8.0,
                max_width_m: 3.5,
                min_height_m: 0.4,
                score_half_points: 30.0,
                end_on_length_m: 4.0,
                classes: ClassWindows {
                    // Passenger cars are at most ~2.1 m wide with their mirrors.
                    car: SizeWindow {
                        length: [2.2, 6.5],
                        width: [0.6, 2.2],
                        height: [0.6, 2.0],
                        clearance: [0.0, 0.6],
                    },
                    // A car's end is rounded (bumper, boot, rear window), so even a rear seen
                    // square-on is some 0.3 m deep; its lowest points are the bumper's and tyres'.
                    car_end_on: SizeWindow {
                        length: [1.3, 2.2],
                        width: [0.3, 1.0],
                        height: [0.6, 1.6],
                        clearance: [0.0, 0.4],
                    },
                    pedestrian: SizeWindow {
                        length: [0.0, 1.2],
                        width: [0.0, 1.0],
                        height: [1.0, 2.1],
                        clearance: [0.0, 0.5],
                    },
                    cyclist: SizeWindow {
                        length: [1.2, 2.2],
                        width: [0.0, 1.0],
                        height: [1.0, 2.1],
                        clearance: [0.0, 0.5],
                    },
                },
            },
            nms_iou: 0.1,
        }
    }
}

impl DetectParams {
    /// Cells on a side of a grid of `cell` metres.
    pub fn grid_side(&self, cell: f32) -> u32 {
        ((2.0 * self.range_m) / cell).ceil() as u32
    }

    /// The class windows in the order they are tried: key, window, the class it gives, and
    /// whether the box is completed as a car seen end-on.
    fn windows(&self) -> [(&'static str, &SizeWindow, i32, bool); 4] {
        let c = &self.boxes.classes;
        [
            ("car", &c.car, 0, false),
            ("car_end_on", &c.car_end_on, 0, true),
            ("pedestrian", &c.pedestrian, 1, false),
            ("cyclist", &c.cyclist, 2, false),
        ]
    }

    /// Step 6: the class of a kept box, and the box reported for it.
    pub fn classify(&self, fit: &Fit, clearance: f32) -> (i32, Box3d) {
        for (_, w, class, end_on) in self.windows() {
            if !w.holds(&fit.bbox, clearance) {
                continue;
            }
            match end_on {
                false => return (class, fit.bbox),
                true => {
                    if let Some(car) = self.complete_end_on(fit) {
                        return (class, car);
                    }
                }
            }
        }
        (CLASS_UNKNOWN, fit.bbox)
    }

    /// Step 6's completion of a car seen end-on, or None when the box's long side is not the one
    /// that faces the sensor (then it cannot be a car's end hiding the rest of the car).
    pub fn complete_end_on(&self, fit: &Fit) -> Option<Box3d> {
        let b = &fit.bbox;
        let dot = |a: [f32; 2]| b.x * a[0] + b.y * a[1];
        let (toward, sideways) = (dot(fit.across), dot(fit.along));
        if toward.abs() < sideways.abs() {
            return None;
        }
        let away = if toward < 0.0 { [-fit.across[0], -fit.across[1]] } else { fit.across };
        let shift = (self.boxes.end_on_length_m - b.width) * 0.5;
        Some(Box3d {
            x: b.x + shift * away[0],
            y: b.y + shift * away[1],
            length: self.boxes.end_on_length_m,
            width: b.length,
            yaw: fit.across_yaw,
            ..*b
        })
    }

    /// Step 6: whether a fitted box is kept.
    pub fn keeps(&self, b: &Box3d) -> bool {
        b.length <= self.boxes.max_length_m && b.width <= self.boxes.max_width_m && b.height >= self.boxes.min_height_m
    }

    /// Step 4: the widest axis-aligned extent a candidate may have.
    pub fn max_extent(&self) -> f32 {
        self.boxes.max_length_m.hypot(self.boxes.max_width_m)
    }

    pub fn score(&self, n: u32) -> f32 {
        let n = n as f32;
        n / (n + self.boxes.score_half_points)
    }

    /// Step 2: `step[d]` for d in 0..=W.
    pub fn slope_steps(&self) -> Vec<f32> {
        let rise = self.ground.max_slope * self.ground.cell_m;
        (0..=self.ground.window_cells).map(|d| d as f32 * rise).collect()
    }

    /// Step 5: the (sin, cos) of every heading, and the headings.
    pub fn headings(&self) -> Vec<(f32, f32, f32)> {
        let delta = std::f32::consts::FRAC_PI_2 / self.boxes.angles as f32;
        (0..self.boxes.angles)
            .map(|k| {
                let yaw = k as f32 * delta;
                let (s, c) = sincos_f32(yaw);
                (yaw, s, c)
            })
            .collect()
    }

    pub fn nms_params(&self) -> NmsParams {
        NmsParams { class_aware: false, ..NmsParams::new(NmsKind::RotatedBev, self.nms_iou) }
    }
}

impl Validate for DetectParams {
    fn validate(&self) -> Result<(), ParamError> {
        let positive = |key: &str, v: f32, max: f32| {
            if v.is_finite() && v > 0.0 && v <= max {
                Ok(())
            } else {
                Err(ParamError::new(key, v, &format!("> 0 and <= {max}")))
            }
        };
        positive("range_m", self.range_m, 1000.0)?;
        positive("ground.cell_m", self.ground.cell_m, 100.0)?;
        positive("cluster.cell_m", self.cluster.cell_m, 100.0)?;
        for (key, cell) in [("ground.cell_m", self.ground.cell_m), ("cluster.cell_m", self.cluster.cell_m)] {
            let g = ((2.0 * self.range_m) / cell).ceil();
            if g > MAX_GRID as f32 {
                return Err(ParamError::new(
                    key,
                    cell,
                    &format!(
                        "at least 2 * range_m / {MAX_GRID} = {} m (the grid would have {g} cells a side)",
                        2.0 * self.range_m / MAX_GRID as f32
                    ),
                ));
            }
        }
        if self.ground.window_cells > 64 {
            return Err(ParamError::new("ground.window_cells", self.ground.window_cells, "0 ..= 64"));
        }
        positive("ground.max_slope", self.ground.max_slope, 10.0)?;
        positive("ground.height_tol_m", self.ground.height_tol_m, 100.0)?;
        positive("ground.max_height_m", self.ground.max_height_m, 1000.0)?;
        if self.ground.max_height_m <= self.ground.height_tol_m {
            return Err(ParamError::new(
                "ground.max_height_m",
                self.ground.max_height_m,
                "must exceed ground.height_tol_m",
            ));
        }
        if self.cluster.min_points == 0 || self.cluster.min_points > self.cluster.max_points {
            return Err(ParamError::new("cluster.min_points", self.cluster.min_points, "1 ..= cluster.max_points"));
        }
        if !(1..=1024).contains(&self.boxes.angles) {
            return Err(ParamError::new("boxes.angles", self.boxes.angles, "1 ..= 1024"));
        }
        positive("boxes.max_length_m", self.boxes.max_length_m, 1000.0)?;
        positive("boxes.max_width_m", self.boxes.max_width_m, 1000.0)?;
        if !(self.boxes.min_height_m.is_finite() && self.boxes.min_height_m >= 0.0) {
            return Err(ParamError::new("boxes.min_height_m", self.boxes.min_height_m, ">= 0"));
        }
        positive("boxes.score_half_points", self.boxes.score_half_points, 1e9)?;
        positive("boxes.end_on_length_m", self.boxes.end_on_length_m, self.boxes.max_length_m)?;
        // A completed car is at least as long as the end it was completed from is long or deep.
        let end = &self.boxes.classes.car_end_on;
        let longest_end = end.length[1].max(end.width[1]);
        if self.boxes.end_on_length_m < longest_end {
            return Err(ParamError::new(
                "boxes.end_on_length_m",
                self.boxes.end_on_length_m,
                &format!(">= boxes.classes.car_end_on's largest length or width ({longest_end})"),
            ));
        }
        for (name, w, _, _) in self.windows() {
            for (side, r) in
                [("length", w.length), ("width", w.width), ("height", w.height), ("clearance", w.clearance)]
            {
                if !(r[0].is_finite() && r[1].is_finite() && 0.0 <= r[0] && r[0] <= r[1]) {
                    return Err(ParamError::new(
                        &format!("boxes.classes.{name}.{side}"),
                        format!("{r:?}"),
                        "[min, max] with 0 <= min <= max",
                    ));
                }
            }
        }
        if !(self.nms_iou.is_finite() && (0.0..=1.0).contains(&self.nms_iou)) {
            return Err(ParamError::new("nms_iou", self.nms_iou, "0 ..= 1"));
        }
        Ok(())
    }
}

/// A point's class after ground segmentation (step 3).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointClass {
    Object = 0,
    Ground = 1,
    Overhead = 2,
    OutOfRange = 3,
}

/// What [`detect`] found in one cloud.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Detections {
    /// Per point: a [`PointClass`] as u8.
    pub point_class: Vec<u8>,
    /// Per point: its kept cluster's id, or -1.
    pub labels: Vec<i32>,
    /// Per kept cluster (by id): its label (lowest point index), point count, box, class, score.
    pub clusters: Vec<Cluster>,
    /// Cluster ids NMS kept, in score order.
    pub keep: Vec<u32>,
    /// Connected components of object cells, candidates among them (step 4).
    pub components: usize,
    pub candidates: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cluster {
    pub label: u32,
    pub points: u32,
    pub bbox: Box3d,
    /// The least height of its points above the ground level (m).
    pub clearance: f32,
    pub class: i32,
    pub score: f32,
}

impl Detections {
    pub fn count(&self, class: PointClass) -> usize {
        self.point_class.iter().filter(|&&c| c == class as u8).count()
    }

    /// The boxes NMS kept, in keep order.
    pub fn kept(&self) -> impl Iterator<Item = &Cluster> {
        self.keep.iter().map(|&k| &self.clusters[k as usize])
    }
}

/// IEEE totalOrder min / max (finite inputs): independent of visiting order, -0.0 below +0.0.
pub fn min_total(a: f32, b: f32) -> f32 {
    if b.total_cmp(&a).is_lt() {
        b
    } else {
        a
    }
}
pub fn max_total(a: f32, b: f32) -> f32 {
    if b.total_cmp(&a).is_gt() {
        b
    } else {
        a
    }
}

/// Step 1: the cell of coordinate `v` in a grid of `g` cells of `cell` metres, if on the grid.
pub fn grid_cell(v: f32, range: f32, cell: f32, g: u32) -> Option<u32> {
    let f = ((v + range) / cell).floor();
    (f >= 0.0 && f < g as f32).then_some(f as u32)
}

/// Step 2 over a dense `g x g` grid of lowest z (row-major, x-major: index `ix * g + iy`).
pub fn ground_levels(lowest: &[f32], g: usize, steps: &[f32]) -> Vec<f32> {
    let w = steps.len() - 1;
    let envelope = |get: &dyn Fn(usize) -> f32, i: usize| {
        let mut m = get(i);
        for d in 1..=w {
            if i >= d {
                m = min_total(m, get(i - d) + steps[d]);
            }
            if i + d < g {
                m = min_total(m, get(i + d) + steps[d]);
            }
        }
        m
    };
    let mut rows = vec![f32::INFINITY; g * g];
    for ix in 0..g {
        let line = &lowest[ix * g..(ix + 1) * g];
        if line.iter().all(|v| v.is_infinite()) {
            continue;
        }
        for iy in 0..g {
            rows[ix * g + iy] = envelope(&|j| line[j], iy);
        }
    }
    let mut level = vec![f32::INFINITY; g * g];
    for ix in 0..g {
        for iy in 0..g {
            level[ix * g + iy] = envelope(&|j| rows[j * g + iy], ix);
        }
    }
    level
}

/// Steps 1-3: each point's [`PointClass`] and its height above the ground level (`fl(z - level)`;
/// 0 out of range).
pub fn segment_ground(cloud: &Cloud, p: &DetectParams) -> (Vec<u8>, Vec<f32>) {
    let (x, y, z) = (cloud.x(), cloud.y(), cloud.z());
    let cell = p.ground.cell_m;
    let g = p.grid_side(cell);
    let cells: Vec<Option<usize>> = (0..cloud.len())
        .map(|i| {
            let ix = grid_cell(x[i], p.range_m, cell, g)?;
            let iy = grid_cell(y[i], p.range_m, cell, g)?;
            Some(ix as usize * g as usize + iy as usize)
        })
        .collect();
    let mut lowest = vec![f32::INFINITY; g as usize * g as usize];
    for (i, c) in cells.iter().enumerate() {
        if let Some(c) = *c {
            lowest[c] = min_total(lowest[c], z[i]);
        }
    }
    let level = ground_levels(&lowest, g as usize, &p.slope_steps());
    let class = cells
        .iter()
        .enumerate()
        .map(|(i, c)| match *c {
            None => PointClass::OutOfRange,
            Some(c) if z[i] <= level[c] + p.ground.height_tol_m => PointClass::Ground,
            Some(c) if z[i] <= level[c] + p.ground.max_height_m => PointClass::Object,
            Some(_) => PointClass::Overhead,
        } as u8)
        .collect();
    let above = cells.iter().enumerate().map(|(i, c)| c.map_or(0.0, |c| z[i] - level[c])).collect();
    (class, above)
}

/// Union-find over dense cells, roots the lowest cell index of their set (any union order gives
/// the same sets).
struct DisjointSets(Vec<u32>);

impl DisjointSets {
    fn find(&mut self, mut a: u32) -> u32 {
        while self.0[a as usize] != a {
            let next = self.0[self.0[a as usize] as usize];
            self.0[a as usize] = next;
            a = next;
        }
        a
    }
    fn union(&mut self, a: u32, b: u32) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.0[ra.max(rb) as usize] = ra.min(rb);
        }
    }
}

/// A component's label, point count, extent in x, y, z and clearance (steps 4 and 6).
#[derive(Debug, Clone, Copy)]
struct Extent {
    label: u32,
    points: u32,
    lo: [f32; 3],
    hi: [f32; 3],
    clearance: f32,
}

impl Extent {
    fn new(label: u32) -> Self {
        Self { label, points: 0, lo: [f32::INFINITY; 3], hi: [f32::NEG_INFINITY; 3], clearance: f32::INFINITY }
    }
    fn add(&mut self, q: [f32; 3], above_ground: f32) {
        self.points += 1;
        self.clearance = min_total(self.clearance, above_ground);
        for a in 0..3 {
            self.lo[a] = min_total(self.lo[a], q[a]);
            self.hi[a] = max_total(self.hi[a], q[a]);
        }
    }
}

/// A fitted box and its axes (unit vectors from the heading table).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    pub bbox: Box3d,
    /// Along the box's length.
    pub along: [f32; 2],
    /// Along its width, at yaw `across_yaw`.
    pub across: [f32; 2],
    pub across_yaw: f32,
}

/// Step 5: the minimum-area box of `points` (x, y, z), with the z range `zmin..zmax`.
pub fn fit_box(points: impl Iterator<Item = [f32; 3]> + Clone, headings: &[(f32, f32, f32)], z: [f32; 2]) -> Fit {
    let mut best: Option<(f32, usize, [f32; 4])> = None;
    for (k, &(_, s, c)) in headings.iter().enumerate() {
        let mut r = [f32::INFINITY, f32::NEG_INFINITY, f32::INFINITY, f32::NEG_INFINITY];
        for q in points.clone() {
            let u = q[0] * c + q[1] * s;
            let v = q[1] * c - q[0] * s;
            r = [min_total(r[0], u), max_total(r[1], u), min_total(r[2], v), max_total(r[3], v)];
        }
        let area = (r[1] - r[0]) * (r[3] - r[2]);
        if best.is_none_or(|(a, _, _)| area < a) {
            best = Some((area, k, r));
        }
    }
    let (_, k, r) = best.expect("at least one heading");
    box_from_extent(headings[k], r, z)
}

/// Step 5's box from the winning heading and its u/v extent `[umin, umax, vmin, vmax]`.
pub fn box_from_extent((yaw, s, c): (f32, f32, f32), r: [f32; 4], z: [f32; 2]) -> Fit {
    let (du, dv) = (r[1] - r[0], r[3] - r[2]);
    let (cu, cv) = ((r[0] + r[1]) * 0.5, (r[2] + r[3]) * 0.5);
    let x = cu * c - cv * s;
    let y = cu * s + cv * c;
    let (u, v) = ([c, s], [-s, c]);
    let turned = yaw + std::f32::consts::FRAC_PI_2;
    let (length, width, yaw, along, across, across_yaw) =
        if du >= dv { (du, dv, yaw, u, v, turned) } else { (dv, du, turned, v, u, yaw) };
    Fit {
        bbox: Box3d { x, y, z: (z[0] + z[1]) * 0.5, length, width, height: z[1] - z[0], yaw },
        along,
        across,
        across_yaw,
    }
}

/// The CPU reference of the module's semantics.
pub fn detect(cloud: &Cloud, p: &DetectParams) -> Result<Detections, OpError> {
    p.validate()?;
    let n = cloud.len();
    if n > u32::MAX as usize / 2 {
        return Err(ParamError::new("points", n, "at most 2^31 - 1 points").into());
    }
    let (point_class, above_ground) = segment_ground(cloud, p);
    let (x, y, z) = (cloud.x(), cloud.y(), cloud.z());
    let cell = p.cluster.cell_m;
    let g = p.grid_side(cell) as usize;
    // Object points' cluster cells; a cell's first point index marks it occupied.
    const EMPTY: u32 = u32::MAX;
    let mut first = vec![EMPTY; g * g];
    let mut point_cell = vec![EMPTY; n];
    for i in 0..n {
        if point_class[i] != PointClass::Object as u8 {
            continue;
        }
        // An object point is on the ground grid, but may be off a cluster grid of another cell size.
        let (Some(ix), Some(iy)) =
            (grid_cell(x[i], p.range_m, cell, g as u32), grid_cell(y[i], p.range_m, cell, g as u32))
        else {
            continue;
        };
        let c = ix as usize * g + iy as usize;
        point_cell[i] = c as u32;
        if first[c] == EMPTY {
            first[c] = i as u32;
        }
    }
    let mut sets = DisjointSets((0..(g * g) as u32).collect());
    for c in 0..g * g {
        if first[c] == EMPTY {
            continue;
        }
        let (ix, iy) = (c / g, c % g);
        // The 4 neighbours after c in a raster walk; the other 4 see c themselves.
        for (dx, dy) in [(0isize, 1isize), (1, -1), (1, 0), (1, 1)] {
            let (nx, ny) = (ix as isize + dx, iy as isize + dy);
            if nx < 0 || ny < 0 || nx >= g as isize || ny >= g as isize {
                continue;
            }
            let nc = nx as usize * g + ny as usize;
            if first[nc] != EMPTY {
                sets.union(c as u32, nc as u32);
            }
        }
    }
    // Components keyed by root cell, in order of first appearance = ascending label.
    let mut component_of_root = std::collections::HashMap::new();
    let mut extents: Vec<Extent> = Vec::new();
    let mut point_component = vec![EMPTY; n];
    for i in 0..n {
        if point_cell[i] == EMPTY {
            continue;
        }
        let root = sets.find(point_cell[i]);
        let k = *component_of_root.entry(root).or_insert_with(|| {
            extents.push(Extent::new(i as u32));
            extents.len() as u32 - 1
        });
        point_component[i] = k;
        extents[k as usize].add([x[i], y[i], z[i]], above_ground[i]);
    }
    let max_extent = p.max_extent();
    let is_candidate = |e: &Extent| {
        (p.cluster.min_points..=p.cluster.max_points).contains(&e.points)
            && e.hi[0] - e.lo[0] <= max_extent
            && e.hi[1] - e.lo[1] <= max_extent
    };
    // Points of each candidate, for the fit.
    let mut members: Vec<Vec<u32>> = vec![Vec::new(); extents.len()];
    for i in 0..n {
        let k = point_component[i];
        if k != EMPTY && is_candidate(&extents[k as usize]) {
            members[k as usize].push(i as u32);
        }
    }
    let headings = p.headings();
    let mut component_id = vec![-1i32; extents.len()];
    let mut clusters = Vec::new();
    let mut candidates = 0;
    for (k, e) in extents.iter().enumerate() {
        if !is_candidate(e) {
            continue;
        }
        candidates += 1;
        let pts = members[k].iter().map(|&i| [x[i as usize], y[i as usize], z[i as usize]]);
        let fit = fit_box(pts, &headings, [e.lo[2], e.hi[2]]);
        if !p.keeps(&fit.bbox) {
            continue;
        }
        let (class, bbox) = p.classify(&fit, e.clearance);
        component_id[k] = clusters.len() as i32;
        clusters.push(Cluster {
            label: e.label,
            points: e.points,
            bbox,
            clearance: e.clearance,
            class,
            score: p.score(e.points),
        });
    }
    let labels =
        point_component.iter().map(|&k| if k == EMPTY { -1 } else { component_id[k as usize] }).collect::<Vec<_>>();
    let keep = keep_boxes(&clusters, p, |b, s, c, np| nms(b, s, c, np).map_err(OpError::from))?;
    Ok(Detections { point_class, labels, clusters, keep, components: extents.len(), candidates })
}

/// Step 8 through an NMS implementation (the CPU reference's or a backend's).
pub fn keep_boxes<E>(
    clusters: &[Cluster],
    p: &DetectParams,
    nms: impl FnOnce(&[Box3d], &[f32], &[i32], &NmsParams) -> Result<crate::ops::nms::NmsOutput, E>,
) -> Result<Vec<u32>, E> {
    let boxes: Vec<Box3d> = clusters.iter().map(|c| c.bbox).collect();
    let scores: Vec<f32> = clusters.iter().map(|c| c.score).collect();
    let classes: Vec<i32> = clusters.iter().map(|c| c.class).collect();
    Ok(nms(&boxes, &scores, &classes, &p.nms_params())?.keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        DetectParams::default().validate().unwrap();
    }

    #[test]
    fn total_order_min_max() {
        assert!(min_total(0.0, -0.0).is_sign_negative());
        assert!(min_total(-0.0, 0.0).is_sign_negative());
        assert!(max_total(-0.0, 0.0).is_sign_positive());
        assert_eq!(min_total(1.0, 2.0), 1.0);
    }

    #[test]
    fn axis_aligned_rectangle_is_fitted_exactly() {
        let p = DetectParams::default();
        let pts: Vec<[f32; 3]> =
            (0..=40).flat_map(|i| [[i as f32 * 0.1, 0.0, 0.0], [i as f32 * 0.1, 2.0, 1.5]]).collect();
        let b = fit_box(pts.iter().copied(), &p.headings(), [0.0, 1.5]).bbox;
        assert_eq!((b.x, b.y, b.length, b.width, b.height, b.yaw), (2.0, 1.0, 4.0, 2.0, 1.5, 0.0));
    }
}
