//! Opening a bag (file or folder) and iterating its messages.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::mcap_read::{self, McapMessages};
use super::metadata::{BagInfo, METADATA_FILE};
use super::sqlite::{self, SqliteMessages};
use super::{describe_topics, BagError, BagMessage, Storage, TopicInfo};

/// An opened bag: its files (in reading order) and topics.
#[derive(Debug)]
pub struct BagReader {
    path: PathBuf,
    storage: Storage,
    files: Vec<PathBuf>,
    topics: Vec<TopicInfo>,
    metadata: Option<BagInfo>,
    damage: Vec<String>,
}

/// Opens a rosbag2 bag: a `.mcap` file, a `.db3` file, or a bag folder. A folder is read through
/// its `metadata.yaml` (`storage_identifier`, `relative_file_paths` in order); a folder without
/// one is read from the `.mcap`/`.db3` files it holds, ordered by their `_<index>` suffix.
///
/// Topic counts come from each MCAP file's summary (statistics); a file without one (a recording
/// that was cut off) is read through once. A damaged file does not fail `open` when its start is
/// readable: [`BagReader::damage`] describes it and [`BagReader::messages`] ends with the error.
pub fn open(path: impl AsRef<Path>) -> Result<BagReader, BagError> {
    let path = path.as_ref();
    let meta = std::fs::metadata(path).map_err(|e| BagError::io(path, e))?;
    let (storage, files, metadata) =
        if meta.is_dir() { folder_files(path)? } else { (detect_storage(path)?, vec![path.to_path_buf()], None) };
    let mut topics: Vec<TopicInfo> = Vec::new();
    let mut damage = Vec::new();
    for file in &files {
        let file_topics = match storage {
            Storage::Mcap => {
                let (t, d) = mcap_read::scan_topics(file)?;
                damage.extend(d);
                t
            }
            Storage::Sqlite3 => sqlite::scan_topics(file)?,
        };
        for t in file_topics {
            match topics.iter_mut().find(|o| o.name == t.name && o.type_name == t.type_name) {
                Some(o) => o.message_count = o.message_count.saturating_add(t.message_count),
                None => topics.push(t),
            }
        }
    }
    Ok(BagReader { path: path.to_path_buf(), storage, files, topics, metadata, damage })
}

fn detect_storage(path: &Path) -> Result<Storage, BagError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("mcap") => return Ok(Storage::Mcap),
        Some("db3") => return Ok(Storage::Sqlite3),
        Some("zstd") | Some("zst") => {
            return Err(BagError::Unsupported {
                path: path.to_path_buf(),
                what: "zstd-compressed bag files (decompress it first, e.g. `zstd -d`)".into(),
            })
        }
        _ => {}
    }
    let mut head = [0u8; 16];
    let mut file = std::fs::File::open(path).map_err(|e| BagError::io(path, e))?;
    let n = file.read(&mut head).map_err(|e| BagError::io(path, e))?;
    if head[..n].starts_with(mcap_read::MAGIC) {
        Ok(Storage::Mcap)
    } else if head[..n] == sqlite::MAGIC[..] {
        Ok(Storage::Sqlite3)
    } else {
        Err(BagError::UnknownStorage {
            path: path.to_path_buf(),
            reason: "neither a .mcap nor a .db3 file (no MCAP or SQLite magic)".into(),
        })
    }
}

type FolderFiles = (Storage, Vec<PathBuf>, Option<BagInfo>);

fn folder_files(dir: &Path) -> Result<FolderFiles, BagError> {
    let meta_path = dir.join(METADATA_FILE);
    if !meta_path.exists() {
        return loose_files(dir);
    }
    let info = BagInfo::read(dir)?;
    let storage = match info.storage_identifier.as_str() {
        "mcap" => Storage::Mcap,
        "sqlite3" => Storage::Sqlite3,
        other => {
            return Err(BagError::UnknownStorage {
                path: meta_path,
                reason: format!("storage_identifier '{other}' (supported: mcap, sqlite3)"),
            })
        }
    };
    let mode = info.compression_mode.to_ascii_lowercase();
    if !mode.is_empty() && mode != "none" {
        return Err(BagError::Unsupported {
            path: meta_path,
            what: format!(
                "compression_mode '{}' with compression_format '{}' (only uncompressed bags are read; \
                 MCAP chunk compression is fine)",
                info.compression_mode, info.compression_format
            ),
        });
    }
    let mut files = Vec::new();
    for rel in &info.relative_file_paths {
        // Versions < 4 stored "<bag dir>/<file>"; later ones the bare file name.
        let direct = dir.join(rel);
        let by_name = Path::new(rel).file_name().map(|n| dir.join(n));
        let file = if direct.is_file() {
            direct
        } else if let Some(p) = by_name.filter(|p| p.is_file()) {
            p
        } else {
            return Err(BagError::Metadata {
                path: meta_path,
                reason: format!("listed file '{rel}' does not exist in {}", dir.display()),
            });
        };
        files.push(file);
    }
    Ok((storage, files, Some(info)))
}

/// A folder without metadata.yaml: its .mcap or .db3 files, ordered by index.
fn loose_files(dir: &Path) -> Result<FolderFiles, BagError> {
    let entries = std::fs::read_dir(dir).map_err(|e| BagError::io(dir, e))?;
    let mut mcap = Vec::new();
    let mut db3 = Vec::new();
    for entry in entries {
        let p = entry.map_err(|e| BagError::io(dir, e))?.path();
        match p.extension().and_then(|e| e.to_str()) {
            Some("mcap") => mcap.push(p),
            Some("db3") => db3.push(p),
            _ => {}
        }
    }
    let (storage, mut files) = match (mcap.is_empty(), db3.is_empty()) {
        (false, true) => (Storage::Mcap, mcap),
        (true, false) => (Storage::Sqlite3, db3),
        (true, true) => {
            return Err(BagError::UnknownStorage {
                path: dir.to_path_buf(),
                reason: format!("folder has no {METADATA_FILE} and no .mcap or .db3 file"),
            })
        }
        (false, false) => {
            return Err(BagError::UnknownStorage {
                path: dir.to_path_buf(),
                reason: format!("folder has no {METADATA_FILE} and holds both .mcap and .db3 files"),
            })
        }
    };
    let index = |p: &PathBuf| -> (u64, PathBuf) {
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        let n = stem.rsplit('_').next().and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
        (n, p.clone())
    };
    files.sort_by_key(index);
    tracing::warn!("{}: no {METADATA_FILE}; reading {} file(s) found in the folder", dir.display(), files.len());
    Ok((storage, files, None))
}

impl BagReader {
    /// The path given to [`open`].
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn storage(&self) -> Storage {
        self.storage
    }
    /// The storage files, in reading order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }
    /// Topics in order of first appearance (file by file).
    pub fn topics(&self) -> &[TopicInfo] {
        &self.topics
    }
    /// The parsed `metadata.yaml` of a bag folder.
    pub fn metadata(&self) -> Option<&BagInfo> {
        self.metadata.as_ref()
    }
    /// Descriptions of truncated or corrupt files found while opening (empty for a sound bag).
    pub fn damage(&self) -> &[String] {
        &self.damage
    }
    pub fn message_count(&self) -> u64 {
        self.topics.iter().fold(0u64, |sum, t| sum.saturating_add(t.message_count))
    }

    pub fn topic(&self, name: &str) -> Option<&TopicInfo> {
        self.topics.iter().find(|t| t.name == name)
    }

    /// The topic `name`, or [`BagError::TopicNotFound`] listing the topics there are.
    pub fn require_topic(&self, name: &str) -> Result<&TopicInfo, BagError> {
        self.topic(name).ok_or_else(|| BagError::TopicNotFound {
            path: self.path.clone(),
            topic: name.to_string(),
            available: describe_topics(&self.topics),
        })
    }

    /// The topic `name`, checked to carry `type_name` ([`BagError::WrongType`] otherwise).
    pub fn require_topic_type(&self, name: &str, type_name: &str) -> Result<&TopicInfo, BagError> {
        let topic = self.require_topic(name)?;
        if let Some(other) = self.topics.iter().find(|t| t.name == name && t.type_name != type_name) {
            return Err(BagError::WrongType {
                location: self.path.display().to_string(),
                topic: name.to_string(),
                expected: type_name.to_string(),
                found: other.type_name.clone(),
            });
        }
        Ok(topic)
    }

    /// Streams the messages of every file in order (file order within a file: MCAP record order,
    /// sqlite3 `(timestamp, id)`), only those on `topic` when given. An unknown topic yields one
    /// [`BagError::TopicNotFound`]; a damaged file yields the messages before the damage and then
    /// one [`BagError::Corrupt`], after which the iterator ends, or, where the reader can read
    /// around the damage, a [`BagError::Skipped`] line and then the messages recovered after it.
    pub fn messages(&self, topic: Option<&str>) -> Messages<'_> {
        let pending = topic.and_then(|t| self.require_topic(t).err());
        Messages::new(self, topic, pending)
    }

    /// Like [`Self::messages`] for one topic, failing first with [`BagError::WrongType`] when the
    /// topic does not carry `type_name`.
    pub fn messages_of_type(&self, topic: &str, type_name: &str) -> Messages<'_> {
        let pending = self.require_topic_type(topic, type_name).err();
        Messages::new(self, Some(topic), pending)
    }
}

enum FileStream {
    Mcap(Box<McapMessages>),
    Sqlite(Box<SqliteMessages>),
}

/// Iterator over the messages of a bag, see [`BagReader::messages`].
pub struct Messages<'r> {
    reader: &'r BagReader,
    filter: Option<String>,
    next_file: usize,
    current: Option<FileStream>,
    pending: Option<BagError>,
    done: bool,
}

impl<'r> Messages<'r> {
    fn new(reader: &'r BagReader, topic: Option<&str>, pending: Option<BagError>) -> Self {
        Self { reader, filter: topic.map(str::to_string), next_file: 0, current: None, pending, done: false }
    }
}

impl Iterator for Messages<'_> {
    type Item = Result<BagMessage, BagError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some(e) = self.pending.take() {
            self.done = true;
            return Some(Err(e));
        }
        loop {
            if self.current.is_none() {
                let Some(file) = self.reader.files.get(self.next_file) else {
                    self.done = true;
                    return None;
                };
                self.next_file += 1;
                let filter = self.filter.as_deref();
                let opened = match self.reader.storage {
                    Storage::Mcap => McapMessages::open(file, filter).map(|m| FileStream::Mcap(Box::new(m))),
                    Storage::Sqlite3 => SqliteMessages::open(file, filter).map(|m| FileStream::Sqlite(Box::new(m))),
                };
                match opened {
                    Ok(s) => self.current = Some(s),
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
            }
            let item = match self.current.as_mut().expect("set above") {
                FileStream::Mcap(m) => m.next_message(),
                FileStream::Sqlite(s) => s.next_message(),
            };
            match item {
                None => self.current = None,
                // Damage read around: reported, and the stream goes on.
                Some(Err(e @ BagError::Skipped { .. })) => return Some(Err(e)),
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Some(Ok(m)) => return Some(Ok(m)),
            }
        }
    }
}
