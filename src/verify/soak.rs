//! `lidar-kernels soak`: the same few scans through one pipeline for thousands of frames, as a
//! node sees a sensor for hours: every frame's outputs must equal those of the first pass over
//! the scans (bit for bit), and host RSS and device memory must not grow.

use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::pipeline::{LatencySamples, Pipeline};

/// What a soak measured.
#[derive(Debug)]
pub struct SoakReport {
    pub frames: u64,
    pub scans: usize,
    /// Frames whose outputs differ from frame `i mod scans`.
    pub mismatches: Vec<u64>,
    /// Frames that failed (with the error of the first).
    pub failures: u64,
    pub first_failure: Option<String>,
    /// (after frame 100, at the end): host resident set and device memory in use, bytes.
    pub rss: (u64, u64),
    pub device_used: Option<(u64, u64)>,
    pub frame_ms: LatencySamples,
}

impl SoakReport {
    /// Growth from frame 100 to the end, as a fraction.
    fn growth((at_100, end): (u64, u64)) -> f64 {
        (end as f64 - at_100 as f64) / at_100.max(1) as f64
    }

    /// Outputs periodic, no failure, RSS and device memory within 5 % of their frame-100 values.
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty()
            && self.failures == 0
            && Self::growth(self.rss) <= 0.05
            && self.device_used.is_none_or(|d| Self::growth(d) <= 0.05)
    }
}

impl std::fmt::Display for SoakReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mb = |b: u64| b as f64 / (1 << 20) as f64;
        writeln!(f, "soak: {} frames over {} scans", self.frames, self.scans)?;
        writeln!(
            f,
            "outputs equal to frame i mod {}: {} ({} mismatches{})",
            self.scans,
            if self.mismatches.is_empty() { "yes" } else { "NO" },
            self.mismatches.len(),
            self.mismatches.first().map_or(String::new(), |i| format!(", first at frame {i}"))
        )?;
        if self.failures > 0 {
            writeln!(f, "failed frames: {} (first: {})", self.failures, self.first_failure.as_deref().unwrap_or(""))?;
        }
        writeln!(
            f,
            "host RSS: {:.1} MB after frame 100, {:.1} MB at the end ({:+.2} %)",
            mb(self.rss.0),
            mb(self.rss.1),
            100.0 * Self::growth(self.rss)
        )?;
        if let Some(d) = self.device_used {
            writeln!(
                f,
                "device memory in use (cuMemGetInfo): {:.1} MB after frame 100, {:.1} MB at the end ({:+.2} %)",
                mb(d.0),
                mb(d.1),
                100.0 * Self::growth(d)
            )?;
        }
        let p = |q| self.frame_ms.percentile(q).unwrap_or(f64::NAN);
        write!(f, "frame wall time p50 {:.2} ms, p99 {:.2} ms", p(0.5), p(0.99))
    }
}

/// Resident set of this process (Linux `/proc/self/statm`), bytes.
fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64
}

fn outputs_digest(messages: &[(&'static str, crate::cloud::CloudMessage)]) -> [u8; 32] {
    let mut h = Sha256::new();
    for (topic, m) in messages {
        h.update(topic.as_bytes());
        h.update(m.cdr());
    }
    h.finalize().into()
}

/// Runs `frames` frames over the CDR clouds `scans` in turn. `device_used` reads the device
/// memory in use (`None` on the CPU backend).
pub fn soak(
    pipeline: &mut Pipeline,
    scans: &[Vec<u8>],
    frames: u64,
    device_used: &dyn Fn() -> Option<u64>,
) -> SoakReport {
    let mut reference: Vec<Option<[u8; 32]>> = vec![None; scans.len()];
    let mut report = SoakReport {
        frames,
        scans: scans.len(),
        mismatches: Vec::new(),
        failures: 0,
        first_failure: None,
        rss: (0, 0),
        device_used: None,
        frame_ms: LatencySamples::default(),
    };
    let mut at_100 = None;
    for i in 0..frames {
        let k = (i % scans.len() as u64) as usize;
        let t = Instant::now();
        match pipeline.process_cdr(&scans[k]) {
            Ok(out) => {
                let d = outputs_digest(&out.messages);
                match reference[k] {
                    None => reference[k] = Some(d),
                    Some(r) if r != d => report.mismatches.push(i),
                    Some(_) => {}
                }
            }
            Err(e) => {
                report.failures += 1;
                report.first_failure.get_or_insert_with(|| e.to_string());
            }
        }
        report.frame_ms.push(t.elapsed());
        if i + 1 == 100.min(frames) {
            at_100 = Some((rss_bytes(), device_used()));
        }
    }
    let (rss_100, dev_100) = at_100.unwrap_or((rss_bytes(), device_used()));
    report.rss = (rss_100, rss_bytes());
    report.device_used = dev_100.zip(device_used());
    report
}
