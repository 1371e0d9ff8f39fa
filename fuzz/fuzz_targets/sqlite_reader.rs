//! A .db3 (rosbag2 sqlite3) file as replay opens it; the seeds are real rosbag2-schema databases.
//! The body is shared with test/fuzz_regressions.rs: see fuzz/src/harness.rs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lidar_kernels_fuzz::harness::sqlite_reader(data));
