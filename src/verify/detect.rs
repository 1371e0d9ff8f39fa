//! The detector's GPU-vs-CPU check and benchmark: point classes, labels, the clusters (box bits
//! included) and the NMS keep list must be identical, and two GPU runs too.

use super::report::{BenchRow, CheckRow, Rng};
use super::VerifyError;
use crate::bag::sample::{load_ouster_bin, ouster_cloud_message, OUSTER_SCANS};
use crate::cloud::{Cloud, CloudView, Header, PointCloud2, PointLayout};
use crate::gpu::{BackendKind, GpuContext};
use crate::ops::backend::{Backend, CpuBackend, CudaBackend};
use crate::ops::detect::{DetectParams, Detections, PointClass};
use std::path::Path;
use std::time::Instant;

/// The first difference between two detections, if any (box floats compared bit for bit).
fn difference(a: &Detections, b: &Detections) -> Option<String> {
    if let Some(i) =
        (0..a.point_class.len().max(b.point_class.len())).find(|&i| a.point_class.get(i) != b.point_class.get(i))
    {
        return Some(format!("point {i}: class {:?} vs {:?}", a.point_class.get(i), b.point_class.get(i)));
    }
    if let Some(i) = (0..a.labels.len().max(b.labels.len())).find(|&i| a.labels.get(i) != b.labels.get(i)) {
        return Some(format!("point {i}: label {:?} vs {:?}", a.labels.get(i), b.labels.get(i)));
    }
    if (a.components, a.candidates) != (b.components, b.candidates) {
        return Some(format!(
            "components/candidates {}/{} vs {}/{}",
            a.components, a.candidates, b.components, b.candidates
        ));
    }
    let bits = |c: &crate::ops::detect::Cluster| {
        let b = c.bbox;
        (
            [b.x, b.y, b.z, b.length, b.width, b.height, b.yaw, c.clearance, c.score].map(f32::to_bits),
            c.label,
            c.points,
            c.class,
        )
    };
    if a.clusters.len() != b.clusters.len() {
        return Some(format!("{} vs {} clusters", a.clusters.len(), b.clusters.len()));
    }
    if let Some(k) = (0..a.clusters.len()).find(|&k| bits(&a.clusters[k]) != bits(&b.clusters[k])) {
        return Some(format!("cluster {k}: {:?} vs {:?}", a.clusters[k], b.clusters[k]));
    }
    (a.keep != b.keep).then(|| format!("keep {:?} vs {:?}", a.keep, b.keep))
}

fn run<B: Backend>(b: &mut B, view: &CloudView<'_>, p: &DetectParams) -> Result<Detections, VerifyError> {
    let points = b.gather(view).map_err(|e| VerifyError::Frame(e.into()))?;
    b.detect(&points, p).map_err(|e| VerifyError::Frame(e.into()))
}

fn row(gpu: &mut CudaBackend, case: &str, msg: PointCloud2<'_>, p: &DetectParams) -> Result<CheckRow, VerifyError> {
    let view = CloudView::new(msg)?;
    let cpu = run(&mut CpuBackend, &view, p)?;
    let first = run(gpu, &view, p)?;
    let second = run(gpu, &view, p)?;
    let mismatch = difference(&cpu, &first);
    let detail = mismatch.clone().unwrap_or_else(|| {
        format!(
            "{} ground, {} components, {} candidates, {} clusters ({} cars, {} of them completed from one end), {} kept after NMS",
            cpu.count(PointClass::Ground),
            cpu.components,
            cpu.candidates,
            cpu.clusters.len(),
            cpu.clusters.iter().filter(|c| c.class == 0).count(),
            cpu.clusters.iter().filter(|c| c.class == 0 && c.bbox.length == p.boxes.end_on_length_m).count(),
            cpu.keep.len()
        )
    });
    Ok(CheckRow {
        operator: "detect".into(),
        case: case.into(),
        points: view.len(),
        integers_identical: mismatch.is_none(),
        max_rel_err: 0.0,
        float_tolerance: 0.0,
        deterministic: difference(&first, &second).is_none(),
        detail,
    })
}

fn xyz_message(cloud: &Cloud) -> PointCloud2<'static> {
    PointCloud2::from_cloud(Header::default(), cloud, &PointLayout::packed_for(cloud))
}

/// A street: a gently sloped, noisy ground, car-, car-end-, pedestrian- and wall-like surfaces
/// standing on it, and overhead points.
fn street(rng: &mut Rng, n: usize) -> Cloud {
    let mut pts = Vec::with_capacity(n);
    let ground_z = |x: f32, y: f32| -1.7 + 0.02 * x - 0.01 * y;
    let objects: Vec<[f32; 6]> = (0..60)
        .map(|_| {
            let (l, w, h) = match rng.below(4) {
                0 => (rng.f32(3.5, 5.0), rng.f32(1.6, 2.0), rng.f32(1.3, 1.8)),
                1 => (rng.f32(0.4, 0.8), rng.f32(0.4, 0.7), rng.f32(1.5, 1.9)),
                // One end of a car (the rest hidden): a car_end_on box, facing the sensor or not.
                2 => (rng.f32(0.3, 0.9), rng.f32(1.4, 2.0), rng.f32(0.8, 1.5)),
                _ => (rng.f32(4.0, 15.0), rng.f32(0.2, 0.4), rng.f32(1.0, 3.0)),
            };
            [rng.f32(-60.0, 60.0), rng.f32(-60.0, 60.0), l, w, h, rng.f32(-3.2, 3.2)]
        })
        .collect();
    while pts.len() < n {
        let kind = rng.below(10);
        if kind < 5 {
            let (x, y) = (rng.f32(-70.0, 70.0), rng.f32(-70.0, 70.0));
            pts.push([x, y, ground_z(x, y) + rng.f32(-0.05, 0.05)]);
        } else if kind < 9 {
            let o = objects[rng.below(objects.len() as u64) as usize];
            let (u, v) = (rng.f32(-0.5, 0.5) * o[2], rng.f32(-0.5, 0.5) * o[3]);
            let (s, c) = o[5].sin_cos();
            let (x, y) = (o[0] + u * c - v * s, o[1] + u * s + v * c);
            pts.push([x, y, ground_z(o[0], o[1]) + rng.f32(0.1, o[4])]);
        } else {
            let (x, y) = (rng.f32(-90.0, 90.0), rng.f32(-90.0, 90.0));
            pts.push([x, y, rng.f32(-3.0, 8.0)]);
        }
    }
    Cloud::from_points(&pts)
}

/// Every Ouster scan (the sample's layout), the evaluation frames when given, and random scenes.
pub fn check(
    ctx: &GpuContext,
    seed: u64,
    ouster_dir: &Path,
    eval_dir: Option<&Path>,
) -> Result<Vec<CheckRow>, VerifyError> {
    let profile = crate::gpu::ProfileChoice::Named(ctx.profile.name.clone());
    let mut gpu = CudaBackend::select(BackendKind::Cuda, profile)?.expect("a CUDA backend or an error");
    let p = DetectParams::default();
    let mut rows = Vec::new();
    for name in OUSTER_SCANS {
        let path = ouster_dir.join(name);
        let scan = load_ouster_bin(&path).map_err(|e| VerifyError::workload(&path, e))?;
        rows.push(row(&mut gpu, &format!("ouster {name}"), ouster_cloud_message(&scan, Header::default()), &p)?);
    }
    if let Some(dir) = eval_dir {
        for frame in crate::eval::find_frames(dir).map_err(|e| VerifyError::workload(dir, e))? {
            let cloud =
                crate::eval::load_scan(&frame.scan, frame.stride).map_err(|e| VerifyError::workload(&frame.scan, e))?;
            rows.push(row(&mut gpu, &frame.name, xyz_message(&cloud), &p)?);
        }
    }
    let mut rng = Rng::new(seed);
    rows.push(row(&mut gpu, "random street 100k", xyz_message(&street(&mut rng, 100_000)), &p)?);
    // Integer coordinates: points on cell borders, duplicates, +-0.
    let lattice = rng.lattice(50_000, 40);
    let shifted: Vec<[f32; 3]> =
        (0..lattice.len()).map(|i| lattice.point(i)).map(|q| [q[0] - 20.0, q[1] - 20.0, q[2] * 0.25 - 2.0]).collect();
    rows.push(row(&mut gpu, "lattice 50k (cell borders, duplicates)", xyz_message(&Cloud::from_points(&shifted)), &p)?);
    let fine = DetectParams {
        range_m: 30.0,
        cluster: crate::ops::detect::ClusterParams { cell_m: 0.1, min_points: 3, max_points: 500 },
        ..DetectParams::default()
    };
    rows.push(row(
        &mut gpu,
        "random uniform 200k, 0.1 m cells, 3..500 points",
        xyz_message(&rng.cloud(200_000, 40.0)),
        &fine,
    )?);
    // More candidates than the kernels rank by counting: ranks from the scan of label flags.
    let many = DetectParams {
        cluster: crate::ops::detect::ClusterParams { cell_m: 0.1, min_points: 1, max_points: 500 },
        ..fine.clone()
    };
    rows.push(row(
        &mut gpu,
        "random uniform 300k, 0.1 m cells, 1..500 points (> 4096 candidates)",
        xyz_message(&rng.cloud(300_000, 60.0)),
        &many,
    )?);
    rows.push(row(&mut gpu, "empty cloud", xyz_message(&Cloud::default()), &p)?);
    Ok(rows)
}

/// Wall time of the whole detector call (launches, copies back, NMS) on the sample's first scan.
pub fn bench(ctx: &GpuContext, ouster_dir: &Path) -> Result<Vec<BenchRow>, VerifyError> {
    let profile = crate::gpu::ProfileChoice::Named(ctx.profile.name.clone());
    let mut gpu = CudaBackend::select(BackendKind::Cuda, profile)?.expect("a CUDA backend or an error");
    let path = ouster_dir.join(OUSTER_SCANS[0]);
    let scan = load_ouster_bin(&path).map_err(|e| VerifyError::workload(&path, e))?;
    let view = CloudView::new(ouster_cloud_message(&scan, Header::default()))?;
    let points = gpu.gather(&view).map_err(|e| VerifyError::Frame(e.into()))?;
    let p = DetectParams::default();
    let mut ms = Vec::new();
    let mut last = None;
    for i in 0..60 {
        let t = Instant::now();
        let d = gpu.detect(&points, &p).map_err(|e| VerifyError::Frame(e.into()))?;
        if i >= 10 {
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        last = Some(d);
    }
    let d = last.expect("ran");
    Ok(vec![BenchRow {
        operator: "detect (ground + clusters + boxes + NMS)".into(),
        workload: "os1-128_scan0, default detect parameters, wall clock incl. copies back".into(),
        points: scan.len(),
        median_ms: super::median(ms.clone()),
        runs: ms.len(),
        min_bytes: (scan.len() * 12) as u64,
        target_ms: Some(1.0),
        peer_ms: None,
        note: format!("{} clusters, {} kept", d.clusters.len(), d.keep.len()),
    }])
}
