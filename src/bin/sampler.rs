//! ROS 2 node `sampler` (feature `ros`): Farthest point sampling. In: `points` (PointCloud2). Out: `~/samples` (the sampled points).
//!
//! Run: `sampler --ros-args --params-file config/cpu.param.yaml -r points:=/sensor/topic -p reliable:=true`
//! `sampler --list-params` prints the declared parameters (`--list-params=markdown`: a table).

use lidar_kernels::ros::{node_main, NodeKind, PipelineStage};

fn main() -> std::process::ExitCode {
    node_main(PipelineStage::new(NodeKind::Sampler))
}
