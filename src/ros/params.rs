//! The node's declared parameters and the six rcl_interfaces parameter services over them
//! (list, get, get_types, describe, set, set_atomically), plus `/parameter_events`.
//!
//! Served here rather than by r2r's handler because r2r 0.9.7 answers `set_parameters` before
//! any check of the whole configuration, and its DescribeParameters has no read-only flag or
//! ranges. Here:
//! - every set is checked for type, range and read-only, then the candidate values as a whole go
//!   through the stage's [`Validator`] (the code that builds the pipeline configuration); a
//!   refused set keeps the old value and says why, so get_parameters always returns what runs;
//! - describe_parameters fills `read_only`, `integer_range` / `floating_point_range` (scalars;
//!   arrays carry their per-element range in `additional_constraints`) and the description;
//! - only declared parameters exist: a params-file key the node does not declare is logged once
//!   at start and is not listed.

use std::sync::{Arc, Mutex};

use anyhow::anyhow;
use futures::{FutureExt, StreamExt};
use r2r::indexmap::IndexMap;
use r2r::rcl_interfaces::msg::{
    FloatingPointRange, IntegerRange, ListParametersResult, Parameter as ParameterMsg, ParameterDescriptor,
    ParameterEvent, ParameterType, ParameterValue as ParameterValueMsg, SetParametersResult,
};
use r2r::rcl_interfaces::srv::{
    DescribeParameters, GetParameterTypes, GetParameters, ListParameters, SetParameters, SetParametersAtomically,
};
use r2r::{ParameterValue as R2rValue, QosProfile};

use super::stage::{ParamSpec, ParamValue, Params, Validator};

pub struct ParamTable {
    specs: Vec<ParamSpec>,
    values: Params,
    undeclared: Vec<String>,
    validator: Option<Validator>,
}

fn from_r2r(v: &R2rValue) -> Result<ParamValue, String> {
    Ok(match v {
        R2rValue::Bool(b) => ParamValue::Bool(*b),
        R2rValue::Integer(i) => ParamValue::Int(*i),
        R2rValue::Double(d) => ParamValue::Double(*d),
        R2rValue::String(s) => ParamValue::Str(s.clone()),
        R2rValue::DoubleArray(a) => ParamValue::DoubleArray(a.clone()),
        R2rValue::IntegerArray(a) => ParamValue::DoubleArray(a.iter().map(|&i| i as f64).collect()),
        R2rValue::StringArray(a) => ParamValue::StringArray(a.clone()),
        other => return Err(format!("type {} is not supported here", other.type_name())),
    })
}

/// The message form of a value; `None` (not set) for a message type this package does not use.
fn from_msg(v: &ParameterValueMsg) -> Result<ParamValue, String> {
    Ok(match v.type_ {
        t if t == ParameterType::PARAMETER_BOOL as u8 => ParamValue::Bool(v.bool_value),
        t if t == ParameterType::PARAMETER_INTEGER as u8 => ParamValue::Int(v.integer_value),
        t if t == ParameterType::PARAMETER_DOUBLE as u8 => ParamValue::Double(v.double_value),
        t if t == ParameterType::PARAMETER_STRING as u8 => ParamValue::Str(v.string_value.clone()),
        t if t == ParameterType::PARAMETER_DOUBLE_ARRAY as u8 => ParamValue::DoubleArray(v.double_array_value.clone()),
        t if t == ParameterType::PARAMETER_INTEGER_ARRAY as u8 => {
            ParamValue::DoubleArray(v.integer_array_value.iter().map(|&i| i as f64).collect())
        }
        t if t == ParameterType::PARAMETER_STRING_ARRAY as u8 => ParamValue::StringArray(v.string_array_value.clone()),
        t if t == ParameterType::PARAMETER_NOT_SET as u8 => return Err("parameters cannot be undeclared".into()),
        t => return Err(format!("parameter type {t} is not supported here")),
    })
}

fn type_of(v: &ParamValue) -> u8 {
    match v {
        ParamValue::Bool(_) => ParameterType::PARAMETER_BOOL as u8,
        ParamValue::Int(_) => ParameterType::PARAMETER_INTEGER as u8,
        ParamValue::Double(_) => ParameterType::PARAMETER_DOUBLE as u8,
        ParamValue::Str(_) => ParameterType::PARAMETER_STRING as u8,
        ParamValue::DoubleArray(_) => ParameterType::PARAMETER_DOUBLE_ARRAY as u8,
        ParamValue::StringArray(_) => ParameterType::PARAMETER_STRING_ARRAY as u8,
    }
}

fn to_msg(v: &ParamValue) -> ParameterValueMsg {
    let mut m = ParameterValueMsg { type_: type_of(v), ..Default::default() };
    match v {
        ParamValue::Bool(b) => m.bool_value = *b,
        ParamValue::Int(i) => m.integer_value = *i,
        ParamValue::Double(d) => m.double_value = *d,
        ParamValue::Str(s) => m.string_value = s.clone(),
        ParamValue::DoubleArray(a) => m.double_array_value = a.clone(),
        ParamValue::StringArray(a) => m.string_array_value = a.clone(),
    }
    m
}

impl ParamTable {
    /// Later specs with an already declared name are ignored (the node's common ones come first).
    pub fn new(specs: Vec<ParamSpec>) -> Self {
        let mut unique: Vec<ParamSpec> = Vec::new();
        for s in specs {
            if !unique.iter().any(|u| u.name == s.name) {
                unique.push(s);
            }
        }
        let values = Params {
            values: unique.iter().map(|s| (s.name.clone(), s.default.clone())).collect(),
            generation: 0,
            explicit: Default::default(),
        };
        Self { specs: unique, values, undeclared: Vec::new(), validator: None }
    }

    pub fn snapshot(&self) -> Params {
        self.values.clone()
    }

    pub fn generation(&self) -> u64 {
        self.values.generation
    }

    pub fn specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    /// Names given on the command line or in a params file that this node does not declare.
    pub fn undeclared(&self) -> &[String] {
        &self.undeclared
    }

    /// From now on every change must also pass `validator` (installed after the first configure).
    pub fn set_validator(&mut self, validator: Option<Validator>) {
        self.validator = validator;
    }

    /// Replaces a value by the one in effect (not an explicit setting; `generation` unchanged).
    pub fn set_effective(&mut self, name: &str, value: ParamValue) {
        if let Some(v) = self.values.values.get_mut(name) {
            *v = value;
        }
    }

    /// The values given at start (`--ros-args -p`, params files: r2r's `Node::params`), type-
    /// and range-checked; read-only ones included. Undeclared names are remembered.
    pub fn apply_overrides(&mut self, given: &IndexMap<String, r2r::Parameter>) -> anyhow::Result<()> {
        self.undeclared.clear();
        for (name, p) in given {
            if matches!(p.value, R2rValue::NotSet) {
                continue;
            }
            let Some(spec) = self.specs.iter().find(|s| &s.name == name) else {
                self.undeclared.push(name.clone());
                continue;
            };
            let v = from_r2r(&p.value).and_then(|v| spec.check(&v)).map_err(|e| anyhow!("parameter '{name}': {e}"))?;
            self.values.values.insert(name.clone(), v);
            self.values.explicit.insert(name.clone());
        }
        Ok(())
    }

    /// Type, range and read-only check of one value (not yet the whole configuration).
    fn checked(&self, name: &str, value: &ParameterValueMsg) -> Result<ParamValue, String> {
        let spec =
            self.specs.iter().find(|s| s.name == name).ok_or_else(|| format!("parameter '{name}' is not declared"))?;
        if spec.read_only {
            return Err(format!(
                "parameter '{name}' is read-only at run time (set it with --ros-args -p or a params file)"
            ));
        }
        spec.check(&from_msg(value)?)
    }

    /// `candidate` with `changes` applied passes the validator.
    fn validate(&self, candidate: &Params) -> Result<(), String> {
        match &self.validator {
            Some(v) => v(candidate).map_err(|e| format!("{e:#}")),
            None => Ok(()),
        }
    }

    fn with(&self, base: &Params, changes: &[(String, ParamValue)]) -> Params {
        let mut c = base.clone();
        for (name, v) in changes {
            c.values.insert(name.clone(), v.clone());
            c.explicit.insert(name.clone());
        }
        c
    }

    fn commit(&mut self, candidate: Params) -> bool {
        let changed = candidate.values != self.values.values || candidate.explicit != self.values.explicit;
        if changed {
            let generation = self.values.generation + 1;
            self.values = Params { generation, ..candidate };
        }
        changed
    }

    /// set_parameters: each change checked and applied in order, on top of the ones before it.
    /// Returns per change Ok(new value) or the reason it was refused.
    pub fn set(&mut self, changes: &[(String, ParameterValueMsg)]) -> Vec<Result<ParamValue, String>> {
        changes
            .iter()
            .map(|(name, value)| {
                let v = self.checked(name, value)?;
                let candidate = self.with(&self.values, &[(name.clone(), v.clone())]);
                self.validate(&candidate)?;
                self.commit(candidate);
                Ok(v)
            })
            .collect()
    }

    /// set_parameters_atomically: all changes or none.
    pub fn set_atomically(&mut self, changes: &[(String, ParameterValueMsg)]) -> Result<Vec<ParamValue>, String> {
        let checked = changes
            .iter()
            .map(|(name, value)| Ok((name.clone(), self.checked(name, value)?)))
            .collect::<Result<Vec<_>, String>>()?;
        let candidate = self.with(&self.values, &checked);
        self.validate(&candidate)?;
        self.commit(candidate);
        Ok(checked.into_iter().map(|(_, v)| v).collect())
    }

    fn get_msg(&self, name: &str) -> ParameterValueMsg {
        self.values.values.get(name).map(to_msg).unwrap_or_default()
    }

    pub fn describe(&self, name: &str) -> ParameterDescriptor {
        let Some(s) = self.specs.iter().find(|s| s.name == name) else {
            return ParameterDescriptor { name: name.into(), ..Default::default() };
        };
        let mut d = ParameterDescriptor {
            name: name.into(),
            type_: type_of(&s.default),
            description: s.full_description(),
            read_only: s.read_only,
            ..Default::default()
        };
        match (s.range, &s.default) {
            (Some((lo, hi)), ParamValue::Int(_)) => {
                d.integer_range = vec![IntegerRange { from_value: lo as i64, to_value: hi as i64, step: 0 }]
            }
            (Some((lo, hi)), ParamValue::Double(_)) => {
                d.floating_point_range = vec![FloatingPointRange { from_value: lo, to_value: hi, step: 0.0 }]
            }
            (Some((lo, hi)), _) => d.additional_constraints = format!("each element in [{lo}, {hi}]"),
            _ => {}
        }
        d
    }

    /// ListParameters semantics of rclcpp: names under the prefixes (all when none), at most
    /// `depth` levels of '.' below them (0: any depth), and the prefixes of the names returned.
    pub fn list(&self, prefixes: &[String], depth: u64) -> ListParametersResult {
        let within = |rest: &str| depth == 0 || (rest.matches('.').count() as u64) < depth;
        let mut result = ListParametersResult::default();
        for s in &self.specs {
            let name = s.name.as_str();
            let ok = if prefixes.is_empty() {
                within(name)
            } else {
                prefixes.iter().any(|p| {
                    name == p || name.strip_prefix(p.as_str()).and_then(|r| r.strip_prefix('.')).is_some_and(within)
                })
            };
            if ok {
                result.names.push(name.to_string());
                if let Some((prefix, _)) = name.rsplit_once('.') {
                    if !result.prefixes.iter().any(|p| p == prefix) {
                        result.prefixes.push(prefix.to_string());
                    }
                }
            }
        }
        result
    }
}

fn guard(t: &Mutex<ParamTable>) -> std::sync::MutexGuard<'_, ParamTable> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

fn parameter_msg(name: &str, v: &ParamValue) -> ParameterMsg {
    ParameterMsg { name: name.to_string(), value: to_msg(v) }
}

/// Creates the parameter services and `/parameter_events` on `node` and returns the future that
/// answers them (spawn it on the executor). Accepted changes are logged and published as events.
pub fn serve(
    node: &mut r2r::Node,
    table: Arc<Mutex<ParamTable>>,
    logger: String,
) -> anyhow::Result<impl std::future::Future<Output = ()> + Send> {
    let name = node.name().map_err(|e| anyhow!("node name: {e}"))?;
    let fqn = node.fully_qualified_name().unwrap_or_else(|_| name.clone());
    let srv = |e: r2r::Error| anyhow!("parameter services: {e}");
    let qos = QosProfile::default;
    let list =
        node.create_service::<ListParameters::Service>(&format!("{name}/list_parameters"), qos()).map_err(srv)?;
    let get = node.create_service::<GetParameters::Service>(&format!("{name}/get_parameters"), qos()).map_err(srv)?;
    let types = node
        .create_service::<GetParameterTypes::Service>(&format!("{name}/get_parameter_types"), qos())
        .map_err(srv)?;
    let describe = node
        .create_service::<DescribeParameters::Service>(&format!("{name}/describe_parameters"), qos())
        .map_err(srv)?;
    let set = node.create_service::<SetParameters::Service>(&format!("{name}/set_parameters"), qos()).map_err(srv)?;
    let set_atomic = node
        .create_service::<SetParametersAtomically::Service>(&format!("{name}/set_parameters_atomically"), qos())
        .map_err(srv)?;
    // rclcpp's parameter-events QoS: reliable, keep last 1000.
    let mut events_qos = QosProfile::default();
    events_qos.depth = 1000;
    let events = Mutex::new(node.create_publisher::<ParameterEvent>("/parameter_events", events_qos).map_err(srv)?);
    let clock = node.get_ros_clock();

    let announce = move |changed: Vec<(String, ParamValue)>| {
        if changed.is_empty() {
            return;
        }
        for (n, v) in &changed {
            r2r::log_info!(&logger, "parameter {n} := {v}");
        }
        let now = clock.lock().map(|mut c| c.get_now().unwrap_or_default()).unwrap_or_default();
        let _ = events.lock().unwrap_or_else(|e| e.into_inner()).publish(&ParameterEvent {
            stamp: r2r::Clock::to_builtin_time(&now),
            node: fqn.clone(),
            changed_parameters: changed.iter().map(|(n, v)| parameter_msg(n, v)).collect(),
            ..Default::default()
        });
    };
    let announce = Arc::new(announce);

    let l = table.clone();
    let list = list.for_each(move |req| {
        let result = guard(&l).list(&req.message.prefixes, req.message.depth);
        let _ = req.respond(ListParameters::Response { result });
        futures::future::ready(())
    });
    let l = table.clone();
    let get = get.for_each(move |req| {
        let t = guard(&l);
        let values = req.message.names.iter().map(|n| t.get_msg(n)).collect();
        let _ = req.respond(GetParameters::Response { values });
        futures::future::ready(())
    });
    let l = table.clone();
    let types = types.for_each(move |req| {
        let t = guard(&l);
        let types = req.message.names.iter().map(|n| t.get_msg(n).type_).collect();
        let _ = req.respond(GetParameterTypes::Response { types });
        futures::future::ready(())
    });
    let l = table.clone();
    let describe = describe.for_each(move |req| {
        let t = guard(&l);
        let descriptors = req.message.names.iter().map(|n| t.describe(n)).collect();
        let _ = req.respond(DescribeParameters::Response { descriptors });
        futures::future::ready(())
    });
    let (l, a) = (table.clone(), announce.clone());
    let set = set.for_each(move |req| {
        let changes: Vec<_> = req.message.parameters.iter().map(|p| (p.name.clone(), p.value.clone())).collect();
        let outcome = guard(&l).set(&changes);
        let mut accepted = Vec::new();
        let results = outcome
            .into_iter()
            .zip(&changes)
            .map(|(r, (n, _))| match r {
                Ok(v) => {
                    accepted.push((n.clone(), v));
                    SetParametersResult { successful: true, reason: String::new() }
                }
                Err(reason) => SetParametersResult { successful: false, reason },
            })
            .collect();
        a(accepted);
        let _ = req.respond(SetParameters::Response { results });
        futures::future::ready(())
    });
    let (l, a) = (table, announce);
    let set_atomic = set_atomic.for_each(move |req| {
        let changes: Vec<_> = req.message.parameters.iter().map(|p| (p.name.clone(), p.value.clone())).collect();
        let result = match guard(&l).set_atomically(&changes) {
            Ok(values) => {
                a(changes.iter().map(|(n, _)| n.clone()).zip(values).collect());
                SetParametersResult { successful: true, reason: String::new() }
            }
            Err(reason) => SetParametersResult { successful: false, reason },
        };
        let _ = req.respond(SetParametersAtomically::Response { result });
        futures::future::ready(())
    });
    Ok(futures::future::join_all([
        list.boxed(),
        get.boxed(),
        types.boxed(),
        describe.boxed(),
        set.boxed(),
        set_atomic.boxed(),
    ])
    .map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> ParamTable {
        ParamTable::new(vec![
            ParamSpec::bool("reliable", false, "QoS.").read_only(),
            ParamSpec::int("queue_size", 1, 1, 16, "Queue."),
            ParamSpec::int("queue_size", 5, 1, 16, "duplicate, ignored"),
            ParamSpec::double("a.lo", 0.0, -10.0, 10.0, "Low."),
            ParamSpec::double("a.hi", 1.0, -10.0, 10.0, "High."),
        ])
    }

    fn int(i: i64) -> ParameterValueMsg {
        to_msg(&ParamValue::Int(i))
    }

    fn double(d: f64) -> ParameterValueMsg {
        to_msg(&ParamValue::Double(d))
    }

    /// lo < hi, like min_radius < radius.
    fn ordered() -> Option<Validator> {
        Some(Box::new(|p: &Params| {
            let (lo, hi) = (p.double("a.lo").unwrap(), p.double("a.hi").unwrap());
            anyhow::ensure!(lo < hi, "parameter 'a.lo' = {lo}: must be < a.hi ({hi})");
            Ok(())
        }))
    }

    #[test]
    fn start_values_are_checked_and_undeclared_ones_named() {
        let mut t = table();
        let mut m = IndexMap::new();
        m.insert("queue_size".to_string(), r2r::Parameter::new(R2rValue::Integer(4)));
        m.insert("reliable".to_string(), r2r::Parameter::new(R2rValue::Bool(true)));
        m.insert("nms.kind".to_string(), r2r::Parameter::new(R2rValue::String("circle".into())));
        t.apply_overrides(&m).unwrap();
        assert_eq!(t.snapshot().int("queue_size"), Some(4));
        assert_eq!(t.snapshot().bool("reliable"), Some(true));
        assert_eq!(t.undeclared(), ["nms.kind".to_string()]);
        assert!(!t.list(&[], 0).names.contains(&"nms.kind".to_string()));

        let mut bad = table();
        let mut m = IndexMap::new();
        m.insert("queue_size".to_string(), r2r::Parameter::new(R2rValue::Integer(99)));
        let e = bad.apply_overrides(&m).unwrap_err().to_string();
        assert!(e.contains("queue_size") && e.contains("outside [1, 16]"), "{e}");
    }

    #[test]
    fn sets_respect_range_read_only_and_the_validator() {
        let mut t = table();
        t.set_validator(ordered());
        let r = t.set(&[("queue_size".into(), int(3))]);
        assert!(r[0].is_ok());
        assert_eq!(t.generation(), 1);
        for (name, v) in [
            ("queue_size", int(0)),
            ("queue_size", double(2.5)),
            ("reliable", to_msg(&ParamValue::Bool(true))),
            ("nope", int(1)),
        ] {
            let r = t.set(&[(name.into(), v)]);
            assert!(r[0].is_err(), "{name}");
        }
        // The validator sees the whole candidate: lo >= hi refused, old value kept.
        let r = t.set(&[("a.lo".into(), double(5.0))]);
        assert!(r[0].as_ref().unwrap_err().contains("must be < a.hi"), "{r:?}");
        assert_eq!(t.snapshot().double("a.lo"), Some(0.0));
        assert_eq!(t.generation(), 1);
        // In order: hi first, then lo, both accepted; the reverse order refuses lo.
        let r = t.set(&[("a.hi".into(), double(8.0)), ("a.lo".into(), double(5.0))]);
        assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
        assert_eq!(t.generation(), 3);
        // Atomically: judged together, all or nothing.
        assert!(t.set_atomically(&[("a.lo".into(), double(9.5)), ("a.hi".into(), double(9.0))]).is_err());
        assert_eq!(t.snapshot().double("a.lo"), Some(5.0));
        assert!(t.set_atomically(&[("a.lo".into(), double(-9.0)), ("a.hi".into(), double(-8.0))]).is_ok());
        assert_eq!((t.snapshot().double("a.lo"), t.snapshot().double("a.hi")), (Some(-9.0), Some(-8.0)));
        // An unchanged value is no new generation.
        let g = t.generation();
        assert!(t.set(&[("a.hi".into(), double(-8.0))])[0].is_ok());
        assert_eq!(t.generation(), g);
    }

    #[test]
    fn describe_and_list_tell_the_truth() {
        let t = table();
        let d = t.describe("reliable");
        assert!(d.read_only && d.type_ == ParameterType::PARAMETER_BOOL as u8);
        let d = t.describe("queue_size");
        assert!(!d.read_only);
        assert_eq!((d.integer_range[0].from_value, d.integer_range[0].to_value), (1, 16));
        assert!(d.description.contains("Range [1, 16]"));
        let d = t.describe("a.lo");
        assert_eq!(d.floating_point_range[0].to_value, 10.0);
        let l = t.list(&[], 1);
        assert_eq!(l.names, ["reliable", "queue_size"]);
        let l = t.list(&["a".into()], 0);
        assert_eq!((l.names.len(), l.prefixes.clone()), (2, vec!["a".to_string()]));
    }
}
