mod common;

use lidar_kernels::cloud::{write_field, Cloud, CloudError, Datatype, Header, PointCloud2, PointField, PointLayout};
use proptest::prelude::*;
use std::borrow::Cow;

/// An independent CDR writer for the test (either endianness), so that decoding is not checked
/// against the library's own encoder only.
struct TestCdr {
    buf: Vec<u8>,
    be: bool,
}

impl TestCdr {
    fn new(be: bool) -> Self {
        Self { buf: vec![0, if be { 0 } else { 1 }, 0, 0], be }
    }
    fn pad(&mut self, n: usize) {
        while (self.buf.len() - 4) % n != 0 {
            self.buf.push(0);
        }
    }
    fn u32(&mut self, v: u32) {
        self.pad(4);
        let b = if self.be { v.to_be_bytes() } else { v.to_le_bytes() };
        self.buf.extend_from_slice(&b);
    }
    fn string(&mut self, s: &str) {
        self.u32(s.len() as u32 + 1);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }
    fn message(msg: &PointCloud2<'_>, be: bool) -> Vec<u8> {
        let mut w = TestCdr::new(be);
        w.u32(msg.header.stamp_sec as u32);
        w.u32(msg.header.stamp_nanosec);
        w.string(&msg.header.frame_id);
        w.u32(msg.height);
        w.u32(msg.width);
        w.u32(msg.fields.len() as u32);
        for f in &msg.fields {
            w.string(&f.name);
            w.u32(f.offset);
            w.buf.push(f.datatype);
            w.u32(f.count);
        }
        w.buf.push(msg.is_bigendian as u8);
        w.u32(msg.point_step);
        w.u32(msg.row_step);
        w.u32(msg.data.len() as u32);
        w.buf.extend_from_slice(&msg.data);
        w.buf.push(msg.is_dense as u8);
        w.buf
    }
}

/// Stores `v` (already representable in `dt`) at `at`, independently of the library's encoder.
fn store(at: &mut [u8], dt: u8, v: f64, be: bool) {
    macro_rules! put {
        ($x:expr) => {{
            let b = if be { $x.to_be_bytes() } else { $x.to_le_bytes() };
            at[..b.len()].copy_from_slice(&b);
        }};
    }
    match dt {
        1 => put!(v as i8),
        2 => put!(v as u8),
        3 => put!(v as i16),
        4 => put!(v as u16),
        5 => put!(v as i32),
        6 => put!(v as u32),
        7 => put!(v as f32),
        8 => put!(v),
        _ => unreachable!(),
    }
}

fn size_of(dt: u8) -> u32 {
    [0, 1, 1, 2, 2, 4, 4, 4, 8][dt as usize]
}

/// A value exactly representable in `dt` (and in f32 after conversion, for the integer types).
fn value_for(dt: u8, seed: u64) -> f64 {
    let s = (seed % 200) as f64;
    match dt {
        1 => s - 100.0,
        2 => s,
        3 => s * 100.0 - 10000.0,
        4 => s * 300.0,
        5 => s * 1000.0 - 100_000.0,
        6 => s * 4000.0,
        _ => (seed as f64 * 0.37).sin() * 100.0,
    }
}

#[derive(Debug, Clone)]
struct Case {
    dts: Vec<u8>, // datatypes of x, y, z, then extra fields
    gaps: Vec<u32>,
    tail_pad: u32,
    row_pad: u32,
    height: u32,
    width: u32,
    be: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(1u8..=8, 3..7),
        prop::collection::vec(0u32..6, 7),
        0u32..9,
        0u32..17,
        0u32..4,
        0u32..40,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(dts, gaps, tail_pad, row_pad, height, width, be, seed)| Case {
            dts,
            gaps,
            tail_pad,
            row_pad,
            height,
            width,
            be,
            seed,
        })
}

/// Builds the message bytes and the expected channels for `c`.
fn build(c: &Case) -> (Vec<u8>, Vec<String>, Vec<Vec<f32>>) {
    let names: Vec<String> = (0..c.dts.len())
        .map(|i| match i {
            0 => "x".to_string(),
            1 => "y".to_string(),
            2 => "z".to_string(),
            k => format!("f{k}"),
        })
        .collect();
    // Fields are declared in a shuffled order to check that x, y, z are found by name.
    let mut offset = 0;
    let mut fields = Vec::new();
    for (i, &dt) in c.dts.iter().enumerate() {
        offset += c.gaps[i];
        fields.push(PointField { name: names[i].clone(), offset, datatype: dt, count: 1 });
        offset += size_of(dt);
    }
    let shift = (c.seed % fields.len() as u64) as usize;
    fields.rotate_left(shift);
    let point_step = offset + c.tail_pad;
    let row_step = point_step * c.width + c.row_pad;
    let n = (c.height * c.width) as usize;
    let mut data = vec![0xAAu8; (row_step * c.height) as usize];
    let mut expected = vec![Vec::new(); c.dts.len()];
    for p in 0..n {
        let (r, col) = (p as u32 / c.width.max(1), p as u32 % c.width.max(1));
        let base = (r * row_step + col * point_step) as usize;
        for (i, f) in fields.iter().enumerate() {
            let k = names.iter().position(|n| *n == f.name).unwrap();
            let v = value_for(f.datatype, c.seed.wrapping_add((p * 31 + i) as u64));
            store(&mut data[base + f.offset as usize..], f.datatype, v, c.be);
            expected[k].push(v as f32);
        }
    }
    let msg = PointCloud2 {
        header: Header { stamp_sec: 7, stamp_nanosec: 9, frame_id: "lidar".into() },
        height: c.height,
        width: c.width,
        fields,
        is_bigendian: c.be,
        point_step,
        row_step,
        data: Cow::Owned(data),
        is_dense: true,
    };
    (TestCdr::message(&msg, c.seed % 2 == 0), names, expected)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Any layout, datatype mix, padding, endianness (of the blob and of the CDR) and organization
    /// gathers to exactly the values stored.
    #[test]
    fn gathers_any_layout(c in case()) {
        let (bytes, names, expected) = build(&c);
        let (header, g) = Cloud::from_cdr(&bytes).unwrap();
        prop_assert_eq!(header.frame_id.as_str(), "lidar");
        prop_assert_eq!(g.dropped_non_finite, 0);
        prop_assert_eq!(g.cloud.len(), (c.height * c.width) as usize);
        for (k, name) in names.iter().enumerate() {
            prop_assert_eq!(g.cloud.channel(name).unwrap(), expected[k].as_slice(), "channel {}", name);
        }
    }

    /// Cutting a valid message anywhere gives an error, never a panic.
    #[test]
    fn truncation_is_an_error(c in case(), cut in 0.0f64..1.0) {
        let (bytes, _, _) = build(&c);
        let at = ((bytes.len() - 1) as f64 * cut) as usize;
        prop_assert!(Cloud::from_cdr(&bytes[..at]).is_err());
    }

    /// Integer fields take the value rounded half away from zero, as `f64::round` then a
    /// saturating cast: over any bits (NaN, infinities, huge values) and near every half.
    #[test]
    fn integer_fields_round_half_away(bits in any::<u64>(), k in -70_000i64..70_000, nudge in -2i32..=2, be in any::<bool>()) {
        let half = k as f64 + 0.5;
        let near_half = f64::from_bits((half.to_bits() as i64 + nudge as i64) as u64);
        for v in [f64::from_bits(bits), near_half, k as f64, -0.49999999999999994, 0.49999999999999994] {
            for dt in 1..=6u8 {
                let datatype = Datatype::from_u8(dt).unwrap();
                let (mut ours, mut expected) = ([0u8; 8], [0u8; 8]);
                write_field(&mut ours, datatype, 0, v, be);
                store(&mut expected, dt, v.round(), be);
                prop_assert_eq!(ours, expected, "{} as datatype {}", v, dt);
            }
        }
    }

    /// Arbitrary bytes never panic the decoder.
    #[test]
    fn garbage_never_panics(mut bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        if bytes.len() > 2 { bytes[0] = 0; bytes[1] = 1; }
        let _ = Cloud::from_cdr(&bytes);
    }

    /// The library encoder and decoder round-trip every channel of a float cloud.
    #[test]
    fn encode_decode_round_trip(points in prop::collection::vec((-1e3f32..1e3, -1e3f32..1e3, -1e3f32..1e3, 0f32..255.0), 0..200)) {
        let cloud = Cloud::from_xyz(points.iter().map(|p| p.0).collect(), points.iter().map(|p| p.1).collect(), points.iter().map(|p| p.2).collect())
            .with_channel("intensity", points.iter().map(|p| p.3).collect());
        let msg = PointCloud2::from_cloud(Header::default(), &cloud, &PointLayout::packed_for(&cloud));
        let (_, g) = Cloud::from_cdr(&msg.to_cdr()).unwrap();
        prop_assert_eq!(g.cloud, cloud);
    }
}

fn xyz_msg(fields: Vec<PointField>, point_step: u32, n: u32) -> PointCloud2<'static> {
    PointCloud2 {
        header: Header::default(),
        height: 1,
        width: n,
        fields,
        is_bigendian: false,
        point_step,
        row_step: point_step * n,
        data: Cow::Owned(vec![0; (point_step * n) as usize]),
        is_dense: false,
    }
}

fn xyz_fields() -> Vec<PointField> {
    ["x", "y", "z"].iter().enumerate().map(|(i, n)| PointField::new(n, 4 * i as u32, Datatype::Float32)).collect()
}

fn decode_err(msg: &PointCloud2<'_>) -> CloudError {
    Cloud::from_cdr(&msg.to_cdr()).unwrap_err()
}

#[test]
fn errors_name_the_problem() {
    let mut no_x = xyz_msg(xyz_fields(), 12, 4);
    no_x.fields.remove(0);
    assert_eq!(decode_err(&no_x), CloudError::MissingField("x"));
    assert!(decode_err(&no_x).to_string().contains("'x'"));

    let mut short = xyz_msg(xyz_fields(), 12, 4);
    short.data = Cow::Owned(vec![0; 47]);
    let e = decode_err(&short);
    assert!(matches!(e, CloudError::DataTooShort { data_len: 47, need: 48, .. }), "{e}");

    let past = xyz_msg(xyz_fields(), 10, 4);
    let e = decode_err(&past);
    assert!(e.to_string().contains("'z'") && e.to_string().contains("point_step 10"), "{e}");

    let mut unknown = xyz_msg(xyz_fields(), 12, 1);
    unknown.fields.push(PointField { name: "rgb".into(), offset: 0, datatype: 9, count: 1 });
    assert!(decode_err(&unknown).to_string().contains("'rgb' has unknown datatype 9"));

    let mut overflow = xyz_msg(xyz_fields(), 12, 1);
    overflow.fields.push(PointField { name: "big".into(), offset: 4, datatype: 8, count: u32::MAX });
    assert!(matches!(decode_err(&overflow), CloudError::Overflow { .. }));

    let mut huge = xyz_msg(xyz_fields(), 12, 1);
    huge.width = u32::MAX;
    huge.height = u32::MAX;
    huge.row_step = u32::MAX;
    assert!(Cloud::from_cdr(&huge.to_cdr()).is_err());

    let mut bad_row = xyz_msg(xyz_fields(), 12, 4);
    bad_row.row_step = 40;
    assert!(matches!(decode_err(&bad_row), CloudError::RowStepTooSmall { row_step: 40, .. }));

    assert!(matches!(Cloud::from_cdr(&[0, 7, 0, 0]).unwrap_err(), CloudError::BadEncapsulation(7)));
}

#[test]
fn non_finite_points_are_dropped_and_counted() {
    let x = vec![1.0, f32::NAN, 3.0, 4.0, f32::INFINITY];
    let y = vec![0.0, 0.0, f32::NEG_INFINITY, 0.5, 0.0];
    let z = vec![0.0; 5];
    let cloud = Cloud::from_xyz(x, y, z).with_channel("intensity", vec![10.0, 20.0, 30.0, 40.0, 50.0]);
    let mut msg = PointCloud2::from_cloud(Header::default(), &cloud, &PointLayout::packed_for(&cloud));
    msg.is_dense = false;
    let (_, g) = Cloud::from_cdr(&msg.to_cdr()).unwrap();
    assert_eq!(g.dropped_non_finite, 3);
    assert_eq!(g.cloud.x(), &[1.0, 4.0]);
    assert_eq!(g.cloud.intensity().unwrap(), &[10.0, 40.0]);
}

#[test]
fn intensity_aliases() {
    for name in ["intensity", "reflectivity", "i"] {
        let cloud = Cloud::from_points(&[[1.0, 2.0, 3.0]]).with_channel(name, vec![42.0]);
        let layout = PointLayout::packed_for(&cloud);
        let (_, g) = Cloud::from_cdr(&PointCloud2::from_cloud(Header::default(), &cloud, &layout).to_cdr()).unwrap();
        assert_eq!(g.cloud.intensity(), Some(&[42.0f32][..]), "{name}");
    }
}

/// The real Ouster scans through the ouster-ros 48-byte layout: x, y, z come back exactly and the
/// integer fields (ring, reflectivity) round-trip their integer values.
#[test]
fn ouster_scans_in_driver_layout() {
    for name in common::OUSTER_SCANS {
        let scan = common::load_ouster(name);
        let layout = PointLayout::ouster();
        let msg = PointCloud2::from_cloud(Header::default(), &scan, &layout);
        assert_eq!(msg.point_step, 48);
        let (_, g) = Cloud::from_cdr(&msg.to_cdr()).unwrap();
        assert_eq!(g.cloud.len(), scan.len(), "{name}");
        assert_eq!(g.cloud.x(), scan.x());
        assert_eq!(g.cloud.y(), scan.y());
        assert_eq!(g.cloud.z(), scan.z());
        assert_eq!(g.cloud.channel("ring").unwrap(), scan.channel("ring").unwrap());
        assert_eq!(g.cloud.channel("reflectivity").unwrap(), scan.channel("reflectivity").unwrap());
        // The scan has no intensity channel, so the driver's intensity field encodes as zero.
        assert!(g.cloud.channel("intensity").unwrap().iter().all(|v| *v == 0.0));
    }
}

/// Two fields of one name would be read as one channel (a second `x` at `y`'s offset gave outputs
/// with y = x): refused, naming the field. PCL's "_" padding placeholders may repeat and are not
/// channels.
#[test]
fn duplicate_field_names_are_refused() {
    let mut twice = xyz_msg(xyz_fields(), 16, 4);
    twice.fields.push(PointField::new("x", 12, Datatype::Float32));
    let e = decode_err(&twice);
    assert_eq!(e, CloudError::DuplicateField { name: "x".into() });
    assert!(e.to_string().contains("two fields named 'x'"), "{e}");

    let mut padded = xyz_msg(xyz_fields(), 20, 4);
    padded.fields.push(PointField::new("_", 12, Datatype::Uint8));
    padded.fields.push(PointField::new("_", 16, Datatype::Float32));
    let (_, g) = Cloud::from_cdr(&padded.to_cdr()).unwrap();
    assert_eq!(g.cloud.names(), ["x", "y", "z"]);
}
