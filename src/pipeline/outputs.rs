//! Operator results as PointCloud2 messages: the topics `replay` writes and the nodes publish.
//! Integer values (indices, counts, coordinates) travel in INT32/UINT32 fields; the cloud type is
//! float32, exact for integers below 2^24 (16.7 M points), far above any lidar scan.

use crate::cloud::{CdrWriter, Cloud, Datatype, Header, PointCloud2, PointField, PointLayout};
use crate::ops::nms::Box3d;

/// Fields of a box record, the format boxes travel in between programs.
pub const BOX_FIELDS: [&str; 9] = ["x", "y", "z", "length", "width", "height", "yaw", "score", "label"];

fn layout(fields: &[(&str, Datatype)]) -> PointLayout {
    let mut offset = 0;
    let fields = fields
        .iter()
        .map(|(name, dt)| {
            let f = PointField::new(name, offset, *dt);
            offset += dt.size();
            f
        })
        .collect();
    PointLayout { fields, point_step: offset, big_endian: false }
}

/// One point per voxel: centroid x, y, z, mean intensity (when the features have one), the number of
/// points and the voxel's grid coordinates.
pub fn voxels_message(
    header: &Header,
    centroids: &Cloud,
    num_points: &[u32],
    coords_zyx: &[[i32; 3]],
) -> PointCloud2<'static> {
    use Datatype::*;
    let mut fields = vec![("x", Float32), ("y", Float32), ("z", Float32)];
    let mut cloud = Cloud::from_xyz(centroids.x().to_vec(), centroids.y().to_vec(), centroids.z().to_vec());
    if let Some(i) = centroids.intensity() {
        fields.push(("intensity", Float32));
        cloud = cloud.with_channel("intensity", i.to_vec());
    }
    fields.extend([("num_points", Uint32), ("voxel_z", Int32), ("voxel_y", Int32), ("voxel_x", Int32)]);
    let cloud = cloud
        .with_channel("num_points", num_points.iter().map(|&n| n as f32).collect())
        .with_channel("voxel_z", coords_zyx.iter().map(|c| c[0] as f32).collect())
        .with_channel("voxel_y", coords_zyx.iter().map(|c| c[1] as f32).collect())
        .with_channel("voxel_x", coords_zyx.iter().map(|c| c[2] as f32).collect());
    PointCloud2::from_cloud(header.clone(), &cloud, &layout(&fields))
}

/// Points in the input's own field layout (so downstream code sees the fields it already knows).
pub fn points_message(header: &Header, cloud: &Cloud, input_layout: &PointLayout) -> PointCloud2<'static> {
    PointCloud2::from_cloud(header.clone(), cloud, input_layout)
}

/// Neighbourhoods as an organized cloud, the grouping a PointNet++ layer consumes: row q holds the
/// `width` neighbours of query q (x, y, z and the point index); padding slots have index -1 and NaN
/// coordinates, so the message is not dense.
pub fn neighborhoods_message(header: &Header, points: &Cloud, indices: &[i32], width: usize) -> PointCloud2<'static> {
    use Datatype::*;
    let pick =
        |col: &[f32]| -> Vec<f32> { indices.iter().map(|&i| if i < 0 { f32::NAN } else { col[i as usize] }).collect() };
    let cloud = Cloud::from_xyz(pick(points.x()), pick(points.y()), pick(points.z()))
        .with_channel("index", indices.iter().map(|&i| i as f32).collect());
    let layout = layout(&[("x", Float32), ("y", Float32), ("z", Float32), ("index", Int32)]);
    let mut msg = PointCloud2::from_cloud(header.clone(), &cloud, &layout);
    let rows = if width == 0 { 0 } else { indices.len() / width };
    msg.height = rows as u32;
    msg.width = width as u32;
    msg.row_step = layout.point_step * width as u32;
    msg.is_dense = !indices.iter().any(|&i| i < 0);
    msg
}

/// Box records (x y z length width height yaw score label).
pub fn boxes_message(header: &Header, boxes: &[Box3d], scores: &[f32], labels: &[i32]) -> PointCloud2<'static> {
    let col = |f: fn(&Box3d) -> f32| boxes.iter().map(f).collect::<Vec<f32>>();
    let cloud = Cloud::from_xyz(col(|b| b.x), col(|b| b.y), col(|b| b.z))
        .with_channel("length", col(|b| b.length))
        .with_channel("width", col(|b| b.width))
        .with_channel("height", col(|b| b.height))
        .with_channel("yaw", col(|b| b.yaw))
        .with_channel("score", scores.to_vec())
        .with_channel("label", labels.iter().map(|&l| l as f32).collect());
    let mut fields: Vec<(&str, Datatype)> = BOX_FIELDS[..8].iter().map(|n| (*n, Datatype::Float32)).collect();
    fields.push(("label", Datatype::Int32));
    PointCloud2::from_cloud(header.clone(), &cloud, &layout(&fields))
}

/// Reads box records back (any layout carrying the box fields).
pub fn boxes_from_cloud(cloud: &Cloud) -> Result<(Vec<Box3d>, Vec<f32>, Vec<i32>), String> {
    let col = |name: &str| cloud.channel(name).ok_or_else(|| format!("box records lack field '{name}'"));
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
        let half = b.yaw as f64 * 0.5;
        let pose = [b.x as f64, b.y as f64, b.z as f64, 0.0, 0.0, half.sin(), half.cos()];
        let scale = [b.length as f64, b.width as f64, b.height as f64];
        let label = labels.get(i).copied().unwrap_or(0);
        let color = LABEL_COLORS[label.rem_euclid(LABEL_COLORS.len() as i32) as usize];
        write_marker(&mut w, header, ns, i as i32, MARKER_CUBE, MARKER_ADD, pose, scale, color);
    }
    w.finish()
}
