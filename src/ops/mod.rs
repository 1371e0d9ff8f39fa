//! The operators, one folder per family: `<family>/mod.rs` holds the parameter structs (serde,
//! validated), the output structs, the exact semantics (doc comments) and the CPU reference, the
//! oracle that every other backend must reproduce bit for bit on integer outputs;
//! `<family>/cuda.rs` holds the CUDA launcher of the family's kernels (`cuda/<family>.cu`), on
//! the runtime of [`crate::gpu`].

pub mod backend;
pub mod detect;
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
