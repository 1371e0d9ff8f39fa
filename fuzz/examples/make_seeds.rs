//! Writes the seed corpus of every fuzz target into `fuzz/corpus/<target>/` (small files: real
//! Ouster points cut down from data/ouster, test-fixture-like clouds, small MCAP and rosbag2
//! sqlite3 bags, the pipeline configurations). Deterministic; run it again after a format change:
//!
//!   cargo run --manifest-path fuzz/Cargo.toml --example make_seeds [-- OUT_DIR]

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use lidar_kernels::bag::sample::{load_ouster_bin, ouster_cloud_message};
use lidar_kernels::bag::{McapBagWriter, WriterOptions, DEFAULT_QOS_PROFILES};
use lidar_kernels::cloud::{Cloud, Datatype, Header, PointCloud2, PointField, PointLayout, POINTCLOUD2_TYPE};
use lidar_kernels::ops::nms::Box3d;
use lidar_kernels::pipeline::outputs::boxes_message;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| root.join("corpus"));
    let data = root.join("../data/ouster");
    let header = Header { stamp_sec: 1_700_000_000, stamp_nanosec: 5, frame_id: "os_sensor".into() };

    // Clouds: 40 real Ouster points (ouster-ros 48-byte layout), and fixture-like layouts.
    let scan = load_ouster_bin(&data.join("os1-32_scan0.bin")).expect("read data/ouster/os1-32_scan0.bin");
    let first: Vec<usize> = (0..scan.len()).step_by(scan.len() / 40).take(40).collect();
    let ouster = ouster_cloud_message(&scan.select(&first), header.clone()).to_cdr();
    let clouds: Vec<(&str, Vec<u8>)> = vec![
        ("ouster_40pts", ouster.clone()),
        ("xyzi_packed_nan", xyzi_packed(&header)),
        ("organized_row_padding", organized(&header)),
        ("mixed_types_big_endian", mixed_big_endian(&header)),
        ("empty", PointCloud2::from_cloud(header.clone(), &Cloud::default(), &PointLayout::packed_f32(&["x", "y", "z"])).to_cdr()),
        ("cdr_be_encapsulation", cdr_be(&header)),
    ];
    for target in ["cdr_pointcloud2", "layout_gather"] {
        for (name, bytes) in &clouds {
            put(&out, target, name, bytes);
        }
    }

    // Box records, byte 0 selecting the NMS kind (0 rotated, 1 axis-aligned, 2 circle, +4 class-aware).
    let boxes = boxes(&header);
    for (sel, name) in [(0u8, "rotated"), (1, "axis_aligned"), (2, "circle"), (0x1c + 2, "circle_caps_class_aware")] {
        put(&out, "box_records", name, &[&[sel][..], &boxes].concat());
    }
    put(&out, "box_records", "f64_fields", &[&[4u8][..], &boxes_f64(&header)].concat());

    // MCAP bags: zstd chunks (the writer's default), plain chunks, and one cut in its middle.
    let tmp = std::env::temp_dir().join(format!("lidar_kernels_seeds_{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for (name, compress) in [("zstd_chunks", true), ("plain_chunks", false)] {
        let path = tmp.join(format!("{name}.mcap"));
        let opts = WriterOptions { compress, chunk_size: 2048, ..WriterOptions::default() };
        let mut w = McapBagWriter::create_file_with(&path, opts).unwrap();
        let points = w.add_topic("/ouster/points", POINTCLOUD2_TYPE).unwrap();
        let det = w.add_topic("/detections/boxes", POINTCLOUD2_TYPE).unwrap();
        w.write(points, 1_000, &ouster[..]).unwrap();
        w.write(det, 1_500, &boxes).unwrap();
        w.write(points, 2_000, &xyzi_packed(&header)).unwrap();
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        if name == "zstd_chunks" {
            put(&out, "mcap_reader", "zstd_chunks_cut", &bytes[..bytes.len() * 2 / 3]);
        }
        put(&out, "mcap_reader", name, &bytes);
    }

    // rosbag2 sqlite3 bags (test/bag.rs's schema), 512-byte pages to keep them small.
    let cloud_rows = [(1, 1, 2_000, ouster.clone()), (2, 2, 1_000, boxes.clone()), (3, 1, 1_000, xyzi_packed(&header))];
    let db = |name: &str, qos: bool, rows: &[(i64, i64, i64, Vec<u8>)]| {
        let path = tmp.join(format!("{name}.db3"));
        write_db3(&path, qos, rows);
        put(&out, "sqlite_reader", name, &std::fs::read(&path).unwrap());
    };
    db("jazzy_schema", true, &cloud_rows);
    db("no_qos_column", false, &cloud_rows[1..]);
    db("unknown_topic_id", true, &[(1, 1, 5, xyzi_packed(&header)), (2, 9, 6, vec![0, 1, 0, 0])]);
    let _ = std::fs::remove_dir_all(&tmp);

    // Pipeline configurations: the shipped file and partial sections as in test/config.rs.
    put(&out, "config_yaml", "pipeline", &std::fs::read(root.join("../config/pipeline.yaml")).unwrap());
    for (name, text) in [
        ("partial_fps", "fps: {start_index: 7}\n"),
        ("circle_class_aware", "nms: {kind: circle, threshold: 2.0, class_aware: true, post_max_size: 3}\n"),
        ("dynamic_float16", "voxelize: {mode: dynamic, features_dtype: float16, max_voxels: 9}\nfeatures: []\n"),
        ("fps_downsampled_knn", "fps: {input: downsampled, num_samples: 8}\nneighbors: {mode: knn, knn: {k: 3}}\n"),
        ("ball_query_minus_one", "neighbors: {ball_query: {radius: 2, min_radius: 0.5, nsample: 4, padding: minus_one}}\n"),
        ("stages_off", "voxelize: {enabled: false}\ndownsample: {enabled: false}\nfps: {enabled: false}\nneighbors: {enabled: false}\n"),
    ] {
        put(&out, "config_yaml", name, text.as_bytes());
    }
}

fn put(out: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = out.join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// 16-byte x, y, z, intensity float32 records, one point with a NaN x (test/cloud.rs style).
fn xyzi_packed(header: &Header) -> Vec<u8> {
    let n = 12;
    let mut x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
    x[4] = f32::NAN;
    let cloud = Cloud::from_xyz(x, (0..n).map(|i| (i % 3) as f32).collect(), vec![0.25; n])
        .with_channel("intensity", (0..n).map(|i| i as f32 * 10.0).collect());
    PointCloud2::from_cloud(header.clone(), &cloud, &PointLayout::packed_f32(&["x", "y", "z", "intensity"])).to_cdr()
}

/// An organized 3 x 4 cloud whose rows carry 8 bytes of padding (row_step > width * point_step).
fn organized(header: &Header) -> Vec<u8> {
    let (h, w, step) = (3u32, 4u32, 12u32);
    let row_step = w * step + 8;
    let mut data = vec![0u8; (row_step * h) as usize];
    for r in 0..h {
        for c in 0..w {
            let at = (r * row_step + c * step) as usize;
            for (k, v) in [c as f32, r as f32, 1.0].iter().enumerate() {
                data[at + 4 * k..at + 4 * k + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    let f = |n: &str, o: u32| PointField::new(n, o, Datatype::Float32);
    PointCloud2 {
        header: header.clone(),
        height: h,
        width: w,
        fields: vec![f("x", 0), f("y", 4), f("z", 8)],
        is_bigendian: false,
        point_step: step,
        row_step,
        data: Cow::Owned(data),
        is_dense: true,
    }
    .to_cdr()
}

/// Big-endian records of every integer width and float64, a padding field and a count-3 field.
fn mixed_big_endian(header: &Header) -> Vec<u8> {
    use Datatype::*;
    let fields = vec![
        PointField::new("x", 0, Float64),
        PointField::new("y", 8, Int32),
        PointField::new("z", 12, Int16),
        PointField::new("intensity", 14, Uint8),
        PointField::new("_", 15, Int8),
        PointField::new("ring", 16, Uint16),
        PointField { name: "normal".into(), offset: 18, datatype: Uint16 as u8, count: 3 },
        PointField::new("t", 24, Uint32),
        PointField::new("i", 28, Float32),
    ];
    let step = 32;
    let n = 6u32;
    let mut data = vec![0u8; (step * n) as usize];
    for i in 0..n as usize {
        let r = &mut data[i * step as usize..][..step as usize];
        r[0..8].copy_from_slice(&(i as f64 * 1.5).to_be_bytes());
        r[8..12].copy_from_slice(&(-(i as i32) * 3).to_be_bytes());
        r[12..14].copy_from_slice(&(i as i16 - 2).to_be_bytes());
        r[14] = 200 + i as u8;
        r[16..18].copy_from_slice(&(i as u16).to_be_bytes());
        r[24..28].copy_from_slice(&(i as u32 * 1_000_000).to_be_bytes());
        r[28..32].copy_from_slice(&(0.5f32 * i as f32).to_be_bytes());
    }
    PointCloud2 {
        header: header.clone(),
        height: 1,
        width: n,
        fields,
        is_bigendian: true,
        point_step: step,
        row_step: step * n,
        data: Cow::Owned(data),
        is_dense: true,
    }
    .to_cdr()
}

/// A 3-point xyz float32 cloud in big-endian CDR (encapsulation 0x0000), written by hand.
fn cdr_be(header: &Header) -> Vec<u8> {
    let mut b: Vec<u8> = vec![0, 0, 0, 0];
    let align = |b: &mut Vec<u8>, n: usize| {
        while (b.len() - 4) % n != 0 {
            b.push(0)
        }
    };
    let u32 = |b: &mut Vec<u8>, v: u32| {
        align(b, 4);
        b.extend_from_slice(&v.to_be_bytes())
    };
    let string = |b: &mut Vec<u8>, s: &str| {
        u32(b, s.len() as u32 + 1);
        b.extend_from_slice(s.as_bytes());
        b.push(0)
    };
    u32(&mut b, header.stamp_sec as u32);
    u32(&mut b, header.stamp_nanosec);
    string(&mut b, &header.frame_id);
    u32(&mut b, 1); // height
    u32(&mut b, 3); // width
    u32(&mut b, 3); // fields
    for (k, name) in ["x", "y", "z"].iter().enumerate() {
        string(&mut b, name);
        u32(&mut b, 4 * k as u32);
        b.push(Datatype::Float32 as u8);
        u32(&mut b, 1);
    }
    b.push(1); // is_bigendian: the records too
    u32(&mut b, 12);
    u32(&mut b, 36);
    u32(&mut b, 36);
    for i in 0..9 {
        b.extend_from_slice(&(i as f32 - 4.0).to_be_bytes());
    }
    b.push(1);
    b
}

fn box_set() -> (Vec<Box3d>, Vec<f32>, Vec<i32>) {
    let b = |x: f32, y: f32, l: f32, w: f32, yaw: f32| Box3d { x, y, z: 0.5, length: l, width: w, height: 1.6, yaw };
    let boxes = vec![
        b(0.0, 0.0, 4.2, 1.8, 0.0),
        b(0.3, 0.1, 4.0, 1.9, 0.05),
        b(10.0, -3.0, 0.8, 0.8, 1.2),
        b(10.2, -3.1, 0.9, 0.7, 1.3),
        b(-20.0, 5.0, 12.0, 2.5, -3.0),
        b(-20.0, 5.0, 0.0, 0.0, 0.0),
    ];
    (boxes, vec![0.9, 0.85, 0.6, 0.7, 0.3, 0.99], vec![1, 1, 2, 2, 3, 1])
}

fn boxes(header: &Header) -> Vec<u8> {
    let (b, s, l) = box_set();
    boxes_message(header, &b, &s, &l).into_cdr()
}

/// The same boxes with float64 fields in another order (a foreign detector's layout).
fn boxes_f64(header: &Header) -> Vec<u8> {
    let (b, s, l) = box_set();
    let names = ["score", "label", "x", "y", "z", "length", "width", "height", "yaw"];
    let fields: Vec<PointField> =
        names.iter().enumerate().map(|(k, n)| PointField::new(n, 8 * k as u32, Datatype::Float64)).collect();
    let step = 8 * names.len() as u32;
    let mut data = Vec::new();
    for i in 0..b.len() {
        let x = &b[i];
        for v in [s[i], l[i] as f32, x.x, x.y, x.z, x.length, x.width, x.height, x.yaw] {
            data.extend_from_slice(&(v as f64).to_le_bytes());
        }
    }
    PointCloud2 {
        header: header.clone(),
        height: 1,
        width: b.len() as u32,
        fields,
        is_bigendian: false,
        point_step: step,
        row_step: step * b.len() as u32,
        data: Cow::Owned(data),
        is_dense: true,
    }
    .to_cdr()
}

/// test/bag.rs's `write_db3` (the rosbag2 Jazzy schema); `qos: false` leaves out the
/// offered_qos_profiles column, as bags older than Foxy do.
fn write_db3(path: &Path, qos: bool, messages: &[(i64, i64, i64, Vec<u8>)]) {
    let _ = std::fs::remove_file(path);
    let conn = rusqlite::Connection::open(path).unwrap();
    let topics_table = if qos {
        "CREATE TABLE topics(id INTEGER PRIMARY KEY,name TEXT NOT NULL,type TEXT NOT NULL,serialization_format TEXT NOT NULL,offered_qos_profiles TEXT NOT NULL,type_description_hash TEXT NOT NULL);"
    } else {
        "CREATE TABLE topics(id INTEGER PRIMARY KEY,name TEXT NOT NULL,type TEXT NOT NULL,serialization_format TEXT NOT NULL);"
    };
    conn.execute_batch(&format!(
        "PRAGMA page_size=512;
         CREATE TABLE schema(schema_version INTEGER PRIMARY KEY,ros_distro TEXT NOT NULL);
         CREATE TABLE metadata(id INTEGER PRIMARY KEY,metadata_version INTEGER NOT NULL,metadata TEXT NOT NULL);
         {topics_table}
         CREATE TABLE messages(id INTEGER PRIMARY KEY,topic_id INTEGER NOT NULL,timestamp INTEGER NOT NULL, data BLOB NOT NULL);
         CREATE INDEX timestamp_idx ON messages (timestamp ASC);
         INSERT INTO schema VALUES (4, 'jazzy');"
    ))
    .unwrap();
    for (id, name) in [(1, "/ouster/points"), (2, "/detections/boxes")] {
        if qos {
            conn.execute(
                "INSERT INTO topics VALUES (?1, ?2, ?3, 'cdr', ?4, '')",
                rusqlite::params![id, name, POINTCLOUD2_TYPE, DEFAULT_QOS_PROFILES],
            )
            .unwrap();
        } else {
            conn.execute("INSERT INTO topics VALUES (?1, ?2, ?3, 'cdr')", rusqlite::params![id, name, POINTCLOUD2_TYPE])
                .unwrap();
        }
    }
    for (id, topic_id, ts, data) in messages {
        conn.execute("INSERT INTO messages VALUES (?1, ?2, ?3, ?4)", rusqlite::params![id, topic_id, ts, data]).unwrap();
    }
}
