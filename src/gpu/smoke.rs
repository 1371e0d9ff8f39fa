//! A GPU smoke test the CLI (or `examples/gpu_smoke.rs`) can run on a machine with a GPU:
//! context creation, NVRTC compilation through the cubin cache (twice: the second start must be all
//! cache hits), and the gather of real Ouster scans in several layouts compared with the CPU
//! reference bit for bit, then steady-state timing with pool-growth checks.

use super::{upload_and_gather, GpuContext, GpuError, GpuOptions, LibProbe, ProfileChoice};
use crate::cloud::{gather, Cloud, Datatype, Header, PointCloud2, PointField, PointLayout};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// What the smoke test found. `ok` is false when any check failed (details in `log`).
#[derive(Debug, Clone, Default)]
pub struct SmokeReport {
    pub ok: bool,
    pub log: String,
}

macro_rules! say {
    ($rep:expr, $($arg:tt)*) => {{
        let line = format!($($arg)*);
        println!("{line}");
        let _ = writeln!($rep.log, "{line}");
    }};
}

/// Compares the GPU result of `msg` with the CPU `gather` bit for bit; returns a mismatch text.
pub fn compare_with_cpu(ctx: &GpuContext, msg: &PointCloud2<'_>) -> Result<Result<String, String>, GpuError> {
    let cpu = gather(msg)?;
    let dev = upload_and_gather(ctx, msg)?;
    let host = dev.to_host()?;
    if host.names() != cpu.cloud.names() {
        return Ok(Err(format!("names differ: gpu {:?} cpu {:?}", host.names(), cpu.cloud.names())));
    }
    if dev.dropped_non_finite != cpu.dropped_non_finite || host.len() != cpu.cloud.len() {
        return Ok(Err(format!(
            "counts differ: gpu {} kept / {} dropped, cpu {} / {}",
            host.len(),
            dev.dropped_non_finite,
            cpu.cloud.len(),
            cpu.dropped_non_finite
        )));
    }
    for (c, (g, r)) in host.columns().iter().zip(cpu.cloud.columns()).enumerate() {
        if let Some(i) = g.iter().zip(r).position(|(a, b)| a.to_bits() != b.to_bits()) {
            return Ok(Err(format!(
                "channel '{}' differs first at point {i}: gpu {:?} (0x{:08x}) cpu {:?} (0x{:08x})",
                host.names()[c],
                g[i],
                g[i].to_bits(),
                r[i],
                r[i].to_bits()
            )));
        }
    }
    Ok(Ok(format!(
        "{} points -> {} kept, {} dropped, {} channels [{}]",
        msg.num_points(),
        host.len(),
        dev.dropped_non_finite,
        host.num_channels(),
        host.names().join(",")
    )))
}

/// An organized, big-endian, padded message with every datatype, unaligned fields, a multi-element
/// field, a duplicate name, float64 values that need rounding or overflow float32, and NaN payloads.
pub fn exotic_message(scan: &Cloud, height: u32) -> PointCloud2<'static> {
    use Datatype::*;
    let f = |n: &str, o: u32, d: Datatype| PointField::new(n, o, d);
    let mut fields = vec![
        f("intensity", 0, Float64),
        f("x", 8, Float32),
        f("y", 12, Float64),
        f("z", 20, Float32),
        f("ring", 24, Uint16),
        f("t", 26, Int32),
        f("reflectivity", 30, Uint8),
        f("i8v", 31, Int8),
        f("i16v", 32, Int16),
        PointField { name: "normal".into(), offset: 34, datatype: Float32 as u8, count: 3 },
        f("u32v", 46, Uint32),
        f("x", 50, Float32), // duplicate name: the first one wins
        f("u16v", 54, Uint16),
        f("f32nan", 56, Float32),
    ];
    let ring = fields.remove(4); // field order need not start with x
    fields.insert(0, ring);
    let point_step = 61u32;
    let width = (scan.len() as u32 / height).max(1);
    let n = (width * height) as usize;
    let row_step = width * point_step + 7;
    // The last row stops right after its last point (no trailing padding).
    let mut data = vec![0u8; (row_step * (height - 1) + width * point_step) as usize];
    let (xs, ys, zs) = (scan.x(), scan.y(), scan.z());
    let refl = scan.channel("reflectivity").unwrap_or(xs);
    let ring = scan.channel("ring").unwrap_or(xs);
    let t = scan.channel("t").unwrap_or(xs);
    for i in 0..n {
        let j = i % scan.len();
        let base = (i / width as usize) * row_step as usize + (i % width as usize) * point_step as usize;
        let p = &mut data[base..base + point_step as usize];
        let mut put = |off: usize, b: &[u8]| p[off..off + b.len()].copy_from_slice(b);
        let intensity = match i % 313 {
            0 => f64::from_bits(0x7ff4_0000_dead_beef), // signalling NaN with payload
            1 => f64::from_bits(0xfff8_0000_0000_0001), // negative quiet NaN
            _ => refl[j] as f64 * 1.37 + 1e-12 * (i % 11) as f64,
        };
        put(0, &intensity.to_be_bytes());
        let x = if i % 997 == 5 { f32::NAN } else { xs[j] };
        put(8, &x.to_be_bytes());
        let y = match i % 1000 {
            7 => 1e39,                                  // overflows float32: inf, dropped
            8 => -1e-46,                                // underflows to -0.0
            9 => 1.5e-40,                               // float32 subnormal
            _ => ys[j] as f64 + 1e-9 * (i % 7) as f64, // needs rounding
        };
        put(12, &y.to_be_bytes());
        let z = if i % 1511 == 3 { f32::NEG_INFINITY } else { zs[j] };
        put(20, &z.to_be_bytes());
        put(24, &(ring[j] as u16).to_be_bytes());
        put(26, &(((t[j] as f64) * 1e9) as i32 - 50_000_000 + i as i32 * 977).to_be_bytes());
        put(30, &(refl[j].clamp(0.0, 255.0) as u8).to_be_bytes());
        put(31, &((ring[j] as i32 - 64) as i8).to_be_bytes());
        put(32, &((xs[j] * 1000.0) as i16).to_be_bytes());
        for k in 0..3 {
            put(34 + 4 * k, &(k as f32 + 0.5).to_be_bytes());
        }
        put(46, &(16_777_217u32.wrapping_add((i as u32).wrapping_mul(2_654_435_761) >> 4)).to_be_bytes());
        put(50, &12345.0f32.to_be_bytes());
        put(54, &((i * 37) as u16).to_be_bytes());
        let f32nan = match i % 17 {
            0 => f32::from_bits(0x7fa0_1234),
            1 => f32::from_bits(0xffc0_0001),
            _ => zs[j] * 0.5,
        };
        put(56, &f32nan.to_be_bytes());
    }
    PointCloud2 {
        header: Header::default(),
        height,
        width,
        fields,
        is_bigendian: true,
        point_step,
        row_step,
        data: Cow::Owned(data),
        is_dense: false,
    }
}

/// A packed float32 xyzi message of `copies` concatenated scans with NaN/inf sprinkled in.
pub fn big_message(scan: &Cloud, copies: usize) -> PointCloud2<'static> {
    let n = scan.len() * copies;
    let mut x = Vec::with_capacity(n);
    let mut y = Vec::with_capacity(n);
    let mut z = Vec::with_capacity(n);
    let mut inten = Vec::with_capacity(n);
    let refl = scan.channel("reflectivity").unwrap_or(scan.x());
    for i in 0..n {
        let j = i % scan.len();
        x.push(if i % 101 == 0 { f32::NAN } else { scan.x()[j] + (i / scan.len()) as f32 });
        y.push(if i % 4099 == 17 { f32::INFINITY } else { scan.y()[j] });
        z.push(scan.z()[j]);
        inten.push(refl[j]);
    }
    let cloud = Cloud::from_xyz(x, y, z).with_channel("intensity", inten);
    PointCloud2::from_cloud(Header::default(), &cloud, &PointLayout::packed_f32(&["x", "y", "z", "intensity"]))
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Runs the smoke test. `data_dir` holds `os1-128_scan0.bin`; `cache_dir` is emptied of cubins
/// first so that the first start compiles and the second must hit. `quick` skips the large cases
/// and the timing loop (for compute-sanitizer runs).
pub fn run_smoke(data_dir: &Path, cache_dir: &Path, quick: bool) -> Result<SmokeReport, GpuError> {
    let mut rep = SmokeReport { ok: true, log: String::new() };
    let probe = LibProbe::probe();
    say!(rep, "libraries: driver={} nvrtc={}", probe.driver, probe.nvrtc);
    if !probe.driver {
        return Err(GpuError::DriverMissing);
    }
    if !probe.nvrtc {
        return Err(GpuError::NvrtcMissing);
    }
    if let Ok(rd) = std::fs::read_dir(cache_dir) {
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "cubin") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let opts = |profile: ProfileChoice| GpuOptions {
        ordinal: 0,
        profile,
        cache_dir: Some(cache_dir.to_path_buf()),
        no_cache: false,
    };

    // 1. Two starts through the cache: the first compiles, the second loads cubins only.
    let mut ctx = None;
    for start in 1..=2 {
        let t = Instant::now();
        let c = GpuContext::new(opts(ProfileChoice::Auto))?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        say!(
            rep,
            "start {start}: {} (cc {}.{}, {} SMs, {}), NVRTC {}.{}, profile {}, {:.1} ms, cache hits {}/{}",
            c.device_name,
            c.compute_capability.0,
            c.compute_capability.1,
            c.sm_count,
            c.arch,
            c.nvrtc_version.0,
            c.nvrtc_version.1,
            c.profile.name,
            ms,
            c.cache_hits(),
            c.module_loads.len()
        );
        for m in &c.module_loads {
            say!(rep, "  module {:<10} {:?} {:.1} ms, {} B cubin", m.module, m.origin, m.ms, m.cubin_bytes);
        }
        let want = if start == 1 { 0 } else { c.module_loads.len() };
        if c.cache_hits() != want {
            rep.ok = false;
            say!(rep, "FAIL: start {start} expected {want} cache hits");
        }
        ctx = Some(c);
    }
    let ctx = ctx.unwrap();

    // 2. Correctness against the CPU reference.
    let scan_path = data_dir.join("os1-128_scan0.bin");
    let scan = crate::bag::sample::load_ouster_bin(&scan_path)
        .map_err(|e| GpuError::Unsupported(format!("{}: {e}", scan_path.display())))?;
    let ouster = PointCloud2::from_cloud(Header::default(), &scan, &PointLayout::ouster());
    let mut nan_scan_x = scan.x().to_vec();
    let mut nan_scan_z = scan.z().to_vec();
    for i in (0..nan_scan_x.len()).step_by(97) {
        nan_scan_x[i] = f32::NAN;
    }
    for i in (5..nan_scan_z.len()).step_by(1009) {
        nan_scan_z[i] = f32::INFINITY;
    }
    let mut nan_cloud = Cloud::from_xyz(nan_scan_x, scan.y().to_vec(), nan_scan_z);
    for name in ["reflectivity", "ring", "t"] {
        nan_cloud = nan_cloud.with_channel(name, scan.channel(name).unwrap().to_vec());
    }
    let ouster_nan = PointCloud2::from_cloud(Header::default(), &nan_cloud, &PointLayout::ouster());
    let exotic = exotic_message(&scan, 127);
    let tiny = |pts: &[[f32; 3]]| {
        PointCloud2::from_cloud(Header::default(), &Cloud::from_points(pts), &PointLayout::packed_f32(&["x", "y", "z"]))
    };
    let all_nan: Vec<[f32; 3]> = (0..3000).map(|i| [f32::NAN, i as f32, 0.0]).collect();
    let mut cases: Vec<(&str, PointCloud2<'static>)> = vec![
        ("ouster LE 48B", ouster.clone()),
        ("ouster LE 48B + NaN/inf", ouster_nan),
        ("exotic BE organized padded", exotic),
        ("empty", tiny(&[])),
        ("one NaN point", tiny(&[[f32::NAN, 0.0, 0.0]])),
        ("three points", tiny(&[[1.0, 2.0, 3.0], [f32::NAN, 1.0, 1.0], [4.0, 5.0, 6.0]])),
        ("3000 all NaN", tiny(&all_nan)),
    ];
    if !quick {
        cases.push(("20 scans packed xyzi", big_message(&scan, 20)));
    }
    let profiles: Vec<ProfileChoice> = if quick {
        vec![ProfileChoice::Auto]
    } else {
        vec![ProfileChoice::Auto, ProfileChoice::Named("orin".into()), ProfileChoice::Named("xavier".into())]
    };
    for (pi, profile) in profiles.into_iter().enumerate() {
        let other;
        let c = if pi == 0 {
            &ctx
        } else {
            other = GpuContext::new(opts(profile))?;
            &other
        };
        say!(
            rep,
            "profile {} (gather block {} x {} items):",
            c.profile.name,
            c.profile.block_size.gather,
            c.profile.items_per_thread.gather
        );
        for (name, msg) in &cases {
            match compare_with_cpu(c, msg)? {
                Ok(s) => say!(rep, "  ok   {name}: {s}"),
                Err(s) => {
                    rep.ok = false;
                    say!(rep, "  FAIL {name}: {s}");
                }
            }
        }
    }

    // 3. Steady state: repeated frames allocate nothing; per-stage times.
    if !quick {
        for (name, msg) in [("ouster 107k pts", &ouster), ("20 scans 2.15M pts", &cases[7].1)] {
            let mut timer = ctx.stage_timer();
            let (mut h2d, mut gk, mut wall) = (Vec::new(), Vec::new(), Vec::new());
            let mut before = None;
            for frame in 0..60 {
                if frame == 10 {
                    before = Some(ctx.pool_stats());
                }
                let t = Instant::now();
                let dev = super::gather::upload_and_gather_timed(&ctx, msg, Some(&mut timer))?;
                let w = t.elapsed().as_secs_f64() * 1e3;
                let stages = timer.finish()?;
                drop(dev);
                if frame >= 10 {
                    wall.push(w);
                    for (s, ms) in stages {
                        if s == "h2d" {
                            h2d.push(ms as f64)
                        } else {
                            gk.push(ms as f64)
                        }
                    }
                }
            }
            let after = ctx.pool_stats();
            say!(
                rep,
                "timing {name} ({} B): h2d (host copy into pinned slot + DMA) {:.3} ms, gather kernel {:.3} ms, upload_and_gather wall {:.3} ms (medians of 50)",
                msg.data.len(),
                median(&mut h2d),
                median(&mut gk),
                median(&mut wall)
            );
            if Some(after) != before {
                rep.ok = false;
                say!(rep, "FAIL: pools grew at steady state: {before:?} -> {after:?}");
            } else {
                say!(rep, "  pools steady over 50 frames: {after:?}");
            }
        }
    }
    say!(rep, "{}", if rep.ok { "SMOKE OK" } else { "SMOKE FAILED" });
    Ok(rep)
}
