//! ROS 2 node `voxelizer` (feature `ros`): Voxelize (hard | dynamic) and/or voxel-grid downsample.
//! In: `points` (PointCloud2). Out: `~/voxels`, `~/downsampled`.
//!
//! Run: `voxelizer --ros-args --params-file config/cpu.param.yaml -r points:=/sensor/topic -p reliable:=true`
//! `voxelizer --list-params` prints the declared parameters (`--list-params=markdown`: a table).

use lidar_kernels::ros::{node_main, NodeKind, PipelineStage};

fn main() -> std::process::ExitCode {
    node_main(PipelineStage::new(NodeKind::Voxelizer))
}
