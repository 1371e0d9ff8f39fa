//! Per-stage latency statistics and frame counters, shared by `replay`'s summary table and the
//! nodes' diagnostics.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Latency samples of one stage, in milliseconds.
#[derive(Debug, Default, Clone)]
pub struct LatencySamples {
    samples_ms: Vec<f64>,
}

impl LatencySamples {
    pub fn push(&mut self, d: Duration) {
        self.samples_ms.push(d.as_secs_f64() * 1e3);
    }

    pub fn len(&self) -> usize {
        self.samples_ms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples_ms.is_empty()
    }

    /// Nearest-rank percentile (q in 0..=1); `None` without samples.
    pub fn percentile(&self, q: f64) -> Option<f64> {
        if self.samples_ms.is_empty() {
            return None;
        }
        let mut sorted = self.samples_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        Some(sorted[rank - 1])
    }
}

/// Counters and per-stage latencies over a run.
#[derive(Debug, Default, Clone)]
pub struct PipelineStats {
    pub clouds_received: u64,
    pub clouds_processed: u64,
    pub clouds_dropped: u64,
    pub malformed: u64,
    pub points_in: u64,
    pub points_non_finite: u64,
    pub points_out_of_range: u64,
    pub points_over_capacity: u64,
    pub gpu: GpuFallbackStats,
    pub stages: BTreeMap<&'static str, LatencySamples>,
}

/// What the CUDA engine's recovery did (all zero on the CPU backend and on a healthy GPU).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GpuFallbackStats {
    /// Device errors (launch, copy, allocation, sticky faults): each frame is run again on the CPU.
    pub faults: u64,
    /// Frames the CPU ran instead of the GPU: after a fault, during a back-off, or for a cloud past
    /// the kernels' size limits.
    pub cpu_frames: u64,
    /// CUDA contexts rebuilt after a fault, and attempts that failed (the back-off then doubles).
    pub rebuilds: u64,
    pub rebuild_failures: u64,
    /// A sticky fault made CUDA unusable for the rest of the process: every frame runs on the CPU.
    pub lost: bool,
    /// Output messages whose bytes were put on the heap because the page-locked output pool was
    /// full (`gpu::output_pool`): their copies back run slower.
    pub output_heap_messages: u64,
}

impl PipelineStats {
    pub fn record_stage(&mut self, stage: &'static str, d: Duration) {
        self.stages.entry(stage).or_default().push(d);
    }

    /// Key/value pairs for diagnostics and logs.
    pub fn key_values(&self) -> Vec<(String, String)> {
        let mut kv = vec![
            ("clouds_received".to_string(), self.clouds_received.to_string()),
            ("clouds_processed".to_string(), self.clouds_processed.to_string()),
            ("clouds_dropped".to_string(), self.clouds_dropped.to_string()),
            ("malformed_messages".to_string(), self.malformed.to_string()),
            ("points_non_finite".to_string(), self.points_non_finite.to_string()),
            ("points_out_of_range".to_string(), self.points_out_of_range.to_string()),
            ("points_dropped_capacity".to_string(), self.points_over_capacity.to_string()),
            ("gpu_faults".to_string(), self.gpu.faults.to_string()),
            ("gpu_fallback_cpu_frames".to_string(), self.gpu.cpu_frames.to_string()),
            ("gpu_context_rebuilds".to_string(), self.gpu.rebuilds.to_string()),
            ("gpu_context_rebuild_failures".to_string(), self.gpu.rebuild_failures.to_string()),
            ("gpu_lost".to_string(), self.gpu.lost.to_string()),
            ("gpu_output_heap_messages".to_string(), self.gpu.output_heap_messages.to_string()),
        ];
        for (stage, s) in &self.stages {
            for (label, q) in [("p50", 0.5), ("p99", 0.99)] {
                if let Some(v) = s.percentile(q) {
                    kv.push((format!("{stage}_{label}_ms"), format!("{v:.3}")));
                }
            }
        }
        kv
    }
}

/// The per-stage table printed at the end of a replay.
impl fmt::Display for PipelineStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| stage | frames | p50 ms | p99 ms |")?;
        writeln!(f, "|---|---:|---:|---:|")?;
        for (stage, s) in &self.stages {
            let p = |q| s.percentile(q).map_or("-".to_string(), |v| format!("{v:.3}"));
            writeln!(f, "| {stage} | {} | {} | {} |", s.len(), p(0.5), p(0.99))?;
        }
        write!(
            f,
            "clouds: {} received, {} processed, {} malformed; points: {} in, {} non-finite, {} out of range, {} over capacity",
            self.clouds_received,
            self.clouds_processed,
            self.malformed,
            self.points_in,
            self.points_non_finite,
            self.points_out_of_range,
            self.points_over_capacity
        )?;
        if self.gpu.faults > 0 {
            write!(f, "\n{}", self.gpu)?;
        }
        if self.gpu.output_heap_messages > 0 {
            write!(
                f,
                "\n{} output messages on the heap: the page-locked output pool was full",
                self.gpu.output_heap_messages
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for GpuFallbackStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU faults: {} (frames run on the CPU instead: {}; CUDA context rebuilt {} times, {} failed attempts)",
            self.faults, self.cpu_frames, self.rebuilds, self.rebuild_failures
        )?;
        if self.lost {
            write!(f, "; CUDA lost to a sticky fault: later frames ran on the CPU (restart to get the GPU back)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut s = LatencySamples::default();
        assert_eq!(s.percentile(0.5), None);
        for ms in [5u64, 1, 4, 2, 3] {
            s.push(Duration::from_millis(ms));
        }
        // Sorted 1..=5: the 50th percentile by nearest rank is the 3rd value, the 99th the 5th.
        assert_eq!(s.percentile(0.5), Some(3.0));
        assert_eq!(s.percentile(0.99), Some(5.0));
        assert_eq!(s.percentile(0.0), Some(1.0));
    }
}
