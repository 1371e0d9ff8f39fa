//! NVRTC compilation to CUBIN, the on-disk cubin cache, and `nvrtc-check`.
//!
//! Kernels are compiled for the present GPU's exact architecture to CUBIN (never PTX: PTX from an
//! NVRTC newer than the driver fails to JIT). The shared headers (`cuda/common.cuh`, see
//! [`super::kernels::HEADERS`]) are handed to NVRTC by name. The cache key is the SHA-256 of the
//! source, the headers, the architecture, the NVRTC version and every option (profile defines
//! included), so any change recompiles and a restart compiles nothing.

use super::kernels::{KernelSource, HEADERS, KERNELS};
use super::profile::KernelProfile;
use super::GpuError;
use cudarc::nvrtc::{result as nvrtc_result, sys as nvrtc_sys};
use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Whether libnvrtc can be loaded (never panics).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the candidate names.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// NVRTC's (major, minor) version. Errors instead of panicking when NVRTC is missing.
pub fn nvrtc_version() -> Result<(i32, i32), GpuError> {
    if !nvrtc_present() {
        return Err(GpuError::NvrtcMissing);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; plain out-parameters.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| GpuError::Nvrtc(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// `sm_XY` for a compute capability.
pub fn arch_name(cc: (i32, i32)) -> String {
    format!("sm_{}{}", cc.0, cc.1)
}

/// The bits of the NaN this CPU's f64 arithmetic produces from finite or infinite operands
/// (inf - inf): x86's "real indefinite" has the sign bit set, aarch64's default NaN does not. The
/// kernels that sum record values reproduce it (`lk_dadd_host` in cuda/common.cuh).
const HOST_DEFAULT_NAN: u64 = if cfg!(target_arch = "x86_64") { 0xfff8_0000_0000_0000 } else { 0x7ff8_0000_0000_0000 };

/// The NVRTC options for a kernel file: architecture, language, bit-exact float math, profile.
pub fn compile_options(arch: &str, profile: &KernelProfile) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        // The CPU reference does no FMA, flushes no denormals and divides/square-roots exactly.
        "--fmad=false".to_string(),
        "--ftz=false".to_string(),
        "--prec-div=true".to_string(),
        "--prec-sqrt=true".to_string(),
        "-DLIDAR_KERNELS=1".to_string(),
        format!("-DLK_HOST_DEFAULT_NAN={HOST_DEFAULT_NAN:#x}ull"),
        format!("-DFPS_SLOTS={}u", crate::ops::fps::cuda::EXCHANGE_SLOTS),
    ];
    o.extend(profile.defines());
    o
}

/// Compiles `source` to a CUBIN. On failure the error carries NVRTC's log.
pub fn compile_cubin(name: &str, source: &str, options: &[String]) -> Result<Vec<u8>, GpuError> {
    compile_cubin_with_log(name, source, options).map(|(cubin, _)| cubin)
}

/// Compiles `source` to a CUBIN, returning it with NVRTC's log (warnings). The source may include
/// the registry's [`HEADERS`] by name.
pub fn compile_cubin_with_log(name: &str, source: &str, options: &[String]) -> Result<(Vec<u8>, String), GpuError> {
    if !nvrtc_present() {
        return Err(GpuError::NvrtcMissing);
    }
    let nul = |what: &str| GpuError::Nvrtc(format!("{name}: {what} contains a NUL byte"));
    let src = CString::new(source).map_err(|_| nul("source"))?;
    let cname = CString::new(format!("{name}.cu")).expect("module names have no NUL");
    let header_texts =
        HEADERS.iter().map(|(_, t)| CString::new(*t).map_err(|_| nul("a header"))).collect::<Result<Vec<_>, _>>()?;
    let header_names = HEADERS
        .iter()
        .map(|(n, _)| CString::new(*n).map_err(|_| nul("a header name")))
        .collect::<Result<Vec<_>, _>>()?;
    let texts: Vec<*const std::ffi::c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
    let names: Vec<*const std::ffi::c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
    let mut prog = std::mem::MaybeUninit::<nvrtc_sys::nvrtcProgram>::uninit();
    // SAFETY: NVRTC is present; every pointer is a NUL-terminated string alive for the call (NVRTC
    // copies the sources), `texts` and `names` hold HEADERS.len() entries each.
    unsafe {
        nvrtc_sys::nvrtcCreateProgram(
            prog.as_mut_ptr(),
            src.as_ptr(),
            cname.as_ptr(),
            HEADERS.len() as std::ffi::c_int,
            texts.as_ptr(),
            names.as_ptr(),
        )
    }
    .result()
    .map_err(|e| GpuError::Nvrtc(format!("{name}: nvrtcCreateProgram: {e:?}")))?;
    // SAFETY: initialized by the successful call above.
    let prog = unsafe { prog.assume_init() };
    struct Guard(nvrtc_sys::nvrtcProgram);
    impl Drop for Guard {
        fn drop(&mut self) {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { nvrtc_result::destroy_program(self.0) };
        }
    }
    let guard = Guard(prog);
    // SAFETY: `prog` is live until `guard` drops.
    let compiled = unsafe { nvrtc_result::compile_program(guard.0, options) };
    let log = unsafe { nvrtc_result::get_program_log(guard.0) }
        .map(|raw| {
            let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        })
        .unwrap_or_default();
    if let Err(e) = compiled {
        return Err(GpuError::Compile {
            module: name.to_string(),
            options: options.join(" "),
            log: if log.is_empty() { format!("{e:?}") } else { log },
        });
    }
    let mut size = 0usize;
    // SAFETY: compiled program; out-parameter.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(guard.0, &mut size) }
        .result()
        .map_err(|e| GpuError::Nvrtc(format!("{name}: nvrtcGetCUBINSize: {e:?} (options must name a real sm_XY)")))?;
    if size == 0 {
        return Err(GpuError::Nvrtc(format!("{name}: NVRTC produced no CUBIN (was a compute_XY arch given?)")));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: buffer of the reported size.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(guard.0, cubin.as_mut_ptr() as *mut std::ffi::c_char) }
        .result()
        .map_err(|e| GpuError::Nvrtc(format!("{name}: nvrtcGetCUBIN: {e:?}")))?;
    Ok((cubin, log))
}

/// The cache folder: `$LIDAR_KERNELS_CACHE_DIR`, else `$XDG_CACHE_HOME/lidar_kernels`, else
/// `~/.cache/lidar_kernels` (None when none of these can be formed).
pub fn default_cache_dir() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("LIDAR_KERNELS_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("lidar_kernels")))
        .or_else(|| env("HOME").map(|h| h.join(".cache").join("lidar_kernels")))
}

/// SHA-256 (hex) of everything that determines a CUBIN: the source, the headers it may include
/// (name and text), the architecture, the NVRTC version and the options.
pub fn cache_key(
    source: &str,
    headers: &[(&str, &str)],
    arch: &str,
    nvrtc_version: (i32, i32),
    options: &[String],
) -> String {
    let mut h = Sha256::new();
    // Length-prefixed parts: no two different inputs hash the same byte stream.
    let mut part = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    part(b"lidar_kernels cubin v2");
    part(source.as_bytes());
    part(&(headers.len() as u64).to_le_bytes());
    for (name, text) in headers {
        part(name.as_bytes());
        part(text.as_bytes());
    }
    part(arch.as_bytes());
    part(format!("{}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
    for o in options {
        part(o.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a CUBIN came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CubinOrigin {
    CacheHit,
    Compiled,
}

/// The on-disk cubin cache (or no cache when `dir` is None).
#[derive(Debug, Clone)]
pub struct CubinCache {
    pub dir: Option<PathBuf>,
}

impl CubinCache {
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir }
    }

    fn path(&self, module: &str, arch: &str, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{module}-{arch}-{key}.cubin")))
    }

    /// The CUBIN for `kernel`, from the cache or freshly compiled (then stored).
    pub fn get(
        &self,
        kernel: &KernelSource,
        arch: &str,
        nvrtc_version: (i32, i32),
        options: &[String],
    ) -> Result<(Vec<u8>, CubinOrigin), GpuError> {
        let key = cache_key(kernel.source, HEADERS, arch, nvrtc_version, options);
        let path = self.path(kernel.module, arch, &key);
        if let Some(p) = &path {
            if let Ok(bytes) = std::fs::read(p) {
                if is_elf(&bytes) {
                    tracing::debug!(module = kernel.module, arch, path = %p.display(), "cubin cache hit");
                    return Ok((bytes, CubinOrigin::CacheHit));
                }
                tracing::warn!(path = %p.display(), "ignoring a corrupt cached cubin");
            }
        }
        let t = Instant::now();
        let (cubin, log) = compile_cubin_with_log(kernel.module, kernel.source, options)?;
        tracing::debug!(
            module = kernel.module,
            arch,
            ms = t.elapsed().as_secs_f64() * 1e3,
            bytes = cubin.len(),
            "compiled with NVRTC (cache miss)"
        );
        if !log.is_empty() {
            tracing::debug!(module = kernel.module, "NVRTC log: {log}");
        }
        if let Some(p) = &path {
            if let Err(e) = store_atomic(p, &cubin) {
                tracing::warn!(path = %p.display(), "cannot write the cubin cache: {e}");
            }
        }
        Ok((cubin, CubinOrigin::Compiled))
    }
}

fn is_elf(b: &[u8]) -> bool {
    b.len() > 4 && &b[..4] == b"\x7fELF"
}

fn store_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("cache files live in a folder");
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("cubin"),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// One compilation of `nvrtc-check`.
#[derive(Debug, Clone)]
pub struct NvrtcRow {
    pub file: String,
    pub profile: String,
    pub arch: String,
    pub ok: bool,
    pub ms: f64,
    pub cubin_bytes: usize,
    pub log: String,
}

/// The result of compiling every kernel file with every profile for every target arch.
#[derive(Debug, Clone)]
pub struct NvrtcReport {
    pub nvrtc_version: (i32, i32),
    pub rows: Vec<NvrtcRow>,
}

impl NvrtcReport {
    pub fn all_ok(&self) -> bool {
        self.rows.iter().all(|r| r.ok)
    }
    pub fn failures(&self) -> impl Iterator<Item = &NvrtcRow> {
        self.rows.iter().filter(|r| !r.ok)
    }
}

impl fmt::Display for NvrtcReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "NVRTC {}.{}", self.nvrtc_version.0, self.nvrtc_version.1)?;
        writeln!(f, "{:<20} {:<8} {:<6} {:<4} {:>8} {:>8}  log", "file", "profile", "arch", "ok", "ms", "cubin")?;
        for r in &self.rows {
            let log = r.log.lines().next().unwrap_or("");
            writeln!(
                f,
                "{:<20} {:<8} {:<6} {:<4} {:>8.1} {:>8}  {}",
                r.file,
                r.profile,
                r.arch,
                if r.ok { "ok" } else { "FAIL" },
                r.ms,
                r.cubin_bytes,
                log
            )?;
        }
        let failed = self.rows.iter().filter(|r| !r.ok).count();
        write!(f, "{} compilations, {} failed", self.rows.len(), failed)?;
        for r in self.failures() {
            write!(f, "\n--- {} {} {} ---\n{}", r.file, r.profile, r.arch, r.log)?;
        }
        Ok(())
    }
}

/// The architectures every kernel must compile for: Xavier, Orin, Hopper.
pub const CHECK_ARCHS: [&str; 3] = ["sm_72", "sm_87", "sm_90"];

/// Compiles every kernel file with every built-in profile for sm_72, sm_87 and sm_90 (needs NVRTC
/// only, no GPU). Compilation failures are rows with `ok: false`; a missing NVRTC is an error.
pub fn nvrtc_check() -> Result<NvrtcReport, GpuError> {
    nvrtc_check_with(KERNELS, &KernelProfile::builtins()?, &CHECK_ARCHS)
}

pub fn nvrtc_check_with(
    kernels: &[KernelSource],
    profiles: &[KernelProfile],
    archs: &[&str],
) -> Result<NvrtcReport, GpuError> {
    let nvrtc_version = nvrtc_version()?;
    let mut rows = Vec::new();
    for k in kernels {
        for p in profiles {
            for arch in archs {
                let options = compile_options(arch, p);
                let t = Instant::now();
                let res = compile_cubin_with_log(k.module, k.source, &options);
                let ms = t.elapsed().as_secs_f64() * 1e3;
                let (ok, cubin_bytes, log) = match res {
                    Ok((c, log)) => (true, c.len(), log),
                    Err(GpuError::Compile { log, .. }) => (false, 0, log),
                    Err(e) => (false, 0, e.to_string()),
                };
                rows.push(NvrtcRow {
                    file: k.file.to_string(),
                    profile: p.name.clone(),
                    arch: arch.to_string(),
                    ok,
                    ms,
                    cubin_bytes,
                    log,
                });
            }
        }
    }
    Ok(NvrtcReport { nvrtc_version, rows })
}
