//! `bench-cpu`: the whole pipeline on the CPU backend, wall clock per frame, for three cloud sizes
//! and each thread count asked for (the CPU backend's threads come from one rayon pool, so the
//! pool's size is the backend's).

use super::suite::time_pipeline;
use super::VerifyError;
use crate::bag::sample::{load_ouster_bin, ouster_cloud_message};
use crate::cloud::{Cloud, Header};
use crate::gpu::{BackendKind, ProfileChoice};
use crate::pipeline::{Engine, Pipeline, PipelineConfig};
use std::fmt;
use std::path::Path;

/// One cloud at one thread count.
#[derive(Debug, Clone)]
pub struct CpuBenchRow {
    pub cloud: String,
    pub points: usize,
    pub threads: usize,
    pub frames: usize,
    pub median_ms: f64,
    /// Stage p50s, `name=ms` separated by spaces.
    pub stages: String,
}

#[derive(Debug, Clone, Default)]
pub struct CpuBenchTable(pub Vec<CpuBenchRow>);

impl fmt::Display for CpuBenchTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| cloud | points | threads | frames | wall p50 ms | stage p50 ms |")?;
        writeln!(f, "|---|---:|---:|---:|---:|---|")?;
        for r in &self.0 {
            writeln!(
                f,
                "| {} | {} | {} | {} | {:.1} | {} |",
                r.cloud, r.points, r.threads, r.frames, r.median_ms, r.stages
            )?;
        }
        Ok(())
    }
}

/// The 1.7 M-point cloud of shared/bench/workloads.py's shape: the six scans one after the other,
/// three times, each copy's x, y, z jittered by up to 1 cm (a fixed seed).
fn large_cloud(scans: &[Cloud]) -> Cloud {
    let mut rng = super::report::Rng::new(20261201);
    let mut xyz: [Vec<f32>; 3] = Default::default();
    let names: Vec<String> = scans[0].names()[3..].to_vec();
    let mut rest: Vec<Vec<f32>> = vec![Vec::new(); names.len()];
    for _ in 0..3 {
        for s in scans {
            for (a, col) in [s.x(), s.y(), s.z()].into_iter().enumerate() {
                xyz[a].extend(col.iter().map(|&v| v + rng.f32(-0.01, 0.01)));
            }
            for (k, name) in names.iter().enumerate() {
                rest[k].extend_from_slice(s.channel(name).expect("every scan has the same channels"));
            }
        }
    }
    let [x, y, z] = xyz;
    names.iter().zip(rest).fold(Cloud::from_xyz(x, y, z), |c, (name, v)| c.with_channel(name, v))
}

/// The pipeline of `config` on the CPU backend: the 27k-point os1-32 scan, the 107k-point
/// os1-128 scan and the 1.7 M-point cloud, each at every count in `threads`. `frames` timed
/// frames after a few warm-up ones (a fifth of them, at least 3, for the 1.7 M cloud).
pub fn bench_cpu(
    ouster_dir: &Path,
    config: &PipelineConfig,
    threads: &[usize],
    frames: usize,
) -> Result<CpuBenchTable, VerifyError> {
    let scans = crate::bag::sample::OUSTER_SCANS
        .iter()
        .map(|name| {
            let path = ouster_dir.join(name);
            load_ouster_bin(&path).map_err(|e| VerifyError::workload(&path, e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let by_name = |name: &str| {
        let k = crate::bag::sample::OUSTER_SCANS.iter().position(|s| *s == name).expect("a bundled scan");
        scans[k].clone()
    };
    let clouds = [
        ("os1-32_scan0", by_name("os1-32_scan0.bin"), frames),
        ("os1-128_scan0", by_name("os1-128_scan0.bin"), frames),
        ("6 scans x 3, jittered", large_cloud(&scans), (frames / 5).max(3)),
    ];
    let mut rows = Vec::new();
    for (name, cloud, frames) in clouds {
        let cdr = ouster_cloud_message(&cloud, Header::default()).to_cdr();
        for &t in threads {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .map_err(|e| VerifyError::ThreadPool { threads: t, message: e.to_string() })?;
            let engine = Engine::select(BackendKind::Cpu, ProfileChoice::Auto)?;
            let mut pipeline = Pipeline::with_engine(config.clone(), engine);
            let (median_ms, stages) =
                pool.install(|| time_pipeline(&mut pipeline, &cdr, frames.div_ceil(5), frames))?;
            tracing::info!(cloud = name, threads = t, median_ms, "bench-cpu");
            rows.push(CpuBenchRow { cloud: name.into(), points: cloud.len(), threads: t, frames, median_ms, stages });
        }
    }
    Ok(CpuBenchTable(rows))
}
