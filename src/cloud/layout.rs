//! Point layouts: validating a PointCloud2's fields, gathering any layout into a [`Cloud`], and
//! writing a [`Cloud`] out in a chosen layout.

use super::{Cloud, CloudError, Datatype, PointCloud2, PointField};

/// A validated point layout. Every field fits inside `point_step` and has a known datatype.
#[derive(Debug, Clone, PartialEq)]
pub struct PointLayout {
    pub fields: Vec<PointField>,
    pub point_step: u32,
    pub big_endian: bool,
}

/// The result of gathering a PointCloud2.
#[derive(Debug, Clone, PartialEq)]
pub struct Gathered {
    pub cloud: Cloud,
    /// Points dropped because x, y or z was NaN or infinite.
    pub dropped_non_finite: usize,
}

impl PointLayout {
    /// Checks every field against `point_step`; x, y and z must be present.
    pub fn new(fields: Vec<PointField>, point_step: u32, big_endian: bool) -> Result<Self, CloudError> {
        for f in &fields {
            let dt = Datatype::from_u8(f.datatype)
                .ok_or_else(|| CloudError::UnknownDatatype { name: f.name.clone(), datatype: f.datatype })?;
            if f.count == 0 {
                return Err(CloudError::ZeroCount { name: f.name.clone() });
            }
            let size = dt.size().checked_mul(f.count).ok_or(CloudError::Overflow { what: "field size" })?;
            let end = f.offset.checked_add(size).ok_or(CloudError::Overflow { what: "field end" })?;
            if end > point_step {
                return Err(CloudError::FieldPastPointStep {
                    name: f.name.clone(),
                    offset: f.offset,
                    size,
                    point_step,
                });
            }
        }
        for axis in ["x", "y", "z"] {
            if !fields.iter().any(|f| f.name == axis) {
                return Err(CloudError::MissingField(axis));
            }
        }
        // Two fields of one name would be read as one channel, silently dropping the other
        // (padding placeholders "" and "_", as PCL writes them, are never read). A set, not a
        // scan of the fields before each: a message of 100k fields took seconds.
        let mut seen = std::collections::HashSet::with_capacity(fields.len());
        for f in &fields {
            if !is_padding_name(&f.name) && !seen.insert(f.name.as_str()) {
                return Err(CloudError::DuplicateField { name: f.name.clone() });
            }
        }
        Ok(Self { fields, point_step, big_endian })
    }

    /// Packed float32 fields, one per name, in order (`["x","y","z","intensity"]` is the 16-byte xyzi).
    pub fn packed_f32(names: &[&str]) -> Self {
        let fields =
            names.iter().enumerate().map(|(i, n)| PointField::new(n, 4 * i as u32, Datatype::Float32)).collect();
        Self { fields, point_step: 4 * names.len() as u32, big_endian: false }
    }

    /// Packed float32 fields named after every channel of `cloud`.
    pub fn packed_for(cloud: &Cloud) -> Self {
        let names: Vec<&str> = cloud.names().iter().map(String::as_str).collect();
        Self::packed_f32(&names)
    }

    /// The ouster-ros driver's 48-byte `ouster_ros::Point`.
    pub fn ouster() -> Self {
        use Datatype::*;
        let f = PointField::new;
        Self {
            fields: vec![
                f("x", 0, Float32),
                f("y", 4, Float32),
                f("z", 8, Float32),
                f("intensity", 16, Float32),
                f("t", 20, Uint32),
                f("reflectivity", 24, Uint16),
                f("ring", 26, Uint16),
                f("ambient", 28, Uint16),
                f("range", 32, Uint32),
            ],
            point_step: 48,
            big_endian: false,
        }
    }

    /// Fields that become cloud channels: single-element fields (names are unique, padding
    /// placeholders excluded), x/y/z first.
    pub fn channels(&self) -> Vec<&PointField> {
        let mut out: Vec<&PointField> =
            ["x", "y", "z"].iter().map(|a| self.fields.iter().find(|f| f.name == *a).expect("validated")).collect();
        let mut taken: std::collections::HashSet<&str> = ["x", "y", "z"].into_iter().collect();
        for f in &self.fields {
            if f.count == 1 && !is_padding_name(&f.name) && taken.insert(f.name.as_str()) {
                out.push(f);
            }
        }
        out
    }

    /// Serializes `cloud` into this layout. Fields without a channel of the same name are zero;
    /// integer fields take the value rounded to nearest and saturated to the type's range.
    pub fn encode(&self, cloud: &Cloud) -> Vec<u8> {
        let step = self.point_step as usize;
        let mut data = vec![0u8; step * cloud.len()];
        for f in &self.fields {
            let Some(values) = cloud.channel(&f.name) else { continue };
            let dt = Datatype::from_u8(f.datatype).expect("validated");
            let off = f.offset as usize;
            for (i, &v) in values.iter().enumerate() {
                let at = &mut data[i * step + off..];
                write_value(at, dt, v as f64, self.big_endian);
            }
        }
        data
    }
}

/// Field names that only mark padding bytes.
fn is_padding_name(name: &str) -> bool {
    name.is_empty() || name == "_"
}

macro_rules! put {
    ($at:expr, $v:expr, $be:expr) => {{
        let b = if $be { $v.to_be_bytes() } else { $v.to_le_bytes() };
        $at[..b.len()].copy_from_slice(&b);
    }};
}

/// `v` rounded half away from zero: `f64::round` up to the sign of a zero result, which no integer
/// field keeps. Inline because `f64::round` is a libm call on baseline x86_64 (no SSE4.1), and it
/// was much of the CPU downsample's record writing (BENCHMARKS.md, 2026-12-07 later).
#[inline]
fn round_half_away(v: f64) -> f64 {
    // From 2^52 up every f64 is an integer; NaN and the infinities pass through too.
    if v.is_nan() || v.abs() >= 4_503_599_627_370_496.0 {
        return v;
    }
    let t = v as i64 as f64; // the truncation, exact below 2^52
    let frac = v - t; // exact: the fractional bits of v
    if frac >= 0.5 {
        t + 1.0
    } else if frac <= -0.5 {
        t - 1.0
    } else {
        t
    }
}

#[inline]
pub(super) fn write_value(at: &mut [u8], dt: Datatype, v: f64, be: bool) {
    let r = || round_half_away(v);
    match dt {
        Datatype::Int8 => put!(at, (r() as i8), be),
        Datatype::Uint8 => put!(at, (r() as u8), be),
        Datatype::Int16 => put!(at, (r() as i16), be),
        Datatype::Uint16 => put!(at, (r() as u16), be),
        Datatype::Int32 => put!(at, (r() as i32), be),
        Datatype::Uint32 => put!(at, (r() as u32), be),
        Datatype::Float32 => put!(at, (v as f32), be),
        Datatype::Float64 => put!(at, v, be),
    }
}

macro_rules! read_column {
    ($ty:ty, $n:literal, $msg:expr, $off:expr, $out:expr) => {{
        let be = $msg.is_bigendian;
        for_each_point($msg, |p| {
            let b: [u8; $n] = p[$off..$off + $n].try_into().unwrap();
            let v = if be { <$ty>::from_be_bytes(b) } else { <$ty>::from_le_bytes(b) };
            $out.push(v as f32);
        });
    }};
}

/// Calls `f` with the bytes of every point, row by row (rows may carry padding after the points).
fn for_each_point(msg: &PointCloud2<'_>, mut f: impl FnMut(&[u8])) {
    // An empty cloud may still claim up to 2^32 - 1 rows of width 0: walking them took seconds.
    if msg.width == 0 {
        return;
    }
    let step = msg.point_step as usize;
    for row in 0..msg.height as usize {
        let row_bytes = &msg.data[row * msg.row_step as usize..];
        for col in 0..msg.width as usize {
            f(&row_bytes[col * step..(col + 1) * step]);
        }
    }
}

/// Checks the message's sizes: returns its layout once every point is known to lie inside `data`.
pub fn validate(msg: &PointCloud2<'_>) -> Result<PointLayout, CloudError> {
    let layout = PointLayout::new(msg.fields.clone(), msg.point_step, msg.is_bigendian)?;
    // The gather makes one float column per channel: more channels than bytes per point (plus
    // x, y, z) means fields overlapping at the same bytes, and would let a message of a few MB
    // gather into terabytes (points x channels floats).
    let channels = 3 + layout
        .fields
        .iter()
        .filter(|f| f.count == 1 && !is_padding_name(&f.name) && !["x", "y", "z"].contains(&f.name.as_str()))
        .count();
    if channels as u64 > msg.point_step as u64 + 3 {
        return Err(CloudError::TooManyChannels { channels, point_step: msg.point_step });
    }
    let points = msg.num_points();
    if points > 0 && msg.point_step == 0 {
        return Err(CloudError::ZeroPointStep { points });
    }
    let min_row = (msg.width as u64)
        .checked_mul(msg.point_step as u64)
        .ok_or(CloudError::Overflow { what: "width * point_step" })?;
    if msg.height > 0 && (msg.row_step as u64) < min_row {
        return Err(CloudError::RowStepTooSmall {
            row_step: msg.row_step,
            width: msg.width,
            point_step: msg.point_step,
        });
    }
    let need = (msg.row_step as u64)
        .checked_mul(msg.height as u64)
        .ok_or(CloudError::Overflow { what: "row_step * height" })?;
    // The last row needs only its points, not its trailing padding.
    let need_exact = if msg.height == 0 { 0 } else { need - msg.row_step as u64 + min_row };
    if (msg.data.len() as u64) < need_exact {
        return Err(CloudError::DataTooShort {
            data_len: msg.data.len(),
            row_step: msg.row_step,
            height: msg.height,
            need,
        });
    }
    Ok(layout)
}

/// Gathers every single-element field of `msg` into a float32 [`Cloud`], whatever the datatypes,
/// offsets, padding, endianness and organization. Points whose x, y or z is not finite are dropped
/// and counted (whatever `is_dense` claims: a wrong flag must not let NaN reach the operators).
pub fn gather(msg: &PointCloud2<'_>) -> Result<Gathered, CloudError> {
    Ok(gather_valid(msg, &validate(msg)?))
}

/// [`gather`] of a message already validated into `layout`.
pub(super) fn gather_valid(msg: &PointCloud2<'_>, layout: &PointLayout) -> Gathered {
    let n = msg.num_points() as usize;
    let channels = layout.channels();
    let mut columns: Vec<Vec<f32>> = Vec::with_capacity(channels.len());
    for f in &channels {
        let mut out = Vec::with_capacity(n);
        let off = f.offset as usize;
        match Datatype::from_u8(f.datatype).expect("validated") {
            Datatype::Int8 => read_column!(i8, 1, msg, off, out),
            Datatype::Uint8 => read_column!(u8, 1, msg, off, out),
            Datatype::Int16 => read_column!(i16, 2, msg, off, out),
            Datatype::Uint16 => read_column!(u16, 2, msg, off, out),
            Datatype::Int32 => read_column!(i32, 4, msg, off, out),
            Datatype::Uint32 => read_column!(u32, 4, msg, off, out),
            Datatype::Float32 => read_column!(f32, 4, msg, off, out),
            Datatype::Float64 => read_column!(f64, 8, msg, off, out),
        }
        columns.push(out);
    }
    let finite: Vec<bool> =
        (0..n).map(|i| columns[0][i].is_finite() && columns[1][i].is_finite() && columns[2][i].is_finite()).collect();
    let dropped_non_finite = finite.iter().filter(|f| !**f).count();
    if dropped_non_finite > 0 {
        for c in &mut columns {
            let mut keep = finite.iter();
            c.retain(|_| *keep.next().unwrap());
        }
    }
    let mut it = columns.into_iter();
    let mut cloud = Cloud::from_xyz(it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    for (f, values) in channels[3..].iter().zip(it) {
        cloud = cloud.with_channel(&f.name, values);
    }
    Gathered { cloud, dropped_non_finite }
}

/// The value of field `f` in the point record `p`, widened to f64 (exact for every datatype).
pub(super) fn read_f64(p: &[u8], dt: Datatype, offset: usize, be: bool) -> f64 {
    macro_rules! get {
        ($ty:ty, $n:literal) => {{
            let b: [u8; $n] = p[offset..offset + $n].try_into().unwrap();
            (if be { <$ty>::from_be_bytes(b) } else { <$ty>::from_le_bytes(b) }) as f64
        }};
    }
    match dt {
        Datatype::Int8 => get!(i8, 1),
        Datatype::Uint8 => get!(u8, 1),
        Datatype::Int16 => get!(i16, 2),
        Datatype::Uint16 => get!(u16, 2),
        Datatype::Int32 => get!(i32, 4),
        Datatype::Uint32 => get!(u32, 4),
        Datatype::Float32 => get!(f32, 4),
        Datatype::Float64 => get!(f64, 8),
    }
}
