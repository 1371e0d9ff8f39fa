//! The ROS parameter conversion (feature `ros`): arbitrary parameter values, as `--ros-args -p` /
//! params files (r2r values) give them at start and as `set_parameters` /
//! `set_parameters_atomically` (rcl_interfaces messages, any `type` byte) give them at run time,
//! through the node's own code path without a running node: `ParamTable` (type, range, read-only
//! checks, the stage's validator) -> `PipelineStage::configure` -> the pipeline configuration.
//!
//! The property: a set the parameter services accept is never refused by the stage when the node
//! applies it before the next cloud (the node would then run a configuration other than the one
//! `get_parameters` reports), and every value in effect is a valid value of its parameter.

use arbitrary::Arbitrary;
use lidar_kernels::ros::{common_params, NodeKind, ParamTable, PipelineStage, Stage};
use r2r::indexmap::IndexMap;
use r2r::rcl_interfaces::msg::ParameterValue as ParameterValueMsg;

/// A value of any rcl_interfaces type (also the unsupported ones: byte and bool arrays, NOT_SET).
#[derive(Arbitrary, Debug, Clone)]
pub enum Value {
    NotSet,
    Bool(bool),
    Int(i64),
    Double(f64),
    Str(String),
    BoolArray(Vec<bool>),
    ByteArray(Vec<u8>),
    IntArray(Vec<i64>),
    DoubleArray(Vec<f64>),
    StrArray(Vec<String>),
    /// A message whose `type` byte is out of range (a foreign or buggy client).
    BadType(u8),
}

/// A parameter name: one the node declares (by index), or any string.
#[derive(Arbitrary, Debug, Clone)]
pub enum Name {
    Declared(u8),
    Other(String),
}

#[derive(Arbitrary, Debug, Clone)]
pub enum Request {
    Set(Vec<(Name, Value)>),
    SetAtomically(Vec<(Name, Value)>),
}

#[derive(Arbitrary, Debug)]
pub struct Input {
    /// Which of the five executables (`NodeKind::ALL`).
    pub node: u8,
    /// `--ros-args -p` / params-file values at start.
    pub start: Vec<(Name, Value)>,
    /// Parameter service calls afterwards, each applied before the next cloud.
    pub requests: Vec<Request>,
}

/// The message form `set_parameters` receives.
fn to_msg(v: &Value) -> ParameterValueMsg {
    let mut m = ParameterValueMsg::default();
    match v.clone() {
        Value::NotSet => m.type_ = 0,
        Value::Bool(b) => (m.type_, m.bool_value) = (1, b),
        Value::Int(i) => (m.type_, m.integer_value) = (2, i),
        Value::Double(d) => (m.type_, m.double_value) = (3, d),
        Value::Str(s) => (m.type_, m.string_value) = (4, s),
        Value::ByteArray(a) => (m.type_, m.byte_array_value) = (5, a),
        Value::BoolArray(a) => (m.type_, m.bool_array_value) = (6, a),
        Value::IntArray(a) => (m.type_, m.integer_array_value) = (7, a),
        Value::DoubleArray(a) => (m.type_, m.double_array_value) = (8, a),
        Value::StrArray(a) => (m.type_, m.string_array_value) = (9, a),
        Value::BadType(t) => m.type_ = t.saturating_add(10),
    }
    m
}

/// The r2r form `Node::params` holds after `--ros-args -p`.
fn to_r2r(v: &Value) -> r2r::ParameterValue {
    use r2r::ParameterValue as P;
    match v.clone() {
        Value::NotSet | Value::BadType(_) => P::NotSet,
        Value::Bool(b) => P::Bool(b),
        Value::Int(i) => P::Integer(i),
        Value::Double(d) => P::Double(d),
        Value::Str(s) => P::String(s),
        Value::BoolArray(a) => P::BoolArray(a),
        Value::ByteArray(a) => P::ByteArray(a),
        Value::IntArray(a) => P::IntegerArray(a),
        Value::DoubleArray(a) => P::DoubleArray(a),
        Value::StrArray(a) => P::StringArray(a),
    }
}

/// Parameters that select a backend or read a file: fixed, so that a run stays on the CPU and
/// touches no file (they are read-only, given by the operator, not by a remote client).
const FIXED: [&str; 3] = ["backend", "target", "config_file"];

pub fn ros_param_conversion(input: Input) {
    let kind = NodeKind::ALL[input.node as usize % NodeKind::ALL.len()];
    let mut stage = PipelineStage::new(kind);
    // As run_node: the common parameters, then the stage's.
    let mut specs = common_params();
    specs.extend(stage.params());
    let mut table = ParamTable::new(specs);
    let names: Vec<String> = table.specs().iter().map(|s| s.name.clone()).collect();
    let name = |n: &Name| match n {
        Name::Declared(i) => names[*i as usize % names.len()].clone(),
        Name::Other(s) => s.clone(),
    };

    let mut given: IndexMap<String, r2r::Parameter> = IndexMap::new();
    for (n, v) in &input.start {
        let n = name(n);
        if !FIXED.contains(&n.as_str()) {
            given.insert(n, r2r::Parameter::new(to_r2r(v)));
        }
    }
    given.insert("backend".into(), r2r::Parameter::new(r2r::ParameterValue::String("cpu".into())));
    if table.apply_overrides(&given).is_err() {
        return; // the node refuses to start, naming the parameter
    }
    if stage.configure(&table.snapshot()).is_err() {
        return; // "configuration refused" at start
    }
    for (n, v) in stage.effective_params() {
        table.set_effective(&n, v);
    }
    table.set_validator(stage.validator());
    check_effective(&table, &stage);

    for request in &input.requests {
        let before = table.generation();
        match request {
            Request::Set(changes) => {
                let changes: Vec<_> = changes.iter().map(|(n, v)| (name(n), to_msg(v))).collect();
                let _ = table.set(&changes);
            }
            Request::SetAtomically(changes) => {
                let changes: Vec<_> = changes.iter().map(|(n, v)| (name(n), to_msg(v))).collect();
                let _ = table.set_atomically(&changes);
            }
        }
        if table.generation() != before {
            // What the node does between clouds; the validator accepted these values.
            let params = table.snapshot();
            if let Err(e) = stage.configure(&params) {
                panic!("accepted parameters refused by the stage: {e:#}\nparams: {params:?}");
            }
            check_effective(&table, &stage);
        }
    }
}

/// Every value of the configuration in effect is a valid value of its declared parameter.
fn check_effective(table: &ParamTable, stage: &PipelineStage) {
    for (name, value) in stage.effective_params() {
        let spec = table.specs().iter().find(|s| s.name == name).expect("an effective value has a declared parameter");
        if let Err(e) = spec.check(&value) {
            panic!("value in effect is not a valid parameter value: {e}");
        }
    }
}
