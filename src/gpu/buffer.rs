//! Device buffers passed to kernels as plain pointers, and the device x, y, z view the point
//! operators take. (The cudarc-tracked grow-only buffers, pools and pinned rings are in
//! [`super::context`].)

use super::gather::DeviceCloud;
use super::{GpuContext, GpuError};
use cudarc::driver::{
    result as drv, sys, CudaContext, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};
use std::marker::PhantomData;
use std::sync::Arc;

/// Device x, y, z columns: `x = data[0..len]`, `y = data[stride..stride + len]`,
/// `z = data[2 * stride..2 * stride + len]` (the layout of a [`DeviceCloud`]).
#[derive(Clone, Copy)]
pub struct DeviceXyz<'a> {
    pub data: &'a CudaSlice<f32>,
    pub stride: usize,
    pub len: usize,
}

impl<'a> DeviceXyz<'a> {
    pub fn new(data: &'a CudaSlice<f32>, stride: usize, len: usize) -> Result<Self, GpuError> {
        if len > stride || (len > 0 && data.len() < 2 * stride + len) {
            return Err(GpuError::XyzView { len, stride, needed: 2 * stride + len, available: data.len() });
        }
        Ok(Self { data, stride, len })
    }
}

impl<'a> From<&'a DeviceCloud> for DeviceXyz<'a> {
    fn from(c: &'a DeviceCloud) -> Self {
        Self { data: &c.data, stride: c.capacity, len: c.len }
    }
}

/// Uploads host x, y, z columns as one device buffer (stride = len).
pub fn upload_xyz(ctx: &GpuContext, x: &[f32], y: &[f32], z: &[f32]) -> Result<CudaSlice<f32>, GpuError> {
    let n = x.len();
    let mut all = Vec::with_capacity(3 * n.max(1));
    all.extend_from_slice(x);
    all.extend_from_slice(&y[..n]);
    all.extend_from_slice(&z[..n]);
    if all.is_empty() {
        all.push(0.0);
    }
    Ok(ctx.stream.clone_htod(&all)?)
}

/// Whether the device of `stream` has stream-ordered memory pools (the `pools` of [`DevBuf::new`]).
pub(crate) fn memory_pools_supported(stream: &CudaStream) -> Result<bool, GpuError> {
    Ok(stream.context().attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? > 0)
}

/// One value in page-locked host memory, the target of small device-to-host copies that the host
/// reads while other work runs (the FPS progress probe).
pub struct PinnedWord<T> {
    _memory: PinnedHostSlice<T>,
    host: *mut T,
}

// SAFETY: `host` points into the page-locked allocation owned by `_memory`, valid on any thread;
// it is only read with volatile accesses, after the copy into it has been waited for.
unsafe impl<T> Send for PinnedWord<T> {}
unsafe impl<T> Sync for PinnedWord<T> {}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> PinnedWord<T> {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        // SAFETY: the value is only read after a copy has written it.
        let mut memory = unsafe { ctx.alloc_pinned_with_flags::<T>(1, 0) }?;
        let host = memory.as_mut_ptr()?;
        Ok(Self { _memory: memory, host })
    }

    /// Copies the value at `src` (a device address) into the word and waits for `stream`.
    pub fn fetch(&self, src: u64, stream: &CudaStream) -> Result<T, GpuError> {
        stream.context().bind_to_thread()?;
        // SAFETY: `host` holds one T; the copy has finished when synchronize returns.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(self.host, 1);
            drv::memcpy_dtoh_async(dst, src, stream.cu_stream())?;
            stream.synchronize()?;
            Ok(self.host.read_volatile())
        }
    }
}

/// A grow-only raw device allocation, passed to kernels as a plain pointer (no cudarc event
/// tracking). Allocated and freed in stream order on the owner's stream (pool allocations
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
    pub(crate) fn new(stream: &Arc<CudaStream>, pools: bool) -> Self {
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
    pub(crate) fn zero_all(&self) -> Result<(), GpuError> {
        if self.ptr != 0 {
            self.stream.context().bind_to_thread()?;
            // SAFETY: ptr holds len elements.
            unsafe { drv::memset_d8_async(self.ptr, 0, self.len * std::mem::size_of::<T>(), self.stream.cu_stream()) }?;
        }
        Ok(())
    }

    /// At least `len` elements (grow-only, by at least half); returns the device address.
    pub(crate) fn ensure(&mut self, len: usize) -> Result<u64, GpuError> {
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

impl DevBuf<u32> {
    /// Sets every element of the allocation to `value` (stream-ordered).
    pub(crate) fn fill_all(&self, value: u32) -> Result<(), GpuError> {
        if self.ptr != 0 {
            self.stream.context().bind_to_thread()?;
            // SAFETY: ptr holds len u32 elements.
            unsafe { sys::cuMemsetD32Async(self.ptr, value, self.len, self.stream.cu_stream()) }.result()?;
        }
        Ok(())
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> DevBuf<T> {
    /// Copies the first `len` elements to the host (waits for the stream).
    pub fn to_host(&self, len: usize) -> Result<Vec<T>, GpuError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        assert!(len <= self.len, "DevBuf::to_host: {len} elements of {}", self.len);
        // Not zeroed first: the copy writes every element (a multi-MB memset per frame otherwise).
        let mut v: Vec<T> = Vec::with_capacity(len);
        self.stream.context().bind_to_thread()?;
        let bytes = len * std::mem::size_of::<T>();
        // SAFETY: `v` has room for len elements and ptr holds >= len; the copy has completed when
        // synchronize returns, so all len elements are initialized before set_len.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(v.as_mut_ptr().cast(), self.ptr, bytes, self.stream.cu_stream()).result()?;
            self.stream.synchronize()?;
            v.set_len(len);
        }
        Ok(v)
    }
}

impl<T> Drop for DevBuf<T> {
    fn drop(&mut self) {
        self.release();
    }
}
