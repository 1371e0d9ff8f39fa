//! Writing MCAP bags that ROS 2 tools read: header profile `ros2`, one `ros2msg` schema per type
//! with the complete message definition, channels with message encoding `cdr` and the
//! `offered_qos_profiles` metadata rosbag2 expects, a `rosbag2` metadata record, and, for a bag
//! folder, `metadata.yaml` (version 8, ROS 2 Jazzy).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::metadata::{
    BagInfo, FileInfo, Nanoseconds, NanosecondsSinceEpoch, TopicMetadata, TopicWithCount, METADATA_FILE,
    METADATA_VERSION,
};
use super::{msgdefs, BagError};

/// QoS stored with each topic when none is given: reliable, volatile, keep last 10 (the rclcpp
/// default), in rosbag2's version-8 YAML form (numeric enums, "infinite" durations).
pub const DEFAULT_QOS_PROFILES: &str = "- history: 1
  depth: 10
  reliability: 1
  durability: 2
  deadline:
    sec: 9223372036
    nsec: 854775807
  lifespan:
    sec: 9223372036
    nsec: 854775807
  liveliness: 1
  liveliness_lease_duration:
    sec: 9223372036
    nsec: 854775807
  avoid_ros_namespace_conventions: false";

/// Options of [`McapBagWriter`].
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// zstd chunk compression (what rosbag2's MCAP plugin does by default). Off: uncompressed chunks.
    pub compress: bool,
    /// Target chunk size in bytes (a larger message makes a chunk of its own).
    pub chunk_size: u64,
    /// QoS YAML stored for every topic.
    pub qos_profiles: String,
    /// `ros_distro` written to metadata.
    pub ros_distro: String,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            compress: true,
            chunk_size: 768 * 1024,
            qos_profiles: DEFAULT_QOS_PROFILES.to_string(),
            ros_distro: "jazzy".to_string(),
        }
    }
}

/// A topic added to a [`McapBagWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TopicHandle(usize);

struct WriterTopic {
    name: String,
    type_name: String,
    channel_id: u16,
    count: u64,
}

/// Writes one MCAP file, optionally inside a rosbag2 bag folder.
pub struct McapBagWriter {
    file_path: PathBuf,
    folder: Option<PathBuf>,
    writer: Option<mcap::Writer<BufWriter<File>>>,
    topics: Vec<WriterTopic>,
    bounds: Option<(u64, u64)>,
    options: WriterOptions,
}

impl McapBagWriter {
    /// A single `.mcap` file (no metadata.yaml).
    pub fn create(path: impl AsRef<Path>) -> Result<Self, BagError> {
        Self::create_with(path.as_ref(), None, WriterOptions::default())
    }

    /// A bag folder `dir` holding `dir/<dir name>_0.mcap` and, on [`Self::finish`], `metadata.yaml`.
    /// `dir` is created; it must not exist already unless empty.
    pub fn create_folder(dir: impl AsRef<Path>) -> Result<Self, BagError> {
        Self::create_folder_with(dir, WriterOptions::default())
    }

    pub fn create_folder_with(dir: impl AsRef<Path>, options: WriterOptions) -> Result<Self, BagError> {
        let dir = dir.as_ref();
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| BagError::Write { path: dir.to_path_buf(), reason: "bag folder needs a UTF-8 name".into() })?
            .to_string();
        if dir.exists() {
            let mut entries = std::fs::read_dir(dir).map_err(|e| BagError::io(dir, e))?;
            if entries.next().is_some() {
                return Err(BagError::Write {
                    path: dir.to_path_buf(),
                    reason: "bag folder already exists and is not empty".into(),
                });
            }
        }
        std::fs::create_dir_all(dir).map_err(|e| BagError::io(dir, e))?;
        let file = dir.join(format!("{name}_0.mcap"));
        Self::create_with(&file, Some(dir.to_path_buf()), options)
    }

    /// A single `.mcap` file with options.
    pub fn create_file_with(path: impl AsRef<Path>, options: WriterOptions) -> Result<Self, BagError> {
        Self::create_with(path.as_ref(), None, options)
    }

    fn create_with(path: &Path, folder: Option<PathBuf>, options: WriterOptions) -> Result<Self, BagError> {
        let file = File::create(path).map_err(|e| BagError::io(path, e))?;
        let compression = if options.compress { Some(mcap::Compression::Zstd) } else { None };
        let writer = mcap::WriteOptions::new()
            .profile("ros2")
            .library(concat!("lidar_kernels ", env!("CARGO_PKG_VERSION"), " (mcap-rs)"))
            .compression(compression)
            .chunk_size(Some(options.chunk_size))
            .create(BufWriter::with_capacity(1 << 20, file))
            .map_err(|e| Self::mcap_err(path, e))?;
        Ok(Self {
            file_path: path.to_path_buf(),
            folder,
            writer: Some(writer),
            topics: Vec::new(),
            bounds: None,
            options,
        })
    }

    fn mcap_err(path: &Path, e: mcap::McapError) -> BagError {
        match e {
            mcap::McapError::Io(io) => BagError::io(path, io),
            other => BagError::Write { path: path.to_path_buf(), reason: other.to_string() },
        }
    }

    fn writer(&mut self) -> &mut mcap::Writer<BufWriter<File>> {
        self.writer.as_mut().expect("writer is present until finish")
    }

    /// The `.mcap` file being written.
    pub fn file_path(&self) -> &Path {
        &self.file_path
    }

    /// Adds a topic whose type has a definition in [`msgdefs::MSG_FILES`]. Adding the same topic
    /// and type again returns the same handle.
    pub fn add_topic(&mut self, name: &str, type_name: &str) -> Result<TopicHandle, BagError> {
        let definition = msgdefs::full_definition(type_name).map_err(|missing| BagError::UnknownType {
            path: self.file_path.clone(),
            type_name: missing,
            known: msgdefs::known_types().collect::<Vec<_>>().join(", "),
        })?;
        self.add_topic_with_definition(name, type_name, "ros2msg", &definition)
    }

    /// Adds a topic with an explicit schema: `encoding` `ros2msg` (complete .msg text with
    /// dependencies) or `ros2idl`.
    pub fn add_topic_with_definition(
        &mut self,
        name: &str,
        type_name: &str,
        encoding: &str,
        definition: &str,
    ) -> Result<TopicHandle, BagError> {
        if let Some(i) = self.topics.iter().position(|t| t.name == name) {
            if self.topics[i].type_name == type_name {
                return Ok(TopicHandle(i));
            }
            return Err(BagError::Write {
                path: self.file_path.clone(),
                reason: format!("topic '{name}' already added with type {}, not {type_name}", self.topics[i].type_name),
            });
        }
        let path = self.file_path.clone();
        let schema_id = self
            .writer()
            .add_schema(type_name, encoding, definition.as_bytes())
            .map_err(|e| Self::mcap_err(&path, e))?;
        let mut metadata = BTreeMap::new();
        metadata.insert("offered_qos_profiles".to_string(), self.options.qos_profiles.clone());
        let channel_id =
            self.writer().add_channel(schema_id, name, "cdr", &metadata).map_err(|e| Self::mcap_err(&path, e))?;
        self.topics.push(WriterTopic {
            name: name.to_string(),
            type_name: type_name.to_string(),
            channel_id,
            count: 0,
        });
        Ok(TopicHandle(self.topics.len() - 1))
    }

    /// Writes one CDR-serialized message (log time = publish time = `log_time_ns`).
    pub fn write(&mut self, topic: TopicHandle, log_time_ns: u64, cdr: &[u8]) -> Result<(), BagError> {
        let Some(t) = self.topics.get_mut(topic.0) else {
            return Err(BagError::Write {
                path: self.file_path.clone(),
                reason: format!("unknown topic handle {}", topic.0),
            });
        };
        let header = mcap::records::MessageHeader {
            channel_id: t.channel_id,
            sequence: t.count as u32,
            log_time: log_time_ns,
            publish_time: log_time_ns,
        };
        t.count += 1;
        self.bounds = Some(match self.bounds {
            None => (log_time_ns, log_time_ns),
            Some((a, b)) => (a.min(log_time_ns), b.max(log_time_ns)),
        });
        let path = self.file_path.clone();
        self.writer().write_to_known_channel(&header, cdr).map_err(|e| Self::mcap_err(&path, e))
    }

    /// Messages written so far.
    pub fn message_count(&self) -> u64 {
        self.topics.iter().map(|t| t.count).sum()
    }

    fn bag_info(&self) -> BagInfo {
        let file_name = self.file_path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let (start, end) = self.bounds.unwrap_or((0, 0));
        let count = self.message_count();
        BagInfo {
            version: METADATA_VERSION,
            storage_identifier: "mcap".into(),
            duration: Nanoseconds { nanoseconds: end - start },
            starting_time: NanosecondsSinceEpoch { nanoseconds_since_epoch: start },
            message_count: count,
            topics_with_message_count: self
                .topics
                .iter()
                .map(|t| TopicWithCount {
                    topic_metadata: TopicMetadata {
                        name: t.name.clone(),
                        type_name: t.type_name.clone(),
                        serialization_format: "cdr".into(),
                        offered_qos_profiles: serde_yaml::Value::String(self.options.qos_profiles.clone()),
                        type_description_hash: String::new(),
                    },
                    message_count: t.count,
                })
                .collect(),
            compression_format: String::new(),
            compression_mode: String::new(),
            relative_file_paths: vec![file_name.clone()],
            files: vec![FileInfo {
                path: file_name,
                starting_time: NanosecondsSinceEpoch { nanoseconds_since_epoch: start },
                duration: Nanoseconds { nanoseconds: end - start },
                message_count: count,
            }],
            custom_data: None,
            ros_distro: self.options.ros_distro.clone(),
        }
    }

    /// Writes the summary and footer (and metadata.yaml for a folder). Returns the bag's path: the
    /// folder for [`Self::create_folder`], else the `.mcap` file.
    pub fn finish(mut self) -> Result<PathBuf, BagError> {
        let info = self.bag_info();
        let path = self.file_path.clone();
        let mut record = BTreeMap::new();
        record.insert("serialized_metadata".to_string(), info.to_inner_yaml());
        record.insert("ROS_DISTRO".to_string(), self.options.ros_distro.clone());
        let mut writer = self.writer.take().expect("writer is present until finish");
        writer
            .write_metadata(&mcap::records::Metadata { name: "rosbag2".into(), metadata: record })
            .map_err(|e| Self::mcap_err(&path, e))?;
        writer.finish().map_err(|e| Self::mcap_err(&path, e))?;
        let mut buffered = writer.into_inner();
        buffered.flush().map_err(|e| BagError::io(&path, e))?;
        let file = buffered.into_inner().map_err(|e| BagError::io(&path, e.into_error()))?;
        file.sync_all().map_err(|e| BagError::io(&path, e))?;
        match &self.folder {
            Some(dir) => {
                info.write(dir)?;
                debug_assert!(dir.join(METADATA_FILE).exists());
                Ok(dir.clone())
            }
            None => Ok(path),
        }
    }
}
