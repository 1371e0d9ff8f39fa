//! The node's declared parameters behind r2r's parameter services (list/get/set/describe):
//! type- and range-checked, read-only ones refused at run time, CLI / params-file overrides applied
//! at start (a bad one stops the node with a clear message).
//!
//! r2r 0.9.7's DescribeParameters reports only name, type and description (no range fields), so
//! the range is also written into the description text; it is enforced on every set.

use r2r::indexmap::IndexMap;
use r2r::{Parameter, ParameterValue, RosParams};

use super::stage::{ParamSpec, ParamValue, Params};

pub struct ParamTable {
    specs: Vec<ParamSpec>,
    values: Params,
    started: bool,
    undeclared: Vec<String>,
}

fn from_r2r(name: &str, v: &ParameterValue) -> r2r::Result<ParamValue> {
    Ok(match v {
        ParameterValue::Bool(b) => ParamValue::Bool(*b),
        ParameterValue::Integer(i) => ParamValue::Int(*i),
        ParameterValue::Double(d) => ParamValue::Double(*d),
        ParameterValue::String(s) => ParamValue::Str(s.clone()),
        ParameterValue::DoubleArray(a) => ParamValue::DoubleArray(a.clone()),
        ParameterValue::IntegerArray(a) => ParamValue::DoubleArray(a.iter().map(|&i| i as f64).collect()),
        ParameterValue::StringArray(a) => ParamValue::StringArray(a.clone()),
        other => {
            return Err(r2r::Error::ParameterValueConv {
                name: name.into(),
                msg: format!("type {} is not supported here", other.type_name()),
            })
        }
    })
}

fn to_r2r(v: &ParamValue) -> ParameterValue {
    match v {
        ParamValue::Bool(b) => ParameterValue::Bool(*b),
        ParamValue::Int(i) => ParameterValue::Integer(*i),
        ParamValue::Double(d) => ParameterValue::Double(*d),
        ParamValue::Str(s) => ParameterValue::String(s.clone()),
        ParamValue::DoubleArray(a) => ParameterValue::DoubleArray(a.clone()),
        ParamValue::StringArray(a) => ParameterValue::StringArray(a.clone()),
    }
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
        Self { specs: unique, values, started: false, undeclared: Vec::new() }
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

    /// Names given on the command line or in a params file that this node does not declare
    /// (ignored; a params file for `/**` may serve several nodes).
    pub fn undeclared(&self) -> &[String] {
        &self.undeclared
    }

    /// Replaces a value by the one in effect (not an explicit setting; `generation` unchanged).
    pub fn set_effective(&mut self, name: &str, value: ParamValue) {
        if let Some(v) = self.values.values.get_mut(name) {
            *v = value;
        }
    }

    fn spec(&self, name: &str) -> r2r::Result<&ParamSpec> {
        self.specs.iter().find(|s| s.name == name).ok_or_else(|| r2r::Error::InvalidParameterName { name: name.into() })
    }

    fn checked(&self, name: &str, val: &ParameterValue) -> r2r::Result<ParamValue> {
        let spec = self.spec(name)?;
        if self.started && spec.read_only {
            return Err(r2r::Error::ParameterValueConv {
                name: name.into(),
                msg: "read-only at run time (set it with --ros-args -p or a params file)".into(),
            });
        }
        let v = from_r2r(name, val)?;
        spec.check(&v).map_err(|msg| r2r::Error::ParameterValueConv { name: name.into(), msg })
    }
}

impl RosParams for ParamTable {
    fn register_parameters(
        &mut self,
        prefix: &str,
        _param: Option<Parameter>,
        params: &mut IndexMap<String, Parameter>,
    ) -> r2r::Result<()> {
        let sep = if prefix.is_empty() { "" } else { "." };
        for i in 0..self.specs.len() {
            let name = self.specs[i].name.clone();
            let full = format!("{prefix}{sep}{name}");
            if let Some(cli) = params.get(&full) {
                if !matches!(cli.value, ParameterValue::NotSet) {
                    let v = self.checked(&name, &cli.value)?;
                    self.values.values.insert(name.clone(), v);
                    self.values.explicit.insert(name.clone());
                }
                params.shift_remove(&full);
            }
            // r2r keeps descriptions as &'static str: a few short strings per node, leaked once.
            let description: &'static str = Box::leak(self.specs[i].full_description().into_boxed_str());
            let value = to_r2r(&self.values.values[&name]);
            params.insert(full, Parameter { value, description });
        }
        let declared: std::collections::HashSet<String> =
            self.specs.iter().map(|s| format!("{prefix}{sep}{}", s.name)).collect();
        self.undeclared = params.keys().filter(|k| !declared.contains(*k)).cloned().collect();
        self.started = true;
        Ok(())
    }

    fn get_parameter(&mut self, param_name: &str) -> r2r::Result<ParameterValue> {
        self.values
            .values
            .get(param_name)
            .map(to_r2r)
            .ok_or_else(|| r2r::Error::InvalidParameterName { name: param_name.into() })
    }

    fn set_parameter(&mut self, param_name: &str, param_val: &ParameterValue) -> r2r::Result<()> {
        let v = self.checked(param_name, param_val)?;
        if self.values.values.get(param_name) != Some(&v) || !self.values.explicit.contains(param_name) {
            self.values.values.insert(param_name.into(), v);
            self.values.explicit.insert(param_name.into());
            self.values.generation += 1;
        }
        Ok(())
    }

    fn check_parameter(&self, param_name: &str, param_val: &ParameterValue) -> r2r::Result<()> {
        self.checked(param_name, param_val).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> ParamTable {
        ParamTable::new(vec![
            ParamSpec::bool("reliable", false, "QoS.").read_only(),
            ParamSpec::int("queue_size", 1, 1, 16, "Queue."),
            ParamSpec::int("queue_size", 5, 1, 16, "duplicate, ignored"),
        ])
    }

    #[test]
    fn cli_overrides_are_checked_and_applied() {
        let mut t = table();
        let mut m = IndexMap::new();
        m.insert("queue_size".to_string(), Parameter::new(ParameterValue::Integer(4)));
        m.insert("reliable".to_string(), Parameter::new(ParameterValue::Bool(true)));
        t.register_parameters("", None, &mut m).unwrap();
        assert_eq!(t.snapshot().int("queue_size"), Some(4));
        assert_eq!(t.snapshot().bool("reliable"), Some(true));
        assert!(m["queue_size"].description.contains("Range [1, 16]"));

        let mut bad = table();
        let mut m = IndexMap::new();
        m.insert("queue_size".to_string(), Parameter::new(ParameterValue::Integer(99)));
        assert!(bad.register_parameters("", None, &mut m).is_err());
    }

    #[test]
    fn runtime_sets_respect_range_and_read_only() {
        let mut t = table();
        t.register_parameters("", None, &mut IndexMap::new()).unwrap();
        assert!(t.set_parameter("queue_size", &ParameterValue::Integer(3)).is_ok());
        assert_eq!(t.generation(), 1);
        assert!(t.set_parameter("queue_size", &ParameterValue::Integer(0)).is_err());
        assert!(t.set_parameter("queue_size", &ParameterValue::Double(2.0)).is_err());
        assert!(t.set_parameter("reliable", &ParameterValue::Bool(true)).is_err());
        assert!(t.set_parameter("nope", &ParameterValue::Bool(true)).is_err());
        assert_eq!(t.snapshot().int("queue_size"), Some(3));
        assert_eq!(t.generation(), 1);
    }
}
