//! Non-maximum suppression on the device (`cuda/nms.cu`): the same parameters, semantics and keep
//! lists as the CPU reference [`super::nms`], bit for bit.
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

use super::{Box3d, NmsKind, NmsOutput, NmsParams};
use crate::gpu::{GpuContext, GpuError, GrowBuffer, StageTimer};
use cudarc::driver::{sys, LaunchConfig, PushKernelArg};

/// Boxes per tile = threads of a mask block (`NMS_TILE` in cuda/nms.cu): one u64 mask word.
const TILE: usize = 64;
/// Threads of the key, rank and prep blocks (`NMS_AUX_BLOCK` in cuda/nms.cu).
const AUX_BLOCK: u32 = 256;
/// Must match SWEEP_THREADS / SWEEP_EPT in cuda/nms.cu.
const SWEEP_THREADS: u32 = 512;
const SWEEP_EPT: usize = 2048;
/// Initial entry capacity per row tile (grows when a run overflows it).
const INITIAL_TILE_CAPACITY: usize = 4096;
/// Row tiles are limited so that the triangular mask grid fits a 1D grid (< 2^31 blocks).
const MAX_TILES: usize = 65_000;

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
pub(crate) struct Launched {
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
    pub(crate) fn enqueue(
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
        if n > i32::MAX as usize {
            return Err(GpuError::TooLarge {
                what: "GPU NMS boxes (32-bit indices)",
                value: n as u64,
                limit: i32::MAX as u64,
            });
        }
        if wt > MAX_TILES {
            return Err(GpuError::TooLarge {
                what: "GPU NMS candidates after pre_max_size",
                value: pre as u64,
                limit: (MAX_TILES * TILE) as u64,
            });
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
                    return Err(GpuError::SharedMemory {
                        kernel: "GPU NMS sweep",
                        needed: smem,
                        available: max,
                        count: pre,
                        items: "candidates",
                    });
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
        if let Some(t) = timer {
            t.stage("sweep")?;
        }
        Ok(Launched { pre, tile_capacity: capt })
    }

    /// Reads the result of an enqueued run: Ok(None) when a row tile overflowed (capacity grown).
    pub(crate) fn read(&mut self, ctx: &GpuContext, l: Launched) -> Result<Option<NmsOutput>, GpuError> {
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
