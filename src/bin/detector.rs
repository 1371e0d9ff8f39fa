//! ROS 2 node `detector` (feature `ros`): boxes from the lidar alone (ground segmentation,
//! clustering, minimum-area boxes, rotated NMS; `detect.*` parameters). In: `points` (PointCloud2).
//! Out: `~/detections` (box records), `~/clusters` (per-point class and cluster id), `~/markers`
//! (visualization_msgs/MarkerArray), `~/detections_3d` (vision_msgs/Detection3DArray, where the
//! ROS environment has vision_msgs).
//!
//! Run: `detector --ros-args --params-file config/cpu.param.yaml -r points:=/sensor/points`
//! `detector --list-params` prints the declared parameters (`--list-params=markdown`: a table).

use lidar_kernels::ros::{node_main, NodeKind, PipelineStage};

fn main() -> std::process::ExitCode {
    node_main(PipelineStage::new(NodeKind::Detector))
}
