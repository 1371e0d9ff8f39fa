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

/// One rayon pool of each size in `threads`, in order.
fn pools(threads: &[usize]) -> Result<Vec<(usize, rayon::ThreadPool)>, VerifyError> {
    threads
        .iter()
        .map(|&t| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .map_err(|e| VerifyError::ThreadPool { threads: t, message: e.to_string() })?;
            Ok((t, pool))
        })
        .collect()
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
    let pools = pools(threads)?;
    let mut rows = Vec::new();
    for (name, cloud, frames) in clouds {
        let cdr = ouster_cloud_message(&cloud, Header::default()).to_cdr();
        for (t, pool) in &pools {
            let t = *t;
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

/// What an operator of [`bench_cpu_ops`] returns; encoded as int32 after the timing.
enum OpOutput {
    Indices(Vec<i32>),
    HardVoxels(crate::ops::voxel::HardVoxels),
}

impl OpOutput {
    /// Indices as they are; hard voxels as a row per voxel: z, y, x, num_points, then the
    /// `P x C` features' f32 bits.
    fn into_i32(self) -> Vec<i32> {
        match self {
            OpOutput::Indices(v) => v,
            OpOutput::HardVoxels(h) => (0..h.voxel_count())
                .flat_map(|v| {
                    let c = h.coords[v];
                    let features = h.voxel_features(v).iter().map(|f| f.to_bits() as i32);
                    [c[0], c[1], c[2], h.num_points[v] as i32].into_iter().chain(features)
                })
                .collect(),
        }
    }
}

/// One operator of [`bench_cpu_ops`] at one thread count.
#[derive(Debug, Clone)]
pub struct CpuOpRow {
    /// The name of its output file (`NAME.bin`, int32 indices) and of its row in `ours.tsv`.
    pub name: String,
    pub workload: String,
    pub threads: usize,
    pub runs: usize,
    pub median_ms: f64,
}

/// The CPU reference of FPS, KNN, ball query, the voxel-grid downsample's voxel numbering, hard
/// voxelization (W1) and axis-aligned NMS on the fixed workloads (`workloads.py --dump`),
/// median of `runs` runs at each thread count; each operator's indices are written to
/// `outputs/NAME.bin` (int32, little endian, row-major) and the medians to `outputs/ours.tsv`, for
/// bench/cpu_peers.py to time the peers beside them on the same inputs and compare.
pub fn bench_cpu_ops(
    workloads: &Path,
    threads: &[usize],
    runs: usize,
    outputs: &Path,
) -> Result<Vec<CpuOpRow>, VerifyError> {
    use crate::ops::fps::{farthest_point_sample, FpsParams};
    use crate::ops::neighbors::{ball_query, knn, BallPadding, BallQueryParams, KnnParams};
    let cloud = |name: &str| -> Result<Cloud, VerifyError> {
        let (x, y, z) = super::workload_xyz(workloads, name)?;
        Ok(Cloud::from_xyz(x, y, z))
    };
    let scan0 = cloud("scan0_xyz")?;
    let w3a = cloud("w3a_xyz")?;
    let queries = scan0.select(&super::workload_indices(workloads, "w3b_queries_idx")?);
    let nms_workloads = super::nms::load_workloads(workloads)?;
    let w1_clouds = [
        ("scan0", super::voxel::load_xyzr(workloads, "scan0_xyzr")?),
        ("large", super::voxel::load_xyzr(workloads, "large_xyzr")?),
    ];
    type Op<'a> = Box<dyn Fn() -> Result<OpOutput, VerifyError> + Sync + 'a>;
    let mut ops: Vec<(String, String, Op)> = vec![
        (
            "fps_w2a".into(),
            "W2a scan0 107,647 -> 4096, start 0".into(),
            Box::new(|| {
                Ok(OpOutput::Indices(
                    farthest_point_sample(&scan0, &FpsParams { num_samples: 4096, start_index: 0 })?.indices,
                ))
            }),
        ),
        (
            "knn_w3a".into(),
            "W3a k=16, 16384 queries = points".into(),
            Box::new(|| Ok(OpOutput::Indices(knn(&w3a, &w3a, &KnnParams { k: 16 })?.indices))),
        ),
        (
            "knn_w3b".into(),
            "W3b k=32, 4096 FPS queries into scan0".into(),
            Box::new(|| Ok(OpOutput::Indices(knn(&scan0, &queries, &KnnParams { k: 32 })?.indices))),
        ),
        (
            "ball_w4".into(),
            "W4 r=1 m, 32 samples (first found), 4096 FPS queries into scan0".into(),
            Box::new(|| {
                let p = BallQueryParams { radius: 1.0, min_radius: 0.0, nsample: 32, padding: BallPadding::FirstFound };
                Ok(OpOutput::Indices(ball_query(&scan0, &queries, &p)?.indices))
            }),
        ),
        (
            "downsample_w1".into(),
            "voxel-grid downsample of scan0, 0.2 m (indices: each point's voxel)".into(),
            Box::new(|| {
                let grid = crate::ops::voxel::VoxelGrid {
                    voxel_size: [0.2; 3],
                    point_cloud_range: [-100.0, -100.0, -10.0, 100.0, 100.0, 10.0],
                };
                Ok(OpOutput::Indices(crate::ops::voxel::voxelize_dynamic(&scan0, &grid).point_voxel))
            }),
        ),
    ];
    // Axis-aligned NMS at IoU 0.5 on the torchvision-style boxes (aa_boxes_N), keep in score order.
    for w in nms_workloads.iter().filter(|w| w.params.kind == crate::ops::nms::NmsKind::AxisAligned) {
        ops.push((
            format!("nms_aa_{}", w.boxes.len()),
            format!("W5a {}", w.name),
            Box::new(move || {
                let out = crate::ops::nms::nms(&w.boxes, &w.scores, &[], &w.params)?;
                Ok(OpOutput::Indices(out.keep.iter().map(|&k| k as i32).collect()))
            }),
        ));
    }
    // Hard voxelization (W1, spconv PointToVoxel's workloads): a row per voxel.
    for (wl, cloud) in &w1_clouds {
        for (cfg, params) in [("pillars", super::voxel::w1_pillars()), ("voxels", super::voxel::w1_voxels())] {
            ops.push((
                format!("voxels_{cfg}_{wl}"),
                format!("W1 {cfg} {wl}_xyzr (rows: z, y, x, num_points, the P x 4 features as f32 bits)"),
                Box::new(move || Ok(OpOutput::HardVoxels(crate::ops::voxel::voxelize_hard(cloud, &params)?))),
            ));
        }
    }
    std::fs::create_dir_all(outputs).map_err(|e| VerifyError::workload(outputs, e))?;
    let pools = pools(threads)?;
    let mut rows = Vec::new();
    for (name, workload, op) in &ops {
        let mut output = OpOutput::Indices(Vec::new());
        for (t, pool) in &pools {
            let mut ms = Vec::with_capacity(runs);
            for _ in 0..runs + 1 {
                let start = std::time::Instant::now();
                output = pool.install(op)?;
                ms.push(start.elapsed().as_secs_f64() * 1e3);
            }
            ms.remove(0);
            rows.push(CpuOpRow {
                name: name.clone(),
                workload: workload.clone(),
                threads: *t,
                runs,
                median_ms: super::median(ms),
            });
        }
        // The same bits at every thread count: one file.
        let path = outputs.join(format!("{name}.bin"));
        let bytes: Vec<u8> = output.into_i32().iter().flat_map(|i| i.to_le_bytes()).collect();
        std::fs::write(&path, bytes).map_err(|e| VerifyError::workload(&path, e))?;
    }
    let tsv: String =
        rows.iter().map(|r| format!("{}\t{}\t{}\t{:.4}\n", r.name, r.threads, r.runs, r.median_ms)).collect();
    let path = outputs.join("ours.tsv");
    std::fs::write(&path, format!("name\tthreads\truns\tmedian_ms\n{tsv}"))
        .map_err(|e| VerifyError::workload(&path, e))?;
    Ok(rows)
}
