//! The node plumbing around a [`Stage`]:
//!
//! ```text
//!  DDS --raw CDR--> r2r subscription --(executor task: push, never blocks)--> LatestQueue
//!  LatestQueue --(processing thread)--> decode + validate --> Stage::process --> publish_raw
//!  1 s wall timer --> /diagnostics (counters, link health, Stage::stats), stamped with the ROS clock
//!  spin thread: Node::spin_once, and once a second the graph (input publishers, output subscriptions)
//!  parameter services on the tokio runtime; Ctrl-C / SIGTERM: stop within SHUTDOWN_GRACE
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use futures::StreamExt;
use r2r::QosProfile;

use super::graph::GraphProbe;
use super::link::{cdr_stamp_ns, describe_qos, incompatibility, resolve_topic, StampGaps};
use super::params::{self, ParamTable};
use super::queue::{LatestQueue, Pop};
use super::ratelimit::RateLimiter;
use super::stage::{error_kind, Input, ParamSpec, ParamValue, Params, Stage};
use crate::cloud::{CloudView, POINTCLOUD2_TYPE};
use crate::pipeline::LatencySamples;

/// The parameters every node declares (a stage's own come after them).
pub fn common_params() -> Vec<ParamSpec> {
    vec![
        ParamSpec::bool(
            "reliable",
            false,
            "Input QoS: false = sensor data (best effort), true = reliable (no cloud lost on the wire; the \
             publisher must be reliable too).",
        )
        .read_only(),
        ParamSpec::int(
            "qos_depth",
            5,
            1,
            100,
            "Input QoS history depth (keep last N); 5 as the sensor-data profile, so that a large cloud still \
             being reassembled is not pushed out by the next.",
        )
        .read_only(),
        ParamSpec::bool(
            "output_reliable",
            true,
            "Output QoS reliability; reliable output reaches both reliable and best-effort subscribers.",
        )
        .read_only(),
        ParamSpec::int(
            "output_depth",
            10,
            1,
            100,
            "Output QoS history depth (keep last N). Reliable outputs resend from this history: with 1, a \
             subscriber that misses a fragment of a large message loses it when the next is published.",
        )
        .read_only(),
        ParamSpec::int(
            "queue_size",
            1,
            1,
            64,
            "Clouds waiting for processing; when full, the oldest waiting is dropped and counted (latest wins).",
        ),
        ParamSpec::double("diagnostics_period", 1.0, 0.1, 60.0, "Seconds between /diagnostics messages (wall time).")
            .read_only(),
        ParamSpec::double(
            "malformed_log_period",
            5.0,
            0.0,
            3600.0,
            "Seconds between log lines about malformed clouds or stage errors; the others are counted only.",
        ),
        ParamSpec::double(
            "input_timeout",
            3.0,
            0.1,
            3600.0,
            "Seconds without a cloud, while the input topic has a publisher, before /diagnostics warns (and names \
             the publisher's QoS).",
        ),
        ParamSpec::bool(
            "use_sim_time",
            false,
            "Take the ROS clock from /clock (diagnostics stamps); outputs keep their input's header stamp.",
        )
        .read_only(),
    ]
}

/// Counters shared by the executor side, the processing thread and the diagnostics task.
#[derive(Default)]
pub struct NodeStats {
    pub processed: AtomicU64,
    pub malformed: AtomicU64,
    pub stage_errors: AtomicU64,
    pub publish_errors: AtomicU64,
    pub published: AtomicU64,
    pub points_in: AtomicU64,
    detail: Mutex<StatsDetail>,
}

#[derive(Default)]
struct StatsDetail {
    malformed_by_kind: BTreeMap<&'static str, u64>,
    last_malformed: String,
    last_stage_error: String,
    process_ms_last: f64,
    process_ms_max: f64,
    process_ms_sum: f64,
    /// Receive (executor callback) to the last publish of the cloud's outputs, recent window.
    latency: LatencySamples,
    latency_ms_last: f64,
    latency_ms_max: f64,
    stage_stats: Vec<(String, String)>,
}

/// Samples kept for the receive-to-publish percentiles (a sliding window, restarted when full).
const LATENCY_WINDOW: usize = 4096;

impl NodeStats {
    fn detail(&self) -> std::sync::MutexGuard<'_, StatsDetail> {
        self.detail.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Frame {
    cdr: Vec<u8>,
    /// When the executor callback got the bytes.
    received: Instant,
}

/// Builds the /diagnostics key/values: the node's counters, then the stage's stats.
fn diagnostic_values(stats: &NodeStats, queue: &LatestQueue<Frame>, input_qos: &str) -> Vec<(String, String)> {
    let processed = stats.processed.load(Ordering::Relaxed);
    let d = stats.detail();
    let mut kv: Vec<(String, String)> = vec![
        ("received".into(), queue.pushed().to_string()),
        ("processed".into(), processed.to_string()),
        ("dropped_queue_full".into(), queue.dropped().to_string()),
        ("queue_waiting".into(), queue.len().to_string()),
        ("queue_size".into(), queue.capacity().to_string()),
        ("malformed".into(), stats.malformed.load(Ordering::Relaxed).to_string()),
    ];
    for (k, n) in &d.malformed_by_kind {
        kv.push((format!("malformed.{k}"), n.to_string()));
    }
    kv.extend([
        ("last_malformed".into(), d.last_malformed.clone()),
        ("stage_errors".into(), stats.stage_errors.load(Ordering::Relaxed).to_string()),
        ("last_stage_error".into(), d.last_stage_error.clone()),
        ("published".into(), stats.published.load(Ordering::Relaxed).to_string()),
        ("publish_errors".into(), stats.publish_errors.load(Ordering::Relaxed).to_string()),
        ("points_in".into(), stats.points_in.load(Ordering::Relaxed).to_string()),
        ("process_ms_last".into(), format!("{:.3}", d.process_ms_last)),
        (
            "process_ms_mean".into(),
            format!("{:.3}", if processed > 0 { d.process_ms_sum / processed as f64 } else { 0.0 }),
        ),
        ("process_ms_max".into(), format!("{:.3}", d.process_ms_max)),
        ("input_qos".into(), input_qos.to_string()),
    ]);
    // The node's own latency, reported like a pipeline stage: callback received the bytes -> last
    // output published.
    kv.push(("receive_to_publish_last_ms".into(), format!("{:.3}", d.latency_ms_last)));
    for (label, q) in [("p50", 0.5), ("p99", 0.99)] {
        if let Some(v) = d.latency.percentile(q) {
            kv.push((format!("receive_to_publish_{label}_ms"), format!("{v:.3}")));
        }
    }
    kv.push(("receive_to_publish_max_ms".into(), format!("{:.3}", d.latency_ms_max)));
    kv.extend(d.stage_stats.iter().cloned());
    kv
}

fn qos(reliable: bool, depth: i64) -> QosProfile {
    let mut q = if reliable { QosProfile::default() } else { QosProfile::sensor_data() };
    q.depth = depth.max(1) as usize;
    q
}

/// The node's declared parameters (common ones, then the stage's), one per line, tab-separated:
/// `name, type, default, range, read_only|-, description`; with `markdown` a Markdown table.
pub fn list_params<S: Stage>(stage: &S, markdown: bool) -> String {
    let mut specs = common_params();
    specs.extend(stage.params());
    let table = ParamTable::new(specs);
    let mut out = String::new();
    if markdown {
        out.push_str("| parameter | type | default | range | description |\n|---|---|---|---|---|\n");
    }
    for s in table.specs() {
        let range = s.range.map_or("-".to_string(), |(lo, hi)| format!("[{lo}, {hi}]"));
        let default = match &s.default {
            ParamValue::Str(v) => format!("{v:?}"),
            v => v.to_string(),
        };
        if markdown {
            let ro = if s.read_only { " Read-only at run time." } else { "" };
            out.push_str(&format!(
                "| `{}` | {} | `{default}` | {range} | {}{ro} |\n",
                s.name,
                s.default.type_name(),
                s.description.replace('|', "\\|")
            ));
        } else {
            let ro = if s.read_only { "read_only" } else { "-" };
            out.push_str(&format!(
                "{}\t{}\t{default}\t{range}\t{ro}\t{}\n",
                s.name,
                s.default.type_name(),
                s.description
            ));
        }
    }
    out
}

/// `main` of a node executable: [`run_node`], and on error one line on stderr with the whole
/// cause chain (`<node>: error: parameter 'backend' = 'cuda': CUDA driver library not found ...`)
/// and exit status 1.
pub fn node_main<S: Stage>(stage: S) -> std::process::ExitCode {
    crate::pipeline::keep_frame_buffers_mapped();
    let name = stage.name().to_string();
    match run_node(stage) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs `stage` as a ROS 2 node until Ctrl-C or SIGTERM. ROS arguments (`--ros-args -p name:=value
/// -r points:=/sensor/points -r __node:=name --params-file f.yaml`) are read from the command line.
/// Subscribes to `points` (PointCloud2, raw CDR); publishes the stage's outputs and /diagnostics.
///
/// `--list-params` (before `--ros-args`) prints the declared parameters and exits
/// (`--list-params=markdown`: a Markdown table); no ROS context is created.
pub fn run_node<S: Stage>(stage: S) -> anyhow::Result<()> {
    for a in std::env::args().skip(1) {
        if a == "--ros-args" {
            break;
        }
        if a == "--list-params" || a == "--list-params=markdown" {
            print!("{}", list_params(&stage, a.ends_with("markdown")));
            return Ok(());
        }
    }
    let dds_profile = use_large_cloud_dds_profile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ros-exec")
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let result = rt.block_on(run_async(stage, dds_profile));
    rt.shutdown_timeout(Duration::from_millis(500));
    result
}

/// What the diagnostics task knows about the node's links, refreshed every period.
#[derive(Default)]
struct LinkState {
    /// Problems found this period, each one sentence (QoS mismatch, silent input, lost clouds).
    problems: Vec<String>,
    /// Which kinds of problem (`LINK_*` bits): a kind not in the last logged set is logged at
    /// once, the rest at most once per `malformed_log_period`.
    kinds: u8,
    input_publishers: Vec<String>,
    output_mismatches: u64,
}

const LINK_INPUT_QOS: u8 = 1;
const LINK_OUTPUT_QOS: u8 = 2;
const LINK_SILENT: u8 = 4;
const LINK_LOST: u8 = 8;
const LINK_GRAPH: u8 = 16;

/// What the spin thread last read from the graph.
#[derive(Clone)]
struct GraphView {
    input_publishers: Result<Vec<(String, QosProfile)>, String>,
    output_subscriptions: Vec<(String, Vec<(String, QosProfile)>)>,
}

impl Default for GraphView {
    fn default() -> Self {
        Self { input_publishers: Ok(Vec::new()), output_subscriptions: Vec::new() }
    }
}

/// Fast DDS reads its XML profile once, when the first participant is created: point it at the
/// package's large-cloud profile unless the user chose one. The installed copy is used where the
/// executable sits in a colcon install; otherwise the embedded copy is written to the temp folder.
fn use_large_cloud_dds_profile() -> Option<String> {
    // Fast DDS 2.x (Humble, Jazzy) reads the FASTRTPS_ name, 3.x the FASTDDS_ one.
    const VARS: [&str; 2] = ["FASTRTPS_DEFAULT_PROFILES_FILE", "FASTDDS_DEFAULT_PROFILES_FILE"];
    const FILE: &str = "fastdds_large_clouds.xml";
    const XML: &str = include_str!("../../config/fastdds_large_clouds.xml");
    if VARS.iter().any(|v| std::env::var_os(v).is_some()) {
        return None;
    }
    if std::env::var("RMW_IMPLEMENTATION").is_ok_and(|r| !r.is_empty() && r != "rmw_fastrtps_cpp") {
        return None;
    }
    let installed = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("../../share/lidar_kernels/config").join(FILE)))
        .filter(|p| p.is_file());
    let path = installed.or_else(|| {
        let p = std::env::temp_dir().join(format!("lidar_kernels_{}_{FILE}", env!("CARGO_PKG_VERSION")));
        let current = std::fs::read_to_string(&p).is_ok_and(|t| t == XML);
        (current || std::fs::write(&p, XML).is_ok()).then_some(p)
    })?;
    // Before any thread exists (`run_node` calls this before it builds the runtime).
    for v in VARS {
        std::env::set_var(v, &path);
    }
    Some(path.display().to_string())
}

async fn run_async<S: Stage>(mut stage: S, dds_profile: Option<String>) -> anyhow::Result<()> {
    let mut stop = StopSignals::register()?;
    let ctx = r2r::Context::create().map_err(|e| anyhow!("rcl init failed: {e} (is HOME or ROS_LOG_DIR set?)"))?;
    let mut node =
        r2r::Node::create(ctx, stage.name(), "").map_err(|e| anyhow!("creating node '{}': {e}", stage.name()))?;
    let logger = node.logger().to_string();
    let node_name = node.name().unwrap_or_else(|_| stage.name().to_string());
    let namespace = node.namespace().unwrap_or_else(|_| "/".into());
    let fqn = node.fully_qualified_name().unwrap_or_else(|_| stage.name().to_string());
    match &dds_profile {
        Some(p) => r2r::log_info!(&logger, "Fast DDS profile: {p} (set FASTRTPS_DEFAULT_PROFILES_FILE to use another)"),
        None => r2r::log_info!(
            &logger,
            "DDS profile: the environment's (FASTRTPS_/FASTDDS_DEFAULT_PROFILES_FILE or RMW_IMPLEMENTATION set)"
        ),
    }

    // Parameters: common ones, then the stage's; command-line / params-file values checked here.
    let mut specs = common_params();
    specs.extend(stage.params());
    let table = Arc::new(Mutex::new(ParamTable::new(specs)));
    table.lock().unwrap().apply_overrides(&node.params.lock().unwrap_or_else(|e| e.into_inner()))?;
    let undeclared = table.lock().unwrap().undeclared().to_vec();
    if !undeclared.is_empty() {
        r2r::log_warn!(&logger, "parameters given but not declared by this node (ignored): {}", undeclared.join(", "));
    }
    let params: Params = table.lock().unwrap().snapshot();
    stage.configure(&params).context("configuration refused")?;
    {
        let mut t = table.lock().unwrap();
        for (name, value) in stage.effective_params() {
            t.set_effective(&name, value);
        }
        t.set_validator(stage.validator());
    }
    let params: Params = table.lock().unwrap().snapshot();
    let param_services = params::serve(&mut node, table.clone(), logger.clone())?;
    if params.bool("use_sim_time").unwrap_or(false) {
        let ts = node.get_time_source();
        ts.enable_sim_time(&mut node).map_err(|e| anyhow!("use_sim_time: {e}"))?;
    }

    let reliable = params.bool("reliable").unwrap_or(false);
    let depth = params.int("qos_depth").unwrap_or(5);
    let in_qos = qos(reliable, depth);
    let input_qos = describe_qos(&in_qos);
    let input_topic = stage.input_topic().to_string();
    let args: Vec<String> = std::env::args().collect();
    let input_resolved = resolve_topic(&input_topic, &args, &node_name, &namespace);
    let sub = node
        .subscribe_raw(&input_topic, POINTCLOUD2_TYPE, in_qos.clone())
        .map_err(|e| anyhow!("subscribing to '{input_topic}': {e}"))?;

    let out_qos = qos(params.bool("output_reliable").unwrap_or(true), params.int("output_depth").unwrap_or(10));
    let mut publishers = HashMap::new();
    let mut output_resolved = Vec::new();
    let mut unavailable = HashSet::new();
    for o in stage.outputs() {
        let p = match node.create_publisher_untyped(&o.topic, &o.type_name, out_qos.clone()) {
            Ok(p) => p,
            Err(e) if o.optional => {
                r2r::log_info!(
                    &logger,
                    "not publishing '{}': no {} in this ROS environment ({e})",
                    o.topic,
                    o.type_name
                );
                unavailable.insert(o.topic.clone());
                continue;
            }
            Err(e) => bail!("publisher '{}' ({}): {e}", o.topic, o.type_name),
        };
        output_resolved.push(resolve_topic(&o.topic, &args, &node_name, &namespace));
        publishers.insert(o.topic.clone(), p);
    }
    let diag_pub = node
        .create_publisher::<r2r::diagnostic_msgs::msg::DiagnosticArray>("/diagnostics", QosProfile::default())
        .map_err(|e| anyhow!("/diagnostics publisher: {e}"))?;
    let ros_clock = node.get_ros_clock();
    r2r::log_info!(
        &logger,
        "{fqn}: input '{input_resolved}' ({input_qos}), outputs {:?} ({}), queue_size {}",
        output_resolved,
        describe_qos(&out_qos),
        params.int("queue_size").unwrap_or(1)
    );

    let shutdown = Arc::new(AtomicBool::new(false));
    // Closed at shutdown before the node (and its publishers) is dropped: a frame that ends after
    // that is abandoned, not published on a dead publisher.
    let outputs_open = Arc::new(Mutex::new(true));
    let queue = Arc::new(LatestQueue::<Frame>::new(params.int("queue_size").unwrap_or(1) as usize));
    let stats = Arc::new(NodeStats::default());
    let gaps = Arc::new(Mutex::new(StampGaps::default()));
    let last_received = Arc::new(Mutex::new(None::<Instant>));

    // Spin thread: the only place that touches the node from now on. Between spins, once a
    // second, it reads from the graph the input's publishers and the outputs' subscriptions.
    let graph = Arc::new(Mutex::new(GraphView::default()));
    let spin = {
        let (shutdown, graph, input, outputs) =
            (shutdown.clone(), graph.clone(), input_resolved.clone(), output_resolved.clone());
        let probe = GraphProbe::new(&format!("{node_name}_graph"));
        if let Err(e) = &probe {
            r2r::log_warn!(&logger, "graph probe unavailable, output QoS mismatches will not be reported: {e}");
        }
        std::thread::Builder::new().name("ros-spin".into()).spawn(move || {
            let probe = probe.ok();
            let mut queried: Option<Instant> = None;
            while !shutdown.load(Ordering::Relaxed) {
                node.spin_once(Duration::from_millis(20));
                if queried.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                    continue;
                }
                let endpoint = |ns: &str, name: &str| format!("{}/{name}", ns.trim_end_matches('/'));
                let view = GraphView {
                    input_publishers: node
                        .get_publishers_info_by_topic(&input, false)
                        .map(|v| {
                            v.into_iter().map(|p| (endpoint(&p.node_namespace, &p.node_name), p.qos_profile)).collect()
                        })
                        .map_err(|e| e.to_string()),
                    output_subscriptions: probe.as_ref().map_or_else(Vec::new, |probe| {
                        outputs.iter().map(|t| (t.clone(), probe.subscriptions(t).unwrap_or_default())).collect()
                    }),
                };
                *graph.lock().unwrap_or_else(|e| e.into_inner()) = view;
                queried = Some(Instant::now());
            }
            node
        })?
    };

    tokio::spawn(param_services);

    // Executor side of the queue: the stamp for the loss count, then the bytes in.
    {
        let (queue, gaps, last_received) = (queue.clone(), gaps.clone(), last_received.clone());
        tokio::spawn(sub.for_each(move |cdr| {
            let now = Instant::now();
            if let Some(ns) = cdr_stamp_ns(&cdr) {
                gaps.lock().unwrap_or_else(|e| e.into_inner()).observe(ns);
            }
            *last_received.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
            queue.push(Frame { cdr, received: now });
            futures::future::ready(())
        }));
    }

    // Processing thread.
    let worker = {
        let (queue, stats, table, logger) = (queue.clone(), stats.clone(), table.clone(), logger.clone());
        let outputs = (publishers, unavailable, outputs_open.clone());
        std::thread::Builder::new()
            .name("lk-process".into())
            .spawn(move || process_loop(stage, queue, stats, table, outputs, logger, params))?
    };

    // Diagnostics, with the QoS checks against what the spin thread read from the graph.
    let diagnostics = {
        let (queue, stats, fqn, logger) = (queue.clone(), stats.clone(), fqn.clone(), logger.clone());
        let snapshot = table.lock().unwrap().snapshot();
        let period = Duration::from_secs_f64(snapshot.double("diagnostics_period").unwrap_or(1.0));
        let mut problem_log =
            RateLimiter::new(Duration::from_secs_f64(snapshot.double("malformed_log_period").unwrap_or(5.0)));
        let name = format!("{fqn}: lidar_kernels");
        let table = table.clone();
        tokio::spawn(async move {
            use r2r::diagnostic_msgs::msg::{DiagnosticArray, DiagnosticStatus, KeyValue};
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let (mut last_malformed, mut last_errors, mut last_lost, mut last_gpu_faults) = (0u64, 0u64, 0u64, 0u64);
            let mut logged_kinds = 0u8;
            let started = Instant::now();
            loop {
                tick.tick().await;
                let input_timeout =
                    table.lock().map(|t| t.snapshot().double("input_timeout").unwrap_or(3.0)).unwrap_or(3.0);
                let mut link = LinkState::default();
                let view = graph.lock().unwrap_or_else(|e| e.into_inner()).clone();
                match &view.input_publishers {
                    Ok(pubs) => {
                        for (node, q) in pubs {
                            let who = format!("{node} ({})", describe_qos(q));
                            if let Some(why) = incompatibility(&in_qos, q) {
                                link.kinds |= LINK_INPUT_QOS;
                                link.problems.push(format!(
                                    "QoS mismatch on input '{input_resolved}': {why} ({who}); no cloud can arrive"
                                ));
                            }
                            link.input_publishers.push(who);
                        }
                    }
                    Err(e) => {
                        link.kinds |= LINK_GRAPH;
                        link.problems.push(format!("graph query for '{input_resolved}' failed: {e}"));
                    }
                }
                for (topic, subs) in &view.output_subscriptions {
                    for (node, q) in subs {
                        if let Some(why) = incompatibility(q, &out_qos) {
                            link.output_mismatches += 1;
                            link.kinds |= LINK_OUTPUT_QOS;
                            link.problems.push(format!(
                                "QoS mismatch on output '{topic}': {why} ({node} asks {}, this node offers {})",
                                describe_qos(q),
                                describe_qos(&out_qos)
                            ));
                        }
                    }
                }
                let since = last_received.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or(started).elapsed();
                if !link.input_publishers.is_empty() && since.as_secs_f64() > input_timeout {
                    link.kinds |= LINK_SILENT;
                    link.problems.push(format!(
                        "no cloud on '{input_resolved}' for {:.1} s while it has {} publisher(s): {}",
                        since.as_secs_f64(),
                        link.input_publishers.len(),
                        link.input_publishers.join("; ")
                    ));
                }
                let (lost, gap_kv) = {
                    let g = gaps.lock().unwrap_or_else(|e| e.into_inner());
                    let period = g.period_ns().map_or("-".to_string(), |p| format!("{:.3}", p as f64 / 1e6));
                    (
                        g.lost,
                        vec![
                            ("input_lost".to_string(), g.lost.to_string()),
                            ("input_gaps".to_string(), g.gaps.to_string()),
                            ("input_period_ms".to_string(), period),
                        ],
                    )
                };
                if lost > last_lost {
                    link.kinds |= LINK_LOST;
                    link.problems.push(format!(
                        "{} clouds lost before the node in the last period (gaps in the header stamps on '{input_resolved}', {} in all)",
                        lost - last_lost, lost
                    ));
                }
                let malformed = stats.malformed.load(Ordering::Relaxed);
                let errors = stats.stage_errors.load(Ordering::Relaxed) + stats.publish_errors.load(Ordering::Relaxed);
                let mut level = if link.problems.is_empty() { 0u8 } else { 1u8 };
                let mut message = link.problems.clone();
                if malformed > last_malformed {
                    level = level.max(1);
                    message.push(format!("{} malformed clouds in the last period", malformed - last_malformed));
                }
                if errors > last_errors {
                    level = 2;
                    let last = stats.detail().last_stage_error.clone();
                    message.insert(0, format!("{} clouds failed in the last period: {last}", errors - last_errors));
                }
                // The engine's recovery (pipeline::engine): faults cost no frame, a lost GPU costs speed.
                let (gpu_faults, gpu_lost) = {
                    let d = stats.detail();
                    let value = |key: &str| d.stage_stats.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
                    (
                        value("gpu_faults").and_then(|v| v.parse().ok()).unwrap_or(0u64),
                        value("gpu_lost").as_deref() == Some("true"),
                    )
                };
                if gpu_lost {
                    level = 2;
                    message.insert(0, "CUDA lost to a sticky GPU fault: clouds run on the CPU backend; restart the node to get the GPU back".into());
                } else if gpu_faults > last_gpu_faults {
                    level = level.max(1);
                    message.push(format!(
                        "{} GPU faults in the last period (those clouds ran on the CPU; the CUDA context is rebuilt)",
                        gpu_faults - last_gpu_faults
                    ));
                }
                if !link.problems.is_empty() {
                    let fresh = link.kinds & !logged_kinds != 0;
                    let held = problem_log.check(Instant::now());
                    if fresh || held.is_some() {
                        let more = match held {
                            Some(n) if n > 0 => format!(" ({n} more reports since the last line)"),
                            _ => String::new(),
                        };
                        r2r::log_warn!(&logger, "{}{more}", link.problems.join("; "));
                    }
                }
                logged_kinds = link.kinds;
                (last_malformed, last_errors, last_lost, last_gpu_faults) = (malformed, errors, lost, gpu_faults);
                let message = if message.is_empty() { "ok".to_string() } else { message.join("; ") };
                let now = ros_clock.lock().map(|mut c| c.get_now().unwrap_or_default()).unwrap_or_default();
                let mut kv = diagnostic_values(&stats, &queue, &input_qos);
                kv.extend(gap_kv);
                kv.push(("input_topic".into(), input_resolved.clone()));
                kv.push(("input_publishers".into(), link.input_publishers.join("; ")));
                kv.push(("seconds_since_last_cloud".into(), format!("{:.1}", since.as_secs_f64())));
                kv.push(("output_qos".into(), describe_qos(&out_qos)));
                kv.push(("output_qos_mismatches".into(), link.output_mismatches.to_string()));
                let values = kv.into_iter().map(|(key, value)| KeyValue { key, value }).collect();
                let msg = DiagnosticArray {
                    header: r2r::std_msgs::msg::Header {
                        stamp: r2r::Clock::to_builtin_time(&now),
                        frame_id: String::new(),
                    },
                    status: vec![DiagnosticStatus {
                        level,
                        name: name.clone(),
                        message,
                        hardware_id: "lidar_kernels".into(),
                        values,
                    }],
                };
                let _ = diag_pub.publish(&msg);
            }
        })
    };

    stop.wait().await;
    r2r::log_info!(&logger, "shutting down");
    shutdown.store(true, Ordering::Relaxed);
    queue.close();
    diagnostics.abort();
    let _ = diagnostics.await;
    // The frame in progress gets a short grace; a longer one (a multi-second CPU frame) is
    // abandoned: the process exits without it, and the OS and the CUDA driver take back its memory.
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    while !worker.is_finished() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Waits for a frame being published to finish publishing; a later one publishes nothing.
    *outputs_open.lock().unwrap_or_else(|e| e.into_inner()) = false;
    let abandoned = !worker.is_finished();
    let node = spin.join().map_err(|_| anyhow!("the spin thread panicked"))?;
    let processed = stats.processed.load(Ordering::Relaxed);
    r2r::log_info!(
        &logger,
        "stopped: {} received, {processed} processed, {} dropped (queue full), {} malformed{}",
        queue.pushed(),
        queue.dropped(),
        stats.malformed.load(Ordering::Relaxed),
        if abandoned { ", the frame in progress abandoned" } else { "" }
    );
    if abandoned {
        // Leave the DDS graph cleanly, then exit without waiting for (or unwinding) the worker.
        drop(node);
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: _exit ends the process at once; nothing after it runs.
        unsafe { libc::_exit(0) };
    }
    let _ = worker.join();
    drop(node);
    Ok(())
}

/// How long a stop waits for the frame in progress before abandoning it.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(300);

/// SIGINT and SIGTERM, registered before anything else so that a signal arriving during start-up
/// (a launch file stopping the node at once) is kept and acted on, not lost.
struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn register() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("SIGTERM handler")?,
        })
    }

    async fn wait(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

fn process_loop<S: Stage>(
    mut stage: S,
    queue: Arc<LatestQueue<Frame>>,
    stats: Arc<NodeStats>,
    table: Arc<Mutex<ParamTable>>,
    (publishers, unavailable, outputs_open): (
        HashMap<String, r2r::PublisherUntyped>,
        HashSet<String>,
        Arc<Mutex<bool>>,
    ),
    logger: String,
    mut params: Params,
) {
    let log_period = |p: &Params| Duration::from_secs_f64(p.double("malformed_log_period").unwrap_or(5.0));
    let mut malformed_log = RateLimiter::new(log_period(&params));
    let mut error_log = RateLimiter::new(log_period(&params));
    // The stage's key/values (backend, configuration) are in /diagnostics before the first cloud.
    stats.detail().stage_stats = stage.stats();
    loop {
        let frame = match queue.pop_timeout(Duration::from_millis(100)) {
            Pop::Item(f) => Some(f),
            Pop::TimedOut => None,
            Pop::Closed => break,
        };

        // Parameter changes are applied between clouds, on this thread.
        let generation = table.lock().unwrap_or_else(|e| e.into_inner()).generation();
        if generation != params.generation {
            let new = table.lock().unwrap_or_else(|e| e.into_inner()).snapshot();
            queue.set_capacity(new.int("queue_size").unwrap_or(1) as usize);
            malformed_log = RateLimiter::new(log_period(&new));
            error_log = RateLimiter::new(log_period(&new));
            if let Err(e) = stage.configure(&new) {
                r2r::log_error!(
                    &logger,
                    "new parameters rejected by the stage, keeping the previous configuration: {e:#}"
                );
            }
            stats.detail().stage_stats = stage.stats();
            params = new;
        }

        let Some(frame) = frame else { continue };
        let view = match CloudView::decode(&frame.cdr) {
            Ok(v) => v,
            Err(e) => {
                stats.malformed.fetch_add(1, Ordering::Relaxed);
                let text = e.to_string();
                {
                    let mut d = stats.detail();
                    *d.malformed_by_kind.entry(error_kind(&e)).or_default() += 1;
                    d.last_malformed = text.clone();
                }
                if let Some(held) = malformed_log.check(Instant::now()) {
                    r2r::log_warn!(
                        &logger,
                        "malformed PointCloud2 ({} bytes) skipped: {text}{}",
                        frame.cdr.len(),
                        if held > 0 { format!(" ({held} more since the last report)") } else { String::new() }
                    );
                }
                continue;
            }
        };

        let t0 = Instant::now();
        let input = Input { cdr: &frame.cdr, view: &view };
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| stage.process(&input)));
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        stats.processed.fetch_add(1, Ordering::Relaxed);
        stats.points_in.fetch_add(view.msg.num_points(), Ordering::Relaxed);
        let mut latency_ms = None;
        let error = match result {
            Ok(Ok(outputs)) => {
                let open = outputs_open.lock().unwrap_or_else(|e| e.into_inner());
                if !*open {
                    break;
                }
                let any = !outputs.is_empty();
                for (topic, cdr) in outputs {
                    match publishers.get(&topic) {
                        Some(p) => match p.publish_raw(&cdr) {
                            Ok(()) => {
                                stats.published.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => {
                                stats.publish_errors.fetch_add(1, Ordering::Relaxed);
                                if error_log.check(Instant::now()).is_some() {
                                    r2r::log_error!(&logger, "publishing on '{topic}' failed: {e}");
                                }
                            }
                        },
                        // Said once at start: this ROS environment lacks the topic's type.
                        None if unavailable.contains(&topic) => {}
                        None => {
                            stats.publish_errors.fetch_add(1, Ordering::Relaxed);
                            if error_log.check(Instant::now()).is_some() {
                                r2r::log_error!(&logger, "stage output for undeclared topic '{topic}' dropped");
                            }
                        }
                    }
                }
                if any {
                    latency_ms = Some(frame.received.elapsed().as_secs_f64() * 1e3);
                }
                None
            }
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(panic) => Some(format!(
                "stage panicked: {}",
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default()
            )),
        };
        let stage_stats = stage.stats();
        {
            let mut d = stats.detail();
            d.process_ms_last = ms;
            d.process_ms_max = d.process_ms_max.max(ms);
            d.process_ms_sum += ms;
            d.stage_stats = stage_stats;
            if let Some(l) = latency_ms {
                if d.latency.len() >= LATENCY_WINDOW {
                    d.latency = LatencySamples::default();
                }
                d.latency.push(Duration::from_secs_f64(l / 1e3));
                d.latency_ms_last = l;
                d.latency_ms_max = d.latency_ms_max.max(l);
            }
            if let Some(e) = &error {
                d.last_stage_error = e.clone();
            }
        }
        if let Some(e) = error {
            stats.stage_errors.fetch_add(1, Ordering::Relaxed);
            if let Some(held) = error_log.check(Instant::now()) {
                r2r::log_error!(
                    &logger,
                    "stage error: {e}{}",
                    if held > 0 { format!(" ({held} more since the last report)") } else { String::new() }
                );
            }
        }
    }
}
