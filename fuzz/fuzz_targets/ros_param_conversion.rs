//! ROS parameters (any rcl_interfaces type and value, at start and through the parameter
//! services) -> the node's checks and validator -> the pipeline configuration it runs.
//! Needs `--features ros` and a ROS 2 environment (`source scripts/ros-env.sh`); see
//! fuzz/src/ros_harness.rs.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: lidar_kernels_fuzz::ros_harness::Input| {
    lidar_kernels_fuzz::ros_harness::ros_param_conversion(input)
});
