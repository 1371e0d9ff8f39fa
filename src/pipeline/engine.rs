//! The backend a pipeline runs on: the CPU reference, or CUDA (one context, scratch buffers reused
//! frame after frame). Both run the one stage sequence of [`super::stages::run`].

use super::config::PipelineConfig;
use super::stages::{self, StageResults};
use super::{FrameError, Timings};
use crate::cloud::CloudView;
use crate::gpu::{BackendKind, GpuError, ProfileChoice};
use crate::ops::backend::{Backend, CpuBackend, CudaBackend};
use crate::ops::nms::{Box3d, NmsOutput, NmsParams};

pub enum Engine {
    Cpu(CpuBackend),
    Cuda(Box<CudaBackend>),
}

impl Engine {
    /// The CPU reference.
    pub fn cpu() -> Self {
        Engine::Cpu(CpuBackend)
    }

    /// `auto`: CUDA when a driver, NVRTC and a GPU are present, else the CPU (one log line says
    /// why); `cuda`: CUDA or an error naming what is missing; `cpu`: the CPU reference.
    pub fn select(kind: BackendKind, profile: ProfileChoice) -> Result<Self, GpuError> {
        Ok(match CudaBackend::select(kind, profile)? {
            None => Engine::Cpu(CpuBackend),
            Some(b) => Engine::Cuda(Box::new(b)),
        })
    }

    /// "cpu" or "cuda NVIDIA H200 (sm_90, profile x86_64)".
    pub fn describe(&self) -> String {
        match self {
            Engine::Cpu(b) => b.describe(),
            Engine::Cuda(b) => b.describe(),
        }
    }

    pub(super) fn run(
        &mut self,
        cfg: &PipelineConfig,
        view: &CloudView<'_>,
        t: &mut Timings,
    ) -> Result<StageResults, FrameError> {
        match self {
            Engine::Cpu(b) => stages::run(b, cfg, view, t),
            Engine::Cuda(b) => stages::run(&mut **b, cfg, view, t),
        }
    }

    pub(super) fn nms(
        &mut self,
        boxes: &[Box3d],
        scores: &[f32],
        classes: &[i32],
        params: &NmsParams,
    ) -> Result<NmsOutput, FrameError> {
        Ok(match self {
            Engine::Cpu(b) => b.nms(boxes, scores, classes, params)?,
            Engine::Cuda(b) => b.nms(boxes, scores, classes, params)?,
        })
    }
}
