//! ROS 2 node `pipeline` (feature `ros`): Every stage chosen by the `*.enabled` parameters (voxelize, downsample, fps, neighbors) in one
//! process on one backend (one CUDA context; the frame stays on the device between stages).
//! In: `points` (PointCloud2). Out: `~/voxels`, `~/downsampled`, `~/samples`, `~/neighborhoods`.
//!
//! Run: `pipeline --ros-args --params-file config/cpu.param.yaml -r points:=/sensor/topic -p reliable:=true`
//! `pipeline --list-params` prints the declared parameters (`--list-params=markdown`: a table).

use lidar_kernels::ros::{node_main, NodeKind, PipelineStage};

fn main() -> std::process::ExitCode {
    node_main(PipelineStage::new(NodeKind::Pipeline))
}
