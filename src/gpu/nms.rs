//! Non-maximum suppression on the device (`cuda/nms.cu`): the same parameters, semantics and keep
//! lists as the CPU reference [`crate::ops::nms::nms`], bit for bit.
//!
//! Everything after the upload runs on the device with no host round trip:
//! 1. **sort**: a 64-bit key per box, `(!ordered(score) << 32) | index` for candidates
//!    (`score >= score_threshold`, `-0.0` and `+0.0` tie), all ones otherwise; the rank of each
//!    key is the number of smaller keys (an exact counting sort: keys are unique, so ranks are a
//!    permutation, deterministic whatever the scheduling); `pre_max_size` keeps ranks below it.
//! 2. **mask**: one 64-thread block per (row tile, column tile) of the upper triangle; the pair
//!    test is the kind's exact f32 formula, with the BEV pre-filter first (bounding rectangles
//!    must overlap strictly: IoU is 0 otherwise). Diagonal words go to a dense `diag` array; the
//!    other words are stored only when non-zero, appended to the row tile's entry list (a sparse
//!    mask: boxes far apart never produce an entry, so 20k boxes need ~MBs, not 50 MB).
//! 3. **sweep**: one block walks the row tiles in rank order with the `removed` bitvector in
//!    shared memory: a tile's kept rows follow from its removed word and the diagonal words (only
//!    kept rows with a non-zero diagonal word are visited), then the kept rows' entries are OR-ed
//!    into `removed`; the next tile's entries are prefetched meanwhile. `post_max_size` stops it.
//! 4. the kept input indices and their count are the only data copied back.
//!
//! A row tile whose entries exceed the list capacity is detected (an overflow counter); the run
//! is then repeated once with a large enough capacity, so the result never depends on it.

use super::context::{GpuContext, GrowBuffer, StageTimer};
use super::report::{BenchRow, CheckRow, Rng};
use super::GpuError;
use crate::ops::nms::{nms as cpu_nms, Box3d, NmsError, NmsKind, NmsOutput, NmsParams};
use cudarc::driver::{sys, LaunchConfig, PushKernelArg};
use std::path::Path;

const TILE: usize = 64;
const AUX_BLOCK: u32 = 256;
/// Must match SWEEP_THREADS / SWEEP_EPT in cuda/nms.cu.
const SWEEP_THREADS: u32 = 512;
const SWEEP_EPT: usize = 2048;
/// Initial entry capacity per row tile (grows when a run overflows it).
const INITIAL_TILE_CAPACITY: usize = 4096;
/// Row tiles are limited so that the triangular mask grid fits a 1D grid (< 2^31 blocks).
const MAX_TILES: usize = 65_000;

/// Why the GPU NMS failed: the input (same checks and errors as the CPU) or the device.
#[derive(Debug, thiserror::Error)]
pub enum NmsGpuError {
    #[error(transparent)]
    Input(#[from] NmsError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

impl From<cudarc::driver::DriverError> for NmsGpuError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Self::Gpu(GpuError::Driver(e))
    }
}

/// The CPU reference's input checks, shared so that both backends refuse the same input alike.
pub use crate::ops::nms::validate_input;

/// Device buffers of the NMS (grow-only; reuse one `DeviceNms` frame after frame).
pub struct DeviceNms {
    n: usize,
    boxes: GrowBuffer<f32>,
    scores: GrowBuffer<f32>,
    classes: GrowBuffer<i32>,
    keys: GrowBuffer<u64>,
    rank: GrowBuffer<u32>,
    order: GrowBuffer<u32>,
    prep: GrowBuffer<f32>,
    diag: GrowBuffer<u64>,
    tilecnt: GrowBuffer<u32>,
    entries: GrowBuffer<u32>,
    counters: GrowBuffer<u32>,
    out: GrowBuffer<u32>,
    tile_capacity: usize,
    smem_attr: usize,
    /// Runs repeated because a row tile's entry list overflowed.
    pub reruns: u64,
}

/// What one enqueued run needs to read its result.
#[derive(Debug, Clone, Copy)]
struct Launched {
    pre: usize,
    tile_capacity: usize,
}

impl DeviceNms {
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
        let s = &ctx.stream;
        Ok(Self {
            n: 0,
            boxes: GrowBuffer::new(s, 0)?,
            scores: GrowBuffer::new(s, 0)?,
            classes: GrowBuffer::new(s, 1)?,
            keys: GrowBuffer::new(s, 0)?,
            rank: GrowBuffer::new(s, 0)?,
            order: GrowBuffer::new(s, 0)?,
            prep: GrowBuffer::new(s, 0)?,
            diag: GrowBuffer::new(s, 0)?,
            tilecnt: GrowBuffer::new(s, 0)?,
            entries: GrowBuffer::new(s, 0)?,
            counters: GrowBuffer::new(s, 4)?,
            out: GrowBuffer::new(s, 4)?,
            tile_capacity: INITIAL_TILE_CAPACITY,
            smem_attr: 0,
            reruns: 0,
        })
    }

    /// Copies the boxes (7 floats each), scores and classes (may be empty unless class-aware)
    /// to the device. Checks nothing: [`DeviceNms::run`] callers validate first.
    pub fn upload(
        &mut self,
        ctx: &GpuContext,
        boxes: &[Box3d],
        scores: &[f32],
        classes: &[i32],
    ) -> Result<(), GpuError> {
        let s = &ctx.stream;
        let n = boxes.len();
        assert_eq!(scores.len(), n);
        self.n = n;
        if n == 0 {
            return Ok(());
        }
        let flat: Vec<f32> = boxes.iter().flat_map(|b| [b.x, b.y, b.z, b.length, b.width, b.height, b.yaw]).collect();
        let db = self.boxes.ensure(s, 7 * n)?;
        s.memcpy_htod(&flat, &mut db.slice_mut(..7 * n))?;
        let ds = self.scores.ensure(s, n)?;
        s.memcpy_htod(scores, &mut ds.slice_mut(..n))?;
        if classes.len() == n {
            let dc = self.classes.ensure(s, n)?;
            s.memcpy_htod(classes, &mut dc.slice_mut(..n))?;
        }
        Ok(())
    }

    /// Enqueues the whole device NMS on the uploaded boxes (no synchronisation). With a timer,
    /// records the stages `sort`, `prep`, `mask`, `sweep`.
    fn enqueue(
        &mut self,
        ctx: &GpuContext,
        params: &NmsParams,
        mut timer: Option<&mut StageTimer>,
    ) -> Result<Launched, GpuError> {
        let s = &ctx.stream;
        let n = self.n;
        let pre = params.pre_max_size.unwrap_or(usize::MAX).min(n);
        let post = params.post_max_size.unwrap_or(usize::MAX).min(n).min(i32::MAX as usize);
        let wt = pre.div_ceil(TILE);
        if n > i32::MAX as usize || wt > MAX_TILES {
            return Err(GpuError::Unsupported(format!(
                "GPU NMS takes at most {} candidates after pre_max_size ({pre} given)",
                MAX_TILES * TILE
            )));
        }
        let capt = self.tile_capacity;
        if let Some(t) = timer.as_deref_mut() {
            t.start()?;
        }
        let counters = self.counters.ensure(s, 4)?;
        s.memset_zeros(&mut counters.slice_mut(..4))?;
        let keys = self.keys.ensure(s, n)?;
        let rank = self.rank.ensure(s, n)?;
        let tilecnt = self.tilecnt.ensure(s, wt.max(1))?;
        let order = self.order.ensure(s, pre.max(1))?;
        let prep = self.prep.ensure(s, 12 * pre.max(1))?;
        let diag = self.diag.ensure(s, TILE * wt.max(1))?;
        let entries = self.entries.ensure(s, 4 * capt * wt.max(1))?;
        let out = self.out.ensure(s, 4 + pre)?;
        let (n_i, pre_i, post_i, wt_i, capt_i) = (n as i32, pre as i32, post as i32, wt as i32, capt as i32);
        let bx = n.div_ceil(AUX_BLOCK as usize) as u32;

        // 1. keys, ranks
        {
            let f = ctx.function("nms", "nms_keys")?;
            let mut l = s.launch_builder(&f);
            let st = params.score_threshold;
            l.arg(&*self.scores.ensure(s, n)?).arg(&n_i).arg(&st).arg(&mut *keys).arg(&mut *rank);
            l.arg(&mut *tilecnt).arg(&wt_i).arg(&mut *counters);
            let cfg = LaunchConfig { grid_dim: (bx, 1, 1), block_dim: (AUX_BLOCK, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: argument types/order match nms_keys; keys, rank >= n, tilecnt >= wt, counters >= 4.
            unsafe { l.launch(cfg) }?;
        }
        {
            let f = ctx.function("nms", "nms_rank")?;
            let target_blocks = 8 * ctx.sm_count.max(1) as u32;
            let chunks = target_blocks.div_ceil(bx).clamp(1, bx);
            let chunk_tiles = bx.div_ceil(chunks);
            let chunks = bx.div_ceil(chunk_tiles);
            let chunk_i = chunk_tiles as i32;
            let mut l = s.launch_builder(&f);
            l.arg(&*keys).arg(&n_i).arg(&chunk_i).arg(&mut *rank);
            let cfg = LaunchConfig { grid_dim: (bx, chunks, 1), block_dim: (AUX_BLOCK, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: matches nms_rank; keys and rank hold n elements.
            unsafe { l.launch(cfg) }?;
        }
        if let Some(t) = timer.as_deref_mut() {
            t.stage("sort")?;
        }
        // 2. order + per-box preparation
        let kind_i: i32 = match params.kind {
            NmsKind::AxisAligned => 0,
            NmsKind::RotatedBev => 1,
            NmsKind::Circle => 2,
        };
        {
            let f = ctx.function("nms", "nms_prep")?;
            let ca = params.class_aware as i32;
            let mut l = s.launch_builder(&f);
            l.arg(&*self.boxes.ensure(s, 7 * n)?).arg(&*self.classes.ensure(s, 1)?).arg(&ca).arg(&kind_i).arg(&n_i);
            l.arg(&pre_i).arg(&*keys).arg(&*rank).arg(&mut *order).arg(&mut *prep);
            let cfg = LaunchConfig { grid_dim: (bx, 1, 1), block_dim: (AUX_BLOCK, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: matches nms_prep; classes hold n elements when class_aware (checked by the
            // caller), order >= pre, prep >= 12 * pre.
            unsafe { l.launch(cfg) }?;
        }
        if let Some(t) = timer.as_deref_mut() {
            t.stage("prep")?;
        }
        // 3. mask over the upper triangle of row/column tiles
        {
            let name = match params.kind {
                NmsKind::AxisAligned => "nms_mask_aa",
                NmsKind::RotatedBev => "nms_mask_rot",
                NmsKind::Circle => "nms_mask_circle",
            };
            let f = ctx.function("nms", name)?;
            let t = match params.kind {
                NmsKind::Circle => params.threshold * params.threshold,
                _ => params.threshold,
            };
            let blocks = (wt * (wt + 1) / 2) as u32;
            let (mut cnt_view, mut ovf_view) = counters.split_at_mut(1);
            let mut l = s.launch_builder(&f);
            l.arg(&*prep).arg(&mut cnt_view).arg(&pre_i).arg(&wt_i).arg(&t).arg(&mut *diag).arg(&mut *tilecnt);
            l.arg(&mut *entries).arg(&capt_i).arg(&mut ovf_view);
            let cfg =
                LaunchConfig { grid_dim: (blocks.max(1), 1, 1), block_dim: (TILE as u32, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: matches the mask kernels; diag >= 64*wt, tilecnt >= wt, entries >= 4*capt*wt.
            unsafe { l.launch(cfg) }?;
        }
        if let Some(t) = timer.as_deref_mut() {
            t.stage("mask")?;
        }
        // 4. sweep
        {
            let f = ctx.function("nms", "nms_sweep")?;
            let smem = 2 * SWEEP_EPT * 16 + 2 * TILE * 8 + wt.max(1) * 8;
            if smem > self.smem_attr {
                let max =
                    ctx.ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                        as usize;
                if smem + 256 > max {
                    return Err(GpuError::Unsupported(format!(
                        "GPU NMS sweep needs {smem} bytes of shared memory for {pre} candidates; the device allows {max}"
                    )));
                }
                f.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem.max(48 * 1024) as i32,
                )?;
                self.smem_attr = smem.max(48 * 1024);
            }
            let mut l = s.launch_builder(&f);
            l.arg(&*counters).arg(&pre_i).arg(&post_i).arg(&*diag).arg(&*tilecnt).arg(&*entries).arg(&capt_i);
            l.arg(&*order).arg(&mut *out);
            let cfg =
                LaunchConfig { grid_dim: (1, 1, 1), block_dim: (SWEEP_THREADS, 1, 1), shared_mem_bytes: smem as u32 };
            // SAFETY: matches nms_sweep; out >= 4 + pre; shared memory as laid out in the kernel.
            unsafe { l.launch(cfg) }?;
        }
        if let Some(t) = timer.as_deref_mut() {
            t.stage("sweep")?;
        }
        Ok(Launched { pre, tile_capacity: capt })
    }

    /// Reads the result of an enqueued run: Ok(None) when a row tile overflowed (capacity grown).
    fn read(&mut self, ctx: &GpuContext, l: Launched) -> Result<Option<NmsOutput>, GpuError> {
        let s = &ctx.stream;
        let counters = s.clone_dtoh(&self.counters.ensure(s, 4)?.slice(..4))?;
        let head = s.clone_dtoh(&self.out.ensure(s, 4 + l.pre)?.slice(..4))?;
        s.synchronize()?;
        let overflow = counters[1] as usize;
        if overflow > l.tile_capacity {
            self.tile_capacity = overflow.next_multiple_of(1024).max(l.tile_capacity * 2);
            self.reruns += 1;
            tracing::debug!(capacity = self.tile_capacity, "NMS tile entry list grown, rerun");
            return Ok(None);
        }
        let kept = head[0] as usize;
        let m = head[1] as usize;
        let keep =
            if kept == 0 { Vec::new() } else { s.clone_dtoh(&self.out.ensure(s, 4 + l.pre)?.slice(4..4 + kept))? };
        s.synchronize()?;
        Ok(Some(NmsOutput { keep, candidates: m }))
    }

    /// Runs the NMS on the uploaded boxes and returns the keep list (input indices, rank order).
    /// The caller validated the input (see [`validate_input`]).
    pub fn run(&mut self, ctx: &GpuContext, params: &NmsParams) -> Result<NmsOutput, GpuError> {
        self.run_timed(ctx, params, None)
    }

    pub fn run_timed(
        &mut self,
        ctx: &GpuContext,
        params: &NmsParams,
        mut timer: Option<&mut StageTimer>,
    ) -> Result<NmsOutput, GpuError> {
        if self.n == 0 {
            return Ok(NmsOutput { keep: Vec::new(), candidates: 0 });
        }
        loop {
            let l = self.enqueue(ctx, params, timer.as_deref_mut())?;
            if let Some(out) = self.read(ctx, l)? {
                return Ok(out);
            }
        }
    }
}

/// GPU NMS with the CPU reference's parameters, checks and semantics; the keep list equals
/// [`crate::ops::nms::nms`]'s bit for bit.
pub fn nms(
    ctx: &GpuContext,
    boxes: &[Box3d],
    scores: &[f32],
    classes: &[i32],
    params: &NmsParams,
) -> Result<NmsOutput, NmsGpuError> {
    validate_input(boxes, scores, classes, params)?;
    let mut d = DeviceNms::new(ctx)?;
    let classes = if params.class_aware { classes } else { &[] };
    d.upload(ctx, boxes, scores, classes)?;
    Ok(d.run(ctx, params)?)
}

// ---------------------------------------------------------------------------------------------
// Checks.

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
                b.yaw += 2.0 * std::f32::consts::PI * ((r.below(200 as u64) as usize) as f32 - 100.0);
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
    let classes: Vec<i32> = (0..n).map(|_| (r.below(3 as u64) as usize) as i32).collect();
    (boxes, scores, classes)
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
) -> Result<CheckRow, GpuError> {
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
    validate_input(boxes, scores, classes, params).map_err(|e| GpuError::Unsupported(e.to_string()))?;
    let cls = if params.class_aware { classes } else { &[] };
    dev.upload(ctx, boxes, scores, cls)?;
    let g1 = dev.run(ctx, params)?;
    let g2 = dev.run(ctx, params)?;
    let identical = g1 == cpu;
    let mut detail = format!("kept {} of {} candidates", cpu.keep.len(), cpu.candidates);
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
pub fn check(ctx: &GpuContext, seed: u64, eval_dir: Option<&Path>) -> Result<Vec<CheckRow>, GpuError> {
    check_sizes(ctx, seed, &[0, 1, 2, 3, 317, 4096, 20000], eval_dir)
}

/// [`check`] with chosen random-set sizes (e.g. small ones under compute-sanitizer).
pub fn check_sizes(
    ctx: &GpuContext,
    seed: u64,
    sizes: &[usize],
    eval_dir: Option<&Path>,
) -> Result<Vec<CheckRow>, GpuError> {
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
                Err(e) => return Err(GpuError::Unsupported(format!("{}: {e}", f.display()))),
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

/// The `shape` of array `name` in `dir/manifest.json` (a minimal reader: no JSON dependency).
fn manifest_shape(dir: &Path, name: &str) -> Option<Vec<usize>> {
    let text = std::fs::read_to_string(dir.join("manifest.json")).ok()?;
    let at = text.find(&format!("\"{name}\""))?;
    let rest = &text[at..];
    let sh = rest.find("\"shape\"")?;
    let rest = &rest[sh..];
    let open = rest.find('[')?;
    let close = rest.find(']')?;
    rest[open + 1..close].split(',').map(|t| t.trim().parse().ok()).collect()
}

fn read_f32(dir: &Path, name: &str, cols: usize) -> Result<(Vec<f32>, usize), GpuError> {
    let path = dir.join(format!("{name}.bin"));
    let bytes = std::fs::read(&path).map_err(|e| GpuError::Unsupported(format!("{}: {e}", path.display())))?;
    let v: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let rows = v.len() / cols.max(1);
    if let Some(shape) = manifest_shape(dir, name) {
        let want: usize = shape.iter().product();
        if want != v.len() || shape[0] != rows {
            return Err(GpuError::Unsupported(format!(
                "{name}: manifest shape {shape:?}, file holds {} floats",
                v.len()
            )));
        }
    }
    Ok((v, rows))
}

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
pub fn load_workloads(dir: &Path) -> Result<Vec<Workload>, GpuError> {
    let mut out = Vec::new();
    for (n, target, peer, peer_kept) in
        [(10000usize, Some(0.5), Some(4.86), Some(7474)), (50000, None, Some(86.7), None)]
    {
        let name = format!("aa_boxes_{n}");
        if !dir.join(format!("{name}.bin")).exists() {
            continue;
        }
        let (b, rows) = read_f32(dir, &name, 4)?;
        let (scores, _) = read_f32(dir, &format!("aa_scores_{n}"), 1)?;
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
        let (b, rows) = read_f32(dir, &name, 7)?;
        let (scores, _) = read_f32(dir, &format!("rot_scores_{n}"), 1)?;
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
pub fn check_workloads(ctx: &GpuContext, dir: &Path) -> Result<Vec<CheckRow>, GpuError> {
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
/// workloads in `workloads`. Each row's note has the per-stage medians and whether the keep list
/// equals the CPU reference.
pub fn bench(ctx: &GpuContext, workloads: &Path) -> Result<Vec<BenchRow>, GpuError> {
    const RUNS: usize = 60;
    let mut rows = Vec::new();
    let mut dev = DeviceNms::new(ctx)?;
    let mut timer = ctx.stage_timer();
    for w in load_workloads(workloads)? {
        let n = w.boxes.len();
        let t0 = std::time::Instant::now();
        let cpu = cpu_nms(&w.boxes, &w.scores, &[], &w.params).map_err(|e| GpuError::Unsupported(e.to_string()))?;
        let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
        dev.upload(ctx, &w.boxes, &w.scores, &[])?;
        let first = dev.run(ctx, &w.params)?; // warm-up; sizes the entry lists
        for _ in 0..3 {
            dev.run(ctx, &w.params)?;
        }
        let mut totals = Vec::with_capacity(RUNS);
        let mut stages: Vec<Vec<f64>> = vec![Vec::new(); 4];
        let mut names: Vec<String> = Vec::new();
        let mut same = first == cpu;
        for _ in 0..RUNS {
            let reruns = dev.reruns;
            let l = dev.enqueue(ctx, &w.params, Some(&mut timer))?;
            let st = timer.finish()?;
            let out = dev.read(ctx, l)?;
            if dev.reruns != reruns {
                return Err(GpuError::Unsupported("entry list overflow after warm-up".into()));
            }
            same &= out.as_ref() == Some(&cpu);
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
                "kept {} of {}{peer}, keep == CPU: {}; stages ms: {}; CPU ref {:.1} ms",
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
