//! The published messages keep what came in: pass-through fields bit for bit in their own
//! datatype, wide fields' means computed in f64, integer fields exact for any cloud size, hard
//! voxels as [V, P, C] features, neighbourhood rows naming their query.

use lidar_kernels::cloud::{CloudMessage, CloudView, Datatype, Header, PointCloud2, PointField};
use lidar_kernels::pipeline::{Pipeline, PipelineConfig, DOWNSAMPLED_TOPIC, NEIGHBORHOODS_TOPIC, SAMPLES_TOPIC};
use rand::{Rng, SeedableRng};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// x, y, z f32 at 0, 4, 8; intensity f32 at 12; `timestamp` FLOAT64 at 16 (absolute seconds, as
/// Hesai/Velodyne drivers publish it); `t` UINT32 at 24 (ns offsets far above 2^24); 4 bytes of
/// padding; point_step 32.
fn wide_layout() -> Vec<PointField> {
    vec![
        PointField::new("x", 0, Datatype::Float32),
        PointField::new("y", 4, Datatype::Float32),
        PointField::new("z", 8, Datatype::Float32),
        PointField::new("intensity", 12, Datatype::Float32),
        PointField::new("timestamp", 16, Datatype::Float64),
        PointField::new("t", 24, Datatype::Uint32),
    ]
}

fn message(records: Vec<u8>, n: usize) -> Vec<u8> {
    PointCloud2 {
        header: Header { stamp_sec: 1_700_000_000, stamp_nanosec: 5, frame_id: "lidar".into() },
        height: 1,
        width: n as u32,
        fields: wide_layout(),
        is_bigendian: false,
        point_step: 32,
        row_step: 32 * n as u32,
        data: Cow::Owned(records),
        is_dense: true,
    }
    .to_cdr()
}

struct Point {
    xyz: [f32; 3],
    stamp: f64,
    t: u32,
}

fn record(p: &Point, intensity: f32, pad: u32) -> Vec<u8> {
    let mut r = Vec::with_capacity(32);
    for v in p.xyz {
        r.extend_from_slice(&v.to_le_bytes());
    }
    r.extend_from_slice(&intensity.to_le_bytes());
    r.extend_from_slice(&p.stamp.to_le_bytes());
    r.extend_from_slice(&p.t.to_le_bytes());
    r.extend_from_slice(&pad.to_le_bytes());
    r
}

fn config(yaml: &str) -> PipelineConfig {
    PipelineConfig::from_yaml(yaml, "test").unwrap()
}

fn topic<'m>(msgs: &'m [(&'static str, CloudMessage)], name: &str) -> CloudView<'m> {
    msgs.iter().find(|(t, _)| *t == name).unwrap_or_else(|| panic!("no {name}")).1.view()
}

/// Samples are the input's records, byte for byte (FLOAT64 stamp, UINT32 t, even the padding);
/// the downsampled stamps and t are the f64 means of their voxel's points.
#[test]
fn float64_stamps_and_uint32_offsets_come_out_exact() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // Points 0.05 m around the centres of 0.2 m voxels, so the voxel of each point is known here.
    let mut points = Vec::new();
    for v in 0..300 {
        let centre = [(v % 10) as f32 * 0.2 + 0.1, ((v / 10) % 10) as f32 * 0.2 + 0.1, (v / 100) as f32 * 0.2 + 0.1];
        for _ in 0..rng.random_range(1..6) {
            let mut jitter = || rng.random_range(-0.05f32..0.05);
            let xyz = [centre[0] + jitter(), centre[1] + jitter(), centre[2] + jitter()];
            let stamp = 1_733_000_000.0 + rng.random_range(0.0..0.1);
            points.push((v, Point { xyz, stamp, t: rng.random_range(50_000_000..100_000_000) }));
        }
    }
    // Shuffle so a voxel's points are not contiguous.
    for i in (1..points.len()).rev() {
        let j = rng.random_range(0..=i);
        points.swap(i, j);
    }
    let n = points.len();
    let records: Vec<Vec<u8>> =
        points.iter().enumerate().map(|(i, (_, p))| record(p, i as f32, 0xdead_0000 + i as u32)).collect();
    let cdr = message(records.concat(), n);
    let cfg = config(
        "voxelize: {enabled: false}\nneighbors: {enabled: false}\nfps: {num_samples: 64, start_index: 3}\n\
         downsample: {voxel_size: [0.2, 0.2, 0.2], point_cloud_range: [0, 0, 0, 2, 2, 2]}",
    );
    let mut pipeline = Pipeline::new(cfg.clone());
    let frame = pipeline.process_cdr(&cdr).unwrap();
    let msgs = frame.messages();

    let samples = topic(msgs, SAMPLES_TOPIC);
    let indices = frame.results.samples.as_ref().unwrap();
    assert_eq!(samples.len(), 64);
    for (k, &i) in indices.iter().enumerate() {
        assert_eq!(samples.record(k), &records[i as usize][..], "sample {k} (point {i})");
    }

    // Downsampled: group by the known voxel, in input order, f64 sums.
    let mut groups: BTreeMap<[i32; 3], (u32, f64, f64, usize)> = BTreeMap::new();
    for (order, (_, p)) in points.iter().enumerate() {
        let key = [(p.xyz[2] / 0.2) as i32, (p.xyz[1] / 0.2) as i32, (p.xyz[0] / 0.2) as i32];
        let g = groups.entry(key).or_insert((0, 0.0, 0.0, order));
        g.0 += 1;
        g.1 += p.stamp;
        g.2 += p.t as f64;
    }
    let down = topic(msgs, DOWNSAMPLED_TOPIC);
    assert_eq!(down.len(), groups.len());
    assert_eq!(down.layout, CloudView::decode(&cdr).unwrap().layout, "the input's own layout");
    // Output voxels are in first-point order.
    let mut expected: Vec<_> = groups.values().collect();
    expected.sort_by_key(|g| g.3);
    let (stamp_f, t_f) = (&down.layout.fields[4], &down.layout.fields[5]);
    for (v, (count, stamp_sum, t_sum, _)) in expected.into_iter().enumerate() {
        let stamp = down.value(stamp_f, v);
        assert_eq!(stamp.to_bits(), (stamp_sum / *count as f64).to_bits(), "voxel {v} stamp {stamp}");
        assert_eq!(down.value(t_f, v), (t_sum / *count as f64).round(), "voxel {v} t");
    }
}

/// A voxel whose FLOAT64 stamps hold NaNs publishes its first NaN, quieted, with its payload (the
/// CUDA backend reproduces these bits); a voxel without NaN is unaffected.
#[test]
fn a_nan_stamp_is_the_voxels_first_nan() {
    let signalling = f64::from_bits(0x7ff4_0000_dead_beef);
    let negative_quiet = f64::from_bits(0xfff8_0000_0000_0001);
    let at = |x: f32, stamp: f64| Point { xyz: [x, 0.1, 0.1], stamp, t: 7 };
    // Voxel 0: 1.5, then the signalling NaN, then the negative quiet NaN; voxel 1: finite only.
    let points = [at(0.1, 1.5), at(0.12, signalling), at(0.3, 2.0), at(0.14, negative_quiet), at(0.31, 4.0)];
    let records: Vec<u8> = points.iter().flat_map(|p| record(p, 0.0, 0)).collect();
    let cfg = config(
        "voxelize: {enabled: false}\nneighbors: {enabled: false}\nfps: {enabled: false}\n\
         downsample: {voxel_size: [0.2, 0.2, 0.2], point_cloud_range: [0, 0, 0, 2, 2, 2]}",
    );
    let cdr = message(records, points.len());
    let mut pipeline = Pipeline::new(cfg);
    let frame = pipeline.process_cdr(&cdr).unwrap();
    let down = topic(frame.messages(), DOWNSAMPLED_TOPIC);
    assert_eq!(down.len(), 2);
    let stamp = &down.layout.fields[4];
    assert_eq!(down.value(stamp, 0).to_bits(), 0x7ffc_0000_dead_beef, "quieted, payload kept");
    assert_eq!(down.value(stamp, 1), 3.0);
}

/// A 17.5 M-point cloud: indices above 2^24 (where float32 has no odd integers) come out exact in
/// `samples` (the record itself), `neighborhoods.index` and `neighborhoods.query_index`.
#[test]
fn indices_above_2_pow_24_are_exact() {
    const N: usize = 17_500_000;
    let start = N - 3; // odd and > 2^24: float32 would round it
                       // Distinct points on a 0.5 m lattice (exact in f32), 32-byte records.
    let mut data = vec![0u8; 32 * N];
    for (i, r) in data.chunks_exact_mut(32).enumerate() {
        let xyz = [(i % 256) as f32 * 0.5, ((i / 256) % 256) as f32 * 0.5, (i / 65536) as f32 * 0.5];
        r[..32].copy_from_slice(&record(&Point { xyz, stamp: i as f64, t: i as u32 }, 1.0, 0));
    }
    let cdr = message(data, N);
    let cfg = config(
        "voxelize: {enabled: false}\ndownsample: {enabled: false}\nfps: {num_samples: 2, start_index: 17499997}\n\
         neighbors: {mode: knn, knn: {k: 1}}",
    );
    assert_eq!(cfg.fps.params.start_index, start);
    let mut pipeline = Pipeline::new(cfg.clone());
    let frame = pipeline.process_cdr(&cdr).unwrap();
    let msgs = frame.messages();
    let samples = topic(msgs, SAMPLES_TOPIC);
    let t_field = &samples.layout.fields[5];
    assert_eq!(samples.value(t_field, 0), start as f64, "the start point's own t");
    let nb = topic(msgs, NEIGHBORHOODS_TOPIC);
    let field = |name: &str| nb.layout.fields.iter().find(|f| f.name == name).unwrap().clone();
    let (index, query, query_index) = (field("index"), field("query"), field("query_index"));
    assert_eq!((nb.msg.height, nb.msg.width), (2, 1));
    // k = 1: a point's nearest neighbour is itself (distance 0, lowest index first).
    let samples_idx = frame.results.samples.as_ref().unwrap();
    for q in 0..2 {
        assert_eq!(nb.value(&query, q), q as f64);
        assert_eq!(nb.value(&query_index, q), samples_idx[q] as f64);
        assert_eq!(nb.value(&index, q), samples_idx[q] as f64);
    }
    assert_eq!(samples_idx[0] as usize, start);
}

/// `voxel_features` is [V, P, C]: one row per voxel of `voxels` (same order), the voxel's points
/// in its first num_points slots (inside that voxel), zeros after.
#[test]
fn hard_voxels_are_published_as_features() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let n = 5000;
    let pts: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let xyz =
                [rng.random_range(-20.0f32..20.0), rng.random_range(-20.0f32..20.0), rng.random_range(-2.0f32..2.0)];
            record(&Point { xyz, stamp: 0.0, t: 0 }, i as f32 + 1.0, 0)
        })
        .collect();
    let cdr = message(pts.concat(), n);
    let cfg = config("voxelize: {voxel_size: [2, 2, 4], max_points_per_voxel: 8}\nfps: {enabled: false}\nneighbors: {enabled: false}");
    let mut pipeline = Pipeline::new(cfg.clone());
    let frame = pipeline.process_cdr(&cdr).unwrap();
    let msgs = frame.messages();
    let voxels = topic(msgs, "voxels");
    let feats = topic(msgs, "voxel_features");
    let names: Vec<&str> = feats.layout.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["x", "y", "z", "intensity"]);
    assert_eq!((feats.msg.height as usize, feats.msg.width), (voxels.len(), 8));
    let vf = |name: &str| voxels.layout.fields.iter().find(|f| f.name == name).unwrap().clone();
    let (np, cz, cy, cx) = (vf("num_points"), vf("voxel_z"), vf("voxel_y"), vf("voxel_x"));
    for v in 0..voxels.len() {
        let count = voxels.value(&np, v) as usize;
        let coord = [voxels.value(&cx, v), voxels.value(&cy, v), voxels.value(&cz, v)];
        for s in 0..8 {
            let slot = v * 8 + s;
            let xyz = feats.xyz(slot);
            let intensity = feats.value(&feats.layout.fields[3], slot);
            if s < count {
                let cell =
                    [((xyz[0] + 51.2) / 2.0).floor(), ((xyz[1] + 51.2) / 2.0).floor(), ((xyz[2] + 5.0) / 4.0).floor()];
                assert_eq!(cell.map(|c| c as f64), coord, "voxel {v} slot {s}");
                assert!(intensity >= 1.0, "a real point's intensity");
            } else {
                assert_eq!((xyz, intensity), ([0.0; 3], 0.0), "padding of voxel {v} slot {s}");
            }
        }
    }
}

/// An empty cloud goes through every stage and gives empty messages.
#[test]
fn empty_cloud_gives_empty_outputs() {
    let cdr = message(Vec::new(), 0);
    let mut pipeline = Pipeline::new(PipelineConfig::default());
    let frame = pipeline.process_cdr(&cdr).unwrap();
    assert_eq!(frame.messages().len(), 5);
    for (topic, m) in frame.messages() {
        assert_eq!((m.num_points(), m.view().len()), (0, 0), "{topic}");
    }
}

/// `voxelize.features_dtype: float16` publishes the same [V, P, C] values as IEEE binary16 bits
/// (round to nearest even) in UINT16 fields.
#[test]
fn voxel_features_as_float16() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let n = 3000;
    let pts: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let xyz =
                [rng.random_range(-30.0f32..30.0), rng.random_range(-30.0f32..30.0), rng.random_range(-2.0f32..2.0)];
            record(&Point { xyz, stamp: 0.0, t: 0 }, rng.random_range(0.0f32..70000.0), 0)
        })
        .collect();
    let cdr = message(pts.concat(), n);
    let run = |yaml: &str| {
        let mut pipeline = Pipeline::new(config(yaml));
        let frame = pipeline.process_cdr(&cdr).unwrap();
        frame.messages().iter().find(|(t, _)| *t == "voxel_features").unwrap().1.clone()
    };
    let base = "fps: {enabled: false}\nneighbors: {enabled: false}\ndownsample: {enabled: false}\n";
    let f32_msg = run(base);
    let f16_msg = run(&format!("{base}voxelize: {{features_dtype: float16}}"));
    let (a, b) = (f32_msg.view(), f16_msg.view());
    assert_eq!((b.msg.height, b.msg.width, b.layout.point_step), (a.msg.height, a.msg.width, 8));
    assert!(b.layout.fields.iter().all(|f| f.datatype == Datatype::Uint16 as u8));
    assert!(a.len() > 0);
    for i in 0..a.len() {
        for (fa, fb) in a.layout.fields.iter().zip(&b.layout.fields) {
            let expected = half::f16::from_f32(a.value(fa, i) as f32).to_bits();
            assert_eq!(b.value(fb, i), expected as f64, "slot {i} field {}", fa.name);
        }
    }
}

/// With `fps.input: downsampled` the neighbourhoods carry the points the search read, the float32
/// centroids, even where the input's x, y, z are integers (INT16 here), which `downsampled`
/// rounds back into its INT16 fields.
#[test]
fn neighborhoods_carry_the_searched_points() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let n = 3000;
    let fields = vec![
        PointField::new("x", 0, Datatype::Int16),
        PointField::new("y", 2, Datatype::Int16),
        PointField::new("z", 4, Datatype::Int16),
    ];
    let pts: Vec<[i16; 3]> =
        (0..n).map(|_| [rng.random_range(-40..40), rng.random_range(-40..40), rng.random_range(-4..4)]).collect();
    let data: Vec<u8> = pts.iter().flat_map(|p| p.iter().flat_map(|v| v.to_le_bytes())).collect();
    let cdr = PointCloud2 {
        header: Header { stamp_sec: 3, stamp_nanosec: 0, frame_id: "lidar".into() },
        height: 1,
        width: n as u32,
        fields,
        is_bigendian: false,
        point_step: 6,
        row_step: 6 * n as u32,
        data: Cow::Owned(data),
        is_dense: true,
    }
    .to_cdr();
    let cfg = config(
        "voxelize: {enabled: false}\nfeatures: []\ndownsample: {voxel_size: [3, 3, 3]}\nfps: {input: downsampled, num_samples: 64}\nneighbors: {mode: knn, knn: {k: 8}}",
    );
    let mut pipeline = Pipeline::new(cfg);
    let frame = pipeline.process_cdr(&cdr).unwrap();
    let msgs = frame.messages();
    let (down, nbrs) = (topic(msgs, DOWNSAMPLED_TOPIC), topic(msgs, NEIGHBORHOODS_TOPIC));
    // Independently: each occupied 3 m voxel's mean in f64, rounded to f32, in order of first point.
    let grid = |v: i16, min: f64| ((v as f64 - min) / 3.0).floor() as i64;
    let mut groups: Vec<([i64; 3], Vec<usize>)> = Vec::new();
    let mut slot_of: BTreeMap<[i64; 3], usize> = BTreeMap::new();
    for (i, p) in pts.iter().enumerate() {
        let key = [grid(p[0], -100.0), grid(p[1], -100.0), grid(p[2], -10.0)];
        let g = *slot_of.entry(key).or_insert_with(|| {
            groups.push((key, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(i);
    }
    let centroid = |g: usize| -> [f32; 3] {
        let members = &groups[g].1;
        [0, 1, 2].map(|a| (members.iter().map(|&i| pts[i][a] as f64).sum::<f64>() / members.len() as f64) as f32)
    };
    assert_eq!(down.len(), groups.len());
    let index = nbrs.layout.fields.iter().find(|f| f.name == "index").unwrap().clone();
    let mut fractional = 0;
    for slot in 0..nbrs.len() {
        let i = nbrs.value(&index, slot) as usize;
        let want = centroid(i);
        assert_eq!(nbrs.xyz(slot).map(f32::to_bits), want.map(f32::to_bits), "slot {slot} (point {i})");
        fractional += want.iter().any(|v| v.fract() != 0.0) as usize;
    }
    assert!(fractional > 0, "the case has non-integer centroids");
}
