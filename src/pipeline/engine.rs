//! The backend a pipeline runs on: the CPU reference, or CUDA with the frame kept on the device
//! from the gather to the last stage (one context, scratch buffers reused frame after frame).

use super::config::{NeighborMode, PipelineConfig, VoxelMode};
use super::{timed, FrameError, Neighborhoods, Timings, Voxels};
use crate::cloud::{gather, Cloud, Gathered, PointCloud2};
use crate::gpu::fps::{farthest_point_sample_with, upload_xyz, DeviceXyz, FpsScratch};
use crate::gpu::neighbors::{ball_query_with, knn_with, NeighborsScratch};
use crate::gpu::nms::{validate_input, DeviceNms};
use crate::gpu::voxel::{downsampled_from, GpuVoxelizer};
use crate::gpu::{select_backend, BackendKind, GpuContext, GpuError, ProfileChoice};
use crate::ops::fps::{farthest_point_sample, FpsOutput};
use crate::ops::neighbors::{ball_query, knn};
use crate::ops::nms::{nms, Box3d, NmsOutput, NmsParams};
use crate::ops::voxel::{voxel_grid_downsample, voxelize_dynamic, voxelize_hard};

/// What one frame's stages produced, before output encoding.
pub(super) struct StageResults {
    pub input: Gathered,
    pub voxels: Option<Voxels>,
    pub downsampled: Option<Cloud>,
    pub samples: Option<FpsOutput>,
    pub neighborhoods: Option<Neighborhoods>,
}

/// CUDA state kept across frames.
pub struct CudaEngine {
    pub ctx: GpuContext,
    voxelizer: GpuVoxelizer,
    downsampler: GpuVoxelizer,
    fps: FpsScratch,
    neighbors: NeighborsScratch,
    nms: DeviceNms,
}

pub enum Engine {
    Cpu,
    Cuda(Box<CudaEngine>),
}

impl Engine {
    /// `auto`: CUDA when a driver, NVRTC and a GPU are present, else the CPU (one log line says
    /// why); `cuda`: CUDA or an error naming what is missing; `cpu`: the CPU reference.
    pub fn select(kind: BackendKind, profile: ProfileChoice) -> Result<Self, GpuError> {
        Ok(match select_backend(kind, profile)? {
            None => Engine::Cpu,
            Some(ctx) => Engine::Cuda(Box::new(CudaEngine {
                voxelizer: GpuVoxelizer::new(&ctx)?,
                downsampler: GpuVoxelizer::new(&ctx)?,
                fps: FpsScratch::new(&ctx)?,
                neighbors: NeighborsScratch::new(&ctx)?,
                nms: DeviceNms::new(&ctx)?,
                ctx,
            })),
        })
    }

    /// "cpu" or "cuda NVIDIA H200 (sm_90, profile x86_64)".
    pub fn describe(&self) -> String {
        match self {
            Engine::Cpu => "cpu".into(),
            Engine::Cuda(e) => format!("cuda {} ({}, profile {})", e.ctx.device_name, e.ctx.arch, e.ctx.profile.name),
        }
    }

    /// NMS over one frame's boxes (same checks and keep list on both backends).
    pub(super) fn nms(
        &mut self,
        boxes: &[Box3d],
        scores: &[f32],
        classes: &[i32],
        params: &NmsParams,
    ) -> Result<NmsOutput, FrameError> {
        match self {
            Engine::Cpu => Ok(nms(boxes, scores, classes, params)?),
            Engine::Cuda(e) => {
                validate_input(boxes, scores, classes, params)?;
                let classes = if params.class_aware { classes } else { &[] };
                e.nms.upload(&e.ctx, boxes, scores, classes).map_err(FrameError::Gpu)?;
                e.nms.run(&e.ctx, params).map_err(FrameError::Gpu)
            }
        }
    }

    pub(super) fn run(
        &mut self,
        cfg: &PipelineConfig,
        msg: &PointCloud2<'_>,
        t: &mut Timings,
    ) -> Result<StageResults, FrameError> {
        match self {
            Engine::Cpu => run_cpu(cfg, msg, t),
            Engine::Cuda(e) => e.run(cfg, msg, t).map_err(FrameError::Gpu),
        }
    }
}

fn run_cpu(cfg: &PipelineConfig, msg: &PointCloud2<'_>, t: &mut Timings) -> Result<StageResults, FrameError> {
    let input = timed(t, "gather", || gather(msg))?;
    let cloud = &input.cloud;
    let voxels = if cfg.voxelize.enabled {
        let features = cloud.with_features(&cfg.features).map_err(FrameError::MissingFeature)?;
        Some(timed(t, "voxelize", || -> Result<_, FrameError> {
            Ok(match cfg.voxelize.mode {
                VoxelMode::Hard => Voxels::Hard(voxelize_hard(&features, &cfg.voxelize.params)?),
                VoxelMode::Dynamic => Voxels::Dynamic(voxelize_dynamic(&features, &cfg.voxelize.params.grid)),
            })
        })?)
    } else {
        None
    };
    let downsampled = cfg
        .downsample
        .enabled
        .then(|| timed(t, "downsample", || voxel_grid_downsample(cloud, &cfg.downsample.grid)).cloud);
    let samples = match cfg.fps.enabled {
        true => Some(timed(t, "fps", || farthest_point_sample(cloud, &cfg.fps.params))?),
        false => None,
    };
    let neighborhoods = match (&samples, cfg.neighbors.enabled) {
        (Some(s), true) => {
            let queries = cloud.select(&super::valid_indices(&s.indices));
            Some(timed(t, "neighbors", || -> Result<_, FrameError> {
                Ok(match cfg.neighbors.mode {
                    NeighborMode::Knn => {
                        let n = knn(cloud, &queries, &cfg.neighbors.knn)?;
                        Neighborhoods { indices: n.indices, width: n.width }
                    }
                    NeighborMode::BallQuery => {
                        let b = ball_query(cloud, &queries, &cfg.neighbors.ball_query)?;
                        Neighborhoods { indices: b.indices, width: b.width }
                    }
                })
            })?)
        }
        _ => None,
    };
    Ok(StageResults { input, voxels, downsampled, samples, neighborhoods })
}

impl CudaEngine {
    fn run(&mut self, cfg: &PipelineConfig, msg: &PointCloud2<'_>, t: &mut Timings) -> Result<StageResults, GpuError> {
        let ctx = &self.ctx;
        let dev = timed(t, "gather", || crate::gpu::gather::upload_and_gather(ctx, msg))?;
        let cloud = timed(t, "download", || dev.to_host())?;
        let input = Gathered { cloud, dropped_non_finite: dev.dropped_non_finite };
        let voxels = if cfg.voxelize.enabled {
            let chans = Cloud::channel_indices(&dev.names, &cfg.features)
                .map_err(|f| GpuError::Unsupported(format!("cloud has no channel '{f}' listed in `features`")))?;
            let v = &mut self.voxelizer;
            Some(timed(t, "voxelize", || -> Result<_, GpuError> {
                Ok(match cfg.voxelize.mode {
                    VoxelMode::Hard => {
                        v.hard_device(ctx, &dev, &chans, &cfg.voxelize.params, true, None)?;
                        Voxels::Hard(v.hard_to_host(ctx)?.0)
                    }
                    VoxelMode::Dynamic => {
                        v.dynamic_device(ctx, &dev, &chans, &cfg.voxelize.params.grid)?;
                        Voxels::Dynamic(v.dynamic_to_host(ctx)?)
                    }
                })
            })?)
        } else {
            None
        };
        let downsampled = if cfg.downsample.enabled {
            let all: Vec<usize> = (3..dev.names.len()).collect();
            let d = &mut self.downsampler;
            Some(timed(t, "downsample", || -> Result<_, GpuError> {
                d.dynamic_device(ctx, &dev, &all, &cfg.downsample.grid)?;
                Ok(downsampled_from(&d.dynamic_to_host(ctx)?, &dev.names).cloud)
            })?)
        } else {
            None
        };
        let fps = &mut self.fps;
        let samples = match cfg.fps.enabled {
            true => {
                Some(timed(t, "fps", || farthest_point_sample_with(ctx, fps, DeviceXyz::from(&dev), &cfg.fps.params))?)
            }
            false => None,
        };
        let neighborhoods = match (&samples, cfg.neighbors.enabled) {
            (Some(s), true) => {
                let q = input.cloud.select(&super::valid_indices(&s.indices));
                let nb = &mut self.neighbors;
                Some(timed(t, "neighbors", || -> Result<_, GpuError> {
                    let qbuf = upload_xyz(ctx, q.x(), q.y(), q.z())?;
                    let queries = DeviceXyz::new(&qbuf, q.len(), q.len())?;
                    let points = DeviceXyz::from(&dev);
                    Ok(match cfg.neighbors.mode {
                        NeighborMode::Knn => {
                            let n = knn_with(ctx, nb, points, queries, &cfg.neighbors.knn)?;
                            Neighborhoods { indices: n.indices, width: n.width }
                        }
                        NeighborMode::BallQuery => {
                            let b = ball_query_with(ctx, nb, points, queries, &cfg.neighbors.ball_query)?;
                            Neighborhoods { indices: b.indices, width: b.width }
                        }
                    })
                })?)
            }
            _ => None,
        };
        Ok(StageResults { input, voxels, downsampled, samples, neighborhoods })
    }
}
