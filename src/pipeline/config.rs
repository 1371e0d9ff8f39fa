//! The pipeline configuration (YAML, serde_yaml). Every key is optional: the input's tree is merged
//! over the defaults' tree (mappings key by key, anything else replaces), so a partial section keeps
//! the defaults of the keys it leaves out. Unknown keys, values of the wrong type, values out of
//! range and stage combinations that cannot run are refused with the key's full path, once.
//!
//! serde ignores `deny_unknown_fields` through `flatten`, so unknown keys are found by comparing
//! the input's keys with the defaults' tree.

use super::stages::{self, StageRuleError};
use crate::ops::detect::DetectParams;
use crate::ops::fps::FpsParams;
use crate::ops::neighbors::{BallQueryParams, KnnParams};
use crate::ops::nms::{NmsKind, NmsParams};
use crate::ops::voxel::{FeaturesDtype, HardVoxelParams, VoxelGrid};
use crate::ops::{ParamError, Validate};
use serde::{Deserialize, Serialize};
use serde_yaml::Value;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {message}")]
    Read { path: String, message: String },
    #[error("config {path}: {message}")]
    Parse { path: String, message: String },
    #[error("config {path}: unknown key '{key}'")]
    UnknownKey { path: String, key: String },
    #[error("config {path}: {key}: {message}")]
    BadValue { path: String, key: String, message: String },
    #[error("config {path}: invalid parameter {section}.{} = {}: {}", error.key, error.value, error.allowed)]
    Invalid { path: String, section: &'static str, error: ParamError },
    #[error("config {path}: {rule}")]
    Stages { path: String, rule: StageRuleError },
}

/// Largest `neighbors.knn.k` and `neighbors.ball_query.nsample` of a pipeline configuration.
pub const MAX_NEIGHBORS: usize = 65536;

/// Which voxelization the `voxelize` stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum VoxelMode {
    /// Fixed-capacity voxels [V, P, C] (PointPillars / mmcv hard voxelization).
    #[default]
    Hard,
    /// Per-point voxel coordinates and per-voxel means (scatter mean).
    Dynamic,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VoxelizeStage {
    pub enabled: bool,
    pub mode: VoxelMode,
    /// The datatype of the published `voxel_features` (hard mode).
    pub features_dtype: FeaturesDtype,
    #[serde(flatten)]
    pub params: HardVoxelParams,
}

impl Default for VoxelizeStage {
    fn default() -> Self {
        // PointPillars-style pillars over a 360-degree scan (the W1 benchmark configuration).
        let grid =
            VoxelGrid { voxel_size: [0.16, 0.16, 10.0], point_cloud_range: [-51.2, -51.2, -5.0, 51.2, 51.2, 5.0] };
        Self {
            enabled: true,
            mode: VoxelMode::Hard,
            features_dtype: FeaturesDtype::Float32,
            params: HardVoxelParams { grid, max_points_per_voxel: 32, max_voxels: 60000 },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DownsampleStage {
    pub enabled: bool,
    #[serde(flatten)]
    pub grid: VoxelGrid,
}

impl Default for DownsampleStage {
    fn default() -> Self {
        Self {
            enabled: true,
            grid: VoxelGrid {
                voxel_size: [0.2, 0.2, 0.2],
                point_cloud_range: [-100.0, -100.0, -10.0, 100.0, 100.0, 10.0],
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FpsStage {
    pub enabled: bool,
    /// The cloud FPS samples from; the neighbourhoods are searched in the same cloud.
    pub input: FpsInput,
    #[serde(flatten)]
    pub params: FpsParams,
}

/// Which cloud the FPS stage (and with it the neighbour search) works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FpsInput {
    /// The gathered input cloud.
    #[default]
    Cloud,
    /// The voxel-grid downsampled cloud (PointNet++-style models); needs `downsample.enabled`.
    Downsampled,
}

impl Default for FpsStage {
    fn default() -> Self {
        Self { enabled: true, input: FpsInput::Cloud, params: FpsParams { num_samples: 4096, start_index: 0 } }
    }
}

/// Which neighbour search runs around the FPS samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NeighborMode {
    #[default]
    BallQuery,
    Knn,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NeighborsStage {
    pub enabled: bool,
    pub mode: NeighborMode,
    pub knn: KnnParams,
    pub ball_query: BallQueryParams,
}

impl Default for NeighborsStage {
    fn default() -> Self {
        Self {
            enabled: true,
            mode: NeighborMode::BallQuery,
            knn: KnnParams::default(),
            ball_query: BallQueryParams::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NmsStage {
    pub enabled: bool,
    /// Topic of incoming box records (PointCloud2 with x y z length width height yaw score label).
    pub boxes_topic: String,
    #[serde(flatten)]
    pub params: NmsParams,
}

impl Default for NmsStage {
    fn default() -> Self {
        Self {
            enabled: true,
            boxes_topic: "/detections/boxes".into(),
            params: NmsParams::new(NmsKind::RotatedBev, 0.5),
        }
    }
}

/// Objects from the cloud alone: ground segmentation, clustering, box fitting, NMS (`ops::detect`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DetectStage {
    pub enabled: bool,
    #[serde(flatten)]
    pub params: DetectParams,
}

impl Default for DetectStage {
    fn default() -> Self {
        Self { enabled: false, params: DetectParams::default() }
    }
}

/// The whole pipeline: which stages run and with what parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Channels after x, y, z carried into the voxel features (`intensity` matches any of its aliases).
    pub features: Vec<String>,
    pub voxelize: VoxelizeStage,
    pub downsample: DownsampleStage,
    pub fps: FpsStage,
    pub neighbors: NeighborsStage,
    pub detect: DetectStage,
    pub nms: NmsStage,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            features: vec!["intensity".into()],
            voxelize: VoxelizeStage::default(),
            downsample: DownsampleStage::default(),
            fps: FpsStage::default(),
            neighbors: NeighborsStage::default(),
            detect: DetectStage::default(),
            nms: NmsStage::default(),
        }
    }
}

impl PipelineConfig {
    /// Parses `text` (label `path` in errors) and merges it over the defaults.
    pub fn from_yaml(text: &str, path: &str) -> Result<Self, ConfigError> {
        let input: Value =
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string() })?;
        Self::from_tree(input, path)
    }

    /// A configuration from a YAML tree (a config file's, or the ROS parameters written into one):
    /// unknown keys refused, the tree merged over the defaults, then deserialized and validated.
    pub fn from_tree(input: Value, path: &str) -> Result<Self, ConfigError> {
        let input = match input {
            Value::Null => Value::Mapping(Default::default()),
            m @ Value::Mapping(_) => m,
            other => {
                return Err(ConfigError::Parse {
                    path: path.into(),
                    message: format!("expected a mapping of sections, found {}", yaml_kind(&other)),
                })
            }
        };
        let mut tree = Self::default_tree();
        if let Some(key) = first_unknown_key(&input, &tree, "") {
            return Err(ConfigError::UnknownKey { path: path.into(), key });
        }
        merge(&mut tree, input.clone());
        let cfg: Self = serde_yaml::from_value(tree).map_err(|e| {
            let (key, message) = bad_leaf(&input).unwrap_or_else(|| (String::new(), e.to_string()));
            ConfigError::BadValue { path: path.into(), key, message }
        })?;
        cfg.validate().map_err(|(section, error)| ConfigError::Invalid { path: path.into(), section, error })?;
        stages::check_rules(&cfg).map_err(|rule| ConfigError::Stages { path: path.into(), rule })?;
        Ok(cfg)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let p = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError::Read { path: p.clone(), message: e.to_string() })?;
        Self::from_yaml(&text, &p)
    }

    /// The defaults as a YAML tree: every key a configuration may have.
    pub fn default_tree() -> Value {
        serde_yaml::to_value(Self::default()).expect("the default configuration serializes")
    }

    /// Validates every stage, enabled or not, so a config cannot hide a bad value behind a switch.
    pub fn validate(&self) -> Result<(), (&'static str, ParamError)> {
        self.voxelize.params.validate().map_err(|e| ("voxelize", e))?;
        self.downsample.grid.validate().map_err(|e| ("downsample", e))?;
        self.fps.params.validate().map_err(|e| ("fps", e))?;
        self.neighbors.knn.validate().map_err(|e| ("neighbors.knn", e))?;
        self.neighbors.ball_query.validate().map_err(|e| ("neighbors.ball_query", e))?;
        // Every query gets a row of k (nsample) indices whatever the cloud holds, so the operators'
        // limit (2^31 - 1) let a config allocate hundreds of GB on the first frame. The nodes'
        // parameters stop at 65536 (src/ros/pipeline_stage.rs); a config file now does too.
        let width = |key: &str, v: usize| match v {
            1..=MAX_NEIGHBORS => Ok(()),
            _ => Err(ParamError::new(key, v, "1 ..= 65536")),
        };
        width("k", self.neighbors.knn.k).map_err(|e| ("neighbors.knn", e))?;
        width("nsample", self.neighbors.ball_query.nsample).map_err(|e| ("neighbors.ball_query", e))?;
        self.detect.params.validate().map_err(|e| ("detect", e))?;
        self.nms.params.validate().map_err(|e| ("nms", e))?;
        Ok(())
    }
}

fn yaml_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a sequence",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// Writes `over` onto `base`: mappings merge key by key, anything else replaces.
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// The first leaf of `input` that alone, written over the defaults, fails to deserialize: its
/// dotted path and serde's message. serde reports errors inside `flatten`ed structs at the
/// section, not the key, so the key is found by trying the leaves one by one (only on error).
fn bad_leaf(input: &Value) -> Option<(String, String)> {
    let mut all = Vec::new();
    leaves(input, "", &mut all);
    all.into_iter().find_map(|(key, value)| {
        let mut tree = PipelineConfig::default_tree();
        set_path(&mut tree, &key, value);
        serde_yaml::from_value::<PipelineConfig>(tree).err().map(|e| (key, e.to_string()))
    })
}

/// Every leaf of a YAML tree (sequences are leaves) as (dotted path, value).
pub fn leaves(v: &Value, prefix: &str, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Mapping(m) => {
            for (k, v) in m {
                let k = k.as_str().map_or_else(|| format!("{k:?}"), str::to_string);
                let path = if prefix.is_empty() { k } else { format!("{prefix}.{k}") };
                leaves(v, &path, out);
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}

/// Writes `value` at the dotted `path` of a YAML mapping, creating mappings on the way.
pub fn set_path(tree: &mut Value, path: &str, value: Value) {
    let mut node = tree;
    for part in path.split('.') {
        if !node.is_mapping() {
            *node = Value::Mapping(Default::default());
        }
        let map = node.as_mapping_mut().expect("mapping");
        let key = Value::String(part.to_string());
        if !map.contains_key(&key) {
            map.insert(key.clone(), Value::Null);
        }
        node = map.get_mut(&key).expect("inserted");
    }
    *node = value;
}

/// The first key path present in `input` but not in `known` (the defaults' tree).
fn first_unknown_key(input: &Value, known: &Value, prefix: &str) -> Option<String> {
    let (Value::Mapping(input), Value::Mapping(known)) = (input, known) else {
        return None;
    };
    input.iter().find_map(|(k, v)| {
        let name = k.as_str().map_or_else(|| format!("{k:?}"), str::to_string);
        let path = if prefix.is_empty() { name } else { format!("{prefix}.{name}") };
        match known.get(k) {
            None => Some(path),
            Some(kv) => first_unknown_key(v, kv, &path),
        }
    })
}
