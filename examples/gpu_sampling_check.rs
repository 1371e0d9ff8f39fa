//! GPU FPS / KNN / ball query: checks against the CPU reference and benchmarks.
//! `gpu_sampling_check [OUSTER_DIR] [WORKLOADS_DIR] [--seed N] [--no-bench] [--no-check] [--fps-only] [--quick]` (`--fps-only`: FPS checks and bench only; `--quick`: a few small FPS cases only, for compute-sanitizer); exit code 1 when a check failed.

use lidar_kernels::gpu::report::{BenchTable, CheckTable};
use lidar_kernels::gpu::{fps, neighbors, GpuContext, GpuOptions};
use std::path::PathBuf;

fn copy_bandwidth_gbs(ctx: &GpuContext) -> f64 {
    let n = 64usize << 20; // 256 MB of f32
    let run = || -> Result<f64, lidar_kernels::gpu::GpuError> {
        let a = ctx.stream.alloc_zeros::<f32>(n)?;
        let mut b = ctx.stream.alloc_zeros::<f32>(n)?;
        for _ in 0..2 {
            ctx.stream.memcpy_dtod(&a, &mut b)?;
        }
        let mut t = ctx.stage_timer();
        let mut v = Vec::new();
        for _ in 0..10 {
            t.start()?;
            ctx.stream.memcpy_dtod(&a, &mut b)?;
            t.stage("copy")?;
            v.push(t.finish()?[0].1 as f64);
        }
        v.sort_by(|x, y| x.partial_cmp(y).unwrap());
        Ok(2.0 * (n * 4) as f64 / (v[v.len() / 2] * 1e-3) / 1e9)
    };
    run().unwrap_or(0.0)
}

fn main() {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let no_bench = args.iter().any(|a| a == "--no-bench");
    let no_check = args.iter().any(|a| a == "--no-check");
    let seed = args.iter().position(|a| a == "--seed").and_then(|i| args.get(i + 1)).and_then(|s| s.parse().ok()).unwrap_or(1u64);
    let pos: Vec<&String> = args.iter().enumerate().filter(|(i, a)| !a.starts_with("--") && (*i == 0 || args[i - 1] != "--seed")).map(|(_, a)| a).collect();
    let ouster = pos.first().map(PathBuf::from).unwrap_or_else(|| PathBuf::from("data/ouster"));
    let workloads = pos.get(1).map(PathBuf::from);
    let ctx = match GpuContext::new(GpuOptions::default()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("no GPU context: {e}");
            std::process::exit(2);
        }
    };
    println!("{} (cc {}.{}, {} SMs), profile {}, NVRTC {}.{}\n", ctx.device_name, ctx.compute_capability.0, ctx.compute_capability.1, ctx.sm_count, ctx.profile.name, ctx.nvrtc_version.0, ctx.nvrtc_version.1);
    if args.iter().any(|a| a == "--quick") {
        // A few small FPS cases (every path the planner picks for them), for compute-sanitizer.
        let ok = match fps::check_quick(&ctx, seed) {
            Ok(r) => {
                let t = CheckTable(r);
                println!("{t}");
                t.all_passed()
            }
            Err(e) => {
                eprintln!("fps quick check error: {e}");
                false
            }
        };
        println!("quick checks: {}", if ok { "ALL PASSED" } else { "FAILURES" });
        std::process::exit(if ok { 0 } else { 1 });
    }
    let fps_only = args.iter().any(|a| a == "--fps-only");
    let mut rows = Vec::new();
    let t = std::time::Instant::now();
    if !no_check {
    match fps::check(&ctx, seed, &ouster) {
        Ok(r) => rows.extend(r),
        Err(e) => eprintln!("fps check error: {e}"),
    }
    eprintln!("fps checks {:.1} s", t.elapsed().as_secs_f64());
    if !fps_only {
    let t = std::time::Instant::now();
    match neighbors::check(&ctx, seed, &ouster) {
        Ok(r) => rows.extend(r),
        Err(e) => eprintln!("neighbors check error: {e}"),
    }
    eprintln!("neighbors checks {:.1} s", t.elapsed().as_secs_f64());
    }
    }
    let table = CheckTable(rows);
    let ok = no_check || table.all_passed();
    if !no_check {
        println!("{table}");
        println!("checks: {}\n", if ok { "ALL PASSED" } else { "FAILURES" });
    }
    if let (Some(w), false) = (workloads, no_bench) {
        let mut bt = BenchTable { device: ctx.device_name.clone(), copy_bandwidth_gbs: copy_bandwidth_gbs(&ctx), rows: Vec::new() };
        match fps::bench(&ctx, &w) {
            Ok(r) => bt.rows.extend(r),
            Err(e) => eprintln!("fps bench error: {e}"),
        }
        if !fps_only {
            match neighbors::bench(&ctx, &w) {
                Ok(r) => bt.rows.extend(r),
                Err(e) => eprintln!("neighbors bench error: {e}"),
            }
        }
        println!("{bt}");
    }
    std::process::exit(if ok { 0 } else { 1 });
}
