//! FPS: GPU ([`crate::ops::fps::cuda`]) against the CPU reference, and the W2 benchmarks.

use super::report::{BenchRow, CheckRow, Rng};
use super::VerifyError;
use super::{load_scan, time_ms, upload_cloud, workload_xyz};
use crate::cloud::Cloud;
use crate::gpu::{upload_xyz, DeviceXyz, GpuContext};
use crate::ops::fps::cuda::{
    cluster_capacity, farthest_point_sample_batched_with, farthest_point_sample_with, fps_enqueue, launch_cluster,
    launch_grid, ClusterShape, FpsScratch, CLUSTER_BLOCKS, CLUSTER_PPT,
};
use crate::ops::fps::{self as cpu_fps, FpsParams};
use std::path::Path;

fn first_diff<T: PartialEq + std::fmt::Debug>(a: &[T], b: &[T]) -> String {
    if a.len() != b.len() {
        return format!("lengths differ: gpu {} cpu {}", a.len(), b.len());
    }
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("first difference at {i}: gpu {:?} cpu {:?}", a[i], b[i]),
        None => String::new(),
    }
}

fn row(operator: &str, case: &str, points: usize, same: bool, det: bool, detail: String) -> CheckRow {
    CheckRow {
        operator: operator.into(),
        case: case.into(),
        points,
        integers_identical: same,
        max_rel_err: 0.0,
        float_tolerance: 0.0,
        deterministic: det,
        detail,
    }
}

const SCAN0_PREFIX: [i32; 10] = [0, 45184, 45610, 39325, 45611, 6407, 54302, 48405, 64409, 41877];

/// `cloud` with its points sorted by position (x, then y, then z): each warp's points lie in a
/// small box, as in a scan-ordered cloud, so that the kernels skip most warp updates (cuda/fps.cu,
/// `FpsBox`), and lattice duplicates sit side by side.
fn sorted_by_position(cloud: &Cloud) -> Cloud {
    let mut pts: Vec<[f32; 3]> = (0..cloud.len()).map(|i| cloud.point(i)).collect();
    pts.sort_by(|a, b| a[0].total_cmp(&b[0]).then(a[1].total_cmp(&b[1])).then(a[2].total_cmp(&b[2])));
    Cloud::from_points(&pts)
}

/// The xyz of `clouds` in one cloud, back to back (a batch).
fn back_to_back(clouds: &[Cloud]) -> Cloud {
    let cat = |f: fn(&Cloud) -> &[f32]| clouds.iter().flat_map(|c| f(c).iter().copied()).collect::<Vec<f32>>();
    Cloud::from_xyz(cat(Cloud::x), cat(Cloud::y), cat(Cloud::z))
}

/// GPU vs CPU FPS over the Ouster scans in `ouster_dir` and random clouds from `seed`.
pub fn check(ctx: &GpuContext, seed: u64, ouster_dir: &Path) -> Result<Vec<CheckRow>, VerifyError> {
    let mut rows = Vec::new();
    let mut scratch = FpsScratch::new(ctx)?;
    let mut single = |rows: &mut Vec<CheckRow>,
                      case: &str,
                      dev: DeviceXyz<'_>,
                      host: &Cloud,
                      params: &FpsParams|
     -> Result<Vec<i32>, VerifyError> {
        let cpu = cpu_fps::farthest_point_sample(host, params)?;
        let g1 = farthest_point_sample_with(ctx, &mut scratch, dev, params)?;
        let plan = scratch.last_plan.clone();
        let g2 = farthest_point_sample_with(ctx, &mut scratch, dev, params)?;
        let same = g1.indices == cpu.indices;
        let mut detail = format!("K={} start={} via {} x{}", params.num_samples, params.start_index, plan.0, plan.1);
        if !same {
            detail += &format!("; {}", first_diff(&g1.indices, &cpu.indices));
        }
        rows.push(row("fps", case, host.len(), same, g1 == g2, detail));
        Ok(g1.indices)
    };

    // Real scans through the PointCloud2 gather path.
    let mut files: Vec<_> = std::fs::read_dir(ouster_dir)
        .map_err(|e| VerifyError::workload(ouster_dir, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    files.sort();
    for f in &files {
        let name = f.file_stem().unwrap().to_string_lossy().to_string();
        let (dev, host) = load_scan(ctx, f)?;
        let p = FpsParams { num_samples: 4096, start_index: 0 };
        let got = single(&mut rows, &name, (&dev).into(), &host, &p)?;
        if name == "os1-128_scan0" {
            let ok = got.len() >= 10 && got[..10] == SCAN0_PREFIX;
            rows.push(row(
                "fps",
                "os1-128_scan0 published prefix",
                host.len(),
                ok,
                true,
                format!("{:?}", &got[..10.min(got.len())]),
            ));
        }
    }

    // Random clouds.
    let mut rng = Rng::new(seed);
    let cases: Vec<(String, Cloud, FpsParams)> = vec![
        ("empty".into(), Cloud::from_xyz(vec![], vec![], vec![]), FpsParams { num_samples: 5, start_index: 0 }),
        ("one point, K=3".into(), rng.cloud(1, 10.0), FpsParams { num_samples: 3, start_index: 0 }),
        ("300 random, K=300".into(), rng.cloud(300, 10.0), FpsParams { num_samples: 300, start_index: 17 }),
        ("300 random, K=400 (-1 pad)".into(), rng.cloud(300, 10.0), FpsParams { num_samples: 400, start_index: 299 }),
        (
            "all identical 1000, K=1200".into(),
            Cloud::from_points(&vec![[1.5f32, -2.0, 0.25]; 1000]),
            FpsParams { num_samples: 1200, start_index: 3 },
        ),
        ("lattice dups 20000, K=2048".into(), rng.lattice(20000, 12), FpsParams { num_samples: 2048, start_index: 5 }),
        ("100k random, K=1024".into(), rng.cloud(100_000, 50.0), FpsParams { num_samples: 1024, start_index: 12345 }),
        ("1M random, K=64".into(), rng.cloud(1_000_000, 80.0), FpsParams { num_samples: 64, start_index: 999_999 }),
        ("1.2M random, K=48".into(), rng.cloud(1_200_000, 80.0), FpsParams { num_samples: 48, start_index: 7 }),
        // Past the cluster path on every device: thousands of grid exchanges, and (lattice) ties
        // decided across blocks once the 864 distinct positions are taken.
        ("600k random, K=3000".into(), rng.cloud(600_000, 60.0), FpsParams { num_samples: 3000, start_index: 4242 }),
        ("lattice dups 300k, K=1500".into(), rng.lattice(300_000, 12), FpsParams { num_samples: 1500, start_index: 0 }),
        // Sorted by position: most warps skip their update, and ties are decided among skipping ones.
        (
            "lattice dups 20000 sorted, K=2048".into(),
            sorted_by_position(&rng.lattice(20000, 12)),
            FpsParams { num_samples: 2048, start_index: 5 },
        ),
        (
            "lattice dups 300k sorted, K=1500".into(),
            sorted_by_position(&rng.lattice(300_000, 12)),
            FpsParams { num_samples: 1500, start_index: 77 },
        ),
        (
            "600k random sorted, K=3000".into(),
            sorted_by_position(&rng.cloud(600_000, 60.0)),
            FpsParams { num_samples: 3000, start_index: 0 },
        ),
    ];
    for (case, cloud, p) in &cases {
        let (dev, host) = upload_cloud(ctx, cloud)?;
        single(&mut rows, case, (&dev).into(), &host, p)?;
    }

    // Batched ragged clouds (one device cloud, clouds back to back).
    let mut batched = |case: &str, clouds: &[Cloud], p: &FpsParams| -> Result<(), VerifyError> {
        let lengths: Vec<usize> = clouds.iter().map(|c| c.len()).collect();
        let (dev, host) = upload_cloud(ctx, &back_to_back(clouds))?;
        let cpu = cpu_fps::farthest_point_sample_batched(&host, &lengths, p)?;
        let g1 = farthest_point_sample_batched_with(ctx, &mut scratch, (&dev).into(), &lengths, p)?;
        let plan = scratch.last_plan.clone();
        let g2 = farthest_point_sample_batched_with(ctx, &mut scratch, (&dev).into(), &lengths, p)?;
        let same = g1 == cpu;
        let mut detail =
            format!("B={} lengths {:?} K={} via {} x{}", lengths.len(), lengths, p.num_samples, plan.0, plan.1);
        if !same {
            detail += &format!("; {}", first_diff(&g1.indices, &cpu.indices));
        }
        rows.push(row("fps_batched", case, host.len(), same, g1 == g2, detail));
        Ok(())
    };
    let ragged: Vec<Cloud> = vec![
        rng.cloud(5000, 20.0),
        Cloud::from_xyz(vec![], vec![], vec![]),
        rng.cloud(1, 1.0),
        rng.lattice(16384, 10),
        rng.cloud(300, 5.0),
        rng.cloud(20000, 30.0),
    ];
    batched("ragged 6 clouds (one empty), K=512", &ragged, &FpsParams { num_samples: 512, start_index: 0 })?;
    if let Some(f) = files.iter().find(|f| f.ends_with("os1-128_scan0.bin")) {
        let scan = crate::bag::sample::load_ouster_bin(f).map_err(|e| VerifyError::workload(f, e))?;
        let clouds: Vec<Cloud> = (0..8)
            .map(|b| {
                let idx: Vec<usize> = (0..16384).map(|j| (j * 6 + b) % scan.len()).collect();
                let s = scan.select(&idx);
                Cloud::from_xyz(s.x().to_vec(), s.y().to_vec(), s.z().to_vec())
            })
            .collect();
        batched("scan0 8 x 16384, K=1024", &clouds, &FpsParams { num_samples: 1024, start_index: 0 })?;
    }

    // Every cluster kernel (sm_90+), launched with its own shape rather than the planner's: three
    // blocks, the last one partly filled.
    if ctx.compute_capability.0 >= 9 {
        for block in CLUSTER_BLOCKS {
            for ppt in CLUSTER_PPT {
                let shape = ClusterShape { block, ppt, group: 3 };
                let n = 2 * block * ppt + block * ppt / 2 + 7;
                let (dev, host) = upload_cloud(ctx, &rng.cloud(n, 20.0))?;
                let p = FpsParams { num_samples: 256, start_index: n / 3 };
                let cpu = cpu_fps::farthest_point_sample(&host, &p)?;
                let case = format!("cluster kernel {block} threads x {ppt} points x 3 blocks, {n} random, K=256");
                if cluster_capacity(ctx, shape, 1)? == 0 {
                    rows.push(row("fps", &case, n, false, false, "the shape cannot launch on this device".into()));
                    continue;
                }
                let mut runs = Vec::new();
                for _ in 0..2 {
                    launch_cluster(ctx, &mut scratch, (&dev).into(), &[0, n], &p, shape)?;
                    runs.push(scratch.download(ctx)?);
                }
                let same = runs[0] == cpu.indices;
                let detail =
                    if same { format!("via {}", scratch.last_plan.0) } else { first_diff(&runs[0], &cpu.indices) };
                rows.push(row("fps", &case, n, same, runs[0] == runs[1], detail));
            }
        }
        // The register path, launched directly: here the planner takes clusters for these clouds,
        // which GPUs before sm_90 (Orin, Xavier) run on it, one block per cloud (the winner's
        // coordinates from registers) or a few blocks exchanging.
        let grid_cases: Vec<(&str, Vec<Cloud>, FpsParams)> = vec![
            (
                "register path, 4 clouds of one block each",
                vec![rng.cloud(5000, 20.0), rng.cloud(1, 1.0), rng.lattice(3000, 8), rng.cloud(700, 5.0)],
                FpsParams { num_samples: 600, start_index: 0 },
            ),
            (
                "register path, 100k random over a few blocks",
                vec![rng.cloud(100_000, 50.0)],
                FpsParams { num_samples: 1024, start_index: 999 },
            ),
            (
                "register path, lattice dups 20000 over a few blocks",
                vec![rng.lattice(20000, 12)],
                FpsParams { num_samples: 1500, start_index: 5 },
            ),
            (
                "register path, 3 sorted clouds (one block, a few blocks)",
                vec![
                    sorted_by_position(&rng.lattice(6000, 10)),
                    sorted_by_position(&rng.cloud(60_000, 30.0)),
                    sorted_by_position(&rng.lattice(30_000, 12)),
                ],
                FpsParams { num_samples: 1200, start_index: 0 },
            ),
        ];
        for (case, clouds, p) in grid_cases {
            let lengths: Vec<usize> = clouds.iter().map(|c| c.len()).collect();
            let (dev, host) = upload_cloud(ctx, &back_to_back(&clouds))?;
            let cpu = cpu_fps::farthest_point_sample_batched(&host, &lengths, &p)?;
            let mut runs = Vec::new();
            for _ in 0..2 {
                launch_grid(ctx, &mut scratch, (&dev).into(), &cpu.offsets, &p)?;
                runs.push(scratch.download(ctx)?);
            }
            let same = runs[0] == cpu.indices;
            let plan = &scratch.last_plan;
            let detail = if same {
                format!("lengths {lengths:?} K={} via {} x{}", p.num_samples, plan.0, plan.1)
            } else {
                first_diff(&runs[0], &cpu.indices)
            };
            rows.push(row("fps_batched", case, host.len(), same, runs[0] == runs[1], detail));
        }
    }
    Ok(rows)
}

/// A few small FPS cases (single and batched, every path the planner picks for them) for
/// compute-sanitizer runs.
pub fn check_quick(ctx: &GpuContext, seed: u64) -> Result<Vec<CheckRow>, VerifyError> {
    let mut rows = Vec::new();
    let mut scratch = FpsScratch::new(ctx)?;
    let mut rng = Rng::new(seed);
    for (case, cloud, p) in [
        ("300 random, K=40", rng.cloud(300, 10.0), FpsParams { num_samples: 40, start_index: 17 }),
        ("4000 random, K=64", rng.cloud(4000, 20.0), FpsParams { num_samples: 64, start_index: 123 }),
        ("lattice 20000, K=64", rng.lattice(20000, 12), FpsParams { num_samples: 64, start_index: 5 }),
    ] {
        let (dev, host) = upload_cloud(ctx, &cloud)?;
        let cpu = cpu_fps::farthest_point_sample(&host, &p)?;
        let g = farthest_point_sample_with(ctx, &mut scratch, (&dev).into(), &p)?;
        let same = g.indices == cpu.indices;
        let detail =
            format!("via {} x{} {}", scratch.last_plan.0, scratch.last_plan.1, first_diff(&g.indices, &cpu.indices));
        rows.push(row("fps", case, host.len(), same, true, detail));
    }
    let clouds =
        [rng.cloud(5000, 20.0), Cloud::from_xyz(vec![], vec![], vec![]), rng.cloud(1, 1.0), rng.cloud(17000, 30.0)];
    let lengths: Vec<usize> = clouds.iter().map(|c| c.len()).collect();
    let (mut x, mut y, mut z) = (Vec::new(), Vec::new(), Vec::new());
    for c in &clouds {
        x.extend_from_slice(c.x());
        y.extend_from_slice(c.y());
        z.extend_from_slice(c.z());
    }
    let (dev, host) = upload_cloud(ctx, &Cloud::from_xyz(x, y, z))?;
    let p = FpsParams { num_samples: 64, start_index: 0 };
    let cpu = cpu_fps::farthest_point_sample_batched(&host, &lengths, &p)?;
    let g = farthest_point_sample_batched_with(ctx, &mut scratch, (&dev).into(), &lengths, &p)?;
    let detail =
        format!("via {} x{} {}", scratch.last_plan.0, scratch.last_plan.1, first_diff(&g.indices, &cpu.indices));
    rows.push(row("fps_batched", "ragged 4 clouds, K=64", host.len(), g == cpu, true, detail));
    Ok(rows)
}

/// FPS benchmarks on the fixed workloads (W2a, W2b, W2c).
pub fn bench(ctx: &GpuContext, workloads: &Path) -> Result<Vec<BenchRow>, VerifyError> {
    let mut rows = Vec::new();
    let mut scratch = FpsScratch::new(ctx)?;
    let mut one = |name: &str,
                   wl: &str,
                   clouds: usize,
                   k: usize,
                   runs: usize,
                   target: Option<f64>,
                   peer: Option<f64>|
     -> Result<(), VerifyError> {
        let (x, y, z) = workload_xyz(workloads, wl)?;
        let n = x.len();
        let buf = upload_xyz(ctx, &x, &y, &z)?;
        let pts = DeviceXyz::new(&buf, n, n)?;
        let per = n / clouds;
        let offsets: Vec<usize> = (0..=clouds).map(|b| b * per).collect();
        let p = FpsParams { num_samples: k, start_index: 0 };
        let ms = time_ms(ctx, 2, runs, || fps_enqueue(ctx, &mut scratch, pts, &offsets, &p))?;
        rows.push(BenchRow {
            operator: "fps".into(),
            workload: name.into(),
            points: n,
            median_ms: ms,
            runs,
            min_bytes: (n * 12 + clouds * k * 4) as u64,
            target_ms: target,
            peer_ms: peer,
            note: format!("{} clouds, K={k}, {} x{} blocks/cloud", clouds, scratch.last_plan.0, scratch.last_plan.1),
        });
        Ok(())
    };
    one("W2a scan0 107,647 -> 4096", "scan0_xyz", 1, 4096, 20, Some(3.0), Some(291.0))?;
    one("W2b 8 x 16384 -> 1024", "w2b_xyz", 8, 1024, 20, Some(1.0), Some(11.5))?;
    one("W2c 1M -> 16384", "w2c_xyz", 1, 16384, 5, None, Some(10526.0))?;
    Ok(rows)
}
