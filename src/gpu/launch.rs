//! Kernel launches that may start before the previous kernel of their stream has ended
//! (programmatic dependent launch, sm_90+). A chain of short kernels (the voxelizer's insert, rank
//! and select) otherwise pays, at every boundary, the wait for the last block of one kernel before
//! the first block of the next is scheduled. A kernel launched this way must call
//! `lk_wait_prior_grid()` (cuda/common.cuh) before it reads or writes anything the previous kernel
//! touches; the previous kernel's `lk_let_next_start()` lets it be scheduled early. On devices
//! before sm_90 the launch is an ordinary one (and both device calls compile to nothing).

use super::{GpuContext, GpuError};
use cudarc::driver::{sys, CudaFunction, CudaStream, DeviceRepr, LaunchConfig};
use std::ffi::c_void;
use std::marker::PhantomData;

/// The arguments of one launch, by reference (the driver copies them at the launch).
pub struct EarlyLaunch<'a> {
    args: Vec<*mut c_void>,
    _values: PhantomData<&'a ()>,
}

impl<'a> EarlyLaunch<'a> {
    pub fn new() -> Self {
        Self { args: Vec::with_capacity(16), _values: PhantomData }
    }

    pub fn arg<T: DeviceRepr>(&mut self, value: &'a T) -> &mut Self {
        self.args.push(value as *const T as *mut c_void);
        self
    }

    /// Launches `func` on `stream`, allowed to start before the stream's previous kernel ends
    /// where the device supports it.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and type, the kernel
    /// must call `lk_wait_prior_grid()` before it touches the previous kernel's data, and the
    /// device memory they point to must stay valid until the kernel ends.
    pub unsafe fn launch(
        &mut self,
        ctx: &GpuContext,
        stream: &CudaStream,
        func: &CudaFunction,
        cfg: LaunchConfig,
    ) -> Result<(), GpuError> {
        stream.context().bind_to_thread()?;
        let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let early = ctx.compute_capability.0 >= 9;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: if early { &mut attr } else { std::ptr::null_mut() },
            numAttrs: early as u32,
        };
        sys::cuLaunchKernelEx(&config, func.cu_function(), self.args.as_mut_ptr(), std::ptr::null_mut()).result()?;
        Ok(())
    }
}

impl Default for EarlyLaunch<'_> {
    fn default() -> Self {
        Self::new()
    }
}
