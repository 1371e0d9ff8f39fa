//! The device context: one CUDA context and stream, the compiled kernel modules, the kernel profile,
//! a ring of pinned staging buffers, grow-only device buffers and pools, and CUDA-event stage timing.

use super::kernels::KERNELS;
use super::nvrtc::{self, CubinCache, CubinOrigin};
use super::profile::{KernelProfile, ProfileChoice, TunedFor};
use super::GpuError;
use cudarc::driver::{
    result as drv, sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DevicePtrMut, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How to open a [`GpuContext`].
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// CUDA device ordinal.
    pub ordinal: usize,
    pub profile: ProfileChoice,
    /// Cubin cache folder; `None` uses [`nvrtc::default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Run on a green context of this many SMs (at least; the driver rounds up to its partition
    /// granularity) instead of the whole device: `bench --sms 16` as an Orin-sized proxy.
    pub sm_limit: Option<u32>,
    /// Compile every kernel, read and write no cache.
    pub no_cache: bool,
}

/// How one kernel module was obtained at start-up.
#[derive(Debug, Clone)]
pub struct ModuleLoad {
    pub module: &'static str,
    pub origin: CubinOrigin,
    pub ms: f64,
    pub cubin_bytes: usize,
}

/// A CUDA device ready to run the operators.
pub struct GpuContext {
    pub ctx: Arc<CudaContext>,
    /// The one stream every stage is ordered on.
    pub stream: Arc<CudaStream>,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    pub profile: KernelProfile,
    pub device_name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: i32,
    /// `sm_XY` the kernels were compiled for.
    pub arch: String,
    pub nvrtc_version: (i32, i32),
    pub cache_dir: Option<PathBuf>,
    /// One entry per kernel file: cache hit or compiled, and how long it took.
    pub module_loads: Vec<ModuleLoad>,
    /// Host -> device staging of PointCloud2 blobs.
    pub(crate) upload_ring: Mutex<PinnedRing<u8>>,
    /// Device -> host read-back (plain pinned memory: the CPU reads it).
    pub(crate) readback_ring: Arc<Mutex<PinnedRing<f32>>>,
    pub(crate) gather_scratch: Mutex<super::gather::GatherScratch>,
    /// Point columns of gathered clouds (grow-only, recycled when a [`super::DeviceCloud`] drops),
    /// with their uploaded records and record indices.
    pub cloud_pool: DevicePool<f32>,
    pub(crate) record_pool: DevicePool<u8>,
    pub(crate) index_pool: DevicePool<u32>,
    /// Page-locked bytes of the messages results are copied back into.
    pub output_pool: super::OutputPool,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("device_name", &self.device_name)
            .field("compute_capability", &self.compute_capability)
            .field("sm_count", &self.sm_count)
            .field("arch", &self.arch)
            .field("profile", &self.profile.name)
            .field("nvrtc_version", &self.nvrtc_version)
            .finish()
    }
}

/// Growth counters of every pool, for diagnostics and steady-state checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    pub upload_ring_growths: u64,
    pub readback_ring_growths: u64,
    pub scratch_growths: u64,
    /// The gathered clouds' pools: columns, records and record indices.
    pub cloud_pool_growths: u64,
}

/// A context on `min_sms` (rounded up by the driver) of the device's SMs, and its SM count.
/// The context is never destroyed: a green context's converted context must not be passed to
/// cuCtxDestroy, which is what dropping a non-primary `CudaContext` does, so the process keeps it.
fn green_context(ordinal: usize, min_sms: u32) -> Result<(Arc<CudaContext>, i32), GpuError> {
    // The driver may be newer than the bindings' CUDA version, whose CUdevResource may be smaller
    // than the driver's (CUDA 13 appended a field): room to spare behind each one.
    #[repr(C)]
    struct Resource {
        r: sys::CUdevResource,
        spare: [u8; 256],
    }
    let fail = |what: &str, r: sys::CUresult| {
        GpuError::NoDevice(format!("green context of {min_sms} SMs: {what} failed: {r:?}"))
    };
    let ok = |what: &str, r: sys::CUresult| if r == sys::CUresult::CUDA_SUCCESS { Ok(()) } else { Err(fail(what, r)) };
    // SAFETY: plain driver calls on zeroed, oversized out-structs; the device ordinal was checked
    // by the caller; the converted context is handed to CudaContext and never destroyed (above).
    unsafe {
        let mut dev: sys::CUdevice = 0;
        ok("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal as i32))?;
        let mut all: Resource = std::mem::zeroed();
        ok(
            "cuDeviceGetDevResource",
            sys::cuDeviceGetDevResource(dev, &mut all.r, sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM),
        )?;
        let mut part: Resource = std::mem::zeroed();
        let mut rest: Resource = std::mem::zeroed();
        let mut groups = 1u32;
        ok(
            "cuDevSmResourceSplitByCount",
            sys::cuDevSmResourceSplitByCount(&mut part.r, &mut groups, &all.r, &mut rest.r, 0, min_sms),
        )?;
        if groups < 1 {
            return Err(fail("cuDevSmResourceSplitByCount (no group)", sys::CUresult::CUDA_ERROR_INVALID_VALUE));
        }
        let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
        ok("cuDevResourceGenerateDesc", sys::cuDevResourceGenerateDesc(&mut desc, &mut part.r, 1))?;
        let mut green: sys::CUgreenCtx = std::ptr::null_mut();
        let flags = sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32;
        ok("cuGreenCtxCreate", sys::cuGreenCtxCreate(&mut green, desc, dev, flags))?;
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        ok("cuCtxFromGreenCtx", sys::cuCtxFromGreenCtx(&mut raw, green))?;
        let ctx = CudaContext::from_raw_context(ordinal, dev, raw)?;
        std::mem::forget(ctx.clone());
        Ok((ctx, part.r.__bindgen_anon_1.sm.smCount as i32))
    }
}

impl GpuContext {
    /// Opens the device, picks the profile and loads every kernel module (compiling what the cache
    /// lacks). The caller has checked that the driver and NVRTC libraries exist (see
    /// [`super::select_backend`]); this function errors, never panics, when they do not.
    pub fn new(options: GpuOptions) -> Result<Self, GpuError> {
        // SAFETY: only dlopen attempts.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::DriverMissing);
        }
        if !nvrtc::nvrtc_present() {
            return Err(GpuError::NvrtcMissing);
        }
        let count = CudaContext::device_count()
            .map_err(|e| GpuError::NoDevice(format!("cuInit/cuDeviceGetCount failed: {e}")))?;
        if count <= 0 {
            return Err(GpuError::NoDevice("the driver reports 0 devices".into()));
        }
        if options.ordinal >= count as usize {
            return Err(GpuError::NoDevice(format!("device {} requested, {count} present", options.ordinal)));
        }
        let (ctx, sm_count) = match options.sm_limit {
            None => {
                let ctx = CudaContext::new(options.ordinal)?;
                let sms = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
                (ctx, sms)
            }
            Some(n) => green_context(options.ordinal, n)?,
        };
        let device_name = ctx.name()?;
        let compute_capability = ctx.compute_capability()?;
        let nvrtc_version = nvrtc::nvrtc_version()?;
        let profile =
            options.profile.resolve(&TunedFor::of(&device_name, compute_capability, nvrtc_version), sm_count)?;
        let stream = ctx.new_stream()?;
        let arch = nvrtc::arch_name(compute_capability);
        let cache_dir =
            if options.no_cache { None } else { options.cache_dir.clone().or_else(nvrtc::default_cache_dir) };
        let cache = CubinCache::new(cache_dir.clone());
        let compile_opts = nvrtc::compile_options(&arch, &profile);

        let mut modules = HashMap::new();
        let mut module_loads = Vec::new();
        for k in KERNELS {
            let t = Instant::now();
            let (cubin, origin) = cache.get(k, &arch, nvrtc_version, &compile_opts)?;
            let cubin_bytes = cubin.len();
            let module = ctx.load_module(Ptx::from_binary(cubin))?;
            modules.insert(k.module, module);
            module_loads.push(ModuleLoad {
                module: k.module,
                origin,
                ms: t.elapsed().as_secs_f64() * 1e3,
                cubin_bytes,
            });
        }
        let hits = module_loads.iter().filter(|m| m.origin == CubinOrigin::CacheHit).count();
        tracing::debug!(
            hits,
            compiled = module_loads.len() - hits,
            cache = %cache_dir.as_ref().map(|d| d.display().to_string()).unwrap_or_else(|| "(none)".into()),
            "kernel modules loaded: {}",
            module_loads
                .iter()
                .map(|m| format!("{}={}", m.module, if m.origin == CubinOrigin::CacheHit { "hit" } else { "compiled" }))
                .collect::<Vec<_>>()
                .join(" ")
        );

        let pools = &profile.pools;
        let upload_ring = PinnedRing::new(ctx.clone(), pools.pinned_slots, pools.points * 48)?;
        let readback_ring = PinnedRing::new(ctx.clone(), pools.pinned_slots, 0)?;
        let gather_scratch = super::gather::GatherScratch::new(&stream, &profile)?;
        let cloud_pool = DevicePool::new(stream.clone(), pools.points * 8);
        // 48 bytes/point: the ouster-ros layout, the widest common one.
        let record_pool = DevicePool::new(stream.clone(), pools.points * 48);
        let index_pool = DevicePool::new(stream.clone(), pools.points);
        Ok(Self {
            output_pool: super::OutputPool::new(ctx.clone()),
            ctx,
            stream,
            modules,
            profile,
            device_name,
            compute_capability,
            sm_count,
            arch,
            nvrtc_version,
            cache_dir,
            module_loads,
            upload_ring: Mutex::new(upload_ring),
            readback_ring: Arc::new(Mutex::new(readback_ring)),
            gather_scratch: Mutex::new(gather_scratch),
            cloud_pool,
            record_pool,
            index_pool,
        })
    }

    /// A kernel function of a loaded module (`module` as in `src/gpu/kernels.rs`).
    pub fn function(&self, module: &str, name: &str) -> Result<CudaFunction, GpuError> {
        let m = self.modules.get(module).ok_or_else(|| GpuError::UnknownModule(module.to_string()))?;
        Ok(m.load_function(name)?)
    }

    /// Module names loaded.
    pub fn modules(&self) -> Vec<&'static str> {
        KERNELS.iter().map(|k| k.module).filter(|m| self.modules.contains_key(m)).collect()
    }

    /// Number of modules that came from the cubin cache.
    pub fn cache_hits(&self) -> usize {
        self.module_loads.iter().filter(|m| m.origin == CubinOrigin::CacheHit).count()
    }

    pub fn pool_stats(&self) -> PoolStats {
        PoolStats {
            upload_ring_growths: self.upload_ring.lock().unwrap().growths(),
            readback_ring_growths: self.readback_ring.lock().unwrap().growths(),
            scratch_growths: self.gather_scratch.lock().unwrap().growths(),
            cloud_pool_growths: self.cloud_pool.growths() + self.record_pool.growths() + self.index_pool.growths(),
        }
    }

    /// A stage timer on this context's stream.
    pub fn stage_timer(&self) -> StageTimer {
        StageTimer::new(self.stream.clone())
    }

    pub fn synchronize(&self) -> Result<(), GpuError> {
        Ok(self.stream.synchronize()?)
    }
}

// ---------------------------------------------------------------------------------------------

struct PinnedSlot<T> {
    buf: Option<PinnedHostSlice<T>>,
    /// Recorded after the last copy that used `buf`; waited on before `buf` is reused.
    done: CudaEvent,
    in_flight: bool,
}

/// A small ring of page-locked staging buffers, reused frame after frame. A slot is reused only
/// after the copy that last used it has finished; a slot grows (counted) when a frame needs more.
pub struct PinnedRing<T> {
    ctx: Arc<CudaContext>,
    slots: Vec<PinnedSlot<T>>,
    next: usize,
    growths: u64,
}

/// Bytes each task copies into a pinned upload slot.
const UPLOAD_COPY_CHUNK: usize = 64 << 10;
/// Bytes per DMA of an upload (see [`PinnedRing::upload`]).
const UPLOAD_DMA_PIECE: usize = 1 << 20;

impl<T: DeviceRepr + ValidAsZeroBits + Copy + Send + Sync> PinnedRing<T> {
    /// Not write-combined, uploads included: on the H200 machine the upload of a 5.2 MB cloud
    /// (parallel copy into the slot, then the DMA) took 0.35 ms from cached memory against 0.43 ms
    /// from write-combined memory (BENCHMARKS.md, 2026-12-03).
    pub fn new(ctx: Arc<CudaContext>, slots: usize, initial_len: usize) -> Result<Self, GpuError> {
        let mut ring = Self { ctx: ctx.clone(), slots: Vec::new(), next: 0, growths: 0 };
        for _ in 0..slots.max(1) {
            let buf = if initial_len > 0 { Some(ring.alloc(initial_len)?) } else { None };
            ring.slots.push(PinnedSlot { buf, done: ctx.new_event(None)?, in_flight: false });
        }
        Ok(ring)
    }

    fn alloc(&self, len: usize) -> Result<PinnedHostSlice<T>, GpuError> {
        // SAFETY: the memory is written before it is read (upload) or by the copy (read-back).
        Ok(unsafe { self.ctx.alloc_pinned_with_flags::<T>(len, 0) }?)
    }

    /// How many times a slot had to be (re)allocated because a frame did not fit.
    pub fn growths(&self) -> u64 {
        self.growths
    }

    /// The current capacity of each slot, in elements.
    pub fn capacities(&self) -> Vec<usize> {
        self.slots.iter().map(|s| s.buf.as_ref().map_or(0, |b| b.len())).collect()
    }

    /// Takes the next slot with room for `len` elements, waiting for its previous copy.
    fn next_slot(&mut self, len: usize) -> Result<usize, GpuError> {
        let i = self.next;
        self.next = (self.next + 1) % self.slots.len();
        if self.slots[i].in_flight {
            self.slots[i].done.synchronize()?;
            self.slots[i].in_flight = false;
        }
        let cap = self.slots[i].buf.as_ref().map_or(0, |b| b.len());
        if cap < len {
            let new_len = len.max(cap + cap / 2);
            self.slots[i].buf = None; // free first: pinned memory is precious
            let buf = self.alloc(new_len)?;
            self.slots[i].buf = Some(buf);
            self.growths += 1;
            tracing::debug!(slot = i, elems = new_len, "pinned staging slot grown");
        }
        Ok(i)
    }

    /// Copies `src` into a pinned slot and enqueues its copy to `dst` (first `src.len()` elements)
    /// on `stream`. Returns without waiting for the copy.
    pub fn upload(&mut self, stream: &Arc<CudaStream>, src: &[T], dst: &mut CudaSlice<T>) -> Result<(), GpuError> {
        assert!(dst.len() >= src.len(), "upload destination too small");
        if src.is_empty() {
            return Ok(());
        }
        let i = self.next_slot(src.len())?;
        let slot = &mut self.slots[i];
        let host = &mut slot.buf.as_mut().unwrap().as_mut_slice()?[..src.len()];
        let size = std::mem::size_of::<T>().max(1);
        let (dptr, _record) = dst.device_ptr_mut(stream);
        // The host copy and the DMA overlap: each piece's DMA is enqueued as soon as it is in the
        // pinned slot, while the next piece is copied (in parallel: one thread's memcpy is
        // several times slower than the DMA).
        let piece = (UPLOAD_DMA_PIECE / size).max(1);
        let chunk = (UPLOAD_COPY_CHUNK / size).max(1);
        for (k, (h, s)) in host.chunks_mut(piece).zip(src.chunks(piece)).enumerate() {
            h.par_chunks_mut(chunk).zip(s.par_chunks(chunk)).for_each(|(h, s)| h.copy_from_slice(s));
            let h = &*h;
            // SAFETY: `h` is pinned and stays alive (and untouched) until `done` completes; the
            // destination has room for `src.len()` elements from `dptr`, and this piece ends
            // within them.
            unsafe { drv::memcpy_htod_async(dptr + (k * piece * size) as u64, h, stream.cu_stream()) }?;
        }
        slot.done.record(stream)?;
        slot.in_flight = true;
        Ok(())
    }

    /// Copies `len` elements starting at element `offset` of `src` into a pinned slot, waits, and
    /// calls `f` with them.
    pub fn download<R>(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &CudaSlice<T>,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[T]) -> R,
    ) -> Result<R, GpuError> {
        assert!(offset + len <= src.len(), "download range past the device buffer");
        if len == 0 {
            return Ok(f(&[]));
        }
        let i = self.next_slot(len)?;
        let slot = &mut self.slots[i];
        {
            let view = src.slice(offset..offset + len);
            let (sptr, _record) = view.device_ptr(stream);
            let host = slot.buf.as_mut().unwrap().as_mut_slice()?;
            // SAFETY: exact sizes; `host` is pinned and is read only after `done` completes.
            unsafe { drv::memcpy_dtoh_async(&mut host[..len], sptr, stream.cu_stream()) }?;
        }
        slot.done.record(stream)?;
        slot.done.synchronize()?;
        slot.in_flight = false;
        let host = slot.buf.as_ref().unwrap().as_slice()?;
        Ok(f(&host[..len]))
    }
}

// ---------------------------------------------------------------------------------------------

/// One grow-only device buffer: reallocated (counted) only when a frame needs more than it holds.
pub struct GrowBuffer<T> {
    buf: Option<CudaSlice<T>>,
    growths: u64,
}

impl<T: DeviceRepr + ValidAsZeroBits> GrowBuffer<T> {
    /// Allocates `initial` elements up front (not counted as a growth).
    pub fn new(stream: &Arc<CudaStream>, initial: usize) -> Result<Self, GpuError> {
        let buf = if initial > 0 { Some(stream.alloc_zeros::<T>(initial)?) } else { None };
        Ok(Self { buf, growths: 0 })
    }

    /// The buffer, with at least `len` elements (grows by at least 1.5x).
    pub fn ensure(&mut self, stream: &Arc<CudaStream>, len: usize) -> Result<&mut CudaSlice<T>, GpuError> {
        let cap = self.buf.as_ref().map_or(0, |b| b.len());
        if cap < len.max(1) {
            let new_len = len.max(1).max(cap + cap / 2);
            self.buf = None;
            self.buf = Some(stream.alloc_zeros::<T>(new_len)?);
            self.growths += 1;
            tracing::debug!(elems = new_len, "device buffer grown");
        }
        Ok(self.buf.as_mut().unwrap())
    }

    pub fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    pub fn growths(&self) -> u64 {
        self.growths
    }
}

struct PoolInner<T> {
    free: Vec<CudaSlice<T>>,
    growths: u64,
}

/// A grow-only pool of device buffers. [`DevicePool::take`] hands out a [`PooledSlice`] that
/// returns to the pool when dropped, so a steady stream of frames allocates nothing.
pub struct DevicePool<T> {
    stream: Arc<CudaStream>,
    inner: Arc<Mutex<PoolInner<T>>>,
    initial: usize,
}

impl<T> Clone for DevicePool<T> {
    fn clone(&self) -> Self {
        Self { stream: self.stream.clone(), inner: self.inner.clone(), initial: self.initial }
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> DevicePool<T> {
    /// `initial`: the size of the first buffer, in elements (a bigger request wins).
    pub fn new(stream: Arc<CudaStream>, initial: usize) -> Self {
        Self { stream, inner: Arc::new(Mutex::new(PoolInner { free: Vec::new(), growths: 0 })), initial }
    }

    /// A buffer of at least `len` elements: the smallest free one that fits, else a new one
    /// (counted; the largest free buffer that is too small is released).
    pub fn take(&self, len: usize) -> Result<PooledSlice<T>, GpuError> {
        let mut inner = self.inner.lock().unwrap();
        let best =
            inner.free.iter().enumerate().filter(|(_, b)| b.len() >= len).min_by_key(|(_, b)| b.len()).map(|(i, _)| i);
        let buf = match best {
            Some(i) => inner.free.swap_remove(i),
            None => {
                let largest = inner.free.iter().map(|b| b.len()).max().unwrap_or(0);
                if let Some(i) = inner.free.iter().position(|b| b.len() == largest) {
                    inner.free.swap_remove(i);
                }
                let new_len = len.max(self.initial).max(largest + largest / 2).max(1);
                inner.growths += 1;
                tracing::debug!(elems = new_len, "device pool grown");
                self.stream.alloc_zeros::<T>(new_len)?
            }
        };
        Ok(PooledSlice { buf: Some(buf), pool: self.inner.clone() })
    }

    /// Allocations made because no free buffer was large enough.
    pub fn growths(&self) -> u64 {
        self.inner.lock().unwrap().growths
    }

    /// Buffers waiting in the pool.
    pub fn free_buffers(&self) -> usize {
        self.inner.lock().unwrap().free.len()
    }
}

/// A device buffer borrowed from a [`DevicePool`]; derefs to its `CudaSlice`.
pub struct PooledSlice<T> {
    buf: Option<CudaSlice<T>>,
    pool: Arc<Mutex<PoolInner<T>>>,
}

impl<T> std::ops::Deref for PooledSlice<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.buf.as_ref().unwrap()
    }
}

impl<T> std::ops::DerefMut for PooledSlice<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.buf.as_mut().unwrap()
    }
}

impl<T> Drop for PooledSlice<T> {
    fn drop(&mut self) {
        if let (Some(buf), Ok(mut inner)) = (self.buf.take(), self.pool.lock()) {
            inner.free.push(buf);
        }
    }
}

// ---------------------------------------------------------------------------------------------

/// Per-stage GPU times from CUDA events recorded on one stream. Events are reused across frames.
///
/// ```ignore
/// let mut t = ctx.stage_timer();
/// t.start()?;  /* enqueue upload */ t.stage("upload")?;  /* enqueue gather */ t.stage("gather")?;
/// let times = t.finish()?; // [("upload", 0.41), ("gather", 0.05)] in ms
/// ```
pub struct StageTimer {
    stream: Arc<CudaStream>,
    events: Vec<CudaEvent>,
    names: Vec<String>,
    used: usize,
}

impl StageTimer {
    pub fn new(stream: Arc<CudaStream>) -> Self {
        Self { stream, events: Vec::new(), names: Vec::new(), used: 0 }
    }

    fn record(&mut self) -> Result<(), GpuError> {
        if self.used == self.events.len() {
            let ev = self.stream.context().new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            self.events.push(ev);
        }
        self.events[self.used].record(&self.stream)?;
        self.used += 1;
        Ok(())
    }

    /// Starts a new frame (forgets the previous stages).
    pub fn start(&mut self) -> Result<(), GpuError> {
        self.used = 0;
        self.names.clear();
        self.record()
    }

    /// Marks the end of a stage (everything enqueued since the previous mark).
    pub fn stage(&mut self, name: &str) -> Result<(), GpuError> {
        if self.used == 0 {
            self.start()?;
        }
        self.names.push(name.to_string());
        self.record()
    }

    /// Waits for the last stage and returns (name, milliseconds) per stage, in order.
    pub fn finish(&mut self) -> Result<Vec<(String, f32)>, GpuError> {
        let mut out = Vec::with_capacity(self.names.len());
        for (i, name) in self.names.iter().enumerate() {
            out.push((name.clone(), self.events[i].elapsed_ms(&self.events[i + 1])?));
        }
        Ok(out)
    }
}
