//! ROS 2 nodes (feature `ros`, through r2r): the plumbing that turns a [`Stage`] into a node.
//!
//! A node is a stage function, `(validated PointCloud2) -> Vec<(topic, CDR bytes)>`, plus stats:
//! - input: a raw (CDR) PointCloud2 subscription on `points`, sensor-data QoS (best effort, keep
//!   last 5) unless `reliable:=true`; decoded without copying the point blob; Fast DDS given the
//!   package's large-cloud profile unless the environment names one;
//! - a bounded latest-wins queue: when clouds arrive faster than processed, the oldest waiting is
//!   dropped and counted; processing runs on its own thread, never on the executor;
//! - outputs: raw publishers (`publish_raw` of CDR the stage encodes, e.g. `PointCloud2::to_cdr`);
//! - /diagnostics (diagnostic_msgs/DiagnosticArray) every second: the node's counters (received,
//!   processed, dropped, malformed by kind, errors, timings) and the stage's key/values;
//! - declared parameters with descriptions, ranges and read-only flags, served by [`params`]
//!   (every set validated by the stage first), `use_sim_time`;
//! - the links watched ([`link`]): clouds lost before the node (header-stamp gaps), QoS mismatches
//!   on the input and the outputs, a silent input that has a publisher: WARN in /diagnostics;
//! - malformed clouds (bad CDR, missing x/y/z, a field past point_step, data shorter than the
//!   points) are counted and logged at most once per `malformed_log_period`; the node goes on;
//! - Ctrl-C / SIGTERM: stop within 0.3 s; a frame still running then is abandoned.
//!
//! The five executables (`src/bin/`) run [`PipelineStage`] with a [`NodeKind`]: the library
//! pipeline with the stages of that node, its configuration keys declared as dotted parameters.

mod graph;
pub mod link;
mod node;
mod params;
pub mod pipeline_stage;
pub mod queue;
pub mod ratelimit;
pub mod stage;

pub use crate::cloud::validate as validate_cloud;
pub use node::{common_params, list_params, node_main, run_node, NodeStats};
pub use params::ParamTable;
pub use pipeline_stage::{NodeKind, PipelineStage};
pub use stage::{error_kind, Input, Output, OutputSpec, ParamSpec, ParamValue, Params, Stage, Validator};
