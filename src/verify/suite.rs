//! `check-gpu` and `bench`: every operator family's GPU-vs-CPU check and benchmark in one table,
//! plus the gather path, the device's copy bandwidth and the whole pipeline on one scan.

use super::report::{BenchRow, BenchTable, CheckRow, CheckTable};
use super::smoke::{big_message, compare_with_cpu, exotic_message};
use super::VerifyError;
use super::{detect, fps, neighbors, nms, voxel};
use crate::bag::sample::{load_ouster_bin, ouster_cloud_message, OUSTER_SCANS as SCANS};
use crate::cloud::{Header, PointCloud2};
use crate::gpu::profile::BUILTIN_PROFILES;
use crate::gpu::{GpuContext, GpuError, GpuOptions, ProfileChoice};
use crate::ops::backend::CudaBackend;
use crate::pipeline::{Engine, Pipeline, PipelineConfig};
use std::path::Path;
use std::time::Instant;

fn gather_row(ctx: &GpuContext, case: &str, msg: &PointCloud2<'_>) -> Result<CheckRow, VerifyError> {
    // Two runs that each equal the CPU bit for bit are also equal to each other.
    let first = compare_with_cpu(ctx, msg)?;
    let second = compare_with_cpu(ctx, msg)?;
    let detail = match (&first, &second) {
        (Ok(d), Ok(_)) => d.clone(),
        (Err(e), _) | (_, Err(e)) => e.clone(),
    };
    Ok(CheckRow {
        operator: "gather".into(),
        case: case.into(),
        points: msg.num_points() as usize,
        integers_identical: first.is_ok(),
        max_rel_err: 0.0,
        float_tolerance: 0.0,
        deterministic: second.is_ok(),
        detail,
    })
}

/// The gather kernel on every Ouster scan in the driver's 48-byte layout, an organized
/// big-endian padded layout with every datatype, and a 1.1 M-point cloud with NaN/inf points.
fn check_gather(ctx: &GpuContext, ouster_dir: &Path) -> Result<Vec<CheckRow>, VerifyError> {
    let mut rows = Vec::new();
    for name in SCANS {
        let path = ouster_dir.join(name);
        let scan = load_ouster_bin(&path).map_err(|e| VerifyError::workload(&path, e))?;
        rows.push(gather_row(
            ctx,
            &format!("ouster {name} (48-byte layout)"),
            &ouster_cloud_message(&scan, Header::default()),
        )?);
        if name == SCANS[0] {
            rows.push(gather_row(ctx, "organized big-endian every datatype", &exotic_message(&scan, 127))?);
            rows.push(gather_row(ctx, "10 copies with NaN/inf (xyzi)", &big_message(&scan, 10))?);
        }
    }
    Ok(rows)
}

/// Pipeline configurations that [`check_profiles`] runs with every built-in profile: between them
/// every stage and both neighbour searches.
const PROFILE_CHECK_CONFIGS: [(&str, &str); 2] = [
    ("default config", "{}"),
    (
        "knn, dynamic voxels, fps on downsampled, detect",
        "neighbors: {mode: knn}\nvoxelize: {mode: dynamic}\nfps: {input: downsampled}\ndetect: {enabled: true}",
    ),
];

/// Every published message of `cdr` through `config` on the CUDA backend of `options`, twice,
/// against the CPU backend's, byte for byte, with no GPU fault (a faulted frame runs on the CPU,
/// so its outputs would match while the device path failed).
fn pipeline_row(
    case: String,
    config: &PipelineConfig,
    cdr: &[u8],
    points: usize,
    options: &GpuOptions,
) -> Result<CheckRow, VerifyError> {
    let published = |p: &mut Pipeline| -> Result<Vec<(&'static str, Vec<u8>)>, VerifyError> {
        let out = p.process_cdr(cdr)?;
        Ok(out.messages().iter().map(|(t, m)| (*t, m.cdr().to_vec())).collect())
    };
    let want = published(&mut Pipeline::new(config.clone()))?;
    let engine = Engine::cuda(CudaBackend::new(GpuContext::new(options.clone())?)?, options.profile.clone());
    let mut gpu = Pipeline::with_engine(config.clone(), engine);
    let first = published(&mut gpu)?;
    let second = published(&mut gpu)?;
    let faults = gpu.stats.gpu.faults;
    let differing: Vec<&str> = want.iter().zip(&first).filter(|(w, g)| w != g).map(|(w, _)| w.0).collect();
    let same = faults == 0 && first.len() == want.len() && differing.is_empty();
    Ok(CheckRow {
        operator: "pipeline".into(),
        case,
        points,
        integers_identical: same,
        max_rel_err: 0.0,
        float_tolerance: 0.0,
        deterministic: first == second,
        detail: format!(
            "{} messages, {} GPU faults{}",
            first.len(),
            faults,
            if differing.is_empty() { String::new() } else { format!(", differ from the CPU: {differing:?}") }
        ),
    })
}

/// The pipeline on the CUDA backend with each built-in target profile (each compiles the kernels
/// with its own block sizes and tiles), against the CPU backend on one scan ([`pipeline_row`]).
fn check_profiles(ouster_dir: &Path) -> Result<Vec<CheckRow>, VerifyError> {
    let path = ouster_dir.join(SCANS[0]);
    let scan = load_ouster_bin(&path).map_err(|e| VerifyError::workload(&path, e))?;
    let cdr = ouster_cloud_message(&scan, Header::default()).to_cdr();
    let mut rows = Vec::new();
    for (label, yaml) in PROFILE_CHECK_CONFIGS {
        let config = PipelineConfig::from_yaml(yaml, label).expect("the check configurations are valid");
        for (name, _) in BUILTIN_PROFILES {
            let options = GpuOptions { profile: name.parse().expect("infallible"), ..GpuOptions::default() };
            let case = format!("{label}, profile {name}, {}", SCANS[0]);
            rows.push(pipeline_row(case, &config, &cdr, scan.len(), &options)?);
        }
    }
    Ok(rows)
}

/// The pass-through outputs (`samples`, `downsampled`) of layouts unlike the driver's: the
/// organized big-endian padded layout with every datatype (rows with padding, FLOAT64 and UINT32
/// fields) and 10 copies with NaN/inf points (records found through the gather's record index),
/// with FPS on the cloud and on the downsampled cloud ([`pipeline_row`]).
fn check_pass_through(ouster_dir: &Path) -> Result<Vec<CheckRow>, VerifyError> {
    let path = ouster_dir.join(SCANS[0]);
    let scan = load_ouster_bin(&path).map_err(|e| VerifyError::workload(&path, e))?;
    let messages = [
        ("organized big-endian every datatype", exotic_message(&scan, 127)),
        ("10 copies with NaN/inf (xyzi)", big_message(&scan, 10)),
    ];
    let configs = [
        ("fps on the cloud", "voxelize: {enabled: false}\nneighbors: {enabled: false}"),
        ("fps on the downsampled cloud", "voxelize: {enabled: false}\nfps: {input: downsampled}"),
    ];
    let mut rows = Vec::new();
    for (case, msg) in &messages {
        let cdr = msg.to_cdr();
        for (label, yaml) in configs {
            let config = PipelineConfig::from_yaml(yaml, label).expect("the check configurations are valid");
            let case = format!("samples and downsampled, {label}, {case}");
            rows.push(pipeline_row(case, &config, &cdr, msg.num_points() as usize, &GpuOptions::default())?);
        }
    }
    Ok(rows)
}

/// A second context with the same options must load every module from the cubin cache.
fn check_cache(ctx: &GpuContext) -> Result<CheckRow, VerifyError> {
    let options = GpuOptions {
        profile: ProfileChoice::Named(ctx.profile.name.clone()),
        cache_dir: ctx.cache_dir.clone(),
        ..GpuOptions::default()
    };
    let second = GpuContext::new(options)?;
    let (hits, modules) = (second.cache_hits(), second.modules().len());
    Ok(CheckRow {
        operator: "cubin cache".into(),
        case: "second start".into(),
        points: 0,
        integers_identical: hits == modules,
        max_rel_err: 0.0,
        float_tolerance: 0.0,
        deterministic: true,
        detail: format!("{hits} of {modules} modules loaded from the cache, none compiled"),
    })
}

/// Every check; `seed` draws the random clouds and boxes.
pub fn check_all(
    ctx: &GpuContext,
    seed: u64,
    ouster_dir: &Path,
    eval_dir: Option<&Path>,
    only: &Families,
) -> Result<CheckTable, VerifyError> {
    let mut rows = Vec::new();
    if only.has(Family::Pipeline) {
        rows.push(check_cache(ctx)?);
        rows.extend(check_gather(ctx, ouster_dir)?);
    }
    if only.has(Family::Voxel) {
        rows.extend(voxel::check(ctx, seed, ouster_dir)?);
        rows.extend(voxel::check_downsampled(ctx, ouster_dir)?);
    }
    if only.has(Family::Fps) {
        rows.extend(fps::check(ctx, seed, ouster_dir)?);
    }
    if only.has(Family::Neighbors) {
        rows.extend(neighbors::check(ctx, seed, ouster_dir)?);
    }
    if only.has(Family::Nms) {
        rows.extend(nms::check(ctx, seed, eval_dir)?);
    }
    if only.has(Family::Detect) {
        rows.extend(detect::check(ctx, seed, ouster_dir, eval_dir)?);
    }
    if only.has(Family::Pipeline) {
        rows.extend(check_profiles(ouster_dir)?);
        rows.extend(check_pass_through(ouster_dir)?);
    }
    Ok(CheckTable(rows))
}

/// An operator family of `check-gpu` and `bench` (`--only`); the pipeline family holds the gather,
/// the kernel cache, the profiles, the pass-through outputs and the whole-pipeline rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    Voxel,
    Fps,
    Neighbors,
    Nms,
    Detect,
    Pipeline,
}

/// The families a run covers: all of them when none is named.
#[derive(Debug, Clone, Default)]
pub struct Families(pub Vec<Family>);

impl Families {
    pub fn has(&self, f: Family) -> bool {
        self.0.is_empty() || self.0.contains(&f)
    }
}

/// Device-to-device copy bandwidth (bytes read + written per second), median of 20 copies of 1 GiB.
pub fn copy_bandwidth_gbs(ctx: &GpuContext) -> Result<f64, GpuError> {
    let n = 1usize << 28; // f32 elements: 1 GiB
    let src = ctx.stream.alloc_zeros::<f32>(n)?;
    let mut dst = ctx.stream.alloc_zeros::<f32>(n)?;
    let mut timer = ctx.stage_timer();
    let mut ms = Vec::new();
    for _ in 0..22 {
        timer.start()?;
        ctx.stream.memcpy_dtod(&src, &mut dst)?;
        timer.stage("copy")?;
        ms.push(timer.finish()?[0].1 as f64);
    }
    let mut ms = ms[2..].to_vec();
    ms.sort_by(f64::total_cmp);
    Ok(2.0 * (n * 4) as f64 / (ms[ms.len() / 2] * 1e-3) / 1e9)
}

/// Pipeline configurations timed by [`bench_pipeline`]: (name, YAML over the defaults, target ms).
const PIPELINE_BENCHES: [(&str, &str, Option<f64>); 3] = [
    ("pipeline voxelize + downsample", "fps: {enabled: false}\nneighbors: {enabled: false}", Some(0.5)),
    ("pipeline (default config)", "{}", None),
    ("pipeline fps.input: downsampled", "fps: {input: downsampled}", None),
];

/// The whole pipeline on one 107k-point Ouster scan, wall clock per frame: CDR bytes -> pinned
/// staging -> H2D -> gather -> the configured stages -> every published message encoded as CDR on
/// the host. Medians of 50 frames after 10 warm-up frames; stage p50s in the note.
fn bench_pipeline(ouster_dir: &Path, options: &GpuOptions) -> Result<Vec<BenchRow>, VerifyError> {
    let path = ouster_dir.join(SCANS[0]);
    let scan = load_ouster_bin(&path).map_err(|e| VerifyError::workload(&path, e))?;
    let cdr = ouster_cloud_message(&scan, Header::default()).to_cdr();
    let mut rows = Vec::new();
    for (name, yaml, target_ms) in PIPELINE_BENCHES {
        let config = PipelineConfig::from_yaml(yaml, name).expect("the bench configurations are valid");
        let engine = Engine::cuda(CudaBackend::new(GpuContext::new(options.clone())?)?, options.profile.clone());
        let mut pipeline = Pipeline::with_engine(config, engine);
        let (median_ms, stages) = time_pipeline(&mut pipeline, &cdr, 10, 50)?;
        rows.push(BenchRow {
            operator: name.into(),
            workload: "os1-128_scan0 CDR -> published CDR, wall clock".into(),
            points: scan.len(),
            median_ms,
            runs: 50,
            min_bytes: (scan.len() * 48) as u64,
            target_ms,
            peer_ms: None,
            note: format!("stage p50 ms: {stages}"),
        });
    }
    Ok(rows)
}

/// The median wall time (ms) of `frames` frames of `cdr` through `pipeline` after `warmup` ones,
/// each to every published message's CDR bytes, and the stage p50s (`name=ms ...`).
pub(super) fn time_pipeline(
    pipeline: &mut Pipeline,
    cdr: &[u8],
    warmup: usize,
    frames: usize,
) -> Result<(f64, String), VerifyError> {
    let mut ms = Vec::with_capacity(frames);
    for i in 0..warmup + frames {
        let t = Instant::now();
        let frame = pipeline.process_cdr(cdr)?;
        let bytes: usize = frame.messages().iter().map(|(_, m)| m.cdr().len()).sum();
        std::hint::black_box(bytes);
        if i >= warmup {
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    ms.sort_by(f64::total_cmp);
    let stages = pipeline
        .stats
        .key_values()
        .into_iter()
        .filter(|(k, _)| k.ends_with("_p50_ms"))
        .map(|(k, v)| format!("{}={v}", k.trim_end_matches("_p50_ms")))
        .collect::<Vec<_>>()
        .join(" ");
    Ok((ms[ms.len() / 2], stages))
}

/// Every benchmark on the fixed workloads in `workloads` (see shared/bench/workloads.py).
/// Every bench row on `ctx`; the pipeline rows open their own contexts with `options` (the same
/// profile and SM limit as `ctx`).
pub fn bench_all(
    ctx: &GpuContext,
    options: &GpuOptions,
    workloads: &Path,
    ouster_dir: &Path,
    only: &Families,
) -> Result<BenchTable, VerifyError> {
    let mut rows = Vec::new();
    if only.has(Family::Voxel) {
        rows.extend(voxel::bench(ctx, workloads)?);
    }
    if only.has(Family::Fps) {
        rows.extend(fps::bench(ctx, workloads)?);
    }
    if only.has(Family::Neighbors) {
        rows.extend(neighbors::bench(ctx, workloads)?);
    }
    if only.has(Family::Nms) {
        rows.extend(nms::bench(ctx, workloads)?);
    }
    if only.has(Family::Detect) {
        rows.extend(detect::bench(ctx, ouster_dir)?);
    }
    if only.has(Family::Pipeline) {
        rows.extend(bench_pipeline(ouster_dir, options)?);
    }
    Ok(BenchTable {
        device: format!("{} ({}, {} SMs, profile {})", ctx.device_name, ctx.arch, ctx.sm_count, ctx.profile.name),
        copy_bandwidth_gbs: copy_bandwidth_gbs(ctx)?,
        rows,
    })
}
