//! A .mcap file as replay opens it: a damaged or hostile bag must end in an error, not a panic, hang or huge allocation.
//! The body is shared with test/fuzz_regressions.rs: see fuzz/src/harness.rs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lidar_kernels_fuzz::harness::mcap_reader(data));
