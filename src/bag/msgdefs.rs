//! ROS 2 message definitions embedded into written MCAP bags (schema encoding `ros2msg`).
//!
//! The `.msg` texts live in `msg/<package>/msg/<Type>.msg` and are compiled in with `include_str!`.
//! To support another type, add its file and those of its dependencies there and one line each to
//! [`MSG_FILES`]. [`full_definition`] concatenates a type with all its dependencies the way
//! rosbag2's `LocalMessageDefinitionSource` does, so the schema text is what `ros2 bag record`
//! would have written.

/// `(type name as "pkg/msg/Type", .msg text)` of every known message type.
pub const MSG_FILES: &[(&str, &str)] = &[
    ("builtin_interfaces/msg/Time", include_str!("../../msg/builtin_interfaces/msg/Time.msg")),
    ("std_msgs/msg/Header", include_str!("../../msg/std_msgs/msg/Header.msg")),
    ("sensor_msgs/msg/PointField", include_str!("../../msg/sensor_msgs/msg/PointField.msg")),
    ("sensor_msgs/msg/PointCloud2", include_str!("../../msg/sensor_msgs/msg/PointCloud2.msg")),
    // visualization_msgs/MarkerArray (the nms node's ~/markers) and its dependencies.
    ("builtin_interfaces/msg/Duration", include_str!("../../msg/builtin_interfaces/msg/Duration.msg")),
    ("std_msgs/msg/ColorRGBA", include_str!("../../msg/std_msgs/msg/ColorRGBA.msg")),
    ("geometry_msgs/msg/Point", include_str!("../../msg/geometry_msgs/msg/Point.msg")),
    ("geometry_msgs/msg/Quaternion", include_str!("../../msg/geometry_msgs/msg/Quaternion.msg")),
    ("geometry_msgs/msg/Pose", include_str!("../../msg/geometry_msgs/msg/Pose.msg")),
    ("geometry_msgs/msg/Vector3", include_str!("../../msg/geometry_msgs/msg/Vector3.msg")),
    ("sensor_msgs/msg/CompressedImage", include_str!("../../msg/sensor_msgs/msg/CompressedImage.msg")),
    ("visualization_msgs/msg/UVCoordinate", include_str!("../../msg/visualization_msgs/msg/UVCoordinate.msg")),
    ("visualization_msgs/msg/MeshFile", include_str!("../../msg/visualization_msgs/msg/MeshFile.msg")),
    ("visualization_msgs/msg/Marker", include_str!("../../msg/visualization_msgs/msg/Marker.msg")),
    ("visualization_msgs/msg/MarkerArray", include_str!("../../msg/visualization_msgs/msg/MarkerArray.msg")),
    // vision_msgs/Detection3DArray (the detect stage's boxes in bags) and its dependencies.
    ("geometry_msgs/msg/PoseWithCovariance", include_str!("../../msg/geometry_msgs/msg/PoseWithCovariance.msg")),
    ("vision_msgs/msg/ObjectHypothesis", include_str!("../../msg/vision_msgs/msg/ObjectHypothesis.msg")),
    (
        "vision_msgs/msg/ObjectHypothesisWithPose",
        include_str!("../../msg/vision_msgs/msg/ObjectHypothesisWithPose.msg"),
    ),
    ("vision_msgs/msg/BoundingBox3D", include_str!("../../msg/vision_msgs/msg/BoundingBox3D.msg")),
    ("vision_msgs/msg/Detection3D", include_str!("../../msg/vision_msgs/msg/Detection3D.msg")),
    ("vision_msgs/msg/Detection3DArray", include_str!("../../msg/vision_msgs/msg/Detection3DArray.msg")),
];

/// The 80 `=` line that separates the definitions of dependencies.
pub const SEPARATOR: &str = "================================================================================\n";

const PRIMITIVES: [&str; 14] = [
    "bool", "byte", "char", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
    "uint64", "string",
];

/// The `.msg` text of one type. Accepts `pkg/msg/Type` and `pkg/Type`.
pub fn msg_text(type_name: &str) -> Option<&'static str> {
    let full = normalize(type_name)?;
    MSG_FILES.iter().find(|(name, _)| *name == full).map(|(_, text)| *text)
}

/// Type names known to [`full_definition`].
pub fn known_types() -> impl Iterator<Item = &'static str> {
    MSG_FILES.iter().map(|(name, _)| *name)
}

/// `pkg/Type` or `pkg/msg/Type` -> `pkg/msg/Type`.
fn normalize(type_name: &str) -> Option<String> {
    let parts: Vec<&str> = type_name.split('/').collect();
    match parts.as_slice() {
        [pkg, ty] => Some(format!("{pkg}/msg/{ty}")),
        [pkg, "msg", ty] => Some(format!("{pkg}/msg/{ty}")),
        _ => None,
    }
}

/// Field types a `.msg` text refers to, as rosbag2 finds them: the first token of every line
/// (without an array suffix) that is not a primitive; a bare `Type` is qualified with `package`.
/// Sorted and deduplicated, like rosbag2's `std::set`.
fn dependencies(text: &str, package: &str) -> std::collections::BTreeSet<String> {
    let mut deps = std::collections::BTreeSet::new();
    for line in text.lines() {
        let line = line.trim_start();
        let end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '/')).unwrap_or(line.len());
        if end == 0 {
            continue;
        }
        let (ty, mut rest) = line.split_at(end);
        if let Some(after) = rest.strip_prefix('[') {
            match after.find(']') {
                Some(close) => rest = &after[close + 1..],
                None => continue,
            }
        }
        if !rest.starts_with(char::is_whitespace) || PRIMITIVES.contains(&ty) {
            continue;
        }
        deps.insert(if ty.contains('/') { ty.to_string() } else { format!("{package}/{ty}") });
    }
    deps
}

/// The complete `ros2msg` definition of `type_name`: its own text, then every dependency
/// (recursively, each once) preceded by [`SEPARATOR`] and `MSG: pkg/Type`.
/// Errors with the name of the first type whose `.msg` text is not known.
pub fn full_definition(type_name: &str) -> Result<String, String> {
    fn append(name: &str, seen: &mut std::collections::HashSet<String>, depth: u32) -> Result<String, String> {
        if depth == 0 {
            return Err(format!("{name} (dependency recursion too deep)"));
        }
        let text = msg_text(name).ok_or_else(|| name.to_string())?;
        let package = name.split('/').next().unwrap_or_default();
        let mut out = text.to_string();
        for dep in dependencies(text, package) {
            if seen.insert(dep.clone()) {
                out.push('\n');
                out.push_str(SEPARATOR);
                out.push_str("MSG: ");
                out.push_str(&dep);
                out.push('\n');
                out.push_str(&append(&dep, seen, depth - 1)?);
            }
        }
        Ok(out)
    }
    append(type_name, &mut std::collections::HashSet::new(), 50)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointcloud2_definition_has_all_dependencies_once() {
        let def = full_definition("sensor_msgs/msg/PointCloud2").unwrap();
        assert!(def.starts_with("# This message holds a collection of N-dimensional points"));
        for dep in ["sensor_msgs/PointField", "std_msgs/Header", "builtin_interfaces/Time"] {
            let marker = format!("{SEPARATOR}MSG: {dep}\n");
            assert_eq!(def.matches(&marker).count(), 1, "{dep} in\n{def}");
        }
        // rosbag2 order: sorted dependencies, depth first.
        let pf = def.find("MSG: sensor_msgs/PointField").unwrap();
        let hd = def.find("MSG: std_msgs/Header").unwrap();
        let tm = def.find("MSG: builtin_interfaces/Time").unwrap();
        assert!(pf < hd && hd < tm);
        assert_eq!(def.matches(SEPARATOR).count(), 3);
    }

    #[test]
    fn dependencies_skip_primitives_comments_and_constants() {
        let deps = dependencies(
            "# comment Foo bar\nuint8 A = 1\nstring<=5 s\nPointField[] f\nstd_msgs/Header[3] h\nint32[<=2] x\n",
            "sensor_msgs",
        );
        let deps: Vec<String> = deps.into_iter().collect();
        assert_eq!(deps, ["sensor_msgs/PointField", "std_msgs/Header"]);
    }

    #[test]
    fn unknown_type_is_named() {
        assert_eq!(full_definition("nav_msgs/msg/Odometry").unwrap_err(), "nav_msgs/msg/Odometry");
        assert!(full_definition("visualization_msgs/msg/MarkerArray")
            .unwrap()
            .contains("MSG: visualization_msgs/Marker"));
        assert!(msg_text("std_msgs/Header").is_some());
    }
}
