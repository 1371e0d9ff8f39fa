//! Rows of the `check-gpu` and `bench` tables, shared by every operator family.

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
        writeln!(f, "| operator | case | points | integers identical | max rel err (tol) | deterministic | result | detail |")?;
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
        writeln!(f, "Device: {}; measured device copy bandwidth {:.0} GB/s (read + write)\n", self.device, self.copy_bandwidth_gbs)?;
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
