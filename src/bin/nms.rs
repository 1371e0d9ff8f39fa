//! ROS 2 node `nms` (feature `ros`): NMS over box records. In: `boxes_in` (PointCloud2 with x y z length width height yaw score label).
//! Out: `~/boxes` (kept box records), `~/markers` (visualization_msgs/MarkerArray, CUBE markers).
//!
//! Run: `nms --ros-args --params-file config/cpu.param.yaml -r boxes_in:=/sensor/topic -p reliable:=true`
//! `nms --list-params` prints the declared parameters (`--list-params=markdown`: a table).

use lidar_kernels::ros::{node_main, NodeKind, PipelineStage};

fn main() -> std::process::ExitCode {
    node_main(PipelineStage::new(NodeKind::Nms))
}
