//! Test-only GPU faults, for `--inject-gpu-fault KIND@OP:FRAME` of `replay` and `soak`: at the start
//! of operator OP on frame FRAME (counted from 0 over every cloud the pipeline is given), a real
//! CUDA call that the driver refuses. They exercise, on a real device, what
//! [`crate::pipeline::Engine`] does with a device error: the frame again on the CPU, the context
//! dropped and rebuilt after a back-off, the frames after it back on the GPU. Nothing is
//! simulated: each kind asks the driver for something it cannot do.

use super::{GpuContext, GpuError};
use cudarc::driver::{result as drv, LaunchConfig, PushKernelArg};

/// What the injected call does wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A kernel launch with 4096 threads per block, more than any device allows.
    Launch,
    /// A host-to-device copy to an address no allocation holds.
    Copy,
    /// An allocation of the device's whole memory and 1 GiB more (out of memory).
    Alloc,
    /// A kernel that reads an address no allocation holds (illegal address): a sticky error, after
    /// which every call on the context fails until the context is destroyed.
    IllegalAddress,
}

/// Where the fault is made: the backend operator it precedes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    Gather,
    Voxelize,
    Downsample,
    Fps,
    Neighbors,
    Detect,
    Nms,
}

/// One fault: `KIND@OP:FRAME`, e.g. `illegal-address@fps:10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultPlan {
    pub kind: FaultKind,
    pub op: FaultOp,
    pub frame: u64,
}

const KINDS: [(&str, FaultKind); 4] = [
    ("launch", FaultKind::Launch),
    ("copy", FaultKind::Copy),
    ("alloc", FaultKind::Alloc),
    ("illegal-address", FaultKind::IllegalAddress),
];
const OPS: [(&str, FaultOp); 7] = [
    ("gather", FaultOp::Gather),
    ("voxelize", FaultOp::Voxelize),
    ("downsample", FaultOp::Downsample),
    ("fps", FaultOp::Fps),
    ("neighbors", FaultOp::Neighbors),
    ("detect", FaultOp::Detect),
    ("nms", FaultOp::Nms),
];

fn find<T: Copy>(plan: &str, table: &[(&str, T)], name: &str, what: &str) -> Result<T, String> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).ok_or_else(|| {
        let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
        format!("'{plan}': unknown fault {what} '{name}' ({})", names.join(", "))
    })
}

impl std::str::FromStr for FaultPlan {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || format!("'{s}': expected KIND@OP:FRAME, e.g. illegal-address@fps:10");
        let (kind, rest) = s.split_once('@').ok_or_else(usage)?;
        let (op, frame) = rest.split_once(':').ok_or_else(usage)?;
        Ok(FaultPlan {
            kind: find(s, &KINDS, kind, "kind")?,
            op: find(s, &OPS, op, "operator")?,
            frame: frame.parse().map_err(|_| format!("'{s}': frame '{frame}' is not a frame number"))?,
        })
    }
}

/// An address no allocation holds (the first page is never mapped).
const UNMAPPED: u64 = 0x8;

impl GpuContext {
    /// Makes the call of `kind` and returns the driver's error. `select_xyz` (cuda/gather.cu) is
    /// the kernel launched wrongly: any kernel would do.
    pub(crate) fn inject_fault(&self, kind: FaultKind, select_xyz: &cudarc::driver::CudaFunction) -> GpuError {
        let made = || -> Result<(), GpuError> {
            match kind {
                FaultKind::Alloc => {
                    let (_, total) = self.ctx.mem_get_info()?;
                    // SAFETY: nothing reads the (never obtained) allocation.
                    let _ = unsafe { self.stream.alloc::<u8>(total + (1 << 30)) }?;
                }
                FaultKind::Copy => {
                    // SAFETY: the driver checks the destination and refuses it; nothing is written.
                    unsafe { drv::memcpy_htod_async(UNMAPPED, &[0u8; 64], self.stream.cu_stream()) }?;
                    self.stream.synchronize()?;
                }
                FaultKind::Launch | FaultKind::IllegalAddress => {
                    let (threads, m) = if kind == FaultKind::Launch { (4096, 0u32) } else { (1, 1u32) };
                    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
                    let stride = 0u64;
                    let mut l = self.stream.launch_builder(select_xyz);
                    l.arg(&UNMAPPED).arg(&stride).arg(&UNMAPPED).arg(&m).arg(&UNMAPPED);
                    // SAFETY: the point of the call: it reads and writes unmapped addresses, which
                    // the device traps (no host memory is touched).
                    unsafe { l.launch(cfg) }?;
                    self.stream.synchronize()?;
                }
            }
            Ok(())
        };
        match made() {
            Err(e) => e,
            Ok(()) => GpuError::FaultNotRaised(kind),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_bad_ones_say_what_is_wrong() {
        let p: FaultPlan = "illegal-address@fps:10".parse().unwrap();
        assert_eq!(p, FaultPlan { kind: FaultKind::IllegalAddress, op: FaultOp::Fps, frame: 10 });
        let p: FaultPlan = "alloc@gather:0".parse().unwrap();
        assert_eq!((p.kind, p.op, p.frame), (FaultKind::Alloc, FaultOp::Gather, 0));
        for (bad, says) in [
            ("alloc", "KIND@OP:FRAME"),
            ("alloc@gather", "KIND@OP:FRAME"),
            ("oom@gather:1", "unknown fault kind 'oom'"),
            ("alloc@encode:1", "unknown fault operator 'encode'"),
            ("alloc@fps:x", "frame 'x'"),
        ] {
            let e = bad.parse::<FaultPlan>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
