//! The `lidar-kernels` command line: replay bags through the pipeline, build the sample bag, and
//! check the CUDA kernels.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use lidar_kernels::bag::sample;
use lidar_kernels::gpu::{select_backend, BackendKind, FaultPlan, GpuContext, GpuOptions};
use lidar_kernels::pipeline::{Engine, PipelineConfig};
use lidar_kernels::replay::{replay, ReplayOptions};
use lidar_kernels::verify;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "lidar-kernels", version, about = "Deterministic lidar kernels: replay, checks and benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every PointCloud2 of a bag through the pipeline; without BAG, the bundled Ouster sample.
    Replay {
        /// rosbag2 bag: a .mcap or .db3 file, or a bag folder with metadata.yaml.
        bag: Option<PathBuf>,
        /// PointCloud2 topic (default: the bag's only PointCloud2 topic).
        #[arg(long)]
        topic: Option<String>,
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// Write every output topic here: a .mcap file, or a bag folder for any other name.
        #[arg(long)]
        out: Option<PathBuf>,
        /// No per-frame lines, only the summary.
        #[arg(long)]
        quiet: bool,
        /// Write one bird's-eye-view PNG per frame here (points by cluster, boxes); turns the
        /// detect stage on.
        #[arg(long)]
        render: Option<PathBuf>,
        /// Exit with an error when any message was skipped (malformed, wrong type, failed frame,
        /// damaged bag), not only when no frame was processed: for CI use of replay.
        #[arg(long)]
        strict: bool,
    },
    /// Score the detect stage's boxes against ground truth: every NAME.bin with a NAME.gt.txt in
    /// DIR or its subfolders (KITTI / nuScenes layout; see src/eval.rs). Only the detect stage runs.
    Eval {
        #[arg(long)]
        data: PathBuf,
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// Write one bird's-eye-view PNG per frame here.
        #[arg(long)]
        render: Option<PathBuf>,
        /// Also write the per-frame and score tables (markdown) here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Write the bundled sample bag (real Ouster scans, ouster-ros 48-byte points) into DIR.
    /// The clouds of BAG (default: the bundled sample) through one pipeline for --frames frames,
    /// in turn: checks every frame's outputs equal those of the first pass over the clouds, and
    /// host RSS and device memory after frame 100 vs at the end (within 5 %). Exit 1 otherwise.
    Soak {
        bag: Option<PathBuf>,
        #[arg(long, default_value_t = 2000)]
        frames: u64,
        #[command(flatten)]
        pipeline: PipelineArgs,
    },
    Sample {
        #[arg(default_value = "target/sample")]
        dir: PathBuf,
    },
    /// Per topic: message count and the SHA-256 of every message's stamp and bytes, in order (two
    /// replays on different backends must print the same digests).
    Digest { bag: PathBuf },
    /// Compile every CUDA kernel with every target profile for sm_72, sm_87 and sm_90 (NVRTC only, no GPU).
    NvrtcCheck,
    /// Every operator on the GPU and the CPU: integer outputs bit-identical, two GPU runs identical.
    CheckGpu {
        /// Seed of the random clouds and boxes (default: drawn from the clock, printed).
        #[arg(long)]
        seed: Option<u64>,
        /// Folder with the Ouster .bin scans (default: $LIDAR_KERNELS_DATA_DIR/ouster, else the crate's).
        #[arg(long, default_value_os_t = sample::sample_data_dir())]
        data_dir: PathBuf,
        /// KITTI evaluation folder (kitti_fov/*.pointpillars.txt), if available.
        #[arg(long)]
        eval_dir: Option<PathBuf>,
        #[arg(long, default_value = "auto")]
        profile: String,
        /// Only these operator families (comma separated); default: all.
        #[arg(long, value_enum, value_delimiter = ',')]
        only: Vec<verify::Family>,
        /// Also write the table (markdown) here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The pipeline on the CPU backend, wall clock per frame (median), for the 27k- and
    /// 107k-point scans and a 1.7 M-point cloud, at each thread count.
    BenchCpu {
        /// Thread counts of the CPU backend's pool, comma separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
        /// Timed frames per row (a fifth of them for the 1.7 M-point cloud, at least 3).
        #[arg(long, default_value_t = 20)]
        frames: usize,
        /// Pipeline configuration (YAML); default: built-in defaults.
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long, default_value_os_t = sample::sample_data_dir())]
        data_dir: PathBuf,
        /// Also write the table (markdown) here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Choose the kernel profile by measurement on the GPU present: every candidate is checked
    /// against the CPU reference, then timed on the fixed workloads; the fastest valid one is
    /// written as a profile YAML keyed by the device (config/targets/ can hold it).
    Tune {
        /// Folder written by shared/bench/workloads.py --dump.
        #[arg(long)]
        workloads: PathBuf,
        /// The built-in profile to start from, and to fall back to on another device.
        #[arg(long, default_value = "x86_64")]
        target: String,
        #[arg(long, default_value_os_t = sample::sample_data_dir())]
        data_dir: PathBuf,
        /// Write the tuned profile here (default: print it).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also write the search table (markdown) here.
        #[arg(long)]
        report: Option<PathBuf>,
    },
    /// The CPU reference of FPS, KNN, ball query and downsample on the fixed workloads, median wall time at
    /// each thread count; writes the indices and the medians to OUTPUTS for bench/cpu_peers.py.
    BenchCpuOps {
        /// Folder written by shared/bench/workloads.py --dump.
        workloads: PathBuf,
        #[arg(long)]
        outputs: PathBuf,
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
        #[arg(long, default_value_t = 9)]
        runs: usize,
    },
    /// GPU time per operator (CUDA events, median) on the fixed benchmark workloads.
    Bench {
        /// Folder written by shared/bench/workloads.py --dump.
        workloads: PathBuf,
        #[arg(long, default_value_os_t = sample::sample_data_dir())]
        data_dir: PathBuf,
        #[arg(long, default_value = "auto")]
        profile: String,
        /// Run on a green context of at least this many SMs (the driver rounds up), e.g. 16 as a
        /// proxy for Jetson Orin AGX's 16 SMs; the device line says how many were given.
        #[arg(long)]
        sms: Option<u32>,
        /// Only these operator families (comma separated); default: all.
        #[arg(long, value_enum, value_delimiter = ',')]
        only: Vec<verify::Family>,
        /// Also write the table (markdown) here.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// The pipeline a command runs: its configuration and backend.
#[derive(clap::Args)]
struct PipelineArgs {
    /// Pipeline configuration (YAML); default: built-in defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendArg,
    /// GPU kernel profile: auto, orin, xavier, x86_64 or a profile YAML file.
    #[arg(long, default_value = "auto")]
    profile: String,
    /// Testing the GPU recovery: make a real CUDA call fail at the start of operator OP on frame
    /// FRAME (from 0). KIND: launch, copy, alloc (out of memory), illegal-address (sticky); OP:
    /// gather, voxelize, downsample, fps, neighbors, detect, nms. E.g. illegal-address@fps:10.
    #[arg(long, value_name = "KIND@OP:FRAME")]
    inject_gpu_fault: Option<FaultPlan>,
}

impl PipelineArgs {
    fn load(&self) -> Result<(PipelineConfig, Engine)> {
        let config = match &self.config {
            Some(path) => PipelineConfig::load(path)?,
            None => PipelineConfig::default(),
        };
        let mut engine = Engine::select(self.backend.into(), self.profile.parse()?)?;
        if let Some(plan) = self.inject_gpu_fault {
            if !engine.inject_fault(plan) {
                bail!("--inject-gpu-fault needs the CUDA backend (this run uses {})", engine.describe());
            }
        }
        Ok((config, engine))
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum BackendArg {
    Auto,
    Cuda,
    Cpu,
}

impl From<BackendArg> for BackendKind {
    fn from(b: BackendArg) -> Self {
        match b {
            BackendArg::Auto => BackendKind::Auto,
            BackendArg::Cuda => BackendKind::Cuda,
            BackendArg::Cpu => BackendKind::Cpu,
        }
    }
}

/// The sample bag, built on first use in the user's cache folder (the CUDA cubin cache's root,
/// else the temp folder), never in the source tree.
fn sample_bag() -> Result<PathBuf> {
    let root =
        lidar_kernels::gpu::nvrtc::default_cache_dir().unwrap_or_else(|| std::env::temp_dir().join("lidar_kernels"));
    let dir = root.join("sample");
    let bag = dir.join(sample::SAMPLE_BAG_NAME);
    if bag.join("metadata.yaml").exists() {
        return Ok(bag);
    }
    sample::write_sample_bag(&dir).context("building the sample bag")
}

/// A CUDA context or an error naming what is missing (these commands need a GPU).
fn cuda_context(profile: &str) -> Result<GpuContext> {
    Ok(select_backend(BackendKind::Cuda, profile.parse()?)?.expect("cuda backend gives a context or an error"))
}

fn write_report(path: Option<&std::path::Path>, text: &str) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn main() {
    lidar_kernels::pipeline::keep_frame_buffers_mapped();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Replay { bag, topic, pipeline, out, quiet, strict, render } => {
            let (mut config, engine) = pipeline.load()?;
            config.detect.enabled |= render.is_some();
            let bag = match bag {
                Some(b) => b,
                None => sample_bag()?,
            };
            let summary = replay(
                &ReplayOptions { bag: bag.clone(), topic, out, verbose_frames: !quiet, render },
                config,
                engine,
            )?;
            println!(
                "\nreplayed {} frames of {} from {} (backend {})",
                summary.frames,
                summary.topic,
                bag.display(),
                summary.backend
            );
            if summary.box_frames > 0 {
                println!("nms over {} box messages", summary.box_frames);
            }
            if summary.skipped > 0 {
                println!("skipped {} messages (see the lines above)", summary.skipped);
            }
            println!("{}", summary.stats);
            if let Some(out) = &summary.out {
                println!("outputs written to {}", out.display());
            }
            if summary.frames == 0 {
                anyhow::bail!("no frame of {} was processed ({} messages skipped)", summary.topic, summary.skipped);
            }
            if strict && summary.skipped > 0 {
                anyhow::bail!("--strict: {} messages were skipped (see the lines above)", summary.skipped);
            }
            Ok(())
        }
        Command::Digest { bag } => {
            use sha2::{Digest, Sha256};
            let reader = lidar_kernels::bag::open(&bag)?;
            let mut digests: std::collections::BTreeMap<String, (u64, Sha256)> = Default::default();
            for m in reader.messages(None) {
                let m = m?;
                let (count, hash) = digests.entry(m.topic.clone()).or_default();
                *count += 1;
                hash.update(m.log_time_ns.to_le_bytes());
                hash.update(&m.data);
            }
            for (topic, (count, hash)) in digests {
                let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
                println!("{topic} {count} {hex}");
            }
            Ok(())
        }
        Command::Soak { bag, frames, pipeline } => {
            let (config, engine) = pipeline.load()?;
            let bag = match bag {
                Some(b) => b,
                None => sample_bag()?,
            };
            let reader = lidar_kernels::bag::open(&bag)?;
            let topic = reader
                .topics()
                .iter()
                .find(|t| t.type_name == lidar_kernels::cloud::POINTCLOUD2_TYPE)
                .map(|t| t.name.clone())
                .with_context(|| format!("no PointCloud2 topic in {}", bag.display()))?;
            let scans: Vec<Vec<u8>> =
                reader.messages(Some(&topic)).map(|m| m.map(|m| m.data)).collect::<Result<_, _>>()?;
            if scans.is_empty() {
                bail!("no cloud on {topic} in {}", bag.display());
            }
            println!("soak: {} frames of the {} clouds of {topic}, backend {}", frames, scans.len(), engine.describe());
            let on_gpu = matches!(engine, Engine::Cuda(_));
            let mut pipeline = lidar_kernels::pipeline::Pipeline::with_engine(config, engine);
            let device_used = || {
                on_gpu
                    .then(|| cudarc::driver::result::mem_get_info().ok().map(|(free, total)| (total - free) as u64))
                    .flatten()
            };
            let report = verify::soak::soak(&mut pipeline, &scans, frames, &device_used);
            println!("{report}");
            if pipeline.stats.gpu.faults > 0 {
                println!("{}", pipeline.stats.gpu);
            }
            if !report.passed() {
                bail!("soak failed (outputs not periodic, frames failed, or memory grew more than 5 %)");
            }
            Ok(())
        }
        Command::Eval { data, pipeline, render, out } => {
            let (mut config, engine) = pipeline.load()?;
            config.voxelize.enabled = false;
            config.downsample.enabled = false;
            config.fps.enabled = false;
            config.neighbors.enabled = false;
            config.detect.enabled = true;
            let report = lidar_kernels::eval::run(&data, config, engine, render.as_deref())?;
            println!("{report}");
            write_report(out.as_deref(), &report)
        }
        Command::Sample { dir } => {
            let bag = sample::write_sample_bag(&dir)?;
            println!("{}", bag.display());
            Ok(())
        }
        Command::CheckGpu { seed, data_dir, eval_dir, profile, only, out } => {
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
            });
            let ctx = cuda_context(&profile)?;
            println!("check-gpu on {} ({}, profile {}), seed {seed}", ctx.device_name, ctx.arch, ctx.profile.name);
            let table = verify::check_all(&ctx, seed, &data_dir, eval_dir.as_deref(), &verify::Families(only))?;
            println!("{table}");
            write_report(out.as_deref(), &format!("check-gpu seed {seed} on {}\n\n{table}", ctx.device_name))?;
            let failed = table.0.iter().filter(|r| !r.passed()).count();
            if failed > 0 || !table.all_passed() {
                bail!("{failed} of {} GPU checks failed", table.0.len());
            }
            println!("all {} GPU checks passed", table.0.len());
            Ok(())
        }
        Command::BenchCpu { threads, frames, config, data_dir, out } => {
            if frames == 0 || threads.contains(&0) {
                bail!("--frames and every --threads count must be at least 1");
            }
            let config = match &config {
                Some(path) => PipelineConfig::load(path)?,
                None => PipelineConfig::default(),
            };
            let table = verify::cpu::bench_cpu(&data_dir, &config, &threads, frames)?;
            println!("{table}");
            write_report(out.as_deref(), &table.to_string())
        }
        Command::Tune { workloads, target, data_dir, out, report } => {
            let base = lidar_kernels::gpu::KernelProfile::builtin(&target)?;
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} candidates, {elapsed} {msg}")
                    .expect("a valid template"),
            );
            let tuning = verify::tune::tune(&base, &workloads, &data_dir, |t, done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
                let time = match (&t.error, t.relative_time) {
                    (Some(e), _) => format!("refused: {e}"),
                    (None, Some(r)) => format!("{r:.3} x start"),
                    (None, None) => "invalid: not timed".to_string(),
                };
                bar.println(format!("{}: {}: checks {}/{}, {time}", t.family, t.candidate, t.checks.0, t.checks.1));
            })?;
            bar.finish_and_clear();
            println!("{tuning}");
            write_report(report.as_deref(), &tuning.to_string())?;
            let yaml = format!(
                "# {}\n# Written by `lidar-kernels tune --target {target}`; the search is in its report.\n{}",
                tuning.profile.description,
                serde_yaml::to_string(&tuning.profile).context("writing the profile")?
            );
            match out {
                Some(path) => {
                    write_report(Some(&path), &yaml)?;
                    println!("tuned profile written to {}", path.display());
                }
                None => println!("{yaml}"),
            }
            Ok(())
        }
        Command::BenchCpuOps { workloads, outputs, threads, runs } => {
            if runs == 0 || threads.contains(&0) {
                bail!("--runs and every --threads count must be at least 1");
            }
            for r in verify::cpu::bench_cpu_ops(&workloads, &threads, runs, &outputs)? {
                println!("{}\t{} threads\t{:.3} ms\t{}", r.name, r.threads, r.median_ms, r.workload);
            }
            Ok(())
        }
        Command::Bench { workloads, data_dir, profile, sms, only, out } => {
            let options = GpuOptions { profile: profile.parse()?, sm_limit: sms, ..GpuOptions::default() };
            let ctx = match sms {
                None => cuda_context(&profile)?,
                Some(_) => GpuContext::new(options.clone())?,
            };
            let table = verify::bench_all(&ctx, &options, &workloads, &data_dir, &verify::Families(only))?;
            println!("{table}");
            write_report(out.as_deref(), &table.to_string())
        }
        Command::NvrtcCheck => {
            let report = lidar_kernels::gpu::nvrtc::nvrtc_check()?;
            println!("{report}");
            if !report.all_ok() {
                bail!("{} kernel compilations failed", report.failures().count());
            }
            Ok(())
        }
    }
}
