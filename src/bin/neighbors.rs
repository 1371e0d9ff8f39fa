//! ROS 2 node `neighbors` (feature `ros`): FPS + KNN / ball query. In: `points` (PointCloud2). Out: `~/neighborhoods` (organized cloud:
//! row q = the neighbours of sample q, with x y z index; padding index -1).
//!
//! Run: `neighbors --ros-args --params-file config/cpu.param.yaml -r points:=/sensor/topic -p reliable:=true`
//! `neighbors --list-params` prints the declared parameters (`--list-params=markdown`: a table).

use lidar_kernels::ros::{node_main, NodeKind, PipelineStage};

fn main() -> std::process::ExitCode {
    node_main(PipelineStage::new(NodeKind::Neighbors))
}
