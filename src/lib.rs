//! lidar_kernels: deterministic lidar point-cloud operators for ROS 2.
//!
//! - [`cloud`]: PointCloud2 CDR codec and the structure-of-arrays [`cloud::Cloud`].
//! - [`ops`]: the operators, one folder per family: parameters, outputs, exact semantics, the CPU
//!   reference (the oracle every backend must match) and the CUDA launcher.
//! - [`gpu`]: the CUDA runtime (context, buffers, NVRTC and its cubin cache, profiles, kernel
//!   registry, gather).
//! - [`bag`]: rosbag2 reading (MCAP, sqlite3) and MCAP writing.
//! - [`pipeline`]: configuration and the per-frame pipeline used by `replay` and the nodes.
//! - [`verify`]: the GPU-vs-CPU checks and the benchmarks (`check-gpu`, `bench`), outside the data
//!   path.

pub mod bag;
pub mod cloud;
pub mod eval;
pub mod gpu;
pub mod ops;
pub mod pipeline;
pub mod render;
pub mod replay;
#[cfg(feature = "ros")]
pub mod ros;
pub mod verify;
