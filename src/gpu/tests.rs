//! Tests that run without a GPU (NVRTC tests run only where libnvrtc loads, else print a skip line).

use super::nvrtc::{cache_key, compile_cubin, compile_options, nvrtc_check, nvrtc_present, CubinCache, CubinOrigin};
use super::profile::{auto_profile_name, KernelProfile, ProfileChoice, BUILTIN_PROFILES};
use super::*;

const NO_DRIVER: LibProbe = LibProbe { driver: false, nvrtc: true };
const NO_NVRTC: LibProbe = LibProbe { driver: true, nvrtc: false };

#[test]
fn auto_without_driver_is_cpu() {
    let r = select_backend_with(BackendKind::Auto, GpuOptions::default(), NO_DRIVER);
    assert!(matches!(r, Ok(None)), "{r:?}");
    let r = select_backend_with(BackendKind::Auto, GpuOptions::default(), NO_NVRTC);
    assert!(matches!(r, Ok(None)), "{r:?}");
}

#[test]
fn cuda_without_driver_names_libcuda() {
    let e = select_backend_with(BackendKind::Cuda, GpuOptions::default(), NO_DRIVER).unwrap_err();
    assert!(e.to_string().contains("libcuda"), "{e}");
    let e = select_backend_with(BackendKind::Cuda, GpuOptions::default(), NO_NVRTC).unwrap_err();
    assert!(e.to_string().contains("libnvrtc"), "{e}");
}

#[test]
fn cpu_backend_touches_nothing() {
    assert!(matches!(select_backend(BackendKind::Cpu, ProfileChoice::Auto), Ok(None)));
}

/// On this machine for real: no panic whatever is installed.
#[test]
fn real_probe_never_panics() {
    let probe = LibProbe::probe();
    let r = select_backend(BackendKind::Auto, ProfileChoice::Auto);
    if !probe.driver {
        assert!(matches!(r, Ok(None)));
        let e = select_backend(BackendKind::Cuda, ProfileChoice::Auto).unwrap_err();
        assert!(matches!(e, GpuError::DriverMissing), "{e}");
        // GpuContext::new directly must error too, not panic.
        assert!(matches!(GpuContext::new(GpuOptions::default()), Err(GpuError::DriverMissing)));
    }
}

#[test]
fn backend_kind_serde_lowercase() {
    assert_eq!(serde_yaml::to_string(&BackendKind::Cuda).unwrap().trim(), "cuda");
    let k: BackendKind = serde_yaml::from_str("auto").unwrap();
    assert_eq!(k, BackendKind::Auto);
    assert_eq!("CPU".parse::<BackendKind>().unwrap(), BackendKind::Cpu);
    assert!("tpu".parse::<BackendKind>().is_err());
}

#[test]
fn builtin_profiles_parse_and_validate() {
    let all = KernelProfile::builtins().unwrap();
    assert_eq!(all.len(), 3);
    for ((name, _), p) in BUILTIN_PROFILES.iter().zip(&all) {
        assert_eq!(&p.name, name);
        assert!(!p.description.is_empty());
        assert!(p.defines().iter().any(|d| d.starts_with("-DGATHER_BLOCK=")));
    }
    assert_eq!(KernelProfile::builtin("orin").unwrap().items_per_thread.gather, 8);
    assert!(KernelProfile::builtin("nope").unwrap_err().to_string().contains("nope"));
}

#[test]
fn auto_profile_from_device() {
    assert_eq!(auto_profile_name((7, 2), 8), "xavier");
    assert_eq!(auto_profile_name((8, 7), 16), "orin");
    assert_eq!(auto_profile_name((9, 0), 132), "x86_64");
    assert_eq!(auto_profile_name((8, 6), 84), "x86_64");
    let device = |cc: (i32, i32)| TunedFor::of("a GPU", cc, (12, 9));
    assert_eq!(ProfileChoice::Auto.resolve(&device((8, 7)), 8).unwrap().name, "orin");
    assert_eq!("xavier".parse::<ProfileChoice>().unwrap(), ProfileChoice::Named("xavier".into()));
    assert!(matches!("config/targets/orin.yaml".parse::<ProfileChoice>().unwrap(), ProfileChoice::Path(_)));
    let p = ProfileChoice::Path(concat!(env!("CARGO_MANIFEST_DIR"), "/config/targets/xavier.yaml").into());
    assert_eq!(p.resolve(&device((9, 0)), 132).unwrap().name, "xavier");
}

/// A tuned profile holds on its own device only; elsewhere its target's built-in profile runs.
#[test]
fn tuned_profiles_hold_on_their_device_only() {
    let here = TunedFor::of("NVIDIA H200", (9, 0), (13, 0));
    let mut tuned = KernelProfile::builtin("x86_64").unwrap();
    tuned.block_size.fps = 256;
    tuned.tuned_for = Some(here.clone());
    let dir = std::env::temp_dir().join(format!("lk_tuned_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("h200.yaml");
    std::fs::write(&path, serde_yaml::to_string(&tuned).unwrap()).unwrap();
    let choice = ProfileChoice::Path(path);
    assert_eq!(choice.resolve(&here, 132).unwrap(), tuned);
    for other in [
        TunedFor::of("NVIDIA H100", (9, 0), (13, 0)),
        TunedFor::of("NVIDIA H200", (9, 0), (12, 9)),
        TunedFor::of("NVIDIA H200", (8, 9), (13, 0)),
    ] {
        assert_eq!(choice.resolve(&other, 132).unwrap(), KernelProfile::builtin("x86_64").unwrap(), "{other:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn with_replaced(from: &str, to: &str) -> Result<KernelProfile, GpuError> {
    let base = BUILTIN_PROFILES[0].1;
    assert!(base.contains(from), "test setup: '{from}' not in the profile");
    KernelProfile::from_yaml(&base.replacen(from, to, 1))
}

#[test]
fn bad_profile_values_name_the_key() {
    let cases = [
        ("gather: 256", "gather: 100", "block_size.gather"),
        ("fps: 1024", "fps: 2048", "block_size.fps"),
        ("neighbors: 256", "neighbors: 48", "block_size.neighbors"),
        ("  gather: 4", "  gather: 0", "items_per_thread.gather"),
        ("hash_load_factor: 0.5", "hash_load_factor: 0.95", "hash_load_factor"),
        ("points: 262144", "points: 0", "pools.points"),
        ("pinned_slots: 3", "pinned_slots: 1", "pools.pinned_slots"),
        ("name: x86_64", "name: ''", "name"),
    ];
    for (from, to, key) in cases {
        let e = with_replaced(from, to).unwrap_err();
        match &e {
            GpuError::Profile { key: k, .. } => assert_eq!(k, key, "{e}"),
            other => panic!("{from} -> {to}: {other}"),
        }
        assert!(e.to_string().contains(key), "{e}");
    }
    // Unknown and missing keys: serde names them.
    let e = with_replaced("hash_load_factor: 0.5", "hash_load_factor: 0.5\nhash_load_factors: 0.5").unwrap_err();
    assert!(e.to_string().contains("hash_load_factors"), "{e}");
    let e = with_replaced("hash_load_factor: 0.5", "").unwrap_err();
    assert!(e.to_string().contains("hash_load_factor"), "{e}");
    // Keys no kernel and no host code reads are gone: a profile naming one is refused.
    for (after, gone) in [
        ("hash_load_factor: 0.5", "fps_tile: 2048"),
        ("hash_load_factor: 0.5", "nms_tile: 64"),
        ("  neighbors: 256", "  nms: 64"),
        ("  points: 262144", "  voxels: 160000"),
        ("  points: 262144", "  boxes: 8192"),
    ] {
        let e = with_replaced(after, &format!("{after}\n{gone}")).unwrap_err();
        let key = gone.trim().split(':').next().unwrap();
        assert!(e.to_string().contains(key), "{gone}: {e}");
    }
    let e = with_replaced("gather: 256", "gather: -1").unwrap_err();
    assert!(e.to_string().contains("gather"), "{e}");
}

#[test]
fn cache_key_changes_with_each_input() {
    let p = KernelProfile::builtin("x86_64").unwrap();
    let o = compile_options("sm_90", &p);
    let h: &[(&str, &str)] = &[("common.cuh", "int a;")];
    let k = cache_key("src", h, "sm_90", (12, 9), &o);
    assert_eq!(k.len(), 64);
    assert_eq!(k, cache_key("src", h, "sm_90", (12, 9), &o), "deterministic");
    assert_ne!(k, cache_key("src ", h, "sm_90", (12, 9), &o), "source");
    assert_ne!(k, cache_key("src", &[("common.cuh", "int b;")], "sm_90", (12, 9), &o), "header text");
    assert_ne!(k, cache_key("src", &[("other.cuh", "int a;")], "sm_90", (12, 9), &o), "header name");
    assert_ne!(k, cache_key("src", &[], "sm_90", (12, 9), &o), "no header");
    assert_ne!(k, cache_key("src", h, "sm_87", (12, 9), &o), "arch");
    assert_ne!(k, cache_key("src", h, "sm_90", (12, 8), &o), "nvrtc version");
    assert_ne!(k, cache_key("src", h, "sm_90", (13, 0), &o), "nvrtc major");
    let orin = KernelProfile::builtin("orin").unwrap();
    assert_ne!(k, cache_key("src", h, "sm_90", (12, 9), &compile_options("sm_90", &orin)), "profile");
    let mut p2 = p.clone();
    p2.block_size.neighbors = 128;
    assert_ne!(k, cache_key("src", h, "sm_90", (12, 9), &compile_options("sm_90", &p2)), "one profile value");
    // Concatenation ambiguity: parts are length-prefixed.
    assert_ne!(cache_key("ab", &[], "c", (1, 0), &[]), cache_key("a", &[], "bc", (1, 0), &[]));
    assert_ne!(cache_key("a", &[("b", "c")], "d", (1, 0), &[]), cache_key("a", &[("bc", "")], "d", (1, 0), &[]));
}

/// The NaN the kernels reproduce for inf - inf in their f64 sums (`lk_dadd_host`) is the one this
/// CPU's own addition gives.
#[test]
fn host_default_nan_is_this_cpus() {
    let o = compile_options("sm_87", &KernelProfile::builtin("orin").unwrap());
    let inf = std::hint::black_box(f64::INFINITY);
    let bits = (inf + -inf).to_bits();
    assert!(o.contains(&format!("-DLK_HOST_DEFAULT_NAN={bits:#x}ull")), "{bits:#x} not in {o:?}");
}

#[test]
fn compile_options_are_bit_exact() {
    let o = compile_options("sm_72", &KernelProfile::builtin("xavier").unwrap());
    for want in [
        "--gpu-architecture=sm_72",
        "-std=c++17",
        "--fmad=false",
        "--ftz=false",
        "-DGATHER_BLOCK=256",
        "-DGATHER_ITEMS=8",
    ] {
        assert!(o.iter().any(|x| x == want), "{want} missing from {o:?}");
    }
    // Only values a kernel reads are defines (the hash load factor is read on the host).
    for gone in ["-DHASH_LOAD_FACTOR", "-DFPS_TILE", "-DNMS_TILE", "-DNMS_BLOCK"] {
        assert!(!o.iter().any(|x| x.starts_with(gone)), "{gone} in {o:?}");
    }
    for d in KernelProfile::builtin("xavier").unwrap().defines() {
        let name = d.trim_start_matches("-D").split('=').next().unwrap().to_string();
        assert!(KERNELS.iter().any(|k| k.source.contains(&name)), "{name}: no kernel reads it");
    }
}

#[test]
fn kernel_registry_lists_every_file() {
    let names: Vec<_> = KERNELS.iter().map(|k| k.module).collect();
    assert_eq!(names, ["gather", "voxel", "fps", "neighbors", "nms", "detect"]);
    assert!(kernels::kernel("gather").unwrap().source.contains("gather_compact"));
    let files: Vec<String> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/cuda"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let cu = files.iter().filter(|f| f.ends_with(".cu")).count();
    assert_eq!(cu, KERNELS.len(), "every cuda/*.cu file must be registered in src/gpu/kernels.rs");
    let cuh: Vec<&String> = files.iter().filter(|f| !f.ends_with(".cu")).collect();
    assert_eq!(cuh.len(), kernels::HEADERS.len(), "every other file in cuda/ is a registered header: {cuh:?}");
    for f in cuh {
        assert!(kernels::HEADERS.iter().any(|(n, _)| n == f), "{f} is not in kernels::HEADERS");
    }
    for k in KERNELS {
        assert!(k.source.contains("#include \"common.cuh\""), "{} does not include common.cuh", k.file);
    }
}

#[test]
fn gather_params_match_the_cuda_struct() {
    // 8 scalars + 2 arrays of 32 u32 = 288 bytes, no padding.
    assert_eq!(std::mem::size_of::<gather::GatherParams>(), 8 * 4 + 2 * 32 * 4);
    let header = kernels::HEADERS.iter().find(|(n, _)| *n == "common.cuh").unwrap().1;
    assert!(header.contains(&format!("#define LK_MAX_CHANNELS {}", gather::MAX_CHANNELS)));
    assert!(header.contains("static_assert(sizeof(GatherParams) == 288"));
}

fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc_present() {
        true
    } else {
        println!("SKIP {test}: libnvrtc not loadable (run scripts/install-nvrtc.sh and set LD_LIBRARY_PATH)");
        false
    }
}

#[test]
fn nvrtc_check_all_archs() {
    if !nvrtc_or_skip("nvrtc_check_all_archs") {
        return;
    }
    let report = nvrtc_check().unwrap();
    println!("{report}");
    assert_eq!(report.rows.len(), KERNELS.len() * 3 * 3);
    assert!(report.all_ok(), "{report}");
}

#[test]
fn nvrtc_failure_carries_the_log() {
    if !nvrtc_or_skip("nvrtc_failure_carries_the_log") {
        return;
    }
    let o = compile_options("sm_87", &KernelProfile::builtin("orin").unwrap());
    let e = compile_cubin("broken", "extern \"C\" __global__ void k() { this_is_not_declared(); }", &o).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("this_is_not_declared") && text.contains("broken"), "{text}");
    // A block size the kernel refuses at compile time (#error), with the log naming it.
    let src = kernels::kernel("gather").unwrap().source;
    let bad_only: Vec<String> = o
        .iter()
        .map(|x| if x.starts_with("-DGATHER_BLOCK=") { "-DGATHER_BLOCK=48".to_string() } else { x.clone() })
        .collect();
    let e = compile_cubin("gather", src, &bad_only).unwrap_err().to_string();
    assert!(e.contains("GATHER_BLOCK must be a multiple of 32"), "{e}");
}

#[test]
fn cubin_cache_second_get_is_a_hit() {
    if !nvrtc_or_skip("cubin_cache_second_get_is_a_hit") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("lidar_kernels_cache_test_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = CubinCache::new(Some(dir.clone()));
    let k = kernels::kernel("gather").unwrap();
    let v = super::nvrtc::nvrtc_version().unwrap();
    let o = compile_options("sm_87", &KernelProfile::builtin("orin").unwrap());
    let (a, oa) = cache.get(k, "sm_87", v, &o).unwrap();
    let (b, ob) = cache.get(k, "sm_87", v, &o).unwrap();
    assert_eq!((oa, ob), (CubinOrigin::Compiled, CubinOrigin::CacheHit));
    assert_eq!(a, b);
    assert_eq!(&a[..4], b"\x7fELF", "a CUBIN, not PTX");
    // Another profile value (x86_64: 4 gather items per thread, orin 8): another entry.
    let o2 = compile_options("sm_87", &KernelProfile::builtin("x86_64").unwrap());
    assert_eq!(cache.get(k, "sm_87", v, &o2).unwrap().1, CubinOrigin::Compiled);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn launcher_param_and_size_errors_are_backend_neutral_op_errors() {
    use crate::ops::backend::OpError;
    use crate::ops::ParamError;
    match OpError::from(GpuError::from(ParamError::new("k", 0, ">= 1"))) {
        OpError::Param(e) => assert_eq!(e, ParamError::new("k", 0, ">= 1")),
        e => panic!("{e:?}"),
    }
    let big = GpuError::TooLarge { what: "FPS points (32-bit indices)", value: 1 << 33, limit: u32::MAX as u64 - 1 };
    assert!(big.to_string().contains("FPS points") && big.to_string().contains("8589934592"), "{big}");
    match OpError::from(big) {
        OpError::TooLarge { what, value, limit } => {
            assert_eq!((what, value, limit), ("FPS points (32-bit indices)", 1 << 33, u32::MAX as u64 - 1))
        }
        e => panic!("{e:?}"),
    }
    let e = OpError::from(GpuError::NoResult { op: "hard_to_host", result: "hard voxels" });
    assert!(matches!(e, OpError::Device(GpuError::NoResult { .. })), "{e:?}");
    assert!(e.to_string().contains("hard_to_host: no hard voxels on the device"), "{e}");
}

/// Every profile file shipped in config/targets/ (the built-ins and tuned ones) loads and validates.
#[test]
fn every_shipped_profile_file_is_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config/targets");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            KernelProfile::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 4, "{n} profiles in {dir}");
}
