//! rosbag2's `metadata.yaml` (`rosbag2_bagfile_information`).
//!
//! Reading accepts every version rosbag2 has written (1..=9): only `storage_identifier` and
//! `relative_file_paths` are required. Writing produces version 8, the format of ROS 2 Jazzy
//! (QoS profiles as a YAML string with numeric enums, `type_description_hash`, `ros_distro`).

use serde::{Deserialize, Serialize};
use std::path::Path;

use super::BagError;

pub const METADATA_FILE: &str = "metadata.yaml";
/// The version [`BagInfo`]s are written with (ROS 2 Jazzy).
pub const METADATA_VERSION: u32 = 8;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MetadataFile {
    rosbag2_bagfile_information: BagInfo,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Nanoseconds {
    pub nanoseconds: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct NanosecondsSinceEpoch {
    pub nanoseconds_since_epoch: u64,
}

/// The `rosbag2_bagfile_information` map, fields in the order rosbag2 writes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BagInfo {
    #[serde(default)]
    pub version: u32,
    pub storage_identifier: String,
    #[serde(default)]
    pub duration: Nanoseconds,
    #[serde(default)]
    pub starting_time: NanosecondsSinceEpoch,
    #[serde(default)]
    pub message_count: u64,
    #[serde(default)]
    pub topics_with_message_count: Vec<TopicWithCount>,
    #[serde(default)]
    pub compression_format: String,
    #[serde(default)]
    pub compression_mode: String,
    pub relative_file_paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileInfo>,
    #[serde(default)]
    pub custom_data: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ros_distro: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicWithCount {
    pub topic_metadata: TopicMetadata,
    #[serde(default)]
    pub message_count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicMetadata {
    pub name: String,
    #[serde(rename = "type")]
    pub type_name: String,
    #[serde(default)]
    pub serialization_format: String,
    /// Version <= 8: a YAML string; version 9: a list. Kept as YAML either way.
    #[serde(default)]
    pub offered_qos_profiles: serde_yaml::Value,
    #[serde(default)]
    pub type_description_hash: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileInfo {
    pub path: String,
    pub starting_time: NanosecondsSinceEpoch,
    pub duration: Nanoseconds,
    pub message_count: u64,
}

impl BagInfo {
    /// Reads and parses `dir/metadata.yaml`.
    pub fn read(dir: &Path) -> Result<Self, BagError> {
        let path = dir.join(METADATA_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| BagError::io(&path, e))?;
        Self::parse(&text).map_err(|reason| BagError::Metadata { path, reason })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let file: MetadataFile = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        let info = file.rosbag2_bagfile_information;
        if info.relative_file_paths.is_empty() {
            return Err("relative_file_paths is empty".into());
        }
        Ok(info)
    }

    /// The whole `metadata.yaml` text.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(&MetadataFile { rosbag2_bagfile_information: self.clone() }).expect("metadata serializes")
    }

    /// The inner map only, as rosbag2 stores it in the MCAP `rosbag2` metadata record.
    pub fn to_inner_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("metadata serializes")
    }

    /// Writes `dir/metadata.yaml`.
    pub fn write(&self, dir: &Path) -> Result<(), BagError> {
        let path = dir.join(METADATA_FILE);
        std::fs::write(&path, self.to_yaml()).map_err(|e| BagError::io(&path, e))
    }
}

impl TopicMetadata {
    /// The QoS YAML as text (a version-9 list is re-serialized).
    pub fn qos_text(&self) -> String {
        match &self.offered_qos_profiles {
            serde_yaml::Value::Null => String::new(),
            serde_yaml::Value::String(s) => s.clone(),
            other => serde_yaml::to_string(other).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JAZZY: &str = r#"rosbag2_bagfile_information:
  version: 8
  storage_identifier: mcap
  duration:
    nanoseconds: 200000000
  starting_time:
    nanoseconds_since_epoch: 1700000000000000000
  message_count: 3
  topics_with_message_count:
    - topic_metadata:
        name: /ouster/points
        type: sensor_msgs/msg/PointCloud2
        serialization_format: cdr
        offered_qos_profiles: "- history: 3\n  depth: 0\n  reliability: 1\n  durability: 2\n  deadline:\n    sec: 9223372036\n    nsec: 854775807\n  lifespan:\n    sec: 9223372036\n    nsec: 854775807\n  liveliness: 1\n  liveliness_lease_duration:\n    sec: 9223372036\n    nsec: 854775807\n  avoid_ros_namespace_conventions: false"
        type_description_hash: RIHS01_abc
      message_count: 3
  compression_format: ""
  compression_mode: ""
  relative_file_paths:
    - bag_0.mcap
  files:
    - path: bag_0.mcap
      starting_time:
        nanoseconds_since_epoch: 1700000000000000000
      duration:
        nanoseconds: 200000000
      message_count: 3
  custom_data: ~
  ros_distro: jazzy
"#;

    #[test]
    fn parses_jazzy_metadata_and_round_trips() {
        let info = BagInfo::parse(JAZZY).unwrap();
        assert_eq!(info.version, 8);
        assert_eq!(info.relative_file_paths, ["bag_0.mcap"]);
        assert_eq!(info.topics_with_message_count[0].message_count, 3);
        assert!(info.topics_with_message_count[0].topic_metadata.qos_text().contains("depth: 0"));
        let again = BagInfo::parse(&info.to_yaml()).unwrap();
        assert_eq!(again, info);
    }

    #[test]
    fn parses_old_minimal_metadata() {
        let text = "rosbag2_bagfile_information:\n  version: 3\n  storage_identifier: sqlite3\n  relative_file_paths:\n    - old/old_0.db3\n";
        let info = BagInfo::parse(text).unwrap();
        assert_eq!(info.storage_identifier, "sqlite3");
        assert!(BagInfo::parse("foo: 1").is_err());
    }
}
