//! The stage sequence, written once over [`Backend`]: the table of stages (config key, input,
//! output topics, requirements), the cross-stage rules checked when a configuration loads (for
//! `replay` and the nodes alike), and [`run`], which takes one validated cloud through every
//! enabled stage.

use super::config::{FpsInput, NeighborMode, PipelineConfig, VoxelMode};
use super::{outputs, timed, FrameError, Neighborhoods, Timings, Voxels};
use crate::cloud::{Cloud, CloudMessage, CloudView, SourceIndex};
use crate::ops::backend::Backend;
use crate::ops::detect::Detections;
use crate::ops::fps::FpsParams;
use crate::ops::voxel::{voxels_message, FeaturesLayout};

/// Output topics, relative to the output namespace.
pub const VOXELS_TOPIC: &str = "voxels";
pub const VOXEL_FEATURES_TOPIC: &str = "voxel_features";
pub const DOWNSAMPLED_TOPIC: &str = "downsampled";
pub const SAMPLES_TOPIC: &str = "samples";
pub const NEIGHBORHOODS_TOPIC: &str = "neighborhoods";
pub const BOXES_TOPIC: &str = "boxes";
pub const DETECTIONS_TOPIC: &str = "detections";
pub const CLUSTERS_TOPIC: &str = "clusters";
/// The detect stage's boxes as visualization_msgs/MarkerArray and as vision_msgs/Detection3DArray.
pub const MARKERS_TOPIC: &str = "markers";
pub const DETECTIONS_3D_TOPIC: &str = "detections_3d";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageId {
    Voxelize,
    Downsample,
    Fps,
    Neighbors,
    Detect,
}

/// One row of the stage table.
#[derive(Debug)]
pub struct StageSpec {
    pub id: StageId,
    /// The configuration section (its `enabled` switch turns the stage on).
    pub key: &'static str,
    /// What the stage reads.
    pub input: &'static str,
    /// What it publishes.
    pub topics: &'static [&'static str],
}

/// The per-cloud stages, in run order. (NMS runs on box records, not clouds: `Pipeline::process_boxes_cdr`.)
pub const STAGES: [StageSpec; 5] = [
    StageSpec {
        id: StageId::Voxelize,
        key: "voxelize",
        input: "the cloud",
        topics: &[VOXELS_TOPIC, VOXEL_FEATURES_TOPIC],
    },
    StageSpec { id: StageId::Downsample, key: "downsample", input: "the cloud", topics: &[DOWNSAMPLED_TOPIC] },
    StageSpec {
        id: StageId::Fps,
        key: "fps",
        input: "fps.input: the cloud or the downsampled cloud",
        topics: &[SAMPLES_TOPIC],
    },
    StageSpec {
        id: StageId::Neighbors,
        key: "neighbors",
        input: "the FPS samples as queries into fps.input",
        topics: &[NEIGHBORHOODS_TOPIC],
    },
    StageSpec {
        id: StageId::Detect,
        key: "detect",
        input: "the cloud",
        topics: &[DETECTIONS_TOPIC, CLUSTERS_TOPIC, MARKERS_TOPIC, DETECTIONS_3D_TOPIC],
    },
];

/// A stage that is on while a stage it needs is off.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{setting} needs {needs}: true ({why})")]
pub struct StageRuleError {
    pub setting: String,
    pub needs: String,
    pub why: &'static str,
}

pub fn enabled(cfg: &PipelineConfig, id: StageId) -> bool {
    match id {
        StageId::Voxelize => cfg.voxelize.enabled,
        StageId::Downsample => cfg.downsample.enabled,
        StageId::Fps => cfg.fps.enabled,
        StageId::Neighbors => cfg.neighbors.enabled,
        StageId::Detect => cfg.detect.enabled,
    }
}

/// The stages `id` needs under `cfg`, as (the setting that needs it, the stage, why).
fn requirements(cfg: &PipelineConfig, id: StageId) -> Vec<(&'static str, StageId, &'static str)> {
    match id {
        StageId::Voxelize | StageId::Downsample | StageId::Detect => vec![],
        StageId::Fps => match cfg.fps.input {
            FpsInput::Cloud => vec![],
            FpsInput::Downsampled => {
                vec![("fps.input: downsampled", StageId::Downsample, "FPS samples the downsampled cloud")]
            }
        },
        StageId::Neighbors => {
            let mut r = vec![(
                "neighbors.enabled: true",
                StageId::Fps,
                "the neighbourhoods are searched around the FPS samples",
            )];
            r.extend(requirements(cfg, StageId::Fps).into_iter().map(|(_, s, w)| ("neighbors.enabled: true", s, w)));
            r
        }
    }
}

/// Every enabled stage's requirements hold.
pub fn check_rules(cfg: &PipelineConfig) -> Result<(), StageRuleError> {
    for stage in &STAGES {
        if !enabled(cfg, stage.id) {
            continue;
        }
        for (setting, needed, why) in requirements(cfg, stage.id) {
            if !enabled(cfg, needed) {
                let key = STAGES.iter().find(|s| s.id == needed).expect("in the table").key;
                return Err(StageRuleError { setting: setting.into(), needs: format!("{key}.enabled"), why });
            }
        }
    }
    Ok(())
}

/// What one frame's stages produced, on the host.
#[derive(Debug, Clone)]
pub struct StageResults {
    /// Points after the gather (non-finite ones dropped).
    pub points: usize,
    pub dropped_non_finite: usize,
    /// The gathered cloud's channel names (x, y, z first).
    pub channel_names: Vec<String>,
    pub voxels: Option<Voxels>,
    /// Points of the downsampled cloud.
    pub downsampled: Option<usize>,
    /// FPS indices into the cloud of `fps.input`: the first min(K, N) samples (the -1 padding of
    /// K > N is not computed; an empty cloud gives one -1).
    pub samples: Option<Vec<i32>>,
    pub neighborhoods: Option<Neighborhoods>,
    pub detections: Option<Detections>,
}

impl StageResults {
    /// The FPS indices without the -1 padding of K > N.
    pub fn valid_samples(&self) -> Option<&[i32]> {
        self.samples.as_deref().map(without_padding)
    }
}

/// FPS indices without their padding: FPS takes every point before it pads, so the -1 come last.
fn without_padding(indices: &[i32]) -> &[i32] {
    &indices[..indices.iter().take_while(|&&i| i >= 0).count()]
}

/// FPS and the neighbour search around its samples, started ([`start_sampling`]).
struct Sampling<B: Backend> {
    samples: B::Samples,
    /// The real samples: the neighbour queries.
    queries: usize,
    search: Option<B::Neighbors>,
}

/// Starts FPS over `points` (see [`Backend::fps`]) and, with `neighbors.enabled`, the neighbour
/// search around its samples.
fn start_sampling<B: Backend>(
    backend: &mut B,
    points: &B::Points,
    cfg: &PipelineConfig,
    t: &mut Timings,
) -> Result<Sampling<B>, FrameError> {
    // K > N pads with -1 and only the real samples are used after FPS: sampling min(K, N) gives
    // the same samples without computing the padding, which for a K of up to 2^31 - 1 was
    // gigabytes per frame whatever the cloud's size. FPS takes every point before it pads, so
    // all min(K, N) samples are real, and an empty cloud (one -1) has none.
    let n = backend.len(points);
    let params = FpsParams { num_samples: cfg.fps.params.num_samples.min(n.max(1)), ..cfg.fps.params.clone() };
    let samples = timed(t, "fps", || backend.fps(points, &params))?;
    let queries = if n == 0 { 0 } else { params.num_samples };
    let search = if cfg.neighbors.enabled {
        Some(timed(t, "neighbors", || match cfg.neighbors.mode {
            NeighborMode::Knn => backend.knn(points, &samples, queries, &cfg.neighbors.knn),
            NeighborMode::BallQuery => backend.ball_query(points, &samples, queries, &cfg.neighbors.ball_query),
        })?)
    } else {
        None
    };
    Ok(Sampling { samples, queries, search })
}

/// Every PointCloud2 output of a frame as (topic, message), in a fixed order: the topics of the
/// stage table, in its order.
pub type Messages = Vec<(&'static str, CloudMessage)>;

/// Runs every enabled stage of `cfg` on `view` (validated once, by the caller) and collects its
/// output messages: the backend writes each stage's own (on CUDA, on the device), the `encode`
/// stage only the detector's, side by side on the current rayon pool, so the bytes do not depend
/// on the threads. FPS and the neighbour search are started first, then the downsample; the voxel
/// stages and their messages are done while the device samples, which is only waited for after
/// them.
pub fn run<B: Backend>(
    backend: &mut B,
    cfg: &PipelineConfig,
    view: &CloudView<'_>,
    t: &mut Timings,
) -> Result<(StageResults, Messages), FrameError> {
    let h = &view.msg.header;
    let cloud = timed(t, "gather", || backend.gather(view))?;
    let names = backend.channel_names(&cloud).to_vec();
    let dropped_non_finite = backend.dropped_non_finite(&cloud);
    let source = view.source_indices(dropped_non_finite);
    let mut messages = Messages::new();
    let voxel_names = super::voxel_channel_names(cfg);
    // FPS starts as soon as its input exists: on the CUDA backend it runs on the device while
    // the voxel stages (on a stream of their own) and the host's encoding go on.
    let fps_on_downsampled = cfg.fps.enabled && cfg.fps.input == FpsInput::Downsampled;
    let mut pending =
        if cfg.fps.enabled && !fps_on_downsampled { Some(start_sampling(backend, &cloud, cfg, t)?) } else { None };
    // The downsample is started before the voxel stage, which waits for its copies meanwhile.
    let downsample = if cfg.downsample.enabled {
        Some(timed(t, "downsample", || backend.downsample(&cloud, &cfg.downsample.grid, fps_on_downsampled))?)
    } else {
        None
    };
    let (voxels, voxel_messages) = if cfg.voxelize.enabled {
        let channels = Cloud::channel_indices(&names, &cfg.features).map_err(FrameError::MissingFeature)?;
        let (voxels, messages) = timed(t, "voxelize", || -> Result<_, FrameError> {
            Ok(match cfg.voxelize.mode {
                VoxelMode::Hard => {
                    let layout = FeaturesLayout { header: h, names: &voxel_names, dtype: cfg.voxelize.features_dtype };
                    let p = backend.voxelize_hard_published(&cloud, &channels, &cfg.voxelize.params, &layout)?;
                    (Voxels::Hard(p.counts), (Some(p.voxels), Some(p.features)))
                }
                VoxelMode::Dynamic => {
                    let dv = backend.voxelize_dynamic(&cloud, &channels, &cfg.voxelize.params.grid)?;
                    let m = voxels_message(h, &dv.means, &voxel_names, &dv.num_points, &dv.voxel_coords);
                    (Voxels::Dynamic(dv), (Some(m), None))
                }
            })
        })?;
        (Some(voxels), messages)
    } else {
        (None, (None, None))
    };
    let (downsampled, downsampled_points) = match downsample {
        Some(voxels) => {
            let (d, kept) = timed(t, "downsample", || backend.downsample_published(&cloud, view, &source, voxels))?;
            (Some(d), kept)
        }
        None => (None, None),
    };
    let fps_cloud = match (&downsampled_points, fps_on_downsampled) {
        (Some(d), true) => d,
        _ => &cloud,
    };
    if fps_on_downsampled {
        pending = Some(start_sampling(backend, fps_cloud, cfg, t)?);
    }

    let (downsampled, downsampled_message) = match downsampled {
        Some(d) => (Some(d.points), Some(d.message)),
        None => (None, None),
    };
    let (voxels_message, voxel_features) = voxel_messages;
    messages.extend(voxels_message.map(|m| (VOXELS_TOPIC, m)));
    messages.extend(voxel_features.map(|m| (VOXEL_FEATURES_TOPIC, m)));

    // The cloud FPS ran on as a message, and how its points map to that message's records.
    let downsampled_view = downsampled_message.as_ref().map(CloudMessage::view);
    let identity = SourceIndex::Identity;
    let (searched, searched_source) = match (fps_on_downsampled, &downsampled_view) {
        (true, Some(d)) => (d, &identity),
        _ => (view, &source),
    };
    let mut samples_message = None;
    let (samples, neighborhoods) = match pending {
        Some(Sampling { samples: on_backend, queries, search }) => {
            let (indices, message) = timed(t, "fps", || {
                backend.samples_published(fps_cloud, &on_backend, queries, searched, searched_source, h)
            })?;
            samples_message = Some(message);
            debug_assert_eq!(without_padding(&indices).len(), queries, "FPS of min(K, N) pads only an empty cloud");
            let neighborhoods = match search {
                Some(search) => {
                    let p = timed(t, "neighbors", || backend.neighbors_published(fps_cloud, &on_backend, search, h))?;
                    messages.push((NEIGHBORHOODS_TOPIC, p.message));
                    Some(Neighborhoods { rows: p.rows, width: p.width, found: p.found })
                }
                None => None,
            };
            (Some(indices), neighborhoods)
        }
        None => (None, None),
    };
    let detections = if cfg.detect.enabled {
        Some(timed(t, "detect", || backend.detect(&cloud, &cfg.detect.params))?)
    } else {
        None
    };

    drop(downsampled_view);
    timed(t, "encode", || -> Result<(), FrameError> {
        let detect_messages = detections.as_ref().map(|d| {
            rayon::join(|| outputs::detections_message(h, d), || outputs::clusters_message(h, view, &source, d))
        });
        messages.extend(downsampled_message.map(|m| (DOWNSAMPLED_TOPIC, m)));
        messages.extend(samples_message.map(|m| (SAMPLES_TOPIC, m)));
        if let Some((d, c)) = detect_messages {
            messages.extend([(DETECTIONS_TOPIC, d), (CLUSTERS_TOPIC, c)]);
        }
        Ok(())
    })?;
    let results = StageResults {
        points: backend.len(&cloud),
        dropped_non_finite,
        channel_names: names,
        voxels,
        downsampled,
        samples,
        neighborhoods,
        detections,
    };
    Ok((results, messages))
}
