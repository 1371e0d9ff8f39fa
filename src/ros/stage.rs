//! What a node runs: a [`Stage`], free of any ROS type, so that the pipeline can implement it
//! without knowing r2r. The node plumbing ([`super::run_node`]) owns the subscription, the queue,
//! the publishers, the parameters and the diagnostics; a stage sees one validated PointCloud2 at a
//! time on its own thread and returns CDR-encoded messages for its declared output topics.

use std::collections::BTreeMap;

use crate::cloud::{CloudError, CloudView, Header, MessageBytes};

/// A parameter value (the ROS types a stage needs).
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Bool(bool),
    Int(i64),
    Double(f64),
    Str(String),
    DoubleArray(Vec<f64>),
    StringArray(Vec<String>),
}

impl ParamValue {
    pub fn type_name(&self) -> &'static str {
        match self {
            ParamValue::Bool(_) => "bool",
            ParamValue::Int(_) => "integer",
            ParamValue::Double(_) => "double",
            ParamValue::Str(_) => "string",
            ParamValue::DoubleArray(_) => "double array",
            ParamValue::StringArray(_) => "string array",
        }
    }
}

impl std::fmt::Display for ParamValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamValue::Bool(v) => write!(f, "{v}"),
            ParamValue::Int(v) => write!(f, "{v}"),
            ParamValue::Double(v) => write!(f, "{v}"),
            ParamValue::Str(v) => write!(f, "{v:?}"),
            ParamValue::DoubleArray(v) => write!(f, "{v:?}"),
            ParamValue::StringArray(v) => write!(f, "{v:?}"),
        }
    }
}

/// A declared parameter: name, default, description, optional inclusive range (per element for a
/// double array), read-only flag.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub description: String,
    pub default: ParamValue,
    /// Inclusive `[min, max]`, for integer and double parameters.
    pub range: Option<(f64, f64)>,
    /// Settable only at start (`--ros-args -p`, a params file), not at run time.
    pub read_only: bool,
}

impl ParamSpec {
    fn new(name: &str, default: ParamValue, description: &str) -> Self {
        Self { name: name.into(), description: description.into(), default, range: None, read_only: false }
    }
    pub fn bool(name: &str, default: bool, description: &str) -> Self {
        Self::new(name, ParamValue::Bool(default), description)
    }
    pub fn int(name: &str, default: i64, min: i64, max: i64, description: &str) -> Self {
        Self { range: Some((min as f64, max as f64)), ..Self::new(name, ParamValue::Int(default), description) }
    }
    pub fn double(name: &str, default: f64, min: f64, max: f64, description: &str) -> Self {
        Self { range: Some((min, max)), ..Self::new(name, ParamValue::Double(default), description) }
    }
    pub fn string(name: &str, default: &str, description: &str) -> Self {
        Self::new(name, ParamValue::Str(default.into()), description)
    }
    pub fn double_array(name: &str, default: &[f64], range: Option<(f64, f64)>, description: &str) -> Self {
        Self { range, ..Self::new(name, ParamValue::DoubleArray(default.to_vec()), description) }
    }
    pub fn string_array(name: &str, default: &[String], description: &str) -> Self {
        Self::new(name, ParamValue::StringArray(default.to_vec()), description)
    }
    /// Any default value, optional range (integers, doubles, double arrays).
    pub fn with_value(name: &str, default: ParamValue, range: Option<(f64, f64)>, description: &str) -> Self {
        Self { range, ..Self::new(name, default, description) }
    }
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Checks type and range; an integer is accepted for a double parameter. An empty array of
    /// another element type is accepted for an array parameter (YAML `[]` has no element type).
    pub fn check(&self, value: &ParamValue) -> Result<ParamValue, String> {
        let v = match (&self.default, value) {
            (ParamValue::Double(_), ParamValue::Int(i)) => ParamValue::Double(*i as f64),
            (ParamValue::DoubleArray(_), ParamValue::StringArray(a)) if a.is_empty() => ParamValue::DoubleArray(vec![]),
            (ParamValue::StringArray(_), ParamValue::DoubleArray(a)) if a.is_empty() => ParamValue::StringArray(vec![]),
            (d, v) if std::mem::discriminant(d) == std::mem::discriminant(v) => v.clone(),
            (d, v) => {
                return Err(format!("parameter '{}' is a {}, got a {} ({v})", self.name, d.type_name(), v.type_name()))
            }
        };
        if let Some((lo, hi)) = self.range {
            let xs: Vec<f64> = match &v {
                ParamValue::Int(i) => vec![*i as f64],
                ParamValue::Double(d) => vec![*d],
                ParamValue::DoubleArray(a) => a.clone(),
                _ => return Ok(v),
            };
            if xs.iter().any(|&x| !(x >= lo && x <= hi)) {
                let each = if matches!(v, ParamValue::DoubleArray(_)) { " (each element)" } else { "" };
                return Err(format!("parameter '{}' = {v} is outside [{lo}, {hi}]{each}", self.name));
            }
        }
        Ok(v)
    }

    /// The description with the range and read-only flag spelled out (what DescribeParameters shows).
    pub fn full_description(&self) -> String {
        let mut s = self.description.clone();
        if let Some((lo, hi)) = self.range {
            let each = if matches!(self.default, ParamValue::DoubleArray(_)) { " (each element)" } else { "" };
            s.push_str(&format!(" Range [{lo}, {hi}]{each}."));
        }
        if self.read_only {
            s.push_str(" Read-only at run time.");
        }
        s
    }
}

/// A snapshot of the current parameter values. `generation` grows at every accepted change.
/// `explicit` names the parameters given a value (command line, params file, set_parameters), as
/// opposed to those still at their declared default: a stage overlays only these on its own
/// configuration file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Params {
    pub values: BTreeMap<String, ParamValue>,
    pub generation: u64,
    pub explicit: std::collections::BTreeSet<String>,
}

impl Params {
    pub fn get(&self, name: &str) -> Option<&ParamValue> {
        self.values.get(name)
    }
    pub fn bool(&self, name: &str) -> Option<bool> {
        match self.get(name)? {
            ParamValue::Bool(v) => Some(*v),
            _ => None,
        }
    }
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.get(name)? {
            ParamValue::Int(v) => Some(*v),
            _ => None,
        }
    }
    pub fn double(&self, name: &str) -> Option<f64> {
        match self.get(name)? {
            ParamValue::Double(v) => Some(*v),
            ParamValue::Int(v) => Some(*v as f64),
            _ => None,
        }
    }
    pub fn str(&self, name: &str) -> Option<&str> {
        match self.get(name)? {
            ParamValue::Str(v) => Some(v),
            _ => None,
        }
    }
    pub fn is_explicit(&self, name: &str) -> bool {
        self.explicit.contains(name)
    }
}

/// An output topic the stage publishes on. `topic` follows ROS naming (relative names resolve in
/// the node's namespace, `~/x` under the node's name); `type_name` is e.g. `sensor_msgs/msg/PointCloud2`.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputSpec {
    pub topic: String,
    pub type_name: String,
    /// A topic the node runs without (logged once) when the ROS environment lacks its type.
    pub optional: bool,
}

impl OutputSpec {
    pub fn new(topic: &str, type_name: &str) -> Self {
        Self { topic: topic.into(), type_name: type_name.into(), optional: false }
    }
    pub fn optional(topic: &str, type_name: &str) -> Self {
        Self { optional: true, ..Self::new(topic, type_name) }
    }
}

/// One input cloud, already decoded (the point blob borrowed, not copied) and validated: every
/// point lies inside `msg.data`, every field inside `point_step`, x/y/z present.
pub struct Input<'a> {
    /// The message as received (CDR), e.g. to forward it unchanged.
    pub cdr: &'a [u8],
    /// The message decoded and validated (once, by the node).
    pub view: &'a CloudView<'a>,
}

impl Input<'_> {
    pub fn header(&self) -> &Header {
        &self.view.msg.header
    }
}

/// Checks a complete set of parameter values (a candidate change) the way the stage would.
pub type Validator = Box<dyn Fn(&Params) -> anyhow::Result<()> + Send>;

/// A CDR-encoded message for one of the stage's declared output topics (`OutputSpec::topic`): its
/// bytes as the pipeline wrote them (page-locked ones go back to the GPU backend's pool once
/// published).
pub type Output = (String, MessageBytes);

/// A node's processing: (validated PointCloud2) -> messages to publish, plus stats.
///
/// Called on the node's processing thread, never on the ROS executor; a slow `process` makes the
/// latest-wins queue drop the oldest waiting clouds (counted), it never blocks the subscription.
pub trait Stage: Send + 'static {
    /// Default node name (a launch file or `--ros-args -r __node:=` may rename it).
    fn name(&self) -> &str;

    /// The stage's own parameters (the node adds its common ones: see `super::node`).
    fn params(&self) -> Vec<ParamSpec> {
        Vec::new()
    }

    /// The PointCloud2 topic to subscribe to (relative: remap it with `-r points:=/sensor/points`).
    fn input_topic(&self) -> &str {
        "points"
    }

    /// The topics `process` may publish on.
    fn outputs(&self) -> Vec<OutputSpec>;

    /// Called before the first cloud and again, on the processing thread, before the next cloud
    /// after any parameter change. An error keeps the previous configuration (and is logged);
    /// an error at start stops the node.
    fn configure(&mut self, _params: &Params) -> anyhow::Result<()> {
        Ok(())
    }

    /// Processes one cloud. An error is counted and logged (rate-limited); the node goes on.
    fn process(&mut self, input: &Input<'_>) -> anyhow::Result<Vec<Output>>;

    /// Key/values for /diagnostics (read after each `process`, published at 1 Hz).
    fn stats(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// After a successful `configure`: the check every parameter change must pass before it is
    /// accepted (the same code `configure` runs), so that a refused value never reaches the stage
    /// and what get_parameters returns is what runs.
    fn validator(&self) -> Option<Validator> {
        None
    }

    /// After a successful `configure`: parameter values the stage actually uses where they differ
    /// from what it was given (e.g. taken from its configuration file), so that get_parameters
    /// reports the values in effect.
    fn effective_params(&self) -> Vec<(String, ParamValue)> {
        Vec::new()
    }
}

/// A short name for the kind of malformation, used as a /diagnostics key suffix.
pub fn error_kind(e: &CloudError) -> &'static str {
    match e {
        CloudError::Truncated { .. } | CloudError::BadEncapsulation(_) | CloudError::BadString { .. } => "cdr",
        CloudError::MissingField(_) => "missing_field",
        CloudError::DuplicateField { .. } => "duplicate_field",
        CloudError::FieldPastPointStep { .. } => "field_past_point_step",
        CloudError::UnknownDatatype { .. } | CloudError::ZeroCount { .. } | CloudError::TooManyChannels { .. } => {
            "bad_field"
        }
        CloudError::DataTooShort { .. } => "data_too_short",
        CloudError::ZeroPointStep { .. } | CloudError::RowStepTooSmall { .. } | CloudError::Overflow { .. } => {
            "bad_size"
        }
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::validate as validate_cloud;
    use crate::cloud::{Datatype, PointCloud2, PointField};
    use std::borrow::Cow;

    fn msg(fields: Vec<PointField>, point_step: u32, n: u32, data_len: usize) -> PointCloud2<'static> {
        PointCloud2 {
            header: Header::default(),
            height: 1,
            width: n,
            fields,
            is_bigendian: false,
            point_step,
            row_step: point_step * n,
            data: Cow::Owned(vec![0; data_len]),
            is_dense: true,
        }
    }

    fn xyz() -> Vec<PointField> {
        ["x", "y", "z"].iter().enumerate().map(|(i, n)| PointField::new(n, 4 * i as u32, Datatype::Float32)).collect()
    }

    #[test]
    fn validation_catches_the_three_test_malformations() {
        assert!(validate_cloud(&msg(xyz(), 12, 10, 120)).is_ok());
        let e = validate_cloud(&msg(xyz(), 12, 10, 119)).unwrap_err();
        assert_eq!(error_kind(&e), "data_too_short");
        let e = validate_cloud(&msg(xyz(), 8, 10, 80)).unwrap_err();
        assert_eq!(error_kind(&e), "field_past_point_step");
        let e = validate_cloud(&msg(xyz()[1..].to_vec(), 12, 10, 120)).unwrap_err();
        assert_eq!(error_kind(&e), "missing_field");
    }

    #[test]
    fn param_checks() {
        let p = ParamSpec::double("voxel_size", 0.1, 0.01, 10.0, "Edge.");
        assert_eq!(p.check(&ParamValue::Int(1)), Ok(ParamValue::Double(1.0)));
        assert!(p.check(&ParamValue::Double(20.0)).is_err());
        assert!(p.check(&ParamValue::Double(f64::NAN)).is_err());
        assert!(p.check(&ParamValue::Bool(true)).is_err());
        assert!(p.full_description().contains("[0.01, 10]"));
    }
}
