//! Shared by the integration tests: the real Ouster scans shipped in data/ouster and the
//! evaluation data read from ../shared (never copied into the project).
#![allow(dead_code)]

use lidar_kernels::cloud::Cloud;
use std::path::PathBuf;

pub fn ouster_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/ouster")
}

#[allow(unused_imports)] // not every test crate that includes this module uses it
pub use lidar_kernels::bag::sample::OUSTER_SCANS;

/// Loads an Ouster scan as a cloud with channels x, y, z, reflectivity, ring, t.
pub fn load_ouster(name: &str) -> Cloud {
    lidar_kernels::bag::sample::load_ouster_bin(&ouster_dir().join(name)).expect("read Ouster scan")
}

/// The KITTI/nuScenes evaluation folder (non-commercial data, read in place), if present.
pub fn eval_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LIDAR_KERNELS_EVAL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/eval"));
    dir.is_dir().then_some(dir)
}
