//! rosbag2 bags without ROS: reading MCAP and sqlite3 storage, writing MCAP.
//!
//! - [`open`] takes a `.mcap` file, a `.db3` file or a bag folder (with `metadata.yaml`, whose
//!   `relative_file_paths` are read in order) and returns a [`BagReader`].
//! - [`BagReader::messages`] streams [`BagMessage`]s (raw CDR bytes) file by file: MCAP files are
//!   read with buffered `read` calls through the MCAP crate's sans-io reader (no mmap, one chunk in
//!   memory at a time); sqlite3 files are paged 16 messages per query.
//! - [`McapBagWriter`] writes MCAP bags (profile `ros2`, schemas `ros2msg`, messages `cdr`), as a
//!   single file or as a bag folder with `metadata.yaml` (format version 8, as ROS 2 Jazzy writes).
//! - [`sample`] builds the bundled sample bag from the Ouster scans in `data/ouster`.

mod mcap_read;
mod metadata;
pub mod msgdefs;
mod reader;
pub mod sample;
mod sqlite;
mod writer;

use std::path::{Path, PathBuf};

use crate::cloud::{CloudError, PointCloud2};

pub use metadata::{BagInfo, FileInfo, TopicMetadata, TopicWithCount, METADATA_FILE, METADATA_VERSION};
pub use reader::{open, BagReader, Messages};
pub use writer::{McapBagWriter, TopicHandle, WriterOptions, DEFAULT_QOS_PROFILES};

/// Storage plugin of a bag file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    Mcap,
    Sqlite3,
}

impl Storage {
    /// The rosbag2 `storage_identifier`.
    pub fn identifier(self) -> &'static str {
        match self {
            Storage::Mcap => "mcap",
            Storage::Sqlite3 => "sqlite3",
        }
    }
}

/// A topic recorded in the bag (merged over all files of the bag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    /// ROS type name, e.g. `sensor_msgs/msg/PointCloud2`.
    pub type_name: String,
    /// `cdr` for every bag a ROS 2 recorder writes.
    pub serialization_format: String,
    pub message_count: u64,
    /// The YAML QoS text rosbag2 stored with the topic (empty when none).
    pub offered_qos_profiles: String,
}

/// One recorded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BagMessage {
    pub topic: String,
    pub type_name: String,
    /// Receive time as rosbag2 logged it (nanoseconds since the epoch).
    pub log_time_ns: u64,
    /// Serialized message (CDR with its 4-byte encapsulation header).
    pub data: Vec<u8>,
}

impl BagMessage {
    /// Fails with [`BagError::WrongType`] unless the message has type `type_name`.
    pub fn expect_type(&self, type_name: &str) -> Result<&[u8], BagError> {
        if self.type_name != type_name {
            return Err(BagError::WrongType {
                location: format!("message at log time {} ns", self.log_time_ns),
                topic: self.topic.clone(),
                expected: type_name.to_string(),
                found: self.type_name.clone(),
            });
        }
        Ok(&self.data)
    }

    /// Decodes the message as a `sensor_msgs/msg/PointCloud2` (checking the type first).
    pub fn point_cloud(&self) -> Result<PointCloud2<'_>, BagError> {
        let bytes = self.expect_type(crate::cloud::POINTCLOUD2_TYPE)?;
        PointCloud2::from_cdr(bytes).map_err(|source| BagError::Decode {
            topic: self.topic.clone(),
            log_time_ns: self.log_time_ns,
            type_name: self.type_name.clone(),
            source,
        })
    }
}

/// Everything that can go wrong reading or writing a bag. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum BagError {
    #[error("{}: no such file or directory", .path.display())]
    NotFound { path: PathBuf },
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a rosbag2 bag: {reason}", .path.display())]
    UnknownStorage { path: PathBuf, reason: String },
    #[error("{}: unsupported: {what}", .path.display())]
    Unsupported { path: PathBuf, what: String },
    #[error("{}: invalid metadata: {reason}", .path.display())]
    Metadata { path: PathBuf, reason: String },
    /// A truncated or damaged file. `offset` is how far into the file reading got.
    #[error("{}: corrupt or truncated {storage} file (read {offset} of {size} bytes): {reason}", .path.display())]
    Corrupt { path: PathBuf, storage: &'static str, offset: u64, size: u64, reason: String },
    /// Damage read around, not the end of the messages: what was skipped and what is read instead.
    #[error("{}: damaged {storage} file: {what}", .path.display())]
    Skipped { path: PathBuf, storage: &'static str, what: String },
    #[error("{}: sqlite3: {source}", .path.display())]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{}: topic '{topic}' not found; available topics: {available}", .path.display())]
    TopicNotFound { path: PathBuf, topic: String, available: String },
    #[error("{location}: topic '{topic}' has type {found}, expected {expected}")]
    WrongType { location: String, topic: String, expected: String, found: String },
    #[error("message on '{topic}' at log time {log_time_ns} ns is not a valid {type_name}: {source}")]
    Decode {
        topic: String,
        log_time_ns: u64,
        type_name: String,
        #[source]
        source: CloudError,
    },
    #[error("{}: no message definition for type {type_name} (known: {known}); use add_topic_with_definition", .path.display())]
    UnknownType { path: PathBuf, type_name: String, known: String },
    #[error("{}: {reason}", .path.display())]
    Write { path: PathBuf, reason: String },
}

impl BagError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            BagError::NotFound { path: path.to_path_buf() }
        } else {
            BagError::Io { path: path.to_path_buf(), source }
        }
    }
}

/// "a (type, n msgs), b (type, n msgs)" or "(none)".
pub(crate) fn describe_topics(topics: &[TopicInfo]) -> String {
    if topics.is_empty() {
        return "(none)".into();
    }
    topics
        .iter()
        .map(|t| format!("{} ({}, {} msgs)", t.name, t.type_name, t.message_count))
        .collect::<Vec<_>>()
        .join(", ")
}
