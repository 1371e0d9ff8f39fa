//! GPU NMS check and bench:
//! `gpu_nms_check [--seed N] [--sizes 0,1,317] [--eval DIR] [--workloads DIR] [--no-check]`.
//! Needs a GPU, libcuda and NVRTC. Prints the check table (GPU vs CPU keep lists) and, with
//! `--workloads`, the fixed-workload checks and the bench table. Exit code 0 when every check passed.

use lidar_kernels::gpu::nms::{bench, check, check_sizes, check_workloads, copy_bandwidth_gbs};
use lidar_kernels::gpu::report::{BenchTable, CheckTable};
use lidar_kernels::gpu::{select_backend, BackendKind, ProfileChoice};
use std::path::PathBuf;

fn main() {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let seed: u64 = opt("--seed").and_then(|s| s.parse().ok()).unwrap_or(0);
    let eval = opt("--eval").map(PathBuf::from);
    let workloads = opt("--workloads").map(PathBuf::from);
    let no_check = args.iter().any(|a| a == "--no-check");

    let ctx = match select_backend(BackendKind::Cuda, ProfileChoice::Auto) {
        Ok(Some(c)) => c,
        Ok(None) => unreachable!("Cuda backend never falls back"),
        Err(e) => {
            eprintln!("no CUDA backend: {e}");
            std::process::exit(2);
        }
    };
    println!("device: {} (sm_{}{}, {} SMs), profile {}", ctx.device_name, ctx.compute_capability.0, ctx.compute_capability.1, ctx.sm_count, ctx.profile.name);
    let mut ok = true;
    let mut rows = Vec::new();
    if !no_check {
        let t = std::time::Instant::now();
        let res = match opt("--sizes") {
            Some(list) => {
                let sizes: Vec<usize> = list.split(',').filter_map(|v| v.parse().ok()).collect();
                check_sizes(&ctx, seed, &sizes, eval.as_deref())
            }
            None => check(&ctx, seed, eval.as_deref()),
        };
        match res {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("check error: {e}");
                ok = false;
            }
        }
        println!("checks took {:.1} s", t.elapsed().as_secs_f64());
    }
    if let Some(dir) = &workloads {
        match check_workloads(&ctx, dir) {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("workload check error: {e}");
                ok = false;
            }
        }
    }
    let table = CheckTable(rows);
    if !table.0.is_empty() {
        println!("\n{table}");
        let failed = table.0.iter().filter(|r| !r.passed()).count();
        println!("{} checks, {} failed", table.0.len(), failed);
        ok &= failed == 0;
    }
    if let Some(dir) = &workloads {
        let bw = copy_bandwidth_gbs(&ctx).unwrap_or(0.0);
        match bench(&ctx, dir) {
            Ok(rows) => {
                ok &= rows.iter().all(|r| r.note.contains("keep == CPU: yes"));
                println!("\n{}", BenchTable { device: ctx.device_name.clone(), copy_bandwidth_gbs: bw, rows });
            }
            Err(e) => {
                eprintln!("bench error: {e}");
                ok = false;
            }
        }
    }
    std::process::exit(if ok { 0 } else { 1 });
}
