//! Voxelization on the GPU (`cuda/voxel.cu`): hard voxelization, dynamic voxelization with scatter
//! means, voxel-grid downsampling and the PointPillars point decoration, reproducing
//! [`crate::ops::voxel`] exactly (integer outputs bit-identical; hard features and pillar features
//! bit-identical; dynamic means computed in the reference's order, hence identical too).
//!
//! Algorithm (no serial pass, no memset, no host synchronization; 4 launches for W1 pillars):
//! 1. one thread per point computes the voxel coordinate with the reference's f32 arithmetic and
//!    takes a table slot: the cell itself on small grids (direct-mapped table, `DIRECT_MAX_CELLS`),
//!    else an open-addressing hash slot (size from the profile's `hash_load_factor`); `atomicMax`
//!    of `gen << 32 | !index` keeps the voxel's first point, tagged with the call's generation so
//!    the table never needs clearing;
//! 2. a single-pass decoupled look-back scan over the "first point of its voxel" flags, in input
//!    order, gives every voxel its rank = output index (voxels past `max_voxels` dropped, counted);
//!    the same kernel turns every point into its sort key (the rank of its voxel, read once the
//!    tile of the voxel's first point has published it) and builds the radix histograms;
//! 3. a stable LSD radix sort of the points by voxel rank (one launch per 8-bit digit, per-digit
//!    decoupled look-back; values: point indices in input order) makes every voxel a contiguous
//!    segment in input order: a point's slot is its offset in the segment (exact input-order
//!    rank); the last pass also writes each segment's start;
//! 4. one thread per (voxel, slot) writes the output (raw channels and/or fused pillar features);
//!    dynamic means: one thread per (voxel, channel) sums the segment in f64 in input order.
//!
//! The scratch and output buffers are raw device allocations ([`DevBuf`]) passed to the kernels as
//! plain pointers: cudarc's per-argument event tracking (a stream wait and an event record per
//! slice argument and launch) would cost more host time than the kernels take on a 100k-point scan.
//! Everything runs on the context's one stream, so stream order is the only synchronization needed.
//!
//! Results stay on the device in the [`GpuVoxelizer`]'s buffers (for chaining) until the next call;
//! the `*_host` functions copy them back into the reference's output structs.

use super::context::{GpuContext, StageTimer};
use super::gather::DeviceCloud;
use super::report::{BenchRow, CheckRow, Rng};
use super::GpuError;
use crate::cloud::{Cloud, Header, PointCloud2, PointLayout};
use crate::ops::voxel::{Downsampled, DynamicVoxels, HardVoxelParams, HardVoxels, PillarFeatures, VoxelGrid};
use crate::ops::Validate;
use cudarc::driver::{
    result as drv, sys, CudaFunction, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use std::marker::PhantomData;
use std::path::Path;
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
const RADIX_BINS: usize = 256;
const RADIX_MAX_PASSES: usize = 4;
/// Counters + global digit histograms (`CTR_TOTAL` in cuda/voxel.cu).
const CTR_TOTAL: usize = CTR_WORDS + RADIX_MAX_PASSES * RADIX_BINS;

const FLAG_RAW: u32 = 1;
const FLAG_PILLAR: u32 = 2;
const FLAG_RANGE: u32 = 4;
const FLAG_DIRECT: u32 = 8;

/// Kernel parameters; must match `struct VoxParams` in cuda/voxel.cu.
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
    Hard { max_points: usize, num_channels: usize, pillar_channels: usize, max_voxels: u32 },
    Dynamic { points: usize, num_channels: usize },
}

/// The voxel kernels with their grow-only device scratch and output buffers (one per stream user).
pub struct GpuVoxelizer {
    f_insert: CudaFunction,
    f_rank: CudaFunction,
    f_sort: CudaFunction,
    f_fill: CudaFunction,
    f_means: CudaFunction,
    f_pillar: CudaFunction,
    f_half: CudaFunction,
    /// fp16 copies of the features ([`Self::hard_features_f16`]).
    half: DevBuf<u16>,
    /// Hash keys + 1 (0 = empty); all-zero between calls (the first point of each voxel clears its key).
    table_keys: DevBuf<u64>,
    /// `gen << 32 | !first point` per slot (generation-tagged: never cleared).
    table_first: DevBuf<u64>,
    table_vid: DevBuf<u32>,
    pslot: DevBuf<i32>,
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
    /// Hard: `[V, P, C]` features; dynamic: `[V, C]` means.
    pub features: DevBuf<f32>,
    /// `[V, P, 9 or 10]` pillar features.
    pub pillar: DevBuf<f32>,
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
}

fn cfg(blocks: usize, block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks.max(1) as u32, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

impl GpuVoxelizer {
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
        let s = &ctx.stream;
        let pools = ctx.ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? > 0;
        let f = |n: &str| ctx.function("voxel", n);
        let mut counters: DevBuf<u32> = DevBuf::new(s, pools);
        counters.ensure(CTR_TOTAL)?;
        Ok(Self {
            f_insert: f("vox_insert")?,
            f_rank: f("vox_rank_keys")?,
            f_sort: f("vox_sort_pass")?,
            f_fill: f("vox_hard_fill")?,
            f_means: f("vox_dyn_means")?,
            f_pillar: f("vox_pillar")?,
            f_half: f("vox_to_half")?,
            half: DevBuf::new(s, pools),
            table_keys: DevBuf::new(s, pools),
            table_first: DevBuf::new(s, pools),
            table_vid: DevBuf::new(s, pools),
            pslot: DevBuf::new(s, pools),
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
            point_voxel: DevBuf::new(s, pools),
            point_coords: DevBuf::new(s, pools),
            last: LastOp::None,
            last_params: VoxParams::default(),
            sorted_slot: 0,
            gen: 0,
            keys_clean: true,
        })
    }

    pub fn last(&self) -> LastOp {
        self.last
    }

    fn check_channels(cloud: &DeviceCloud, channels: &[usize]) -> Result<(), GpuError> {
        if 3 + channels.len() > MAX_CHANNELS {
            return Err(GpuError::Unsupported(format!(
                "{} extra channels: at most {}",
                channels.len(),
                MAX_CHANNELS - 3
            )));
        }
        if let Some(&c) = channels.iter().find(|&&c| c >= cloud.num_channels()) {
            return Err(GpuError::Unsupported(format!(
                "channel index {c} of a cloud with {} channels",
                cloud.num_channels()
            )));
        }
        if cloud.capacity > u32::MAX as usize || cloud.len > MAX_POINTS {
            return Err(GpuError::Unsupported(format!("cloud too large: at most {MAX_POINTS} points (30-bit counts)")));
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

    /// Steps 1-3 (table, ranks + keys, sort with segment starts). Returns the params.
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
        mut timer: Option<&mut StageTimer>,
    ) -> Result<VoxParams, GpuError> {
        grid.validate().map_err(|e| GpuError::Unsupported(e.to_string()))?;
        Self::check_channels(cloud, channels)?;
        let s = &ctx.stream;
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
        let passes = p.sort_passes as usize;
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
        let sstat = self.sort_status.ensure(passes * tiles * RADIX_BINS)?;
        let coords = self.coords.ensure(3 * km.max(1))?;
        let ka = self.keys[0].ensure(n)?;
        let kb = self.keys[1].ensure(n)?;
        let va = self.vals[0].ensure(n)?;
        let vb = self.vals[1].ensure(n)?;
        let seg = self.seg_start.ensure(km.max(1))?;
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
        {
            let mut l = s.launch_builder(&self.f_insert);
            l.arg(&cloud_ptr).arg(&tkeys).arg(&first).arg(&pslot).arg(&ctr).arg(&pc).arg(&p);
            // SAFETY: matches vox_insert; tables hold `slots` entries, pslot n, counters CTR_TOTAL,
            // point_coords 3n or null.
            unsafe { l.launch(cfg(blocks, block)) }?;
        }
        mark("insert")?;
        {
            let mut l = s.launch_builder(&self.f_rank);
            l.arg(&pslot)
                .arg(&tkeys)
                .arg(&first)
                .arg(&vid)
                .arg(&coords)
                .arg(&rstat)
                .arg(&ctr)
                .arg(&ka)
                .arg(&pv)
                .arg(&p);
            // SAFETY: matches vox_rank_keys; coords holds 3 * key_max ints (ranks written only below
            // min(max_voxels, distinct) <= key_max); status `tiles` words; keys n; point_voxel n or null.
            unsafe { l.launch(cfg(tiles, block)) }?;
        }
        if !direct {
            self.keys_clean = true; // the rank kernel clears every key the insert kernel set
        }
        mark("rank+keys")?;
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
        params.validate().map_err(|e| GpuError::Unsupported(e.to_string()))?;
        if pillar.is_some() && channels.is_empty() {
            return Err(GpuError::Unsupported("pillar features need an intensity channel (channels[0])".into()));
        }
        let s = &ctx.stream;
        let (cloud_ptr, _record) = cloud.slice().device_ptr(s);
        let mut p = self.enqueue_core(
            ctx,
            cloud,
            cloud_ptr,
            channels,
            &params.grid,
            Some(params.max_voxels),
            params.max_points_per_voxel,
            false,
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
        let vals = self.vals[self.sorted_slot].ptr();
        let seg = self.seg_start.ptr();
        let ctr = self.counters.ptr();
        let mut l = s.launch_builder(&self.f_fill);
        l.arg(&cloud_ptr).arg(&vals).arg(&seg).arg(&coords).arg(&ctr).arg(&np).arg(&feats).arg(&pil).arg(&p);
        // One thread per (voxel, slot); P <= 32 rounds the slots up to a power of two (lane groups).
        let lanes = if pp <= 32 { pp.next_power_of_two() } else { pp };
        // SAFETY: matches vox_hard_fill; outputs sized for key_max voxels (>= kept voxels).
        unsafe { l.launch(cfg(Self::fill_blocks(ctx, km * lanes), ctx.profile.block_size.voxel)) }?;
        if let Some(t) = timer {
            t.stage("fill")?;
        }
        Ok(())
    }

    /// PointPillars decoration of the hard voxels the last [`Self::hard_device`] left on the device
    /// (raw features must have been written; channel 3 = intensity). Writes `self.pillar`.
    pub fn pillar_device(&mut self, ctx: &GpuContext, with_range: bool) -> Result<(), GpuError> {
        let LastOp::Hard { max_points, num_channels, max_voxels, .. } = self.last else {
            return Err(GpuError::Unsupported("pillar_device needs hard voxels on the device".into()));
        };
        if num_channels < 4 {
            return Err(GpuError::Unsupported("pillar features need >= 4 channels".into()));
        }
        let mut p = self.last_params;
        p.flags = if with_range { FLAG_RANGE } else { 0 };
        let oc = if with_range { 10 } else { 9 };
        self.last = LastOp::Hard { max_points, num_channels, pillar_channels: oc, max_voxels };
        let km = p.key_max as usize;
        let pil = self.pillar.ensure((km * max_points * oc).max(1))?;
        if p.n == 0 {
            return Ok(());
        }
        let (feats, np, coords, ctr) =
            (self.features.ptr(), self.num_points.ptr(), self.coords.ptr(), self.counters.ptr());
        let mut l = ctx.stream.launch_builder(&self.f_pillar);
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
        let s = &ctx.stream;
        let (cloud_ptr, _record) = cloud.slice().device_ptr(s);
        let p = self.enqueue_core(ctx, cloud, cloud_ptr, channels, grid, None, 1, true, None)?;
        self.last = LastOp::Dynamic { points: cloud.len, num_channels: p.num_ch as usize };
        self.last_params = p;
        let km = p.key_max as usize;
        let c = p.num_ch as usize;
        let np = self.num_points.ensure(km.max(1))?;
        let means = self.features.ensure((km * c).max(1))?;
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
        let LastOp::Hard { max_points, num_channels, pillar_channels, max_voxels } = self.last else {
            return Err(GpuError::Unsupported("no hard voxels on the device".into()));
        };
        let ctr = self.counters_host()?;
        let v = (ctr[CTR_VOXELS]).min(max_voxels) as usize;
        let coords = self.coords.to_host(3 * v)?;
        let num_points = self.num_points.to_host(v)?;
        let raw = self.last_params.flags & FLAG_RAW != 0 || self.last_params.flags & FLAG_PILLAR == 0;
        let features = if raw { self.features.to_host(v * max_points * num_channels)? } else { Vec::new() };
        let hv = HardVoxels {
            features,
            coords: coords.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect(),
            num_points,
            num_channels,
            max_points,
            dropped_out_of_range: ctr[CTR_OUT_OF_RANGE] as usize,
            dropped_point_capacity: ctr[CTR_POINT_CAP] as usize,
            dropped_voxel_capacity: ctr[CTR_VOXEL_CAP] as usize,
        };
        let pf = if pillar_channels > 0 {
            Some(PillarFeatures {
                features: self.pillar.to_host(v * max_points * pillar_channels)?,
                num_channels: pillar_channels,
                max_points,
            })
        } else {
            None
        };
        Ok((hv, pf))
    }

    /// fp16 copies of the last hard voxels' `[V, P, C]` features (`pillar = false`) or pillar
    /// features (`pillar = true`), converted on the device (half the bytes come back) with the
    /// rounding of [`crate::ops::voxel::features_f16`], so both backends give the same bits.
    pub fn hard_features_f16(&mut self, ctx: &GpuContext, pillar: bool) -> Result<Vec<half::f16>, GpuError> {
        let LastOp::Hard { max_points, num_channels, pillar_channels, max_voxels } = self.last else {
            return Err(GpuError::Unsupported("no hard voxels on the device".into()));
        };
        let raw_written = self.last_params.flags & FLAG_RAW != 0;
        let (src, c) = match pillar {
            true if pillar_channels > 0 => (self.pillar.ptr(), pillar_channels),
            false if raw_written => (self.features.ptr(), num_channels),
            _ => {
                return Err(GpuError::Unsupported(format!(
                    "the last hard voxelization wrote no {} features",
                    if pillar { "pillar" } else { "raw" }
                )))
            }
        };
        let v = (self.counters_host()?[CTR_VOXELS]).min(max_voxels) as usize;
        let n = v * max_points * c;
        if n == 0 {
            return Ok(Vec::new());
        }
        let dst = self.half.ensure(n)?;
        let n64 = n as u64;
        let mut l = ctx.stream.launch_builder(&self.f_half);
        l.arg(&src).arg(&dst).arg(&n64);
        // SAFETY: matches vox_to_half; src holds >= n floats (sized for key_max >= v voxels), dst n.
        unsafe { l.launch(cfg(Self::fill_blocks(ctx, n), ctx.profile.block_size.voxel)) }?;
        Ok(self.half.to_host(n)?.into_iter().map(half::f16::from_bits).collect())
    }

    /// Copies the last dynamic result back (waits for the stream).
    pub fn dynamic_to_host(&self, _ctx: &GpuContext) -> Result<DynamicVoxels, GpuError> {
        let LastOp::Dynamic { points, num_channels } = self.last else {
            return Err(GpuError::Unsupported("no dynamic voxels on the device".into()));
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

/// A grow-only raw device allocation, passed to kernels as a plain pointer (no cudarc event
/// tracking). Allocated and freed in stream order on the voxelizer's stream (pool allocations
/// where the device supports them), zero-filled when (re)allocated.
pub struct DevBuf<T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    pools: bool,
    growths: u64,
    _t: PhantomData<T>,
}

impl<T> DevBuf<T> {
    fn new(stream: &Arc<CudaStream>, pools: bool) -> Self {
        Self { ptr: 0, len: 0, stream: stream.clone(), pools, growths: 0, _t: PhantomData }
    }

    fn release(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let ptr = std::mem::replace(&mut self.ptr, 0);
        self.len = 0;
        let ctx = self.stream.context();
        let r = ctx.bind_to_thread().and_then(|_| {
            if self.pools {
                // SAFETY: allocated by cuMemAllocAsync; freed after the stream's queued work.
                unsafe { drv::free_async(ptr, self.stream.cu_stream()) }
            } else {
                self.stream.synchronize()?;
                // SAFETY: allocated by cuMemAlloc; the stream's work on it has finished.
                unsafe { drv::free_sync(ptr) }
            }
        });
        ctx.record_err(r);
    }

    /// The device address (0 before the first `ensure`).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Capacity in elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many times the buffer was (re)allocated.
    pub fn growths(&self) -> u64 {
        self.growths
    }

    /// Zeroes the whole allocation (stream-ordered).
    fn zero_all(&self) -> Result<(), GpuError> {
        if self.ptr != 0 {
            self.stream.context().bind_to_thread()?;
            // SAFETY: ptr holds len elements.
            unsafe { drv::memset_d8_async(self.ptr, 0, self.len * std::mem::size_of::<T>(), self.stream.cu_stream()) }?;
        }
        Ok(())
    }

    /// At least `len` elements (grow-only, by at least half); returns the device address.
    fn ensure(&mut self, len: usize) -> Result<u64, GpuError> {
        if self.len < len.max(1) {
            let new_len = len.max(1).max(self.len + self.len / 2);
            self.release();
            let bytes = new_len * std::mem::size_of::<T>();
            self.stream.context().bind_to_thread()?;
            // SAFETY: plain allocation; zeroed in stream order before any kernel sees it.
            let ptr = unsafe {
                if self.pools {
                    drv::malloc_async(self.stream.cu_stream(), bytes)
                } else {
                    drv::malloc_sync(bytes)
                }
            }?;
            self.ptr = ptr;
            self.len = new_len;
            self.growths += 1;
            self.zero_all()?;
        }
        Ok(self.ptr)
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> DevBuf<T> {
    /// Copies the first `len` elements to the host (waits for the stream).
    pub fn to_host(&self, len: usize) -> Result<Vec<T>, GpuError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        assert!(len <= self.len, "DevBuf::to_host: {len} elements of {}", self.len);
        // SAFETY: T is valid as all-zero bits.
        let mut v = vec![unsafe { std::mem::zeroed::<T>() }; len];
        self.stream.context().bind_to_thread()?;
        // SAFETY: ptr holds >= len elements; the copy completes before synchronize returns.
        unsafe { drv::memcpy_dtoh_async(&mut v, self.ptr, self.stream.cu_stream()) }?;
        self.stream.synchronize()?;
        Ok(v)
    }
}

impl<T> Drop for DevBuf<T> {
    fn drop(&mut self) {
        self.release();
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

// ---------------------------------------------------------------------------------------------
// Checks against the CPU reference and benchmarks
// ---------------------------------------------------------------------------------------------

/// The W1 "pillars" configuration (spconv PointToVoxel peer workload).
pub fn w1_pillars() -> HardVoxelParams {
    HardVoxelParams {
        grid: VoxelGrid { voxel_size: [0.16, 0.16, 10.0], point_cloud_range: [-51.2, -51.2, -5.0, 51.2, 51.2, 5.0] },
        max_points_per_voxel: 32,
        max_voxels: 60000,
    }
}

/// The W1 "voxels" configuration.
pub fn w1_voxels() -> HardVoxelParams {
    HardVoxelParams {
        grid: VoxelGrid { voxel_size: [0.1, 0.1, 0.2], point_cloud_range: [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0] },
        max_points_per_voxel: 10,
        max_voxels: 160000,
    }
}

fn random_cloud(rng: &mut Rng, n: usize) -> Cloud {
    let mut c = [Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n)];
    for _ in 0..n {
        c[0].push(rng.f32(-60.0, 60.0));
        c[1].push(rng.f32(-60.0, 60.0));
        c[2].push(rng.f32(-6.0, 6.0));
        c[3].push(rng.f32(0.0, 255.0));
    }
    let [x, y, z, i] = c;
    Cloud::from_xyz(x, y, z).with_channel("intensity", i)
}

/// Check clouds drawn from `seed`: (name, cloud with x, y, z, intensity). NaN points included in
/// "nan" (the gather drops them on both sides).
pub(crate) fn check_clouds(seed: u64, big: bool) -> Vec<(String, Cloud)> {
    let mut rng = Rng::new(seed);
    let mut out = vec![
        ("random 0".to_string(), random_cloud(&mut rng, 0)),
        ("random 1".to_string(), random_cloud(&mut rng, 1)),
        ("random 300".to_string(), random_cloud(&mut rng, 300)),
        ("random 100k".to_string(), random_cloud(&mut rng, 100_000)),
    ];
    if big {
        out.push(("random 1.2M".to_string(), random_cloud(&mut rng, 1_200_000)));
    }
    // All points in one voxel (of both W1 grids): 20000 points in [0.01, 0.09]^2 x [0.01, 0.19].
    let n = 20_000;
    let one = Cloud::from_xyz(
        (0..n).map(|_| rng.f32(0.01, 0.09)).collect(),
        (0..n).map(|_| rng.f32(0.01, 0.09)).collect(),
        (0..n).map(|_| rng.f32(0.01, 0.19)).collect(),
    )
    .with_channel("intensity", (0..n).map(|k| k as f32).collect());
    out.push(("one voxel 20k".to_string(), one));
    // Duplicates: 500 distinct points, each 40 times, interleaved.
    let base = random_cloud(&mut rng, 500);
    let idx: Vec<usize> = (0..20_000).map(|k| (k * 7919) % 500).collect();
    out.push(("duplicates 500x40".to_string(), base.select(&idx)));
    // Borders: exact voxel and range borders of both W1 grids (multiples of 0.16, 0.1, 0.2, and the
    // range ends), every combination of a few.
    let xs: Vec<f32> =
        (0..=640).map(|k| -51.2 + 0.16 * k as f32).chain([-51.2, 51.2, 51.199997, -51.200001, 0.0, -0.0]).collect();
    let zs = [-5.0f32, 5.0, 3.0, 2.999_999_8, -5.000_000_5, 0.0, 0.2, 0.4, 0.6000001, 4.99];
    let (mut bx, mut by, mut bz) = (Vec::new(), Vec::new(), Vec::new());
    for (k, &x) in xs.iter().enumerate() {
        for &z in &zs {
            bx.push(x);
            by.push(xs[(k * 37) % xs.len()]);
            bz.push(z);
            bx.push(-x);
            by.push(x);
            bz.push(z);
        }
    }
    let nb = bx.len();
    out.push((
        "borders".to_string(),
        Cloud::from_xyz(bx, by, bz).with_channel("intensity", (0..nb).map(|k| k as f32).collect()),
    ));
    // NaN / inf points (dropped by the gather), and NaN intensities (kept; they propagate).
    let mut nan = random_cloud(&mut rng, 50_000);
    {
        let cols = nan.columns().to_vec();
        let mut c = cols;
        for k in (0..50_000).step_by(7) {
            c[k % 3][k] = if k % 2 == 0 { f32::NAN } else { f32::INFINITY };
        }
        for k in (3..50_000).step_by(11) {
            c[3][k] = f32::NAN;
        }
        let [x, y, z, i]: [Vec<f32>; 4] = c.try_into().unwrap();
        nan = Cloud::from_xyz(x, y, z).with_channel("intensity", i);
    }
    out.push(("nan/inf points".to_string(), nan));
    out
}

fn upload(ctx: &GpuContext, cloud: &Cloud) -> Result<(DeviceCloud, Cloud), GpuError> {
    let msg = PointCloud2::from_cloud(Header::default(), cloud, &PointLayout::packed_for(cloud));
    let cpu = crate::cloud::gather(&msg)?;
    let dev = super::gather::upload_and_gather(ctx, &msg)?;
    Ok((dev, cpu.cloud))
}

/// The cloud with x, y, z + the chosen channels (what the GPU sees as its C channels).
fn project(cloud: &Cloud, channels: &[usize]) -> Cloud {
    let cols = cloud.columns();
    let mut out = Cloud::from_xyz(cols[0].clone(), cols[1].clone(), cols[2].clone());
    for &c in channels {
        out = out.with_channel(&cloud.names()[c], cols[c].clone());
    }
    out
}

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Largest relative difference (NaN == NaN; NaN vs number = infinity; length mismatch = infinity).
fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let mut m = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        if x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()) {
            continue;
        }
        let (x, y) = (x as f64, y as f64);
        let d = if x.is_finite() && y.is_finite() {
            (x - y).abs() / x.abs().max(y.abs()).max(f64::MIN_POSITIVE)
        } else {
            f64::INFINITY
        };
        m = m.max(d);
    }
    m
}

fn hard_same(a: &HardVoxels, b: &HardVoxels) -> bool {
    a.coords == b.coords
        && a.num_points == b.num_points
        && a.num_channels == b.num_channels
        && a.max_points == b.max_points
        && a.dropped_out_of_range == b.dropped_out_of_range
        && a.dropped_point_capacity == b.dropped_point_capacity
        && a.dropped_voxel_capacity == b.dropped_voxel_capacity
}

fn dyn_same(a: &DynamicVoxels, b: &DynamicVoxels) -> bool {
    a.point_coords == b.point_coords
        && a.point_voxel == b.point_voxel
        && a.voxel_coords == b.voxel_coords
        && a.num_points == b.num_points
        && a.num_channels == b.num_channels
        && a.dropped_out_of_range == b.dropped_out_of_range
}

fn first_hard_diff(g: &HardVoxels, c: &HardVoxels) -> String {
    if g.coords != c.coords {
        let i = g.coords.iter().zip(&c.coords).position(|(a, b)| a != b);
        return format!("coords differ (gpu {} cpu {} voxels, first at {i:?})", g.coords.len(), c.coords.len());
    }
    if g.num_points != c.num_points {
        let i = g.num_points.iter().zip(&c.num_points).position(|(a, b)| a != b);
        return format!("num_points differ first at {i:?}");
    }
    format!(
        "counters gpu oor {} pcap {} vcap {} / cpu {} {} {}",
        g.dropped_out_of_range,
        g.dropped_point_capacity,
        g.dropped_voxel_capacity,
        c.dropped_out_of_range,
        c.dropped_point_capacity,
        c.dropped_voxel_capacity
    )
}

/// Compares every GPU voxel operator with the CPU reference on the real Ouster scans
/// (`ouster_dir/*.bin`) and on clouds drawn from `seed`, for the W1 pillars and voxels configs;
/// each GPU op runs twice (outputs must be identical).
pub fn check(ctx: &GpuContext, seed: u64, ouster_dir: &Path) -> Result<Vec<CheckRow>, GpuError> {
    check_with(ctx, seed, ouster_dir, false)
}

/// [`check`]; `quick` keeps the first Ouster scan and the small drawn clouds only (for runs under
/// compute-sanitizer).
pub fn check_with(ctx: &GpuContext, seed: u64, ouster_dir: &Path, quick: bool) -> Result<Vec<CheckRow>, GpuError> {
    use crate::ops::voxel as cpu;
    let mut cases: Vec<(String, Cloud, Vec<usize>)> = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(ouster_dir)
        .map_err(|e| GpuError::Unsupported(format!("{}: {e}", ouster_dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    files.sort();
    if quick {
        files.truncate(1);
    }
    for (k, f) in files.iter().enumerate() {
        let scan = crate::bag::sample::load_ouster_bin(f)
            .map_err(|e| GpuError::Unsupported(format!("{}: {e}", f.display())))?;
        // Channel 3 = reflectivity as the intensity; the first scan also carries ring and t.
        let chans = if k == 0 { vec![3, 4, 5] } else { vec![3] };
        cases.push((format!("ouster {}", f.file_name().unwrap().to_string_lossy()), scan, chans));
    }
    for (name, cloud) in check_clouds(seed, !quick) {
        cases.push((name, cloud, vec![3]));
    }
    let configs = [
        ("pillars", w1_pillars()),
        ("voxels", w1_voxels()),
        ("small caps", HardVoxelParams { max_points_per_voxel: 3, max_voxels: 1000, ..w1_pillars() }),
    ];
    let mut vox = GpuVoxelizer::new(ctx)?;
    let mut rows = Vec::new();
    for (case, cloud, chans) in &cases {
        let (dev, host) = upload(ctx, cloud)?;
        let proj = project(&host, chans);
        let npts = cloud.len();
        for (cfg_name, params) in &configs {
            let label = format!("{case} / {cfg_name}");
            // Hard voxelization (+ fused pillars, + standalone pillar kernel).
            let exp = cpu::voxelize_hard(&proj, params).map_err(|e| GpuError::Unsupported(e.to_string()))?;
            vox.hard_device(ctx, &dev, chans, params, true, Some(true))?;
            let (g1, pf1) = vox.hard_to_host(ctx)?;
            let half_raw = vox.hard_features_f16(ctx, false)?;
            let half_pillar = vox.hard_features_f16(ctx, true)?;
            vox.hard_device(ctx, &dev, chans, params, true, Some(true))?;
            let (g2, pf2) = vox.hard_to_host(ctx)?;
            let half_bits = |h: &[half::f16]| {
                h.iter().map(|v| if v.is_nan() { u16::MAX } else { v.to_bits() }).collect::<Vec<u16>>()
            };
            let half_same = half_bits(&half_raw) == half_bits(&cpu::features_f16(&exp.features))
                && pf1.as_ref().is_some_and(|p| half_bits(&half_pillar) == half_bits(&cpu::features_f16(&p.features)));
            rows.push(CheckRow {
                operator: "voxel features fp16".into(),
                case: label.clone(),
                points: npts,
                integers_identical: half_same,
                max_rel_err: 0.0,
                float_tolerance: 0.0,
                deterministic: half_bits(&half_raw) == half_bits(&vox.hard_features_f16(ctx, false)?),
                detail: format!(
                    "{} raw + {} pillar values, fp16 bits vs CPU rounding (NaN as one class)",
                    half_raw.len(),
                    half_pillar.len()
                ),
            });
            let ints = hard_same(&g1, &exp);
            let rel = if bits_eq(&g1.features, &exp.features) {
                0.0
            } else {
                max_rel(&g1.features, &exp.features).max(1e-300)
            };
            rows.push(CheckRow {
                operator: "voxelize_hard".into(),
                case: label.clone(),
                points: npts,
                integers_identical: ints,
                max_rel_err: rel,
                float_tolerance: 0.0,
                deterministic: hard_same(&g1, &g2) && bits_eq(&g1.features, &g2.features),
                detail: if ints {
                    format!(
                        "V={} kept={} oor={} pcap={} vcap={}",
                        g1.voxel_count(),
                        g1.kept_points(),
                        g1.dropped_out_of_range,
                        g1.dropped_point_capacity,
                        g1.dropped_voxel_capacity
                    )
                } else {
                    first_hard_diff(&g1, &exp)
                },
            });
            let pf1 = pf1.unwrap();
            let pf2 = pf2.unwrap();
            for with_range in [true, false] {
                let pexp = cpu::pillar_features(&exp, &params.grid, with_range)
                    .map_err(|e| GpuError::Unsupported(e.to_string()))?;
                let (fused, fused2) = if with_range {
                    (pf1.clone(), pf2.clone())
                } else {
                    vox.hard_device(ctx, &dev, chans, params, true, Some(false))?;
                    let a = vox.hard_to_host(ctx)?.1.unwrap();
                    vox.hard_device(ctx, &dev, chans, params, true, Some(false))?;
                    (a, vox.hard_to_host(ctx)?.1.unwrap())
                };
                // Standalone kernel on the device hard voxels.
                vox.hard_device(ctx, &dev, chans, params, true, None)?;
                vox.pillar_device(ctx, with_range)?;
                let standalone = vox.hard_to_host(ctx)?.1.unwrap();
                let same = bits_eq(&fused.features, &pexp.features) && bits_eq(&standalone.features, &pexp.features);
                rows.push(CheckRow {
                    operator: format!("pillar_features{}", if with_range { " (range)" } else { "" }),
                    case: label.clone(),
                    points: npts,
                    integers_identical: fused.num_channels == pexp.num_channels && fused.max_points == pexp.max_points,
                    max_rel_err: if same {
                        0.0
                    } else {
                        max_rel(&fused.features, &pexp.features)
                            .max(max_rel(&standalone.features, &pexp.features))
                            .max(1e-300)
                    },
                    float_tolerance: 0.0,
                    deterministic: bits_eq(&fused.features, &fused2.features),
                    detail: format!("fused + standalone kernel, {} floats", fused.features.len()),
                });
            }
            if *cfg_name == "small caps" {
                continue; // dynamic ops have no caps
            }
            // Dynamic voxelization and downsampling.
            let dexp = cpu::voxelize_dynamic(&proj, &params.grid);
            vox.dynamic_device(ctx, &dev, chans, &params.grid)?;
            let d1 = vox.dynamic_to_host(ctx)?;
            vox.dynamic_device(ctx, &dev, chans, &params.grid)?;
            let d2 = vox.dynamic_to_host(ctx)?;
            rows.push(CheckRow {
                operator: "voxelize_dynamic".into(),
                case: label.clone(),
                points: npts,
                integers_identical: dyn_same(&d1, &dexp),
                max_rel_err: max_rel(&d1.means, &dexp.means),
                float_tolerance: 1e-6,
                deterministic: dyn_same(&d1, &d2) && bits_eq(&d1.means, &d2.means),
                detail: format!(
                    "V={} oor={} means bit-identical: {}",
                    d1.voxel_count(),
                    d1.dropped_out_of_range,
                    bits_eq(&d1.means, &dexp.means)
                ),
            });
            let ds_exp = cpu::voxel_grid_downsample(&proj, &params.grid);
            let ds = voxel_grid_downsample(ctx, &dev, chans, &params.grid)?;
            let ds2 = voxel_grid_downsample(ctx, &dev, chans, &params.grid)?;
            let cols_rel =
                ds.cloud.columns().iter().zip(ds_exp.cloud.columns()).map(|(a, b)| max_rel(a, b)).fold(0.0, f64::max);
            let cols_det = ds.cloud.columns().iter().zip(ds2.cloud.columns()).all(|(a, b)| bits_eq(a, b));
            rows.push(CheckRow {
                operator: "voxel_grid_downsample".into(),
                case: label,
                points: npts,
                integers_identical: ds.cloud.len() == ds_exp.cloud.len()
                    && ds.cloud.names() == ds_exp.cloud.names()
                    && ds.dropped_out_of_range == ds_exp.dropped_out_of_range,
                max_rel_err: cols_rel,
                float_tolerance: 1e-6,
                deterministic: cols_det && ds.dropped_out_of_range == ds2.dropped_out_of_range,
                detail: format!("{} -> {} points", host.len(), ds.cloud.len()),
            });
        }
    }
    Ok(rows)
}

/// Reads `dir/name.bin` as `[N, 4]` float32 LE (x, y, z, r) into a cloud.
fn load_xyzr(dir: &Path, name: &str) -> Result<Cloud, GpuError> {
    let p = dir.join(format!("{name}.bin"));
    let bytes = std::fs::read(&p).map_err(|e| GpuError::Unsupported(format!("{}: {e}", p.display())))?;
    if bytes.len() % 16 != 0 {
        return Err(GpuError::Unsupported(format!("{}: not [N, 4] float32", p.display())));
    }
    let v: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let c = |k: usize| v.iter().skip(k).step_by(4).copied().collect::<Vec<f32>>();
    Ok(Cloud::from_xyz(c(0), c(1), c(2)).with_channel("intensity", c(3)))
}

/// (median GPU ms between events around `f`, median host µs spent enqueueing `f`).
fn median_ms(
    timer: &mut StageTimer,
    runs: usize,
    mut f: impl FnMut() -> Result<(), GpuError>,
) -> Result<(f64, f64), GpuError> {
    for _ in 0..10 {
        f()?;
    }
    let mut t = Vec::with_capacity(runs);
    let mut host = Vec::with_capacity(runs);
    for _ in 0..runs {
        timer.start()?;
        let h = std::time::Instant::now();
        f()?;
        host.push(h.elapsed().as_secs_f64() * 1e6);
        timer.stage("op")?;
        t.push(timer.finish()?[0].1 as f64);
    }
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    host.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok((t[runs / 2], host[runs / 2]))
}

/// Per-launch GPU times (median of 100 runs, an event after every launch) of hard voxelization on
/// the W1 pillars workloads, raw features and raw + fused pillar features: one line per workload.
pub fn bench_stages(ctx: &GpuContext, workloads: &Path) -> Result<Vec<String>, GpuError> {
    const RUNS: usize = 100;
    let mut vox = GpuVoxelizer::new(ctx)?;
    let mut timer = ctx.stage_timer();
    let mut out = Vec::new();
    for wl in ["scan0_xyzr", "large_xyzr"] {
        let Ok(cloud) = load_xyzr(workloads, wl) else { continue };
        let (dev, _) = upload(ctx, &cloud)?;
        for (what, pillar) in [("raw", None), ("raw + pillar", Some(false))] {
            let mut per: Vec<(String, Vec<f64>)> = Vec::new();
            for run in 0..RUNS + 10 {
                timer.start()?;
                vox.hard_device_timed(ctx, &dev, &[3], &w1_pillars(), true, pillar, Some(&mut timer))?;
                let st = timer.finish()?;
                if run < 10 {
                    continue;
                }
                for (k, (name, ms)) in st.into_iter().enumerate() {
                    if per.len() <= k {
                        per.push((name, Vec::new()));
                    }
                    per[k].1.push(ms as f64);
                }
            }
            let mut line = format!("stages W1 pillars {wl} ({what}):");
            let mut sum = 0.0;
            for (name, mut v) in per {
                v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let m = v[v.len() / 2];
                sum += m;
                line.push_str(&format!(" {name} {:.4}", m));
            }
            line.push_str(&format!(" | sum {:.4} ms", sum));
            out.push(line);
        }
    }
    Ok(out)
}

/// GPU time (CUDA events, 10 warm-up runs, median of 100) of the voxel operators on the W1
/// workloads in `workloads` (`scan0_xyzr.bin`, `large_xyzr.bin`), data already on the device.
pub fn bench(ctx: &GpuContext, workloads: &Path) -> Result<Vec<BenchRow>, GpuError> {
    const RUNS: usize = 100;
    let mut vox = GpuVoxelizer::new(ctx)?;
    let mut timer = ctx.stage_timer();
    let mut rows = Vec::new();
    for (wl, target_p, peer_p, peer_v) in [("scan0_xyzr", 0.03, 0.030, 0.553), ("large_xyzr", 0.1, 0.121, 0.732)] {
        let cloud = match load_xyzr(workloads, wl) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("bench: skipping {wl}: {e}");
                continue;
            }
        };
        let (dev, _) = upload(ctx, &cloud)?;
        let n = dev.len;
        let ch = [3usize];
        for (cfg_name, params, target, peer) in
            [("pillars", w1_pillars(), Some(target_p), Some(peer_p)), ("voxels", w1_voxels(), None, Some(peer_v))]
        {
            let (ms, host_us) = median_ms(&mut timer, RUNS, || vox.hard_device(ctx, &dev, &ch, &params, true, None))?;
            let (h, _) = vox.hard_to_host(ctx)?;
            let bytes = (n * 16 + h.features.len() * 4 + h.coords.len() * 12 + h.num_points.len() * 4) as u64;
            rows.push(BenchRow {
                operator: "voxelize_hard".into(),
                workload: format!("W1 {cfg_name} {wl}"),
                points: n,
                median_ms: ms,
                runs: RUNS,
                min_bytes: bytes,
                target_ms: target,
                peer_ms: peer,
                note: format!("V={} kept={} host {host_us:.1} us", h.voxel_count(), h.kept_points()),
            });
            if cfg_name == "pillars" {
                let (ms, host_us) =
                    median_ms(&mut timer, RUNS, || vox.hard_device(ctx, &dev, &ch, &params, true, Some(false)))?;
                let (h, pf) = vox.hard_to_host(ctx)?;
                let pf = pf.unwrap();
                rows.push(BenchRow {
                    operator: "voxelize_hard + pillar_features (fused)".into(),
                    workload: format!("W1 {cfg_name} {wl}"),
                    points: n,
                    median_ms: ms,
                    runs: RUNS,
                    min_bytes: bytes + pf.features.len() as u64 * 4,
                    target_ms: if wl == "scan0_xyzr" { Some(0.05) } else { None },
                    peer_ms: None,
                    note: format!("V={} raw + 9-channel features host {host_us:.1} us", h.voxel_count()),
                });
            }
            let (ms, host_us) = median_ms(&mut timer, RUNS, || vox.dynamic_device(ctx, &dev, &ch, &params.grid))?;
            let d = vox.dynamic_to_host(ctx)?;
            rows.push(BenchRow {
                operator: "voxelize_dynamic (means)".into(),
                workload: format!("W1 {cfg_name} grid {wl}"),
                points: n,
                median_ms: ms,
                runs: RUNS,
                min_bytes: (n * 16 + n * 16 + d.means.len() * 4 + d.voxel_coords.len() * 16) as u64,
                target_ms: None,
                peer_ms: None,
                note: format!("V={} host {host_us:.1} us", d.voxel_count()),
            });
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn check_clouds_are_deterministic() {
        let a = check_clouds(7, false);
        let b = check_clouds(7, false);
        assert_eq!(a.len(), b.len());
        for ((na, ca), (nb, cb)) in a.iter().zip(&b) {
            assert_eq!(na, nb);
            assert_eq!(ca.len(), cb.len());
            for (x, y) in ca.columns().iter().zip(cb.columns()) {
                assert!(bits_eq(x, y));
            }
        }
        assert_eq!(a[0].1.len(), 0);
        assert_eq!(a[1].1.len(), 1);
    }

    #[test]
    fn compare_helpers() {
        assert_eq!(max_rel(&[1.0, f32::NAN], &[1.0, f32::NAN]), 0.0);
        assert!(max_rel(&[1.0], &[f32::NAN]).is_infinite());
        assert!((max_rel(&[1.0], &[1.000001]) - 1e-6).abs() < 1e-7);
        assert!(!bits_eq(&[0.0], &[-0.0]));
    }

    /// Compiles cuda/voxel.cu for sm_72, sm_87 and sm_90 with every profile (needs NVRTC only).
    #[test]
    #[ignore]
    fn nvrtc_compiles_voxel() {
        if !super::super::nvrtc::nvrtc_present() {
            eprintln!("skip: no NVRTC");
            return;
        }
        let k = super::super::kernels::kernel("voxel").unwrap();
        let profiles = super::super::profile::KernelProfile::builtins().unwrap();
        let rep = super::super::nvrtc::nvrtc_check_with(
            std::slice::from_ref(k),
            &profiles,
            &super::super::nvrtc::CHECK_ARCHS,
        )
        .unwrap();
        println!("{rep}");
        assert!(rep.all_ok(), "{rep}");
    }
}
