//! The detector on the device (`cuda/detect.cu`): the semantics of [`super::detect`], the same
//! integer outputs and the same box bits. One frame is 16 launches with no host round trip; the
//! counters, the kept clusters' records, the point classes and the labels are copied back once,
//! and the backend's NMS keeps the boxes.

use super::{Cluster, DetectParams, Detections};
use crate::gpu::{DeviceXyz, GpuContext, GpuError, GrowBuffer};
use crate::ops::nms::Box3d;
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

/// Threads of the per-point and per-cell kernels (`DET_BLOCK`).
const BLOCK: u32 = 256;

/// Kernel parameters; must match `struct DetectArgs` in cuda/detect.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct DetectArgs {
    range: f32,
    ground_cell: f32,
    cluster_cell: f32,
    height_tol: f32,
    max_height: f32,
    max_extent: f32,
    max_length: f32,
    max_width: f32,
    min_height: f32,
    score_half: f32,
    n: u32,
    stride: u32,
    gg: u32,
    gc: u32,
    window: u32,
    min_points: u32,
    max_points: u32,
    angles: u32,
    cand_capacity: u32,
    end_on_length: f32,
    /// Per window, in the order of `ClassWindows`.
    classes: [[f32; 8]; 4],
}
// SAFETY: repr(C), 4-byte fields only, no padding; matches the CUDA struct.
unsafe impl DeviceRepr for DetectArgs {}
const _: () = assert!(std::mem::size_of::<DetectArgs>() == 208);

/// One cluster as the kernels write it; must match `struct ClusterRecord` in cuda/detect.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct ClusterRecord {
    bbox: [f32; 7],
    clearance: f32,
    score: f32,
    label: u32,
    points: u32,
    class: i32,
}
const RECORD_WORDS: usize = 12;
const _: () = assert!(std::mem::size_of::<ClusterRecord>() == 4 * RECORD_WORDS);

impl ClusterRecord {
    fn from_words(w: &[u32]) -> Self {
        let f = |k: usize| f32::from_bits(w[k]);
        Self {
            bbox: std::array::from_fn(f),
            clearance: f(7),
            score: f(8),
            label: w[9],
            points: w[10],
            class: w[11] as i32,
        }
    }
}

/// Device buffers of the detector, kept across frames (grow-only).
pub struct DeviceDetector {
    lowest: GrowBuffer<u32>,
    rows: GrowBuffer<f32>,
    level: GrowBuffer<f32>,
    steps: GrowBuffer<f32>,
    headings: GrowBuffer<f32>,
    gcell: GrowBuffer<u32>,
    ccell: GrowBuffer<u32>,
    above: GrowBuffer<f32>,
    pclass: GrowBuffer<u8>,
    labels: GrowBuffer<i32>,
    first: GrowBuffer<u32>,
    parent: GrowBuffer<u32>,
    stats: GrowBuffer<u32>,
    cand_of_root: GrowBuffer<u32>,
    counters: GrowBuffer<u32>,
    cand_label: GrowBuffer<u32>,
    cand_root: GrowBuffer<u32>,
    label_flag: GrowBuffer<u32>,
    label_rank: GrowBuffer<u32>,
    root_by_rank: GrowBuffer<u32>,
    count_by_rank: GrowBuffer<u32>,
    offsets: GrowBuffer<u32>,
    cursor: GrowBuffer<u32>,
    members: GrowBuffer<u32>,
    records: GrowBuffer<u32>,
    kept: GrowBuffer<u32>,
    ids: GrowBuffer<u32>,
    out: GrowBuffer<u32>,
}

fn blocks(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((n.max(1) as u32).div_ceil(BLOCK), 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

impl DeviceDetector {
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
        let s = &ctx.stream;
        Ok(Self {
            lowest: GrowBuffer::new(s, 0)?,
            rows: GrowBuffer::new(s, 0)?,
            level: GrowBuffer::new(s, 0)?,
            steps: GrowBuffer::new(s, 0)?,
            headings: GrowBuffer::new(s, 0)?,
            gcell: GrowBuffer::new(s, 0)?,
            ccell: GrowBuffer::new(s, 0)?,
            above: GrowBuffer::new(s, 0)?,
            pclass: GrowBuffer::new(s, 0)?,
            labels: GrowBuffer::new(s, 0)?,
            first: GrowBuffer::new(s, 0)?,
            parent: GrowBuffer::new(s, 0)?,
            stats: GrowBuffer::new(s, 0)?,
            cand_of_root: GrowBuffer::new(s, 0)?,
            counters: GrowBuffer::new(s, 4)?,
            cand_label: GrowBuffer::new(s, 0)?,
            cand_root: GrowBuffer::new(s, 0)?,
            label_flag: GrowBuffer::new(s, 0)?,
            label_rank: GrowBuffer::new(s, 0)?,
            root_by_rank: GrowBuffer::new(s, 0)?,
            count_by_rank: GrowBuffer::new(s, 0)?,
            offsets: GrowBuffer::new(s, 0)?,
            cursor: GrowBuffer::new(s, 0)?,
            members: GrowBuffer::new(s, 0)?,
            records: GrowBuffer::new(s, 0)?,
            kept: GrowBuffer::new(s, 0)?,
            ids: GrowBuffer::new(s, 0)?,
            out: GrowBuffer::new(s, 0)?,
        })
    }

    /// Ground, clusters and fitted boxes of the cloud `xyz` (validated parameters); `keep` is
    /// left empty for the caller's NMS.
    pub fn run(&mut self, ctx: &GpuContext, xyz: DeviceXyz<'_>, p: &DetectParams) -> Result<Detections, GpuError> {
        let s = &ctx.stream;
        let n = xyz.len;
        if n > i32::MAX as usize || xyz.stride > u32::MAX as usize {
            return Err(GpuError::TooLarge {
                what: "detector points (32-bit indices)",
                value: n as u64,
                limit: i32::MAX as u64,
            });
        }
        let (gg, gc) = (p.grid_side(p.ground.cell_m) as usize, p.grid_side(p.cluster.cell_m) as usize);
        let cand_capacity = n / p.cluster.min_points as usize + 1;
        let w = |win: &super::SizeWindow| {
            [
                win.length[0],
                win.length[1],
                win.width[0],
                win.width[1],
                win.height[0],
                win.height[1],
                win.clearance[0],
                win.clearance[1],
            ]
        };
        let c = &p.boxes.classes;
        let args = DetectArgs {
            range: p.range_m,
            ground_cell: p.ground.cell_m,
            cluster_cell: p.cluster.cell_m,
            height_tol: p.ground.height_tol_m,
            max_height: p.ground.max_height_m,
            max_extent: p.max_extent(),
            max_length: p.boxes.max_length_m,
            max_width: p.boxes.max_width_m,
            min_height: p.boxes.min_height_m,
            score_half: p.boxes.score_half_points,
            n: n as u32,
            stride: xyz.stride as u32,
            gg: gg as u32,
            gc: gc as u32,
            window: p.ground.window_cells,
            min_points: p.cluster.min_points,
            max_points: p.cluster.max_points,
            angles: p.boxes.angles,
            cand_capacity: cand_capacity as u32,
            end_on_length: p.boxes.end_on_length_m,
            classes: [w(&c.car), w(&c.car_end_on), w(&c.pedestrian), w(&c.cyclist)],
        };
        let steps = p.slope_steps();
        let headings: Vec<f32> = p.headings().into_iter().flat_map(|(y, sn, cs)| [y, sn, cs]).collect();
        s.memcpy_htod(&steps, &mut self.steps.ensure(s, steps.len())?.slice_mut(..steps.len()))?;
        s.memcpy_htod(&headings, &mut self.headings.ensure(s, headings.len())?.slice_mut(..headings.len()))?;
        let (cells_g, cells_c) = (gg * gg, gc * gc);
        let lowest = self.lowest.ensure(s, cells_g)?;
        let rows = self.rows.ensure(s, cells_g)?;
        let level = self.level.ensure(s, cells_g)?;
        let gcell = self.gcell.ensure(s, n)?;
        let ccell = self.ccell.ensure(s, n)?;
        let above = self.above.ensure(s, n)?;
        let pclass = self.pclass.ensure(s, n)?;
        let labels = self.labels.ensure(s, n)?;
        let first = self.first.ensure(s, cells_c)?;
        let parent = self.parent.ensure(s, cells_c)?;
        let stats = self.stats.ensure(s, 9 * cells_c)?;
        let cand_of_root = self.cand_of_root.ensure(s, cells_c)?;
        let counters = self.counters.ensure(s, 4)?;
        let cand_label = self.cand_label.ensure(s, cand_capacity)?;
        let cand_root = self.cand_root.ensure(s, cand_capacity)?;
        let label_flag = self.label_flag.ensure(s, n)?;
        let label_rank = self.label_rank.ensure(s, n)?;
        let root_by_rank = self.root_by_rank.ensure(s, cand_capacity)?;
        let count_by_rank = self.count_by_rank.ensure(s, cand_capacity)?;
        let offsets = self.offsets.ensure(s, cand_capacity)?;
        let cursor = self.cursor.ensure(s, cand_capacity)?;
        let members = self.members.ensure(s, n)?;
        let records = self.records.ensure(s, RECORD_WORDS * cand_capacity)?;
        let kept = self.kept.ensure(s, cand_capacity)?;
        let ids = self.ids.ensure(s, cand_capacity)?;
        let out = self.out.ensure(s, RECORD_WORDS * cand_capacity)?;
        let steps = &*self.steps.ensure(s, 1)?;
        let headings = &*self.headings.ensure(s, 1)?;
        let xyz = xyz.data;
        if n > 0 {
            s.memset_zeros(&mut label_flag.slice_mut(..n))?;
        }
        let f = |name| ctx.function("detect", name);
        // SAFETY (every launch below): the arguments match the kernel's signature in
        // cuda/detect.cu in type and order, and every buffer holds what the kernel indexes
        // (ensured above: cells, points or candidates).
        unsafe {
            let k = f("det_init")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(&mut *lowest).arg(&mut *first).arg(&mut *parent).arg(&mut *stats);
            l.arg(&mut *cand_of_root).arg(&mut *counters);
            l.launch(blocks(cells_g.max(cells_c)))?;

            let k = f("det_lowest")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(xyz).arg(&mut *gcell).arg(&mut *lowest);
            l.launch(blocks(n))?;

            let k = f("det_envelope_y")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(&*lowest).arg(&mut *rows).arg(steps);
            l.launch(blocks(cells_g))?;
            let k = f("det_envelope_x")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(&*rows).arg(&mut *level).arg(steps);
            l.launch(blocks(cells_g))?;

            let k = f("det_classify")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(xyz).arg(&*gcell).arg(&*level).arg(&mut *pclass).arg(&mut *above);
            l.arg(&mut *ccell).arg(&mut *first);
            l.launch(blocks(n))?;

            for name in ["det_union", "det_flatten"] {
                let k = f(name)?;
                let mut l = s.launch_builder(&k);
                l.arg(&args).arg(&*first).arg(&mut *parent);
                l.launch(blocks(cells_c))?;
            }

            let k = f("det_stats")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(xyz).arg(&*ccell).arg(&*above).arg(&*parent).arg(&mut *stats);
            l.launch(blocks(n))?;

            let k = f("det_candidates")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(&*first).arg(&*parent).arg(&*stats).arg(&mut *cand_label).arg(&mut *cand_root);
            l.arg(&mut *label_flag).arg(&mut *counters);
            l.launch(blocks(cells_c))?;

            let one_block = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
            let k = f("det_label_ranks")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(&*counters).arg(&*label_flag).arg(&mut *label_rank);
            l.launch(one_block)?;

            let k = f("det_rank")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(&*cand_label).arg(&*cand_root).arg(&*stats).arg(&*counters).arg(&*label_rank);
            l.arg(&mut *cand_of_root).arg(&mut *root_by_rank).arg(&mut *count_by_rank);
            l.launch(blocks(cand_capacity))?;

            let scan = f("det_scan")?;
            let (candidates, kept_total, members_total) = (1u32, 2u32, 3u32);
            let mut l = s.launch_builder(&scan);
            l.arg(&*count_by_rank).arg(&mut *offsets).arg(&mut *counters).arg(&candidates).arg(&members_total);
            l.launch(one_block)?;

            s.memset_zeros(&mut cursor.slice_mut(..cand_capacity))?;
            let k = f("det_scatter")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(&*ccell).arg(&*parent).arg(&*cand_of_root).arg(&*offsets).arg(&mut *cursor);
            l.arg(&mut *members);
            l.launch(blocks(n))?;

            let k = f("det_fit")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(xyz).arg(&*counters).arg(&*root_by_rank).arg(&*count_by_rank).arg(&*offsets);
            l.arg(&*members).arg(&*stats).arg(headings).arg(&mut *records).arg(&mut *kept);
            let threads = p.boxes.angles.next_multiple_of(32);
            l.launch(LaunchConfig {
                grid_dim: (cand_capacity as u32, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            })?;

            let mut l = s.launch_builder(&scan);
            l.arg(&*kept).arg(&mut *ids).arg(&mut *counters).arg(&candidates).arg(&kept_total);
            l.launch(one_block)?;

            let k = f("det_compact")?;
            let mut l = s.launch_builder(&k);
            l.arg(&*counters).arg(&*records).arg(&*kept).arg(&*ids).arg(&mut *out);
            l.launch(blocks(cand_capacity))?;

            let k = f("det_labels")?;
            let mut l = s.launch_builder(&k);
            l.arg(&args).arg(&*ccell).arg(&*parent).arg(&*cand_of_root).arg(&*kept).arg(&*ids).arg(&mut *labels);
            l.launch(blocks(n))?;
        }
        let counts = s.clone_dtoh(&counters.slice(..4))?;
        let (point_class, labels) = if n == 0 {
            (Vec::new(), Vec::new())
        } else {
            (s.clone_dtoh(&pclass.slice(..n))?, s.clone_dtoh(&labels.slice(..n))?)
        };
        s.synchronize()?;
        let kept = counts[2] as usize;
        let words = if kept == 0 { Vec::new() } else { s.clone_dtoh(&out.slice(..RECORD_WORDS * kept))? };
        s.synchronize()?;
        let clusters = words
            .chunks_exact(RECORD_WORDS)
            .map(|w| {
                let r = ClusterRecord::from_words(w);
                let b = r.bbox;
                Cluster {
                    label: r.label,
                    points: r.points,
                    bbox: Box3d::new(b[0], b[1], b[2], b[3], b[4], b[5], b[6]),
                    clearance: r.clearance,
                    class: r.class,
                    score: r.score,
                }
            })
            .collect();
        Ok(Detections {
            point_class,
            labels,
            clusters,
            keep: Vec::new(),
            components: counts[0] as usize,
            candidates: counts[1] as usize,
        })
    }
}
