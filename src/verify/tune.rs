//! `lidar-kernels tune`: a kernel profile chosen by measurement on the GPU present. Family by
//! family (the voxel tiles, the voxel hash table, FPS, the neighbour searches), every candidate
//! value of the family's knobs is compiled into a profile, checked against the CPU reference with
//! the family's `check-gpu` rows (a candidate with one failing row is discarded), then timed with
//! the family's `bench` rows on the fixed workloads. The fastest valid candidate (geometric mean
//! of its rows' medians over the starting profile's) replaces the starting values only when it is
//! at least [`MIN_GAIN`] faster; then the next family is searched.
//! The result is keyed by the device, its compute capability and the NVRTC version
//! ([`TunedFor`]), so a node on another device falls back to the target's built-in profile.

use super::report::{BenchRow, CheckRow};
use super::{fps, neighbors, voxel, VerifyError};
use crate::gpu::{select_backend, BackendKind, GpuContext, KernelProfile, ProfileChoice, TunedFor};
use std::fmt;
use std::path::Path;

/// One family: the knob values it tries and how a candidate is checked and timed.
struct Family {
    name: &'static str,
    /// The candidates: a label and the profile with this family's knobs set.
    candidates: fn(&KernelProfile) -> Vec<(String, KernelProfile)>,
    check: fn(&GpuContext, &Path) -> Result<Vec<CheckRow>, VerifyError>,
    bench: fn(&GpuContext, &Path) -> Result<Vec<BenchRow>, VerifyError>,
}

/// Smallest gain that replaces a family's starting values: on the H200 the same profile timed
/// twice in one search differed by up to 6 % (kernels of tens of microseconds), so a smaller gain
/// is not told apart from noise.
pub const MIN_GAIN: f64 = 0.05;

/// The seed of the check rows' random clouds (fixed: every candidate sees the same inputs).
const SEED: u64 = 20261201;

/// `base` with one knob set to each of `values`, labelled `key value`.
fn one_knob<T: Copy + fmt::Display>(
    base: &KernelProfile,
    key: &str,
    values: &[T],
    set: fn(&mut KernelProfile, T),
) -> Vec<(String, KernelProfile)> {
    values
        .iter()
        .map(|&v| {
            let mut p = base.clone();
            set(&mut p, v);
            (format!("{key} {v}"), p)
        })
        .collect()
}

fn families() -> [Family; 4] {
    [
        Family {
            name: "voxel tiles",
            candidates: |base| {
                let mut out = Vec::new();
                for block in [128, 256, 512] {
                    for items in [2, 4, 8, 16] {
                        let mut p = base.clone();
                        (p.block_size.voxel, p.items_per_thread.voxel) = (block, items);
                        out.push((format!("block_size.voxel {block}, items_per_thread.voxel {items}"), p));
                    }
                }
                out
            },
            check: |ctx, ouster| voxel::check_with(ctx, SEED, ouster, true),
            bench: voxel::bench,
        },
        Family {
            name: "voxel hash table",
            candidates: |base| one_knob(base, "hash_load_factor", &[0.3, 0.5, 0.7], |p, f| p.hash_load_factor = f),
            check: |ctx, ouster| voxel::check_with(ctx, SEED, ouster, true),
            bench: voxel::bench,
        },
        Family {
            name: "fps",
            candidates: |base| one_knob(base, "block_size.fps", &[256, 512, 1024], |p, b| p.block_size.fps = b),
            check: |ctx, ouster| fps::check(ctx, SEED, ouster),
            bench: fps::bench,
        },
        Family {
            name: "neighbors",
            candidates: |base| {
                one_knob(base, "block_size.neighbors", &[64, 128, 256, 512], |p, b| p.block_size.neighbors = b)
            },
            check: |ctx, ouster| neighbors::check(ctx, SEED, ouster),
            bench: neighbors::bench,
        },
    ]
}

/// One candidate as measured.
#[derive(Debug, Clone)]
pub struct Trial {
    pub family: &'static str,
    pub candidate: String,
    /// Check rows passed of all.
    pub checks: (usize, usize),
    /// Geometric mean over the family's bench rows of median / the starting profile's median.
    pub relative_time: Option<f64>,
    /// Sum of the rows' medians (ms), for reading.
    pub sum_ms: Option<f64>,
    /// Why the candidate could not be checked or timed (a launch refused, ...), if so.
    pub error: Option<String>,
    pub chosen: Choice,
}

/// Whether a trial's values were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    No,
    /// The fastest, at least [`MIN_GAIN`] faster than the start.
    Faster,
    /// The starting values, kept: no candidate was [`MIN_GAIN`] faster.
    StartKept,
}

/// The search and its result.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub device: TunedFor,
    pub base: String,
    pub trials: Vec<Trial>,
    pub profile: KernelProfile,
}

impl fmt::Display for Tuning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "tune on {} (sm_{}{}, NVRTC {}.{}), from the {} profile\n",
            self.device.device,
            self.device.compute_capability[0],
            self.device.compute_capability[1],
            self.device.nvrtc_version[0],
            self.device.nvrtc_version[1],
            self.base
        )?;
        writeln!(f, "| family | candidate | checks passed | time vs start (geo. mean) | sum of medians ms | chosen |")?;
        writeln!(f, "|---|---|---|---:|---:|---|")?;
        let errors: Vec<&Trial> = self.trials.iter().filter(|t| t.error.is_some()).collect();
        for t in &self.trials {
            let num = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
            writeln!(
                f,
                "| {} | {} | {}/{} | {} | {} | {} |",
                t.family,
                t.candidate,
                t.checks.0,
                t.checks.1,
                num(t.relative_time, 3),
                num(t.sum_ms, 3),
                match t.chosen {
                    Choice::No => "",
                    Choice::Faster => "**yes**",
                    Choice::StartKept => "yes (start kept)",
                }
            )?;
        }
        for t in errors {
            writeln!(f, "\n{} {}: {}", t.family, t.candidate, t.error.as_deref().unwrap_or_default())?;
        }
        Ok(())
    }
}

fn context(profile: &KernelProfile) -> Result<GpuContext, VerifyError> {
    let choice = ProfileChoice::Given(Box::new(profile.clone()));
    Ok(select_backend(BackendKind::Cuda, choice)?.expect("a CUDA context or an error"))
}

/// The geometric mean of `rows`' medians over `base`'s, row by row (operator, workload); None
/// when a row of `base` is missing.
fn relative(rows: &[BenchRow], base: &[BenchRow]) -> Option<f64> {
    let mut log_sum = 0.0;
    for b in base {
        let r = rows.iter().find(|r| r.operator == b.operator && r.workload == b.workload)?;
        log_sum += (r.median_ms / b.median_ms).ln();
    }
    (!base.is_empty()).then(|| (log_sum / base.len() as f64).exp())
}

/// Searches every family from `base` (see the module doc). `progress` is told of each trial.
pub fn tune(
    base: &KernelProfile,
    workloads: &Path,
    ouster_dir: &Path,
    mut progress: impl FnMut(&Trial, usize, usize),
) -> Result<Tuning, VerifyError> {
    let families = families();
    let total: usize = families.iter().map(|fam| (fam.candidates)(base).len()).sum();
    let first = context(base)?;
    let device = TunedFor::of(&first.device_name, first.compute_capability, first.nvrtc_version);
    drop(first);
    let mut best = base.clone();
    let mut trials = Vec::new();
    for fam in &families {
        // The starting point of this family: the profile as chosen so far.
        let start_rows = (fam.bench)(&context(&best)?, workloads)?;
        let mut chosen: Option<(f64, KernelProfile, usize)> = None;
        for (label, candidate) in (fam.candidates)(&best) {
            // A candidate the device refuses (too many registers for its block, ...) is invalid.
            let measured = context(&candidate).and_then(|ctx| {
                let checks = (fam.check)(&ctx, ouster_dir)?;
                let passed = checks.iter().filter(|r| r.passed()).count();
                let rows = if passed == checks.len() { Some((fam.bench)(&ctx, workloads)?) } else { None };
                Ok(((passed, checks.len()), rows))
            });
            let (checks, rows, error) = match measured {
                Ok((checks, rows)) => (checks, rows, None),
                Err(e) => ((0, 0), None, Some(e.to_string())),
            };
            let relative_time = rows.as_ref().and_then(|r| relative(r, &start_rows));
            let sum_ms = rows.as_ref().map(|r| r.iter().map(|r| r.median_ms).sum());
            let start = candidate == best;
            trials.push(Trial {
                family: fam.name,
                candidate: label,
                checks,
                relative_time,
                sum_ms,
                error,
                chosen: if start { Choice::StartKept } else { Choice::No },
            });
            if let Some(rel) = relative_time.filter(|&r| r <= 1.0 - MIN_GAIN) {
                if chosen.as_ref().is_none_or(|(r, _, _)| rel < *r) {
                    chosen = Some((rel, candidate, trials.len() - 1));
                }
            }
            progress(trials.last().expect("just pushed"), trials.len(), total);
        }
        if let Some((_, profile, at)) = chosen {
            for t in trials.iter_mut().filter(|t| t.family == fam.name) {
                t.chosen = Choice::No;
            }
            trials[at].chosen = Choice::Faster;
            best = profile;
        }
    }
    best.description = format!(
        "{} tuned by lidar-kernels tune on {} (sm_{}{}, NVRTC {}.{})",
        base.name,
        device.device,
        device.compute_capability[0],
        device.compute_capability[1],
        device.nvrtc_version[0],
        device.nvrtc_version[1]
    );
    best.tuned_for = Some(device.clone());
    Ok(Tuning { device, base: base.name.clone(), trials, profile: best })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(op: &str, ms: f64) -> BenchRow {
        BenchRow {
            operator: op.into(),
            workload: "w".into(),
            points: 1,
            median_ms: ms,
            runs: 1,
            min_bytes: 0,
            target_ms: None,
            peer_ms: None,
            note: String::new(),
        }
    }

    #[test]
    fn relative_time_is_the_geometric_mean_of_the_rows() {
        let base = [row("a", 2.0), row("b", 8.0)];
        assert_eq!(relative(&base, &base), Some(1.0));
        // One row twice as fast, one twice as slow: no gain.
        let r = relative(&[row("b", 16.0), row("a", 1.0)], &base).unwrap();
        assert!((r - 1.0).abs() < 1e-12, "{r}");
        let r = relative(&[row("a", 1.0), row("b", 4.0)], &base).unwrap();
        assert!((r - 0.5).abs() < 1e-12, "{r}");
        assert_eq!(relative(&[row("a", 1.0)], &base), None);
        assert_eq!(relative(&[], &[]), None);
    }

    #[test]
    fn every_candidate_is_a_valid_profile_that_differs_in_its_family_only() {
        let base = KernelProfile::builtin("x86_64").unwrap();
        for fam in families() {
            let cands = (fam.candidates)(&base);
            assert!(cands.len() >= 3, "{}", fam.name);
            for (label, p) in cands {
                p.validate().unwrap_or_else(|e| panic!("{} {label}: {e}", fam.name));
                assert_eq!(p.pools, base.pools, "{label}");
                assert_eq!(p.block_size.gather, base.block_size.gather, "{label}");
            }
        }
    }
}
