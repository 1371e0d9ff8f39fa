//! The pipeline ([`crate::pipeline::Pipeline`]) as a [`Stage`]: the five node executables are
//! this stage with a [`NodeKind`].
//!
//! - `pipeline`: every stage chosen by the `*.enabled` parameters (voxelize, downsample, fps,
//!   neighbors) in one process, on one backend: with CUDA one context, the frame stays on the
//!   device from the gather to the last stage (this is the package's composition);
//! - `voxelizer`: voxelize (hard | dynamic) and/or downsample;
//! - `sampler`: FPS, publishes the sampled points;
//! - `neighbors`: FPS + KNN / ball query, publishes the organized neighbourhood cloud;
//! - `nms`: box records in (`boxes_in`), kept boxes out as box records and as a MarkerArray.
//!
//! Parameters: `backend`, `target`, `config_file` (read-only), then every key of the pipeline YAML
//! that the node uses, named by its dotted path (`voxelize.max_voxels`, `voxelize.voxel_size` as a
//! double array, `neighbors.ball_query.radius`, ...). The configuration is the YAML tree of
//! `config_file` (or the defaults) with every explicitly given parameter written over it, then
//! deserialized and validated by [`PipelineConfig::from_yaml`], so errors name the key. At run
//! time a parameter change rebuilds the configuration the same way (the backend stays).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use serde_yaml::Value;

use super::stage::{Input, Output, OutputSpec, ParamSpec, ParamValue, Params, Stage, Validator};
use crate::cloud::POINTCLOUD2_TYPE;
use crate::gpu::{BackendKind, ProfileChoice};
use crate::pipeline::config::{leaves, set_path};
use crate::pipeline::outputs::{markers_cdr, DETECTION_3D_ARRAY_TYPE, MARKER_ARRAY_TYPE};
use crate::pipeline::{
    ConfigError, Engine, Pipeline, PipelineConfig, BOXES_TOPIC, CLUSTERS_TOPIC, DETECTIONS_3D_TOPIC, DETECTIONS_TOPIC,
    DOWNSAMPLED_TOPIC, MARKERS_TOPIC, NEIGHBORHOODS_TOPIC, SAMPLES_TOPIC, VOXELS_TOPIC, VOXEL_FEATURES_TOPIC,
};

/// Which node: which stages it runs, which parameters it declares, which topics it publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Pipeline,
    Voxelizer,
    Sampler,
    Neighbors,
    Detector,
    Nms,
}

/// Marker namespace of the NMS node's boxes.
pub const MARKER_NS: &str = "lidar_kernels_boxes";

impl NodeKind {
    pub const ALL: [NodeKind; 6] = [
        NodeKind::Pipeline,
        NodeKind::Voxelizer,
        NodeKind::Sampler,
        NodeKind::Neighbors,
        NodeKind::Detector,
        NodeKind::Nms,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NodeKind::Pipeline => "pipeline",
            NodeKind::Voxelizer => "voxelizer",
            NodeKind::Sampler => "sampler",
            NodeKind::Neighbors => "neighbors",
            NodeKind::Detector => "detector",
            NodeKind::Nms => "nms",
        }
    }

    /// Configuration sections whose keys the node declares as parameters.
    pub fn sections(self) -> &'static [&'static str] {
        match self {
            NodeKind::Pipeline => &["features", "voxelize", "downsample", "fps", "neighbors", "detect"],
            NodeKind::Voxelizer => &["features", "voxelize", "downsample"],
            NodeKind::Sampler => &["fps"],
            NodeKind::Neighbors => &["fps", "neighbors"],
            NodeKind::Detector => &["detect"],
            NodeKind::Nms => &["nms"],
        }
    }

    /// Keys fixed by the node kind (not parameters of that node), as YAML values.
    fn forced(self) -> &'static [(&'static str, &'static str)] {
        match self {
            NodeKind::Pipeline => &[("nms.enabled", "false")],
            NodeKind::Voxelizer => &[
                ("fps.enabled", "false"),
                ("neighbors.enabled", "false"),
                ("detect.enabled", "false"),
                ("nms.enabled", "false"),
            ],
            // No downsample stage in these nodes, so FPS runs on the cloud.
            NodeKind::Sampler => &[
                ("voxelize.enabled", "false"),
                ("downsample.enabled", "false"),
                ("fps.enabled", "true"),
                ("fps.input", "cloud"),
                ("neighbors.enabled", "false"),
                ("detect.enabled", "false"),
                ("nms.enabled", "false"),
            ],
            NodeKind::Neighbors => &[
                ("voxelize.enabled", "false"),
                ("downsample.enabled", "false"),
                ("fps.enabled", "true"),
                ("fps.input", "cloud"),
                ("neighbors.enabled", "true"),
                ("detect.enabled", "false"),
                ("nms.enabled", "false"),
            ],
            NodeKind::Detector => &[
                ("voxelize.enabled", "false"),
                ("downsample.enabled", "false"),
                ("fps.enabled", "false"),
                ("neighbors.enabled", "false"),
                ("detect.enabled", "true"),
                ("nms.enabled", "false"),
            ],
            NodeKind::Nms => &[
                ("voxelize.enabled", "false"),
                ("downsample.enabled", "false"),
                ("fps.enabled", "false"),
                ("neighbors.enabled", "false"),
                ("detect.enabled", "false"),
                ("nms.enabled", "true"),
            ],
        }
    }

    /// Output topics (relative names, published under the node: `~/<topic>`).
    pub fn topics(self) -> &'static [&'static str] {
        match self {
            NodeKind::Pipeline => &[
                VOXELS_TOPIC,
                VOXEL_FEATURES_TOPIC,
                DOWNSAMPLED_TOPIC,
                SAMPLES_TOPIC,
                NEIGHBORHOODS_TOPIC,
                DETECTIONS_TOPIC,
                CLUSTERS_TOPIC,
                MARKERS_TOPIC,
                DETECTIONS_3D_TOPIC,
            ],
            NodeKind::Voxelizer => &[VOXELS_TOPIC, VOXEL_FEATURES_TOPIC, DOWNSAMPLED_TOPIC],
            NodeKind::Sampler => &[SAMPLES_TOPIC],
            NodeKind::Neighbors => &[NEIGHBORHOODS_TOPIC],
            NodeKind::Detector => &[DETECTIONS_TOPIC, CLUSTERS_TOPIC, MARKERS_TOPIC, DETECTIONS_3D_TOPIC],
            NodeKind::Nms => &[BOXES_TOPIC, MARKERS_TOPIC],
        }
    }
}

/// Descriptions, ranges and allowed values of the pipeline keys. A key of the configuration not
/// listed here is still declared (generic description, no range).
struct KeyInfo {
    key: &'static str,
    description: &'static str,
    range: Option<(f64, f64)>,
    choices: &'static [&'static str],
}

const I32_MAX: f64 = i32::MAX as f64;
const U32_MAX: f64 = u32::MAX as f64;
const KEYS: &[KeyInfo] = &[
    KeyInfo { key: "features", description: "Channels after x, y, z carried into the voxel features ('intensity' also matches the fields reflectivity and i); [] for clouds without intensity.", range: None, choices: &[] },
    KeyInfo { key: "voxelize.enabled", description: "Run the voxelize stage (output ~/voxels).", range: None, choices: &[] },
    KeyInfo { key: "voxelize.mode", description: "hard: fixed-capacity [V, P, C] voxels (PointPillars/mmcv); dynamic: per-point voxel coordinates and per-voxel means.", range: None, choices: &["hard", "dynamic"] },
    KeyInfo { key: "voxelize.features_dtype", description: "Datatype of ~/voxel_features: float32, or float16 (IEEE binary16 bits in UINT16 fields, for fp16 networks).", range: None, choices: &["float32", "float16"] },
    KeyInfo { key: "voxelize.voxel_size", description: "Voxel edge [x, y, z] in metres, each > 0.", range: Some((1e-6, 1e4)), choices: &[] },
    KeyInfo { key: "voxelize.point_cloud_range", description: "[xmin, ymin, zmin, xmax, ymax, zmax] in metres, max > min; points outside are dropped and counted.", range: Some((-1e6, 1e6)), choices: &[] },
    KeyInfo { key: "voxelize.max_points_per_voxel", description: "P: later points of a voxel are dropped and counted (hard mode).", range: Some((1.0, 65536.0)), choices: &[] },
    KeyInfo { key: "voxelize.max_voxels", description: "Voxels past this count (first-point order) are dropped and counted (hard mode).", range: Some((1.0, I32_MAX)), choices: &[] },
    KeyInfo { key: "downsample.enabled", description: "Run the voxel-grid downsample (centroid per occupied voxel; output ~/downsampled).", range: None, choices: &[] },
    KeyInfo { key: "downsample.voxel_size", description: "Downsample voxel edge [x, y, z] in metres, each > 0.", range: Some((1e-6, 1e4)), choices: &[] },
    KeyInfo { key: "downsample.point_cloud_range", description: "[xmin, ymin, zmin, xmax, ymax, zmax] in metres; points outside are dropped and counted.", range: Some((-1e6, 1e6)), choices: &[] },
    KeyInfo { key: "fps.enabled", description: "Run farthest point sampling (output ~/samples).", range: None, choices: &[] },
    KeyInfo { key: "fps.input", description: "The cloud FPS samples and the neighbourhoods are searched in: cloud (the input) or downsampled (needs downsample.enabled).", range: None, choices: &["cloud", "downsampled"] },
    KeyInfo { key: "fps.num_samples", description: "K samples per cloud; K > N pads with -1.", range: Some((1.0, I32_MAX)), choices: &[] },
    KeyInfo { key: "fps.start_index", description: "Index of the first sample; must be < N.", range: Some((0.0, I32_MAX)), choices: &[] },
    KeyInfo { key: "neighbors.enabled", description: "Run the neighbour search around the FPS samples (needs fps.enabled; output ~/neighborhoods).", range: None, choices: &[] },
    KeyInfo { key: "neighbors.mode", description: "Neighbour search: ball_query or knn.", range: None, choices: &["ball_query", "knn"] },
    KeyInfo { key: "neighbors.knn.k", description: "Neighbours per query (knn); k > N pads with -1.", range: Some((1.0, 65536.0)), choices: &[] },
    KeyInfo { key: "neighbors.ball_query.radius", description: "Ball radius in metres (> 0); neighbours have min_radius <= d < radius.", range: Some((1e-6, 1e4)), choices: &[] },
    KeyInfo { key: "neighbors.ball_query.min_radius", description: "Inner radius in metres, >= 0 and < radius.", range: Some((0.0, 1e4)), choices: &[] },
    KeyInfo { key: "neighbors.ball_query.nsample", description: "Neighbours per query (ball query).", range: Some((1.0, 65536.0)), choices: &[] },
    KeyInfo { key: "neighbors.ball_query.padding", description: "Unfilled slots: first_found (mmcv/PointNet++) or minus_one (PyTorch3D).", range: None, choices: &["first_found", "minus_one"] },
    KeyInfo { key: "detect.enabled", description: "Run the detector: ground, clusters, boxes, NMS (outputs ~/detections, ~/clusters, ~/markers, ~/detections_3d).", range: None, choices: &[] },
    KeyInfo { key: "detect.range_m", description: "Half side in metres of the square around the sensor that is segmented and clustered; points outside are out of range (counted).", range: Some((1e-3, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.ground.cell_m", description: "Ground cell side in metres.", range: Some((1e-3, 100.0)), choices: &[] },
    KeyInfo { key: "detect.ground.window_cells", description: "Cells on each side whose lowest points bound a cell's ground level.", range: Some((0.0, 64.0)), choices: &[] },
    KeyInfo { key: "detect.ground.max_slope", description: "Steepest ground slope (rise over run) followed from cell to cell.", range: Some((1e-6, 10.0)), choices: &[] },
    KeyInfo { key: "detect.ground.height_tol_m", description: "Points at most this many metres above the ground level are ground.", range: Some((1e-6, 100.0)), choices: &[] },
    KeyInfo { key: "detect.ground.max_height_m", description: "Points more than this many metres above the ground level are overhead, not clustered; > height_tol_m.", range: Some((1e-6, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.cluster.cell_m", description: "Cluster cell side in metres: object points in touching cells are one cluster.", range: Some((1e-3, 100.0)), choices: &[] },
    KeyInfo { key: "detect.cluster.min_points", description: "Fewest points of a cluster that gets a box.", range: Some((1.0, U32_MAX)), choices: &[] },
    KeyInfo { key: "detect.cluster.max_points", description: "Most points of a cluster that gets a box; >= min_points.", range: Some((1.0, U32_MAX)), choices: &[] },
    KeyInfo { key: "detect.boxes.angles", description: "Headings in [0, 90) degrees tried by the minimum-area box fit.", range: Some((1.0, 1024.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.max_length_m", description: "Boxes longer than this (metres) are dropped.", range: Some((1e-6, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.max_width_m", description: "Boxes wider than this (metres) are dropped.", range: Some((1e-6, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.min_height_m", description: "Boxes lower than this (metres) are dropped.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.score_half_points", description: "A cluster of this many points scores 0.5 (score = n / (n + this)).", range: Some((1e-6, 1e9)), choices: &[] },
    KeyInfo { key: "detect.boxes.end_on_length_m", description: "Length in metres a car seen end-on (car_end_on window) is completed to, behind its visible end; <= max_length_m and >= the car_end_on window's largest length and width.", range: Some((1e-6, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.car.length", description: "[min, max] box length in metres of a car.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.car.width", description: "[min, max] box width in metres of a car.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.car.height", description: "[min, max] box height in metres of a car.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.car.clearance", description: "[min, max] height in metres of a car's lowest point above the ground level.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.car_end_on.length", description: "[min, max] box length in metres of a car seen end-on (its rear or front only).", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.car_end_on.width", description: "[min, max] box width in metres of a car seen end-on (its rear or front only).", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.car_end_on.height", description: "[min, max] box height in metres of a car seen end-on (its rear or front only).", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.car_end_on.clearance", description: "[min, max] height in metres of the lowest point above the ground level of a car seen end-on.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.pedestrian.length", description: "[min, max] box length in metres of a pedestrian.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.pedestrian.width", description: "[min, max] box width in metres of a pedestrian.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.pedestrian.height", description: "[min, max] box height in metres of a pedestrian.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.pedestrian.clearance", description: "[min, max] height in metres of a pedestrian's lowest point above the ground level.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.cyclist.length", description: "[min, max] box length in metres of a cyclist.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.cyclist.width", description: "[min, max] box width in metres of a cyclist.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.cyclist.height", description: "[min, max] box height in metres of a cyclist.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.boxes.classes.cyclist.clearance", description: "[min, max] height in metres of a cyclist's lowest point above the ground level.", range: Some((0.0, 1000.0)), choices: &[] },
    KeyInfo { key: "detect.nms_iou", description: "Rotated BEV IoU above which the lower-scored of two boxes is dropped.", range: Some((0.0, 1.0)), choices: &[] },
    KeyInfo { key: "nms.kind", description: "axis_aligned (BEV IoU of axis-aligned boxes), rotated_bev (rotated BEV IoU) or circle (BEV centre distance).", range: None, choices: &["axis_aligned", "rotated_bev", "circle"] },
    KeyInfo { key: "nms.threshold", description: "IoU kinds: suppress when IoU > threshold, in (0, 1]; circle: centre distance in metres, > 0.", range: Some((1e-9, 1e4)), choices: &[] },
    KeyInfo { key: "nms.score_threshold", description: "Candidates have score >= this (-.inf: all).", range: None, choices: &[] },
    KeyInfo { key: "nms.pre_max_size", description: "Keep the top N candidates by score before NMS; 0 = all.", range: Some((0.0, I32_MAX)), choices: &[] },
    KeyInfo { key: "nms.post_max_size", description: "Return at most N boxes; 0 = all.", range: Some((0.0, I32_MAX)), choices: &[] },
    KeyInfo { key: "nms.class_aware", description: "true: boxes of different labels never suppress each other.", range: None, choices: &[] },
];

/// Keys of the configuration that are not node parameters (the NMS node's input is `boxes_in`).
const NOT_PARAMETERS: &[&str] = &["nms.boxes_topic"];

fn key_info(key: &str) -> Option<&'static KeyInfo> {
    KEYS.iter().find(|k| k.key == key)
}

/// f32 values widened to f64 print as 0.1599999964: keep the shortest f32 text instead.
fn tidy(v: f64) -> f64 {
    if v.is_finite() && (v as f32) as f64 == v {
        format!("{}", v as f32).parse().unwrap_or(v)
    } else {
        v
    }
}

/// A YAML leaf as a parameter value; `null` (an optional count) becomes 0.
fn to_param(v: &Value) -> Option<ParamValue> {
    Some(match v {
        Value::Bool(b) => ParamValue::Bool(*b),
        Value::Number(n) if n.is_i64() || n.is_u64() => ParamValue::Int(n.as_i64()?),
        Value::Number(n) => ParamValue::Double(tidy(n.as_f64()?)),
        Value::String(s) => ParamValue::Str(s.clone()),
        Value::Null => ParamValue::Int(0),
        Value::Sequence(items) if items.iter().all(|i| i.is_string()) && !items.is_empty() => {
            ParamValue::StringArray(items.iter().filter_map(|i| i.as_str().map(str::to_string)).collect())
        }
        Value::Sequence(items) if items.iter().all(|i| i.is_number()) => {
            ParamValue::DoubleArray(items.iter().filter_map(|i| i.as_f64().map(tidy)).collect())
        }
        _ => return None,
    })
}

/// A parameter value as the YAML the configuration expects (`nullable`: 0 means null).
fn to_yaml(v: &ParamValue, nullable: bool) -> Value {
    match v {
        ParamValue::Bool(b) => Value::Bool(*b),
        ParamValue::Int(0) if nullable => Value::Null,
        ParamValue::Int(i) => Value::Number((*i).into()),
        ParamValue::Double(d) => Value::Number((*d).into()),
        ParamValue::Str(s) => Value::String(s.clone()),
        ParamValue::DoubleArray(a) => Value::Sequence(a.iter().map(|&d| Value::Number(d.into())).collect()),
        ParamValue::StringArray(a) => Value::Sequence(a.iter().map(|s| Value::String(s.clone())).collect()),
    }
}

/// One configuration key declared as a parameter.
#[derive(Debug, Clone)]
struct KeyParam {
    spec: ParamSpec,
    nullable: bool,
    choices: &'static [&'static str],
}

/// The pipeline keys a node kind declares, from the default configuration's YAML tree.
fn key_params(kind: NodeKind) -> Vec<KeyParam> {
    let mut all = Vec::new();
    leaves(&PipelineConfig::default_tree(), "", &mut all);
    let forced: Vec<&str> = kind.forced().iter().map(|(k, _)| *k).collect();
    all.into_iter()
        .filter(|(key, _)| {
            let section = key.split('.').next().unwrap_or("");
            kind.sections().contains(&section)
                && !forced.contains(&key.as_str())
                && !NOT_PARAMETERS.contains(&key.as_str())
        })
        .filter_map(|(key, v)| {
            let default = match (key.as_str(), to_param(&v)?) {
                // `features: []` has no element type: it is a string array.
                ("features", ParamValue::DoubleArray(a)) if a.is_empty() => ParamValue::StringArray(vec![]),
                (_, p) => p,
            };
            let info = key_info(&key);
            let mut description = info.map_or_else(
                || format!("Pipeline configuration key '{key}' (see config/pipeline.yaml)."),
                |i| i.description.to_string(),
            );
            let choices = info.map_or(&[][..], |i| i.choices);
            if !choices.is_empty() {
                description.push_str(&format!(" One of: {}.", choices.join(", ")));
            }
            let spec = ParamSpec::with_value(&key, default, info.and_then(|i| i.range), &description);
            Some(KeyParam { spec, nullable: v.is_null(), choices })
        })
        .collect()
}

/// Builds a node's configuration from its parameters: the node kind's keys and the YAML tree of
/// `config_file` (read once, at start). Shared by `configure` and the parameter services, so a
/// value is refused at `set_parameters` by the same code that would refuse it at the next cloud.
#[derive(Debug, Clone)]
struct ConfigBuilder {
    kind: NodeKind,
    keys: Vec<KeyParam>,
    /// (label for messages, tree of `config_file` or an empty mapping).
    base: (String, Value),
}

impl ConfigBuilder {
    fn new(kind: NodeKind, keys: Vec<KeyParam>, config_file: &str) -> anyhow::Result<Self> {
        let tree = if config_file.is_empty() {
            Value::Mapping(Default::default())
        } else {
            let text = std::fs::read_to_string(config_file)
                .with_context(|| format!("parameter 'config_file': cannot read '{config_file}'"))?;
            let tree: Value =
                serde_yaml::from_str(&text).map_err(|e| anyhow!("parameter 'config_file' = '{config_file}': {e}"))?;
            match tree {
                Value::Null => Value::Mapping(Default::default()),
                Value::Mapping(_) => tree,
                _ => bail!("parameter 'config_file' = '{config_file}': not a YAML mapping"),
            }
        };
        let label = if config_file.is_empty() {
            "ROS parameters".to_string()
        } else {
            format!("{config_file} + ROS parameters")
        };
        Ok(Self { kind, keys, base: (label, tree) })
    }

    /// The defaults' YAML tree with `config_file`'s tree merged over it, the explicitly given
    /// parameters over that, the node kind's switches, then [`PipelineConfig::from_tree`]
    /// (unknown keys and invalid values are refused by key).
    fn build(&self, params: &Params) -> anyhow::Result<PipelineConfig> {
        let (label, mut tree) = self.base.clone();
        for k in &self.keys {
            let name = &k.spec.name;
            if !params.is_explicit(name) {
                continue;
            }
            let Some(v) = params.get(name) else { continue };
            match (v, &k.spec.default) {
                (ParamValue::Str(s), _) if !k.choices.is_empty() && !k.choices.contains(&s.as_str()) => {
                    bail!("parameter '{name}' = {s:?} is not one of {}", k.choices.join(", "))
                }
                (ParamValue::DoubleArray(a), ParamValue::DoubleArray(d)) if !d.is_empty() && a.len() != d.len() => {
                    bail!("parameter '{name}' needs {} values, got {} ({v})", d.len(), a.len())
                }
                _ => {}
            }
            set_path(&mut tree, name, to_yaml(v, k.nullable));
        }
        for (key, yaml) in self.kind.forced() {
            set_path(&mut tree, key, serde_yaml::from_str(yaml).expect("static YAML value"));
        }
        PipelineConfig::from_tree(tree, &label).map_err(|e| match e {
            // Name the parameter as it is declared: `neighbors.ball_query.min_radius`.
            ConfigError::Invalid { section, error, .. } => {
                anyhow!("parameter '{section}.{}' = {}: must be {} ({label})", error.key, error.value, error.allowed)
            }
            e => anyhow!("{e}"),
        })
    }
}

/// The pipeline as a node stage.
pub struct PipelineStage {
    kind: NodeKind,
    keys: Vec<KeyParam>,
    /// Set by the first `configure` (it reads `config_file`).
    builder: Option<ConfigBuilder>,
    pipeline: Option<Pipeline>,
    backend: String,
    frames: u64,
    last: Vec<(String, String)>,
    stats_cache: Vec<(String, String)>,
    stats_at: Option<Instant>,
}

impl PipelineStage {
    pub fn new(kind: NodeKind) -> Self {
        Self {
            kind,
            keys: key_params(kind),
            builder: None,
            pipeline: None,
            backend: String::new(),
            frames: 0,
            last: Vec::new(),
            stats_cache: Vec::new(),
            stats_at: None,
        }
    }

    pub fn kind(&self) -> NodeKind {
        self.kind
    }

    /// The configuration in effect (after a successful `configure`).
    pub fn config(&self) -> Option<&PipelineConfig> {
        self.pipeline.as_ref().map(|p| &p.config)
    }

    /// The configuration these parameters give (`config_file` is read on the first call).
    pub fn build_config(&mut self, params: &Params) -> anyhow::Result<PipelineConfig> {
        if self.builder.is_none() {
            let file = params.str("config_file").unwrap_or("");
            self.builder = Some(ConfigBuilder::new(self.kind, self.keys.clone(), file)?);
        }
        self.builder.as_ref().expect("set above").build(params)
    }
}

impl Stage for PipelineStage {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn params(&self) -> Vec<ParamSpec> {
        let mut specs = vec![
            ParamSpec::string(
                "backend",
                "auto",
                "auto: CUDA when a driver, NVRTC and a GPU are present, else the CPU reference (logged); cuda: CUDA \
                 or the node stops with what is missing; cpu: the CPU reference. One of: auto, cuda, cpu.",
            )
            .read_only(),
            ParamSpec::string(
                "target",
                "auto",
                "GPU kernel profile: auto (from the device: sm_72 xavier, sm_87 orin, else x86_64), orin, xavier, \
                 x86_64, or a profile YAML path. Ignored on the CPU backend.",
            )
            .read_only(),
            ParamSpec::string(
                "config_file",
                "",
                "Pipeline YAML (config/pipeline.yaml format) loaded first; parameters given explicitly override its \
                 keys. Empty: the built-in defaults.",
            )
            .read_only(),
        ];
        specs.extend(self.keys.iter().map(|k| k.spec.clone()));
        specs
    }

    fn input_topic(&self) -> &str {
        if self.kind == NodeKind::Nms {
            "boxes_in"
        } else {
            "points"
        }
    }

    fn outputs(&self) -> Vec<OutputSpec> {
        self.kind
            .topics()
            .iter()
            .map(|&t| match t {
                MARKERS_TOPIC => OutputSpec::new(&format!("~/{t}"), MARKER_ARRAY_TYPE),
                // vision_msgs is not in every ROS environment (not in the PyPI wheels): without its
                // type support the node runs without this topic and says so once.
                DETECTIONS_3D_TOPIC => OutputSpec::optional(&format!("~/{t}"), DETECTION_3D_ARRAY_TYPE),
                _ => OutputSpec::new(&format!("~/{t}"), POINTCLOUD2_TYPE),
            })
            .collect()
    }

    fn configure(&mut self, params: &Params) -> anyhow::Result<()> {
        let cfg = self.build_config(params)?;
        match &mut self.pipeline {
            Some(p) => p.config = cfg,
            None => {
                let b = params.str("backend").unwrap_or("auto");
                let kind: BackendKind = b.parse().map_err(|e: String| anyhow!("parameter 'backend': {e}"))?;
                let target = params.str("target").unwrap_or("auto");
                let profile: ProfileChoice = target.parse().expect("infallible");
                let engine = Engine::select(kind, profile).map_err(|e| anyhow!("parameter 'backend' = '{b}': {e}"))?;
                self.backend = engine.describe();
                if kind == BackendKind::Auto && matches!(engine, Engine::Cpu(_)) {
                    self.backend = "cpu (backend auto: no usable CUDA driver/NVRTC/GPU here)".into();
                }
                eprintln!("[{}] backend: {}", self.kind.name(), self.backend);
                self.pipeline = Some(Pipeline::with_engine(cfg, engine));
            }
        }
        self.stats_at = None;
        Ok(())
    }

    fn validator(&self) -> Option<Validator> {
        let builder = self.builder.clone()?;
        Some(Box::new(move |params: &Params| builder.build(params).map(|_| ())))
    }

    fn effective_params(&self) -> Vec<(String, ParamValue)> {
        let Some(cfg) = self.config() else { return Vec::new() };
        let Ok(tree) = serde_yaml::to_value(cfg) else { return Vec::new() };
        let mut all = Vec::new();
        leaves(&tree, "", &mut all);
        all.into_iter()
            .filter_map(|(key, v)| {
                let k = self.keys.iter().find(|k| k.spec.name == key)?;
                let p = match (to_param(&v)?, &k.spec.default) {
                    (ParamValue::DoubleArray(a), ParamValue::StringArray(_)) if a.is_empty() => {
                        ParamValue::StringArray(vec![])
                    }
                    (ParamValue::Int(i), ParamValue::Double(_)) => ParamValue::Double(i as f64),
                    (p, _) => p,
                };
                Some((key, p))
            })
            .collect()
    }

    fn process(&mut self, input: &Input<'_>) -> anyhow::Result<Vec<Output>> {
        let p = self.pipeline.as_mut().ok_or_else(|| anyhow!("not configured"))?;
        let mut out = Vec::new();
        self.last.clear();
        if self.kind == NodeKind::Nms {
            let kept = p.process_boxes(input.view)?;
            out.push((format!("~/{BOXES_TOPIC}"), kept.message().into_cdr()));
            out.push((
                format!("~/{MARKERS_TOPIC}"),
                markers_cdr(&kept.header, &kept.boxes, &kept.labels, MARKER_NS).into(),
            ));
            self.last.push(("last.boxes_in".into(), kept.nms.candidates.to_string()));
            self.last.push(("last.boxes_kept".into(), kept.nms.keep.len().to_string()));
        } else {
            let frame = p.process(input.view.clone())?;
            let topics = self.kind.topics();
            self.last.push(("last.points".into(), frame.results.points.to_string()));
            let typed = frame.typed_messages();
            // The messages' CDR bytes move to the publishers (a copy of ~17 MB a frame otherwise).
            for (topic, msg) in frame.messages {
                if topics.contains(&topic) {
                    self.last.push((format!("last.{topic}"), msg.num_points().to_string()));
                    out.push((format!("~/{topic}"), msg.into_cdr()));
                }
            }
            if let Some(d) = &frame.results.detections {
                self.last.push(("last.clusters".into(), d.clusters.len().to_string()));
                self.last.push(("last.boxes_kept".into(), d.keep.len().to_string()));
            }
            for (topic, _, cdr) in typed {
                if topics.contains(&topic) {
                    out.push((format!("~/{topic}"), cdr.into()));
                }
            }
        }
        self.frames += 1;
        self.refresh_stats();
        Ok(out)
    }

    fn stats(&self) -> Vec<(String, String)> {
        let mut kv = vec![
            ("stage".to_string(), self.kind.name().to_string()),
            ("backend".to_string(), self.backend.clone()),
            ("frames".to_string(), self.frames.to_string()),
        ];
        kv.extend(self.last.iter().cloned());
        kv.extend(self.stats_cache.iter().cloned());
        kv
    }
}

impl PipelineStage {
    /// Refreshes the cached pipeline statistics (per-stage p50/p99) at most once a second, and
    /// keeps the latency samples to a recent window.
    pub fn refresh_stats(&mut self) {
        if self.stats_at.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        if let Some(p) = &mut self.pipeline {
            if p.stats.stages.values().any(|s| s.len() > 4096) {
                p.stats.stages.clear();
            }
            self.stats_cache = p.stats.key_values().into_iter().map(|(k, v)| (format!("pipeline.{k}"), v)).collect();
        }
        self.stats_at = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(stage: &PipelineStage, set: &[(&str, ParamValue)]) -> Params {
        let mut p = Params::default();
        for s in stage.params() {
            p.values.insert(s.name.clone(), s.default.clone());
        }
        for (k, v) in set {
            p.values.insert(k.to_string(), v.clone());
            p.explicit.insert(k.to_string());
        }
        p
    }

    #[test]
    fn marker_array_definition_is_complete() {
        let d = crate::bag::msgdefs::full_definition(MARKER_ARRAY_TYPE).unwrap();
        for t in [
            "MSG: visualization_msgs/Marker",
            "MSG: geometry_msgs/Pose",
            "MSG: sensor_msgs/CompressedImage",
            "MSG: visualization_msgs/MeshFile",
        ] {
            assert!(d.contains(t), "{t}");
        }
    }

    #[test]
    fn every_node_declares_its_keys() {
        let s = PipelineStage::new(NodeKind::Pipeline);
        let names: Vec<String> = s.params().into_iter().map(|p| p.name).collect();
        for n in [
            "backend",
            "target",
            "config_file",
            "features",
            "voxelize.max_voxels",
            "voxelize.voxel_size",
            "fps.enabled",
            "neighbors.ball_query.radius",
            "neighbors.knn.k",
        ] {
            assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
        }
        assert!(!names.iter().any(|x| x.starts_with("nms.")));
        let nms: Vec<String> = PipelineStage::new(NodeKind::Nms).params().into_iter().map(|p| p.name).collect();
        assert!(nms.contains(&"nms.pre_max_size".to_string()) && !nms.contains(&"nms.enabled".to_string()));
        let vs = s.params().into_iter().find(|p| p.name == "voxelize.voxel_size").unwrap();
        assert_eq!(vs.default, ParamValue::DoubleArray(vec![0.16, 0.16, 10.0]));
    }

    #[test]
    fn parameters_overlay_the_file_and_errors_name_the_key() {
        let dir = std::env::temp_dir().join(format!("lk_ros_cfg_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.yaml");
        std::fs::write(&file, "fps:\n  num_samples: 100\nvoxelize:\n  max_voxels: 7\n").unwrap();
        let mut s = PipelineStage::new(NodeKind::Sampler);
        let p = params(
            &s,
            &[("config_file", ParamValue::Str(file.display().to_string())), ("fps.start_index", ParamValue::Int(3))],
        );
        let cfg = s.build_config(&p).unwrap();
        assert_eq!((cfg.fps.params.num_samples, cfg.fps.params.start_index), (100, 3));
        assert_eq!(cfg.voxelize.params.max_voxels, 7);
        assert!(!cfg.voxelize.enabled && cfg.fps.enabled && !cfg.neighbors.enabled);

        let mut s = PipelineStage::new(NodeKind::Neighbors);
        let p = params(&s, &[("neighbors.ball_query.min_radius", ParamValue::Double(5.0))]);
        let e = s.build_config(&p).unwrap_err().to_string();
        assert!(e.contains("parameter 'neighbors.ball_query.min_radius' = 5"), "{e}");

        let mut s = PipelineStage::new(NodeKind::Pipeline);
        let p = params(&s, &[("voxelize.voxel_size", ParamValue::DoubleArray(vec![0.1, 0.1]))]);
        assert!(s.build_config(&p).unwrap_err().to_string().contains("voxelize.voxel_size"));
        let p = params(&s, &[("voxelize.mode", ParamValue::Str("soft".into()))]);
        assert!(s.build_config(&p).unwrap_err().to_string().contains("voxelize.mode"));

        let mut s = PipelineStage::new(NodeKind::Nms);
        let p = params(&s, &[("nms.post_max_size", ParamValue::Int(5)), ("backend", ParamValue::Str("cpu".into()))]);
        s.configure(&p).unwrap();
        assert_eq!(s.config().unwrap().nms.params.post_max_size, Some(5));
        assert_eq!(s.config().unwrap().nms.params.pre_max_size, None);
        let eff = s.effective_params();
        assert!(eff.contains(&("nms.post_max_size".to_string(), ParamValue::Int(5))));
        assert!(eff.contains(&("nms.pre_max_size".to_string(), ParamValue::Int(0))));
    }
}
