//! PointCloud2 in and out: CDR decoding without copying the point blob, gathering any field layout
//! into a float32 structure-of-arrays [`Cloud`], and encoding clouds back into PointCloud2.

pub mod cdr;
mod layout;

use rayon::prelude::*;
use std::borrow::Cow;

pub use cdr::{CdrReader, CdrWriter};
pub use layout::{gather, validate, Gathered, PointLayout};
use layout::{gather_valid, read_f64, write_value};

/// ROS message type names, as rosbag2 and the ROS graph spell them.
pub const POINTCLOUD2_TYPE: &str = "sensor_msgs/msg/PointCloud2";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CloudError {
    #[error("message truncated while reading {what}: needs {need} bytes, has {have}")]
    Truncated { what: &'static str, need: usize, have: usize },
    #[error("unsupported CDR encapsulation 0x{0:04x} (expected 0x0000 CDR_BE or 0x0001 CDR_LE)")]
    BadEncapsulation(u16),
    #[error("{what} is not valid UTF-8")]
    BadString { what: &'static str },
    #[error("size overflow computing {what}")]
    Overflow { what: &'static str },
    #[error("PointCloud2 has no field '{0}'")]
    MissingField(&'static str),
    #[error("PointCloud2 has two fields named '{name}'")]
    DuplicateField { name: String },
    #[error("field '{name}' has unknown datatype {datatype} (expected 1..=8, INT8..FLOAT64)")]
    UnknownDatatype { name: String, datatype: u8 },
    #[error("field '{name}' (offset {offset}, {size} bytes) ends past point_step {point_step}")]
    FieldPastPointStep { name: String, offset: u32, size: u32, point_step: u32 },
    #[error("{channels} single-element fields in a point_step of {point_step} bytes: fields overlap (at most point_step + 3)")]
    TooManyChannels { channels: usize, point_step: u32 },
    #[error("field '{name}' has count 0")]
    ZeroCount { name: String },
    #[error("point_step is 0 but the cloud has {points} points")]
    ZeroPointStep { points: u64 },
    #[error("row_step {row_step} is smaller than width {width} x point_step {point_step}")]
    RowStepTooSmall { row_step: u32, width: u32, point_step: u32 },
    #[error("data has {data_len} bytes, shorter than row_step {row_step} x height {height} = {need}")]
    DataTooShort { data_len: usize, row_step: u32, height: u32, need: u64 },
}

/// PointField.datatype values (sensor_msgs/PointField constants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Datatype {
    Int8 = 1,
    Uint8 = 2,
    Int16 = 3,
    Uint16 = 4,
    Int32 = 5,
    Uint32 = 6,
    Float32 = 7,
    Float64 = 8,
}

impl Datatype {
    pub fn from_u8(v: u8) -> Option<Self> {
        use Datatype::*;
        Some(match v {
            1 => Int8,
            2 => Uint8,
            3 => Int16,
            4 => Uint16,
            5 => Int32,
            6 => Uint32,
            7 => Float32,
            8 => Float64,
            _ => return None,
        })
    }

    pub fn size(self) -> u32 {
        use Datatype::*;
        match self {
            Int8 | Uint8 => 1,
            Int16 | Uint16 => 2,
            Int32 | Uint32 | Float32 => 4,
            Float64 => 8,
        }
    }

    /// True when float32 cannot hold every value of the type (32-bit integers, float64): means of
    /// such fields are computed from the f64 values of the records, not from the float32 channels.
    pub fn wider_than_f32(self) -> bool {
        matches!(self, Datatype::Int32 | Datatype::Uint32 | Datatype::Float64)
    }
}

/// sensor_msgs/PointField. `datatype` stays the raw byte so that an unknown value can be reported.
#[derive(Debug, Clone, PartialEq)]
pub struct PointField {
    pub name: String,
    pub offset: u32,
    pub datatype: u8,
    pub count: u32,
}

impl PointField {
    pub fn new(name: &str, offset: u32, datatype: Datatype) -> Self {
        Self { name: name.to_string(), offset, datatype: datatype as u8, count: 1 }
    }

    /// Fields of the given names and datatypes packed one after the other, and the point step.
    pub fn packed<'n>(fields: impl IntoIterator<Item = (&'n str, Datatype)>) -> (Vec<PointField>, u32) {
        let mut offset = 0;
        let fields = fields
            .into_iter()
            .map(|(name, dt)| {
                let f = PointField::new(name, offset, dt);
                offset += dt.size();
                f
            })
            .collect();
        (fields, offset)
    }
}

/// std_msgs/Header.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Header {
    pub stamp_sec: i32,
    pub stamp_nanosec: u32,
    pub frame_id: String,
}

impl Header {
    pub fn read(r: &mut CdrReader<'_>) -> Result<Self, CloudError> {
        Ok(Self {
            stamp_sec: r.i32("header.stamp.sec")?,
            stamp_nanosec: r.u32("header.stamp.nanosec")?,
            frame_id: r.string("header.frame_id")?,
        })
    }

    pub fn write(&self, w: &mut CdrWriter) {
        w.i32(self.stamp_sec);
        w.u32(self.stamp_nanosec);
        w.string(&self.frame_id);
    }

    /// Stamp in nanoseconds, used as the log time of bag records.
    pub fn stamp_ns(&self) -> u64 {
        (self.stamp_sec.max(0) as u64) * 1_000_000_000 + self.stamp_nanosec as u64
    }
}

/// sensor_msgs/PointCloud2. `data` borrows from the CDR buffer when decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct PointCloud2<'a> {
    pub header: Header,
    pub height: u32,
    pub width: u32,
    pub fields: Vec<PointField>,
    pub is_bigendian: bool,
    pub point_step: u32,
    pub row_step: u32,
    pub data: Cow<'a, [u8]>,
    pub is_dense: bool,
}

impl<'a> PointCloud2<'a> {
    /// Decodes CDR bytes; the point blob is borrowed, not copied.
    pub fn from_cdr(bytes: &'a [u8]) -> Result<Self, CloudError> {
        let mut r = CdrReader::new(bytes)?;
        let header = Header::read(&mut r)?;
        let height = r.u32("height")?;
        let width = r.u32("width")?;
        // A PointField takes at least 4 (name length) + 4 + 1 + 4 bytes.
        let n_fields = r.seq_len("fields", 13)?;
        let mut fields = Vec::with_capacity(n_fields);
        for _ in 0..n_fields {
            fields.push(PointField {
                name: r.string("fields[].name")?,
                offset: r.u32("fields[].offset")?,
                datatype: r.u8("fields[].datatype")?,
                count: r.u32("fields[].count")?,
            });
        }
        let is_bigendian = r.bool("is_bigendian")?;
        let point_step = r.u32("point_step")?;
        let row_step = r.u32("row_step")?;
        let data = r.byte_seq("data")?;
        let is_dense = r.bool("is_dense")?;
        Ok(Self {
            header,
            height,
            width,
            fields,
            is_bigendian,
            point_step,
            row_step,
            data: Cow::Borrowed(data),
            is_dense,
        })
    }

    /// Encodes as little-endian CDR (the layout of the point blob is whatever `data` holds).
    pub fn to_cdr(&self) -> Vec<u8> {
        let mut w = CdrWriter::new();
        self.header.write(&mut w);
        w.u32(self.height);
        w.u32(self.width);
        w.u32(self.fields.len() as u32);
        for f in &self.fields {
            w.string(&f.name);
            w.u32(f.offset);
            w.u8(f.datatype);
            w.u32(f.count);
        }
        w.bool(self.is_bigendian);
        w.u32(self.point_step);
        w.u32(self.row_step);
        w.byte_seq(&self.data);
        w.bool(self.is_dense);
        w.finish()
    }

    pub fn num_points(&self) -> u64 {
        self.height as u64 * self.width as u64
    }

    /// Builds an unorganized (height 1) message holding `cloud` in `layout`.
    pub fn from_cloud(header: Header, cloud: &Cloud, layout: &PointLayout) -> PointCloud2<'static> {
        let data = layout.encode(cloud);
        PointCloud2 {
            header,
            height: 1,
            width: cloud.len() as u32,
            fields: layout.fields.clone(),
            is_bigendian: layout.big_endian,
            point_step: layout.point_step,
            row_step: layout.point_step * cloud.len() as u32,
            data: Cow::Owned(data),
            is_dense: true,
        }
    }
}

/// A decoded PointCloud2 whose layout has been validated: every point record lies inside `data`.
/// The pipeline validates a cloud once, into this view, and every stage takes the view.
#[derive(Debug, Clone)]
pub struct CloudView<'a> {
    pub msg: PointCloud2<'a>,
    pub layout: PointLayout,
    /// Datatype and offset of the x, y, z fields.
    xyz: [(Datatype, usize); 3],
    /// Rows follow each other without padding: point `i` starts at `i * point_step`.
    contiguous: bool,
}

impl<'a> CloudView<'a> {
    /// Decodes CDR bytes (the point blob stays borrowed) and validates the layout.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, CloudError> {
        Self::new(PointCloud2::from_cdr(bytes)?)
    }

    pub fn new(msg: PointCloud2<'a>) -> Result<Self, CloudError> {
        let layout = validate(&msg)?;
        let ch = layout.channels();
        let xyz = [0, 1, 2].map(|a| (Datatype::from_u8(ch[a].datatype).expect("validated"), ch[a].offset as usize));
        let contiguous = msg.height <= 1 || msg.row_step as u64 == msg.width as u64 * msg.point_step as u64;
        Ok(Self { msg, layout, xyz, contiguous })
    }

    /// Points in the message, finite or not.
    pub fn len(&self) -> usize {
        self.msg.num_points() as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The float32 structure-of-arrays cloud of [`gather`].
    pub fn gather(&self) -> Gathered {
        gather_valid(&self.msg, &self.layout)
    }

    /// The bytes of point `i` (row-major over an organized cloud), `point_step` long.
    pub fn record(&self, i: usize) -> &[u8] {
        let step = self.layout.point_step as usize;
        let start = if self.contiguous {
            i * step
        } else {
            let w = self.msg.width as usize;
            (i / w) * self.msg.row_step as usize + (i % w) * step
        };
        &self.msg.data[start..start + step]
    }

    /// Field `f` of point `i`, widened to f64 (exact for every datatype).
    pub fn value(&self, f: &PointField, i: usize) -> f64 {
        let dt = Datatype::from_u8(f.datatype).expect("validated");
        self.value_at(dt, f.offset as usize, i)
    }

    /// The value of type `dt` at byte `offset` of point `i` (a field's datatype and offset).
    pub fn value_at(&self, dt: Datatype, offset: usize, i: usize) -> f64 {
        read_f64(self.record(i), dt, offset, self.layout.big_endian)
    }

    /// x, y, z of point `i` as float32, the values [`gather`] produces.
    pub fn xyz(&self, i: usize) -> [f32; 3] {
        let r = self.record(i);
        self.xyz.map(|(dt, off)| read_f64(r, dt, off, self.layout.big_endian) as f32)
    }

    /// For every gathered point, the index of its record in the message: the identity when no
    /// point was dropped as non-finite (the common case, known without reading the data).
    pub fn source_indices(&self, dropped_non_finite: usize) -> SourceIndex {
        if dropped_non_finite == 0 {
            return SourceIndex::Identity;
        }
        let keep = (0..self.len()).filter(|&i| self.xyz(i).iter().all(|v| v.is_finite()));
        SourceIndex::Map(keep.map(|i| i as u32).collect())
    }
}

/// Maps gathered point indices to message record indices (see [`CloudView::source_indices`]).
#[derive(Debug, Clone, PartialEq)]
pub enum SourceIndex {
    Identity,
    Map(Vec<u32>),
}

impl SourceIndex {
    pub fn get(&self, i: usize) -> usize {
        match self {
            SourceIndex::Identity => i,
            SourceIndex::Map(m) => m[i] as usize,
        }
    }
}

/// Record bytes copied per task by [`CloudMessage::from_records`].
const COPY_CHUNK: usize = 256 << 10;

/// Bytes an allocator lends for one message and takes back when they drop (on any thread): the
/// CUDA backend's page-locked buffers, which its copies write into without a staging copy.
pub trait LentBytes: Send + Sync {
    fn bytes(&self) -> &[u8];
    fn bytes_mut(&mut self) -> &mut [u8];
}

/// The encoded bytes of a message: its own heap buffer, or bytes lent by an allocator.
pub enum MessageBytes {
    Heap(Vec<u8>),
    Lent(Box<dyn LentBytes>),
}

impl MessageBytes {
    /// `len` zero bytes on the heap.
    pub fn zeroed(len: usize) -> Self {
        MessageBytes::Heap(vec![0; len])
    }
}

impl std::ops::Deref for MessageBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            MessageBytes::Heap(v) => v,
            MessageBytes::Lent(b) => b.bytes(),
        }
    }
}

impl std::ops::DerefMut for MessageBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            MessageBytes::Heap(v) => v,
            MessageBytes::Lent(b) => b.bytes_mut(),
        }
    }
}

/// A clone is a heap copy (the lender's buffer stays with the original).
impl Clone for MessageBytes {
    fn clone(&self) -> Self {
        MessageBytes::Heap(self.to_vec())
    }
}

impl std::fmt::Debug for MessageBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if matches!(self, MessageBytes::Heap(_)) { "heap" } else { "lent" };
        write!(f, "MessageBytes({} bytes, {kind})", self.len())
    }
}

impl From<Vec<u8>> for MessageBytes {
    fn from(v: Vec<u8>) -> Self {
        MessageBytes::Heap(v)
    }
}

/// A PointCloud2 written straight into its CDR bytes: the header and fields first, then the point
/// records filled in place, so an output is encoded once, with no intermediate copy of its data.
#[derive(Debug, Clone)]
pub struct CloudMessage {
    cdr: MessageBytes,
    data: std::ops::Range<usize>,
    points: usize,
}

impl CloudMessage {
    /// A little- (or big-) endian message of `height` x `width` zeroed records of `point_step`
    /// bytes, dense until [`Self::set_dense`] says otherwise.
    pub fn new(
        header: &Header,
        height: usize,
        width: usize,
        fields: &[PointField],
        point_step: u32,
        big_endian: bool,
    ) -> Self {
        Self::in_bytes(header, height, width, fields, point_step, big_endian, MessageBytes::zeroed)
    }

    /// [`Self::new`] in bytes from `alloc` (called once with the encoded length), whose records
    /// are left as `alloc` gives them: for a caller that writes every record byte.
    pub fn in_bytes(
        header: &Header,
        height: usize,
        width: usize,
        fields: &[PointField],
        point_step: u32,
        big_endian: bool,
        alloc: impl FnOnce(usize) -> MessageBytes,
    ) -> Self {
        let prefix = Self::prefix(header, height, width, fields, point_step, big_endian);
        let data = prefix.len()..prefix.len() + height * width * point_step as usize;
        let mut cdr = alloc(data.end + 1);
        assert_eq!(cdr.len(), data.end + 1, "message bytes");
        cdr[..prefix.len()].copy_from_slice(&prefix);
        cdr[data.end] = 1; // is_dense
        Self { cdr, data, points: height * width }
    }

    /// A message whose records are `records` (`height * width * point_step` bytes), copied once.
    pub fn from_records(
        header: &Header,
        (height, width): (usize, usize),
        fields: &[PointField],
        point_step: u32,
        big_endian: bool,
        records: &[u8],
    ) -> Self {
        assert_eq!(records.len(), height * width * point_step as usize, "record bytes");
        let prefix = Self::prefix(header, height, width, fields, point_step, big_endian);
        let data = prefix.len()..prefix.len() + records.len();
        let mut cdr = Vec::with_capacity(data.end + 1);
        cdr.extend_from_slice(&prefix);
        // In parallel (the records are up to tens of MB: `voxel_features`), into the spare
        // capacity, so the bytes are written once.
        let spare = &mut cdr.spare_capacity_mut()[..records.len()];
        spare.par_chunks_mut(COPY_CHUNK).zip(records.par_chunks(COPY_CHUNK)).for_each(|(dst, src)| {
            for (d, s) in dst.iter_mut().zip(src) {
                d.write(*s);
            }
        });
        // SAFETY: the prefix and every record byte have been written.
        unsafe { cdr.set_len(data.end) };
        cdr.push(1); // is_dense
        Self { cdr: MessageBytes::Heap(cdr), data, points: height * width }
    }

    /// The CDR bytes before the records: header, sizes, fields, and the records' length.
    fn prefix(
        header: &Header,
        height: usize,
        width: usize,
        fields: &[PointField],
        point_step: u32,
        big_endian: bool,
    ) -> Vec<u8> {
        let mut w = CdrWriter::new();
        header.write(&mut w);
        w.u32(height as u32);
        w.u32(width as u32);
        w.u32(fields.len() as u32);
        for f in fields {
            w.string(&f.name);
            w.u32(f.offset);
            w.u8(f.datatype);
            w.u32(f.count);
        }
        w.bool(big_endian);
        w.u32(point_step);
        w.u32(point_step * width as u32);
        w.u32((height * width * point_step as usize) as u32);
        w.finish()
    }

    /// The point records (row-major), to be filled.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.cdr[self.data.clone()]
    }

    pub fn set_dense(&mut self, dense: bool) {
        *self.cdr.last_mut().expect("is_dense") = dense as u8;
    }

    pub fn num_points(&self) -> usize {
        self.points
    }

    /// The encoded message.
    pub fn cdr(&self) -> &[u8] {
        &self.cdr
    }

    pub fn into_cdr(self) -> MessageBytes {
        self.cdr
    }

    /// The message decoded again (borrowing the bytes) with its validated layout.
    pub fn view(&self) -> CloudView<'_> {
        CloudView::decode(&self.cdr).expect("an encoded message decodes")
    }
}

/// An unorganized message in `view`'s layout whose point `i` is record `pick(i)` of `view`, copied
/// byte for byte: every field keeps its datatype and value.
pub fn select_records(header: &Header, view: &CloudView<'_>, picks: &[usize]) -> CloudMessage {
    let l = &view.layout;
    let mut m = CloudMessage::new(header, 1, picks.len(), &l.fields, l.point_step, l.big_endian);
    // In parallel: every pick is a random read from the input (a cache and TLB miss each), and
    // the FPS samples come last in a frame, on its critical path.
    if l.point_step > 0 {
        let step = l.point_step as usize;
        m.data_mut().par_chunks_mut(step * SELECT_CHUNK).zip(picks.par_chunks(SELECT_CHUNK)).for_each(
            |(out, picks)| {
                for (rec, &i) in out.chunks_exact_mut(step).zip(picks) {
                    rec.copy_from_slice(view.record(i));
                }
            },
        );
    }
    m
}

/// Records each task of [`select_records`] copies.
const SELECT_CHUNK: usize = 256;

/// Writes `v` as type `dt` at byte `offset` of the record `at` (integers rounded to nearest and
/// saturated).
#[inline]
pub fn write_field(at: &mut [u8], dt: Datatype, offset: usize, v: f64, big_endian: bool) {
    write_value(&mut at[offset..], dt, v, big_endian);
}

/// Field names accepted as intensity, in order of preference.
pub const INTENSITY_NAMES: [&str; 3] = ["intensity", "reflectivity", "i"];
/// Field names accepted as the per-point time offset, in order of preference.
pub const TIME_NAMES: [&str; 3] = ["t", "time", "timestamp"];

/// A float32 structure-of-arrays cloud. Channels 0, 1, 2 are always x, y, z; the rest keep the
/// names of the PointCloud2 fields they came from (intensity, ring, t, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Cloud {
    names: Vec<String>,
    columns: Vec<Vec<f32>>,
}

impl Default for Cloud {
    fn default() -> Self {
        Self::from_xyz(Vec::new(), Vec::new(), Vec::new())
    }
}

impl Cloud {
    pub fn from_xyz(x: Vec<f32>, y: Vec<f32>, z: Vec<f32>) -> Self {
        assert!(x.len() == y.len() && y.len() == z.len(), "x, y, z lengths differ");
        Self { names: vec!["x".into(), "y".into(), "z".into()], columns: vec![x, y, z] }
    }

    /// Builds a cloud from interleaved `[x, y, z]` points.
    pub fn from_points(points: &[[f32; 3]]) -> Self {
        Self::from_xyz(
            points.iter().map(|p| p[0]).collect(),
            points.iter().map(|p| p[1]).collect(),
            points.iter().map(|p| p[2]).collect(),
        )
    }

    /// A cloud from row-major values `[n, stride]` (per-voxel means, for instance): column `k` of
    /// each row is channel `k`, named `names[k]` (x, y, z first; only `names.len()` columns are used).
    pub fn from_row_major(values: &[f32], stride: usize, names: &[String]) -> Cloud {
        let column = |k: usize| -> Vec<f32> { values.iter().skip(k).step_by(stride).copied().collect() };
        let mut cloud = Cloud::from_xyz(column(0), column(1), column(2));
        for (k, name) in names.iter().enumerate().skip(3).take(stride.saturating_sub(3)) {
            cloud = cloud.with_channel(name, column(k));
        }
        cloud
    }

    /// Adds a channel; panics when its length differs from the cloud's (a programming error).
    pub fn with_channel(mut self, name: &str, values: Vec<f32>) -> Self {
        assert_eq!(values.len(), self.len(), "channel '{name}' length");
        self.names.push(name.to_string());
        self.columns.push(values);
        self
    }

    pub fn len(&self) -> usize {
        self.columns[0].len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn x(&self) -> &[f32] {
        &self.columns[0]
    }
    pub fn y(&self) -> &[f32] {
        &self.columns[1]
    }
    pub fn z(&self) -> &[f32] {
        &self.columns[2]
    }
    pub fn point(&self, i: usize) -> [f32; 3] {
        [self.columns[0][i], self.columns[1][i], self.columns[2][i]]
    }
    pub fn names(&self) -> &[String] {
        &self.names
    }
    pub fn columns(&self) -> &[Vec<f32>] {
        &self.columns
    }
    pub fn num_channels(&self) -> usize {
        self.columns.len()
    }
    pub fn channel(&self, name: &str) -> Option<&[f32]> {
        self.names.iter().position(|n| n == name).map(|i| self.columns[i].as_slice())
    }
    /// Intensity under any of its usual names.
    pub fn intensity(&self) -> Option<&[f32]> {
        INTENSITY_NAMES.iter().find_map(|n| self.channel(n))
    }
    /// Per-point time offset under any of its usual names.
    pub fn time(&self) -> Option<&[f32]> {
        TIME_NAMES.iter().find_map(|n| self.channel(n))
    }

    /// The points at `indices`, in that order, with every channel.
    pub fn select(&self, indices: &[usize]) -> Cloud {
        Cloud {
            names: self.names.clone(),
            columns: self.columns.iter().map(|c| indices.iter().map(|&i| c[i]).collect()).collect(),
        }
    }

    /// Indices of the named channels (`intensity` matches any of [`INTENSITY_NAMES`]); the name of
    /// the first one missing is the error.
    pub fn channel_indices(names: &[String], wanted: &[String]) -> Result<Vec<usize>, String> {
        wanted
            .iter()
            .map(|w| {
                let own = [w.as_str()];
                let aliases: &[&str] = if w == "intensity" { &INTENSITY_NAMES } else { &own };
                aliases.iter().find_map(|a| names.iter().position(|n| n == a)).ok_or_else(|| w.clone())
            })
            .collect()
    }

    /// x, y, z plus the channels at `indices` (see [`Self::channel_indices`]), in that order.
    pub fn with_channels(&self, indices: &[usize]) -> Cloud {
        let mut out = Cloud::from_xyz(self.x().to_vec(), self.y().to_vec(), self.z().to_vec());
        for &c in indices {
            out = out.with_channel(&self.names[c], self.columns[c].clone());
        }
        out
    }

    /// x, y, z plus the named channels, in that order and under those names (`intensity` keeps its
    /// name whichever alias it was found under; see [`Self::channel_indices`]).
    pub fn with_features(&self, features: &[String]) -> Result<Cloud, String> {
        let mut out = self.with_channels(&Self::channel_indices(&self.names, features)?);
        out.names[3..].clone_from_slice(features);
        Ok(out)
    }

    /// Decodes CDR PointCloud2 bytes and gathers them (see [`gather`]).
    pub fn from_cdr(bytes: &[u8]) -> Result<(Header, Gathered), CloudError> {
        let msg = PointCloud2::from_cdr(bytes)?;
        let gathered = gather(&msg)?;
        Ok((msg.header, gathered))
    }
}
