//! Operator results as PointCloud2 messages: the topics `replay` writes and the nodes publish.
//! Integer values (indices, counts, coordinates) travel in INT32/UINT32 fields; the cloud type is
//! float32, exact for integers below 2^24 (16.7 M points), far above any lidar scan.

use crate::cloud::{Cloud, Datatype, Header, PointCloud2, PointField, PointLayout};
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
pub fn voxels_message(header: &Header, centroids: &Cloud, num_points: &[u32], coords_zyx: &[[i32; 3]]) -> PointCloud2<'static> {
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
    let pick = |col: &[f32]| -> Vec<f32> {
        indices.iter().map(|&i| if i < 0 { f32::NAN } else { col[i as usize] }).collect()
    };
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
