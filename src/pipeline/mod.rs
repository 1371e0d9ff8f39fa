//! The per-frame pipeline shared by `replay` and the ROS nodes: decode a PointCloud2, run the
//! configured stages, and turn their results into output messages.

pub mod config;
pub mod engine;
pub mod outputs;
pub mod stats;

pub use config::{ConfigError, NeighborMode, PipelineConfig, VoxelMode};
pub use engine::Engine;
pub use stats::{LatencySamples, PipelineStats};

use crate::cloud::{validate, Cloud, CloudError, Gathered, Header, PointCloud2, PointLayout};
use crate::gpu::GpuError;
use crate::ops::fps::FpsOutput;
use crate::ops::nms::{NmsError, NmsOutput};
use crate::ops::voxel::{DynamicVoxels, HardVoxels};
use crate::ops::ParamError;
use std::time::{Duration, Instant};

/// Topics of the outputs, relative to the output namespace.
pub const VOXELS_TOPIC: &str = "voxels";
pub const DOWNSAMPLED_TOPIC: &str = "downsampled";
pub const SAMPLES_TOPIC: &str = "samples";
pub const NEIGHBORHOODS_TOPIC: &str = "neighborhoods";
pub const BOXES_TOPIC: &str = "boxes";

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("malformed PointCloud2: {0}")]
    Malformed(#[from] CloudError),
    #[error("cloud has no channel '{0}' listed in `features`")]
    MissingFeature(String),
    #[error("{0}")]
    BadBoxes(String),
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error(transparent)]
    Nms(#[from] NmsError),
    #[error("GPU: {0}")]
    Gpu(GpuError),
}

/// Voxelization result of either mode.
#[derive(Debug, Clone, PartialEq)]
pub enum Voxels {
    Hard(HardVoxels),
    Dynamic(DynamicVoxels),
}

/// Neighbour indices around the FPS samples: `indices` is [queries, width], -1 padded.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighborhoods {
    pub indices: Vec<i32>,
    pub width: usize,
}

/// Everything one frame produced.
#[derive(Debug, Clone)]
pub struct FrameOutput {
    pub header: Header,
    pub layout: PointLayout,
    pub input: Gathered,
    pub voxels: Option<Voxels>,
    pub downsampled: Option<Cloud>,
    pub samples: Option<FpsOutput>,
    pub neighborhoods: Option<Neighborhoods>,
    pub timings: Vec<(&'static str, Duration)>,
}

/// Per-stage wall times of one frame, in stage order.
pub type Timings = Vec<(&'static str, Duration)>;

/// Runs `f`, recording its wall time under `stage` inside a tracing span.
fn timed<T>(timings: &mut Timings, stage: &'static str, f: impl FnOnce() -> T) -> T {
    let _span = tracing::debug_span!("stage", name = stage).entered();
    let t = Instant::now();
    let out = f();
    timings.push((stage, t.elapsed()));
    out
}

impl Voxels {
    pub fn len(&self) -> usize {
        match self {
            Voxels::Hard(v) => v.num_points.len(),
            Voxels::Dynamic(v) => v.num_points.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Per-voxel centroid of every feature channel: hard voxels average their valid slots (sum in
    /// f64, slot order), dynamic voxels already carry the means.
    pub fn centroids(&self, names: &[String]) -> Cloud {
        match self {
            Voxels::Dynamic(v) => Cloud::from_row_major(&v.means, v.num_channels, names),
            Voxels::Hard(v) => {
                let (c, p) = (v.num_channels, v.max_points);
                let mut means = Vec::with_capacity(v.num_points.len() * c);
                for (vi, &n) in v.num_points.iter().enumerate() {
                    for ch in 0..c {
                        let sum: f64 = (0..n as usize).map(|s| v.features[(vi * p + s) * c + ch] as f64).sum();
                        means.push((sum / n.max(1) as f64) as f32);
                    }
                }
                Cloud::from_row_major(&means, c, names)
            }
        }
    }

    pub fn num_points(&self) -> &[u32] {
        match self {
            Voxels::Hard(v) => &v.num_points,
            Voxels::Dynamic(v) => &v.num_points,
        }
    }

    pub fn coords(&self) -> &[[i32; 3]] {
        match self {
            Voxels::Hard(v) => &v.coords,
            Voxels::Dynamic(v) => &v.voxel_coords,
        }
    }

    pub fn dropped_out_of_range(&self) -> usize {
        match self {
            Voxels::Hard(v) => v.dropped_out_of_range,
            Voxels::Dynamic(v) => v.dropped_out_of_range,
        }
    }

    pub fn dropped_capacity(&self) -> usize {
        match self {
            Voxels::Hard(v) => v.dropped_point_capacity + v.dropped_voxel_capacity,
            Voxels::Dynamic(_) => 0,
        }
    }
}

/// The configured stages over one backend.
pub struct Pipeline {
    pub config: PipelineConfig,
    pub stats: PipelineStats,
    pub engine: Engine,
}

impl Pipeline {
    /// A pipeline on the CPU reference backend.
    pub fn new(config: PipelineConfig) -> Self {
        Self::with_engine(config, Engine::Cpu)
    }

    pub fn with_engine(config: PipelineConfig, engine: Engine) -> Self {
        Self { config, stats: PipelineStats::default(), engine }
    }

    /// Decodes and processes one CDR-encoded PointCloud2. A malformed message is counted and
    /// returned as an error; the pipeline stays usable.
    pub fn process_cdr(&mut self, bytes: &[u8]) -> Result<FrameOutput, FrameError> {
        self.stats.clouds_received += 1;
        let result = self.process_inner(bytes);
        match &result {
            Ok(out) => {
                self.stats.clouds_processed += 1;
                self.stats.points_in += (out.input.cloud.len() + out.input.dropped_non_finite) as u64;
                self.stats.points_non_finite += out.input.dropped_non_finite as u64;
                if let Some(v) = &out.voxels {
                    self.stats.points_out_of_range += v.dropped_out_of_range() as u64;
                    self.stats.points_over_capacity += v.dropped_capacity() as u64;
                }
                let total: Duration = out.timings.iter().map(|(_, d)| *d).sum();
                for (stage, d) in &out.timings {
                    self.stats.record_stage(stage, *d);
                }
                self.stats.record_stage("total", total);
            }
            Err(FrameError::Malformed(_)) | Err(FrameError::MissingFeature(_)) => self.stats.malformed += 1,
            Err(_) => {}
        }
        result
    }

    fn process_inner(&mut self, bytes: &[u8]) -> Result<FrameOutput, FrameError> {
        let mut timings = Vec::new();
        let (msg, layout) = timed(&mut timings, "decode", || -> Result<_, CloudError> {
            let msg = PointCloud2::from_cdr(bytes)?;
            let layout = validate(&msg)?;
            Ok((msg, layout))
        })?;
        let r = self.engine.run(&self.config, &msg, &mut timings)?;
        Ok(FrameOutput {
            header: msg.header,
            layout,
            input: r.input,
            voxels: r.voxels,
            downsampled: r.downsampled,
            samples: r.samples,
            neighborhoods: r.neighborhoods,
            timings,
        })
    }

    /// Runs NMS over one CDR-encoded PointCloud2 of box records; returns the kept boxes' message.
    pub fn process_boxes_cdr(&mut self, bytes: &[u8]) -> Result<(Header, NmsOutput, PointCloud2<'static>), FrameError> {
        let (header, g) = Cloud::from_cdr(bytes).inspect_err(|_| self.stats.malformed += 1)?;
        let (boxes, scores, labels) = outputs::boxes_from_cloud(&g.cloud).map_err(|e| {
            self.stats.malformed += 1;
            FrameError::BadBoxes(e)
        })?;
        let t = Instant::now();
        let kept = self.engine.nms(&boxes, &scores, &labels, &self.config.nms.params)?;
        self.stats.record_stage("nms", t.elapsed());
        let pick = |k: &u32| *k as usize;
        let msg = outputs::boxes_message(
            &header,
            &kept.keep.iter().map(|k| boxes[pick(k)]).collect::<Vec<_>>(),
            &kept.keep.iter().map(|k| scores[pick(k)]).collect::<Vec<_>>(),
            &kept.keep.iter().map(|k| labels[pick(k)]).collect::<Vec<_>>(),
        );
        Ok((header, kept, msg))
    }
}

/// FPS indices without the -1 padding, as `usize`.
pub fn valid_indices(indices: &[i32]) -> Vec<usize> {
    indices.iter().filter(|&&i| i >= 0).map(|&i| i as usize).collect()
}

impl FrameOutput {
    /// Every output as (topic, message), in a fixed order.
    pub fn messages(&self, feature_names: &[String]) -> Vec<(&'static str, PointCloud2<'static>)> {
        let h = &self.header;
        let cloud = &self.input.cloud;
        let mut out = Vec::new();
        if let Some(v) = &self.voxels {
            let mut names: Vec<String> = vec!["x".into(), "y".into(), "z".into()];
            names.extend(feature_names.iter().cloned());
            out.push((VOXELS_TOPIC, outputs::voxels_message(h, &v.centroids(&names), v.num_points(), v.coords())));
        }
        if let Some(d) = &self.downsampled {
            out.push((DOWNSAMPLED_TOPIC, outputs::points_message(h, d, &self.layout)));
        }
        if let Some(s) = &self.samples {
            out.push((
                SAMPLES_TOPIC,
                outputs::points_message(h, &cloud.select(&valid_indices(&s.indices)), &self.layout),
            ));
        }
        if let Some(n) = &self.neighborhoods {
            out.push((NEIGHBORHOODS_TOPIC, outputs::neighborhoods_message(h, cloud, &n.indices, n.width)));
        }
        out
    }
}
