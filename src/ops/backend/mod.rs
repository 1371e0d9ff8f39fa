//! The operator contract: every operator the pipeline runs, over clouds held by the backend. The CPU
//! reference ([`CpuBackend`]) is the oracle; the CUDA backend ([`CudaBackend`]) implements the same
//! trait and must reproduce it bit for bit on integer outputs. The stage sequence
//! (`pipeline::stages`) is written once, generically over this trait.
//!
//! Clouds stay where the backend keeps them ([`Backend::Points`]: host columns on the CPU, device
//! columns on CUDA), and so do FPS indices ([`Backend::Samples`]) and neighbour results
//! ([`Backend::Neighbors`]) until they are fetched: the neighbour search reads its queries without
//! a round trip, and on CUDA both run while the host goes on. What an operator returns on the host
//! is what is published; the largest outputs (`voxel_features`, `neighborhoods`) come back as
//! messages the backend wrote.

mod cpu;
mod cuda;

pub use cpu::{CpuBackend, HostPoints};
pub use cuda::{CudaBackend, DevicePoints};

use super::detect::{DetectParams, Detections};
use super::fps::FpsParams;
use super::neighbors::{BallQueryParams, KnnParams, PublishedNeighbors};
use super::nms::{Box3d, NmsError, NmsOutput, NmsParams};
use super::voxel::{
    DynamicVoxels, FeaturesLayout, HardVoxelParams, HardVoxels, PillarFeatures, PublishedDownsample,
    PublishedHardVoxels, VoxelGrid,
};
use super::ParamError;
use crate::cloud::{CloudMessage, CloudView, Header, SourceIndex};
use crate::gpu::GpuError;

/// An operator failure, the same type on every backend.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error(transparent)]
    Nms(#[from] NmsError),
    /// A size the backend cannot index (e.g. more points than its 32-bit kernels address).
    #[error("{what}: {value} exceeds the backend's limit of {limit}")]
    TooLarge { what: &'static str, value: u64, limit: u64 },
    /// The device failed (driver error, launch failure, out of memory) or was misused.
    #[error("GPU: {0}")]
    Device(GpuError),
}

/// A launcher's parameter and size errors are the backend-neutral [`OpError::Param`] and
/// [`OpError::TooLarge`] (a bad parameter is the same error on the CPU and on CUDA); every other
/// device error is [`OpError::Device`].
impl From<GpuError> for OpError {
    fn from(e: GpuError) -> Self {
        match e {
            GpuError::Param(e) => OpError::Param(e),
            GpuError::TooLarge { what, value, limit } => OpError::TooLarge { what, value, limit },
            e => OpError::Device(e),
        }
    }
}

/// The operators of the pipeline, over one backend's clouds.
pub trait Backend {
    /// A gathered cloud as this backend holds it; channels 0, 1, 2 are x, y, z.
    type Points;
    /// FPS sample indices as this backend holds them.
    type Samples;
    /// A neighbour search's result as this backend holds it.
    type Neighbors;
    /// The downsample stage's dynamic voxels as this backend holds them.
    type Downsample;

    /// "cpu" or the device and profile.
    fn describe(&self) -> String;

    /// Gathers every single-element field into float32 columns, dropping non-finite points.
    fn gather(&mut self, view: &CloudView<'_>) -> Result<Self::Points, OpError>;
    fn len(&self, points: &Self::Points) -> usize;
    fn dropped_non_finite(&self, points: &Self::Points) -> usize;
    fn channel_names<'p>(&self, points: &'p Self::Points) -> &'p [String];

    /// Hard voxels of x, y, z followed by `channels` (indices into the cloud's channels).
    fn voxelize_hard(
        &mut self,
        points: &Self::Points,
        channels: &[usize],
        params: &HardVoxelParams,
    ) -> Result<HardVoxels, OpError>;
    /// [`Self::voxelize_hard`] as the pipeline publishes it: the features written into the
    /// `voxel_features` message of `layout`, with the voxels' centroids.
    fn voxelize_hard_published(
        &mut self,
        points: &Self::Points,
        channels: &[usize],
        params: &HardVoxelParams,
        layout: &FeaturesLayout<'_>,
    ) -> Result<PublishedHardVoxels, OpError>;
    fn voxelize_dynamic(
        &mut self,
        points: &Self::Points,
        channels: &[usize],
        grid: &VoxelGrid,
    ) -> Result<DynamicVoxels, OpError>;
    /// The downsample stage's dynamic voxels of every channel of `points`; `keep`: the stages
    /// after it run on the downsampled cloud. On CUDA only enqueued, on a stream of its own, until
    /// [`Self::downsample_published`]: the stage sequence starts it before the voxel stage waits
    /// for its own copies.
    fn downsample(&mut self, points: &Self::Points, grid: &VoxelGrid, keep: bool) -> Result<Self::Downsample, OpError>;
    /// The downsample stage as the pipeline publishes it: `voxels` (of [`Self::downsample`] over
    /// `points`, the gather of `view`) written as the `downsampled` message in `view`'s layout
    /// ([`super::voxel::downsampled_message`]; `source` maps the points to `view`'s records, for a
    /// backend that reads them on the host); with `keep`, also the downsampled cloud (the means'
    /// x, y, z) as this backend's points.
    fn downsample_published(
        &mut self,
        points: &Self::Points,
        view: &CloudView<'_>,
        source: &SourceIndex,
        voxels: Self::Downsample,
    ) -> Result<(PublishedDownsample, Option<Self::Points>), OpError>;
    /// Hard voxels with their PointPillars features (`channels[0]` is the intensity channel).
    fn pillar_features(
        &mut self,
        points: &Self::Points,
        channels: &[usize],
        params: &HardVoxelParams,
        with_range: bool,
    ) -> Result<(HardVoxels, PillarFeatures), OpError>;

    /// FPS over `points`, the indices kept on the backend (for the queries). On CUDA the kernels
    /// are only enqueued: the host goes on (the pipeline encodes the voxel outputs meanwhile)
    /// until [`Self::samples_published`].
    fn fps(&mut self, points: &Self::Points, params: &FpsParams) -> Result<Self::Samples, OpError>;
    /// The indices of `samples` on the host and the `samples` message: the records of `view`,
    /// the message of the cloud FPS ran on (the input, or the `downsampled` message; `source`
    /// maps the points of `points` to its records), at the first `queries` samples, byte for
    /// byte ([`crate::cloud::select_records`]). Waits for the device once: on CUDA a kernel picks
    /// the records from the ones on the device, and while FPS runs the neighbour search started
    /// behind it is launched on each chunk of samples FPS has written.
    fn samples_published(
        &mut self,
        points: &Self::Points,
        samples: &Self::Samples,
        queries: usize,
        view: &CloudView<'_>,
        source: &SourceIndex,
        header: &Header,
    ) -> Result<(Vec<i32>, CloudMessage), OpError>;
    /// KNN of the first `queries` sampled points (the non-padding ones) into `points`. On CUDA
    /// only started (the cell grid is built beside FPS); the rows are searched in chunks as the
    /// FPS that makes `samples` writes them ([`Self::samples_published`],
    /// [`Self::neighbors_published`]).
    fn knn(
        &mut self,
        points: &Self::Points,
        samples: &Self::Samples,
        queries: usize,
        params: &KnnParams,
    ) -> Result<Self::Neighbors, OpError>;
    fn ball_query(
        &mut self,
        points: &Self::Points,
        samples: &Self::Samples,
        queries: usize,
        params: &BallQueryParams,
    ) -> Result<Self::Neighbors, OpError>;
    /// A neighbour search (KNN or ball query as it returned it) as published: its indices on the
    /// host and its `neighborhoods` message ([`super::neighbors::neighborhoods_message`]) around
    /// the FPS `samples`, x, y, z from `points`, the cloud it searched. Waits for the device
    /// once: on CUDA the records are written by a kernel and copied with the indices in one go.
    fn neighbors_published(
        &mut self,
        points: &Self::Points,
        samples: &Self::Samples,
        neighbors: Self::Neighbors,
        header: &Header,
    ) -> Result<PublishedNeighbors, OpError>;

    /// Ground, clusters and boxes of the cloud (`ops::detect`).
    fn detect(&mut self, points: &Self::Points, params: &DetectParams) -> Result<Detections, OpError>;

    fn nms(
        &mut self,
        boxes: &[Box3d],
        scores: &[f32],
        classes: &[i32],
        params: &NmsParams,
    ) -> Result<NmsOutput, OpError>;
}
