//! The kernel registry: one `.cu` file per operator family in `cuda/`, embedded in the binary, and
//! the headers they include. Adding a kernel file is one line here; every entry is compiled (through
//! the cubin cache) when a [`super::GpuContext`] starts and by [`super::nvrtc_check`].

/// A kernel source file: the module name used by [`super::GpuContext::function`] and its source.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    pub module: &'static str,
    pub file: &'static str,
    pub source: &'static str,
}

macro_rules! kernel {
    ($name:literal) => {
        KernelSource {
            module: $name,
            file: concat!("cuda/", $name, ".cu"),
            source: include_str!(concat!("../../cuda/", $name, ".cu")),
        }
    };
}

/// The headers the kernel files `#include`: (include name, text). NVRTC receives them as named
/// headers; their text is part of every cubin's cache key.
pub const HEADERS: &[(&str, &str)] = &[("common.cuh", include_str!("../../cuda/common.cuh"))];

/// Every kernel file, in load order.
pub const KERNELS: &[KernelSource] =
    &[kernel!("gather"), kernel!("voxel"), kernel!("fps"), kernel!("neighbors"), kernel!("nms"), kernel!("detect")];

/// The registry entry for `module`.
pub fn kernel(module: &str) -> Option<&'static KernelSource> {
    KERNELS.iter().find(|k| k.module == module)
}
