//! Build script. It does something only for the `ros` feature on the ROS 2 Jazzy PyPI wheels
//! (`scripts/ros-env.sh` sets LIDAR_KERNELS_ROS_WHEELS there); a build without the `ros` feature,
//! or against a system ROS 2, is left exactly as it would be without this file.
//!
//! On the wheels:
//! - the wheels' librcl pulls `*__rosidl_generator_py.so`, which need libpython symbols: the
//!   binaries link libpython3.11 with `--no-as-needed` (else they die at start with
//!   `undefined symbol: PyExc_RuntimeError`);
//! - the wheels' own RPATHs do not resolve: the venv lib dir and every `ros_*.libs` dir
//!   (LIDAR_KERNELS_ROS_LIBDIRS) are baked in as an old-style RPATH, which also serves the
//!   libraries' own dependencies, so the binaries run without LD_LIBRARY_PATH.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LIDAR_KERNELS_ROS_WHEELS");
    println!("cargo:rerun-if-env-changed=LIDAR_KERNELS_ROS_LIBDIRS");
    println!("cargo:rerun-if-env-changed=LIDAR_KERNELS_LIBPYTHON");

    if env::var_os("CARGO_FEATURE_ROS").is_none() {
        return;
    }
    let Some(venv) = env::var_os("LIDAR_KERNELS_ROS_WHEELS").filter(|v| !v.is_empty()) else {
        return; // a system ROS 2: nothing to add
    };
    let venv = PathBuf::from(venv);

    let libdirs: Vec<PathBuf> = match env::var_os("LIDAR_KERNELS_ROS_LIBDIRS") {
        Some(v) => env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).collect(),
        None => vec![venv.join("lib")],
    };

    let libpython = find_libpython().unwrap_or_else(|| {
        panic!(
            "lidar_kernels build.rs: libpython3.11.so.1.0 not found (apt-get install libpython3.11, \
             or set LIDAR_KERNELS_LIBPYTHON to its full path)"
        )
    });
    let dir = libpython.parent().expect("file has a parent");
    let name = libpython.file_name().expect("file name").to_string_lossy().into_owned();

    println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags");
    for d in &libdirs {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", d.display());
    }
    if !is_default_libdir(dir) {
        println!("cargo:rustc-link-arg=-L{}", dir.display());
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-l:{name}");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
}

fn multiarch() -> String {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    format!("{arch}-linux-gnu")
}

fn is_default_libdir(dir: &Path) -> bool {
    let ma = multiarch();
    [format!("/usr/lib/{ma}"), format!("/lib/{ma}"), "/usr/lib".into(), "/lib".into()]
        .iter()
        .any(|d| Path::new(d) == dir)
}

fn find_libpython() -> Option<PathBuf> {
    if let Some(p) = env::var_os("LIDAR_KERNELS_LIBPYTHON").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let ma = multiarch();
    [format!("/usr/lib/{ma}"), "/usr/lib".into(), "/usr/local/lib".into()]
        .iter()
        .map(|d| Path::new(d).join("libpython3.11.so.1.0"))
        .find(|p| p.exists())
}
