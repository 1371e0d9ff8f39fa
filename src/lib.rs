//! lidar_kernels: deterministic lidar point-cloud operators for ROS 2.
//!
//! - [`cloud`]: PointCloud2 CDR codec and the structure-of-arrays [`cloud::Cloud`].
//! - [`ops`]: the operators' CPU reference, the oracle every backend must match.
//! - [`bag`]: rosbag2 reading (MCAP, sqlite3) and MCAP writing.
//! - [`pipeline`]: configuration and the per-frame pipeline used by `replay` and the nodes.

pub mod bag;
pub mod cloud;
pub mod gpu;
pub mod ops;
pub mod pipeline;
pub mod replay;
#[cfg(feature = "ros")]
pub mod ros;
