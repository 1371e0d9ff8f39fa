//! rosbag2 bags without ROS: reading MCAP and sqlite3 storage, writing MCAP.

pub mod sample;
