//! Operator results as PointCloud2 messages: the topics `replay` writes and the nodes publish.
//! Integer values (indices, counts, coordinates) are written as INT32/UINT32 from the integers
//! themselves, exact for any cloud size; pass-through fields are copied from the input records.

use crate::cloud::{CdrWriter, Cloud, CloudMessage, CloudView, Datatype, Header, PointField, SourceIndex};
use crate::ops::detect::{Cluster, Detections, CLASS_NAMES};
use crate::ops::neighbors::for_each_record;
use crate::ops::nms::Box3d;
use std::borrow::Cow;

/// Fields of a box record, the format boxes travel in between programs.
pub const BOX_FIELDS: [&str; 9] = ["x", "y", "z", "length", "width", "height", "yaw", "score", "label"];

/// One column of a packed message.
enum Column<'a> {
    F32(Cow<'a, [f32]>),
    I32(Cow<'a, [i32]>),
    U32(Cow<'a, [u32]>),
}

impl Column<'_> {
    fn datatype(&self) -> Datatype {
        match self {
            Column::F32(_) => Datatype::Float32,
            Column::I32(_) => Datatype::Int32,
            Column::U32(_) => Datatype::Uint32,
        }
    }
    fn len(&self) -> usize {
        match self {
            Column::F32(v) => v.len(),
            Column::I32(v) => v.len(),
            Column::U32(v) => v.len(),
        }
    }
    fn put(&self, i: usize, at: &mut [u8]) {
        let b = match self {
            Column::F32(v) => v[i].to_le_bytes(),
            Column::I32(v) => v[i].to_le_bytes(),
            Column::U32(v) => v[i].to_le_bytes(),
        };
        at[..4].copy_from_slice(&b);
    }
}

/// A little-endian message of packed 4-byte fields, `height` rows of `width` points (row-major).
fn packed_message(header: &Header, height: usize, width: usize, columns: &[(&str, Column<'_>)]) -> CloudMessage {
    let n = height * width;
    assert!(columns.iter().all(|(_, c)| c.len() == n), "column lengths");
    let (fields, step) = PointField::packed(columns.iter().map(|(name, c)| (*name, c.datatype())));
    let step = step as usize;
    let mut m = CloudMessage::new(header, height, width, &fields, step as u32, false);
    for_each_record(m.data_mut(), step, |i, rec| {
        for (k, (_, c)) in columns.iter().enumerate() {
            c.put(i, &mut rec[4 * k..]);
        }
    });
    m
}

/// Box records (x y z length width height yaw score label).
pub fn boxes_message(header: &Header, boxes: &[Box3d], scores: &[f32], labels: &[i32]) -> CloudMessage {
    let col = |f: fn(&Box3d) -> f32| Column::F32(boxes.iter().map(f).collect());
    let columns = [
        ("x", col(|b| b.x)),
        ("y", col(|b| b.y)),
        ("z", col(|b| b.z)),
        ("length", col(|b| b.length)),
        ("width", col(|b| b.width)),
        ("height", col(|b| b.height)),
        ("yaw", col(|b| b.yaw)),
        ("score", Column::F32(scores.into())),
        ("label", Column::I32(labels.into())),
    ];
    packed_message(header, 1, boxes.len(), &columns)
}

/// `detections`: the boxes the detect stage kept, as box records in keep (score) order; `label` is
/// the class (0 car, 1 pedestrian, 2 cyclist, 3 unknown).
pub fn detections_message(header: &Header, d: &Detections) -> CloudMessage {
    let kept: Vec<&Cluster> = d.kept().collect();
    let boxes: Vec<Box3d> = kept.iter().map(|c| c.bbox).collect();
    let scores: Vec<f32> = kept.iter().map(|c| c.score).collect();
    let classes: Vec<i32> = kept.iter().map(|c| c.class).collect();
    boxes_message(header, &boxes, &scores, &classes)
}

/// `clusters`: every gathered point, in order: x, y, z, `index` (UINT32, its record in the input
/// message: every input field is one lookup away), `class` (UINT32: 0 object, 1 ground, 2 overhead,
/// 3 out of range) and `cluster` (INT32: its cluster's id, -1 for none).
pub fn clusters_message(header: &Header, view: &CloudView<'_>, source: &SourceIndex, d: &Detections) -> CloudMessage {
    let n = d.labels.len();
    let records: Vec<usize> = (0..n).map(|i| source.get(i)).collect();
    let xyz: Vec<[f32; 3]> = records.iter().map(|&r| view.xyz(r)).collect();
    let columns = [
        ("x", Column::F32(xyz.iter().map(|p| p[0]).collect())),
        ("y", Column::F32(xyz.iter().map(|p| p[1]).collect())),
        ("z", Column::F32(xyz.iter().map(|p| p[2]).collect())),
        ("index", Column::U32(records.iter().map(|&r| r as u32).collect())),
        ("class", Column::U32(d.point_class.iter().map(|&c| c as u32).collect())),
        ("cluster", Column::I32(d.labels.as_slice().into())),
    ];
    packed_message(header, 1, n, &columns)
}

/// Reads box records back (any layout carrying the box fields).
pub fn boxes_from_cloud(cloud: &Cloud) -> Result<(Vec<Box3d>, Vec<f32>, Vec<i32>), &'static str> {
    let col = |name: &'static str| cloud.channel(name).ok_or(name);
    let (l, w, h, yaw, score, label) =
        (col("length")?, col("width")?, col("height")?, col("yaw")?, col("score")?, col("label")?);
    let boxes = (0..cloud.len())
        .map(|i| {
            let [x, y, z] = cloud.point(i);
            Box3d { x, y, z, length: l[i], width: w[i], height: h[i], yaw: yaw[i] }
        })
        .collect();
    Ok((boxes, score.to_vec(), label.iter().map(|&v| v as i32).collect()))
}

/// ROS type of [`markers_cdr`]'s message.
pub const MARKER_ARRAY_TYPE: &str = "visualization_msgs/msg/MarkerArray";

/// Colours (RGBA) of the box markers, picked by label (cycled).
const LABEL_COLORS: [[f32; 4]; 6] = [
    [0.10, 0.80, 0.10, 0.5],
    [0.95, 0.55, 0.05, 0.5],
    [0.15, 0.45, 0.95, 0.5],
    [0.90, 0.15, 0.15, 0.5],
    [0.70, 0.20, 0.85, 0.5],
    [0.90, 0.90, 0.10, 0.5],
];

/// Marker `type` and `action` constants (visualization_msgs/msg/Marker).
pub const MARKER_CUBE: i32 = 1;
pub const MARKER_ADD: i32 = 0;
pub const MARKER_DELETEALL: i32 = 3;

/// One visualization_msgs/msg/Marker (ROS 2 Humble/Jazzy definition) into `w`.
#[allow(clippy::too_many_arguments)]
fn write_marker(
    w: &mut CdrWriter,
    header: &Header,
    ns: &str,
    id: i32,
    kind: i32,
    action: i32,
    pose: [f64; 7],
    scale: [f64; 3],
    color: [f32; 4],
) {
    header.write(w);
    w.string(ns);
    w.i32(id);
    w.i32(kind);
    w.i32(action);
    for v in pose.into_iter().chain(scale) {
        w.f64(v); // pose.position xyz, pose.orientation xyzw, scale xyz
    }
    for v in color {
        w.f32(v);
    }
    w.i32(0); // lifetime.sec (0: forever; the next frame's DELETEALL clears it)
    w.u32(0); // lifetime.nanosec
    w.bool(false); // frame_locked
    w.u32(0); // points[]
    w.u32(0); // colors[]
    w.string(""); // texture_resource
    Header::default().write(w); // texture: sensor_msgs/CompressedImage header
    w.string(""); // texture.format
    w.byte_seq(&[]); // texture.data
    w.u32(0); // uv_coordinates[]
    w.string(""); // text
    w.string(""); // mesh_resource
    w.string(""); // mesh_file.filename
    w.byte_seq(&[]); // mesh_file.data
    w.bool(false); // mesh_use_embedded_materials
}

/// The boxes as a CDR-encoded visualization_msgs/msg/MarkerArray for RViz: first one DELETEALL
/// marker (clears the previous frame's boxes in namespace `ns`), then one CUBE per box, id = its
/// position in `boxes`, pose from x, y, z (box centre) and yaw (quaternion about z), scale from
/// length, width, height, colour by label, every marker with `header` (the input's stamp and frame).
pub fn markers_cdr(header: &Header, boxes: &[Box3d], labels: &[i32], ns: &str) -> Vec<u8> {
    let mut w = CdrWriter::new();
    w.u32(boxes.len() as u32 + 1);
    write_marker(
        &mut w,
        header,
        ns,
        0,
        MARKER_CUBE,
        MARKER_DELETEALL,
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
        [0.0; 3],
        [0.0; 4],
    );
    for (i, b) in boxes.iter().enumerate() {
        let pose = box_pose(b);
        let scale = [b.length as f64, b.width as f64, b.height as f64];
        let label = labels.get(i).copied().unwrap_or(0);
        let color = LABEL_COLORS[label.rem_euclid(LABEL_COLORS.len() as i32) as usize];
        write_marker(&mut w, header, ns, i as i32, MARKER_CUBE, MARKER_ADD, pose, scale, color);
    }
    w.finish()
}

/// A box's centre and its yaw as a quaternion about z: position xyz, orientation xyzw.
fn box_pose(b: &Box3d) -> [f64; 7] {
    let half = b.yaw as f64 * 0.5;
    [b.x as f64, b.y as f64, b.z as f64, 0.0, 0.0, half.sin(), half.cos()]
}

/// ROS type of [`detections_3d_cdr`]'s message.
pub const DETECTION_3D_ARRAY_TYPE: &str = "vision_msgs/msg/Detection3DArray";

/// The detect stage's kept boxes as a CDR-encoded vision_msgs/msg/Detection3DArray (vision_msgs
/// 4.x, ROS 2 Humble/Jazzy), in keep order: one hypothesis per box (`class_id` car / pedestrian /
/// cyclist / unknown, the box's score; pose = the box centre and yaw, covariance all zero),
/// `bbox` the same pose and length, width, height, `id` the cluster's id.
pub fn detections_3d_cdr(header: &Header, d: &Detections) -> Vec<u8> {
    let mut w = CdrWriter::new();
    header.write(&mut w);
    w.u32(d.keep.len() as u32);
    for &k in &d.keep {
        let c = &d.clusters[k as usize];
        let pose = box_pose(&c.bbox);
        header.write(&mut w);
        w.u32(1); // results[]
        w.string(CLASS_NAMES[c.class.clamp(0, 3) as usize]);
        w.f64(c.score as f64);
        for v in pose {
            w.f64(v);
        }
        for _ in 0..36 {
            w.f64(0.0); // covariance: none estimated
        }
        for v in pose {
            w.f64(v);
        }
        for v in [c.bbox.length, c.bbox.width, c.bbox.height] {
            w.f64(v as f64);
        }
        w.string(&k.to_string());
    }
    w.finish()
}
