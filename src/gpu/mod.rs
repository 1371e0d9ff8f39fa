//! The CUDA backend's runtime: backend selection, kernel profiles, the kernel registry, NVRTC
//! compilation with an on-disk cubin cache, the device context with its pinned staging ring and
//! grow-only device pools and buffers, event timing, and the first data-path stage (PointCloud2
//! upload + gather). The operators' launchers live beside their CPU reference
//! (`crate::ops::<family>::cuda`); the GPU-vs-CPU checks and the benchmarks in `crate::verify`.
//!
//! Everything is loaded at run time (cudarc `dynamic-loading`): a machine without a driver or
//! without NVRTC builds and runs the CPU backend; nothing here panics when a library is missing.

pub mod buffer;
pub mod context;
pub mod fault;
pub mod gather;
pub mod kernels;
pub mod launch;
pub mod nvrtc;
pub mod output_pool;
pub mod profile;

pub use buffer::{upload_xyz, DevBuf, DeviceXyz, PinnedWord};
pub use context::{DevicePool, GpuContext, GpuOptions, GrowBuffer, PinnedRing, PooledSlice, StageTimer};
pub use fault::{FaultKind, FaultOp, FaultPlan};
pub use gather::{upload_and_gather, DeviceCloud};
pub use kernels::{KernelSource, KERNELS};
pub use launch::EarlyLaunch;
pub use nvrtc::{nvrtc_check, NvrtcReport, NvrtcRow};
pub use output_pool::OutputPool;
pub use profile::{KernelProfile, ProfileChoice, TunedFor};

use crate::ops::ParamError;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("CUDA driver library not found (libcuda.so / libcuda.so.1 could not be loaded): no NVIDIA driver on this machine, or it is not on the loader path")]
    DriverMissing,
    #[error("NVRTC library not found (libnvrtc.so / libnvrtc.so.12 could not be loaded): install it with scripts/install-nvrtc.sh and add the printed folder to LD_LIBRARY_PATH (a CUDA 13 NVRTC needs an unversioned libnvrtc.so symlink)")]
    NvrtcMissing,
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    #[error("CUDA driver error: {0}")]
    Driver(cudarc::driver::DriverError),
    #[error("NVRTC failed to compile {module} (options: {options}):\n{log}")]
    Compile { module: String, options: String, log: String },
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    #[error("kernel profile: '{key}': {msg}")]
    Profile { key: String, msg: String },
    #[error("kernel module '{0}' is not loaded (see src/gpu/kernels.rs)")]
    UnknownModule(String),
    #[error("invalid PointCloud2: {0}")]
    Cloud(crate::cloud::CloudError),
    /// An operator parameter the launcher checks itself: the same [`ParamError`] the CPU
    /// reference gives for the same value.
    #[error(transparent)]
    Param(#[from] ParamError),
    /// A size past what the CUDA kernels index (32-bit indices, 30-bit counts, fixed channel
    /// arrays) or past a capacity of the device path.
    #[error("{what}: {value} exceeds the CUDA backend's limit of {limit}")]
    TooLarge { what: &'static str, value: u64, limit: u64 },
    /// A channel index past the cloud's channels.
    #[error("channel index {index} of a cloud with {channels} channels")]
    BadChannel { index: usize, channels: usize },
    /// `op` reads a result (`result`) that the last operator run on this scratch did not compute.
    #[error("{op}: no {result} on the device (the last operator run on this scratch did not compute them)")]
    NoResult { op: &'static str, result: &'static str },
    /// Batch offsets that cover more points than the device cloud holds.
    #[error("offsets cover {covered} points, the device cloud has {points}")]
    OffsetsBeyondCloud { covered: usize, points: usize },
    /// Batch offsets that decrease (cloud `cloud` would end before it starts).
    #[error("offsets must not decrease: cloud {cloud} spans {start}..{end}")]
    OffsetsDecrease { cloud: usize, start: usize, end: usize },
    /// A device x, y, z view whose buffer is shorter than its length and stride need.
    #[error("device xyz: {len} points with stride {stride} need {needed} floats, buffer has {available}")]
    XyzView { len: usize, stride: usize, needed: usize, available: usize },
    /// A kernel needs more shared memory per block than the device allows.
    #[error("{kernel} needs {needed} bytes of shared memory for {count} {items}; the device allows {available}")]
    SharedMemory { kernel: &'static str, needed: usize, available: usize, count: usize, items: &'static str },
    /// A fault of `--inject-gpu-fault` whose call the driver accepted.
    #[error("the injected {0:?} fault did not fail on this device")]
    FaultNotRaised(fault::FaultKind),
    /// A cluster launch (`cuLaunchKernelEx`) the driver refused.
    #[error("{kernel}: cuLaunchKernelEx with {cluster}-block clusters: {source}")]
    ClusterLaunch { kernel: String, cluster: usize, source: cudarc::driver::DriverError },
}

/// Which backend runs the operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// CUDA when a driver, NVRTC and a GPU are present, else the CPU (with one warning).
    #[default]
    Auto,
    /// CUDA or an error naming what is missing.
    Cuda,
    /// The CPU reference.
    Cpu,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cuda" | "gpu" => Ok(Self::Cuda),
            "cpu" => Ok(Self::Cpu),
            other => Err(format!("unknown backend '{other}' (auto, cuda, cpu)")),
        }
    }
}

/// Which CUDA libraries can be loaded. `probe()` checks for real (never panics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibProbe {
    pub driver: bool,
    pub nvrtc: bool,
}

impl LibProbe {
    pub fn probe() -> Self {
        // SAFETY: these only try to dlopen the candidate names.
        Self {
            driver: unsafe { cudarc::driver::sys::is_culib_present() },
            nvrtc: unsafe { cudarc::nvrtc::sys::is_culib_present() },
        }
    }
}

/// Picks the backend: `Ok(Some(ctx))` runs CUDA, `Ok(None)` runs the CPU reference.
/// With `Auto`, a missing driver, NVRTC or GPU logs one warning and returns `Ok(None)`;
/// with `Cuda` the same is an error naming what is missing.
pub fn select_backend(kind: BackendKind, profile: ProfileChoice) -> Result<Option<GpuContext>, GpuError> {
    select_backend_with(kind, GpuOptions { profile, ..GpuOptions::default() }, LibProbe::probe())
}

/// [`select_backend`] with explicit options and library probe (tests inject a missing library).
pub fn select_backend_with(
    kind: BackendKind,
    options: GpuOptions,
    probe: LibProbe,
) -> Result<Option<GpuContext>, GpuError> {
    if kind == BackendKind::Cpu {
        return Ok(None);
    }
    let attempt = || -> Result<GpuContext, GpuError> {
        if !probe.driver {
            return Err(GpuError::DriverMissing);
        }
        if !probe.nvrtc {
            return Err(GpuError::NvrtcMissing);
        }
        GpuContext::new(options)
    };
    match attempt() {
        Ok(ctx) => {
            tracing::info!(
                device = %ctx.device_name,
                cc = %format!("{}.{}", ctx.compute_capability.0, ctx.compute_capability.1),
                sms = ctx.sm_count,
                profile = %ctx.profile.name,
                "CUDA backend"
            );
            Ok(Some(ctx))
        }
        Err(e) if kind == BackendKind::Auto && falls_back(&e) => {
            tracing::warn!("CUDA backend unavailable, using the CPU backend: {e}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Errors that mean "no usable CUDA here" (Auto falls back to the CPU) rather than a bug or a bad
/// configuration (a bad profile or a kernel that does not compile is reported even with Auto).
fn falls_back(e: &GpuError) -> bool {
    matches!(e, GpuError::DriverMissing | GpuError::NvrtcMissing | GpuError::NoDevice(_) | GpuError::Driver(_))
}

#[cfg(test)]
mod tests;

// By hand, not `#[from]`: the messages already show the cause, so it is not also their `source`
// (an `anyhow` chain would print it twice).
impl From<cudarc::driver::DriverError> for GpuError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        GpuError::Driver(e)
    }
}

impl From<crate::cloud::CloudError> for GpuError {
    fn from(e: crate::cloud::CloudError) -> Self {
        GpuError::Cloud(e)
    }
}
