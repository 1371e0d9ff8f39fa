//! ROS 2 node `neighbors` (feature `ros`). For now it relays its input (see `RelayStage`): the
//! neighbors stage of the pipeline is not wired yet.
//!
//! Run: `neighbors --ros-args -r points:=/sensor/points -p reliable:=true`

fn main() -> anyhow::Result<()> {
    lidar_kernels::ros::run_node(lidar_kernels::ros::RelayStage::new("neighbors"))
}
