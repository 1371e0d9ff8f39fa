//! What happens on the wire around the node, for /diagnostics: clouds lost before they reached
//! the node (gaps in the sensor's header stamps), QoS that cannot match between the node and its
//! peers, and a silent input while a publisher exists.
//!
//! r2r 0.9.7 exposes neither rcl's QoS events (message lost, incompatible QoS) nor the
//! subscriptions of a topic, so the node reads the graph itself (the input's publishers through
//! r2r, the outputs' subscriptions through [`super::graph::GraphProbe`]) and applies DDS's
//! request/offer rules to each pair.

use std::collections::VecDeque;

use r2r::qos::{DurabilityPolicy, ReliabilityPolicy};
use r2r::QosProfile;

/// Header stamp (ns) of a CDR PointCloud2 without decoding the rest: the stamp is the first
/// field after the 4-byte encapsulation header.
pub fn cdr_stamp_ns(cdr: &[u8]) -> Option<i64> {
    let little = match cdr.get(..2)? {
        [0, 1] | [0, 3] => true,
        [0, 0] | [0, 2] => false,
        _ => return None,
    };
    let word = |at: usize| -> Option<[u8; 4]> { cdr.get(at..at + 4)?.try_into().ok() };
    let (s, n) = (word(4)?, word(8)?);
    let (sec, nsec) = if little {
        (i32::from_le_bytes(s), u32::from_le_bytes(n))
    } else {
        (i32::from_be_bytes(s), u32::from_be_bytes(n))
    };
    Some(sec as i64 * 1_000_000_000 + nsec as i64)
}

/// Counts clouds missing from a steady stream: once the last header-stamp intervals agree (the
/// sensor's period), an interval of k periods means k - 1 clouds never arrived. A stream without
/// a steady rate (hand-made clouds, a bag restarted) counts nothing; an interval longer than
/// [`StampGaps::MAX_GAP_PERIODS`] periods is a pause, not a loss.
#[derive(Debug, Default)]
pub struct StampGaps {
    last: Option<i64>,
    intervals: VecDeque<i64>,
    pub lost: u64,
    pub gaps: u64,
}

impl StampGaps {
    const WINDOW: usize = 32;
    const MIN_INTERVALS: usize = 8;
    pub const MAX_GAP_PERIODS: f64 = 50.0;

    /// The sensor's period (ns): the shortest recent interval (10th percentile), when nearly all
    /// recent intervals are within 10 % of a whole multiple of it (a steady rate, losses or not)
    /// and it is between 1 ms and 10 s.
    pub fn period_ns(&self) -> Option<i64> {
        if self.intervals.len() < Self::MIN_INTERVALS {
            return None;
        }
        let mut v: Vec<i64> = self.intervals.iter().copied().collect();
        v.sort_unstable();
        let p = v[v.len() / 10];
        if !(1_000_000..=10_000_000_000).contains(&p) {
            return None;
        }
        let on_grid = v
            .iter()
            .filter(|&&d| {
                let k = (d as f64 / p as f64).round().max(1.0);
                (d as f64 - k * p as f64).abs() <= 0.1 * p as f64
            })
            .count();
        (on_grid * 10 >= v.len() * 9).then_some(p)
    }

    /// One received cloud's stamp; returns the clouds missing just before it.
    pub fn observe(&mut self, stamp_ns: i64) -> u64 {
        let prev = self.last.replace(stamp_ns);
        let Some(prev) = prev else { return 0 };
        let d = stamp_ns - prev;
        if d <= 0 {
            // Stamps went back (a bag looped, a driver restarted): a new stream.
            self.intervals.clear();
            return 0;
        }
        let mut missing = 0;
        if let Some(p) = self.period_ns() {
            let periods = d as f64 / p as f64;
            if periods > Self::MAX_GAP_PERIODS {
                self.intervals.clear();
                return 0;
            }
            if periods >= 1.5 {
                missing = periods.round() as u64 - 1;
                self.lost += missing;
                self.gaps += 1;
            }
        }
        if self.intervals.len() == Self::WINDOW {
            self.intervals.pop_front();
        }
        self.intervals.push_back(d);
        missing
    }
}

/// Short text of the QoS that matters for matching: "reliable, volatile, keep last 5".
pub fn describe_qos(q: &QosProfile) -> String {
    let r = match q.reliability {
        ReliabilityPolicy::Reliable => "reliable",
        ReliabilityPolicy::BestEffort => "best effort",
        _ => "reliability unknown",
    };
    let d = match q.durability {
        DurabilityPolicy::TransientLocal => "transient local",
        DurabilityPolicy::Volatile => "volatile",
        _ => "durability unknown",
    };
    // The graph does not carry a remote endpoint's history depth (it reads 0 there).
    match q.depth {
        0 => format!("{r}, {d}"),
        n => format!("{r}, {d}, keep last {n}"),
    }
}

/// Why a reader with `requested` QoS cannot receive from a writer offering `offered` (DDS
/// request/offer rules for reliability and durability), or `None` when they match.
pub fn incompatibility(requested: &QosProfile, offered: &QosProfile) -> Option<&'static str> {
    if requested.reliability == ReliabilityPolicy::Reliable && offered.reliability == ReliabilityPolicy::BestEffort {
        return Some("the subscription is reliable, the publisher best effort");
    }
    if requested.durability == DurabilityPolicy::TransientLocal && offered.durability == DurabilityPolicy::Volatile {
        return Some("the subscription is transient local, the publisher volatile");
    }
    None
}

/// The input topic's fully qualified name as rcl resolves it: the node's `-r from:=to` remaps
/// of `topic` (command line, in `args`), expanded in the node's namespace and name.
pub fn resolve_topic(topic: &str, args: &[String], node_name: &str, namespace: &str) -> String {
    let mut target = topic.to_string();
    let mut in_ros = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--ros-args" => in_ros = true,
            "--" => in_ros = false,
            "-r" | "--remap" if in_ros => {
                let Some(rule) = it.next() else { break };
                let Some((lhs, to)) = rule.split_once(":=") else { continue };
                let (scope, from) = match lhs.split_once(':') {
                    Some((node, from)) => (Some(node), from),
                    None => (None, lhs),
                };
                if from == topic && scope.is_none_or(|n| n == node_name) {
                    target = to.to_string();
                }
            }
            _ => {}
        }
    }
    let ns = namespace.trim_end_matches('/');
    if target.starts_with('/') {
        target
    } else if let Some(rest) = target.strip_prefix("~/") {
        format!("{ns}/{node_name}/{rest}")
    } else {
        format!("{ns}/{target}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_gaps_count_missing_clouds_of_a_steady_stream_only() {
        let mut g = StampGaps::default();
        let period = 100_000_000; // 10 Hz
        let mut t = 1_700_000_000_000_000_000i64;
        for _ in 0..20 {
            t += period + 1_000_000; // a little jitter
            assert_eq!(g.observe(t), 0);
        }
        assert!(g.period_ns().is_some());
        t += 4 * period; // three clouds missing
        assert_eq!(g.observe(t), 3);
        t += period;
        assert_eq!(g.observe(t), 0);
        assert_eq!((g.lost, g.gaps), (3, 1));
        t += 1000 * period; // a pause, not a loss
        assert_eq!(g.observe(t), 0);
        assert_eq!(g.lost, 3);
        // Heavy loss (about half the clouds) is still a steady stream.
        let mut g = StampGaps::default();
        let mut t = 0i64;
        for k in 0..40 {
            t += [1, 3, 1, 2, 4][k % 5] * period;
            g.observe(t);
        }
        assert_eq!(g.period_ns(), Some(period));
        // The first stamp starts the stream; its next eight intervals set the period; the rest count.
        let expected: i64 = (StampGaps::MIN_INTERVALS + 1..40).map(|k| [1, 3, 1, 2, 4][k % 5] - 1).sum();
        assert_eq!(g.lost, expected as u64);
        // Irregular stamps (hand-made clouds 1 ns apart, then seconds apart) count nothing.
        let mut g = StampGaps::default();
        for k in 0..12 {
            g.observe(k);
        }
        g.observe(3_000_000_000);
        assert_eq!(g.lost, 0);
    }

    #[test]
    fn cdr_stamp_reads_the_header() {
        let mut cdr = vec![0u8, 1, 0, 0];
        cdr.extend(7i32.to_le_bytes());
        cdr.extend(5u32.to_le_bytes());
        assert_eq!(cdr_stamp_ns(&cdr), Some(7_000_000_005));
        assert_eq!(cdr_stamp_ns(&cdr[..10]), None);
    }

    #[test]
    fn qos_rules() {
        let (rel, be) = (QosProfile::default(), QosProfile::sensor_data());
        assert!(incompatibility(&rel, &be).is_some());
        assert!(incompatibility(&be, &rel).is_none());
        assert!(incompatibility(&rel, &rel).is_none());
        let latched = QosProfile::default().transient_local();
        assert!(incompatibility(&latched, &rel).is_some());
    }

    #[test]
    fn topics_resolve_with_remaps() {
        let a = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(resolve_topic("points", &a("x"), "pipeline", "/"), "/points");
        assert_eq!(resolve_topic("points", &a("x"), "pipeline", "/car"), "/car/points");
        assert_eq!(resolve_topic("points", &a("x --ros-args -r points:=/lk/points"), "p", "/"), "/lk/points");
        assert_eq!(resolve_topic("points", &a("x --ros-args -r points:=front"), "p", "/car"), "/car/front");
        assert_eq!(resolve_topic("points", &a("x --ros-args -r other:points:=/no"), "p", "/"), "/points");
        assert_eq!(resolve_topic("points", &a("x --ros-args -r p:points:=/yes"), "p", "/"), "/yes");
        assert_eq!(resolve_topic("points", &a("x -r points:=/not_ros_args"), "p", "/"), "/points");
    }
}
