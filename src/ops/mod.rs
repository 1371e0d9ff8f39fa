//! The operators' CPU reference. Each operator has one parameter struct (serde, validated), one
//! output struct and its exact semantics in its doc comment: this code is the oracle that every
//! other backend must reproduce bit for bit on integer outputs.

pub mod fps;
pub mod neighbors;
pub mod nms;
pub mod voxel;

/// An operator parameter outside its allowed range; names the key and the range.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid parameter {key} = {value}: {allowed}")]
pub struct ParamError {
    pub key: String,
    pub value: String,
    pub allowed: String,
}

impl ParamError {
    pub fn new(key: &str, value: impl std::fmt::Display, allowed: &str) -> Self {
        Self { key: key.to_string(), value: value.to_string(), allowed: allowed.to_string() }
    }
}

/// Implemented by every parameter struct; called before an operator runs and when config loads.
pub trait Validate {
    fn validate(&self) -> Result<(), ParamError>;
}
