//! GPU voxel check + bench: `gpu_voxel_check [OUSTER_DIR] [WORKLOADS_DIR] [SEED] [quick]`.
//! Prints the check table (GPU vs CPU reference), the bench table and the per-launch GPU times of
//! W1 pillars. `quick`: first Ouster scan and small drawn clouds only, no bench (for runs under
//! compute-sanitizer). Exit code 1 on a failed check.

use lidar_kernels::gpu::report::{BenchTable, CheckTable};
use lidar_kernels::gpu::{voxel, GpuContext, GpuOptions};
use std::path::PathBuf;

fn main() {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ouster = args.first().map(PathBuf::from).unwrap_or_else(|| PathBuf::from("data/ouster"));
    let workloads = args.get(1).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp/wl"));
    let seed: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let quick = args.get(3).is_some_and(|a| a == "quick");
    let ctx = match GpuContext::new(GpuOptions { no_cache: true, ..GpuOptions::default() }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("no GPU: {e}");
            std::process::exit(2);
        }
    };
    println!("{} cc {}.{} profile {}", ctx.device_name, ctx.compute_capability.0, ctx.compute_capability.1, ctx.profile.name);
    let t = std::time::Instant::now();
    let table = match voxel::check_with(&ctx, seed, &ouster, quick) {
        Ok(rows) => CheckTable(rows),
        Err(e) => {
            eprintln!("check error: {e}");
            std::process::exit(2);
        }
    };
    println!("{table}");
    let rows = table.0.len();
    let passed = table.0.iter().filter(|r| r.passed()).count();
    println!(
        "check: {} ({passed}/{rows} rows pass) in {:.1} s",
        if table.all_passed() { "ALL PASSED" } else { "FAILURES" },
        t.elapsed().as_secs_f64()
    );
    if !quick {
        match voxel::bench(&ctx, &workloads) {
            Ok(rows) => {
                let bt = BenchTable { device: ctx.device_name.clone(), copy_bandwidth_gbs: 4300.0, rows };
                println!("{bt}");
            }
            Err(e) => eprintln!("bench error: {e}"),
        }
        match voxel::bench_stages(&ctx, &workloads) {
            Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
            Err(e) => eprintln!("stage bench error: {e}"),
        }
    }
    if !table.all_passed() {
        std::process::exit(1);
    }
}
