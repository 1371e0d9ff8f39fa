//! Kernel profiles: per-target block sizes, items per thread, hash load factor and initial pool
//! capacities. The three built-in profiles live in `config/targets/*.yaml` and are embedded in the
//! binary, so it works from any directory. Kernel-facing values reach the kernels as NVRTC
//! `-D NAME=value` options (see [`KernelProfile::defines`]); the host reads the same block sizes for
//! its launches, the hash load factor to size the voxel hash table and the pools for the first
//! allocations. Every key has a reader: a value no kernel and no host code reads is no key.

use super::GpuError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The built-in profiles: (name, YAML text).
pub const BUILTIN_PROFILES: [(&str, &str); 3] = [
    ("x86_64", include_str!("../../config/targets/x86_64.yaml")),
    ("orin", include_str!("../../config/targets/orin.yaml")),
    ("xavier", include_str!("../../config/targets/xavier.yaml")),
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockSizes {
    pub gather: u32,
    pub voxel: u32,
    pub fps: u32,
    pub neighbors: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsPerThread {
    pub gather: u32,
    pub voxel: u32,
}

/// Initial capacities of the grow-only device pools and the pinned staging ring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pools {
    /// Points the first device clouds, gather scratch and pinned upload slots are sized for.
    pub points: usize,
    /// Slots of each pinned staging ring (upload and read-back).
    pub pinned_slots: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelProfile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The device a tuned profile was measured on (`lidar-kernels tune`); on any other device the
    /// profile is not used and the target `name`'s built-in profile is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuned_for: Option<TunedFor>,
    pub block_size: BlockSizes,
    pub items_per_thread: ItemsPerThread,
    pub hash_load_factor: f64,
    pub pools: Pools,
}

/// What a tuned profile's timings hold for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TunedFor {
    pub device: String,
    pub compute_capability: [i32; 2],
    pub nvrtc_version: [i32; 2],
}

impl TunedFor {
    pub fn of(device: &str, compute_capability: (i32, i32), nvrtc_version: (i32, i32)) -> Self {
        Self {
            device: device.to_string(),
            compute_capability: [compute_capability.0, compute_capability.1],
            nvrtc_version: [nvrtc_version.0, nvrtc_version.1],
        }
    }
}

fn bad(key: &str, msg: impl Into<String>) -> GpuError {
    GpuError::Profile { key: key.to_string(), msg: msg.into() }
}

impl KernelProfile {
    /// Parses and validates a profile; errors name the offending key.
    pub fn from_yaml(text: &str) -> Result<Self, GpuError> {
        let p: KernelProfile = serde_yaml::from_str(text).map_err(|e| {
            // serde_yaml names unknown/missing fields and the location in its message.
            bad("(yaml)", e.to_string())
        })?;
        p.validate()?;
        Ok(p)
    }

    pub fn from_file(path: &Path) -> Result<Self, GpuError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| bad("(file)", format!("cannot read {}: {e}", path.display())))?;
        Self::from_yaml(&text).map_err(|e| match e {
            GpuError::Profile { key, msg } => bad(&key, format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    /// A built-in profile by name (`x86_64`, `orin`, `xavier`).
    pub fn builtin(name: &str) -> Result<Self, GpuError> {
        let (_, text) = BUILTIN_PROFILES.iter().find(|(n, _)| *n == name).ok_or_else(|| {
            bad(
                "name",
                format!(
                    "unknown profile '{name}' (built-in: {})",
                    BUILTIN_PROFILES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        Self::from_yaml(text)
    }

    /// Every built-in profile, parsed.
    pub fn builtins() -> Result<Vec<Self>, GpuError> {
        BUILTIN_PROFILES.iter().map(|(_, t)| Self::from_yaml(t)).collect()
    }

    pub fn validate(&self) -> Result<(), GpuError> {
        if self.name.trim().is_empty() {
            return Err(bad("name", "must not be empty"));
        }
        let blocks = [
            ("block_size.gather", self.block_size.gather),
            ("block_size.voxel", self.block_size.voxel),
            ("block_size.fps", self.block_size.fps),
            ("block_size.neighbors", self.block_size.neighbors),
        ];
        for (key, v) in blocks {
            if !(32..=1024).contains(&v) || v % 32 != 0 {
                return Err(bad(key, format!("{v} is not a multiple of 32 (warp size) in 32..=1024")));
            }
        }
        for (key, v) in [
            ("items_per_thread.gather", self.items_per_thread.gather),
            ("items_per_thread.voxel", self.items_per_thread.voxel),
        ] {
            if !(1..=32).contains(&v) {
                return Err(bad(key, format!("{v} is outside 1..=32 (per-thread flags are one u32 bitmask)")));
            }
        }
        if !(self.hash_load_factor > 0.05 && self.hash_load_factor <= 0.9) {
            return Err(bad(
                "hash_load_factor",
                format!(
                    "{} is outside (0.05, 0.9] (open addressing degrades sharply above 0.9)",
                    self.hash_load_factor
                ),
            ));
        }
        if self.pools.points == 0 || self.pools.points > (1usize << 31) {
            return Err(bad("pools.points", format!("{} is outside 1..=2^31", self.pools.points)));
        }
        if !(2..=16).contains(&self.pools.pinned_slots) {
            return Err(bad("pools.pinned_slots", format!("{} is outside 2..=16", self.pools.pinned_slots)));
        }
        Ok(())
    }

    /// The `-D NAME=value` options that pass the profile to every kernel file.
    pub fn defines(&self) -> Vec<String> {
        vec![
            format!("-DGATHER_BLOCK={}", self.block_size.gather),
            format!("-DGATHER_ITEMS={}", self.items_per_thread.gather),
            format!("-DVOXEL_BLOCK={}", self.block_size.voxel),
            format!("-DVOXEL_ITEMS={}", self.items_per_thread.voxel),
            format!("-DFPS_BLOCK={}", self.block_size.fps),
            format!("-DNEIGHBORS_BLOCK={}", self.block_size.neighbors),
        ]
    }

    /// Points per gather tile (block size x items per thread).
    pub fn gather_tile(&self) -> usize {
        self.block_size.gather as usize * self.items_per_thread.gather as usize
    }
}

/// Which profile to use.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ProfileChoice {
    /// From the device: compute capability 7.2 -> xavier, 8.7 -> orin, else x86_64.
    #[default]
    Auto,
    /// A built-in profile by name.
    Named(String),
    /// A YAML file.
    Path(PathBuf),
    /// A profile already in memory (the candidates of `lidar-kernels tune`).
    Given(Box<KernelProfile>),
}

impl std::str::FromStr for ProfileChoice {
    type Err = std::convert::Infallible;
    /// `auto`, a built-in name, or a path (anything with a `/` or ending in `.yaml`/`.yml`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(if s.eq_ignore_ascii_case("auto") || s.is_empty() {
            ProfileChoice::Auto
        } else if s.contains('/') || s.ends_with(".yaml") || s.ends_with(".yml") {
            ProfileChoice::Path(PathBuf::from(s))
        } else {
            ProfileChoice::Named(s.to_string())
        })
    }
}

/// The built-in profile name Auto picks for a device.
pub fn auto_profile_name(compute_capability: (i32, i32), sm_count: i32) -> &'static str {
    match compute_capability {
        (7, 2) => "xavier",
        (8, 7) => "orin",
        // Unknown small integrated parts (e.g. Jetson Thor or a future Nano) are not guessed: the
        // x86_64 profile is safe everywhere, only less tuned.
        _ => {
            let _ = sm_count;
            "x86_64"
        }
    }
}

impl ProfileChoice {
    /// Resolves to a validated profile for a device. A tuned profile whose device is not this one
    /// (another GPU, compute capability or NVRTC) gives way, with a warning, to the built-in
    /// profile of its target (`name`), or to Auto's choice when `name` is no built-in.
    pub fn resolve(&self, device: &TunedFor, sm_count: i32) -> Result<KernelProfile, GpuError> {
        let cc = (device.compute_capability[0], device.compute_capability[1]);
        let chosen = match self {
            ProfileChoice::Auto => return KernelProfile::builtin(auto_profile_name(cc, sm_count)),
            ProfileChoice::Named(n) => KernelProfile::builtin(n)?,
            ProfileChoice::Path(p) => KernelProfile::from_file(p)?,
            ProfileChoice::Given(p) => {
                p.validate()?;
                return Ok((**p).clone());
            }
        };
        match &chosen.tuned_for {
            Some(key) if key != device => {
                let fallback = KernelProfile::builtin(&chosen.name)
                    .or_else(|_| KernelProfile::builtin(auto_profile_name(cc, sm_count)))?;
                tracing::warn!(
                    profile = %chosen.name,
                    tuned_for = ?key,
                    device = ?device,
                    "the kernel profile was tuned on another device: using the built-in profile '{}'",
                    fallback.name
                );
                Ok(fallback)
            }
            _ => Ok(chosen),
        }
    }
}
