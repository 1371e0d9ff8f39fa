//! ROS 2 nodes (feature `ros`, through r2r): the plumbing that turns a [`Stage`] into a node.
//!
//! A node is a stage function, `(validated PointCloud2) -> Vec<(topic, CDR bytes)>`, plus stats:
//! - input: a raw (CDR) PointCloud2 subscription on `points`, sensor-data QoS (best effort, keep
//!   last 1) unless `reliable:=true`; decoded without copying the point blob;
//! - a bounded latest-wins queue: when clouds arrive faster than processed, the oldest waiting is
//!   dropped and counted; processing runs on its own thread, never on the executor;
//! - outputs: raw publishers (`publish_raw` of CDR the stage encodes, e.g. `PointCloud2::to_cdr`);
//! - /diagnostics (diagnostic_msgs/DiagnosticArray) every second: the node's counters (received,
//!   processed, dropped, malformed by kind, errors, timings) and the stage's key/values;
//! - declared parameters with descriptions and ranges (r2r's parameter services), `use_sim_time`;
//! - malformed clouds (bad CDR, missing x/y/z, a field past point_step, data shorter than the
//!   points) are counted and logged at most once per `malformed_log_period`; the node goes on;
//! - Ctrl-C / SIGTERM: the processing thread finishes its cloud, the node stops cleanly.
//!
//! The five executables (`src/bin/`) run [`PipelineStage`] with a [`NodeKind`]: the library
//! pipeline with the stages of that node, its configuration keys declared as dotted parameters.

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
