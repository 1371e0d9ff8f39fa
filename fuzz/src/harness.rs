//! The body of every fuzz target, shared with the regression tests (`test/fuzz_regressions.rs`
//! includes this file with `#[path]`), so that a stored finding is replayed through exactly the
//! code that found it. Only `lidar_kernels`, `serde_yaml` and `std` are used here.
//!
//! Contract of every function: any input is fine, an `Err` from the library is fine; a panic, an
//! abort, a hang or a huge allocation is a finding. The `assert!`s state properties the product
//! relies on (a validated cloud's records lie inside its data, a loaded config reloads, ...).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lidar_kernels::bag::{self, BagError};
use lidar_kernels::cloud::{
    gather, select_records, Cloud, CloudView, Header, PointCloud2, PointLayout, POINTCLOUD2_TYPE,
};
use lidar_kernels::ops::nms::{Box3d, NmsKind};
use lidar_kernels::pipeline::outputs::{boxes_from_cloud, boxes_message, markers_cdr};
use lidar_kernels::pipeline::stages::check_rules;
use lidar_kernels::pipeline::{Pipeline, PipelineConfig};

/// CDR bytes -> [`CloudView::decode`]; a cloud that validates has every field of every point
/// read the way the stages read them (`xyz`, `value`, the record copy of `samples`), and
/// re-encodes to the same message.
pub fn cdr_pointcloud2(data: &[u8]) {
    let Ok(view) = CloudView::decode(data) else { return };
    let n = view.len();
    let step = view.layout.point_step as usize;
    let channels: Vec<_> = view.layout.channels().into_iter().cloned().collect();
    for i in 0..n {
        assert_eq!(view.record(i).len(), step);
        let _ = view.xyz(i);
        for f in &channels {
            let _ = view.value(f, i);
        }
    }
    // The `samples` output copies records byte for byte; the copy must decode to the same records.
    let picks: Vec<usize> = (0..n).rev().collect();
    let copy = select_records(&view.msg.header, &view, &picks);
    let copied = copy.view();
    assert_eq!(copied.len(), n);
    for (k, &i) in picks.iter().enumerate() {
        assert_eq!(copied.record(k), view.record(i));
    }
    // Decode -> encode -> decode is the identity (the node re-publishes what it decoded).
    let bytes = view.msg.to_cdr();
    let back = PointCloud2::from_cdr(&bytes).expect("a re-encoded PointCloud2 decodes");
    assert_eq!(back, view.msg);
    CloudView::new(back).expect("a re-encoded valid PointCloud2 validates");
}

/// CDR bytes -> a validated view -> its `gather()`, the layout gather every stage starts from.
/// Checks it against the view's own per-point reads and against the free [`gather`].
pub fn layout_gather(data: &[u8]) {
    let Ok(view) = CloudView::decode(data) else { return };
    // The gather allocates one float per point and channel: that must stay linear in the message's
    // size, or a small message (fields overlapping at one byte) takes gigabytes on a node.
    let floats = view.len() as u64 * view.layout.channels().len() as u64;
    assert!(floats <= 4 * data.len() as u64, "{floats} floats gathered from a message of {} bytes", data.len());
    let g = view.gather();
    let cloud = &g.cloud;
    assert_eq!(cloud.len() + g.dropped_non_finite, view.len());
    assert_eq!(cloud.num_channels(), view.layout.channels().len());
    assert!(cloud.columns().iter().all(|c| c.len() == cloud.len()));
    let source = view.source_indices(g.dropped_non_finite);
    for i in 0..cloud.len() {
        let p = cloud.point(i);
        assert!(p.iter().all(|v| v.is_finite()), "gather keeps only finite points");
        let r = view.xyz(source.get(i));
        assert_eq!(p.map(f32::to_bits), r.map(f32::to_bits), "gathered point {i}");
    }
    // The free `gather` (validate + gather) gives the same cloud, bit for bit (NaN != NaN).
    let bits = |g: &lidar_kernels::cloud::Gathered| {
        let cols: Vec<Vec<u32>> = g.cloud.columns().iter().map(|c| c.iter().map(|v| v.to_bits()).collect()).collect();
        (g.cloud.names().to_vec(), cols, g.dropped_non_finite)
    };
    assert_eq!(bits(&gather(&view.msg).expect("a validated message gathers")), bits(&g));
    // Writing the cloud back out in its own layout (what `PointCloud2::from_cloud` does for the
    // outputs) must not fail on any layout that validated.
    let _ = view.layout.encode(cloud);
}

/// How a bag file of fuzz bytes is read: the way `replay` reads it.
fn bag_file(data: &[u8], ext: &str) {
    let path = scratch_file(ext);
    std::fs::write(&path, data).expect("write the scratch bag file");
    read_bag(&path, data.len());
    let _ = std::fs::remove_file(&path);
}

/// Bytes written to `x.mcap` -> [`bag::open`] -> every message of `messages(None)` (and of the
/// first PointCloud2 topic alone, the path of `replay --topic`).
pub fn mcap_reader(data: &[u8]) {
    bag_file(data, "mcap");
}

/// Bytes written to `x.db3` -> [`bag::open`] -> every message, as [`mcap_reader`].
pub fn sqlite_reader(data: &[u8]) {
    bag_file(data, "db3");
}

/// Opens and reads a bag as `replay` does; `size` bounds how many items a sound reader can yield.
pub fn read_bag(path: &Path, size: usize) {
    let Ok(reader) = bag::open(path) else { return };
    let _ = (reader.topics(), reader.damage(), reader.message_count(), reader.files());
    let cloud_topic = reader.topics().iter().find(|t| t.type_name == POINTCLOUD2_TYPE).map(|t| t.name.clone());
    drain(reader.messages(None), size);
    if let Some(t) = cloud_topic {
        drain(reader.messages_of_type(&t, POINTCLOUD2_TYPE), size);
    }
}

/// Iterates a message stream to its end, decoding every PointCloud2 as `replay` does. A stream
/// ends after its first error other than `Skipped`, and cannot yield more items than the file
/// has records (each takes at least a few bytes).
fn drain(messages: bag::Messages<'_>, size: usize) {
    let limit = 64 + size;
    let mut items = 0usize;
    let mut ended = false;
    for item in messages {
        assert!(!ended, "a bag stream yielded an item after its final error");
        items += 1;
        assert!(items <= limit, "a bag stream of {size} bytes yields more than {limit} items");
        match item {
            Ok(m) => {
                if m.type_name == POINTCLOUD2_TYPE {
                    if let Ok(pc) = m.point_cloud() {
                        let _ = CloudView::new(pc);
                    }
                }
            }
            Err(BagError::Skipped { .. }) => {}
            Err(_) => ended = true,
        }
    }
}

/// Byte 0 picks the NMS parameters (kind, class awareness, caps), the rest is a CDR PointCloud2 of
/// box records -> `Pipeline::process_boxes_cdr` on the CPU engine -> the `boxes` and `markers`
/// outputs, as the NMS node and `replay` publish them.
pub fn box_records(data: &[u8]) {
    let Some((&sel, cdr)) = data.split_first() else { return };
    let mut cfg = PipelineConfig::default();
    let nms = &mut cfg.nms.params;
    nms.kind = [NmsKind::RotatedBev, NmsKind::AxisAligned, NmsKind::Circle][(sel % 3) as usize];
    nms.threshold = if nms.kind == NmsKind::Circle { 1.0 } else { 0.5 };
    nms.class_aware = sel & 0x04 != 0;
    if sel & 0x08 != 0 {
        nms.pre_max_size = Some(1 + (sel >> 5) as usize);
    }
    if sel & 0x10 != 0 {
        nms.post_max_size = Some(1 + (sel >> 6) as usize);
    }
    let mut pipeline = Pipeline::new(cfg);
    let Ok(kept) = pipeline.process_boxes_cdr(cdr) else { return };
    let n = kept.nms.keep.len();
    assert!(n <= kept.nms.candidates);
    assert!(kept.boxes.len() == n && kept.scores.len() == n && kept.labels.len() == n);
    let out = kept.message();
    let view = out.view();
    let g = view.gather();
    let (boxes, scores, labels) = boxes_from_cloud(&g.cloud).expect("the boxes output holds box records");
    assert_eq!(boxes.len() + g.dropped_non_finite, n);
    let _ = (scores, labels);
    let _ = markers_cdr(&kept.header, &kept.boxes, &kept.labels, "fuzz");
}

/// YAML text -> [`PipelineConfig::from_yaml`]; a config that loads passes its validation and
/// stage rules, serializes and reloads to itself, and runs (CPU engine) on a small fixed cloud and
/// a few box records, as `replay --config` does.
pub fn config_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(cfg) = PipelineConfig::from_yaml(text, "fuzz.yaml") else { return };
    cfg.validate().expect("a loaded config validates");
    check_rules(&cfg).expect("a loaded config satisfies the stage rules");
    let written = serde_yaml::to_string(&cfg).expect("a config serializes");
    let again = PipelineConfig::from_yaml(&written, "written.yaml").expect("a written config loads");
    assert_eq!(serde_yaml::to_string(&again).expect("serializes"), written, "a written config reloads to itself");
    run_config(cfg);
}

/// One frame of [`fixture_cloud_cdr`] and one of [`fixture_boxes_cdr`] through `cfg` (an `Err` is
/// fine: e.g. `fps.start_index` past the cloud).
pub fn run_config(cfg: PipelineConfig) {
    let nms = cfg.nms.enabled;
    let mut pipeline = Pipeline::new(cfg);
    if let Ok(frame) = pipeline.process_cdr(fixture_cloud_cdr()) {
        for (_, m) in frame.messages() {
            let _ = m.view();
        }
    }
    if nms {
        let _ = pipeline.process_boxes_cdr(fixture_boxes_cdr());
    }
}

/// A small fixed cloud (x, y, z, intensity, ring; 40 points over the default grids, two with a
/// NaN coordinate), the frame the config targets run.
pub fn fixture_cloud_cdr() -> &'static [u8] {
    static CDR: OnceLock<Vec<u8>> = OnceLock::new();
    CDR.get_or_init(|| {
        let n = 40;
        let f = |k: usize, s: f32| (0..n).map(|i| ((i * k) % 17) as f32 * s - 8.0 * s).collect::<Vec<f32>>();
        let mut x = f(7, 0.9);
        let y = f(5, 1.3);
        let z = f(3, 0.2);
        x[11] = f32::NAN;
        x[29] = f32::INFINITY;
        let cloud = Cloud::from_xyz(x, y, z)
            .with_channel("intensity", (0..n).map(|i| i as f32).collect())
            .with_channel("ring", (0..n).map(|i| (i % 4) as f32).collect());
        let layout = PointLayout::packed_f32(&["x", "y", "z", "intensity", "ring"]);
        let header = Header { stamp_sec: 1, stamp_nanosec: 2, frame_id: "fuzz".into() };
        PointCloud2::from_cloud(header, &cloud, &layout).to_cdr()
    })
}

/// A few fixed box records (overlapping pairs, two classes), the input of the NMS stage.
pub fn fixture_boxes_cdr() -> &'static [u8] {
    static CDR: OnceLock<Vec<u8>> = OnceLock::new();
    CDR.get_or_init(|| {
        let b = |x: f32, y: f32, yaw: f32| Box3d { x, y, z: 0.0, length: 4.0, width: 2.0, height: 1.5, yaw };
        let boxes = [b(0.0, 0.0, 0.0), b(0.5, 0.2, 0.1), b(10.0, 3.0, 1.0), b(10.2, 3.1, 1.1), b(-5.0, 7.0, -2.0)];
        let scores = [0.9, 0.8, 0.7, 0.95, 0.1];
        let labels = [0, 0, 1, 1, 2];
        let header = Header { stamp_sec: 1, stamp_nanosec: 2, frame_id: "fuzz".into() };
        boxes_message(&header, &boxes, &scores, &labels).cdr().to_vec()
    })
}

/// A scratch file `x.<ext>` of this process and thread (the tests run targets on several threads),
/// overwritten by every input.
fn scratch_file(ext: &str) -> PathBuf {
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    let dir = std::env::temp_dir().join(format!("lidar_kernels_fuzz_{}_{thread}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the scratch folder");
    dir.join(format!("x.{ext}"))
}
