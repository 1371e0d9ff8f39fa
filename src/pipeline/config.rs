//! The pipeline configuration (YAML, serde_yaml). Every key has a default; unknown keys and values
//! out of range are refused with the key's full path and the allowed range.
//!
//! serde ignores `deny_unknown_fields` through `flatten`, so unknown keys are found by comparing
//! the input's keys with those of the parsed config serialized back.

use crate::ops::fps::FpsParams;
use crate::ops::neighbors::{BallQueryParams, KnnParams};
use crate::ops::nms::{NmsKind, NmsParams};
use crate::ops::voxel::{HardVoxelParams, VoxelGrid};
use crate::ops::{ParamError, Validate};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config {path}: {source}")]
    Parse { path: String, source: serde_yaml::Error },
    #[error("config {path}: unknown key '{key}'")]
    UnknownKey { path: String, key: String },
    #[error("config {path}: {section}.{source}")]
    Invalid { path: String, section: &'static str, source: ParamError },
}

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
    #[serde(flatten)]
    pub params: FpsParams,
}

impl Default for FpsStage {
    fn default() -> Self {
        Self { enabled: true, params: FpsParams { num_samples: 4096, start_index: 0 } }
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
            nms: NmsStage::default(),
        }
    }
}

impl PipelineConfig {
    pub fn from_yaml(text: &str, path: &str) -> Result<Self, ConfigError> {
        let parse_err = |source| ConfigError::Parse { path: path.to_string(), source };
        let input: serde_yaml::Value = serde_yaml::from_str(text).map_err(parse_err)?;
        let cfg: Self = serde_yaml::from_value(input.clone()).map_err(parse_err)?;
        let known = serde_yaml::to_value(&cfg).map_err(parse_err)?;
        if let Some(key) = first_unknown_key(&input, &known, "") {
            return Err(ConfigError::UnknownKey { path: path.to_string(), key });
        }
        cfg.validate().map_err(|(section, source)| ConfigError::Invalid { path: path.to_string(), section, source })?;
        Ok(cfg)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: p.clone(), source })?;
        Self::from_yaml(&text, &p)
    }

    /// Validates every stage, enabled or not, so a config cannot hide a bad value behind a switch.
    pub fn validate(&self) -> Result<(), (&'static str, ParamError)> {
        self.voxelize.params.validate().map_err(|e| ("voxelize", e))?;
        self.downsample.grid.validate().map_err(|e| ("downsample", e))?;
        self.fps.params.validate().map_err(|e| ("fps", e))?;
        self.neighbors.knn.validate().map_err(|e| ("neighbors.knn", e))?;
        self.neighbors.ball_query.validate().map_err(|e| ("neighbors.ball_query", e))?;
        self.nms.params.validate().map_err(|e| ("nms", e))?;
        Ok(())
    }
}

/// The first key path present in `input` but not in `known` (the parsed config written back).
fn first_unknown_key(input: &serde_yaml::Value, known: &serde_yaml::Value, prefix: &str) -> Option<String> {
    let (serde_yaml::Value::Mapping(input), serde_yaml::Value::Mapping(known)) = (input, known) else {
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
