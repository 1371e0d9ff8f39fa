//! MCAP reading: a bounded record parser of our own over buffered `read` calls (no mmap), at most
//! one chunk held in memory. The `mcap` crate writes; it does not read here, because its 0.24
//! readers trust what a record declares: a string's declared length is reserved before it is read
//! (a 100-byte file allocating 4 GiB), a chunk's claimed uncompressed size is zero-filled before
//! decompressing, and an Attachment shorter than its header panics (fuzz findings, kept in
//! fuzz/regressions/mcap_reader). Here every length prefix is checked against the bytes that exist
//! before anything is allocated, decompression output grows only as it is produced, and only the
//! records a reader of messages needs are parsed.
//!
//! Damage is read around where the framing allows it, each time with a [`BagError::Skipped`]
//! line: a record whose fields do not fit its length, a chunk that fails to decompress or fails its
//! CRC (its messages are skipped, not guessed), a record with an unknown opcode (read as a chunk
//! when its body is a valid one: a flipped opcode byte). A file cut inside a chunk ends with the
//! messages of that chunk that were written out in full (the compressed stream decoded as far as
//! it goes), then the [`BagError::Corrupt`] line.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use mcap::records::op;

use super::{BagError, BagMessage, TopicInfo};

pub(crate) const MAGIC: &[u8; 8] = b"\x89MCAP0\r\n";
/// Largest record (and decompressed chunk) accepted.
const RECORD_LIMIT: u64 = 4 << 30;
/// Most read of a record the file ends inside, and of a summary section: a damaged length must not
/// pull the rest of a multi-gigabyte bag into memory (real chunks and summaries are megabytes).
const DAMAGED_READ_LIMIT: u64 = 256 << 20;
/// A Footer record: opcode, length, then summary_start, summary_offset_start, summary_crc.
const FOOTER_LEN: u64 = 1 + 8 + 8 + 8 + 4;
/// The fixed fields of a Statistics record before its channel counts: message_count,
/// schema_count, channel_count, attachment_count, metadata_count, chunk_count, start and end time.
const STATISTICS_FIXED: u64 = 8 + 2 + 4 + 4 + 4 + 4 + 8 + 8;

fn corrupt(path: &Path, offset: u64, size: u64, reason: impl ToString) -> BagError {
    BagError::Corrupt { path: path.to_path_buf(), storage: "MCAP", offset, size, reason: reason.to_string() }
}

/// Reads up to `buf.len()` bytes, fewer only at the end of the file.
fn read_full(from: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match from.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Opens `path` and checks the leading magic. Returns the file and its size.
fn open_checked(path: &Path) -> Result<(File, u64), BagError> {
    let mut file = File::open(path).map_err(|e| BagError::io(path, e))?;
    let size = file.metadata().map_err(|e| BagError::io(path, e))?.len();
    let mut magic = [0u8; 8];
    let got = read_full(&mut file, &mut magic).map_err(|e| BagError::io(path, e))?;
    if got < 8 {
        return Err(corrupt(path, got as u64, size, "file is shorter than the 8-byte MCAP magic"));
    }
    if &magic != MAGIC {
        return Err(BagError::UnknownStorage { path: path.to_path_buf(), reason: "no MCAP magic at the start".into() });
    }
    Ok((file, size))
}

/// The fields of one record body, each length prefix checked against what is left.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn new(body: &'a [u8]) -> Self {
        Self { rest: body }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], String> {
        match usize::try_from(n) {
            Ok(n) if n <= self.rest.len() => {
                let (field, rest) = self.rest.split_at(n);
                self.rest = rest;
                Ok(field)
            }
            _ => Err(format!("{what} claims {n} bytes where {} are left", self.rest.len())),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u16(&mut self, what: &str) -> Result<u16, String> {
        self.array(what).map(u16::from_le_bytes)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let n = self.u32(what)?;
        let bytes = self.take(n.into(), what)?;
        std::str::from_utf8(bytes).map(str::to_string).map_err(|_| format!("{what} is not UTF-8"))
    }

    /// A map: its byte length, then its entries (read by the caller from the returned fields).
    fn map(&mut self, what: &str) -> Result<Fields<'a>, String> {
        let n = self.u32(what)?;
        Ok(Fields::new(self.take(n.into(), what)?))
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

#[derive(Clone)]
struct ChannelInfo {
    topic: String,
    schema_id: u16,
    encoding: String,
    qos: String,
}

struct ChunkHeader {
    uncompressed_size: u64,
    uncompressed_crc: u32,
    compression: String,
    records_len: u64,
}

/// The records a reader of messages uses; the others are [`Parsed::Unused`].
enum Parsed<'a> {
    Schema {
        id: u16,
        name: String,
    },
    Channel {
        id: u16,
        info: ChannelInfo,
    },
    Message {
        channel_id: u16,
        log_time: u64,
        data: &'a [u8],
    },
    Chunk {
        header: ChunkHeader,
        records: &'a [u8],
    },
    Statistics {
        channel_message_counts: HashMap<u16, u64>,
    },
    /// DataEnd or Footer: messages only live in the data section.
    End,
    Unused,
    Unknown,
}

fn chunk_header(f: &mut Fields) -> Result<ChunkHeader, String> {
    f.u64("chunk message start time")?;
    f.u64("chunk message end time")?;
    Ok(ChunkHeader {
        uncompressed_size: f.u64("chunk uncompressed size")?,
        uncompressed_crc: f.u32("chunk uncompressed crc")?,
        compression: f.string("chunk compression")?,
        records_len: f.u64("chunk records length")?,
    })
}

fn parse(opcode: u8, body: &[u8]) -> Result<Parsed<'_>, String> {
    let mut f = Fields::new(body);
    Ok(match opcode {
        op::SCHEMA => Parsed::Schema { id: f.u16("schema id")?, name: f.string("schema name")? },
        op::CHANNEL => {
            let id = f.u16("channel id")?;
            let schema_id = f.u16("channel schema id")?;
            let topic = f.string("channel topic")?;
            let encoding = f.string("channel message encoding")?;
            let mut metadata = f.map("channel metadata")?;
            let mut qos = String::new();
            while !metadata.is_empty() {
                let key = metadata.string("channel metadata key")?;
                let value = metadata.string("channel metadata value")?;
                if key == "offered_qos_profiles" {
                    qos = value;
                }
            }
            Parsed::Channel { id, info: ChannelInfo { topic, schema_id, encoding, qos } }
        }
        op::MESSAGE => {
            let channel_id = f.u16("message channel id")?;
            f.u32("message sequence")?;
            let log_time = f.u64("message log time")?;
            f.u64("message publish time")?;
            Parsed::Message { channel_id, log_time, data: f.rest }
        }
        op::CHUNK => {
            let header = chunk_header(&mut f)?;
            let records = f.take(header.records_len, "chunk records")?;
            Parsed::Chunk { header, records }
        }
        op::STATISTICS => {
            f.take(STATISTICS_FIXED, "statistics counts")?;
            let mut entries = f.map("statistics channel message counts")?;
            let mut channel_message_counts = HashMap::new();
            while !entries.is_empty() {
                let id = entries.u16("statistics channel id")?;
                channel_message_counts.insert(id, entries.u64("statistics message count")?);
            }
            Parsed::Statistics { channel_message_counts }
        }
        op::DATA_END | op::FOOTER => Parsed::End,
        op::HEADER
        | op::MESSAGE_INDEX
        | op::CHUNK_INDEX
        | op::ATTACHMENT
        | op::ATTACHMENT_INDEX
        | op::METADATA
        | op::METADATA_INDEX
        | op::SUMMARY_OFFSET => Parsed::Unused,
        _ => Parsed::Unknown,
    })
}

/// The records framed in `bytes` (opcode, body), then how many bytes at the end are not a
/// complete record.
fn frame(bytes: &[u8]) -> (Vec<(u8, &[u8])>, usize) {
    let mut records = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 9 {
        let len = u64::from_le_bytes(rest[1..9].try_into().expect("8 bytes"));
        let Some(end) = usize::try_from(len).ok().and_then(|l| l.checked_add(9)).filter(|&e| e <= rest.len()) else {
            break;
        };
        records.push((rest[0], &rest[9..end]));
        rest = &rest[end..];
    }
    (records, rest.len())
}

/// Decompresses a chunk's records into at most `limit` bytes, as far as the stream goes (a cut
/// stream yields its complete blocks). Returns the bytes and, when the stream failed, why.
fn decompress(compression: &str, data: &[u8], limit: u64) -> (Vec<u8>, Result<(), String>) {
    let mut out = Vec::new();
    let result = match compression {
        "" => {
            out.extend_from_slice(&data[..data.len().min(usize::try_from(limit).unwrap_or(usize::MAX))]);
            Ok(())
        }
        "zstd" => zstd_prefix(data, &mut out, limit).map_err(|e| e.to_string()),
        "lz4" => {
            lz4::Decoder::new(data).and_then(|mut d| read_prefix(&mut d, &mut out, limit)).map_err(|e| e.to_string())
        }
        other => Err(format!("unknown compression '{other}'")),
    };
    (out, result)
}

/// Decodes a zstd stream that may be cut, block by block, as far as it goes (the `Read` adapter
/// gives nothing back once it meets the cut).
fn zstd_prefix(input: &[u8], out: &mut Vec<u8>, limit: u64) -> std::io::Result<()> {
    use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};
    let mut decoder = Decoder::new()?;
    let mut input = InBuffer::around(input);
    let mut buf = vec![0u8; 128 << 10];
    loop {
        let mut output = OutBuffer::around(&mut buf[..]);
        let hint = decoder.run(&mut input, &mut output)?;
        let n = output.pos();
        push_bounded(out, &buf[..n], limit)?;
        if hint == 0 {
            return Ok(());
        }
        if n == 0 && input.pos() == input.src.len() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "cut zstd stream"));
        }
    }
}

/// Reads `from` into `out` until it ends or fails (a cut stream fails at the cut).
fn read_prefix(from: &mut impl Read, out: &mut Vec<u8>, limit: u64) -> std::io::Result<()> {
    let mut buf = [0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => push_bounded(out, &buf[..n], limit)?,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn push_bounded(out: &mut Vec<u8>, bytes: &[u8], limit: u64) -> std::io::Result<()> {
    if (out.len() + bytes.len()) as u64 > limit {
        return Err(std::io::Error::other(format!("decompresses to more than the {limit} bytes it declares")));
    }
    out.extend_from_slice(bytes);
    Ok(())
}

/// What the file's records have told so far.
struct State {
    schemas: HashMap<u16, String>,
    channels: HashMap<u16, ChannelInfo>,
    filter: Option<String>,
    copy_data: bool,
    /// Messages seen per channel id (used by the topic scan).
    counts: HashMap<u16, u64>,
    /// Channel ids of messages skipped because no Channel record defines them (said once each).
    unknown_channels: HashSet<u16>,
}

/// What one record yields.
enum Yield {
    Nothing,
    Message(BagMessage),
    /// Damage read around: what was done.
    Skipped(String),
}

impl State {
    /// A Schema, Channel or Message record (top level or inside a chunk).
    fn apply(&mut self, record: Parsed) -> Yield {
        match record {
            Parsed::Schema { id, name } => {
                self.schemas.insert(id, name);
            }
            Parsed::Channel { id, info } => {
                self.channels.insert(id, info);
            }
            Parsed::Message { channel_id, log_time, data } => {
                let Some(ch) = self.channels.get(&channel_id) else {
                    return if self.unknown_channels.insert(channel_id) {
                        Yield::Skipped(format!(
                            "messages on channel id {channel_id}, which no Channel record defines, are skipped"
                        ))
                    } else {
                        Yield::Nothing
                    };
                };
                *self.counts.entry(channel_id).or_insert(0) += 1;
                if self.filter.as_deref().is_some_and(|f| f != ch.topic) {
                    return Yield::Nothing;
                }
                return Yield::Message(BagMessage {
                    topic: ch.topic.clone(),
                    type_name: self.schemas.get(&ch.schema_id).cloned().unwrap_or_default(),
                    log_time_ns: log_time,
                    data: if self.copy_data { data.to_vec() } else { Vec::new() },
                });
            }
            _ => {}
        }
        Yield::Nothing
    }

    /// The records of a chunk's decompressed bytes, in order, into `out`; the line for a
    /// remainder that is no complete record.
    fn apply_chunk_records(&mut self, plain: &[u8], at: u64, out: &mut VecDeque<Yield>) -> Option<String> {
        let (records, left) = frame(plain);
        for (opcode, body) in records {
            match parse(opcode, body) {
                Ok(record) => out.push_back(self.apply(record)),
                Err(e) => out.push_back(Yield::Skipped(format!(
                    "a record (opcode 0x{opcode:02x}) in the chunk at byte {at} is damaged ({e}): skipped"
                ))),
            }
        }
        (left > 0).then(|| format!("the last {left} bytes of the chunk at byte {at} are no complete record"))
    }
}

/// Messages of one MCAP file in file order.
pub(crate) struct McapMessages {
    path: PathBuf,
    file: BufReader<File>,
    size: u64,
    /// Offset of the next top-level record.
    at: u64,
    state: State,
    /// What the last record yielded, not yet handed out.
    pending: VecDeque<Yield>,
    /// The error that ends the file, after `pending`.
    end: Option<BagError>,
    done: bool,
}

impl McapMessages {
    pub(crate) fn open(path: &Path, filter: Option<&str>) -> Result<Self, BagError> {
        let (mut file, size) = open_checked(path)?;
        // The summary repeats every schema and channel: with them known up front, the messages
        // after a damaged chunk that held the channel records can still be read.
        let mut pending = VecDeque::new();
        let (schemas, channels) = match read_summary(&mut file, size) {
            Ok(Some(summary)) => (summary.schemas, summary.channels),
            Ok(None) => Default::default(),
            Err(e) => {
                pending.push_back(Yield::Skipped(format!(
                    "the summary section is unreadable ({e}); channels come from the data section"
                )));
                Default::default()
            }
        };
        file.seek(SeekFrom::Start(MAGIC.len() as u64)).map_err(|e| BagError::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            file: BufReader::with_capacity(1 << 20, file),
            size,
            at: MAGIC.len() as u64,
            state: State {
                schemas,
                channels,
                filter: filter.map(str::to_string),
                copy_data: true,
                counts: HashMap::new(),
                unknown_channels: HashSet::new(),
            },
            pending,
            end: None,
            done: false,
        })
    }

    /// The next message passing the topic filter, or a line about damage read around; after the
    /// final error, `None`.
    pub(crate) fn next_message(&mut self) -> Option<Result<BagMessage, BagError>> {
        loop {
            match self.pending.pop_front() {
                Some(Yield::Message(m)) => return Some(Ok(m)),
                Some(Yield::Skipped(what)) => {
                    return Some(Err(BagError::Skipped { path: self.path.clone(), storage: "MCAP", what }))
                }
                Some(Yield::Nothing) => continue,
                None => {}
            }
            if let Some(e) = self.end.take() {
                return Some(Err(e));
            }
            if self.done {
                return None;
            }
            if let Err(e) = self.read_record() {
                self.done = true;
                self.end = Some(e);
            }
        }
    }

    /// Reads the top-level record at `self.at` and queues what it yields.
    fn read_record(&mut self) -> Result<(), BagError> {
        let (at, size) = (self.at, self.size);
        let left = size - at;
        let cut = |path: &Path, reason: String| Err(corrupt(path, at, size, reason));
        if left < 9 {
            // A complete file ends with a Footer and the magic, which stop the reading first.
            return cut(
                &self.path,
                if left == 0 {
                    format!("the file ends at byte {at} without a data end or footer record (cut off between records)")
                } else {
                    format!("the file ends inside the header of the record at byte {at}")
                },
            );
        }
        let mut head = [0u8; 9];
        self.file.read_exact(&mut head).map_err(|e| BagError::io(&self.path, e))?;
        let (opcode, len) = (head[0], u64::from_le_bytes(head[1..].try_into().expect("8 bytes")));
        if len > RECORD_LIMIT && len <= left - 9 {
            return cut(
                &self.path,
                format!("the record at byte {at} claims {len} bytes, more than the {RECORD_LIMIT} accepted"),
            );
        }
        if len > left - 9 {
            let have = left - 9;
            let note = if opcode == op::CHUNK {
                let mut body = Vec::new();
                (&mut self.file)
                    .take(have.min(DAMAGED_READ_LIMIT))
                    .read_to_end(&mut body)
                    .map_err(|e| BagError::io(&self.path, e))?;
                self.salvage_cut_chunk(at, &body)
            } else {
                String::new()
            };
            return cut(&self.path, format!(
                "the record (opcode 0x{opcode:02x}) at byte {at} claims {len} bytes and the file ends {have} bytes into it{note}"
            ));
        }
        let mut body = Vec::with_capacity(len as usize);
        (&mut self.file).take(len).read_to_end(&mut body).map_err(|e| BagError::io(&self.path, e))?;
        self.at += 9 + len;
        match parse(opcode, &body) {
            Ok(Parsed::End) => self.done = true,
            Ok(Parsed::Chunk { header, records }) => self.read_chunk(at, &header, records, None),
            Ok(Parsed::Unknown) => self.read_unknown(at, opcode, &body),
            Ok(record) => {
                let y = self.state.apply(record);
                self.pending.push_back(y);
            }
            Err(e) => self.pending.push_back(Yield::Skipped(format!(
                "the record (opcode 0x{opcode:02x}) at byte {at} is damaged ({e}): skipped"
            ))),
        }
        Ok(())
    }

    /// A complete chunk: its messages when it decompresses to its declared size and CRC, else a
    /// line saying it was skipped. `note` says how the chunk was found, when that is damage too.
    fn read_chunk(&mut self, at: u64, header: &ChunkHeader, records: &[u8], note: Option<String>) {
        let (plain, decoded) = decompress(&header.compression, records, header.uncompressed_size.min(RECORD_LIMIT));
        let crc_matches = header.uncompressed_crc != 0 && crc32fast::hash(&plain) == header.uncompressed_crc;
        let mut note = note;
        let damage = match decoded {
            Err(e) => Some(e),
            Ok(()) if header.uncompressed_crc != 0 && !crc_matches => Some("its CRC does not match its records".into()),
            Ok(()) if plain.len() as u64 != header.uncompressed_size => {
                let what = format!(
                    "the chunk at byte {at} decompresses to {} bytes, its header says {}",
                    plain.len(),
                    header.uncompressed_size
                );
                if crc_matches {
                    // Only the size field is wrong: the CRC vouches for the records.
                    note = Some(note.map_or(what.clone(), |n| format!("{n}; {what}")) + " (the CRC matches)");
                    None
                } else {
                    Some(what)
                }
            }
            Ok(()) => None,
        };
        if let Some(why) = damage {
            let found = note.map(|n| format!("{n}, but ")).unwrap_or_default();
            self.pending.push_back(Yield::Skipped(format!(
                "{found}the chunk at byte {at} is damaged ({why}): the messages in it are skipped"
            )));
            return;
        }
        if let Some(n) = note {
            self.pending.push_back(Yield::Skipped(format!("{n}: its messages are read")));
        }
        if let Some(line) = self.state.apply_chunk_records(&plain, at, &mut self.pending) {
            self.pending.push_back(Yield::Skipped(format!("{line}: skipped")));
        }
    }

    /// A record with an opcode MCAP does not define: a chunk whose opcode byte was damaged when its
    /// body is a valid chunk, else skipped. Opcodes 0x80 and up are application records that the
    /// format tells readers to ignore.
    fn read_unknown(&mut self, at: u64, opcode: u8, body: &[u8]) {
        let what = format!("a record with unknown opcode 0x{opcode:02x} at byte {at} ({} bytes)", body.len());
        match parse(op::CHUNK, body) {
            Ok(Parsed::Chunk { header, records }) => {
                self.read_chunk(at, &header, records, Some(format!("{what} is a valid chunk, read as one")))
            }
            _ if opcode >= 0x80 => {}
            _ => self.pending.push_back(Yield::Skipped(format!("{what} skipped; messages in it are lost"))),
        }
    }

    /// The complete messages at the start of a chunk the file ends inside, queued; returns the
    /// note for the final error.
    fn salvage_cut_chunk(&mut self, at: u64, body: &[u8]) -> String {
        let mut f = Fields::new(body);
        let how = match chunk_header(&mut f) {
            Err(_) => "its header is cut".to_string(),
            Ok(header) => {
                let (plain, decoded) =
                    decompress(&header.compression, f.rest, header.uncompressed_size.min(RECORD_LIMIT));
                let mut yields = VecDeque::new();
                // The last record may be cut: what is not a complete record is the cut itself.
                let _ = self.state.apply_chunk_records(&plain, at, &mut yields);
                let n = yields.iter().filter(|y| matches!(y, Yield::Message(_))).count();
                self.pending.extend(yields);
                let stream = match (header.compression.as_str(), decoded) {
                    ("", _) => format!("{} of its bytes are there", body.len()),
                    (c, Ok(())) => format!("{c} stream decoded to {} bytes", plain.len()),
                    (c, Err(e)) => format!("{c} stream decoded to {} bytes before '{e}'", plain.len()),
                };
                format!("{n} complete messages recovered from it ({stream})")
            }
        };
        format!("; the file ends inside the chunk at byte {at}: {how}")
    }

    fn topics(&self) -> Vec<TopicInfo> {
        let s = &self.state;
        let counts = |id: &u16| s.counts.get(id).copied().unwrap_or(0);
        topic_infos(&s.schemas, &s.channels, counts)
    }
}

/// Topics sorted by channel id.
fn topic_infos(
    schemas: &HashMap<u16, String>,
    channels: &HashMap<u16, ChannelInfo>,
    count: impl Fn(&u16) -> u64,
) -> Vec<TopicInfo> {
    let mut ids: Vec<&u16> = channels.keys().collect();
    ids.sort();
    ids.into_iter()
        .map(|id| {
            let c = &channels[id];
            TopicInfo {
                name: c.topic.clone(),
                type_name: schemas.get(&c.schema_id).cloned().unwrap_or_default(),
                serialization_format: c.encoding.clone(),
                message_count: count(id),
                offered_qos_profiles: c.qos.clone(),
            }
        })
        .collect()
}

/// Topics of one MCAP file with their message counts, from the summary section when it has
/// statistics, else by reading the whole data section. The second value describes the damage
/// when the file is truncated or corrupt (the counts then cover the readable part).
pub(crate) fn scan_topics(path: &Path) -> Result<(Vec<TopicInfo>, Option<String>), BagError> {
    let (mut file, size) = open_checked(path)?;
    if let Ok(Some(summary)) = read_summary(&mut file, size) {
        if let Some(stats) = &summary.channel_message_counts {
            let count = |id: &u16| stats.get(id).copied().unwrap_or(0);
            return Ok((topic_infos(&summary.schemas, &summary.channels, count), None));
        }
    }
    drop(file);
    let mut scan = McapMessages::open(path, None)?;
    scan.state.copy_data = false;
    let mut damage = None;
    while let Some(item) = scan.next_message() {
        match item {
            Ok(_) | Err(BagError::Skipped { .. }) => {}
            Err(e @ BagError::Corrupt { .. }) => damage = Some(e.to_string()),
            Err(e) => return Err(e),
        }
    }
    Ok((scan.topics(), damage))
}

/// What the summary section says.
struct Summary {
    schemas: HashMap<u16, String>,
    channels: HashMap<u16, ChannelInfo>,
    /// From its Statistics record, when it has one.
    channel_message_counts: Option<HashMap<u16, u64>>,
}

/// The summary section through the Footer before the closing magic; `None` for a file without
/// either (a recording that was cut off) or with no summary.
fn read_summary(file: &mut File, size: u64) -> Result<Option<Summary>, String> {
    if size < MAGIC.len() as u64 * 2 + FOOTER_LEN {
        return Ok(None);
    }
    let mut tail = [0u8; FOOTER_LEN as usize + 8];
    let io = |e: std::io::Error| e.to_string();
    file.seek(SeekFrom::Start(size - tail.len() as u64)).map_err(io)?;
    file.read_exact(&mut tail).map_err(io)?;
    if &tail[FOOTER_LEN as usize..] != MAGIC {
        return Ok(None);
    }
    let footer = &tail[..FOOTER_LEN as usize];
    let mut f = Fields::new(footer);
    if f.array::<1>("footer opcode")? != [op::FOOTER] || f.u64("footer length")? != FOOTER_LEN - 9 {
        return Err("no Footer record before the closing magic".into());
    }
    let (summary_start, _, summary_crc) =
        (f.u64("summary start")?, f.u64("summary offset start")?, f.u32("summary crc")?);
    let footer_at = size - tail.len() as u64;
    if summary_start == 0 {
        return Ok(None);
    }
    if summary_start < MAGIC.len() as u64 || summary_start > footer_at {
        return Err(format!("the footer puts the summary at byte {summary_start}, outside the file"));
    }
    if footer_at - summary_start > DAMAGED_READ_LIMIT {
        return Err(format!(
            "the footer gives the summary {} bytes, more than a summary holds",
            footer_at - summary_start
        ));
    }
    let mut bytes = Vec::with_capacity((footer_at - summary_start) as usize);
    file.seek(SeekFrom::Start(summary_start)).map_err(io)?;
    file.take(footer_at - summary_start).read_to_end(&mut bytes).map_err(io)?;
    if summary_crc != 0 {
        // The CRC covers the summary section and the Footer up to its own field.
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes);
        crc.update(&footer[..FOOTER_LEN as usize - 4]);
        if crc.finalize() != summary_crc {
            return Err("its CRC does not match".into());
        }
    }
    let (records, left) = frame(&bytes);
    if left > 0 {
        return Err(format!("its last {left} bytes are no complete record"));
    }
    let mut summary = Summary { schemas: HashMap::new(), channels: HashMap::new(), channel_message_counts: None };
    for (opcode, body) in records {
        match parse(opcode, body).map_err(|e| format!("record opcode 0x{opcode:02x}: {e}"))? {
            Parsed::Schema { id, name } => {
                summary.schemas.insert(id, name);
            }
            Parsed::Channel { id, info } => {
                summary.channels.insert(id, info);
            }
            Parsed::Statistics { channel_message_counts } => {
                summary.channel_message_counts = Some(channel_message_counts)
            }
            _ => {}
        }
    }
    Ok(Some(summary))
}
