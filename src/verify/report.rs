//! Rows of the `check-gpu` and `bench` tables, shared by every operator family.

use crate::cloud::Cloud;
use std::fmt;

/// One GPU-vs-CPU comparison: integer outputs must be identical, float outputs within `max_rel_err`
/// (0 where the reference fixes the order of arithmetic), and two GPU runs identical.
#[derive(Debug, Clone)]
pub struct CheckRow {
    pub operator: String,
    pub case: String,
    pub points: usize,
    /// Integer outputs (indices, coordinates, counts, keep lists) bit-identical to the CPU.
    pub integers_identical: bool,
    /// Largest relative difference of float outputs (0.0 when bit-identical or none).
    pub max_rel_err: f64,
    /// Allowed `max_rel_err` for this operator's float outputs.
    pub float_tolerance: f64,
    /// Two GPU runs gave identical output.
    pub deterministic: bool,
    pub detail: String,
}

impl CheckRow {
    pub fn passed(&self) -> bool {
        self.integers_identical && self.deterministic && self.max_rel_err <= self.float_tolerance
    }
}

/// A check table; `Display` prints markdown.
#[derive(Debug, Clone, Default)]
pub struct CheckTable(pub Vec<CheckRow>);

impl CheckTable {
    pub fn all_passed(&self) -> bool {
        !self.0.is_empty() && self.0.iter().all(CheckRow::passed)
    }
}

impl fmt::Display for CheckTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "| operator | case | points | integers identical | max rel err (tol) | deterministic | result | detail |"
        )?;
        writeln!(f, "|---|---|---:|---|---|---|---|---|")?;
        for r in &self.0 {
            writeln!(
                f,
                "| {} | {} | {} | {} | {:.1e} ({:.0e}) | {} | {} | {} |",
                r.operator,
                r.case,
                r.points,
                if r.integers_identical { "yes" } else { "NO" },
                r.max_rel_err,
                r.float_tolerance,
                if r.deterministic { "yes" } else { "NO" },
                if r.passed() { "pass" } else { "FAIL" },
                r.detail
            )?;
        }
        Ok(())
    }
}

/// One benchmark measurement: GPU time by CUDA events, median over `runs` after warm-up.
#[derive(Debug, Clone)]
pub struct BenchRow {
    pub operator: String,
    pub workload: String,
    pub points: usize,
    pub median_ms: f64,
    pub runs: usize,
    /// Least bytes the operator must move through device memory (inputs read once, outputs written once).
    pub min_bytes: u64,
    /// Target from the issue, in ms, if any.
    pub target_ms: Option<f64>,
    /// Best peer's median on the same workload, in ms, if known.
    pub peer_ms: Option<f64>,
    pub note: String,
}

/// A bench table with the device's measured copy bandwidth for the bytes/s column.
#[derive(Debug, Clone, Default)]
pub struct BenchTable {
    pub device: String,
    pub copy_bandwidth_gbs: f64,
    pub rows: Vec<BenchRow>,
}

impl fmt::Display for BenchTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Device: {}; measured device copy bandwidth {:.0} GB/s (read + write)\n",
            self.device, self.copy_bandwidth_gbs
        )?;
        writeln!(f, "| operator | workload | points | GPU median ms | runs | achieved GB/s (% of copy) | target ms | best peer ms | note |")?;
        writeln!(f, "|---|---|---:|---:|---:|---:|---:|---:|---|")?;
        for r in &self.rows {
            let gbs = r.min_bytes as f64 / (r.median_ms * 1e-3) / 1e9;
            let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v}"));
            writeln!(
                f,
                "| {} | {} | {} | {:.4} | {} | {:.1} ({:.1}%) | {} | {} | {} |",
                r.operator,
                r.workload,
                r.points,
                r.median_ms,
                r.runs,
                gbs,
                100.0 * gbs / self.copy_bandwidth_gbs.max(1e-9),
                opt(r.target_ms),
                opt(r.peer_ms),
                r.note
            )?;
        }
        Ok(())
    }
}

/// The deterministic generator (splitmix64) of every GPU check's random clouds and boxes.
pub(crate) struct Rng(u64);
impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [lo, hi).
    pub(crate) fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub(crate) fn cloud(&mut self, n: usize, half: f32) -> Cloud {
        let (mut x, mut y, mut z) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            x.push(self.f32(-half, half));
            y.push(self.f32(-half, half));
            z.push(self.f32(-half / 8.0, half / 8.0));
        }
        Cloud::from_xyz(x, y, z)
    }
    /// Points on a coarse integer lattice: many exact duplicates and equal distances.
    pub(crate) fn lattice(&mut self, n: usize, side: u64) -> Cloud {
        let mut pts = Vec::with_capacity(n);
        for _ in 0..n {
            pts.push([self.below(side) as f32, self.below(side) as f32, self.below(side.div_ceil(2)) as f32]);
        }
        Cloud::from_points(&pts)
    }
}
