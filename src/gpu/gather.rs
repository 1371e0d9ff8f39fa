//! The data path's first stage: a PointCloud2 blob is copied once into a pinned staging slot,
//! uploaded asynchronously, and one kernel (`cuda/gather.cu`) converts every single-element field to
//! float32 device columns and drops the points whose x, y or z is not finite, keeping input order.
//! The result equals the CPU reference [`crate::cloud::gather`] bit for bit. The uploaded records
//! and each point's record index stay with the device cloud, for outputs that carry the input's
//! own values (`downsampled`).

use super::buffer::{memory_pools_supported, DevBuf};
use super::context::{GpuContext, PinnedRing, PooledSlice, StageTimer};
use super::profile::KernelProfile;
use super::GpuError;
use crate::cloud::{Cloud, CloudView};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use std::sync::{Arc, Mutex};

/// Channels the kernel can gather at once (`LK_MAX_CHANNELS` in cuda/common.cuh).
pub const MAX_CHANNELS: usize = 32;

/// The message's record layout and the gather's sizes, passed by value. Must match
/// `struct GatherParams` in cuda/common.cuh.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct GatherParams {
    pub(crate) num_channels: u32,
    pub(crate) point_step: u32,
    pub(crate) row_step: u32,
    pub(crate) width: u32,
    n: u32,
    capacity: u32,
    big_endian: u32,
    pad_: u32,
    offset: [u32; MAX_CHANNELS],
    datatype: [u32; MAX_CHANNELS],
}

// SAFETY: repr(C), plain u32 fields, no padding; layout matches the CUDA struct.
unsafe impl DeviceRepr for GatherParams {}
// Same size as the CUDA struct (`static_assert` in cuda/common.cuh).
const _: () = assert!(std::mem::size_of::<GatherParams>() == 288);

/// Per-context device scratch of the gather stage (grow-only). Raw buffers: they are used on the
/// context's stream only, so they need none of cudarc's cross-stream event tracking (an event
/// recorded and waited for per argument, tens of microseconds per frame).
pub(crate) struct GatherScratch {
    tile_status: DevBuf<u64>,
    /// [tile counter, surviving point count]
    counters: DevBuf<u32>,
}

impl GatherScratch {
    pub(crate) fn new(stream: &Arc<CudaStream>, profile: &KernelProfile) -> Result<Self, GpuError> {
        let pools = memory_pools_supported(stream)?;
        let (mut tile_status, mut counters) = (DevBuf::new(stream, pools), DevBuf::new(stream, pools));
        tile_status.ensure(profile.pools.points.div_ceil(profile.gather_tile()))?;
        counters.ensure(2)?;
        Ok(Self { tile_status, counters })
    }

    pub(crate) fn growths(&self) -> u64 {
        self.tile_status.growths() + self.counters.growths()
    }
}

/// A gathered cloud on the device: `names.len()` float32 columns of `capacity` elements each
/// (column-major: channel `c` starts at element `c * capacity`), the first `len` valid.
/// Channels 0, 1, 2 are x, y, z. The buffer returns to the context's pool when this drops.
pub struct DeviceCloud {
    pub len: usize,
    pub capacity: usize,
    pub names: Vec<String>,
    pub data: PooledSlice<f32>,
    /// Points dropped because x, y or z was NaN or infinite.
    pub dropped_non_finite: usize,
    /// The message's records as uploaded, their layout, and for each of the `len` points the
    /// index of its record.
    pub(crate) records: PooledSlice<u8>,
    pub(crate) layout: GatherParams,
    pub(crate) source: PooledSlice<u32>,
    stream: Arc<CudaStream>,
    readback: Arc<Mutex<PinnedRing<f32>>>,
}

impl std::fmt::Debug for DeviceCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCloud")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .field("names", &self.names)
            .field("dropped_non_finite", &self.dropped_non_finite)
            .finish()
    }
}

impl DeviceCloud {
    pub fn num_channels(&self) -> usize {
        self.names.len()
    }

    /// The device column buffer (all channels, `capacity` stride).
    pub fn slice(&self) -> &CudaSlice<f32> {
        &self.data
    }

    /// The `len` valid values of channel `c`.
    pub fn column(&self, c: usize) -> CudaView<'_, f32> {
        assert!(c < self.names.len(), "channel {c} of {}", self.names.len());
        self.data.slice(c * self.capacity..c * self.capacity + self.len)
    }

    /// The channel named `name`.
    pub fn channel(&self, name: &str) -> Option<CudaView<'_, f32>> {
        self.names.iter().position(|n| n == name).map(|c| self.column(c))
    }

    /// Copies the cloud back (through the context's pinned read-back ring).
    pub fn to_host(&self) -> Result<Cloud, GpuError> {
        let mut ring = self.readback.lock().unwrap();
        let mut columns = Vec::with_capacity(self.names.len());
        for c in 0..self.names.len() {
            columns.push(ring.download(&self.stream, &self.data, c * self.capacity, self.len, |v| v.to_vec())?);
        }
        let mut it = columns.into_iter();
        let mut cloud = Cloud::from_xyz(it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        for (name, values) in self.names[3..].iter().zip(it) {
            cloud = cloud.with_channel(name, values);
        }
        Ok(cloud)
    }
}

/// Uploads `msg` and gathers it on the device (see the module docs).
pub fn upload_and_gather(ctx: &GpuContext, view: &CloudView<'_>) -> Result<DeviceCloud, GpuError> {
    upload_and_gather_timed(ctx, view, None)
}

/// [`upload_and_gather`], recording the stages `h2d` and `gather` on `timer` when given.
/// `h2d` spans the host copy into the pinned slot (the stream is idle meanwhile) and the DMA.
pub fn upload_and_gather_timed(
    ctx: &GpuContext,
    view: &CloudView<'_>,
    mut timer: Option<&mut StageTimer>,
) -> Result<DeviceCloud, GpuError> {
    let (msg, layout) = (&view.msg, &view.layout);
    let fields = layout.channels();
    if fields.len() > MAX_CHANNELS {
        return Err(GpuError::TooLarge {
            what: "PointCloud2 single-element fields (gather kernel channels)",
            value: fields.len() as u64,
            limit: MAX_CHANNELS as u64,
        });
    }
    let n64 = msg.num_points();
    // The kernel indexes points and tiles with 32-bit values (n + one tile must not wrap).
    if n64 > (u32::MAX - (1 << 20)) as u64 {
        return Err(GpuError::TooLarge {
            what: "PointCloud2 points per cloud (32-bit gather indexing: 2^32 - 2^20)",
            value: n64,
            limit: (u32::MAX - (1 << 20)) as u64,
        });
    }
    let n = n64 as usize;
    let used_bytes = if n == 0 {
        0
    } else {
        (msg.height as usize - 1) * msg.row_step as usize + msg.width as usize * msg.point_step as usize
    };
    let names: Vec<String> = fields.iter().map(|f| f.name.clone()).collect();
    let c = names.len();

    let mut params = GatherParams {
        num_channels: c as u32,
        point_step: msg.point_step,
        row_step: msg.row_step,
        width: msg.width,
        n: n as u32,
        capacity: 0,
        big_endian: msg.is_bigendian as u32,
        pad_: 0,
        offset: [0; MAX_CHANNELS],
        datatype: [0; MAX_CHANNELS],
    };
    for (i, f) in fields.iter().enumerate() {
        params.offset[i] = f.offset;
        params.datatype[i] = f.datatype as u32;
    }

    let stream = &ctx.stream;
    let mut out = ctx.cloud_pool.take(c * n.max(1))?;
    let capacity = out.len() / c;
    if capacity > u32::MAX as usize {
        return Err(GpuError::TooLarge {
            what: "device column capacity in points (32-bit)",
            value: capacity as u64,
            limit: u32::MAX as u64,
        });
    }
    params.capacity = capacity as u32;

    if let Some(t) = timer.as_deref_mut() {
        t.start()?;
    }
    let mut scratch = ctx.gather_scratch.lock().unwrap();
    let GatherScratch { tile_status, counters } = &mut *scratch;
    let mut records = ctx.record_pool.take(used_bytes.max(1))?;
    let mut source = ctx.index_pool.take(n.max(1))?;
    ctx.upload_ring.lock().unwrap().upload(stream, &msg.data[..used_bytes], &mut records)?;
    if let Some(t) = timer.as_deref_mut() {
        t.stage("h2d")?;
    }

    let len = if n == 0 {
        0
    } else {
        let tile = ctx.profile.gather_tile();
        let tiles = n.div_ceil(tile);
        let status = tile_status.ensure(tiles)?;
        tile_status.zero_all()?;
        let tile_counter = counters.ensure(2)?;
        counters.zero_all()?;
        let out_count = tile_counter + std::mem::size_of::<u32>() as u64;
        let func = ctx.function("gather", "gather_compact")?;
        let cfg = LaunchConfig {
            grid_dim: (tiles as u32, 1, 1),
            block_dim: (ctx.profile.block_size.gather, 1, 1),
            shared_mem_bytes: 0,
        };
        {
            let mut launch = stream.launch_builder(&func);
            launch.arg(&*records);
            launch.arg(&mut *out);
            launch.arg(&mut *source);
            launch.arg(&status);
            launch.arg(&tile_counter);
            launch.arg(&out_count);
            launch.arg(&params);
            // SAFETY: argument types and order match `gather_compact`; every buffer is large
            // enough: records >= used_bytes, out = c * capacity with capacity >= n, source >= n,
            // status >= tiles, counters 2 words.
            unsafe { launch.launch(cfg) }?;
        }
        if let Some(t) = timer.as_deref_mut() {
            t.stage("gather")?;
        }
        counters.to_host(2)?[1] as usize
    };
    if n == 0 {
        if let Some(t) = timer {
            t.stage("gather")?;
        }
    }
    debug_assert!(len <= n);
    Ok(DeviceCloud {
        len,
        capacity,
        names,
        data: out,
        dropped_non_finite: n - len,
        records,
        layout: params,
        source,
        stream: stream.clone(),
        readback: ctx.readback_ring.clone(),
    })
}
