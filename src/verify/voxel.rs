//! Voxel operators: GPU ([`crate::ops::voxel::cuda`]) against the CPU reference, and their
//! benchmarks on the W1 workloads.

use super::report::{BenchRow, CheckRow, Rng};
use super::VerifyError;
use crate::cloud::{Cloud, CloudMessage, Header, PointCloud2, PointLayout};
use crate::gpu::{DeviceCloud, GpuContext, GpuError, StageTimer};
use crate::ops::voxel::cuda::{voxel_grid_downsample, GpuVoxelizer};
use crate::ops::voxel::{
    DynamicVoxels, FeaturesDtype, FeaturesLayout, HardVoxelParams, HardVoxels, PublishedHardVoxels, VoxelGrid,
};
use std::path::Path;

/// The W1 "pillars" configuration (spconv PointToVoxel peer workload).
pub fn w1_pillars() -> HardVoxelParams {
    HardVoxelParams {
        grid: VoxelGrid { voxel_size: [0.16, 0.16, 10.0], point_cloud_range: [-51.2, -51.2, -5.0, 51.2, 51.2, 5.0] },
        max_points_per_voxel: 32,
        max_voxels: 60000,
    }
}

/// The W1 "voxels" configuration.
pub fn w1_voxels() -> HardVoxelParams {
    HardVoxelParams {
        grid: VoxelGrid { voxel_size: [0.1, 0.1, 0.2], point_cloud_range: [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0] },
        max_points_per_voxel: 10,
        max_voxels: 160000,
    }
}

fn random_cloud(rng: &mut Rng, n: usize) -> Cloud {
    let mut c = [Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n)];
    for _ in 0..n {
        c[0].push(rng.f32(-60.0, 60.0));
        c[1].push(rng.f32(-60.0, 60.0));
        c[2].push(rng.f32(-6.0, 6.0));
        c[3].push(rng.f32(0.0, 255.0));
    }
    let [x, y, z, i] = c;
    Cloud::from_xyz(x, y, z).with_channel("intensity", i)
}

/// Check clouds drawn from `seed`: (name, cloud with x, y, z, intensity). NaN points included in
/// "nan" (the gather drops them on both sides).
pub(crate) fn check_clouds(seed: u64, big: bool) -> Vec<(String, Cloud)> {
    let mut rng = Rng::new(seed);
    let mut out = vec![
        ("random 0".to_string(), random_cloud(&mut rng, 0)),
        ("random 1".to_string(), random_cloud(&mut rng, 1)),
        ("random 300".to_string(), random_cloud(&mut rng, 300)),
        ("random 100k".to_string(), random_cloud(&mut rng, 100_000)),
    ];
    if big {
        out.push(("random 1.2M".to_string(), random_cloud(&mut rng, 1_200_000)));
    }
    // All points in one voxel (of both W1 grids): 20000 points in [0.01, 0.09]^2 x [0.01, 0.19].
    let n = 20_000;
    let one = Cloud::from_xyz(
        (0..n).map(|_| rng.f32(0.01, 0.09)).collect(),
        (0..n).map(|_| rng.f32(0.01, 0.09)).collect(),
        (0..n).map(|_| rng.f32(0.01, 0.19)).collect(),
    )
    .with_channel("intensity", (0..n).map(|k| k as f32).collect());
    out.push(("one voxel 20k".to_string(), one));
    // Duplicates: 500 distinct points, each 40 times, interleaved.
    let base = random_cloud(&mut rng, 500);
    let idx: Vec<usize> = (0..20_000).map(|k| (k * 7919) % 500).collect();
    out.push(("duplicates 500x40".to_string(), base.select(&idx)));
    // Borders: exact voxel and range borders of both W1 grids (multiples of 0.16, 0.1, 0.2, and the
    // range ends), every combination of a few.
    let xs: Vec<f32> =
        (0..=640).map(|k| -51.2 + 0.16 * k as f32).chain([-51.2, 51.2, 51.199997, -51.2, 0.0, -0.0]).collect();
    let zs = [-5.0f32, 5.0, 3.0, 2.999_999_8, -5.000_000_5, 0.0, 0.2, 0.4, 0.6000001, 4.99];
    let (mut bx, mut by, mut bz) = (Vec::new(), Vec::new(), Vec::new());
    for (k, &x) in xs.iter().enumerate() {
        for &z in &zs {
            bx.push(x);
            by.push(xs[(k * 37) % xs.len()]);
            bz.push(z);
            bx.push(-x);
            by.push(x);
            bz.push(z);
        }
    }
    let nb = bx.len();
    out.push((
        "borders".to_string(),
        Cloud::from_xyz(bx, by, bz).with_channel("intensity", (0..nb).map(|k| k as f32).collect()),
    ));
    // NaN / inf points (dropped by the gather), and NaN intensities (kept; they propagate).
    let mut nan = random_cloud(&mut rng, 50_000);
    {
        let cols = nan.columns().to_vec();
        let mut c = cols;
        for k in (0..50_000).step_by(7) {
            c[k % 3][k] = if k % 2 == 0 { f32::NAN } else { f32::INFINITY };
        }
        for k in (3..50_000).step_by(11) {
            c[3][k] = f32::NAN;
        }
        let [x, y, z, i]: [Vec<f32>; 4] = c.try_into().unwrap();
        nan = Cloud::from_xyz(x, y, z).with_channel("intensity", i);
    }
    out.push(("nan/inf points".to_string(), nan));
    out
}

fn upload(ctx: &GpuContext, cloud: &Cloud) -> Result<(DeviceCloud, Cloud), VerifyError> {
    let msg = PointCloud2::from_cloud(Header::default(), cloud, &PointLayout::packed_for(cloud));
    let view = crate::cloud::CloudView::new(msg)?;
    let dev = crate::gpu::upload_and_gather(ctx, &view)?;
    Ok((dev, view.gather().cloud))
}

/// The cloud with x, y, z + the chosen channels (what the GPU sees as its C channels).
fn project(cloud: &Cloud, channels: &[usize]) -> Cloud {
    let cols = cloud.columns();
    let mut out = Cloud::from_xyz(cols[0].clone(), cols[1].clone(), cols[2].clone());
    for &c in channels {
        out = out.with_channel(&cloud.names()[c], cols[c].clone());
    }
    out
}

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Largest relative difference (NaN == NaN; NaN vs number = infinity; length mismatch = infinity).
fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let mut m = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        if x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()) {
            continue;
        }
        let (x, y) = (x as f64, y as f64);
        let d = if x.is_finite() && y.is_finite() {
            (x - y).abs() / x.abs().max(y.abs()).max(f64::MIN_POSITIVE)
        } else {
            f64::INFINITY
        };
        m = m.max(d);
    }
    m
}

/// fp16 bits with every NaN as one value (the device's NaNs carry no payload).
fn half_bits(v: &[half::f16]) -> Vec<u16> {
    v.iter().map(|x| if x.is_nan() { u16::MAX } else { x.to_bits() }).collect()
}

/// Two `voxel_features` messages are the same bytes, fp16 NaNs counted as one value.
fn message_same(a: &CloudMessage, b: &CloudMessage, dtype: FeaturesDtype) -> bool {
    let (va, vb) = (a.view(), b.view());
    let shape = |v: &crate::cloud::CloudView<'_>| (v.msg.height, v.msg.width, v.msg.is_dense, v.msg.header.clone());
    if a.cdr().len() != b.cdr().len() || va.layout != vb.layout || shape(&va) != shape(&vb) {
        return false;
    }
    let (da, db) = (&va.msg.data, &vb.msg.data);
    match dtype {
        FeaturesDtype::Float32 => da == db,
        FeaturesDtype::Float16 => {
            let halves = |d: &[u8]| {
                half_bits(&d.chunks_exact(2).map(|h| half::f16::from_le_bytes([h[0], h[1]])).collect::<Vec<_>>())
            };
            halves(da) == halves(db)
        }
    }
}

fn hard_same(a: &HardVoxels, b: &HardVoxels) -> bool {
    a.coords == b.coords
        && a.num_points == b.num_points
        && a.num_channels == b.num_channels
        && a.max_points == b.max_points
        && a.dropped_out_of_range == b.dropped_out_of_range
        && a.dropped_point_capacity == b.dropped_point_capacity
        && a.dropped_voxel_capacity == b.dropped_voxel_capacity
}

fn dyn_same(a: &DynamicVoxels, b: &DynamicVoxels) -> bool {
    a.point_coords == b.point_coords
        && a.point_voxel == b.point_voxel
        && a.voxel_coords == b.voxel_coords
        && a.num_points == b.num_points
        && a.num_channels == b.num_channels
        && a.dropped_out_of_range == b.dropped_out_of_range
}

fn first_hard_diff(g: &HardVoxels, c: &HardVoxels) -> String {
    if g.coords != c.coords {
        let i = g.coords.iter().zip(&c.coords).position(|(a, b)| a != b);
        return format!("coords differ (gpu {} cpu {} voxels, first at {i:?})", g.coords.len(), c.coords.len());
    }
    if g.num_points != c.num_points {
        let i = g.num_points.iter().zip(&c.num_points).position(|(a, b)| a != b);
        return format!("num_points differ first at {i:?}");
    }
    format!(
        "counters gpu oor {} pcap {} vcap {} / cpu {} {} {}",
        g.dropped_out_of_range,
        g.dropped_point_capacity,
        g.dropped_voxel_capacity,
        c.dropped_out_of_range,
        c.dropped_point_capacity,
        c.dropped_voxel_capacity
    )
}

/// Compares every GPU voxel operator with the CPU reference on the real Ouster scans
/// (`ouster_dir/*.bin`) and on clouds drawn from `seed`, for the W1 pillars and voxels configs;
/// each GPU op runs twice (outputs must be identical).
pub fn check(ctx: &GpuContext, seed: u64, ouster_dir: &Path) -> Result<Vec<CheckRow>, VerifyError> {
    check_with(ctx, seed, ouster_dir, false)
}

/// [`check`]; `quick` keeps the first Ouster scan and the small drawn clouds only (for runs under
/// compute-sanitizer).
pub fn check_with(ctx: &GpuContext, seed: u64, ouster_dir: &Path, quick: bool) -> Result<Vec<CheckRow>, VerifyError> {
    use crate::ops::voxel as cpu;
    let mut cases: Vec<(String, Cloud, Vec<usize>)> = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(ouster_dir)
        .map_err(|e| VerifyError::workload(ouster_dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    files.sort();
    if quick {
        files.truncate(1);
    }
    for (k, f) in files.iter().enumerate() {
        let scan = crate::bag::sample::load_ouster_bin(f).map_err(|e| VerifyError::workload(f, e))?;
        // Channel 3 = reflectivity as the intensity; the first scan also carries ring and t.
        let chans = if k == 0 { vec![3, 4, 5] } else { vec![3] };
        cases.push((format!("ouster {}", f.file_name().unwrap().to_string_lossy()), scan, chans));
    }
    for (name, cloud) in check_clouds(seed, !quick) {
        cases.push((name, cloud, vec![3]));
    }
    let configs = [
        ("pillars", w1_pillars()),
        ("voxels", w1_voxels()),
        ("small caps", HardVoxelParams { max_points_per_voxel: 3, max_voxels: 1000, ..w1_pillars() }),
        // P > 32: the sorted path (the others take the select path).
        ("deep pillars", HardVoxelParams { max_points_per_voxel: 40, max_voxels: 20000, ..w1_pillars() }),
    ];
    let mut vox = GpuVoxelizer::new(ctx)?;
    let mut rows = Vec::new();
    for (case, cloud, chans) in &cases {
        let (dev, host) = upload(ctx, cloud)?;
        let proj = project(&host, chans);
        let npts = cloud.len();
        for (cfg_name, params) in &configs {
            let label = format!("{case} / {cfg_name}");
            // Hard voxelization (+ fused pillars, + standalone pillar kernel).
            let exp = cpu::voxelize_hard(&proj, params)?;
            vox.hard_device(ctx, &dev, chans, params, true, Some(true))?;
            let (g1, pf1) = vox.hard_to_host(ctx)?;
            let half_raw = vox.hard_features_f16(ctx, false)?;
            let half_pillar = vox.hard_features_f16(ctx, true)?;
            vox.hard_device(ctx, &dev, chans, params, true, Some(true))?;
            let (g2, pf2) = vox.hard_to_host(ctx)?;
            let half_same = half_bits(&half_raw) == half_bits(&cpu::features_f16(&exp.features))
                && pf1.as_ref().is_some_and(|p| half_bits(&half_pillar) == half_bits(&cpu::features_f16(&p.features)));
            rows.push(CheckRow {
                operator: "voxel features fp16".into(),
                case: label.clone(),
                points: npts,
                integers_identical: half_same,
                max_rel_err: 0.0,
                float_tolerance: 0.0,
                deterministic: half_bits(&half_raw) == half_bits(&vox.hard_features_f16(ctx, false)?),
                detail: format!(
                    "{} raw + {} pillar values, fp16 bits vs CPU rounding (NaN as one class)",
                    half_raw.len(),
                    half_pillar.len()
                ),
            });
            // As the pipeline publishes them: the voxels and voxel_features message bytes (channel 3
            // named as an intensity, so that `voxels` carries its centroid).
            let names: Vec<String> = ["x", "y", "z", "intensity"]
                .into_iter()
                .map(String::from)
                .chain((4..exp.num_channels).map(|k| format!("c{k}")))
                .collect();
            for dtype in [FeaturesDtype::Float32, FeaturesDtype::Float16] {
                let header = Header { stamp_sec: 7, stamp_nanosec: 9, frame_id: "check".into() };
                let layout = FeaturesLayout { header: &header, names: &names, dtype };
                let want = PublishedHardVoxels::from_host(&exp, &layout);
                let mut runs = Vec::new();
                for _ in 0..2 {
                    vox.hard_device(ctx, &dev, chans, params, true, None)?;
                    runs.push(vox.hard_published(ctx, &layout)?);
                }
                let same = |p: &PublishedHardVoxels| {
                    p.counts == want.counts
                        && message_same(&p.voxels, &want.voxels, FeaturesDtype::Float32)
                        && message_same(&p.features, &want.features, dtype)
                };
                rows.push(CheckRow {
                    operator: format!("voxelize_hard published ({dtype:?})"),
                    case: label.clone(),
                    points: npts,
                    integers_identical: same(&runs[0]),
                    max_rel_err: 0.0,
                    float_tolerance: 0.0,
                    deterministic: same(&runs[1]),
                    detail: format!(
                        "voxel_features message {} bytes, voxels message {} bytes identical",
                        want.features.cdr().len(),
                        want.voxels.cdr().len()
                    ),
                });
            }
            let ints = hard_same(&g1, &exp);
            let rel = if bits_eq(&g1.features, &exp.features) {
                0.0
            } else {
                max_rel(&g1.features, &exp.features).max(1e-300)
            };
            rows.push(CheckRow {
                operator: "voxelize_hard".into(),
                case: label.clone(),
                points: npts,
                integers_identical: ints,
                max_rel_err: rel,
                float_tolerance: 0.0,
                deterministic: hard_same(&g1, &g2) && bits_eq(&g1.features, &g2.features),
                detail: if ints {
                    format!(
                        "V={} kept={} oor={} pcap={} vcap={}",
                        g1.voxel_count(),
                        g1.kept_points(),
                        g1.dropped_out_of_range,
                        g1.dropped_point_capacity,
                        g1.dropped_voxel_capacity
                    )
                } else {
                    first_hard_diff(&g1, &exp)
                },
            });
            let pf1 = pf1.unwrap();
            let pf2 = pf2.unwrap();
            for with_range in [true, false] {
                let pexp = cpu::pillar_features(&exp, &params.grid, with_range)?;
                let (fused, fused2) = if with_range {
                    (pf1.clone(), pf2.clone())
                } else {
                    vox.hard_device(ctx, &dev, chans, params, true, Some(false))?;
                    let a = vox.hard_to_host(ctx)?.1.unwrap();
                    vox.hard_device(ctx, &dev, chans, params, true, Some(false))?;
                    (a, vox.hard_to_host(ctx)?.1.unwrap())
                };
                // Standalone kernel on the device hard voxels.
                vox.hard_device(ctx, &dev, chans, params, true, None)?;
                vox.pillar_device(ctx, with_range)?;
                let standalone = vox.hard_to_host(ctx)?.1.unwrap();
                let same = bits_eq(&fused.features, &pexp.features) && bits_eq(&standalone.features, &pexp.features);
                rows.push(CheckRow {
                    operator: format!("pillar_features{}", if with_range { " (range)" } else { "" }),
                    case: label.clone(),
                    points: npts,
                    integers_identical: fused.num_channels == pexp.num_channels && fused.max_points == pexp.max_points,
                    max_rel_err: if same {
                        0.0
                    } else {
                        max_rel(&fused.features, &pexp.features)
                            .max(max_rel(&standalone.features, &pexp.features))
                            .max(1e-300)
                    },
                    float_tolerance: 0.0,
                    deterministic: bits_eq(&fused.features, &fused2.features),
                    detail: format!("fused + standalone kernel, {} floats", fused.features.len()),
                });
            }
            if *cfg_name == "small caps" {
                continue; // dynamic ops have no caps
            }
            // Dynamic voxelization and downsampling.
            let dexp = cpu::voxelize_dynamic(&proj, &params.grid);
            vox.dynamic_device(ctx, &dev, chans, &params.grid)?;
            let d1 = vox.dynamic_to_host(ctx)?;
            vox.dynamic_device(ctx, &dev, chans, &params.grid)?;
            let d2 = vox.dynamic_to_host(ctx)?;
            rows.push(CheckRow {
                operator: "voxelize_dynamic".into(),
                case: label.clone(),
                points: npts,
                integers_identical: dyn_same(&d1, &dexp),
                max_rel_err: max_rel(&d1.means, &dexp.means),
                float_tolerance: 1e-6,
                deterministic: dyn_same(&d1, &d2) && bits_eq(&d1.means, &d2.means),
                detail: format!(
                    "V={} oor={} means bit-identical: {}",
                    d1.voxel_count(),
                    d1.dropped_out_of_range,
                    bits_eq(&d1.means, &dexp.means)
                ),
            });
            let ds_exp = cpu::voxel_grid_downsample(&proj, &params.grid);
            let ds = voxel_grid_downsample(ctx, &dev, chans, &params.grid)?;
            let ds2 = voxel_grid_downsample(ctx, &dev, chans, &params.grid)?;
            let cols_rel =
                ds.cloud.columns().iter().zip(ds_exp.cloud.columns()).map(|(a, b)| max_rel(a, b)).fold(0.0, f64::max);
            let cols_det = ds.cloud.columns().iter().zip(ds2.cloud.columns()).all(|(a, b)| bits_eq(a, b));
            rows.push(CheckRow {
                operator: "voxel_grid_downsample".into(),
                case: label,
                points: npts,
                integers_identical: ds.cloud.len() == ds_exp.cloud.len()
                    && ds.cloud.names() == ds_exp.cloud.names()
                    && ds.dropped_out_of_range == ds_exp.dropped_out_of_range,
                max_rel_err: cols_rel,
                float_tolerance: 1e-6,
                deterministic: cols_det && ds.dropped_out_of_range == ds2.dropped_out_of_range,
                detail: format!("{} -> {} points", host.len(), ds.cloud.len()),
            });
        }
    }
    rows.extend(check_rows_reused(ctx, &cases)?);
    Ok(rows)
}

/// Hard voxels of one cloud after another on one voxelizer (the select kernel rewrites only the
/// padding slots an earlier call filled, by per-row fill counts): each result against the CPU
/// reference. Per row shape, the clouds in case order and back with nothing in between, so that
/// rows with many points are followed by rows with few; then the clouds again with the shapes in
/// turn, among them shapes with equal row lengths (P = 3 x C = 4 and P = 4 x C = 3 raw floats, P = 9
/// x 10 and P = 10 x 9 pillar floats), which must not share counts. Clouds above 200k points are
/// left out (their reference runs already above).
fn check_rows_reused(ctx: &GpuContext, cases: &[(String, Cloud, Vec<usize>)]) -> Result<Vec<CheckRow>, VerifyError> {
    use crate::ops::voxel as cpu;
    let capped = |max_points_per_voxel: u32| HardVoxelParams { max_points_per_voxel, max_voxels: 1000, ..w1_pillars() };
    // (name, params, extra channels, pillar features): C = 4 rows go out unstaged, C = 3 staged.
    let shapes: [(&str, HardVoxelParams, &[usize], Option<bool>); 5] = [
        ("pillars, C 4, 10-ch", w1_pillars(), &[3], Some(true)),
        ("P 3, C 4, 10-ch", capped(3), &[3], Some(true)),
        ("P 4, C 3", capped(4), &[], None),
        ("P 9, C 4, 10-ch", capped(9), &[3], Some(true)),
        ("P 10, C 4, 9-ch", capped(10), &[3], Some(false)),
    ];
    let small: Vec<_> = cases.iter().filter(|(_, c, _)| c.len() <= 200_000).collect();
    let there_and_back: Vec<_> = small.iter().chain(small.iter().rev()).collect();
    let mut rows = Vec::new();
    let mut run = |label: String, calls: Vec<(&Cloud, usize)>| -> Result<(), VerifyError> {
        let mut vox = GpuVoxelizer::new(ctx)?;
        let (mut same, mut values, mut points) = (true, 0usize, 0usize);
        let mut first_diff = None;
        for (k, (cloud, shape)) in calls.iter().enumerate() {
            let (name, params, chans, pillar) = &shapes[*shape];
            let (dev, host) = upload(ctx, cloud)?;
            let exp = cpu::voxelize_hard(&project(&host, chans), params)?;
            vox.hard_device(ctx, &dev, chans, params, true, *pillar)?;
            let (g, pf) = vox.hard_to_host(ctx)?;
            let mut ok = hard_same(&g, &exp) && bits_eq(&g.features, &exp.features);
            values += g.features.len();
            if let Some(with_range) = pillar {
                let pexp = cpu::pillar_features(&exp, &params.grid, *with_range)?;
                let pf = pf.expect("pillar features were asked for");
                ok &= bits_eq(&pf.features, &pexp.features);
                values += pf.features.len();
            }
            if !ok && first_diff.is_none() {
                first_diff = Some(format!("first difference at call {k} ({name}, {} points)", cloud.len()));
            }
            same &= ok;
            points += cloud.len();
        }
        rows.push(CheckRow {
            operator: "voxelize_hard, rows reused".into(),
            case: label,
            points,
            integers_identical: same,
            max_rel_err: 0.0,
            float_tolerance: 0.0,
            deterministic: same,
            detail: first_diff.unwrap_or_else(|| {
                format!("{} calls on one voxelizer, {values} feature values bit-identical", calls.len())
            }),
        });
        Ok(())
    };
    for (shape, (name, ..)) in shapes.iter().enumerate() {
        let calls = there_and_back.iter().map(|(_, c, _)| (c, shape)).collect();
        run(format!("{} clouds there and back / {name}", small.len()), calls)?;
    }
    let calls = small.iter().flat_map(|(_, c, _)| (0..shapes.len()).map(move |shape| (c, shape))).collect();
    run(format!("{} clouds, the {} row shapes in turn", small.len(), shapes.len()), calls)?;
    Ok(rows)
}

/// Workload `name` (`[N, 4]` float32: x, y, z, r) as a cloud.
pub(crate) fn load_xyzr(dir: &Path, name: &str) -> Result<Cloud, VerifyError> {
    let (v, _rows) = super::workload_f32(dir, name, 4)?;
    let c = |k: usize| v.iter().skip(k).step_by(4).copied().collect::<Vec<f32>>();
    Ok(Cloud::from_xyz(c(0), c(1), c(2)).with_channel("intensity", c(3)))
}

/// (median GPU ms between events around `f`, median host µs spent enqueueing `f`).
fn median_ms(
    timer: &mut StageTimer,
    runs: usize,
    mut f: impl FnMut() -> Result<(), GpuError>,
) -> Result<(f64, f64), GpuError> {
    for _ in 0..10 {
        f()?;
    }
    let mut t = Vec::with_capacity(runs);
    let mut host = Vec::with_capacity(runs);
    for _ in 0..runs {
        timer.start()?;
        let h = std::time::Instant::now();
        f()?;
        host.push(h.elapsed().as_secs_f64() * 1e6);
        timer.stage("op")?;
        t.push(timer.finish()?[0].1 as f64);
    }
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    host.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok((t[runs / 2], host[runs / 2]))
}

/// Per-launch GPU times of one hard voxelization (median of `runs` after 10 warm-up runs, an event
/// after every launch): "stages ms: insert 0.0041, ..." (events between launches add a little).
fn hard_stages(
    ctx: &GpuContext,
    vox: &mut GpuVoxelizer,
    timer: &mut StageTimer,
    dev: &DeviceCloud,
    params: &HardVoxelParams,
    pillar: Option<bool>,
    runs: usize,
) -> Result<String, GpuError> {
    let mut per: Vec<(String, Vec<f64>)> = Vec::new();
    for run in 0..runs + 10 {
        timer.start()?;
        vox.hard_device_timed(ctx, dev, &[3], params, true, pillar, Some(timer))?;
        let st = timer.finish()?;
        if run < 10 {
            continue;
        }
        for (k, (name, ms)) in st.into_iter().enumerate() {
            if per.len() <= k {
                per.push((name, Vec::new()));
            }
            per[k].1.push(ms as f64);
        }
    }
    let stages: Vec<String> = per
        .into_iter()
        .map(|(name, mut v)| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            format!("{name} {:.4}", v[v.len() / 2])
        })
        .collect();
    Ok(format!("stages ms: {}", stages.join(", ")))
}

/// GPU time (CUDA events, 10 warm-up runs, median of 100) of the voxel operators on the W1
/// workloads in `workloads` (`scan0_xyzr.bin`, `large_xyzr.bin`), data already on the device.
pub fn bench(ctx: &GpuContext, workloads: &Path) -> Result<Vec<BenchRow>, VerifyError> {
    const RUNS: usize = 100;
    let mut vox = GpuVoxelizer::new(ctx)?;
    let mut timer = ctx.stage_timer();
    let mut rows = Vec::new();
    // Targets of issue 9; peers: CUDA-PointPillars and spconv on the same H200 (shared/bench).
    for (wl, target_p, target_f, peer_p, peer_f, peer_v) in
        [("scan0_xyzr", 0.020, 0.035, 0.0274, 0.0435, 0.553), ("large_xyzr", 0.090, 0.140, 0.1205, 0.178, 0.732)]
    {
        let cloud = match load_xyzr(workloads, wl) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("bench: skipping {wl}: {e}");
                continue;
            }
        };
        let (dev, _) = upload(ctx, &cloud)?;
        let n = dev.len;
        let ch = [3usize];
        // The same points in reverse order: voxels are numbered by their first point, so row v
        // holds another voxel with another point count. Alternating the two, every call rewrites
        // rows an unlike cloud filled, as consecutive scans of a stream do (the select kernel's
        // writes depend on the previous call's rows).
        let reversed = {
            let rev = |v: &[f32]| v.iter().rev().copied().collect::<Vec<f32>>();
            let cols = cloud.columns();
            Cloud::from_xyz(rev(&cols[0]), rev(&cols[1]), rev(&cols[2])).with_channel("intensity", rev(&cols[3]))
        };
        let (dev_reversed, _) = upload(ctx, &reversed)?;
        for (cfg_name, params, target, peer) in
            [("pillars", w1_pillars(), Some(target_p), Some(peer_p)), ("voxels", w1_voxels(), None, Some(peer_v))]
        {
            let (ms, host_us) = median_ms(&mut timer, RUNS, || vox.hard_device(ctx, &dev, &ch, &params, true, None))?;
            let (h, _) = vox.hard_to_host(ctx)?;
            let bytes = (n * 16 + h.features.len() * 4 + h.coords.len() * 12 + h.num_points.len() * 4) as u64;
            let stages = hard_stages(ctx, &mut vox, &mut timer, &dev, &params, None, RUNS)?;
            rows.push(BenchRow {
                operator: "voxelize_hard".into(),
                workload: format!("W1 {cfg_name} {wl}"),
                points: n,
                median_ms: ms,
                runs: RUNS,
                min_bytes: bytes,
                target_ms: target,
                peer_ms: peer,
                note: format!("V={} kept={} host {host_us:.1} us; {stages}", h.voxel_count(), h.kept_points()),
            });
            if cfg_name == "pillars" {
                let (ms, host_us) =
                    median_ms(&mut timer, RUNS, || vox.hard_device(ctx, &dev, &ch, &params, true, Some(false)))?;
                let (h, pf) = vox.hard_to_host(ctx)?;
                let pf = pf.unwrap();
                let stages = hard_stages(ctx, &mut vox, &mut timer, &dev, &params, Some(false), RUNS)?;
                let pillar_bytes = pf.features.len() as u64 * 4;
                rows.push(BenchRow {
                    operator: "voxelize_hard + pillar_features (fused)".into(),
                    workload: format!("W1 {cfg_name} {wl}"),
                    points: n,
                    median_ms: ms,
                    runs: RUNS,
                    min_bytes: bytes + pillar_bytes,
                    target_ms: Some(target_f),
                    peer_ms: Some(peer_f),
                    note: format!("V={} raw + 9-channel features host {host_us:.1} us; {stages}", h.voxel_count()),
                });
                for (pillar, extra_bytes) in [(None, 0), (Some(false), pillar_bytes)] {
                    let mut on_reversed = false;
                    let (ms, _) = median_ms(&mut timer, RUNS, || {
                        on_reversed = !on_reversed;
                        vox.hard_device(ctx, if on_reversed { &dev_reversed } else { &dev }, &ch, &params, true, pillar)
                    })?;
                    rows.push(BenchRow {
                        operator: format!(
                            "voxelize_hard{}, alternating with the cloud reversed",
                            if pillar.is_some() { " + pillar_features (fused)" } else { "" }
                        ),
                        workload: format!("W1 {cfg_name} {wl}"),
                        points: n,
                        median_ms: ms,
                        runs: RUNS,
                        // As the rows above count them: the whole [V, P, C] outputs.
                        min_bytes: bytes + extra_bytes,
                        target_ms: None,
                        peer_ms: None,
                        note: "every call follows one on the other cloud".into(),
                    });
                }
            }
            let (ms, host_us) = median_ms(&mut timer, RUNS, || vox.dynamic_device(ctx, &dev, &ch, &params.grid))?;
            let d = vox.dynamic_to_host(ctx)?;
            rows.push(BenchRow {
                operator: "voxelize_dynamic (means)".into(),
                workload: format!("W1 {cfg_name} grid {wl}"),
                points: n,
                median_ms: ms,
                runs: RUNS,
                min_bytes: (n * 16 + n * 16 + d.means.len() * 4 + d.voxel_coords.len() * 16) as u64,
                target_ms: None,
                peer_ms: None,
                note: format!("V={} host {host_us:.1} us", d.voxel_count()),
            });
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_clouds_are_deterministic() {
        let a = check_clouds(7, false);
        let b = check_clouds(7, false);
        assert_eq!(a.len(), b.len());
        for ((na, ca), (nb, cb)) in a.iter().zip(&b) {
            assert_eq!(na, nb);
            assert_eq!(ca.len(), cb.len());
            for (x, y) in ca.columns().iter().zip(cb.columns()) {
                assert!(bits_eq(x, y));
            }
        }
        assert_eq!(a[0].1.len(), 0);
        assert_eq!(a[1].1.len(), 1);
    }

    #[test]
    fn compare_helpers() {
        assert_eq!(max_rel(&[1.0, f32::NAN], &[1.0, f32::NAN]), 0.0);
        assert!(max_rel(&[1.0], &[f32::NAN]).is_infinite());
        assert!((max_rel(&[1.0], &[1.000001]) - 1e-6).abs() < 1e-7);
        assert!(!bits_eq(&[0.0], &[-0.0]));
    }
}

/// The `downsampled` message written on the device ([`GpuVoxelizer::downsampled_published`])
/// against the CPU backend's, byte for byte, with the downsampled cloud's x, y, z: the first Ouster
/// scan in the driver's layout (UINT32 `t` and `range` summed in f64), the organized big-endian
/// padded layout with every datatype (FLOAT64 fields with NaN payloads, a multi-element field, a
/// padding field), and 10 copies with NaN/inf points (records found through the gather's record
/// indices); on the pipeline's default grid and on a 2 m grid (long sums).
pub fn check_downsampled(ctx: &GpuContext, ouster_dir: &Path) -> Result<Vec<CheckRow>, VerifyError> {
    use crate::bag::sample::{load_ouster_bin, ouster_cloud_message, OUSTER_SCANS};
    use crate::cloud::CloudView;
    use crate::ops::backend::{Backend, CpuBackend};
    use crate::pipeline::PipelineConfig;
    use crate::verify::smoke::{big_message, exotic_message};
    let path = ouster_dir.join(OUSTER_SCANS[0]);
    let scan = load_ouster_bin(&path).map_err(|e| VerifyError::workload(&path, e))?;
    let messages = [
        ("ouster 48-byte layout", ouster_cloud_message(&scan, Header::default())),
        ("organized big-endian every datatype", exotic_message(&scan, 127)),
        ("10 copies with NaN/inf (xyzi)", big_message(&scan, 10)),
    ];
    let default_grid = PipelineConfig::default().downsample.grid;
    let coarse = VoxelGrid { voxel_size: [2.0, 2.0, 2.0], ..default_grid.clone() };
    let mut rows = Vec::new();
    for (case, msg) in &messages {
        let view = CloudView::new(msg.clone())?;
        let dev = crate::gpu::upload_and_gather(ctx, &view)?;
        for (grid_name, grid) in [("0.2 m grid", &default_grid), ("2 m grid", &coarse)] {
            let op = |e: crate::ops::backend::OpError| VerifyError::Frame(e.into());
            let host = CpuBackend.gather(&view).map_err(op)?;
            let voxels = CpuBackend.downsample(&host, grid, true).map_err(op)?;
            let source = view.source_indices(host.dropped_non_finite);
            let (want, want_kept) = CpuBackend.downsample_published(&host, &view, &source, voxels).map_err(op)?;
            let want_xyz = want_kept.expect("kept").cloud;
            let mut vox = GpuVoxelizer::new(ctx)?;
            let mut run = || -> Result<_, VerifyError> {
                let xyz = vox.downsample_device(ctx, &dev, grid, true)?;
                let got = vox.downsampled_published(ctx, &view)?;
                let xyz =
                    ctx.stream.clone_dtoh(&xyz.expect("kept").slice(0..3 * got.points)).map_err(GpuError::from)?;
                Ok((got, xyz))
            };
            let (got, xyz) = run()?;
            let (again, xyz_again) = run()?;
            let same_bytes = got.message.cdr() == want.message.cdr();
            let v = got.points;
            let xyz_same =
                v == want.points && (0..3).all(|a| bits_eq(&xyz[a * v..(a + 1) * v], want_xyz.columns()[a].as_slice()));
            let detail = if same_bytes {
                format!("{} -> {} records of {} bytes, identical", host.cloud.len(), v, view.layout.point_step)
            } else {
                let (g, w) = (got.message.cdr(), want.message.cdr());
                let at = g.iter().zip(w).position(|(a, b)| a != b).unwrap_or(g.len().min(w.len()));
                format!("message bytes differ first at byte {at} of {} (cpu {} bytes)", g.len(), w.len())
            };
            rows.push(CheckRow {
                operator: "downsampled message".into(),
                case: format!("{case}, {grid_name}"),
                points: msg.num_points() as usize,
                integers_identical: same_bytes && xyz_same && got.dropped_out_of_range == want.dropped_out_of_range,
                max_rel_err: 0.0,
                float_tolerance: 0.0,
                deterministic: again.message.cdr() == got.message.cdr() && xyz_again == xyz,
                detail,
            });
        }
    }
    Ok(rows)
}
