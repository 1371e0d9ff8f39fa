//! ROS 2 node `nms` (feature `ros`). For now it relays its input (see `RelayStage`): the
//! nms stage of the pipeline is not wired yet.
//!
//! Run: `nms --ros-args -r points:=/sensor/points -p reliable:=true`

fn main() -> anyhow::Result<()> {
    lidar_kernels::ros::run_node(lidar_kernels::ros::RelayStage::new("nms"))
}
