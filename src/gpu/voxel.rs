//! Voxelization on the GPU (`cuda/voxel.cu`): hard voxelization, dynamic voxelization with scatter
//! means, voxel-grid downsampling and the PointPillars point decoration, reproducing
//! [`crate::ops::voxel`] exactly (integer outputs bit-identical; hard features and pillar features
//! bit-identical; dynamic means computed in the reference's order, hence identical too).
//!
//! Algorithm (no serial pass, no host synchronization between kernels):
//! 1. one thread per point computes the voxel coordinate with the reference's f32 arithmetic and
//!    inserts the linear voxel index into an open-addressing hash table (size from the profile's
//!    `hash_load_factor`), taking `atomicMin` of the point index (the voxel's first point);
//! 2. a single-pass decoupled look-back scan over the "first point of its voxel" flags, in input
//!    order, gives every voxel its rank = output index (voxels past `max_voxels` dropped, counted);
//! 3. a stable LSD radix sort of the points by voxel rank (values: point indices in input order)
//!    makes every voxel a contiguous segment in input order: a point's slot is its offset in the
//!    segment (exact input-order rank); slots `>= P` are dropped and counted;
//! 4. one thread per (voxel, slot) writes the output (raw channels and/or fused pillar features);
//!    dynamic means: one thread per (voxel, channel) sums the segment in f64 in input order.
//!
//! Results stay on the device in the [`GpuVoxelizer`]'s buffers (for chaining) until the next call;
//! the `*_host` functions copy them back into the reference's output structs.

use super::context::{GpuContext, StageTimer};
use super::gather::DeviceCloud;
use super::report::{BenchRow, CheckRow};
use super::GpuError;
use crate::cloud::{Cloud, Header, PointCloud2, PointLayout};
use crate::ops::voxel::{DynamicVoxels, Downsampled, HardVoxelParams, HardVoxels, PillarFeatures, VoxelGrid};
use crate::ops::Validate;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use std::path::Path;
use std::sync::Arc;

/// Output channels at most (x, y, z + 13 others); `VOX_MAX_CHANNELS` in cuda/voxel.cu.
pub const MAX_CHANNELS: usize = 16;

const CTR_VOXELS: usize = 1;
const CTR_OUT_OF_RANGE: usize = 2;
const CTR_VOXEL_CAP: usize = 3;
const CTR_POINT_CAP: usize = 4;
const CTR_WORDS: usize = 8;

const FLAG_RAW: u32 = 1;
const FLAG_PILLAR: u32 = 2;
const FLAG_RANGE: u32 = 4;

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

/// LSD radix passes (shift, bits) covering keys `0..=key_max`, at most 8 bits each, fewest passes.
pub(crate) fn radix_plan(key_max: u32) -> Vec<(u32, u32)> {
    let total = (32 - key_max.leading_zeros()).max(1);
    let passes = total.div_ceil(8);
    let per = total.div_ceil(passes);
    (0..passes).map(|p| (p * per, per.min(total - p * per))).collect()
}

/// Builds the kernel parameters (validated inputs). `max_voxels = None`: dynamic (no cap).
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
    let h = hash_size(distinct, load_factor);
    let mut ch = [0u32; MAX_CHANNELS];
    ch[0] = 0;
    ch[1] = 1;
    ch[2] = 2;
    for (k, &c) in channels.iter().enumerate() {
        ch[3 + k] = c as u32;
    }
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
        flags: 0,
        pad_: 0,
        ch,
    };
    (p, h)
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
    f_point_key: CudaFunction,
    f_hist: CudaFunction,
    f_rowscan: CudaFunction,
    f_scatter: CudaFunction,
    f_segments: CudaFunction,
    f_fill: CudaFunction,
    f_means: CudaFunction,
    f_pillar: CudaFunction,
    table_keys: Grow<u64>,
    table_first: Grow<u32>,
    table_vid: Grow<u32>,
    pslot: Grow<i32>,
    tile_status: Grow<u64>,
    counters: Grow<u32>,
    keys: [Grow<u32>; 2],
    vals: [Grow<u32>; 2],
    hist: Grow<u32>,
    totals: Grow<u32>,
    seg_start: Grow<u32>,
    seg_end: Grow<u32>,
    /// `[V, 3]` voxel coordinates `[z, y, x]`.
    pub coords: Grow<i32>,
    /// `[V]` points per voxel.
    pub num_points: Grow<u32>,
    /// Hard: `[V, P, C]` features; dynamic: `[V, C]` means.
    pub features: Grow<f32>,
    /// `[V, P, 9 or 10]` pillar features.
    pub pillar: Grow<f32>,
    /// Dynamic: `[N]` voxel of each point; `[N, 3]` coordinates.
    pub point_voxel: Grow<i32>,
    pub point_coords: Grow<i32>,
    last: LastOp,
    last_params: VoxParams,
    sorted_slot: usize,
}

fn cfg(blocks: usize, block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks.max(1) as u32, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

impl GpuVoxelizer {
    pub fn new(ctx: &GpuContext) -> Result<Self, GpuError> {
        let s = &ctx.stream;
        let f = |n: &str| ctx.function("voxel", n);
        Ok(Self {
            f_insert: f("vox_hash_insert")?,
            f_rank: f("vox_rank")?,
            f_point_key: f("vox_point_key")?,
            f_hist: f("vox_radix_hist")?,
            f_rowscan: f("vox_radix_rowscan")?,
            f_scatter: f("vox_radix_scatter")?,
            f_segments: f("vox_segments")?,
            f_fill: f("vox_hard_fill")?,
            f_means: f("vox_dyn_means")?,
            f_pillar: f("vox_pillar")?,
            table_keys: Grow::new(s, 0)?,
            table_first: Grow::new(s, 0)?,
            table_vid: Grow::new(s, 0)?,
            pslot: Grow::new(s, 0)?,
            tile_status: Grow::new(s, 0)?,
            counters: Grow::new(s, CTR_WORDS)?,
            keys: [Grow::new(s, 0)?, Grow::new(s, 0)?],
            vals: [Grow::new(s, 0)?, Grow::new(s, 0)?],
            hist: Grow::new(s, 0)?,
            totals: Grow::new(s, 256)?,
            seg_start: Grow::new(s, 0)?,
            seg_end: Grow::new(s, 0)?,
            coords: Grow::new(s, 0)?,
            num_points: Grow::new(s, 0)?,
            features: Grow::new(s, 0)?,
            pillar: Grow::new(s, 0)?,
            point_voxel: Grow::new(s, 0)?,
            point_coords: Grow::new(s, 0)?,
            last: LastOp::None,
            last_params: VoxParams::default(),
            sorted_slot: 0,
        })
    }

    pub fn last(&self) -> LastOp {
        self.last
    }

    fn check_channels(cloud: &DeviceCloud, channels: &[usize]) -> Result<(), GpuError> {
        if 3 + channels.len() > MAX_CHANNELS {
            return Err(GpuError::Unsupported(format!("{} extra channels: at most {}", channels.len(), MAX_CHANNELS - 3)));
        }
        if let Some(&c) = channels.iter().find(|&&c| c >= cloud.num_channels()) {
            return Err(GpuError::Unsupported(format!("channel index {c} of a cloud with {} channels", cloud.num_channels())));
        }
        if cloud.capacity > u32::MAX as usize || cloud.len >= (u32::MAX - (1 << 20)) as usize {
            return Err(GpuError::Unsupported("cloud too large for 32-bit point indices".into()));
        }
        Ok(())
    }

    /// Steps 1-5 (keys, hash, ranks, sort, segments). Returns the params.
    fn enqueue_core(
        &mut self,
        ctx: &GpuContext,
        cloud: &DeviceCloud,
        channels: &[usize],
        grid: &VoxelGrid,
        max_voxels: Option<u32>,
        max_points: u32,
        point_outputs: bool,
    ) -> Result<VoxParams, GpuError> {
        grid.validate().map_err(|e| GpuError::Unsupported(e.to_string()))?;
        Self::check_channels(cloud, channels)?;
        let s = &ctx.stream;
        let n = cloud.len;
        let block = ctx.profile.block_size.voxel;
        let tile = block as usize * ctx.profile.items_per_thread.voxel as usize;
        let (p, h) = make_params(grid, n, cloud.capacity, channels, max_voxels, max_points, ctx.profile.hash_load_factor);
        let km = p.key_max as usize;
        let counters = self.counters.ensure(s, CTR_WORDS)?;
        s.memset_zeros(&mut counters.slice_mut(..CTR_WORDS))?;
        if n == 0 {
            return Ok(p);
        }
        let tiles = n.div_ceil(tile);
        let blocks = n.div_ceil(block as usize);
        let keys_t = self.table_keys.ensure(s, h)?;
        s.memset_zeros(&mut keys_t.slice_mut(..h))?;
        let first_t = self.table_first.ensure(s, h)?;
        s.memset_zeros(&mut first_t.slice_mut(..h))?;
        let vid_t = self.table_vid.ensure(s, h)?;
        let pslot = self.pslot.ensure(s, n)?;
        let status = self.tile_status.ensure(s, tiles)?;
        s.memset_zeros(&mut status.slice_mut(..tiles))?;
        let coords = self.coords.ensure(s, 3 * km.max(1))?;
        let null: u64 = 0;

        {
            let mut l = s.launch_builder(&self.f_insert);
            l.arg(cloud.slice()).arg(&mut *keys_t).arg(&mut *first_t).arg(&mut *pslot).arg(&p);
            // SAFETY: argument order/types match vox_hash_insert; table has h entries, pslot n.
            unsafe { l.launch(cfg(blocks, block)) }?;
        }
        {
            let mut l = s.launch_builder(&self.f_rank);
            l.arg(&*pslot).arg(&*keys_t).arg(&*first_t).arg(&mut *vid_t).arg(&mut *coords).arg(&mut *status).arg(&mut *counters).arg(&p);
            // SAFETY: matches vox_rank; coords holds 3 * key_max ints (ranks written only below min(max_voxels, distinct) <= key_max).
            unsafe { l.launch(cfg(tiles, block)) }?;
        }
        let [ka, kb] = &mut self.keys;
        let [va, vb] = &mut self.vals;
        let ka = ka.ensure(s, n)?;
        let kb = kb.ensure(s, n)?;
        let va = va.ensure(s, n)?;
        let vb = vb.ensure(s, n)?;
        {
            let mut l = s.launch_builder(&self.f_point_key);
            l.arg(&*pslot).arg(&*vid_t).arg(&*coords).arg(&mut *ka).arg(&mut *counters);
            let (pv, pc);
            if point_outputs {
                pv = self.point_voxel.ensure(s, n)?;
                pc = self.point_coords.ensure(s, 3 * n)?;
                l.arg(&mut *pv).arg(&mut *pc);
            } else {
                l.arg(&null).arg(&null);
            }
            l.arg(&p);
            // SAFETY: matches vox_point_key; keys n, point outputs n and 3n or null.
            unsafe { l.launch(cfg(blocks, block)) }?;
        }
        // Radix sort: keys ka -> ..., values identity first.
        let plan = radix_plan(p.key_max);
        let hist = self.hist.ensure(s, 256 * tiles)?;
        let totals = self.totals.ensure(s, 256)?;
        let n32 = n as u32;
        let tiles32 = tiles as u32;
        for (pass, &(shift, bits)) in plan.iter().enumerate() {
            let (kin, kout, vin, vout) = if pass % 2 == 0 { (&*ka, &mut *kb, &*va, &mut *vb) } else { (&*kb, &mut *ka, &*vb, &mut *va) };
            {
                let mut l = s.launch_builder(&self.f_hist);
                l.arg(kin).arg(&mut *hist).arg(&n32).arg(&shift).arg(&bits);
                // SAFETY: matches vox_radix_hist; hist has 256 * tiles entries.
                unsafe { l.launch(cfg(tiles, block)) }?;
            }
            {
                let mut l = s.launch_builder(&self.f_rowscan);
                l.arg(&mut *hist).arg(&mut *totals).arg(&tiles32);
                // SAFETY: matches vox_radix_rowscan; one block per digit (1 << bits <= 256).
                unsafe { l.launch(cfg(1usize << bits, block)) }?;
            }
            {
                let mut l = s.launch_builder(&self.f_scatter);
                l.arg(kin);
                if pass == 0 {
                    l.arg(&null);
                } else {
                    l.arg(vin);
                }
                l.arg(kout).arg(vout).arg(&*hist).arg(&*totals).arg(&n32).arg(&shift).arg(&bits);
                // SAFETY: matches vox_radix_scatter; all arrays hold n elements.
                unsafe { l.launch(cfg(tiles, block)) }?;
            }
        }
        self.sorted_slot = plan.len() % 2;
        let sorted_keys = if self.sorted_slot == 1 { &*kb } else { &*ka };
        let seg_start = self.seg_start.ensure(s, km.max(1))?;
        let seg_end = self.seg_end.ensure(s, km.max(1))?;
        {
            let mut l = s.launch_builder(&self.f_segments);
            l.arg(sorted_keys).arg(&mut *seg_start).arg(&mut *seg_end).arg(&p);
            // SAFETY: matches vox_segments; segments hold key_max entries (kept keys < key_max).
            unsafe { l.launch(cfg(blocks, block)) }?;
        }
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
        params.validate().map_err(|e| GpuError::Unsupported(e.to_string()))?;
        if pillar.is_some() && channels.is_empty() {
            return Err(GpuError::Unsupported("pillar features need an intensity channel (channels[0])".into()));
        }
        let mut p = self.enqueue_core(ctx, cloud, channels, &params.grid, Some(params.max_voxels), params.max_points_per_voxel, false)?;
        let pc = match pillar {
            Some(true) => 10,
            Some(false) => 9,
            None => 0,
        };
        p.flags = if raw { FLAG_RAW } else { 0 }
            | if pillar.is_some() { FLAG_PILLAR } else { 0 }
            | if pillar == Some(true) { FLAG_RANGE } else { 0 };
        let pp = params.max_points_per_voxel as usize;
        let km = p.key_max as usize;
        self.last = LastOp::Hard { max_points: pp, num_channels: p.num_ch as usize, pillar_channels: pc, max_voxels: params.max_voxels };
        self.last_params = p;
        let s = &ctx.stream;
        let np = self.num_points.ensure(s, km.max(1))?;
        let feats = self.features.ensure(s, if raw { km * pp * p.num_ch as usize } else { 1 }.max(1))?;
        let pil = self.pillar.ensure(s, (km * pp * pc).max(1))?;
        let _ = self.coords.ensure(s, 3 * km.max(1))?;
        if cloud.len == 0 {
            return Ok(());
        }
        let [va, vb] = &self.vals;
        let vals = if self.sorted_slot == 1 { b_slice(vb) } else { b_slice(va) };
        let mut l = s.launch_builder(&self.f_fill);
        l.arg(cloud.slice())
            .arg(vals)
            .arg(b_slice(&self.seg_start))
            .arg(b_slice(&self.seg_end))
            .arg(b_slice(&self.coords))
            .arg(b_slice_mut(&mut self.counters))
            .arg(&mut *np)
            .arg(&mut *feats)
            .arg(&mut *pil)
            .arg(&p);
        // SAFETY: matches vox_hard_fill; outputs sized for key_max voxels (>= kept voxels).
        unsafe { l.launch(cfg(Self::fill_blocks(ctx, km * pp), ctx.profile.block_size.voxel)) }?;
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
        let s = &ctx.stream;
        let pil = self.pillar.ensure(s, (km * max_points * oc).max(1))?;
        if p.n == 0 {
            return Ok(());
        }
        let mut l = s.launch_builder(&self.f_pillar);
        l.arg(b_slice(&self.features))
            .arg(b_slice(&self.num_points))
            .arg(b_slice(&self.coords))
            .arg(b_slice(&self.counters))
            .arg(&mut *pil)
            .arg(&p);
        // SAFETY: matches vox_pillar; buffers sized by hard_device for key_max voxels.
        unsafe { l.launch(cfg(Self::fill_blocks(ctx, km * max_points), ctx.profile.block_size.voxel)) }?;
        Ok(())
    }

    /// Dynamic voxelization with means, results left on the device.
    pub fn dynamic_device(&mut self, ctx: &GpuContext, cloud: &DeviceCloud, channels: &[usize], grid: &VoxelGrid) -> Result<(), GpuError> {
        let p = self.enqueue_core(ctx, cloud, channels, grid, None, 1, true)?;
        self.last = LastOp::Dynamic { points: cloud.len, num_channels: p.num_ch as usize };
        self.last_params = p;
        let km = p.key_max as usize;
        let c = p.num_ch as usize;
        let s = &ctx.stream;
        let np = self.num_points.ensure(s, km.max(1))?;
        let means = self.features.ensure(s, (km * c).max(1))?;
        if cloud.len == 0 {
            return Ok(());
        }
        let [va, vb] = &self.vals;
        let vals = if self.sorted_slot == 1 { b_slice(vb) } else { b_slice(va) };
        let mut l = s.launch_builder(&self.f_means);
        l.arg(cloud.slice())
            .arg(vals)
            .arg(b_slice(&self.seg_start))
            .arg(b_slice(&self.seg_end))
            .arg(b_slice(&self.counters))
            .arg(&mut *np)
            .arg(&mut *means)
            .arg(&p);
        // SAFETY: matches vox_dyn_means; outputs sized for key_max voxels.
        unsafe { l.launch(cfg(Self::fill_blocks(ctx, km * c), ctx.profile.block_size.voxel)) }?;
        Ok(())
    }

    fn counters_host(&self, ctx: &GpuContext) -> Result<Vec<u32>, GpuError> {
        Ok(ctx.stream.clone_dtoh(&b_slice(&self.counters).slice(..CTR_WORDS))?)
    }

    /// Copies the last hard result back (waits for the stream).
    pub fn hard_to_host(&self, ctx: &GpuContext) -> Result<(HardVoxels, Option<PillarFeatures>), GpuError> {
        let LastOp::Hard { max_points, num_channels, pillar_channels, max_voxels } = self.last else {
            return Err(GpuError::Unsupported("no hard voxels on the device".into()));
        };
        let ctr = self.counters_host(ctx)?;
        let v = (ctr[CTR_VOXELS]).min(max_voxels) as usize;
        let s = &ctx.stream;
        let dl_i32 = |b: &Grow<i32>, len: usize| -> Result<Vec<i32>, GpuError> {
            if len == 0 { Ok(Vec::new()) } else { Ok(s.clone_dtoh(&b_slice(b).slice(..len))?) }
        };
        let dl_f32 = |b: &Grow<f32>, len: usize| -> Result<Vec<f32>, GpuError> {
            if len == 0 { Ok(Vec::new()) } else { Ok(s.clone_dtoh(&b_slice(b).slice(..len))?) }
        };
        let coords = dl_i32(&self.coords, 3 * v)?;
        let num_points: Vec<u32> = if v == 0 { Vec::new() } else { s.clone_dtoh(&b_slice(&self.num_points).slice(..v))? };
        let raw = self.last_params.flags & FLAG_RAW != 0 || self.last_params.flags & FLAG_PILLAR == 0;
        let features = if raw { dl_f32(&self.features, v * max_points * num_channels)? } else { Vec::new() };
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
                features: dl_f32(&self.pillar, v * max_points * pillar_channels)?,
                num_channels: pillar_channels,
                max_points,
            })
        } else {
            None
        };
        Ok((hv, pf))
    }

    /// Copies the last dynamic result back (waits for the stream).
    pub fn dynamic_to_host(&self, ctx: &GpuContext) -> Result<DynamicVoxels, GpuError> {
        let LastOp::Dynamic { points, num_channels } = self.last else {
            return Err(GpuError::Unsupported("no dynamic voxels on the device".into()));
        };
        let ctr = self.counters_host(ctx)?;
        let v = ctr[CTR_VOXELS] as usize;
        let s = &ctx.stream;
        let dl = |b: &Grow<i32>, len: usize| -> Result<Vec<i32>, GpuError> {
            if len == 0 { Ok(Vec::new()) } else { Ok(s.clone_dtoh(&b_slice(b).slice(..len))?) }
        };
        let pc = dl(&self.point_coords, 3 * points)?;
        let vc = dl(&self.coords, 3 * v)?;
        let tri = |x: Vec<i32>| x.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect::<Vec<_>>();
        Ok(DynamicVoxels {
            point_coords: tri(pc),
            point_voxel: dl(&self.point_voxel, points)?,
            voxel_coords: tri(vc),
            num_points: if v == 0 { Vec::new() } else { s.clone_dtoh(&b_slice(&self.num_points).slice(..v))? },
            means: if v == 0 { Vec::new() } else { s.clone_dtoh(&b_slice(&self.features).slice(..v * num_channels))? },
            num_channels,
            dropped_out_of_range: ctr[CTR_OUT_OF_RANGE] as usize,
        })
    }
}

fn b_slice<T>(b: &Grow<T>) -> &CudaSlice<T> {
    b.buf.as_ref().expect("voxel buffer used before `ensure`")
}

fn b_slice_mut<T>(b: &mut Grow<T>) -> &mut CudaSlice<T> {
    b.buf.as_mut().expect("voxel buffer used before `ensure`")
}

/// A grow-only device buffer (like [`super::GrowBuffer`], with shared access to the allocation).
pub struct Grow<T> {
    buf: Option<CudaSlice<T>>,
    growths: u64,
}

impl<T: DeviceRepr + ValidAsZeroBits> Grow<T> {
    fn new(stream: &Arc<CudaStream>, initial: usize) -> Result<Self, GpuError> {
        let buf = if initial > 0 { Some(stream.alloc_zeros::<T>(initial)?) } else { None };
        Ok(Self { buf, growths: 0 })
    }

    fn ensure(&mut self, stream: &Arc<CudaStream>, len: usize) -> Result<&mut CudaSlice<T>, GpuError> {
        let cap = self.buf.as_ref().map_or(0, |b| b.len());
        if cap < len.max(1) {
            let new_len = len.max(1).max(cap + cap / 2);
            self.buf = None;
            self.buf = Some(stream.alloc_zeros::<T>(new_len)?);
            self.growths += 1;
        }
        Ok(self.buf.as_mut().unwrap())
    }

    /// The current allocation (None before the first use).
    pub fn slice(&self) -> Option<&CudaSlice<T>> {
        self.buf.as_ref()
    }

    pub fn growths(&self) -> u64 {
        self.growths
    }
}

// ---------------------------------------------------------------------------------------------
// One-shot host-facing wrappers (a fresh voxelizer each call; keep a GpuVoxelizer for streams).
// ---------------------------------------------------------------------------------------------

/// [`crate::ops::voxel::voxelize_hard`] on the device cloud (channels x, y, z + `channels`).
pub fn voxelize_hard(ctx: &GpuContext, cloud: &DeviceCloud, channels: &[usize], params: &HardVoxelParams) -> Result<HardVoxels, GpuError> {
    let mut v = GpuVoxelizer::new(ctx)?;
    v.hard_device(ctx, cloud, channels, params, true, None)?;
    Ok(v.hard_to_host(ctx)?.0)
}

/// [`crate::ops::voxel::voxelize_dynamic`] on the device cloud.
pub fn voxelize_dynamic(ctx: &GpuContext, cloud: &DeviceCloud, channels: &[usize], grid: &VoxelGrid) -> Result<DynamicVoxels, GpuError> {
    let mut v = GpuVoxelizer::new(ctx)?;
    v.dynamic_device(ctx, cloud, channels, grid)?;
    v.dynamic_to_host(ctx)
}

/// Builds the downsampled cloud from dynamic voxels (channel names: x, y, z + the chosen ones).
pub fn downsampled_from(dv: &DynamicVoxels, names: &[String]) -> Downsampled {
    let c = dv.num_channels;
    let column = |k: usize| -> Vec<f32> { dv.means.iter().skip(k).step_by(c).copied().collect() };
    let mut out = Cloud::from_xyz(column(0), column(1), column(2));
    for (k, name) in names.iter().enumerate().skip(3).take(c - 3) {
        out = out.with_channel(name, column(k));
    }
    Downsampled { cloud: out, dropped_out_of_range: dv.dropped_out_of_range }
}

/// [`crate::ops::voxel::voxel_grid_downsample`] on the device cloud.
pub fn voxel_grid_downsample(ctx: &GpuContext, cloud: &DeviceCloud, channels: &[usize], grid: &VoxelGrid) -> Result<Downsampled, GpuError> {
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

/// Deterministic SplitMix64 generator for the random check clouds.
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed ^ 0x5851_F42D_4C95_7F2D)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub(crate) fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
}

fn random_cloud(rng: &mut SplitMix, n: usize) -> Cloud {
    let mut c = [Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n)];
    for _ in 0..n {
        c[0].push(rng.uniform(-60.0, 60.0));
        c[1].push(rng.uniform(-60.0, 60.0));
        c[2].push(rng.uniform(-6.0, 6.0));
        c[3].push(rng.uniform(0.0, 255.0));
    }
    let [x, y, z, i] = c;
    Cloud::from_xyz(x, y, z).with_channel("intensity", i)
}

/// Check clouds drawn from `seed`: (name, cloud with x, y, z, intensity). NaN points included in
/// "nan" (the gather drops them on both sides).
pub(crate) fn check_clouds(seed: u64, big: bool) -> Vec<(String, Cloud)> {
    let mut rng = SplitMix::new(seed);
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
        (0..n).map(|_| rng.uniform(0.01, 0.09)).collect(),
        (0..n).map(|_| rng.uniform(0.01, 0.09)).collect(),
        (0..n).map(|_| rng.uniform(0.01, 0.19)).collect(),
    )
    .with_channel("intensity", (0..n).map(|k| k as f32).collect());
    out.push(("one voxel 20k".to_string(), one));
    // Duplicates: 500 distinct points, each 40 times, interleaved.
    let base = random_cloud(&mut rng, 500);
    let idx: Vec<usize> = (0..20_000).map(|k| (k * 7919) % 500).collect();
    out.push(("duplicates 500x40".to_string(), base.select(&idx)));
    // Borders: exact voxel and range borders of both W1 grids (multiples of 0.16, 0.1, 0.2, and the
    // range ends), every combination of a few.
    let xs: Vec<f32> = (0..=640).map(|k| -51.2 + 0.16 * k as f32).chain([-51.2, 51.2, 51.199997, -51.200001, 0.0, -0.0]).collect();
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
    out.push(("borders".to_string(), Cloud::from_xyz(bx, by, bz).with_channel("intensity", (0..nb).map(|k| k as f32).collect())));
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
        let d = if x.is_finite() && y.is_finite() { (x - y).abs() / x.abs().max(y.abs()).max(f64::MIN_POSITIVE) } else { f64::INFINITY };
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
        g.dropped_out_of_range, g.dropped_point_capacity, g.dropped_voxel_capacity,
        c.dropped_out_of_range, c.dropped_point_capacity, c.dropped_voxel_capacity
    )
}

/// Compares every GPU voxel operator with the CPU reference on the real Ouster scans
/// (`ouster_dir/*.bin`) and on clouds drawn from `seed`, for the W1 pillars and voxels configs;
/// each GPU op runs twice (outputs must be identical).
pub fn check(ctx: &GpuContext, seed: u64, ouster_dir: &Path) -> Result<Vec<CheckRow>, GpuError> {
    use crate::ops::voxel as cpu;
    let mut cases: Vec<(String, Cloud, Vec<usize>)> = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(ouster_dir)
        .map_err(|e| GpuError::Unsupported(format!("{}: {e}", ouster_dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    files.sort();
    for (k, f) in files.iter().enumerate() {
        let scan = crate::bag::sample::load_ouster_bin(f).map_err(|e| GpuError::Unsupported(format!("{}: {e}", f.display())))?;
        // Channel 3 = reflectivity as the intensity; the first scan also carries ring and t.
        let chans = if k == 0 { vec![3, 4, 5] } else { vec![3] };
        cases.push((format!("ouster {}", f.file_name().unwrap().to_string_lossy()), scan, chans));
    }
    for (name, cloud) in check_clouds(seed, true) {
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
            vox.hard_device(ctx, &dev, chans, params, true, Some(true))?;
            let (g2, pf2) = vox.hard_to_host(ctx)?;
            let ints = hard_same(&g1, &exp);
            let rel = if bits_eq(&g1.features, &exp.features) { 0.0 } else { max_rel(&g1.features, &exp.features).max(1e-300) };
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
                        g1.voxel_count(), g1.kept_points(), g1.dropped_out_of_range, g1.dropped_point_capacity, g1.dropped_voxel_capacity
                    )
                } else {
                    first_hard_diff(&g1, &exp)
                },
            });
            let pf1 = pf1.unwrap();
            let pf2 = pf2.unwrap();
            for with_range in [true, false] {
                let pexp = cpu::pillar_features(&exp, &params.grid, with_range).map_err(|e| GpuError::Unsupported(e.to_string()))?;
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
                    max_rel_err: if same { 0.0 } else { max_rel(&fused.features, &pexp.features).max(max_rel(&standalone.features, &pexp.features)).max(1e-300) },
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
                detail: format!("V={} oor={} means bit-identical: {}", d1.voxel_count(), d1.dropped_out_of_range, bits_eq(&d1.means, &dexp.means)),
            });
            let ds_exp = cpu::voxel_grid_downsample(&proj, &params.grid);
            let ds = voxel_grid_downsample(ctx, &dev, chans, &params.grid)?;
            let ds2 = voxel_grid_downsample(ctx, &dev, chans, &params.grid)?;
            let cols_rel = ds.cloud.columns().iter().zip(ds_exp.cloud.columns()).map(|(a, b)| max_rel(a, b)).fold(0.0, f64::max);
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

fn median_ms(timer: &mut StageTimer, runs: usize, mut f: impl FnMut() -> Result<(), GpuError>) -> Result<f64, GpuError> {
    for _ in 0..10 {
        f()?;
    }
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        timer.start()?;
        f()?;
        timer.stage("op")?;
        t.push(timer.finish()?[0].1 as f64);
    }
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(t[runs / 2])
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
            let ms = median_ms(&mut timer, RUNS, || vox.hard_device(ctx, &dev, &ch, &params, true, None))?;
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
                note: format!("V={} kept={}", h.voxel_count(), h.kept_points()),
            });
            if cfg_name == "pillars" {
                let ms = median_ms(&mut timer, RUNS, || vox.hard_device(ctx, &dev, &ch, &params, true, Some(false)))?;
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
                    note: format!("V={} raw + 9-channel features", h.voxel_count()),
                });
            }
            let ms = median_ms(&mut timer, RUNS, || vox.dynamic_device(ctx, &dev, &ch, &params.grid))?;
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
                note: format!("V={}", d.voxel_count()),
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
        let (vp, h) = make_params(&p.grid, 107_647, 262_144, &[3, 5], Some(60000), 32, 0.5);
        assert_eq!(vp.key_max, 60000);
        assert_eq!(vp.num_ch, 5);
        assert_eq!(&vp.ch[..5], &[0, 1, 2, 3, 5]);
        assert_eq!(h, 262_144);
        assert_eq!(vp.hash_mask as usize, h - 1);
        assert_eq!(vp.hash_shift, 64 - 18);
        // Dynamic: bounded by the cells of the grid (640 * 640) and by N.
        let (vp, _) = make_params(&p.grid, 1_700_481, 1_700_481, &[], None, 1, 0.5);
        assert_eq!(vp.key_max, 409_600);
        assert_eq!(vp.max_voxels, u32::MAX);
        let (vp, _) = make_params(&p.grid, 10, 10, &[], None, 1, 0.5);
        assert_eq!(vp.key_max, 10);
        assert_eq!(std::mem::size_of::<VoxParams>(), 4 * (3 * 4 + 10 + MAX_CHANNELS));
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
        let rep = super::super::nvrtc::nvrtc_check_with(std::slice::from_ref(k), &profiles, &super::super::nvrtc::CHECK_ARCHS).unwrap();
        println!("{rep}");
        assert!(rep.all_ok(), "{rep}");
    }
}
