//! Voxelization on the GPU (`cuda/voxel.cu`): hard voxelization, dynamic voxelization with scatter
//! means, voxel-grid downsampling and the PointPillars point decoration, reproducing
//! [`super`] (the CPU reference) exactly (integer outputs bit-identical; hard features and pillar features
//! bit-identical; dynamic means computed in the reference's order, hence identical too).
//!
//! Algorithm (no serial pass, no memset, no host synchronization; 3 launches for W1 pillars, the
//! second and third launched to start before the one ahead ends: [`EarlyLaunch`]):
//! 1. one thread per point computes the voxel coordinate with the reference's f32 arithmetic and
//!    takes a table slot: the cell itself on small grids (direct-mapped table, `DIRECT_MAX_CELLS`),
//!    else an open-addressing hash slot (size from the profile's `hash_load_factor`); `atomicMax`
//!    of `gen << 32 | !index` keeps the voxel's first point, tagged with the call's generation so
//!    the table never needs clearing; hard voxels with `P <= 32` also count the points per slot,
//!    each point keeping the count before its own (its place in its voxel's segment);
//! 2. a single-pass decoupled look-back scan over the "first point of its voxel" flags, in input
//!    order, gives every voxel its rank = output index (voxels past `max_voxels` dropped, counted);
//!    for `P <= 32` the same kernel gives every kept voxel a segment of its count and every point
//!    writes its index there (the order within a segment is the atomics'); otherwise it turns every
//!    point into its sort key (the rank of its voxel, read once the tile of the voxel's first point
//!    has published it) and builds the radix histograms;
//! 3. `P <= 32`: one warp per voxel keeps the `min(count, P)` smallest indices of its segment in
//!    ascending order (bitonic sorts and merges over the lanes), which are the reference's slots,
//!    and writes the output. Otherwise a stable LSD radix sort of the points by voxel rank (one
//!    launch per 8-bit digit, per-digit decoupled look-back) makes every voxel a contiguous segment
//!    in input order (a point's slot is its offset in the segment; the last pass writes each
//!    segment's start), then one thread per (voxel, slot) writes the output (raw channels and/or
//!    fused pillar features); dynamic means: one thread per (voxel, channel) sums the segment in
//!    f64 in input order.
//!
//! The scratch and output buffers are raw device allocations ([`DevBuf`]) passed to the kernels as
//! plain pointers: cudarc's per-argument event tracking (a stream wait and an event record per
//! slice argument and launch) would cost more host time than the kernels take on a 100k-point scan.
//! A voxelizer's kernels and copies run on its one stream, so stream order is the only
//! synchronization needed among them; its input cloud's writes on another stream are waited for
//! through the cloud's events.
//!
//! Results stay on the device in the [`GpuVoxelizer`]'s buffers (for chaining) until the next call;
//! the `*_host` functions copy them back into the reference's output structs.

use super::{
    downsampled_message_in, voxels_fields, Downsampled, DynamicVoxels, FeaturesDtype, FeaturesLayout, HardVoxelCounts,
    HardVoxelParams, HardVoxels, PillarFeatures, PublishedDownsample, PublishedHardVoxels, VoxelGrid,
};
use crate::cloud::{CloudMessage, CloudView};
use crate::gpu::buffer::memory_pools_supported;
use crate::gpu::{DevBuf, DeviceCloud, EarlyLaunch, GpuContext, GpuError, PooledSlice, StageTimer};
use crate::ops::{ParamError, Validate};
use cudarc::driver::{
    result as drv, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;

/// Output channels at most (x, y, z + 13 others); `VOX_MAX_CHANNELS` in cuda/voxel.cu.
pub const MAX_CHANNELS: usize = 16;

/// Largest cloud (status words carry 30-bit counts; sort keys use bit 31 as a flag).
pub const MAX_POINTS: usize = (1 << 30) - 1;

/// Grids with at most this many cells use the direct-mapped table (one slot per cell, 20 bytes a
/// cell with the rank: 80 MiB at most); larger grids hash.
pub const DIRECT_MAX_CELLS: u64 = 1 << 22;

const CTR_VOXELS: usize = 1;
const CTR_OUT_OF_RANGE: usize = 2;
const CTR_VOXEL_CAP: usize = 3;
const CTR_POINT_CAP: usize = 4;
const CTR_WORDS: usize = 16;
/// Hard voxels with at most this many points per voxel take the select path (one warp per voxel).
const SELECT_MAX_POINTS: u32 = 32;
const RADIX_BINS: usize = 256;
const RADIX_MAX_PASSES: usize = 4;
/// Counters + global digit histograms (`CTR_TOTAL` in cuda/voxel.cu).
const CTR_TOTAL: usize = CTR_WORDS + RADIX_MAX_PASSES * RADIX_BINS;

const FLAG_RAW: u32 = 1;
const FLAG_PILLAR: u32 = 2;
const FLAG_RANGE: u32 = 4;
const FLAG_DIRECT: u32 = 8;

/// Kernel parameters; must match `struct VoxParams` in cuda/voxel.cu (42 four-byte words).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct VoxParams {
    min: [f32; 3],
    size: [f32; 3],
    dimf: [f32; 3],
    dim: [u32; 3],
    n: u32,
    capacity: u32,
    num_ch: u32,
    max_voxels: u32,
    max_points: u32,
    key_max: u32,
    hash_mask: u32,
    hash_shift: u32,
    flags: u32,
    gen: u32,
    sort_passes: u32,
    sort_bits: u32,
    sort_total: u32,
    pad_: u32,
    ch: [u32; MAX_CHANNELS],
}

// SAFETY: repr(C), 4-byte fields only, no padding; matches the CUDA struct.
unsafe impl DeviceRepr for VoxParams {}
// Same size as the CUDA struct (`static_assert` in cuda/voxel.cu).
const _: () = assert!(std::mem::size_of::<VoxParams>() == 168);

/// Grid dimensions exactly as `VoxelGrid::dims` / the reference's indexer: (f32 dims, integer dims).
pub(crate) fn grid_dims(grid: &VoxelGrid) -> ([f32; 3], [u32; 3]) {
    let r = &grid.point_cloud_range;
    let dimf: [f32; 3] = std::array::from_fn(|a| ((r[a + 3] - r[a]) / grid.voxel_size[a]).round_ties_even());
    (dimf, dimf.map(|d| if d >= 1.0 { d as u32 } else { 0 }))
}

/// Open-addressing table size for at most `distinct` keys at `load_factor`: a power of two >= 64.
pub(crate) fn hash_size(distinct: usize, load_factor: f64) -> usize {
    let want = (distinct as f64 / load_factor).ceil() as usize + 1;
    want.next_power_of_two().max(64)
}

/// LSD radix passes (shift, bits) covering keys `0..=key_max`, at most 8 bits each, fewest passes
/// (equal widths, the last one possibly narrower: pass `q` shifts by `q * plan[0].1`).
pub(crate) fn radix_plan(key_max: u32) -> Vec<(u32, u32)> {
    let total = (32 - key_max.leading_zeros()).max(1);
    let passes = total.div_ceil(8);
    let per = total.div_ceil(passes);
    (0..passes).map(|p| (p * per, per.min(total - p * per))).collect()
}

/// Builds the kernel parameters (validated inputs). `max_voxels = None`: dynamic (no cap).
/// Returns the params (generation 0: set per call) and the table size in slots (cells when
/// direct-mapped, `FLAG_DIRECT` set; else the hash table size).
pub(crate) fn make_params(
    grid: &VoxelGrid,
    n: usize,
    capacity: usize,
    channels: &[usize],
    max_voxels: Option<u32>,
    max_points: u32,
    load_factor: f64,
) -> (VoxParams, usize) {
    let (dimf, dim) = grid_dims(grid);
    let cells = dim.iter().map(|&d| d as u64).product::<u64>();
    let distinct = (n as u64).min(cells) as usize;
    let key_max = (distinct as u64).min(max_voxels.unwrap_or(u32::MAX) as u64) as u32;
    let direct = cells <= DIRECT_MAX_CELLS;
    let h = hash_size(distinct, load_factor);
    let mut ch = [0u32; MAX_CHANNELS];
    ch[0] = 0;
    ch[1] = 1;
    ch[2] = 2;
    for (k, &c) in channels.iter().enumerate() {
        ch[3 + k] = c as u32;
    }
    let plan = radix_plan(key_max);
    let p = VoxParams {
        min: [grid.point_cloud_range[0], grid.point_cloud_range[1], grid.point_cloud_range[2]],
        size: grid.voxel_size,
        dimf,
        dim,
        n: n as u32,
        capacity: capacity as u32,
        num_ch: 3 + channels.len() as u32,
        max_voxels: max_voxels.unwrap_or(u32::MAX),
        max_points,
        key_max,
        hash_mask: (h - 1) as u32,
        hash_shift: 64 - h.trailing_zeros(),
        flags: if direct { FLAG_DIRECT } else { 0 },
        gen: 0,
        sort_passes: plan.len() as u32,
        sort_bits: plan[0].1,
        sort_total: plan.iter().map(|q| q.1).sum(),
        pad_: 0,
        ch,
    };
    (p, if direct { cells as usize } else { h })
}

/// What the last enqueued operation left in the voxelizer's buffers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LastOp {
    None,
    Hard {
        max_points: usize,
        num_channels: usize,
        pillar_channels: usize,
        max_voxels: u32,
    },
    Dynamic {
        points: usize,
        num_channels: usize,
    },
    /// [`GpuVoxelizer::downsample_device`]: dynamic voxels of every channel, with the records.
    Downsample {
        num_channels: usize,
    },
}

/// How many leading slots of each `[P, C]` row of a hard-voxel output may hold non-zero values. The
/// slots past a voxel's points are zero padding and the rows stay in their buffer between calls, so
/// the select kernel writes a row's points and only the padding slots an earlier call filled: W1
/// pillars on scan0 have 1.3 MB of points in 11.4 MB of rows, and the writes set the select
/// kernel's time (BENCHMARKS.md 2026-12-06, late). `u32::MAX`: not known, the whole row is written.
struct RowFill {
    slots: DevBuf<u32>,
    /// The output buffer (address, allocations) and row shape (slots, floats per slot) that
    /// `slots` describes.
    describes: Option<(u64, u64, usize, usize)>,
}

impl RowFill {
    fn new(stream: &Arc<CudaStream>, pools: bool) -> Self {
        Self { slots: DevBuf::new(stream, pools), describes: None }
    }

    /// The counts of `rows` rows of `slots` slots of `width` floats in `out`, set to "not known"
    /// unless they already describe that allocation with that row shape (a count is in slots, so
    /// the same row length in another shape does not do).
    fn ensure(&mut self, out: &DevBuf<f32>, slots: usize, width: usize, rows: usize) -> Result<u64, GpuError> {
        let key = (out.ptr(), out.growths(), slots, width);
        let described = self.describes.take();
        let growths = self.slots.growths();
        let ptr = self.slots.ensure(rows)?;
        if described != Some(key) || self.slots.growths() != growths {
            self.slots.fill_all(u32::MAX)?;
        }
        self.describes = Some(key);
        Ok(ptr)
    }

    /// Another kernel wrote the output buffer: the counts no longer hold.
    fn forget(&mut self) {
        self.describes = None;
    }
}

/// The voxel kernels with their grow-only device scratch and output buffers (one per stream user).
pub struct GpuVoxelizer {
    stream: Arc<CudaStream>,
    f_insert: CudaFunction,
    f_rank: CudaFunction,
    f_sort: CudaFunction,
    f_fill: CudaFunction,
    f_select: CudaFunction,
    f_means: CudaFunction,
    f_pillar: CudaFunction,
    f_half: CudaFunction,
    f_centroids: CudaFunction,
    f_ds_records: CudaFunction,
    f_voxel_records: CudaFunction,
    f_means_xyz: CudaFunction,
    /// The `downsampled` message's records ([`Self::downsampled_published`]).
    ds_records: DevBuf<u8>,
    /// The `voxels` message's records ([`Self::hard_published`]).
    voxel_records: DevBuf<u32>,
    /// `[V, C]` centroids of the last hard voxels ([`Self::hard_published`]).
    centroids: DevBuf<f32>,
    /// fp16 copies of the features ([`Self::hard_features_f16`]).
    half: DevBuf<u16>,
    /// Hash keys + 1 (0 = empty); all-zero between calls (the first point of each voxel clears its key).
    table_keys: DevBuf<u64>,
    /// `gen << 32 | !first point` per slot (generation-tagged: never cleared).
    table_first: DevBuf<u64>,
    table_vid: DevBuf<u32>,
    /// Select path: points per slot; all-zero between calls (the rank kernel resets what it read).
    table_count: DevBuf<u32>,
    pslot: DevBuf<i32>,
    /// Select path: each point's place in its voxel's segment.
    point_pos: DevBuf<u32>,
    /// Select path: the in-range points' indices by voxel segment, and each kept voxel's length.
    seg_points: DevBuf<u32>,
    seg_len: DevBuf<u32>,
    rank_status: DevBuf<u64>,
    sort_status: DevBuf<u64>,
    counters: DevBuf<u32>,
    keys: [DevBuf<u32>; 2],
    vals: [DevBuf<u32>; 2],
    seg_start: DevBuf<u32>,
    /// `[V, 3]` voxel coordinates `[z, y, x]`.
    pub coords: DevBuf<i32>,
    /// `[V]` points per voxel.
    pub num_points: DevBuf<u32>,
    /// Hard: `[V, P, C]` features; dynamic: `[V, C]` means. Written only by this voxelizer's
    /// kernels: the select kernel trusts `features_fill` for the rows' padding.
    pub features: DevBuf<f32>,
    /// `[V, P, 9 or 10]` pillar features (written only here, likewise).
    pub pillar: DevBuf<f32>,
    /// The filled slots of the rows of `features` and of `pillar` (select path).
    features_fill: RowFill,
    pillar_fill: RowFill,
    /// Dynamic: `[N]` voxel of each point; `[N, 3]` coordinates.
    pub point_voxel: DevBuf<i32>,
    pub point_coords: DevBuf<i32>,
    last: LastOp,
    last_params: VoxParams,
    sorted_slot: usize,
    /// Generation of the last call (tags `table_first` and the status words).
    gen: u32,
    /// False while a hash-mode call that dirties `table_keys` may not have been fully enqueued.
    keys_clean: bool,
    /// False while a select-path call that dirties `table_count` may not have been fully enqueued.
    counts_clean: bool,
}

fn cfg(blocks: usize, block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks.max(1) as u32, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

impl GpuVoxelizer {
    /// A voxelizer on the context's stream.
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
        Self::on_stream(ctx, ctx.stream.clone())
    }

    /// A voxelizer whose kernels and copies run on `stream` (one of the CUDA backend's side streams, so
    /// that they overlap FPS on the main one); it reads its input cloud after the cloud's writes
    /// on any stream (cudarc orders them by the cloud's events).
    pub fn on_stream(ctx: &GpuContext, stream: Arc<CudaStream>) -> Result<Self, GpuError> {
        let s = &stream;
        let pools = memory_pools_supported(s)?;
        let f = |n: &str| ctx.function("voxel", n);
        let mut counters: DevBuf<u32> = DevBuf::new(s, pools);
        counters.ensure(CTR_TOTAL)?; // zeroed: vox_rank_keys' tile ticket must start at zero
        Ok(Self {
            stream: stream.clone(),
            f_insert: f("vox_insert")?,
            f_rank: f("vox_rank_keys")?,
            f_sort: f("vox_sort_pass")?,
            f_fill: f("vox_hard_fill")?,
            f_select: f("vox_hard_select")?,
            f_means: f("vox_dyn_means")?,
            f_pillar: f("vox_pillar")?,
            f_half: f("vox_to_half")?,
            f_centroids: f("vox_centroids")?,
            f_ds_records: f("vox_ds_records")?,
            f_voxel_records: f("vox_voxels_records")?,
            f_means_xyz: f("vox_means_xyz")?,
            ds_records: DevBuf::new(s, pools),
            voxel_records: DevBuf::new(s, pools),
            centroids: DevBuf::new(s, pools),
            half: DevBuf::new(s, pools),
            table_keys: DevBuf::new(s, pools),
            table_first: DevBuf::new(s, pools),
            table_vid: DevBuf::new(s, pools),
            table_count: DevBuf::new(s, pools),
            pslot: DevBuf::new(s, pools),
            point_pos: DevBuf::new(s, pools),
            seg_points: DevBuf::new(s, pools),
            seg_len: DevBuf::new(s, pools),
            rank_status: DevBuf::new(s, pools),
            sort_status: DevBuf::new(s, pools),
            counters,
            keys: [DevBuf::new(s, pools), DevBuf::new(s, pools)],
            vals: [DevBuf::new(s, pools), DevBuf::new(s, pools)],
            seg_start: DevBuf::new(s, pools),
            coords: DevBuf::new(s, pools),
            num_points: DevBuf::new(s, pools),
            features: DevBuf::new(s, pools),
            pillar: DevBuf::new(s, pools),
            features_fill: RowFill::new(s, pools),
            pillar_fill: RowFill::new(s, pools),
            point_voxel: DevBuf::new(s, pools),
            point_coords: DevBuf::new(s, pools),
            last: LastOp::None,
            last_params: VoxParams::default(),
            sorted_slot: 0,
            gen: 0,
            keys_clean: true,
            counts_clean: true,
        })
    }

    pub fn last(&self) -> LastOp {
        self.last
    }

    fn check_channels(cloud: &DeviceCloud, channels: &[usize]) -> Result<(), GpuError> {
        if 3 + channels.len() > MAX_CHANNELS {
            return Err(GpuError::TooLarge {
                what: "voxelization extra channels (after x, y, z)",
                value: channels.len() as u64,
                limit: (MAX_CHANNELS - 3) as u64,
            });
        }
        if let Some(&c) = channels.iter().find(|&&c| c >= cloud.num_channels()) {
            return Err(GpuError::BadChannel { index: c, channels: cloud.num_channels() });
        }
        if cloud.len > MAX_POINTS {
            return Err(GpuError::TooLarge {
                what: "voxelization points (30-bit counts)",
                value: cloud.len as u64,
                limit: MAX_POINTS as u64,
            });
        }
        if cloud.capacity > u32::MAX as usize {
            return Err(GpuError::TooLarge {
                what: "voxelization device column capacity in points (32-bit)",
                value: cloud.capacity as u64,
                limit: u32::MAX as u64,
            });
        }
        Ok(())
    }

    /// The next call's generation; on wrap-around the generation-tagged buffers are cleared.
    fn next_gen(&mut self) -> Result<u32, GpuError> {
        if self.gen == u32::MAX {
            self.table_first.zero_all()?;
            self.rank_status.zero_all()?;
            self.sort_status.zero_all()?;
            self.gen = 0;
        }
        self.gen += 1;
        Ok(self.gen)
    }

    /// Steps 1-3: table, ranks, then `select`: unordered segments with their lengths (hard voxels,
    /// `P <= 32`), else sort keys and the sort (segments in input order with their starts).
    /// Returns the params.
    #[allow(clippy::too_many_arguments)]
    fn enqueue_core(
        &mut self,
        ctx: &GpuContext,
        cloud: &DeviceCloud,
        cloud_ptr: u64,
        channels: &[usize],
        grid: &VoxelGrid,
        max_voxels: Option<u32>,
        max_points: u32,
        point_outputs: bool,
        select: bool,
        mut timer: Option<&mut StageTimer>,
    ) -> Result<VoxParams, GpuError> {
        grid.validate()?;
        Self::check_channels(cloud, channels)?;
        let s = &self.stream.clone();
        let n = cloud.len;
        let block = ctx.profile.block_size.voxel;
        let tile = block as usize * ctx.profile.items_per_thread.voxel as usize;
        let (mut p, slots) =
            make_params(grid, n, cloud.capacity, channels, max_voxels, max_points, ctx.profile.hash_load_factor);
        let km = p.key_max as usize;
        let ctr = self.counters.ensure(CTR_TOTAL)?;
        if n == 0 {
            self.counters.zero_all()?;
            return Ok(p);
        }
        p.gen = self.next_gen()?;
        let direct = p.flags & FLAG_DIRECT != 0;
        let tiles = n.div_ceil(tile);
        let blocks = n.div_ceil(block as usize);
        let passes = if select { 0 } else { p.sort_passes as usize };
        let first = self.table_first.ensure(slots)?;
        let vid = self.table_vid.ensure(slots)?;
        let tkeys = if direct {
            0
        } else {
            let k = self.table_keys.ensure(slots)?;
            if !self.keys_clean {
                self.table_keys.zero_all()?;
            }
            k
        };
        let pslot = self.pslot.ensure(n)?;
        let rstat = self.rank_status.ensure(tiles)?;
        let coords = self.coords.ensure(3 * km.max(1))?;
        let seg = self.seg_start.ensure(km.max(1))?;
        let (tcount, ppos, segp, segl) = if select {
            let c = self.table_count.ensure(slots)?;
            if !self.counts_clean {
                self.table_count.zero_all()?;
            }
            (c, self.point_pos.ensure(n)?, self.seg_points.ensure(n)?, self.seg_len.ensure(km.max(1))?)
        } else {
            (0, 0, 0, 0)
        };
        let (ka, kb, va, vb, sstat) = if select {
            (0, 0, 0, 0, 0)
        } else {
            (
                self.keys[0].ensure(n)?,
                self.keys[1].ensure(n)?,
                self.vals[0].ensure(n)?,
                self.vals[1].ensure(n)?,
                self.sort_status.ensure(passes * tiles * RADIX_BINS)?,
            )
        };
        let (pv, pc) =
            if point_outputs { (self.point_voxel.ensure(n)?, self.point_coords.ensure(3 * n)?) } else { (0, 0) };
        let mut mark = |name: &str| -> Result<(), GpuError> {
            if let Some(t) = timer.as_deref_mut() {
                t.stage(name)?;
            }
            Ok(())
        };

        if !direct {
            self.keys_clean = false;
        }
        if select {
            self.counts_clean = false;
        }
        {
            let mut l = s.launch_builder(&self.f_insert);
            l.arg(&cloud_ptr).arg(&tkeys).arg(&first).arg(&tcount).arg(&pslot).arg(&ppos).arg(&ctr).arg(&pc).arg(&p);
            // SAFETY: matches vox_insert; tables hold `slots` entries (count table or null), pslot n,
            // point_pos n or null, counters CTR_TOTAL, point_coords 3n or null.
            unsafe { l.launch(cfg(blocks, block)) }?;
        }
        mark("insert")?;
        {
            let mut l = EarlyLaunch::new();
            l.arg(&pslot)
                .arg(&tkeys)
                .arg(&first)
                .arg(&vid)
                .arg(&tcount)
                .arg(&ppos)
                .arg(&coords)
                .arg(&rstat)
                .arg(&ctr)
                .arg(&ka)
                .arg(&pv)
                .arg(&segp)
                .arg(&seg)
                .arg(&segl)
                .arg(&p);
            // SAFETY: matches vox_rank_keys; coords holds 3 * key_max ints, seg_start / seg_len
            // key_max words (ranks written only below min(max_voxels, distinct) <= key_max); status
            // `tiles` words; keys n or null (select); seg_points n or null; point_voxel n or null.
            // The kernel calls lk_wait_prior_grid first.
            unsafe { l.launch(ctx, s, &self.f_rank, cfg(tiles, block)) }?;
        }
        if !direct {
            self.keys_clean = true; // the rank kernel clears every key the insert kernel set
        }
        if select {
            self.counts_clean = true; // and resets every count the insert kernel added
        }
        mark(if select { "rank+segments" } else { "rank+keys" })?;
        let stride = (tiles * RADIX_BINS * std::mem::size_of::<u64>()) as u64;
        for q in 0..passes {
            let last = q + 1 == passes;
            let (kin, vin, kout, vout) =
                if q % 2 == 0 { (ka, if q == 0 { 0 } else { va }, kb, vb) } else { (kb, vb, ka, va) };
            let kout = if last { 0 } else { kout };
            let st = sstat + q as u64 * stride;
            let q32 = q as u32;
            let mut l = s.launch_builder(&self.f_sort);
            l.arg(&kin).arg(&vin).arg(&kout).arg(&vout).arg(&st).arg(&ctr).arg(&seg).arg(&p).arg(&q32);
            // SAFETY: matches vox_sort_pass; keys/values n each, status `tiles * 256` words per pass,
            // seg_start key_max words (kept ranks < key_max).
            unsafe { l.launch(cfg(tiles, block)) }?;
            mark(&format!("sort pass {q}"))?;
        }
        self.sorted_slot = passes % 2;
        Ok(p)
    }

    fn fill_blocks(ctx: &GpuContext, work: usize) -> usize {
        let block = ctx.profile.block_size.voxel as usize;
        work.div_ceil(block).clamp(1, ctx.sm_count.max(1) as usize * 16)
    }

    /// Hard voxelization of `cloud` (channels x, y, z + `channels`, cloud channel indices), results
    /// left on the device. `pillar`: `Some(with_range)` also writes the PointPillars features (fused;
    /// needs `channels[0]` = intensity); `raw`: write the `[V, P, C]` features.
    pub fn hard_device(
        &mut self,
        ctx: &GpuContext,
        cloud: &DeviceCloud,
        channels: &[usize],
        params: &HardVoxelParams,
        raw: bool,
        pillar: Option<bool>,
    ) -> Result<(), GpuError> {
        self.hard_device_timed(ctx, cloud, channels, params, raw, pillar, None)
    }

    /// [`Self::hard_device`] with a stage mark after every launch (per-kernel GPU times).
    #[allow(clippy::too_many_arguments)]
    pub fn hard_device_timed(
        &mut self,
        ctx: &GpuContext,
        cloud: &DeviceCloud,
        channels: &[usize],
        params: &HardVoxelParams,
        raw: bool,
        pillar: Option<bool>,
        mut timer: Option<&mut StageTimer>,
    ) -> Result<(), GpuError> {
        params.validate()?;
        if pillar.is_some() && channels.is_empty() {
            // The CPU reference's error for voxels without an intensity channel (channels[0]).
            return Err(ParamError::new("voxels.num_channels", 3, ">= 4 (x, y, z, intensity)").into());
        }
        let s = &self.stream.clone();
        let (cloud_ptr, _record) = cloud.slice().device_ptr(s);
        let select = params.max_points_per_voxel <= SELECT_MAX_POINTS;
        let mut p = self.enqueue_core(
            ctx,
            cloud,
            cloud_ptr,
            channels,
            &params.grid,
            Some(params.max_voxels),
            params.max_points_per_voxel,
            false,
            select,
            timer.as_deref_mut(),
        )?;
        let pc = match pillar {
            Some(true) => 10,
            Some(false) => 9,
            None => 0,
        };
        p.flags |= if raw { FLAG_RAW } else { 0 }
            | if pillar.is_some() { FLAG_PILLAR } else { 0 }
            | if pillar == Some(true) { FLAG_RANGE } else { 0 };
        let pp = params.max_points_per_voxel as usize;
        let km = p.key_max as usize;
        self.last = LastOp::Hard {
            max_points: pp,
            num_channels: p.num_ch as usize,
            pillar_channels: pc,
            max_voxels: params.max_voxels,
        };
        self.last_params = p;
        let np = self.num_points.ensure(km.max(1))?;
        let feats = self.features.ensure(if raw { km * pp * p.num_ch as usize } else { 1 }.max(1))?;
        let pil = self.pillar.ensure((km * pp * pc).max(1))?;
        let coords = self.coords.ensure(3 * km.max(1))?;
        if cloud.len == 0 {
            return Ok(());
        }
        let seg = self.seg_start.ptr();
        let ctr = self.counters.ptr();
        let block = ctx.profile.block_size.voxel;
        if select {
            let (segp, segl) = (self.seg_points.ptr(), self.seg_len.ptr());
            let feats_fill =
                if raw { self.features_fill.ensure(&self.features, pp, p.num_ch as usize, km)? } else { 0 };
            let pil_fill = if pc > 0 { self.pillar_fill.ensure(&self.pillar, pp, pc, km)? } else { 0 };
            let mut l = EarlyLaunch::new();
            l.arg(&cloud_ptr).arg(&segp).arg(&seg).arg(&segl).arg(&coords).arg(&ctr).arg(&np).arg(&feats).arg(&pil);
            l.arg(&feats_fill).arg(&pil_fill).arg(&p);
            // One warp per voxel. SAFETY: matches vox_hard_select; segments of the kept voxels
            // (< key_max) written by the rank kernel; outputs and their fill counts sized for
            // key_max voxels (a null count goes with a cleared flag). The kernel
            // calls lk_wait_prior_grid first.
            unsafe { l.launch(ctx, s, &self.f_select, cfg(Self::fill_blocks(ctx, km * 32), block)) }?;
        } else {
            self.features_fill.forget();
            self.pillar_fill.forget();
            let vals = self.vals[self.sorted_slot].ptr();
            let mut l = s.launch_builder(&self.f_fill);
            l.arg(&cloud_ptr).arg(&vals).arg(&seg).arg(&coords).arg(&ctr).arg(&np).arg(&feats).arg(&pil).arg(&p);
            // One thread per (voxel, slot). SAFETY: matches vox_hard_fill; outputs sized for
            // key_max voxels (>= kept voxels).
            unsafe { l.launch(cfg(Self::fill_blocks(ctx, km * pp), block)) }?;
        }
        if let Some(t) = timer {
            t.stage(if select { "select" } else { "fill" })?;
        }
        Ok(())
    }

    /// PointPillars decoration of the hard voxels the last [`Self::hard_device`] left on the device
    /// (raw features must have been written; channel 3 = intensity). Writes `self.pillar`.
    pub fn pillar_device(&mut self, ctx: &GpuContext, with_range: bool) -> Result<(), GpuError> {
        let LastOp::Hard { max_points, num_channels, max_voxels, .. } = self.last else {
            return Err(GpuError::NoResult { op: "pillar_device", result: "hard voxels" });
        };
        if num_channels < 4 {
            return Err(ParamError::new("voxels.num_channels", num_channels, ">= 4 (x, y, z, intensity)").into());
        }
        let mut p = self.last_params;
        p.flags = if with_range { FLAG_RANGE } else { 0 };
        let oc = if with_range { 10 } else { 9 };
        self.last = LastOp::Hard { max_points, num_channels, pillar_channels: oc, max_voxels };
        let km = p.key_max as usize;
        let pil = self.pillar.ensure((km * max_points * oc).max(1))?;
        self.pillar_fill.forget();
        if p.n == 0 {
            return Ok(());
        }
        let (feats, np, coords, ctr) =
            (self.features.ptr(), self.num_points.ptr(), self.coords.ptr(), self.counters.ptr());
        let mut l = self.stream.launch_builder(&self.f_pillar);
        l.arg(&feats).arg(&np).arg(&coords).arg(&ctr).arg(&pil).arg(&p);
        // SAFETY: matches vox_pillar; buffers sized by hard_device for key_max voxels.
        unsafe { l.launch(cfg(Self::fill_blocks(ctx, km * max_points), ctx.profile.block_size.voxel)) }?;
        Ok(())
    }

    /// Dynamic voxelization with means, results left on the device.
    pub fn dynamic_device(
        &mut self,
        ctx: &GpuContext,
        cloud: &DeviceCloud,
        channels: &[usize],
        grid: &VoxelGrid,
    ) -> Result<(), GpuError> {
        let s = &self.stream.clone();
        let (cloud_ptr, _record) = cloud.slice().device_ptr(s);
        let p = self.enqueue_core(ctx, cloud, cloud_ptr, channels, grid, None, 1, true, false, None)?;
        self.last = LastOp::Dynamic { points: cloud.len, num_channels: p.num_ch as usize };
        self.last_params = p;
        let km = p.key_max as usize;
        let c = p.num_ch as usize;
        let np = self.num_points.ensure(km.max(1))?;
        let means = self.features.ensure((km * c).max(1))?;
        self.features_fill.forget();
        if cloud.len == 0 {
            return Ok(());
        }
        let vals = self.vals[self.sorted_slot].ptr();
        let seg = self.seg_start.ptr();
        let ctr = self.counters.ptr();
        let mut l = s.launch_builder(&self.f_means);
        l.arg(&cloud_ptr).arg(&vals).arg(&seg).arg(&ctr).arg(&np).arg(&means).arg(&p);
        // SAFETY: matches vox_dyn_means; outputs sized for key_max voxels.
        unsafe { l.launch(cfg(Self::fill_blocks(ctx, km * c), ctx.profile.block_size.voxel)) }?;
        Ok(())
    }

    fn counters_host(&self) -> Result<Vec<u32>, GpuError> {
        self.counters.to_host(CTR_WORDS)
    }

    /// Copies the last hard result back (waits for the stream).
    pub fn hard_to_host(&self, _ctx: &GpuContext) -> Result<(HardVoxels, Option<PillarFeatures>), GpuError> {
        let LastOp::Hard { max_points, num_channels, max_voxels, pillar_channels } = self.last else {
            return Err(GpuError::NoResult { op: "hard_to_host", result: "hard voxels" });
        };
        let ctr = self.counters_host()?;
        let v = (ctr[CTR_VOXELS]).min(max_voxels) as usize;
        let coords = self.coords.to_host(3 * v)?;
        let mut hv = HardVoxels {
            features: Vec::new(),
            coords: coords.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect(),
            num_points: self.num_points.to_host(v)?,
            num_channels,
            max_points,
            dropped_out_of_range: ctr[CTR_OUT_OF_RANGE] as usize,
            dropped_point_capacity: ctr[CTR_POINT_CAP] as usize,
            dropped_voxel_capacity: ctr[CTR_VOXEL_CAP] as usize,
        };
        let (v, p, c) = (hv.voxel_count(), hv.max_points, hv.num_channels);
        let raw = self.last_params.flags & FLAG_RAW != 0 || self.last_params.flags & FLAG_PILLAR == 0;
        if raw {
            hv.features = self.features.to_host(v * p * c)?;
        }
        let pf = if pillar_channels > 0 {
            Some(PillarFeatures {
                features: self.pillar.to_host(v * p * pillar_channels)?,
                num_channels: pillar_channels,
                max_points: p,
            })
        } else {
            None
        };
        Ok((hv, pf))
    }

    /// The last hard result (raw features written) as the pipeline publishes it: the centroids
    /// (`vox_centroids`) and the `voxels` records (`vox_voxels_records`) written on the device,
    /// the [V, P, C] features (converted to fp16 on the device when `layout` says so), both copied
    /// once, straight into the messages' page-locked bytes. The two kernels are enqueued before
    /// the wait for the counters (they read the voxel count on the device), then one wait for
    /// both copies.
    pub fn hard_published(
        &mut self,
        ctx: &GpuContext,
        layout: &FeaturesLayout<'_>,
    ) -> Result<PublishedHardVoxels, GpuError> {
        let LastOp::Hard { max_points: p, num_channels: c, max_voxels, .. } = self.last else {
            return Err(GpuError::NoResult { op: "hard_published", result: "hard voxels" });
        };
        if self.last_params.flags & FLAG_RAW == 0 {
            return Err(GpuError::NoResult { op: "hard_published", result: "raw hard-voxel features" });
        }
        let names = &layout.names[..c.min(layout.names.len())];
        let (fields, step, intensity) = voxels_fields(names, c);
        let s = &self.stream.clone();
        let vp = self.last_params;
        // Room for every voxel the kernels may keep: min(max_voxels, distinct keys) <= key_max.
        let vmax = (vp.key_max as usize).min(max_voxels as usize);
        let (out, records) =
            (self.centroids.ensure((vmax * c).max(1))?, self.voxel_records.ensure((vmax * step as usize / 4).max(1))?);
        let (feats, np, coords, ctr_ptr) =
            (self.features.ptr(), self.num_points.ptr(), self.coords.ptr(), self.counters.ptr());
        if vp.n > 0 {
            let mut l = s.launch_builder(&self.f_centroids);
            l.arg(&feats).arg(&np).arg(&ctr_ptr).arg(&out).arg(&vp);
            // SAFETY: matches vox_centroids; features hold [V, P, C], out room for V * C floats.
            unsafe { l.launch(cfg(Self::fill_blocks(ctx, vmax * c), ctx.profile.block_size.voxel)) }?;
            let intensity = intensity.map_or(-1, |k| k as i32);
            let mut l = s.launch_builder(&self.f_voxel_records);
            l.arg(&out).arg(&np).arg(&coords).arg(&ctr_ptr).arg(&records).arg(&intensity).arg(&vp);
            // SAFETY: matches vox_voxels_records; centroids [V, C], num_points [V], coords [V, 3],
            // records room for V * step / 4 words (7 or 8 per voxel: `step` of `voxels_fields`).
            unsafe { l.launch(cfg(Self::fill_blocks(ctx, vmax), ctx.profile.block_size.voxel)) }?;
        }
        let ctr = self.counters_host()?;
        let v = (ctr[CTR_VOXELS]).min(max_voxels) as usize;
        debug_assert!(v <= vmax);
        let counts = self.hard_counts(&ctr);
        let mut voxels =
            CloudMessage::in_bytes(layout.header, 1, v, &fields, step, false, |len| ctx.output_pool.take(len));
        let mut features = layout.message(&counts, (c, p), |len| ctx.output_pool.take(len));
        if v > 0 {
            let n = v * p * c;
            let src = match layout.dtype {
                FeaturesDtype::Float32 => feats,
                FeaturesDtype::Float16 => {
                    let dst = self.half.ensure(n)?;
                    let n64 = n as u64;
                    let mut l = s.launch_builder(&self.f_half);
                    l.arg(&feats).arg(&dst).arg(&n64);
                    // SAFETY: matches vox_to_half; feats holds >= n floats, dst n halves.
                    unsafe { l.launch(cfg(Self::fill_blocks(ctx, n), ctx.profile.block_size.voxel)) }?;
                    dst
                }
            };
            let feature_bytes = features.data_mut();
            debug_assert_eq!(feature_bytes.len(), n * layout.dtype.bytes());
            let voxel_bytes = voxels.data_mut();
            debug_assert_eq!(voxel_bytes.len(), v * step as usize);
            // SAFETY: `src` holds the features message's record bytes (n values of its field
            // type, little endian like the device) and `records` the voxels message's; the host
            // bytes are not touched (nor their buffers reused) before the synchronisation below,
            // which returns once the copies have run or the stream has failed.
            unsafe {
                drv::memcpy_dtoh_async(feature_bytes, src, s.cu_stream())?;
                drv::memcpy_dtoh_async(voxel_bytes, records, s.cu_stream())?;
            }
            s.synchronize()?;
        }
        Ok(PublishedHardVoxels { counts, voxels, features })
    }

    /// The last hard result's counts, from its counters and the kept points' total.
    fn hard_counts(&self, ctr: &[u32]) -> HardVoxelCounts {
        let LastOp::Hard { max_voxels, .. } = self.last else { unreachable!("hard voxels") };
        let (n, oor, pcap, vcap) = (
            self.last_params.n as usize,
            ctr[CTR_OUT_OF_RANGE] as usize,
            ctr[CTR_POINT_CAP] as usize,
            ctr[CTR_VOXEL_CAP] as usize,
        );
        HardVoxelCounts {
            voxels: ctr[CTR_VOXELS].min(max_voxels) as usize,
            kept_points: n - oor - pcap - vcap,
            dropped_out_of_range: oor,
            dropped_point_capacity: pcap,
            dropped_voxel_capacity: vcap,
        }
    }

    /// fp16 copies of the last hard voxels' `[V, P, C]` features (`pillar = false`) or pillar
    /// features (`pillar = true`), converted on the device (half the bytes come back) with the
    /// rounding of [`crate::ops::voxel::features_f16`], so both backends give the same bits.
    pub fn hard_features_f16(&mut self, ctx: &GpuContext, pillar: bool) -> Result<Vec<half::f16>, GpuError> {
        let LastOp::Hard { max_points, num_channels, pillar_channels, max_voxels } = self.last else {
            return Err(GpuError::NoResult { op: "hard_features_f16", result: "hard voxels" });
        };
        let raw_written = self.last_params.flags & FLAG_RAW != 0;
        let (src, c) = match pillar {
            true if pillar_channels > 0 => (self.pillar.ptr(), pillar_channels),
            false if raw_written => (self.features.ptr(), num_channels),
            _ => {
                return Err(GpuError::NoResult {
                    op: "hard_features_f16",
                    result: if pillar { "pillar features" } else { "raw hard-voxel features" },
                })
            }
        };
        let v = (self.counters_host()?[CTR_VOXELS]).min(max_voxels) as usize;
        let n = v * max_points * c;
        if n == 0 {
            return Ok(Vec::new());
        }
        let dst = self.half.ensure(n)?;
        let n64 = n as u64;
        let mut l = self.stream.launch_builder(&self.f_half);
        l.arg(&src).arg(&dst).arg(&n64);
        // SAFETY: matches vox_to_half; src holds >= n floats (sized for key_max >= v voxels), dst n.
        unsafe { l.launch(cfg(Self::fill_blocks(ctx, n), ctx.profile.block_size.voxel)) }?;
        Ok(self.half.to_host(n)?.into_iter().map(half::f16::from_bits).collect())
    }

    /// The downsample stage on the device: dynamic voxels of every channel of `cloud`
    /// ([`Self::dynamic_device`]), then the `downsampled` message's records (`vox_ds_records`, from
    /// the means and the cloud's uploaded records) and, with `keep`, the downsampled cloud's x, y,
    /// z as device columns of stride V (`vox_means_xyz`), returned. Only enqueued: both kernels
    /// read the voxel count on the device, so nothing waits until [`Self::downsampled_published`].
    pub fn downsample_device(
        &mut self,
        ctx: &GpuContext,
        cloud: &DeviceCloud,
        grid: &VoxelGrid,
        keep: bool,
    ) -> Result<Option<PooledSlice<f32>>, GpuError> {
        let all: Vec<usize> = (3..cloud.num_channels()).collect();
        self.dynamic_device(ctx, cloud, &all, grid)?;
        let p = self.last_params;
        // Room for every voxel the kernels may write: the distinct keys <= key_max.
        let vmax = p.key_max as usize;
        let mut xyz = keep.then(|| ctx.cloud_pool.take(3 * vmax.max(1))).transpose()?;
        if cloud.len == 0 {
            self.last = LastOp::Downsample { num_channels: p.num_ch as usize };
            return Ok(xyz);
        }
        let s = &self.stream.clone();
        let out = self.ds_records.ensure(vmax * cloud.layout.point_step as usize)?;
        let (records, _r) = cloud.records.device_ptr(s);
        let (source, _s) = cloud.source.device_ptr(s);
        let (vals, seg, ctr_ptr, means) =
            (self.vals[self.sorted_slot].ptr(), self.seg_start.ptr(), self.counters.ptr(), self.features.ptr());
        let lay = cloud.layout;
        let mut l = s.launch_builder(&self.f_ds_records);
        l.arg(&records).arg(&source).arg(&vals).arg(&seg).arg(&ctr_ptr).arg(&means).arg(&out).arg(&lay).arg(&p);
        // SAFETY: matches vox_ds_records; `records` holds the cloud's message records and
        // `source` a record index for each of its points; vals / seg_start / means hold the
        // dynamic result of this cloud over all of its channels; out has room for V records.
        unsafe { l.launch(cfg(Self::fill_blocks(ctx, vmax), ctx.profile.block_size.voxel)) }?;
        if let Some(xyz) = xyz.as_mut() {
            let (dst, _x) = xyz.device_ptr_mut(s);
            let mut l = s.launch_builder(&self.f_means_xyz);
            l.arg(&means).arg(&ctr_ptr).arg(&dst).arg(&p);
            // SAFETY: matches vox_means_xyz; dst has room for 3 * V floats, means [V, C].
            unsafe { l.launch(cfg(Self::fill_blocks(ctx, 3 * vmax), ctx.profile.block_size.voxel)) }?;
        }
        self.last = LastOp::Downsample { num_channels: p.num_ch as usize };
        Ok(xyz)
    }

    /// The last [`Self::downsample_device`] as the pipeline publishes it: the `downsampled`
    /// message in `view`'s layout ([`super::downsampled_message`]), its records copied once into
    /// page-locked message bytes. Waits for the voxel count, then for the copy.
    pub fn downsampled_published(
        &mut self,
        ctx: &GpuContext,
        view: &CloudView<'_>,
    ) -> Result<PublishedDownsample, GpuError> {
        let LastOp::Downsample { num_channels } = self.last else {
            return Err(GpuError::NoResult { op: "downsampled_published", result: "downsample_device" });
        };
        if num_channels != view.layout.channels().len() {
            return Err(GpuError::NoResult { op: "downsampled_published", result: "dynamic voxels of every channel" });
        }
        let ctr = self.counters_host()?;
        let v = ctr[CTR_VOXELS] as usize;
        let mut message = downsampled_message_in(&view.msg.header, view, v, |len| ctx.output_pool.take(len));
        if v > 0 {
            let s = &self.stream;
            let bytes = message.data_mut();
            debug_assert_eq!(bytes.len(), v * view.layout.point_step as usize);
            // SAFETY: `ds_records` holds the v records the message's bytes take; the bytes are
            // not touched (nor their buffer reused) before the synchronisation below.
            unsafe { drv::memcpy_dtoh_async(bytes, self.ds_records.ptr(), s.cu_stream()) }?;
            s.synchronize()?;
        }
        Ok(PublishedDownsample { points: v, dropped_out_of_range: ctr[CTR_OUT_OF_RANGE] as usize, message })
    }

    /// The device address of the records the last [`Self::downsampled_published`] copied (the
    /// `downsampled` message's bytes), valid until the next call on this voxelizer.
    pub fn downsampled_records(&self) -> Result<u64, GpuError> {
        match self.last {
            LastOp::Downsample { .. } => Ok(self.ds_records.ptr()),
            _ => Err(GpuError::NoResult { op: "downsampled_records", result: "downsample_device" }),
        }
    }

    /// Copies the last dynamic result back (waits for the stream).
    pub fn dynamic_to_host(&self, _ctx: &GpuContext) -> Result<DynamicVoxels, GpuError> {
        let LastOp::Dynamic { points, num_channels } = self.last else {
            return Err(GpuError::NoResult { op: "dynamic_to_host", result: "dynamic voxels" });
        };
        let ctr = self.counters_host()?;
        let v = ctr[CTR_VOXELS] as usize;
        let tri = |x: Vec<i32>| x.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect::<Vec<_>>();
        Ok(DynamicVoxels {
            point_coords: tri(self.point_coords.to_host(3 * points)?),
            point_voxel: self.point_voxel.to_host(points)?,
            voxel_coords: tri(self.coords.to_host(3 * v)?),
            num_points: self.num_points.to_host(v)?,
            means: self.features.to_host(v * num_channels)?,
            num_channels,
            dropped_out_of_range: ctr[CTR_OUT_OF_RANGE] as usize,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// One-shot host-facing wrappers (a fresh voxelizer each call; keep a GpuVoxelizer for streams).
// ---------------------------------------------------------------------------------------------

/// [`crate::ops::voxel::voxelize_hard`] on the device cloud (channels x, y, z + `channels`).
pub fn voxelize_hard(
    ctx: &GpuContext,
    cloud: &DeviceCloud,
    channels: &[usize],
    params: &HardVoxelParams,
) -> Result<HardVoxels, GpuError> {
    let mut v = GpuVoxelizer::new(ctx)?;
    v.hard_device(ctx, cloud, channels, params, true, None)?;
    Ok(v.hard_to_host(ctx)?.0)
}

/// [`crate::ops::voxel::voxelize_dynamic`] on the device cloud.
pub fn voxelize_dynamic(
    ctx: &GpuContext,
    cloud: &DeviceCloud,
    channels: &[usize],
    grid: &VoxelGrid,
) -> Result<DynamicVoxels, GpuError> {
    let mut v = GpuVoxelizer::new(ctx)?;
    v.dynamic_device(ctx, cloud, channels, grid)?;
    v.dynamic_to_host(ctx)
}

/// Builds the downsampled cloud from dynamic voxels (channel names: x, y, z + the chosen ones):
/// [`Downsampled::from_dynamic`], the same function the CPU reference uses.
pub fn downsampled_from(dv: &DynamicVoxels, names: &[String]) -> Downsampled {
    Downsampled::from_dynamic(dv, names)
}

/// [`crate::ops::voxel::voxel_grid_downsample`] on the device cloud.
pub fn voxel_grid_downsample(
    ctx: &GpuContext,
    cloud: &DeviceCloud,
    channels: &[usize],
    grid: &VoxelGrid,
) -> Result<Downsampled, GpuError> {
    let dv = voxelize_dynamic(ctx, cloud, channels, grid)?;
    let names: Vec<String> = [0, 1, 2].iter().chain(channels).map(|&c| cloud.names[c].clone()).collect();
    Ok(downsampled_from(&dv, &names))
}

/// Hard voxels + [`crate::ops::voxel::pillar_features`] fused in one pass (`channels[0]` is the
/// intensity channel).
pub fn pillar_features(
    ctx: &GpuContext,
    cloud: &DeviceCloud,
    channels: &[usize],
    params: &HardVoxelParams,
    with_range: bool,
) -> Result<(HardVoxels, PillarFeatures), GpuError> {
    let mut v = GpuVoxelizer::new(ctx)?;
    v.hard_device(ctx, cloud, channels, params, true, Some(with_range))?;
    let (h, p) = v.hard_to_host(ctx)?;
    Ok((h, p.expect("pillar output requested")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::voxel::{w1_pillars, w1_voxels};

    #[test]
    fn dims_match_reference() {
        for g in [VoxelGrid::default(), w1_pillars().grid, w1_voxels().grid] {
            let (_, d) = grid_dims(&g);
            let r = g.dims();
            assert_eq!([d[0] as i32, d[1] as i32, d[2] as i32], r);
        }
        assert_eq!(grid_dims(&w1_pillars().grid).1, [640, 640, 1]);
        assert_eq!(grid_dims(&w1_voxels().grid).1, [1024, 1024, 40]);
    }

    #[test]
    fn radix_plan_covers_keys() {
        for km in [0u32, 1, 2, 255, 256, 60000, 65535, 65536, 160000, 409600, 1_700_000, u32::MAX] {
            let plan = radix_plan(km);
            let total: u32 = plan.iter().map(|p| p.1).sum();
            assert!(total >= 32 - km.leading_zeros(), "{km}: {plan:?}");
            let mut next = 0;
            for &(shift, bits) in &plan {
                assert_eq!(shift, next);
                assert!((1..=8).contains(&bits));
                next += bits;
            }
            assert_eq!(plan.len() as u32, (32 - km.leading_zeros()).max(1).div_ceil(8));
        }
        assert_eq!(radix_plan(60000), vec![(0, 8), (8, 8)]);
        assert_eq!(radix_plan(160000), vec![(0, 6), (6, 6), (12, 6)]);
    }

    #[test]
    fn hash_size_respects_load_factor() {
        for (n, lf) in [(0usize, 0.5), (1, 0.5), (107_647, 0.5), (409_600, 0.7), (1_700_481, 0.9)] {
            let h = hash_size(n, lf);
            assert!(h.is_power_of_two() && h >= 64);
            assert!(n as f64 / h as f64 <= lf, "{n} {lf} {h}");
            assert!(h > n);
        }
    }

    #[test]
    fn params_key_max_and_channels() {
        let p = w1_pillars();
        // Pillars: 640 x 640 x 1 cells, direct-mapped.
        let (vp, slots) = make_params(&p.grid, 107_647, 262_144, &[3, 5], Some(60000), 32, 0.5);
        assert_eq!(vp.key_max, 60000);
        assert_eq!(vp.num_ch, 5);
        assert_eq!(&vp.ch[..5], &[0, 1, 2, 3, 5]);
        assert_eq!(vp.flags & FLAG_DIRECT, FLAG_DIRECT);
        assert_eq!(slots, 640 * 640);
        assert_eq!((vp.sort_passes, vp.sort_bits, vp.sort_total), (2, 8, 16));
        // Voxels: 1024 x 1024 x 40 cells, hashed.
        let (vp, h) = make_params(&w1_voxels().grid, 107_647, 262_144, &[3], Some(160000), 10, 0.5);
        assert_eq!(vp.flags & FLAG_DIRECT, 0);
        assert_eq!(h, 262_144);
        assert_eq!(vp.hash_mask as usize, h - 1);
        assert_eq!(vp.hash_shift, 64 - 18);
        assert_eq!(vp.key_max, 107_647); // min(N, cap)
        assert_eq!((vp.sort_passes, vp.sort_bits, vp.sort_total), (3, 6, 17));
        // Dynamic: bounded by the cells of the grid (640 * 640) and by N.
        let (vp, _) = make_params(&p.grid, 1_700_481, 1_700_481, &[], None, 1, 0.5);
        assert_eq!(vp.key_max, 409_600);
        assert_eq!(vp.max_voxels, u32::MAX);
        let (vp, _) = make_params(&p.grid, 10, 10, &[], None, 1, 0.5);
        assert_eq!(vp.key_max, 10);
        assert_eq!((vp.sort_passes, vp.sort_bits, vp.sort_total), (1, 4, 4));
        assert_eq!(std::mem::size_of::<VoxParams>(), 4 * (3 * 4 + 14 + MAX_CHANNELS));
        for km in [0u32, 1, 255, 256, 60000, 160000, 409_600, MAX_POINTS as u32] {
            let plan = radix_plan(km);
            assert!(plan.len() <= RADIX_MAX_PASSES, "{km}");
            assert!(plan.iter().map(|q| q.1).sum::<u32>() <= 30, "{km}: the sort key's bit 31 is a flag");
            for (q, &(shift, _)) in plan.iter().enumerate() {
                assert_eq!(shift, q as u32 * plan[0].1);
            }
        }
    }

    /// Compiles cuda/voxel.cu for sm_72, sm_87 and sm_90 with every profile (needs NVRTC only).
    #[test]
    #[ignore]
    fn nvrtc_compiles_voxel() {
        if !crate::gpu::nvrtc::nvrtc_present() {
            eprintln!("skip: no NVRTC");
            return;
        }
        let k = crate::gpu::kernels::kernel("voxel").unwrap();
        let profiles = crate::gpu::profile::KernelProfile::builtins().unwrap();
        let rep =
            crate::gpu::nvrtc::nvrtc_check_with(std::slice::from_ref(k), &profiles, &crate::gpu::nvrtc::CHECK_ARCHS)
                .unwrap();
        println!("{rep}");
        assert!(rep.all_ok(), "{rep}");
    }
}
