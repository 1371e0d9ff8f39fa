//! The CPU reference backend: the operators of `ops`, on host clouds.

use super::{Backend, OpError};
use crate::cloud::{select_records, Cloud, CloudMessage, CloudView, Header, SourceIndex};
use crate::ops::detect::{detect, DetectParams, Detections};
use crate::ops::fps::{farthest_point_sample, FpsParams};
use crate::ops::neighbors::{
    ball_query, knn, neighborhoods_message, BallQueryParams, KnnParams, NeighborResult, PublishedNeighbors,
};
use crate::ops::nms::{nms, Box3d, NmsOutput, NmsParams};
use crate::ops::voxel::{
    downsampled_message, pillar_features, voxelize_dynamic, voxelize_hard, Downsampled, DynamicVoxels, FeaturesLayout,
    HardVoxelParams, HardVoxels, PillarFeatures, PublishedDownsample, PublishedHardVoxels, VoxelGrid,
};

/// The CPU reference backend: the operators of `ops`, on host clouds.
#[derive(Debug, Default)]
pub struct CpuBackend;

/// A gathered host cloud and how many points the gather dropped.
#[derive(Debug, Clone)]
pub struct HostPoints {
    pub cloud: Cloud,
    pub dropped_non_finite: usize,
}

impl HostPoints {
    fn queries(&self, samples: &[i32], n: usize) -> Cloud {
        self.cloud.select(&samples[..n].iter().map(|&i| i as usize).collect::<Vec<_>>())
    }
}

impl Backend for CpuBackend {
    type Points = HostPoints;
    type Samples = Vec<i32>;
    type Neighbors = NeighborResult;
    /// The dynamic voxels, and whether the downsampled cloud is kept.
    type Downsample = (DynamicVoxels, bool);

    fn describe(&self) -> String {
        "cpu".into()
    }

    fn gather(&mut self, view: &CloudView<'_>) -> Result<HostPoints, OpError> {
        let g = view.gather();
        Ok(HostPoints { cloud: g.cloud, dropped_non_finite: g.dropped_non_finite })
    }
    fn len(&self, points: &HostPoints) -> usize {
        points.cloud.len()
    }
    fn dropped_non_finite(&self, points: &HostPoints) -> usize {
        points.dropped_non_finite
    }
    fn channel_names<'p>(&self, points: &'p HostPoints) -> &'p [String] {
        points.cloud.names()
    }

    fn voxelize_hard(
        &mut self,
        points: &HostPoints,
        channels: &[usize],
        params: &HardVoxelParams,
    ) -> Result<HardVoxels, OpError> {
        Ok(voxelize_hard(&points.cloud.with_channels(channels), params)?)
    }
    fn voxelize_hard_published(
        &mut self,
        points: &HostPoints,
        channels: &[usize],
        params: &HardVoxelParams,
        layout: &FeaturesLayout<'_>,
    ) -> Result<PublishedHardVoxels, OpError> {
        Ok(PublishedHardVoxels::from_host(&self.voxelize_hard(points, channels, params)?, layout))
    }
    fn voxelize_dynamic(
        &mut self,
        points: &HostPoints,
        channels: &[usize],
        grid: &VoxelGrid,
    ) -> Result<DynamicVoxels, OpError> {
        Ok(voxelize_dynamic(&points.cloud.with_channels(channels), grid))
    }
    fn downsample(
        &mut self,
        points: &HostPoints,
        grid: &VoxelGrid,
        keep: bool,
    ) -> Result<(DynamicVoxels, bool), OpError> {
        Ok((voxelize_dynamic(&points.cloud, grid), keep))
    }
    fn downsample_published(
        &mut self,
        points: &HostPoints,
        view: &CloudView<'_>,
        source: &SourceIndex,
        (dv, keep): (DynamicVoxels, bool),
    ) -> Result<(PublishedDownsample, Option<HostPoints>), OpError> {
        let message = downsampled_message(&view.msg.header, view, source, &dv, points.cloud.names());
        let kept = keep.then(|| HostPoints {
            cloud: Downsampled::from_dynamic(&dv, points.cloud.names()).cloud,
            dropped_non_finite: 0,
        });
        Ok((
            PublishedDownsample { points: dv.voxel_count(), dropped_out_of_range: dv.dropped_out_of_range, message },
            kept,
        ))
    }
    fn pillar_features(
        &mut self,
        points: &HostPoints,
        channels: &[usize],
        params: &HardVoxelParams,
        with_range: bool,
    ) -> Result<(HardVoxels, PillarFeatures), OpError> {
        let voxels = voxelize_hard(&points.cloud.with_channels(channels), params)?;
        let features = pillar_features(&voxels, &params.grid, with_range)?;
        Ok((voxels, features))
    }

    fn fps(&mut self, points: &HostPoints, params: &FpsParams) -> Result<Vec<i32>, OpError> {
        Ok(farthest_point_sample(&points.cloud, params)?.indices)
    }
    fn samples_published(
        &mut self,
        _: &HostPoints,
        samples: &Vec<i32>,
        queries: usize,
        view: &CloudView<'_>,
        source: &SourceIndex,
        header: &Header,
    ) -> Result<(Vec<i32>, CloudMessage), OpError> {
        let picks: Vec<usize> = samples[..queries].iter().map(|&i| source.get(i as usize)).collect();
        Ok((samples.clone(), select_records(header, view, &picks)))
    }
    fn knn(
        &mut self,
        points: &HostPoints,
        samples: &Vec<i32>,
        queries: usize,
        params: &KnnParams,
    ) -> Result<NeighborResult, OpError> {
        Ok(NeighborResult::Knn(knn(&points.cloud, &points.queries(samples, queries), params)?))
    }
    fn ball_query(
        &mut self,
        points: &HostPoints,
        samples: &Vec<i32>,
        queries: usize,
        params: &BallQueryParams,
    ) -> Result<NeighborResult, OpError> {
        Ok(NeighborResult::Ball(ball_query(&points.cloud, &points.queries(samples, queries), params)?))
    }
    fn neighbors_published(
        &mut self,
        points: &HostPoints,
        samples: &Vec<i32>,
        neighbors: NeighborResult,
        header: &Header,
    ) -> Result<PublishedNeighbors, OpError> {
        let (indices, width, found) = neighbors.into_published();
        let message = neighborhoods_message(header, |i| points.cloud.point(i), samples, &indices, width);
        Ok(PublishedNeighbors { rows: indices.len() / width.max(1), width, found, message })
    }

    fn detect(&mut self, points: &HostPoints, params: &DetectParams) -> Result<Detections, OpError> {
        detect(&points.cloud, params)
    }

    fn nms(
        &mut self,
        boxes: &[Box3d],
        scores: &[f32],
        classes: &[i32],
        params: &NmsParams,
    ) -> Result<NmsOutput, OpError> {
        Ok(nms(boxes, scores, classes, params)?)
    }
}
