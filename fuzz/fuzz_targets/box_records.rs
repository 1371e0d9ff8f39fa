//! Box records (PointCloud2 x y z length width height yaw score label) through NMS, as the NMS node and replay do; byte 0 picks the NMS kind.
//! The body is shared with test/fuzz_regressions.rs: see fuzz/src/harness.rs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lidar_kernels_fuzz::harness::box_records(data));
