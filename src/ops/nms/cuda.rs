//! Non-maximum suppression on the device (`cuda/nms.cu`): the same parameters, semantics and keep
//! lists as the CPU reference [`super::nms`], bit for bit.
//!
//! Everything after the upload runs on the device with no host round trip:
//! 1. **sort**: a 64-bit key per box, `(!ordered(score) << 32) | index` for candidates
//!    (`score >= score_threshold`, `-0.0` and `+0.0` tie), all ones otherwise. Tiles of 1024 keys
//!    are sorted in shared memory, then each key's rank is its place in its tile plus a binary
//!    search in every other tile: keys are unique, so the ranks are an exact permutation,
//!    whatever the scheduling. `pre_max_size` keeps ranks below it.
//! 2. **prep**: each candidate's exact f32 preparation, stored by rank. For the grouped mask also
//!    a spatial order: the candidates sorted (as above) by the Morton code of their centre, cut
//!    into groups of 64 with each group's culling rectangle (the union of its boxes' bounding
//!    rectangles; the centres for circle NMS).
//! 3. **mask**: a 64 x 64 bit block per pair of groups, where row b holds the boxes of the other
//!    group that suppress box b (the kind's exact f32 test, the BEV pre-filter first, each box pair
//!    tested once as (higher rank, lower rank)). Grouped (more than [`DENSE_MAX_TILES`] tiles):
//!    only the pairs of groups whose rectangles can hold a suppressing pair are listed (boxes far
//!    apart never suppress each other, which the score order alone cannot exploit). Dense (small
//!    inputs): the groups are the rank tiles and every pair of them is listed. The blocks with a
//!    bit set are kept (20k spread boxes need a few MB, not the 50 MB of a full mask).
//! 4. **sweep**: the greedy keep list as the fixed point it is (a box is kept iff no kept
//!    higher-ranked box suppresses it), resolved in rounds by every block of a cooperative launch
//!    from the pair blocks: a box suppressed by a kept box is removed, a box that no kept or
//!    unresolved box suppresses is kept, the others wait. The fixed point is unique, so the keep
//!    list is the serial sweep's whatever the scheduling; the rounds are the depth of the chains
//!    of unresolved suppressors (5-8 on the bench's circle and axis-aligned sets; at worst one per
//!    box, for a chain in which each box suppresses only the next). `post_max_size` cuts the list.
//! 5. the kept input indices and their count are the only data copied back.
//!
//! When the grouped mask lists more group pairs than its lists hold (boxes packed together, so
//! that many groups interact), the run is repeated once with lists of the size counted, so the
//! result never depends on it; [`DeviceNms::reruns`] counts it.

use super::{Box3d, NmsKind, NmsOutput, NmsParams};
use crate::gpu::{GpuContext, GpuError, GrowBuffer, StageTimer};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// Boxes per tile = threads of a mask block (`NMS_TILE` in cuda/nms.cu): one u64 mask word.
const TILE: usize = 64;
/// Threads of the key, rank and prep blocks (`NMS_AUX_BLOCK` in cuda/nms.cu).
const AUX_BLOCK: u32 = 256;
/// Keys per sorted tile = threads of its block (`SORT_TILE` in cuda/nms.cu).
const SORT_TILE: usize = 1024;
/// `nms_merge_rank` modes (cuda/nms.cu).
const RANK_OF_LOW: i32 = 0;
const LOW_BY_RANK: i32 = 1;
/// Counter words (`counters` in cuda/nms.cu: candidates, live pair blocks, listed group pairs,
/// spare, centre bounds).
const COUNTERS: usize = 8;
const CTR_PAIRS: usize = 2;
/// Up to this many row tiles (4096 candidates) the dense mask runs: its few blocks cost less than
/// the grouped mask's extra launches (the spatial sort, the groups, their pairs). On the H200
/// (BENCHMARKS.md 2026-12-02) 4096 boxes took 0.140 ms dense vs 0.244 grouped (rotated), 10k
/// boxes 0.270 vs 0.236 (axis-aligned).
pub const DENSE_MAX_TILES: usize = 64;
/// Must match SWEEP_THREADS in cuda/nms.cu.
const SWEEP_THREADS: u32 = 512;
/// The sweep's u64 scratch words per group (two kept, two unresolved, three hit by kept, three
/// hit by unresolved, kept by rank) and its counter words (cuda/nms.cu, `nms_sweep`).
const SWEEP_WORDS_PER_GROUP: usize = 11;
const SWEEP_SYNC_WORDS: usize = 2;
/// u64 words of a pair block of the mask (64 rows of each group).
const PAIR_BLOCK_WORDS: usize = 2 * TILE;
/// Initial capacity of the grouped mask's pair lists, per group (grows when a run needs more;
/// a spatially compact group of spread boxes meets ~10 others).
const INITIAL_PAIRS_PER_GROUP: usize = 16;
/// Groups are limited so that the pair kernel's grid fits (65,535 blocks in y).
const MAX_TILES: usize = 65_000;

/// Device buffers of the NMS (grow-only; reuse one `DeviceNms` frame after frame).
pub struct DeviceNms {
    n: usize,
    boxes: GrowBuffer<f32>,
    scores: GrowBuffer<f32>,
    classes: GrowBuffer<i32>,
    keys: GrowBuffer<u64>,
    sorted: GrowBuffer<u64>,
    rank: GrowBuffer<u32>,
    spatial_keys: GrowBuffer<u64>,
    spatial_order: GrowBuffer<u32>,
    spatial_prep: GrowBuffer<f32>,
    spatial_rank: GrowBuffer<u32>,
    group_rects: GrowBuffer<f32>,
    group_pairs: GrowBuffer<u32>,
    order: GrowBuffer<u32>,
    prep: GrowBuffer<f32>,
    live_pairs: GrowBuffer<u32>,
    pair_words: GrowBuffer<u64>,
    counters: GrowBuffer<u32>,
    out: GrowBuffer<u32>,
    sweep_scratch: GrowBuffer<u64>,
    pair_capacity: usize,
    /// Runs repeated because the grouped mask's pair lists overflowed.
    pub reruns: u64,
    /// The mask of the last completed run.
    pub last_mask: Mask,
}

/// Which suppression mask a run builds (see the module documentation): blocks for the pairs of
/// spatially compact groups that can interact, or for every pair of rank tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mask {
    Grouped,
    Dense,
}

/// What [`DeviceNms::read`] found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Read {
    Done(NmsOutput),
    /// The pair lists overflowed (their capacity is grown): run again.
    Rerun,
}

/// What one enqueued run needs to read its result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launched {
    pre: usize,
    pair_capacity: usize,
    mask: Mask,
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
            sorted: GrowBuffer::new(s, 0)?,
            rank: GrowBuffer::new(s, 0)?,
            spatial_keys: GrowBuffer::new(s, 0)?,
            spatial_order: GrowBuffer::new(s, 0)?,
            spatial_prep: GrowBuffer::new(s, 0)?,
            spatial_rank: GrowBuffer::new(s, 0)?,
            group_rects: GrowBuffer::new(s, 0)?,
            group_pairs: GrowBuffer::new(s, 0)?,
            order: GrowBuffer::new(s, 0)?,
            prep: GrowBuffer::new(s, 0)?,
            live_pairs: GrowBuffer::new(s, 0)?,
            pair_words: GrowBuffer::new(s, 0)?,
            counters: GrowBuffer::new(s, COUNTERS)?,
            out: GrowBuffer::new(s, 4)?,
            sweep_scratch: GrowBuffer::new(s, 0)?,
            pair_capacity: 0,
            reruns: 0,
            last_mask: Mask::Dense,
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

    /// The mask a run on these boxes starts with.
    pub fn first_mask(params: &NmsParams, boxes: usize) -> Mask {
        let pre = params.pre_max_size.unwrap_or(usize::MAX).min(boxes);
        if pre.div_ceil(TILE) > DENSE_MAX_TILES {
            Mask::Grouped
        } else {
            Mask::Dense
        }
    }

    /// Enqueues the whole device NMS on the uploaded boxes (no synchronisation). With a timer,
    /// records the stages `sort`, `prep`, `mask`, `sweep`.
    pub(crate) fn enqueue(
        &mut self,
        ctx: &GpuContext,
        params: &NmsParams,
        mask: Mask,
        mut timer: Option<&mut StageTimer>,
    ) -> Result<Launched, GpuError> {
        let s = &ctx.stream;
        let n = self.n;
        let pre = params.pre_max_size.unwrap_or(usize::MAX).min(n);
        let post = params.post_max_size.unwrap_or(usize::MAX).min(n).min(i32::MAX as usize);
        let wt = pre.div_ceil(TILE);
        if n > i32::MAX as usize - SORT_TILE {
            return Err(GpuError::TooLarge {
                what: "GPU NMS boxes (32-bit indices)",
                value: n as u64,
                limit: (i32::MAX as usize - SORT_TILE) as u64,
            });
        }
        if wt > MAX_TILES {
            return Err(GpuError::TooLarge {
                what: "GPU NMS candidates after pre_max_size",
                value: pre as u64,
                limit: (MAX_TILES * TILE) as u64,
            });
        }
        let grouped = mask == Mask::Grouped && wt > 0;
        // Rank tiles list every pair; spatial groups as many as the last run needed, at least.
        let cap = if grouped { self.pair_capacity.max(INITIAL_PAIRS_PER_GROUP * wt) } else { wt * (wt + 1) / 2 }.max(1);
        if let Some(t) = timer.as_deref_mut() {
            t.start()?;
        }
        let counters = self.counters.ensure(s, COUNTERS)?;
        s.memset_zeros(&mut counters.slice_mut(..COUNTERS))?;
        let keys = self.keys.ensure(s, n)?;
        let rank = self.rank.ensure(s, n)?;
        let order = self.order.ensure(s, pre.max(1))?;
        let prep = self.prep.ensure(s, 12 * pre.max(1))?;
        let out = self.out.ensure(s, 4 + pre)?;
        let boxes = self.boxes.ensure(s, 7 * n)?;
        let (n_i, pre_i, post_i, wt_i, cap_u) = (n as i32, pre as i32, post as i32, wt as i32, cap as u32);
        let aux = |items: usize| LaunchConfig {
            grid_dim: (items.div_ceil(AUX_BLOCK as usize).max(1) as u32, 1, 1),
            block_dim: (AUX_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };

        // 1. keys, ranks
        {
            let f = ctx.function("nms", "nms_keys")?;
            let mut l = s.launch_builder(&f);
            let st = params.score_threshold;
            l.arg(&*self.scores.ensure(s, n)?).arg(&n_i).arg(&st).arg(&mut *keys).arg(&mut *counters);
            // SAFETY: argument types/order match nms_keys; keys >= n, counters >= 8.
            unsafe { l.launch(aux(n)) }?;
        }
        sort_keys(ctx, &mut self.sorted, keys, None, n, RANK_OF_LOW, rank)?;
        if let Some(t) = timer.as_deref_mut() {
            t.stage("sort")?;
        }
        // 2. order + per-box preparation (+ the spatial order of the grouped mask)
        let kind_i: i32 = match params.kind {
            NmsKind::AxisAligned => 0,
            NmsKind::RotatedBev => 1,
            NmsKind::Circle => 2,
        };
        {
            let f = ctx.function("nms", "nms_prep")?;
            let ca = params.class_aware as i32;
            let mut l = s.launch_builder(&f);
            l.arg(&*boxes).arg(&*self.classes.ensure(s, 1)?).arg(&ca).arg(&kind_i).arg(&n_i);
            l.arg(&pre_i).arg(&*keys).arg(&*rank).arg(&mut *order).arg(&mut *prep).arg(&mut *counters);
            // SAFETY: matches nms_prep; classes hold n elements when class_aware (checked by the
            // caller), order >= pre, prep >= 12 * pre, counters >= 8.
            unsafe { l.launch(aux(n)) }?;
        }
        if grouped {
            let skeys = self.spatial_keys.ensure(s, pre)?;
            {
                let f = ctx.function("nms", "nms_morton")?;
                let mut l = s.launch_builder(&f);
                l.arg(&*boxes).arg(&*order).arg(&*counters).arg(&pre_i).arg(&mut *skeys);
                // SAFETY: matches nms_morton; order holds the candidates' indices (< n), skeys >= pre.
                unsafe { l.launch(aux(pre)) }?;
            }
            let sp = self.spatial_order.ensure(s, pre)?;
            sort_keys(ctx, &mut self.sorted, skeys, Some(&*counters), pre, LOW_BY_RANK, sp)?;
            let f = ctx.function("nms", "nms_groups")?;
            let mut l = s.launch_builder(&f);
            l.arg(&*prep).arg(&*sp).arg(&*counters).arg(&pre_i).arg(&kind_i);
            l.arg(&mut *self.spatial_prep.ensure(s, 12 * TILE * wt)?)
                .arg(&mut *self.spatial_rank.ensure(s, TILE * wt)?);
            l.arg(&mut *self.group_rects.ensure(s, 4 * wt)?);
            let cfg = LaunchConfig { grid_dim: (wt as u32, 1, 1), block_dim: (TILE as u32, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: matches nms_groups; sp holds the spatial order (< pre entries, each < pre),
            // spatial_prep >= 12 * 64 * wt, spatial_rank >= 64 * wt, group_rects >= 4 * wt.
            unsafe { l.launch(cfg) }?;
        }
        if let Some(t) = timer.as_deref_mut() {
            t.stage("prep")?;
        }
        // 3. mask: the group pairs, then a bit block per pair
        let pairs = self.group_pairs.ensure(s, 2 * cap)?;
        let live = self.live_pairs.ensure(s, 2 * cap)?;
        let words = self.pair_words.ensure(s, PAIR_BLOCK_WORDS * cap)?;
        if wt > 0 {
            let t = match params.kind {
                NmsKind::Circle => params.threshold * params.threshold,
                _ => params.threshold,
            };
            // The circle groups' gap bound (cuda/nms.cu `groups_interact`).
            let tt = if t.is_infinite() { f32::INFINITY } else { params.threshold * 1.0001 };
            let all = (!grouped) as i32;
            let rects = self.group_rects.ensure(s, 4 * wt)?;
            {
                let f = ctx.function("nms", "nms_group_pairs")?;
                let mut l = s.launch_builder(&f);
                l.arg(&*rects).arg(&mut *counters).arg(&pre_i).arg(&kind_i).arg(&tt).arg(&all).arg(&cap_u);
                l.arg(&mut *pairs);
                let cfg = LaunchConfig {
                    grid_dim: (wt.div_ceil(AUX_BLOCK as usize) as u32, wt as u32, 1),
                    block_dim: (AUX_BLOCK, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: matches nms_group_pairs; group_rects >= 4 * wt (read only for spatial
                // groups, written by nms_groups above), pairs >= 2 * cap.
                unsafe { l.launch(cfg) }?;
            }
            let name = match params.kind {
                NmsKind::AxisAligned => "nms_mask_aa",
                NmsKind::RotatedBev => "nms_mask_rot",
                NmsKind::Circle => "nms_mask_circle",
            };
            let f = ctx.function("nms", name)?;
            let mut l = s.launch_builder(&f);
            if grouped {
                l.arg(&*self.spatial_prep.ensure(s, 12 * TILE * wt)?).arg(&*self.spatial_rank.ensure(s, TILE * wt)?);
            } else {
                l.arg(&*prep).arg(&0u64);
            }
            l.arg(&*pairs).arg(&mut *counters).arg(&pre_i).arg(&t).arg(&cap_u).arg(&mut *live).arg(&mut *words);
            let blocks = cap.min(32 * ctx.sm_count.max(1) as usize) as u32;
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (TILE as u32, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: matches the mask kernels; prep and ranks in group order (rank order with a null
            // rank pointer), pairs written above, live >= 2 * cap, words >= 128 * cap.
            unsafe { l.launch(cfg) }?;
        }
        if let Some(t) = timer.as_deref_mut() {
            t.stage("mask")?;
        }
        // 4. sweep
        {
            let f = ctx.function("nms", "nms_sweep")?;
            let scratch_words = SWEEP_WORDS_PER_GROUP * wt.max(1) + SWEEP_SYNC_WORDS;
            let scratch = self.sweep_scratch.ensure(s, scratch_words)?;
            s.memset_zeros(&mut scratch.slice_mut(..scratch_words))?;
            let mut l = s.launch_builder(&f);
            l.arg(&*counters).arg(&pre_i).arg(&post_i).arg(&*live).arg(&*words).arg(&cap_u);
            if grouped {
                l.arg(&*self.spatial_rank.ensure(s, TILE * wt)?);
            } else {
                l.arg(&0u64);
            }
            l.arg(&*order).arg(&mut *scratch).arg(&wt_i).arg(&mut *out);
            // One block per SM at most, so that a cooperative launch always finds them resident.
            let blocks = wt.clamp(1, ctx.sm_count.max(1) as usize) as u32;
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (SWEEP_THREADS, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: matches nms_sweep; out >= 4 + pre; the live blocks and their words as the
            // mask wrote them; scratch holds 11 * wt + 2 zeroed words. The cooperative launch
            // guarantees the co-residency of the blocks that its grid-wide barriers need.
            unsafe { l.launch_cooperative(cfg) }?;
        }
        if let Some(t) = timer {
            t.stage("sweep")?;
        }
        Ok(Launched { pre, pair_capacity: cap, mask: if grouped { Mask::Grouped } else { Mask::Dense } })
    }

    /// Reads the result of an enqueued run, or says to run again when the group pair lists
    /// overflowed (their capacity is grown to the count).
    pub(crate) fn read(&mut self, ctx: &GpuContext, l: Launched) -> Result<Read, GpuError> {
        let s = &ctx.stream;
        let counters = s.clone_dtoh(&self.counters.ensure(s, COUNTERS)?.slice(..COUNTERS))?;
        let head = s.clone_dtoh(&self.out.ensure(s, 4 + l.pre)?.slice(..4))?;
        s.synchronize()?;
        let pairs = counters[CTR_PAIRS] as usize;
        if pairs > l.pair_capacity {
            self.pair_capacity = pairs.next_multiple_of(1024);
            self.reruns += 1;
            tracing::debug!(capacity = self.pair_capacity, "NMS group pair lists overflowed, rerun");
            return Ok(Read::Rerun);
        }
        let kept = head[0] as usize;
        let m = head[1] as usize;
        let keep =
            if kept == 0 { Vec::new() } else { s.clone_dtoh(&self.out.ensure(s, 4 + l.pre)?.slice(4..4 + kept))? };
        s.synchronize()?;
        self.last_mask = l.mask;
        Ok(Read::Done(NmsOutput { keep, candidates: m }))
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
        let mask = Self::first_mask(params, self.n);
        loop {
            let l = self.enqueue(ctx, params, mask, timer.as_deref_mut())?;
            match self.read(ctx, l)? {
                Read::Done(out) => return Ok(out),
                Read::Rerun => {}
            }
        }
    }
}

/// Sorts `len` unique 64-bit keys (`len_on_device`: fewer, the count the device holds) and writes
/// each key's rank as `mode` says (`nms_merge_rank` in cuda/nms.cu). `sorted` is scratch.
fn sort_keys(
    ctx: &GpuContext,
    sorted: &mut GrowBuffer<u64>,
    keys: &CudaSlice<u64>,
    len_on_device: Option<&CudaSlice<u32>>,
    len: usize,
    mode: i32,
    out: &mut CudaSlice<u32>,
) -> Result<(), GpuError> {
    let s = &ctx.stream;
    let tiles = len.div_ceil(SORT_TILE).max(1);
    let sorted = sorted.ensure(s, tiles * SORT_TILE)?;
    let len_i = len as i32;
    {
        let f = ctx.function("nms", "nms_sort_tiles")?;
        let mut l = s.launch_builder(&f);
        l.arg(keys);
        match len_on_device {
            Some(c) => l.arg(c),
            None => l.arg(&0u64),
        };
        l.arg(&len_i).arg(&mut *sorted);
        let cfg =
            LaunchConfig { grid_dim: (tiles as u32, 1, 1), block_dim: (SORT_TILE as u32, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches nms_sort_tiles (a null count pointer when the length is `len`); keys
        // hold >= len keys, sorted tiles * SORT_TILE.
        unsafe { l.launch(cfg) }?;
    }
    let f = ctx.function("nms", "nms_merge_rank")?;
    let tiles_i = tiles as i32;
    let mut l = s.launch_builder(&f);
    l.arg(&*sorted).arg(&tiles_i).arg(&mode).arg(out);
    let cfg = LaunchConfig {
        // One warp per sorted slot.
        grid_dim: ((tiles * SORT_TILE * 32).div_ceil(AUX_BLOCK as usize) as u32, 1, 1),
        block_dim: (AUX_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: matches nms_merge_rank; out is indexed by the keys' low words (box indices < its
    // length) or by ranks (< len <= its length).
    unsafe { l.launch(cfg) }?;
    Ok(())
}
