//! The per-frame pipeline shared by `replay` and the ROS nodes: decode a PointCloud2, run the
//! configured stages, and turn their results into output messages.

pub mod config;
pub mod engine;
pub mod outputs;
pub mod stages;
pub mod stats;

pub use crate::ops::voxel::FeaturesDtype;
pub use config::{ConfigError, FpsInput, NeighborMode, PipelineConfig, VoxelMode};
pub use engine::Engine;
pub use stages::{
    StageResults, BOXES_TOPIC, CLUSTERS_TOPIC, DETECTIONS_3D_TOPIC, DETECTIONS_TOPIC, DOWNSAMPLED_TOPIC, MARKERS_TOPIC,
    NEIGHBORHOODS_TOPIC, SAMPLES_TOPIC, VOXELS_TOPIC, VOXEL_FEATURES_TOPIC,
};
pub use stats::{GpuFallbackStats, LatencySamples, PipelineStats};

use crate::cloud::{CloudError, CloudMessage, CloudView, Header};
use crate::ops::backend::OpError;
use crate::ops::nms::{Box3d, NmsOutput};
use crate::ops::voxel::{DynamicVoxels, HardVoxelCounts};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("malformed PointCloud2: {0}")]
    Malformed(CloudError),
    #[error("cloud has no channel '{0}' listed in `features`")]
    MissingFeature(String),
    #[error("box records lack field '{0}'")]
    BadBoxes(&'static str),
    #[error(transparent)]
    Op(#[from] OpError),
}

/// Voxelization result of either mode.
#[derive(Debug, Clone, PartialEq)]
pub enum Voxels {
    /// Hard voxels' counts (the voxels and their features went into the `voxels` and
    /// `voxel_features` messages).
    Hard(HardVoxelCounts),
    Dynamic(DynamicVoxels),
}

/// Neighbour indices around the FPS samples: `indices` is [queries, width], -1 padded.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighborhoods {
    /// Rows (queries) of `width` slots.
    pub rows: usize,
    pub width: usize,
    /// Real neighbours (padding slots excluded: ball-query `first_found` padding repeats an index).
    pub found: usize,
}

/// Everything one frame produced: the validated input (its records feed the pass-through outputs)
/// and the stages' results.
#[derive(Debug, Clone)]
pub struct FrameOutput<'a> {
    pub view: CloudView<'a>,
    pub results: StageResults,
    /// Every PointCloud2 output as (topic, message), in a fixed order (the `encode` stage).
    pub messages: Vec<(&'static str, CloudMessage)>,
    pub timings: Timings,
}

/// Marker namespace of the detect stage's boxes.
pub const DETECTION_MARKER_NS: &str = "lidar_kernels_detections";

/// Per-stage wall times of one frame, in stage order.
pub type Timings = Vec<(&'static str, Duration)>;

/// The timings with the parts of a stage timed more than once (FPS is started, then waited
/// for; encode runs before and after the wait) summed, at the stage's first place.
fn merge_parts(timings: Timings) -> Timings {
    let mut merged: Timings = Vec::with_capacity(timings.len());
    for (stage, d) in timings {
        match merged.iter_mut().find(|(s, _)| *s == stage) {
            Some((_, total)) => *total += d,
            None => merged.push((stage, d)),
        }
    }
    merged
}

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
            Voxels::Hard(c) => c.voxels,
            Voxels::Dynamic(v) => v.voxel_count(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dropped_out_of_range(&self) -> usize {
        match self {
            Voxels::Hard(c) => c.dropped_out_of_range,
            Voxels::Dynamic(v) => v.dropped_out_of_range,
        }
    }

    pub fn dropped_capacity(&self) -> usize {
        match self {
            Voxels::Hard(c) => c.dropped_point_capacity + c.dropped_voxel_capacity,
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
        Self::with_engine(config, Engine::cpu())
    }

    pub fn with_engine(config: PipelineConfig, engine: Engine) -> Self {
        Self { config, stats: PipelineStats::default(), engine }
    }

    /// Decodes, validates and processes one CDR-encoded PointCloud2. A malformed message is
    /// counted and returned as an error; the pipeline stays usable.
    pub fn process_cdr<'a>(&mut self, bytes: &'a [u8]) -> Result<FrameOutput<'a>, FrameError> {
        let mut timings = Vec::new();
        match timed(&mut timings, "decode", || CloudView::decode(bytes)) {
            Ok(view) => self.process_timed(view, timings),
            Err(e) => {
                self.stats.clouds_received += 1;
                self.stats.malformed += 1;
                Err(e.into())
            }
        }
    }

    /// Processes a cloud decoded and validated by the caller (the ROS nodes validate on receipt).
    pub fn process<'a>(&mut self, view: CloudView<'a>) -> Result<FrameOutput<'a>, FrameError> {
        self.process_timed(view, Vec::new())
    }

    fn process_timed<'a>(&mut self, view: CloudView<'a>, mut timings: Timings) -> Result<FrameOutput<'a>, FrameError> {
        self.stats.clouds_received += 1;
        let result = self
            .engine
            .run(&self.config, &view, &mut timings, &mut self.stats.gpu)
            .map(|(results, messages)| FrameOutput { view, results, messages, timings: merge_parts(timings) });
        match &result {
            Ok(out) => {
                let r = &out.results;
                self.stats.clouds_processed += 1;
                self.stats.points_in += (r.points + r.dropped_non_finite) as u64;
                self.stats.points_non_finite += r.dropped_non_finite as u64;
                if let Some(v) = &r.voxels {
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

    /// Runs NMS over one CDR-encoded PointCloud2 of box records.
    pub fn process_boxes_cdr(&mut self, bytes: &[u8]) -> Result<KeptBoxes, FrameError> {
        let view = CloudView::decode(bytes).inspect_err(|_| self.stats.malformed += 1)?;
        self.process_boxes(&view)
    }

    /// NMS over box records decoded and validated by the caller.
    pub fn process_boxes(&mut self, view: &CloudView<'_>) -> Result<KeptBoxes, FrameError> {
        let g = view.gather();
        let (boxes, scores, labels) = outputs::boxes_from_cloud(&g.cloud).map_err(|field| {
            self.stats.malformed += 1;
            FrameError::BadBoxes(field)
        })?;
        let header = view.msg.header.clone();
        let t = Instant::now();
        let nms = self.engine.nms(&boxes, &scores, &labels, &self.config.nms.params, &mut self.stats.gpu)?;
        self.stats.record_stage("nms", t.elapsed());
        let pick = |k: &u32| *k as usize;
        Ok(KeptBoxes {
            boxes: nms.keep.iter().map(|k| boxes[pick(k)]).collect(),
            scores: nms.keep.iter().map(|k| scores[pick(k)]).collect(),
            labels: nms.keep.iter().map(|k| labels[pick(k)]).collect(),
            header,
            nms,
        })
    }
}

/// The boxes NMS kept, in keep order, with their input's header.
#[derive(Debug, Clone)]
pub struct KeptBoxes {
    pub header: Header,
    pub nms: NmsOutput,
    pub boxes: Vec<Box3d>,
    pub scores: Vec<f32>,
    pub labels: Vec<i32>,
}

impl KeptBoxes {
    /// The `boxes` topic's message (box records).
    pub fn message(&self) -> CloudMessage {
        outputs::boxes_message(&self.header, &self.boxes, &self.scores, &self.labels)
    }
}

impl FrameOutput<'_> {
    pub fn header(&self) -> &Header {
        &self.view.msg.header
    }

    /// Every output as (topic, message), in a fixed order.
    pub fn messages(&self) -> &[(&'static str, CloudMessage)] {
        &self.messages
    }

    /// The outputs that are not PointCloud2, as (topic, ROS type, CDR): the detect stage's kept
    /// boxes as RViz markers (namespace [`DETECTION_MARKER_NS`]) and as a Detection3DArray.
    pub fn typed_messages(&self) -> Vec<(&'static str, &'static str, Vec<u8>)> {
        let Some(d) = &self.results.detections else { return Vec::new() };
        let h = self.header();
        let boxes: Vec<Box3d> = d.kept().map(|c| c.bbox).collect();
        let classes: Vec<i32> = d.kept().map(|c| c.class).collect();
        vec![
            (MARKERS_TOPIC, outputs::MARKER_ARRAY_TYPE, outputs::markers_cdr(h, &boxes, &classes, DETECTION_MARKER_NS)),
            (DETECTIONS_3D_TOPIC, outputs::DETECTION_3D_ARRAY_TYPE, outputs::detections_3d_cdr(h, d)),
        ]
    }
}

/// The voxel channels: x, y, z, then the configuration's `features`.
pub(crate) fn voxel_channel_names(cfg: &PipelineConfig) -> Vec<String> {
    ["x", "y", "z"].into_iter().map(String::from).chain(cfg.features.iter().cloned()).collect()
}

/// Lets glibc keep the per-frame output buffers (up to tens of MB each: `voxel_features` is
/// V x P x C floats) on its heap instead of mapping and unmapping them every frame, which costs a
/// page fault per 4 KiB page touched (on the sample: half of the page faults of a replay). Called
/// by the programs (`lidar-kernels`, the nodes) at start; a no-op where the C library is not glibc.
pub fn keep_frame_buffers_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; 32 MiB is glibc's largest mmap threshold.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

// By hand, not `#[from]`: the message already shows the cause, so it is not also its `source`
// (an `anyhow` chain would print it twice).
impl From<CloudError> for FrameError {
    fn from(e: CloudError) -> Self {
        FrameError::Malformed(e)
    }
}
