//! The backend a pipeline runs on: the CPU reference, or CUDA (one context, scratch buffers reused
//! frame after frame). Both run the one stage sequence of [`super::stages::run`].
//!
//! A device error on CUDA does not lose the frame: it runs again on the CPU reference, which gives
//! the same outputs, and is counted in [`GpuFallbackStats`].
//! - Out of device memory, or a size past what the kernels index (a cloud too large for the
//!   device) costs only that frame: the context is sound and the next frame is tried on it again.
//! - Any other error (a launch or copy the driver refuses) may leave the context or the scratch in
//!   an unknown state: the CUDA backend is dropped whole (its device memory freed), the frames of a
//!   back-off run on the CPU, then a new context is built. A fault on the first frame of a rebuilt
//!   context, or a rebuild that fails, doubles the back-off, up to [`MAX_BACKOFF`].
//! - A sticky error (an illegal address, a kernel that traps) poisons CUDA for the rest of the
//!   process: NVIDIA documents that "to continue using CUDA, the process must be terminated and
//!   relaunched", and on the H200 a new context (after dropping everything, even after
//!   `cuDevicePrimaryCtxReset`) still fails with the same error. The engine then stays on the CPU,
//!   says so once, and reports `gpu_lost` in diagnostics: restarting the process brings the GPU
//!   back.

use super::config::PipelineConfig;
use super::stages::{self, Messages, StageResults};
use super::stats::GpuFallbackStats;
use super::{FrameError, Timings};
use crate::cloud::CloudView;
use crate::gpu::{BackendKind, FaultPlan, GpuError, ProfileChoice};
use crate::ops::backend::{Backend, CpuBackend, CudaBackend, OpError};
use crate::ops::nms::{Box3d, NmsOutput, NmsParams};
use cudarc::driver::sys::CUresult;
use std::time::{Duration, Instant};

/// The first back-off after a fault, and the longest.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

pub enum Engine {
    Cpu(CpuBackend),
    Cuda(Box<CudaEngine>),
}

/// The CUDA backend and its recovery state.
pub struct CudaEngine {
    /// `None` from a fault until the rebuild.
    backend: Option<CudaBackend>,
    profile: ProfileChoice,
    description: String,
    /// Frames given to the engine so far: the clock of `fault`.
    frames: u64,
    fault: Option<FaultPlan>,
    backoff: Duration,
    retry_at: Instant,
    /// Frames the current context completed.
    clean_frames: u64,
}

/// The driver errors after which CUDA cannot be used again in this process.
const STICKY: [CUresult; 9] = [
    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
    CUresult::CUDA_ERROR_LAUNCH_FAILED,
    CUresult::CUDA_ERROR_LAUNCH_TIMEOUT,
    CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUresult::CUDA_ERROR_MISALIGNED_ADDRESS,
    CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE,
    CUresult::CUDA_ERROR_INVALID_PC,
    CUresult::CUDA_ERROR_ECC_UNCORRECTABLE,
];

fn sticky(e: &GpuError) -> bool {
    matches!(e, GpuError::Driver(d) if STICKY.contains(&d.0))
}

impl Engine {
    /// The CPU reference.
    pub fn cpu() -> Self {
        Engine::Cpu(CpuBackend)
    }

    /// `auto`: CUDA when a driver, NVRTC and a GPU are present, else the CPU (one log line says
    /// why); `cuda`: CUDA or an error naming what is missing; `cpu`: the CPU reference.
    pub fn select(kind: BackendKind, profile: ProfileChoice) -> Result<Self, GpuError> {
        Ok(match CudaBackend::select(kind, profile.clone())? {
            None => Engine::Cpu(CpuBackend),
            Some(b) => Self::cuda(b, profile),
        })
    }

    /// The CUDA engine on `backend`; after a device fault it reopens the device with `profile`.
    pub fn cuda(backend: CudaBackend, profile: ProfileChoice) -> Self {
        Engine::Cuda(Box::new(CudaEngine {
            description: backend.describe(),
            backend: Some(backend),
            profile,
            frames: 0,
            fault: None,
            backoff: FIRST_BACKOFF,
            retry_at: Instant::now(),
            clean_frames: 0,
        }))
    }

    /// Arms a test fault (`--inject-gpu-fault`); `false` on the CPU backend, which has none.
    pub fn inject_fault(&mut self, plan: FaultPlan) -> bool {
        match self {
            Engine::Cpu(_) => false,
            Engine::Cuda(e) => {
                e.fault = Some(plan);
                true
            }
        }
    }

    /// "cpu" or "cuda NVIDIA H200 (sm_90, profile x86_64)".
    pub fn describe(&self) -> String {
        match self {
            Engine::Cpu(b) => b.describe(),
            Engine::Cuda(e) => e.description.clone(),
        }
    }

    pub(super) fn run(
        &mut self,
        cfg: &PipelineConfig,
        view: &CloudView<'_>,
        t: &mut Timings,
        gpu: &mut GpuFallbackStats,
    ) -> Result<(StageResults, Messages), FrameError> {
        match self {
            Engine::Cpu(b) => stages::run(b, cfg, view, t),
            Engine::Cuda(e) => match e.attempt(gpu, |b| stages::run(b, cfg, view, t)) {
                Some(result) => result,
                None => {
                    t.clear();
                    stages::run(&mut CpuBackend, cfg, view, t)
                }
            },
        }
    }

    pub(super) fn nms(
        &mut self,
        boxes: &[Box3d],
        scores: &[f32],
        classes: &[i32],
        params: &NmsParams,
        gpu: &mut GpuFallbackStats,
    ) -> Result<NmsOutput, FrameError> {
        let on_cpu = |b: &mut CpuBackend| b.nms(boxes, scores, classes, params).map_err(FrameError::from);
        match self {
            Engine::Cpu(b) => on_cpu(b),
            Engine::Cuda(e) => match e.attempt(gpu, |b| Ok(b.nms(boxes, scores, classes, params)?)) {
                Some(result) => result,
                None => on_cpu(&mut CpuBackend),
            },
        }
    }
}

fn out_of_memory(e: &GpuError) -> bool {
    matches!(e, GpuError::Driver(d) if d.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

impl CudaEngine {
    /// Runs `on_gpu` on the device; `None` when the frame must run on the CPU instead (the device
    /// failed now, or is down for its back-off).
    fn attempt<T>(
        &mut self,
        gpu: &mut GpuFallbackStats,
        on_gpu: impl FnOnce(&mut CudaBackend) -> Result<T, FrameError>,
    ) -> Option<Result<T, FrameError>> {
        let frame = self.frames;
        self.frames += 1;
        if self.backend.is_none() && !gpu.lost && Instant::now() >= self.retry_at {
            self.rebuild(gpu);
        }
        let Some(backend) = self.backend.as_mut() else {
            gpu.cpu_frames += 1;
            return None;
        };
        backend.armed_fault = self.fault.filter(|f| f.frame == frame);
        let heap_before = backend.ctx.output_pool.heap_fallbacks();
        let result = on_gpu(backend);
        gpu.output_heap_messages += backend.ctx.output_pool.heap_fallbacks() - heap_before;
        backend.armed_fault = None;
        let error = match result {
            Err(FrameError::Op(OpError::Device(e))) => e,
            // Past what the kernels index (32-bit indices, 30-bit counts): the CPU has no such limit.
            Err(FrameError::Op(e @ OpError::TooLarge { .. })) => {
                gpu.cpu_frames += 1;
                tracing::warn!("frame {frame}: {e} on the GPU; it runs on the CPU");
                return None;
            }
            other => {
                self.clean_frames += 1;
                return Some(other);
            }
        };
        gpu.faults += 1;
        gpu.cpu_frames += 1;
        let healthy = out_of_memory(&error) && backend.ctx.synchronize().is_ok();
        if healthy {
            tracing::warn!(
                "frame {frame}: out of device memory ({error}); it runs on the CPU, the next frame on the GPU"
            );
            return None;
        }
        self.backend = None;
        if sticky(&error) {
            gpu.lost = true;
            tracing::error!(
                "frame {frame}: sticky GPU fault ({error}): CUDA cannot be used again in this process; this and every later frame run on the CPU (restart the process to get the GPU back)"
            );
            return None;
        }
        if self.clean_frames == 0 {
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        } else {
            self.backoff = FIRST_BACKOFF;
        }
        tracing::error!(
            "frame {frame}: GPU fault ({error}); it runs on the CPU, the CUDA context is dropped and rebuilt in {:.1} s (frames until then on the CPU)",
            self.backoff.as_secs_f64()
        );
        self.retry_at = Instant::now() + self.backoff;
        None
    }

    fn rebuild(&mut self, gpu: &mut GpuFallbackStats) {
        let t = Instant::now();
        match CudaBackend::select(BackendKind::Cuda, self.profile.clone()) {
            Ok(Some(b)) => {
                gpu.rebuilds += 1;
                self.clean_frames = 0;
                tracing::info!(
                    "CUDA context rebuilt in {:.0} ms: frames are back on the GPU",
                    t.elapsed().as_secs_f64() * 1e3
                );
                self.backend = Some(b);
            }
            Ok(None) => unreachable!("a CUDA selection gives a backend or an error"),
            Err(e) if sticky(&e) => {
                gpu.rebuild_failures += 1;
                gpu.lost = true;
                tracing::error!("rebuilding the CUDA context failed with a sticky error ({e}): frames stay on the CPU (restart the process to get the GPU back)");
            }
            Err(e) => {
                gpu.rebuild_failures += 1;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                self.retry_at = Instant::now() + self.backoff;
                tracing::error!(
                    "rebuilding the CUDA context failed ({e}); next attempt in {:.1} s",
                    self.backoff.as_secs_f64()
                );
            }
        }
    }
}
