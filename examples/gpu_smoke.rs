//! GPU smoke test: `gpu_smoke [DATA_DIR] [CACHE_DIR] [--quick]`.
//! Needs a GPU, libcuda and NVRTC (see scripts/install-nvrtc.sh). Exit code 0 when every check passed.

use std::path::PathBuf;

fn main() {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let pos: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let data = pos.first().map(PathBuf::from).unwrap_or_else(|| PathBuf::from("data/ouster"));
    let cache = pos.get(1).map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("lidar_kernels_smoke_cache"));
    match lidar_kernels::gpu::smoke::run_smoke(&data, &cache, quick) {
        Ok(r) if r.ok => {}
        Ok(_) => std::process::exit(1),
        Err(e) => {
            eprintln!("smoke test error: {e}");
            std::process::exit(2);
        }
    }
}
