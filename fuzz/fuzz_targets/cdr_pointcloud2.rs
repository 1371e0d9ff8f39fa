//! CDR PointCloud2 bytes from a bag or a raw subscription: decoding and validation must turn any byte string into a view or an error.
//! The body is shared with test/fuzz_regressions.rs: see fuzz/src/harness.rs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lidar_kernels_fuzz::harness::cdr_pointcloud2(data));
