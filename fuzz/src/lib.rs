//! Harnesses of the fuzz targets (`fuzz_targets/*.rs` are one-line wrappers around these).

pub mod harness;
#[cfg(feature = "ros")]
pub mod ros_harness;
