//! A --config YAML file: refused with a message, or loaded, reloadable and runnable.
//! The body is shared with test/fuzz_regressions.rs: see fuzz/src/harness.rs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lidar_kernels_fuzz::harness::config_yaml(data));
