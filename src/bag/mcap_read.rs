//! Streaming MCAP reading through the `mcap` crate's sans-io readers: plain buffered `read` calls
//! on the file (no mmap), at most one chunk held in memory.
//!
//! Damage: a record with an unknown opcode in the data section (a flipped opcode byte) is read as
//! a chunk when its body is a valid one, else skipped, with a [`BagError::Skipped`] line either
//! way. A file cut inside a chunk ends with the messages of that chunk that were written out in
//! full (the compressed stream decoded as far as it goes), then the [`BagError::Corrupt`] line.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use mcap::records::Record;
use mcap::sans_io::{
    LinearReadEvent, LinearReader, LinearReaderOptions, SummaryReadEvent, SummaryReader, SummaryReaderOptions,
};

use super::{BagError, BagMessage, TopicInfo};

pub(crate) const MAGIC: &[u8; 8] = b"\x89MCAP0\r\n";
/// Largest record accepted (a corrupt length must not turn into a huge allocation).
const RECORD_LIMIT: usize = 4 << 30;
/// Largest single read handed to the reader.
const MAX_READ: usize = 4 << 20;
const MIN_READ: usize = 64 << 10;

fn corrupt(path: &Path, offset: u64, size: u64, reason: impl ToString) -> BagError {
    BagError::Corrupt { path: path.to_path_buf(), storage: "MCAP", offset, size, reason: reason.to_string() }
}

/// Opens `path` and checks the leading magic. Returns the file and its size.
fn open_checked(path: &Path) -> Result<(File, u64), BagError> {
    let mut file = File::open(path).map_err(|e| BagError::io(path, e))?;
    let size = file.metadata().map_err(|e| BagError::io(path, e))?.len();
    let mut magic = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        match file.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(BagError::io(path, e)),
        }
    }
    if got < 8 {
        return Err(corrupt(path, got as u64, size, "file is shorter than the 8-byte MCAP magic"));
    }
    if &magic != MAGIC {
        return Err(BagError::UnknownStorage { path: path.to_path_buf(), reason: "no MCAP magic at the start".into() });
    }
    file.rewind().map_err(|e| BagError::io(path, e))?;
    Ok((file, size))
}

struct ChannelInfo {
    topic: String,
    type_name: String,
    encoding: String,
    qos: String,
}

/// What the file's records have told so far.
struct State {
    schemas: HashMap<u16, String>,
    channels: HashMap<u16, ChannelInfo>,
    filter: Option<String>,
    copy_data: bool,
    /// Messages seen per channel id (used by the topic scan).
    counts: HashMap<u16, u64>,
    /// Lines about damage read around, not yet reported.
    skipped: Vec<String>,
}

enum Step {
    Nothing,
    Message(BagMessage),
    /// A chunk, re-encoded for a reader of its own (see [`guarded_chunk`]).
    Chunk(Vec<u8>),
    /// Damage read around: what was done.
    Skipped(String),
    DataEnd,
}

impl State {
    fn on_record(&mut self, opcode: u8, data: &[u8]) -> Result<Step, String> {
        let record = mcap::parse_record(opcode, data).map_err(|e| format!("record opcode 0x{opcode:02x}: {e}"))?;
        Ok(match record {
            Record::Schema { header, .. } => {
                self.schemas.insert(header.id, header.name);
                Step::Nothing
            }
            Record::Channel(c) => {
                let type_name = self.schemas.get(&c.schema_id).cloned().unwrap_or_default();
                let qos = c.metadata.get("offered_qos_profiles").cloned().unwrap_or_default();
                self.channels
                    .insert(c.id, ChannelInfo { topic: c.topic, type_name, encoding: c.message_encoding, qos });
                Step::Nothing
            }
            Record::Message { header, data } => {
                let Some(ch) = self.channels.get(&header.channel_id) else {
                    return Err(format!("message refers to unknown channel id {}", header.channel_id));
                };
                *self.counts.entry(header.channel_id).or_insert(0) += 1;
                if self.filter.as_deref().is_some_and(|f| f != ch.topic) {
                    return Ok(Step::Nothing);
                }
                Step::Message(BagMessage {
                    topic: ch.topic.clone(),
                    type_name: ch.type_name.clone(),
                    log_time_ns: header.log_time,
                    data: if self.copy_data { data.into_owned() } else { Vec::new() },
                })
            }
            Record::Chunk { header, data } => Step::Chunk(guarded_chunk(&header, &data)),
            Record::Unknown { opcode, data } => match mcap::parse_record(mcap::records::op::CHUNK, &data) {
                Ok(Record::Chunk { header, data: body }) => {
                    self.skipped.push(format!("a record with unknown opcode 0x{opcode:02x} is a valid chunk: read as one"));
                    Step::Chunk(guarded_chunk(&header, &body))
                }
                _ => Step::Skipped(format!(
                    "a record with unknown opcode 0x{opcode:02x} ({} bytes) skipped; messages in it are lost",
                    data.len()
                )),
            },
            // Messages only live in the data section: stop before the summary.
            Record::DataEnd(_) | Record::Footer(_) => Step::DataEnd,
            _ => Step::Nothing,
        })
    }
}

/// Re-encodes a chunk record for a reader of its own. A compressed chunk gets 16 bytes that are
/// no valid zstd/lz4 frame appended to its compressed data: mcap 0.24's sans-io decompression
/// loop spins forever when a chunk header claims more uncompressed bytes than its frame holds
/// (a corrupt header); with the trailer the decompressor fails instead. A sound chunk never
/// reaches the trailer (it is skipped as padding).
fn guarded_chunk(header: &mcap::records::ChunkHeader, data: &[u8]) -> Vec<u8> {
    let trailer: &[u8] = if header.compression.is_empty() { &[] } else { &[0xff; 16] };
    let mut body = Vec::with_capacity(44 + header.compression.len() + data.len() + trailer.len());
    body.extend_from_slice(&header.message_start_time.to_le_bytes());
    body.extend_from_slice(&header.message_end_time.to_le_bytes());
    body.extend_from_slice(&header.uncompressed_size.to_le_bytes());
    body.extend_from_slice(&header.uncompressed_crc.to_le_bytes());
    body.extend_from_slice(&(header.compression.len() as u32).to_le_bytes());
    body.extend_from_slice(header.compression.as_bytes());
    body.extend_from_slice(&((data.len() + trailer.len()) as u64).to_le_bytes());
    body.extend_from_slice(data);
    body.extend_from_slice(trailer);
    let mut record = Vec::with_capacity(9 + body.len());
    record.push(mcap::records::op::CHUNK);
    record.extend_from_slice(&(body.len() as u64).to_le_bytes());
    record.extend_from_slice(&body);
    record
}

fn reader_options() -> LinearReaderOptions {
    LinearReaderOptions::default().with_prevalidate_chunk_crcs(true).with_record_length_limit(RECORD_LIMIT)
}

/// Messages of one MCAP file in file order.
pub(crate) struct McapMessages {
    path: PathBuf,
    file: File,
    size: u64,
    fed: u64,
    reader: LinearReader,
    /// Reader of the chunk being read.
    chunk: Option<LinearReader>,
    state: State,
    done: bool,
    /// Messages recovered from a cut chunk, then the error that ends the file.
    salvaged: VecDeque<BagMessage>,
    end: Option<BagError>,
}

impl McapMessages {
    pub(crate) fn open(path: &Path, filter: Option<&str>) -> Result<Self, BagError> {
        let (mut file, size) = open_checked(path)?;
        // The summary repeats every channel: with them known up front, the messages after a
        // damaged chunk that held the channel records can still be read.
        let mut channels = HashMap::new();
        let mut skipped = Vec::new();
        let summary = read_summary(&mut file, size);
        // A file that ends with the magic claims a whole summary: one that cannot be read is damage.
        if let Err(e) = &summary {
            if ends_with_magic(&mut file, size) {
                skipped.push(format!("the summary section is unreadable ({e}); channels come from the data section"));
            }
        }
        if let Ok(Some(summary)) = summary {
            for (id, c) in &summary.channels {
                channels.insert(
                    *id,
                    ChannelInfo {
                        topic: c.topic.clone(),
                        type_name: c.schema.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
                        encoding: c.message_encoding.clone(),
                        qos: c.metadata.get("offered_qos_profiles").cloned().unwrap_or_default(),
                    },
                );
            }
        }
        file.rewind().map_err(|e| BagError::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            size,
            fed: 0,
            reader: LinearReader::new_with_options(reader_options().with_emit_chunks(true)),
            chunk: None,
            state: State {
                schemas: HashMap::new(),
                channels,
                filter: filter.map(str::to_string),
                copy_data: true,
                counts: HashMap::new(),
                skipped,
            },
            done: false,
            salvaged: VecDeque::new(),
            end: None,
        })
    }

    fn skipped_line(&self, what: String) -> BagError {
        BagError::Skipped { path: self.path.clone(), storage: "MCAP", what }
    }

    /// After the reader failed at the end of a cut file: the messages of the cut record, when it
    /// is a chunk, queued in front of the final error.
    fn salvage_tail(&mut self, error: String) {
        let tail = match last_record(&mut self.file, self.size) {
            Ok(t) => t,
            Err(e) => {
                self.end = Some(corrupt(&self.path, self.fed, self.size, format!("{error} (and {e})")));
                return;
            }
        };
        let mut note = String::new();
        if let Some((at, opcode, body)) = tail {
            if opcode == mcap::records::op::CHUNK {
                let (records, how) = partial_chunk_records(&body);
                let before = self.salvaged.len();
                for (op, data) in records {
                    match self.state.on_record(op, &data) {
                        Ok(Step::Message(m)) => self.salvaged.push_back(m),
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                note = format!(
                    "; the file ends inside the chunk at byte {at}: {} complete messages recovered from it ({how})",
                    self.salvaged.len() - before
                );
            }
        }
        self.end = Some(corrupt(&self.path, self.fed, self.size, format!("{error}{note}")));
    }

    fn fail(&mut self, reason: impl ToString) -> Option<Result<BagMessage, BagError>> {
        self.done = true;
        Some(Err(corrupt(&self.path, self.fed, self.size, reason)))
    }

    /// The next message passing the topic filter; after an error, `None`.
    pub(crate) fn next_message(&mut self) -> Option<Result<BagMessage, BagError>> {
        loop {
            if !self.state.skipped.is_empty() {
                let what = self.state.skipped.remove(0);
                return Some(Err(self.skipped_line(what)));
            }
            if let Some(m) = self.salvaged.pop_front() {
                return Some(Ok(m));
            }
            if let Some(e) = self.end.take() {
                return Some(Err(e));
            }
            if self.done {
                return None;
            }
            let step = if let Some(chunk) = self.chunk.as_mut() {
                match chunk.next_event() {
                    None => {
                        self.chunk = None;
                        continue;
                    }
                    Some(Err(e)) => return self.fail(format!("chunk: {e}")),
                    // The whole chunk was handed over: more is asked only of a damaged one.
                    Some(Ok(LinearReadEvent::ReadRequest(_))) => {
                        chunk.notify_read(0);
                        continue;
                    }
                    Some(Ok(LinearReadEvent::Record { opcode, data })) => self.state.on_record(opcode, data),
                }
            } else {
                match self.reader.next_event() {
                    None => {
                        self.done = true;
                        return None;
                    }
                    // Cut inside a record: what the cut record still holds comes first.
                    Some(Err(e)) if self.fed >= self.size => {
                        self.done = true;
                        self.salvage_tail(e.to_string());
                        continue;
                    }
                    Some(Err(e)) => return self.fail(e),
                    Some(Ok(LinearReadEvent::ReadRequest(need))) => {
                        let buf = self.reader.insert(need.clamp(MIN_READ, MAX_READ));
                        let n = loop {
                            match self.file.read(buf) {
                                Ok(n) => break n,
                                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                                Err(e) => {
                                    self.done = true;
                                    return Some(Err(BagError::io(&self.path, e)));
                                }
                            }
                        };
                        self.reader.notify_read(n);
                        self.fed += n as u64;
                        continue;
                    }
                    Some(Ok(LinearReadEvent::Record { opcode, data })) => self.state.on_record(opcode, data),
                }
            };
            match step {
                Err(reason) => return self.fail(reason),
                Ok(Step::Nothing) => {}
                Ok(Step::Skipped(what)) => return Some(Err(self.skipped_line(what))),
                Ok(Step::Message(m)) => return Some(Ok(m)),
                Ok(Step::Chunk(bytes)) => {
                    let mut chunk = LinearReader::new_with_options(
                        reader_options().with_skip_start_magic(true).with_skip_end_magic(true),
                    );
                    chunk.insert(bytes.len()).copy_from_slice(&bytes);
                    chunk.notify_read(bytes.len());
                    self.chunk = Some(chunk);
                }
                Ok(Step::DataEnd) => {
                    self.done = true;
                    return None;
                }
            }
        }
    }

    fn topics(&self) -> Vec<TopicInfo> {
        let s = &self.state;
        let mut ids: Vec<&u16> = s.channels.keys().collect();
        ids.sort();
        ids.into_iter()
            .map(|id| {
                let c = &s.channels[id];
                TopicInfo {
                    name: c.topic.clone(),
                    type_name: c.type_name.clone(),
                    serialization_format: c.encoding.clone(),
                    message_count: s.counts.get(id).copied().unwrap_or(0),
                    offered_qos_profiles: c.qos.clone(),
                }
            })
            .collect()
    }
}

/// Topics of one MCAP file with their message counts, from the summary section when it has
/// statistics, else by reading the whole data section. The second value describes the damage
/// when the file is truncated or corrupt (the counts then cover the readable part).
pub(crate) fn scan_topics(path: &Path) -> Result<(Vec<TopicInfo>, Option<String>), BagError> {
    let (mut file, size) = open_checked(path)?;
    if let Ok(Some(summary)) = read_summary(&mut file, size) {
        if let Some(stats) = &summary.stats {
            let mut ids: Vec<&u16> = summary.channels.keys().collect();
            ids.sort();
            let topics = ids
                .into_iter()
                .map(|id| {
                    let c = &summary.channels[id];
                    TopicInfo {
                        name: c.topic.clone(),
                        type_name: c.schema.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
                        serialization_format: c.message_encoding.clone(),
                        message_count: stats.channel_message_counts.get(id).copied().unwrap_or(0),
                        offered_qos_profiles: c.metadata.get("offered_qos_profiles").cloned().unwrap_or_default(),
                    }
                })
                .collect();
            return Ok((topics, None));
        }
    }
    drop(file);
    let mut scan = McapMessages::open(path, None)?;
    scan.state.copy_data = false;
    let mut damage = None;
    while let Some(item) = scan.next_message() {
        match item {
            Ok(_) => {}
            Err(e @ BagError::Corrupt { .. }) => damage = Some(e.to_string()),
            Err(e) => return Err(e),
        }
    }
    Ok((scan.topics(), damage))
}

fn ends_with_magic(file: &mut File, size: u64) -> bool {
    let mut tail = [0u8; 8];
    size >= 16
        && file.seek(std::io::SeekFrom::Start(size - 8)).is_ok()
        && file.read_exact(&mut tail).is_ok()
        && &tail == MAGIC
}

fn read_summary(file: &mut File, size: u64) -> Result<Option<mcap::Summary>, Box<dyn std::error::Error>> {
    let mut reader = SummaryReader::new_with_options(
        SummaryReaderOptions::default().with_file_size(size).with_record_length_limit(RECORD_LIMIT),
    );
    while let Some(event) = reader.next_event() {
        match event? {
            SummaryReadEvent::ReadRequest(n) => {
                let n = file.read(reader.insert(n.min(MAX_READ)))?;
                reader.notify_read(n);
            }
            SummaryReadEvent::SeekRequest(to) => {
                let pos = file.seek(to)?;
                reader.notify_seeked(pos);
            }
        }
    }
    Ok(reader.finish())
}

/// The record the file ends inside: walks the record headers of the data section (seeking over
/// bodies) and returns (offset, opcode, the bytes of its body that exist), or `None` when the cut
/// falls between records.
fn last_record(file: &mut File, size: u64) -> std::io::Result<Option<(u64, u8, Vec<u8>)>> {
    let mut at = MAGIC.len() as u64;
    let mut head = [0u8; 9];
    while at + 9 <= size {
        file.seek(std::io::SeekFrom::Start(at))?;
        file.read_exact(&mut head)?;
        let len = u64::from_le_bytes(head[1..9].try_into().expect("8 bytes"));
        let end = (at + 9).saturating_add(len);
        if end > size {
            let mut body = Vec::new();
            file.take((size - at - 9).min(RECORD_LIMIT as u64)).read_to_end(&mut body)?;
            return Ok(Some((at, head[0], body)));
        }
        at = end;
    }
    Ok(None)
}

/// The complete records inside the start of a chunk body that was cut off: its header, then its
/// records, decompressed (zstd, lz4) as far as the stream goes. Returns them and how it went.
fn partial_chunk_records(body: &[u8]) -> (Vec<(u8, Vec<u8>)>, String) {
    let mut r = body;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (a, b) = (r.get(..n)?, r.get(n..)?);
        r = b;
        Some(a)
    };
    let header = (|| {
        take(8 + 8 + 8 + 4)?;
        let clen = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let compression = String::from_utf8_lossy(take(clen)?).into_owned();
        take(8)?;
        Some(compression)
    })();
    let Some(compression) = header else { return (Vec::new(), "its header is cut".into()) };
    let mut plain = Vec::new();
    let decoded = match compression.as_str() {
        "" => {
            plain.extend_from_slice(r);
            Ok(())
        }
        "zstd" => zstd_prefix(r, &mut plain),
        "lz4" => lz4::Decoder::new(r).and_then(|mut d| read_prefix(&mut d, &mut plain)),
        other => return (Vec::new(), format!("unknown compression '{other}'")),
    };
    let mut records = Vec::new();
    let mut rest = &plain[..];
    while rest.len() >= 9 {
        let len = u64::from_le_bytes(rest[1..9].try_into().expect("8 bytes"));
        let Some(end) = usize::try_from(len).ok().and_then(|l| l.checked_add(9)).filter(|&e| e <= rest.len()) else {
            break;
        };
        records.push((rest[0], rest[9..end].to_vec()));
        rest = &rest[end..];
    }
    let how = match (compression.as_str(), decoded) {
        ("", _) => format!("{} of its bytes are there", body.len()),
        (c, Ok(())) => format!("{c} stream decoded to {} bytes", plain.len()),
        (c, Err(e)) => format!("{c} stream decoded to {} bytes before '{e}'", plain.len()),
    };
    (records, how)
}

/// Decodes a zstd stream that may be cut, block by block, as far as it goes (the `Read` adapter
/// gives nothing back once it meets the cut).
fn zstd_prefix(input: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};
    let mut decoder = Decoder::new()?;
    let mut input = InBuffer::around(input);
    let mut buf = vec![0u8; 128 << 10];
    loop {
        let mut output = OutBuffer::around(&mut buf[..]);
        let hint = decoder.run(&mut input, &mut output)?;
        let n = output.pos();
        if out.len() + n > RECORD_LIMIT {
            return Err(std::io::Error::other("chunk larger than the record limit"));
        }
        out.extend_from_slice(&buf[..n]);
        if hint == 0 {
            return Ok(());
        }
        if n == 0 && input.pos() == input.src.len() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "cut zstd stream"));
        }
    }
}

/// Reads `from` into `out` until it ends or fails (a cut stream fails at the cut), bounded by
/// [`RECORD_LIMIT`].
fn read_prefix(from: &mut impl Read, out: &mut Vec<u8>) -> std::io::Result<()> {
    let mut buf = [0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                if out.len() + n > RECORD_LIMIT {
                    return Err(std::io::Error::other("chunk larger than the record limit"));
                }
                out.extend_from_slice(&buf[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
