//! KNN and ball query: GPU ([`crate::ops::neighbors::cuda`]) against the CPU reference, and the
//! W3 / W4 benchmarks.

use super::report::{BenchRow, CheckRow, Rng};
use super::VerifyError;
use super::{load_scan, time_ms, upload_cloud, workload_indices, workload_xyz};
use crate::cloud::Cloud;
use crate::gpu::{upload_xyz, DeviceXyz, GpuContext, GpuError};
use crate::ops::neighbors::cuda::{
    ball_query_enqueue, ball_query_with, build_grid, knn_enqueue, knn_with, NeighborsScratch,
};
use crate::ops::neighbors::{
    ball_query as cpu_ball, knn as cpu_knn, BallPadding, BallQuery, BallQueryParams, KnnParams, Neighbors,
};
use cudarc::driver::CudaSlice;
use std::path::Path;

fn knn_row(case: &str, n: usize, cpu: &Neighbors, g1: &Neighbors, g2: &Neighbors, kernel: &str) -> CheckRow {
    let same_i = g1.indices == cpu.indices;
    let same_d =
        g1.dist2.len() == cpu.dist2.len() && g1.dist2.iter().zip(&cpu.dist2).all(|(a, b)| a.to_bits() == b.to_bits());
    let det = g1.indices == g2.indices && g1.dist2.iter().zip(&g2.dist2).all(|(a, b)| a.to_bits() == b.to_bits());
    let mut max_rel = 0.0f64;
    for (a, b) in g1.dist2.iter().zip(&cpu.dist2) {
        if a.to_bits() != b.to_bits() {
            let r = if a.is_finite() && b.is_finite() {
                ((a - b).abs() as f64) / (b.abs() as f64).max(1e-30)
            } else {
                f64::INFINITY
            };
            max_rel = max_rel.max(r);
        }
    }
    let mut detail = format!(
        "M={} k={} via {kernel}; dist2 bit-identical: {}",
        cpu.indices.len() / cpu.width.max(1),
        cpu.width,
        same_d
    );
    if !same_i {
        if let Some(i) = g1.indices.iter().zip(&cpu.indices).position(|(a, b)| a != b) {
            detail += &format!("; first index difference at {i}: gpu {} cpu {}", g1.indices[i], cpu.indices[i]);
        }
    }
    CheckRow {
        operator: "knn".into(),
        case: case.into(),
        points: n,
        integers_identical: same_i,
        max_rel_err: max_rel,
        float_tolerance: 0.0,
        deterministic: det,
        detail,
    }
}

fn ball_row(
    case: &str,
    n: usize,
    p: &BallQueryParams,
    cpu: &BallQuery,
    g1: &BallQuery,
    g2: &BallQuery,
    kernel: &str,
) -> CheckRow {
    let same = g1 == cpu;
    let mut detail = format!(
        "M={} r={} rmin={} ns={} {:?} via {kernel}; mean count {:.1}",
        cpu.counts.len(),
        p.radius,
        p.min_radius,
        p.nsample,
        p.padding,
        cpu.counts.iter().map(|&c| c as f64).sum::<f64>() / cpu.counts.len().max(1) as f64
    );
    if !same {
        if let Some(i) = g1.counts.iter().zip(&cpu.counts).position(|(a, b)| a != b) {
            detail += &format!("; counts differ at query {i}: gpu {} cpu {}", g1.counts[i], cpu.counts[i]);
        } else if let Some(i) = g1.indices.iter().zip(&cpu.indices).position(|(a, b)| a != b) {
            detail += &format!("; indices differ at {i}: gpu {} cpu {}", g1.indices[i], cpu.indices[i]);
        }
    }
    CheckRow {
        operator: "ball_query".into(),
        case: case.into(),
        points: n,
        integers_identical: same,
        max_rel_err: 0.0,
        float_tolerance: 0.0,
        deterministic: g1 == g2,
        detail,
    }
}

/// Runs KNN and ball-query cases over one (points, queries) pair, appending rows.
fn check_pair(
    ctx: &GpuContext,
    s: &mut NeighborsScratch,
    rows: &mut Vec<CheckRow>,
    case: &str,
    pts: (DeviceXyz<'_>, &Cloud),
    qs: (DeviceXyz<'_>, &Cloud),
    ks: &[usize],
    balls: &[BallQueryParams],
) -> Result<(), VerifyError> {
    for &k in ks {
        let p = KnnParams { k };
        let cpu = cpu_knn(pts.1, qs.1, &p)?;
        let g1 = knn_with(ctx, s, pts.0, qs.0, &p)?;
        let kernel = s.last_kernel.clone();
        let g2 = knn_with(ctx, s, pts.0, qs.0, &p)?;
        rows.push(knn_row(case, pts.1.len(), &cpu, &g1, &g2, &kernel));
    }
    for p in balls {
        let cpu = cpu_ball(pts.1, qs.1, p)?;
        let g1 = ball_query_with(ctx, s, pts.0, qs.0, p)?;
        let kernel = s.last_kernel.clone();
        let g2 = ball_query_with(ctx, s, pts.0, qs.0, p)?;
        rows.push(ball_row(case, pts.1.len(), p, &cpu, &g1, &g2, &kernel));
    }
    Ok(())
}

fn bq(radius: f32, min_radius: f32, nsample: usize, padding: BallPadding) -> BallQueryParams {
    BallQueryParams { radius, min_radius, nsample, padding }
}

/// Uploads a cloud as-is (non-finite values kept: the gather path would drop them).
fn raw_upload(ctx: &GpuContext, c: &Cloud) -> Result<CudaSlice<f32>, GpuError> {
    upload_xyz(ctx, c.x(), c.y(), c.z())
}

/// GPU vs CPU KNN and ball query over the Ouster scans and random clouds from `seed`.
pub fn check(ctx: &GpuContext, seed: u64, ouster_dir: &Path) -> Result<Vec<CheckRow>, VerifyError> {
    let mut rows = Vec::new();
    let mut s = NeighborsScratch::new(ctx)?;
    let ff = BallPadding::FirstFound;
    let m1 = BallPadding::Minus1;

    // Real scans (gather path); queries: every 7th point, and the scan's own FPS-like subset.
    for name in ["os1-128_scan0", "os1-32_scan0", "os2-128_scan0"] {
        let f = ouster_dir.join(format!("{name}.bin"));
        if !f.exists() {
            continue;
        }
        let (dev, host) = load_scan(ctx, &f)?;
        let qidx: Vec<usize> = (0..host.len()).step_by(7).collect();
        let qh = host.select(&qidx);
        let qh = Cloud::from_xyz(qh.x().to_vec(), qh.y().to_vec(), qh.z().to_vec());
        let qd = raw_upload(ctx, &qh)?;
        let qdx = DeviceXyz::new(&qd, qh.len(), qh.len())?;
        let balls = if name == "os1-128_scan0" {
            vec![bq(1.0, 0.0, 32, ff), bq(2.0, 0.0, 32, m1), bq(0.5, 0.2, 16, ff), bq(1.0, 0.0, 64, m1)]
        } else {
            vec![bq(1.0, 0.0, 32, ff)]
        };
        let ks: &[usize] = if name == "os1-128_scan0" { &[1, 16, 32, 48] } else { &[16] };
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            &format!("{name}, queries every 7th"),
            ((&dev).into(), &host),
            (qdx, &qh),
            ks,
            &balls,
        )?;
    }

    let mut rng = Rng::new(seed ^ 0x5eed);
    // Random volume cloud, queries partly outside its box.
    {
        let pts = rng.cloud(20000, 10.0);
        let (dev, host) = upload_cloud(ctx, &pts)?;
        let q = rng.cloud(3000, 14.0);
        let qd = raw_upload(ctx, &q)?;
        let qdx = DeviceXyz::new(&qd, q.len(), q.len())?;
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            "random 20000, 3000 queries",
            ((&dev).into(), &host),
            (qdx, &q),
            &[1, 5, 16, 32, 40],
            &[bq(0.7, 0.0, 32, ff), bq(1.5, 0.3, 8, m1), bq(1.0, 0.0, 100, ff)],
        )?;
    }
    // Lattice with many duplicates: ties in dist2 everywhere.
    {
        let pts = rng.lattice(8000, 9);
        let (dev, host) = upload_cloud(ctx, &pts)?;
        let q = rng.lattice(1000, 11);
        let qd = raw_upload(ctx, &q)?;
        let qdx = DeviceXyz::new(&qd, q.len(), q.len())?;
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            "lattice duplicates 8000",
            ((&dev).into(), &host),
            (qdx, &q),
            &[8, 32, 64],
            &[bq(1.0, 0.0, 32, ff), bq(2.0, 1.0, 16, m1)],
        )?;
    }
    // All identical points.
    {
        let pts = Cloud::from_points(&vec![[3.0f32, -1.0, 0.5]; 500]);
        let (dev, host) = upload_cloud(ctx, &pts)?;
        let q = Cloud::from_points(&[[3.0, -1.0, 0.5], [3.5, -1.0, 0.5], [100.0, 0.0, 0.0]]);
        let qd = raw_upload(ctx, &q)?;
        let qdx = DeviceXyz::new(&qd, q.len(), q.len())?;
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            "500 identical points",
            ((&dev).into(), &host),
            (qdx, &q),
            &[4, 32],
            &[bq(1.0, 0.0, 8, ff), bq(1.0, 0.0, 8, m1)],
        )?;
    }
    // Tiny clouds: k > N, empty, one point; non-finite points and queries (uploaded raw).
    for (case, n) in [("empty cloud", 0usize), ("one point", 1), ("10 points, k > N", 10), ("300 points", 300)] {
        let pts = rng.cloud(n, 3.0);
        let pd = raw_upload(ctx, &pts)?;
        let pdx = DeviceXyz::new(&pd, n, n)?;
        let mut q = rng.cloud(50, 3.5);
        if n == 300 {
            let mut x = q.x().to_vec();
            x[3] = f32::NAN;
            x[9] = f32::INFINITY;
            q = Cloud::from_xyz(x, q.y().to_vec(), q.z().to_vec());
        }
        let qd = raw_upload(ctx, &q)?;
        let qdx = DeviceXyz::new(&qd, q.len(), q.len())?;
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            case,
            (pdx, &pts),
            (qdx, &q),
            &[3, 16],
            &[bq(1.0, 0.0, 16, ff), bq(1.0, 0.0, 4, m1)],
        )?;
    }
    {
        let mut pts = rng.cloud(2000, 4.0);
        let mut x = pts.x().to_vec();
        let mut z = pts.z().to_vec();
        for i in (0..x.len()).step_by(13) {
            x[i] = f32::NAN;
        }
        for i in (5..z.len()).step_by(29) {
            z[i] = f32::NEG_INFINITY;
        }
        pts = Cloud::from_xyz(x, pts.y().to_vec(), z);
        let pd = raw_upload(ctx, &pts)?;
        let pdx = DeviceXyz::new(&pd, pts.len(), pts.len())?;
        let q = rng.cloud(500, 4.0);
        let qd = raw_upload(ctx, &q)?;
        let qdx = DeviceXyz::new(&qd, q.len(), q.len())?;
        check_pair(
            ctx,
            &mut s,
            &mut rows,
            "2000 with non-finite points (raw upload)",
            (pdx, &pts),
            (qdx, &q),
            &[16],
            &[bq(1.0, 0.0, 32, ff)],
        )?;
    }
    Ok(rows)
}

fn same_as_cpu(g: &Neighbors, c: &Neighbors) -> bool {
    g.indices == c.indices
        && g.dist2.len() == c.dist2.len()
        && g.dist2.iter().zip(&c.dist2).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// KNN and ball-query benchmarks on the fixed workloads (W3a, W3b, W4).
pub fn bench(ctx: &GpuContext, workloads: &Path) -> Result<Vec<BenchRow>, VerifyError> {
    let mut rows = Vec::new();
    let mut s = NeighborsScratch::new(ctx)?;
    let runs = 50;
    // W3a: queries = points.
    let (x, y, z) = workload_xyz(workloads, "w3a_xyz")?;
    let n = x.len();
    let a = upload_xyz(ctx, &x, &y, &z)?;
    let ad = DeviceXyz::new(&a, n, n)?;
    let p = KnnParams { k: 16 };
    let w3a_cloud = Cloud::from_xyz(x.clone(), y.clone(), z.clone());
    let w3a_cpu = cpu_knn(&w3a_cloud, &w3a_cloud, &p)?;
    {
        let ms = time_ms(ctx, 3, runs, || knn_enqueue(ctx, &mut s, ad, ad, &p))?;
        let same = same_as_cpu(&knn_with(ctx, &mut s, ad, ad, &p)?, &w3a_cpu);
        rows.push(BenchRow {
            operator: "knn".into(),
            workload: "W3a k=16, 16384 queries = points".into(),
            points: n,
            median_ms: ms,
            runs,
            min_bytes: (n * 12 * 2 + n * 16 * 8) as u64,
            target_ms: Some(0.5),
            peer_ms: Some(2.10),
            note: format!("grid build + {}; identical to CPU: {same}", s.last_kernel),
        });
    }

    // W3b / W4: queries = scan0_xyz[w3b_queries_idx] into scan0_xyz.
    let (x, y, z) = workload_xyz(workloads, "scan0_xyz")?;
    let n = x.len();
    let pbuf = upload_xyz(ctx, &x, &y, &z)?;
    let pd = DeviceXyz::new(&pbuf, n, n)?;
    let qi = workload_indices(workloads, "w3b_queries_idx")?;
    let m = qi.len();
    let qb = upload_xyz(
        ctx,
        &qi.iter().map(|&i| x[i]).collect::<Vec<_>>(),
        &qi.iter().map(|&i| y[i]).collect::<Vec<_>>(),
        &qi.iter().map(|&i| z[i]).collect::<Vec<_>>(),
    )?;
    let qd = DeviceXyz::new(&qb, m, m)?;
    let p = KnnParams { k: 32 };
    let w3b_cpu = cpu_knn(
        &Cloud::from_xyz(x.clone(), y.clone(), z.clone()),
        &Cloud::from_xyz(
            qi.iter().map(|&i| x[i]).collect(),
            qi.iter().map(|&i| y[i]).collect(),
            qi.iter().map(|&i| z[i]).collect(),
        ),
        &p,
    )?;
    {
        let ms = time_ms(ctx, 3, runs, || knn_enqueue(ctx, &mut s, pd, qd, &p))?;
        let same = same_as_cpu(&knn_with(ctx, &mut s, pd, qd, &p)?, &w3b_cpu);
        rows.push(BenchRow {
            operator: "knn".into(),
            workload: "W3b k=32, 4096 FPS queries into scan0".into(),
            points: n,
            median_ms: ms,
            runs,
            min_bytes: (n * 12 + m * 12 + m * 32 * 8) as u64,
            target_ms: Some(0.5),
            peer_ms: Some(8.47),
            note: format!("grid build + {}; identical to CPU: {same}", s.last_kernel),
        });
    }
    let ms = time_ms(ctx, 3, runs, || build_grid(ctx, &mut s, pd, 0, 32, 0.0))?;
    rows.push(BenchRow {
        operator: "knn grid build only".into(),
        workload: "scan0 grid for k=32 (included in the rows above/below)".into(),
        points: n,
        median_ms: ms,
        runs,
        min_bytes: (n * 12 * 2 + n * 16) as u64,
        target_ms: None,
        peer_ms: None,
        note: "bbox, setup, count, 3-kernel scan, scatter".into(),
    });
    for r in [1.0f32, 2.0] {
        let p = bq(r, 0.0, 32, BallPadding::FirstFound);
        let ms = time_ms(ctx, 3, runs, || ball_query_enqueue(ctx, &mut s, pd, qd, &p))?;
        rows.push(BenchRow {
            operator: "ball_query".into(),
            workload: format!("W4 r={r} m, 32 samples, 4096 FPS queries into scan0"),
            points: n,
            median_ms: ms,
            runs,
            min_bytes: (n * 12 + m * 12 + m * 32 * 4 + m * 4) as u64,
            target_ms: Some(0.5),
            peer_ms: Some(28.1),
            note: format!("grid build + {}", s.last_kernel),
        });
    }
    Ok(rows)
}
