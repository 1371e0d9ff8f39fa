//! ROS 2 node `pipeline` (feature `ros`). For now it relays its input (see `RelayStage`): the
//! pipeline stage of the pipeline is not wired yet.
//!
//! Run: `pipeline --ros-args -r points:=/sensor/points -p reliable:=true`

fn main() -> anyhow::Result<()> {
    lidar_kernels::ros::run_node(lidar_kernels::ros::RelayStage::new("pipeline"))
}
