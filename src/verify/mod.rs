//! The GPU-vs-CPU checks (`check-gpu`) and the benchmarks (`bench`, `bench-cpu`) of every operator family, and
//! of the gather stage and the whole pipeline. Not part of the data path: the node binaries and
//! the pipeline never reference this module.
//!
//! - [`suite`]: the whole `check-gpu` and `bench` tables.
//! - [`cpu`]: `bench-cpu`, the pipeline on the CPU backend by cloud size and thread count.
//! - [`tune`]: `tune`, a kernel profile chosen by measurement on the GPU present.
//! - [`voxel`], [`fps`], [`neighbors`], [`nms`], [`detect`]: one family's checks and benchmarks.
//! - [`smoke`]: the gather stage's inputs and comparison.
//! - [`report`]: the table rows and the check inputs' random generator.
//! - `workloads`: the fixed benchmark inputs, read and checked against their manifest.

pub mod cpu;
pub mod detect;
pub mod fps;
pub mod neighbors;
pub mod nms;
pub mod report;
pub mod smoke;
pub mod soak;
pub mod suite;
pub mod tune;
pub mod voxel;
mod workloads;

pub use report::{BenchRow, BenchTable, CheckRow, CheckTable};
pub use suite::{bench_all, check_all, Families, Family};
pub(crate) use workloads::{workload_f32, workload_indices, workload_xyz};

use crate::cloud::{Cloud, CloudError, Header, PointCloud2, PointLayout};
use crate::gpu::{upload_and_gather, DeviceCloud, GpuContext, GpuError};
use crate::ops::nms::NmsError;
use crate::ops::ParamError;
use crate::pipeline::FrameError;
use std::path::{Path, PathBuf};

/// Why a check or a benchmark could not run (a check that runs and disagrees is a failed
/// [`CheckRow`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The device side failed or refused the input.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The CPU reference refused a check's parameters.
    #[error("CPU reference: {0}")]
    Param(ParamError),
    /// The CPU reference refused a check's boxes or NMS parameters.
    #[error("CPU reference: {0}")]
    Nms(NmsError),
    /// A check built an invalid PointCloud2.
    #[error("invalid PointCloud2: {0}")]
    Cloud(CloudError),
    /// The pipeline bench's frame failed.
    #[error("pipeline: {0}")]
    Frame(FrameError),
    /// A scan, workload or detections file (or folder) that cannot be read or has the wrong shape.
    #[error("{}: {message}", path.display())]
    Workload { path: PathBuf, message: String },
    /// `bench-cpu` could not start a thread pool of this size.
    #[error("a thread pool of {threads} threads: {message}")]
    ThreadPool { threads: usize, message: String },
    /// The NMS bench's group pair lists overflowed in a timed run although the warm-up sized them.
    #[error("NMS bench: group pair list overflow after warm-up")]
    PairListOverflow,
}

impl VerifyError {
    pub(crate) fn workload(path: &Path, message: impl std::fmt::Display) -> Self {
        Self::Workload { path: path.to_path_buf(), message: message.to_string() }
    }
}

/// Uploads a host cloud through the PointCloud2 gather path; returns the device cloud and the
/// host cloud the CPU reference must see (the gathered one).
pub(crate) fn upload_cloud(ctx: &GpuContext, cloud: &Cloud) -> Result<(DeviceCloud, Cloud), VerifyError> {
    let msg = PointCloud2::from_cloud(Header::default(), cloud, &PointLayout::packed_f32(&["x", "y", "z"]));
    let view = crate::cloud::CloudView::new(msg)?;
    let dev = upload_and_gather(ctx, &view)?;
    Ok((dev, view.gather().cloud))
}

pub(crate) fn load_scan(ctx: &GpuContext, path: &Path) -> Result<(DeviceCloud, Cloud), VerifyError> {
    let scan = crate::bag::sample::load_ouster_bin(path).map_err(|e| VerifyError::workload(path, e))?;
    let msg = PointCloud2::from_cloud(Header::default(), &scan, &PointLayout::ouster());
    let view = crate::cloud::CloudView::new(msg)?;
    let dev = upload_and_gather(ctx, &view)?;
    Ok((dev, view.gather().cloud))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// GPU time (CUDA events) of `f`, median of `runs` after `warm` warm-up runs.
pub(crate) fn time_ms(
    ctx: &GpuContext,
    warm: usize,
    runs: usize,
    mut f: impl FnMut() -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    for _ in 0..warm {
        f()?;
    }
    ctx.synchronize()?;
    let mut t = ctx.stage_timer();
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs {
        t.start()?;
        f()?;
        t.stage("op")?;
        v.push(t.finish()?[0].1 as f64);
    }
    Ok(median(v))
}

// By hand, not `#[from]`: the messages already show the cause, so it is not also their `source`
// (an `anyhow` chain would print it twice).
macro_rules! verify_error_from {
    ($($ty:ty => $variant:ident),*) => {$(
        impl From<$ty> for VerifyError {
            fn from(e: $ty) -> Self {
                VerifyError::$variant(e)
            }
        }
    )*};
}
verify_error_from!(ParamError => Param, NmsError => Nms, CloudError => Cloud, FrameError => Frame);
