mod common;

// Voxelization operators (src/ops/voxel.rs) against an oracle written independently here from
// the doc comments: coordinates re-derived with the documented f32 formula (not by calling
// `VoxelGrid::coord`), voxels grouped with a BTreeMap and then sorted by first point, capacity
// limits applied afterwards, means and pillar features recomputed from the documented arithmetic.
// Float outputs are compared bit for bit.

use std::collections::BTreeMap;

use lidar_kernels::cloud::{Cloud, Datatype, Header};
use lidar_kernels::ops::voxel::{
    hard_centroids, pillar_features, voxel_grid_downsample, voxelize_dynamic, voxelize_hard, DynamicVoxels,
    FeaturesDtype, FeaturesLayout, HardVoxelParams, HardVoxels, PillarFeatures, PublishedHardVoxels, VoxelGrid,
};
use lidar_kernels::ops::{ParamError, Validate};
use proptest::prelude::*;

// =============================================================================================
// Oracle
// =============================================================================================

/// Grid dims from the doc: per axis, f32 `(max - min) / size`, rounded half to even.
fn o_dims(g: &VoxelGrid) -> [f32; 3] {
    let r = &g.point_cloud_range;
    let s = &g.voxel_size;
    [
        ((r[3] - r[0]) / s[0]).round_ties_even(),
        ((r[4] - r[1]) / s[1]).round_ties_even(),
        ((r[5] - r[2]) / s[2]).round_ties_even(),
    ]
}

/// Voxel coordinate (x, y, z) from the doc: `c = floor((p - min) / size)` in f32; out of range when
/// any c < 0 or c >= dim (or c is NaN).
fn o_coord(g: &VoxelGrid, p: [f32; 3]) -> Option<[i32; 3]> {
    let dims = o_dims(g);
    let mut out = [0i32; 3];
    for a in 0..3 {
        let diff: f32 = p[a] - g.point_cloud_range[a];
        let q: f32 = diff / g.voxel_size[a];
        let c = q.floor();
        if c.is_nan() || c < 0.0 || c >= dims[a] {
            return None;
        }
        out[a] = c as i32;
    }
    Some(out)
}

struct OGroup {
    /// x, y, z
    xyz: [i32; 3],
    /// Input indices, increasing.
    points: Vec<usize>,
}

/// All occupied voxels, in order of their first point, plus the out-of-range count.
fn o_groups(cloud: &Cloud, g: &VoxelGrid) -> (Vec<OGroup>, usize) {
    let mut map: BTreeMap<[i32; 3], Vec<usize>> = BTreeMap::new();
    let mut oor = 0;
    for i in 0..cloud.len() {
        match o_coord(g, cloud.point(i)) {
            Some(c) => map.entry(c).or_default().push(i),
            None => oor += 1,
        }
    }
    let mut groups: Vec<OGroup> = map.into_iter().map(|(xyz, points)| OGroup { xyz, points }).collect();
    groups.sort_by_key(|gr| gr.points[0]);
    (groups, oor)
}

fn o_hard(cloud: &Cloud, params: &HardVoxelParams) -> HardVoxels {
    let (groups, oor) = o_groups(cloud, &params.grid);
    let p = params.max_points_per_voxel as usize;
    let c = cloud.num_channels();
    let mut out = HardVoxels { num_channels: c, max_points: p, dropped_out_of_range: oor, ..Default::default() };
    for (rank, gr) in groups.iter().enumerate() {
        if rank >= params.max_voxels as usize {
            out.dropped_voxel_capacity += gr.points.len();
            continue;
        }
        let kept = gr.points.len().min(p);
        out.dropped_point_capacity += gr.points.len() - kept;
        out.coords.push([gr.xyz[2], gr.xyz[1], gr.xyz[0]]);
        out.num_points.push(kept as u32);
        for s in 0..p {
            for k in 0..c {
                out.features.push(if s < kept { cloud.columns()[k][gr.points[s]] } else { 0.0 });
            }
        }
    }
    out
}

/// `[V, C]` centroids of the kept points of each hard voxel: f64 sum in input order from -0.0,
/// divided by the count in f64, rounded to f32 (the doc of `hard_centroids`).
fn o_centroids(cloud: &Cloud, params: &HardVoxelParams) -> Vec<f32> {
    let (groups, _) = o_groups(cloud, &params.grid);
    let p = params.max_points_per_voxel as usize;
    let mut out = Vec::new();
    for gr in groups.iter().take(params.max_voxels as usize) {
        let kept = &gr.points[..gr.points.len().min(p)];
        for col in cloud.columns() {
            let mut sum = -0.0f64;
            for &i in kept {
                sum += col[i] as f64;
            }
            out.push((sum / kept.len() as f64) as f32);
        }
    }
    out
}

fn o_dynamic(cloud: &Cloud, g: &VoxelGrid) -> DynamicVoxels {
    let (groups, oor) = o_groups(cloud, g);
    let c = cloud.num_channels();
    let n = cloud.len();
    let mut out = DynamicVoxels {
        point_coords: vec![[-1, -1, -1]; n],
        point_voxel: vec![-1; n],
        num_channels: c,
        dropped_out_of_range: oor,
        ..Default::default()
    };
    for (v, gr) in groups.iter().enumerate() {
        let zyx = [gr.xyz[2], gr.xyz[1], gr.xyz[0]];
        out.voxel_coords.push(zyx);
        out.num_points.push(gr.points.len() as u32);
        for &i in &gr.points {
            out.point_coords[i] = zyx;
            out.point_voxel[i] = v as i32;
        }
        for k in 0..c {
            let mut sum = 0.0f64;
            for &i in &gr.points {
                sum += cloud.columns()[k][i] as f64;
            }
            out.means.push((sum / gr.points.len() as f64) as f32);
        }
    }
    out
}

fn o_downsample(cloud: &Cloud, g: &VoxelGrid) -> (Vec<Vec<f32>>, usize) {
    let (groups, oor) = o_groups(cloud, g);
    let mut cols = vec![Vec::new(); cloud.num_channels()];
    for gr in &groups {
        for (k, col) in cols.iter_mut().enumerate() {
            let sum: f64 = gr.points.iter().map(|&i| cloud.columns()[k][i] as f64).fold(0.0, |a, b| a + b);
            col.push((sum / gr.points.len() as f64) as f32);
        }
    }
    (cols, oor)
}

/// Pillar features from the doc, computed from (oracle) hard voxels.
fn o_pillars(h: &HardVoxels, g: &VoxelGrid, with_range: bool) -> Vec<f32> {
    let oc = if with_range { 10 } else { 9 };
    let (p, c) = (h.max_points, h.num_channels);
    let mut out = Vec::new();
    for v in 0..h.coords.len() {
        let n = h.num_points[v] as usize;
        let at = |s: usize, k: usize| h.features[(v * p + s) * c + k];
        let mut mean = [0.0f32; 3];
        for (a, m) in mean.iter_mut().enumerate() {
            let mut sum = 0.0f32;
            for s in 0..n {
                sum += at(s, a);
            }
            *m = sum / n as f32;
        }
        let centre_x = (h.coords[v][2] as f32 + 0.5) * g.voxel_size[0] + g.point_cloud_range[0];
        let centre_y = (h.coords[v][1] as f32 + 0.5) * g.voxel_size[1] + g.point_cloud_range[1];
        for s in 0..p {
            if s >= n {
                out.extend(std::iter::repeat_n(0.0f32, oc));
                continue;
            }
            let (x, y, z, i) = (at(s, 0), at(s, 1), at(s, 2), at(s, 3));
            out.extend([x, y, z, i, x - mean[0], y - mean[1], z - mean[2], x - centre_x, y - centre_y]);
            if with_range {
                let xx = x * x;
                let yy = y * y;
                let zz = z * z;
                out.push(((xx + yy) + zz).sqrt());
            }
        }
    }
    out
}

// =============================================================================================
// Comparison helpers (bit-exact)
// =============================================================================================

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn assert_hard_eq(got: &HardVoxels, exp: &HardVoxels, ctx: &str) {
    assert_eq!(got.num_channels, exp.num_channels, "{ctx}: num_channels");
    assert_eq!(got.max_points, exp.max_points, "{ctx}: max_points");
    assert_eq!(got.coords, exp.coords, "{ctx}: coords");
    assert_eq!(got.num_points, exp.num_points, "{ctx}: num_points");
    assert_eq!(got.dropped_out_of_range, exp.dropped_out_of_range, "{ctx}: dropped_out_of_range");
    assert_eq!(got.dropped_point_capacity, exp.dropped_point_capacity, "{ctx}: dropped_point_capacity");
    assert_eq!(got.dropped_voxel_capacity, exp.dropped_voxel_capacity, "{ctx}: dropped_voxel_capacity");
    assert!(bits(&got.features) == bits(&exp.features), "{ctx}: features differ");
}

fn assert_dynamic_eq(got: &DynamicVoxels, exp: &DynamicVoxels, ctx: &str) {
    assert_eq!(got.num_channels, exp.num_channels, "{ctx}: num_channels");
    assert_eq!(got.point_coords, exp.point_coords, "{ctx}: point_coords");
    assert_eq!(got.point_voxel, exp.point_voxel, "{ctx}: point_voxel");
    assert_eq!(got.voxel_coords, exp.voxel_coords, "{ctx}: voxel_coords");
    assert_eq!(got.num_points, exp.num_points, "{ctx}: num_points");
    assert_eq!(got.dropped_out_of_range, exp.dropped_out_of_range, "{ctx}: dropped_out_of_range");
    assert!(bits(&got.means) == bits(&exp.means), "{ctx}: means differ");
}

fn assert_cloud_bits_eq(got: &Cloud, exp_names: &[String], exp_cols: &[Vec<f32>], ctx: &str) {
    assert_eq!(got.names(), exp_names, "{ctx}: names");
    assert_eq!(got.num_channels(), exp_cols.len(), "{ctx}: channels");
    for (k, (g, e)) in got.columns().iter().zip(exp_cols).enumerate() {
        assert!(bits(g) == bits(e), "{ctx}: channel {k} differs");
    }
}

/// The hard voxels as the pipeline publishes them: the `voxel_features` message holds the oracle's
/// features as little-endian FLOAT32 fields (or binary16 bits in UINT16 fields), V rows of P.
fn check_published(hard: &HardVoxels, exp: &HardVoxels, exp_centroids: &[f32], ctx: &str) {
    let names: Vec<String> = ["x", "y", "z", "intensity"]
        .into_iter()
        .take(exp.num_channels)
        .map(String::from)
        .chain((4..exp.num_channels).map(|k| format!("f{k}")))
        .collect();
    let header = Header { stamp_sec: 3, stamp_nanosec: 4, frame_id: "voxel_test".into() };
    for dtype in [FeaturesDtype::Float32, FeaturesDtype::Float16] {
        let layout = FeaturesLayout { header: &header, names: &names, dtype };
        let p = PublishedHardVoxels::from_host(hard, &layout);
        assert_eq!(p.counts.voxels, exp.voxel_count(), "{ctx}");
        assert_eq!(p.counts.kept_points, exp.num_points.iter().map(|&n| n as usize).sum::<usize>(), "{ctx}");
        // `voxels`: per voxel its centroid x, y, z (and intensity), num_points, voxel z, y, x.
        let voxels = p.voxels.view();
        let with_intensity = exp.num_channels > 3;
        let expect_names = ["x", "y", "z", "intensity", "num_points", "voxel_z", "voxel_y", "voxel_x"];
        let got_names: Vec<&str> = voxels.layout.fields.iter().map(|f| f.name.as_str()).collect();
        let want_names: Vec<&str> =
            expect_names.iter().copied().filter(|&n| with_intensity || n != "intensity").collect();
        assert_eq!(got_names, want_names, "{ctx}: voxels fields");
        assert_eq!(voxels.len(), exp.voxel_count(), "{ctx}");
        let c = exp.num_channels;
        for v in 0..exp.voxel_count() {
            let word = |k: usize| u32::from_le_bytes(voxels.record(v)[4 * k..4 * k + 4].try_into().unwrap());
            let mut want = vec![
                exp_centroids[v * c].to_bits(),
                exp_centroids[v * c + 1].to_bits(),
                exp_centroids[v * c + 2].to_bits(),
            ];
            if with_intensity {
                want.push(exp_centroids[v * c + 3].to_bits());
            }
            want.push(exp.num_points[v]);
            want.extend(exp.coords[v].map(|a| a as u32));
            assert_eq!((0..want.len()).map(word).collect::<Vec<_>>(), want, "{ctx}: voxels record {v}");
        }
        let view = p.features.view();
        assert_eq!((view.msg.height as usize, view.msg.width as usize), (exp.voxel_count(), exp.max_points), "{ctx}");
        assert_eq!(view.msg.header, header);
        let (size, datatype) = match dtype {
            FeaturesDtype::Float32 => (4, Datatype::Float32),
            FeaturesDtype::Float16 => (2, Datatype::Uint16),
        };
        for (k, f) in view.layout.fields.iter().enumerate() {
            assert_eq!((f.name.as_str(), f.offset as usize, f.datatype), (names[k].as_str(), k * size, datatype as u8));
        }
        let want: Vec<u8> = match dtype {
            FeaturesDtype::Float32 => exp.features.iter().flat_map(|v| v.to_le_bytes()).collect(),
            FeaturesDtype::Float16 => {
                exp.features.iter().flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes()).collect()
            }
        };
        assert!(view.msg.data[..] == want[..], "{ctx}: {dtype:?} records");
        let dense = exp.num_points.iter().all(|&n| n as usize == exp.max_points);
        assert_eq!(view.msg.is_dense, dense, "{ctx}: is_dense");
    }
}

/// Runs all four operators and checks each against the oracle.
fn check_all_against_oracle(cloud: &Cloud, params: &HardVoxelParams, ctx: &str) {
    let g = &params.grid;
    let hard = voxelize_hard(cloud, params).expect("valid params");
    let exp_hard = o_hard(cloud, params);
    assert_hard_eq(&hard, &exp_hard, &format!("{ctx} hard"));
    let exp_centroids = o_centroids(cloud, params);
    assert!(bits(&hard_centroids(&hard)) == bits(&exp_centroids), "{ctx} centroids differ");
    check_published(&hard, &exp_hard, &exp_centroids, ctx);

    let dynamic = voxelize_dynamic(cloud, g);
    assert_dynamic_eq(&dynamic, &o_dynamic(cloud, g), &format!("{ctx} dynamic"));

    let down = voxel_grid_downsample(cloud, g);
    let (cols, oor) = o_downsample(cloud, g);
    assert_eq!(down.dropped_out_of_range, oor, "{ctx} downsample oor");
    assert_cloud_bits_eq(&down.cloud, cloud.names(), &cols, &format!("{ctx} downsample"));

    for with_range in [false, true] {
        let pf = pillar_features(&hard, g, with_range);
        if cloud.num_channels() < 4 {
            let e = pf.expect_err("fewer than 4 channels must be rejected");
            assert_eq!(e.key, "voxels.num_channels");
        } else {
            let pf = pf.expect("4+ channels");
            assert_eq!(pf.num_channels, if with_range { 10 } else { 9 });
            assert_eq!(pf.max_points, params.max_points_per_voxel as usize);
            let exp = o_pillars(&exp_hard, g, with_range);
            assert!(bits(&pf.features) == bits(&exp), "{ctx} pillars (range {with_range}) differ");
        }
    }
}

// =============================================================================================
// (a) Property tests
// =============================================================================================

/// Per axis: (voxel size, min, voxels k, jitter on max in voxels).
fn axis_strategy() -> impl Strategy<Value = (f32, f32, u32, f32)> {
    (
        prop::sample::select(vec![0.1f32, 0.16, 0.2, 0.25, 0.3, 0.5, 0.7, 1.0, 4.0]),
        prop::sample::select(vec![0.0f32, -1.0, -0.3, -0.16, 0.1, -51.2, -39.68, 2.5]),
        1u32..6,
        prop::sample::select(vec![0.0f32, 0.0, 0.3, -0.3, 0.5, 0.49, 0.51]),
    )
}

fn grid_strategy() -> impl Strategy<Value = (VoxelGrid, [u32; 3])> {
    [axis_strategy(), axis_strategy(), axis_strategy()].prop_filter_map("grid with >= 1 voxel per axis", |ax| {
        let mut g = VoxelGrid { voxel_size: [0.0; 3], point_cloud_range: [0.0; 6] };
        for (a, &(s, lo, k, jitter)) in ax.iter().enumerate() {
            g.voxel_size[a] = s;
            g.point_cloud_range[a] = lo;
            g.point_cloud_range[a + 3] = lo + s * (k as f32 + jitter);
        }
        let ok =
            o_dims(&g).iter().all(|&d| d >= 1.0) && (0..3).all(|a| g.point_cloud_range[a + 3] > g.point_cloud_range[a]);
        ok.then_some((g, ax.map(|t| t.2)))
    })
}

/// Per axis: (kind, u in [0, 1), integer).
type AxisSpec = (u8, f32, u32);
/// (point kind, axes, extra channel values, integer).
type PointSpec = (u8, [AxisSpec; 3], [f32; 3], u16);

fn axis_spec() -> impl Strategy<Value = AxisSpec> {
    (0u8..4, 0.0f32..1.0, 0u32..16)
}

fn point_spec() -> impl Strategy<Value = PointSpec> {
    let extra = prop_oneof![9 => -300.0f32..300.0, 1 => any::<f32>()];
    (0u8..12, [axis_spec(), axis_spec(), axis_spec()], [extra.clone(), extra.clone(), extra], any::<u16>())
}

#[derive(Debug, Clone)]
struct CaseSpec {
    grid: VoxelGrid,
    k: [u32; 3],
    points: Vec<PointSpec>,
    extra_channels: usize,
    one_voxel: bool,
    max_points: u32,
    max_voxels: u32,
}

fn case_strategy() -> impl Strategy<Value = CaseSpec> {
    let count = prop_oneof![Just(0usize..1), Just(1usize..2), Just(2usize..9), Just(100usize..400)];
    (grid_strategy(), count, 0usize..4, prop::bool::weighted(0.15), 1u32..6, 1u32..14).prop_flat_map(
        |((grid, k), count, extra_channels, one_voxel, max_points, max_voxels)| {
            prop::collection::vec(point_spec(), count).prop_map(move |points| CaseSpec {
                grid,
                k,
                points,
                extra_channels,
                one_voxel,
                max_points,
                max_voxels,
            })
        },
    )
}

fn axis_value(g: &VoxelGrid, k: u32, a: usize, (kind, u, j): AxisSpec) -> f32 {
    let (s, lo, hi) = (g.voxel_size[a], g.point_cloud_range[a], g.point_cloud_range[a + 3]);
    let border = lo + s * (j % (k + 2)) as f32; // inner voxel borders, the range ends, one past
    match kind {
        0 => (lo - s) + u * ((hi - lo) + 2.0 * s),
        1 => border,
        2 => {
            if j % 2 == 0 {
                lo
            } else {
                hi
            }
        }
        _ => {
            if j % 2 == 0 {
                border.next_up()
            } else {
                border.next_down()
            }
        }
    }
}

fn build_cloud(spec: &CaseSpec) -> Cloud {
    let g = &spec.grid;
    let mut pts: Vec<[f32; 3]> = Vec::new();
    let mut extra: Vec<[f32; 3]> = Vec::new();
    for (i, &(kind, axes, ex, w)) in spec.points.iter().enumerate() {
        let p = if spec.one_voxel {
            // Strictly inside voxel (0, 0, 0): quotient in [0.05, 0.95].
            std::array::from_fn(|a| g.point_cloud_range[a] + g.voxel_size[a] * (0.05 + 0.9 * axes[a].1))
        } else if (kind == 9 || kind == 10) && i > 0 {
            pts[w as usize % i] // duplicate of an earlier point
        } else if kind == 11 {
            let mut p: [f32; 3] = std::array::from_fn(|a| axis_value(g, spec.k[a], a, axes[a]));
            p[w as usize % 3] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][(w / 3) as usize % 3];
            p
        } else {
            std::array::from_fn(|a| axis_value(g, spec.k[a], a, axes[a]))
        };
        pts.push(p);
        extra.push(ex);
    }
    let mut cloud = Cloud::from_points(&pts);
    for e in 0..spec.extra_channels {
        cloud = cloud.with_channel(&format!("ch{e}"), extra.iter().map(|x| x[e]).collect());
    }
    cloud
}

proptest! {
    // No regression file: test/ holds only files registered in Cargo.toml.
    #![proptest_config(ProptestConfig { cases: 384, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn prop_all_ops_match_oracle(spec in case_strategy()) {
        let cloud = build_cloud(&spec);
        let params = HardVoxelParams {
            grid: spec.grid,
            max_points_per_voxel: spec.max_points,
            max_voxels: spec.max_voxels,
        };
        params.validate().unwrap();
        check_all_against_oracle(&cloud, &params, "prop");
        // Same cloud with no capacity pressure: hard voxels then hold every in-range point.
        let roomy = HardVoxelParams { max_points_per_voxel: 512, max_voxels: 1024, ..params };
        check_all_against_oracle(&cloud, &roomy, "prop roomy");
        if spec.one_voxel {
            prop_assert!(voxelize_dynamic(&cloud, &spec.grid).voxel_count() <= 1);
        }
    }

    /// `VoxelGrid::coord` and `dims` (the public single definition) agree with the doc formula,
    /// including on borders, neighbours of borders and non-finite values.
    #[test]
    fn prop_coord_matches_doc((grid, k) in grid_strategy(), axes in prop::collection::vec([axis_spec(), axis_spec(), axis_spec()], 1..40)) {
        prop_assert_eq!(grid.dims(), o_dims(&grid).map(|d| d as i32));
        for ax in axes {
            let p: [f32; 3] = std::array::from_fn(|a| axis_value(&grid, k[a], a, ax[a]));
            prop_assert_eq!(grid.coord(p), o_coord(&grid, p), "p = {:?}", p);
        }
    }
}

// =============================================================================================
// (b) Hand-checked cases
// =============================================================================================

/// Grid 1 m cubes over [0,4) x [0,4) x [0,2): dims (4-0)/1 = 4, 4, (2-0)/1 = 2. All coordinates
/// below are dyadic, so every f32 operation is exact and floor() is read off directly.
fn unit_grid() -> VoxelGrid {
    VoxelGrid { voxel_size: [1.0, 1.0, 1.0], point_cloud_range: [0.0, 0.0, 0.0, 4.0, 4.0, 2.0] }
}

/// p0 (0.5, 0.5, 0.5)    -> voxel x0 y0 z0 (A)
/// p1 (1.5, 0.5, 0.5)    -> x1 y0 z0 (B)
/// p2 (0.25, 0.75, 0)    -> A (z = 0 exactly is the lower border: floor(0) = 0)
/// p3 (4, 0, 0)          -> out: x quotient 4 >= dim 4 (the range max is exclusive)
/// p4 (-0.5, 0, 0)       -> out: floor(-0.5) = -1 < 0
/// p5 (0.75, 0.25, 0.75) -> A
/// p6 (3, 3, 1)          -> x3 y3 z1 (C): exactly on borders, goes to the upper voxel
/// p7 (1, 0, 0)          -> B (on the x = 1 border)
/// intensity = 1..8 for p0..p7.
fn hand_cloud() -> Cloud {
    Cloud::from_points(&[
        [0.5, 0.5, 0.5],
        [1.5, 0.5, 0.5],
        [0.25, 0.75, 0.0],
        [4.0, 0.0, 0.0],
        [-0.5, 0.0, 0.0],
        [0.75, 0.25, 0.75],
        [3.0, 3.0, 1.0],
        [1.0, 0.0, 0.0],
    ])
    .with_channel("intensity", vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
}

#[test]
fn hand_coords() {
    let g = unit_grid();
    assert_eq!(g.dims(), [4, 4, 2]);
    let c = hand_cloud();
    let expected = [
        Some([0, 0, 0]),
        Some([1, 0, 0]),
        Some([0, 0, 0]),
        None,
        None,
        Some([0, 0, 0]),
        Some([3, 3, 1]),
        Some([1, 0, 0]),
    ];
    for (i, e) in expected.iter().enumerate() {
        assert_eq!(g.coord(c.point(i)), *e, "point {i}");
    }
    // Just below the top of the range is inside, the top itself is not.
    assert_eq!(g.coord([4.0f32.next_down(), 0.0, 2.0f32.next_down()]), Some([3, 0, 1]));
    assert_eq!(g.coord([0.0, 0.0, 2.0]), None);
    // Just below 0 is out (quotient -1.2e-38 floors to -1).
    assert_eq!(g.coord([0.0f32.next_down(), 0.0, 0.0]), None);
}

#[test]
fn hand_hard() {
    // P = 2, max 2 voxels. First-point order: A (p0), B (p1), C (p6).
    // A keeps p0, p2 and drops p5 (point capacity); B keeps p1, p7; C is the third voxel: p6 is
    // dropped for voxel capacity. Out of range: p3, p4. 4 kept + 2 + 1 + 1 = 8.
    let params = HardVoxelParams { grid: unit_grid(), max_points_per_voxel: 2, max_voxels: 2 };
    let h = voxelize_hard(&hand_cloud(), &params).unwrap();
    assert_eq!(h.voxel_count(), 2);
    assert_eq!(h.coords, vec![[0, 0, 0], [0, 0, 1]]); // (z, y, x)
    assert_eq!(h.num_points, vec![2, 2]);
    assert_eq!((h.num_channels, h.max_points), (4, 2));
    assert_eq!(h.dropped_out_of_range, 2);
    assert_eq!(h.dropped_point_capacity, 1);
    assert_eq!(h.dropped_voxel_capacity, 1);
    assert_eq!(h.kept_points(), 4);
    #[rustfmt::skip]
    let expected = vec![
        0.5, 0.5, 0.5, 1.0,    0.25, 0.75, 0.0, 3.0, // A: p0, p2
        1.5, 0.5, 0.5, 2.0,    1.0, 0.0, 0.0, 8.0,   // B: p1, p7
    ];
    assert_eq!(h.features, expected);
    assert_eq!(h.point(1, 1), &[1.0, 0.0, 0.0, 8.0]);

    // P = 4, 1 voxel: A keeps p0, p2, p5 plus one zero slot; B and C (p1, p7, p6) are dropped.
    let params = HardVoxelParams { grid: unit_grid(), max_points_per_voxel: 4, max_voxels: 1 };
    let h = voxelize_hard(&hand_cloud(), &params).unwrap();
    assert_eq!(h.coords, vec![[0, 0, 0]]);
    assert_eq!(h.num_points, vec![3]);
    assert_eq!((h.dropped_out_of_range, h.dropped_point_capacity, h.dropped_voxel_capacity), (2, 0, 3));
    #[rustfmt::skip]
    assert_eq!(h.voxel_features(0), &[
        0.5, 0.5, 0.5, 1.0,
        0.25, 0.75, 0.0, 3.0,
        0.75, 0.25, 0.75, 6.0,
        0.0, 0.0, 0.0, 0.0,
    ]);
}

#[test]
fn hand_dynamic_and_downsample() {
    let g = unit_grid();
    let d = voxelize_dynamic(&hand_cloud(), &g);
    // Voxels A (p0 p2 p5), B (p1 p7), C (p6), in first-point order.
    assert_eq!(d.voxel_coords, vec![[0, 0, 0], [0, 0, 1], [1, 3, 3]]);
    assert_eq!(d.point_voxel, vec![0, 1, 0, -1, -1, 0, 2, 1]);
    assert_eq!(
        d.point_coords,
        vec![[0, 0, 0], [0, 0, 1], [0, 0, 0], [-1, -1, -1], [-1, -1, -1], [0, 0, 0], [1, 3, 3], [0, 0, 1]]
    );
    assert_eq!(d.num_points, vec![3, 2, 1]);
    assert_eq!(d.dropped_out_of_range, 2);
    // A: x (0.5 + 0.25 + 0.75) / 3 = 0.5, y (0.5 + 0.75 + 0.25) / 3 = 0.5,
    //    z (0.5 + 0 + 0.75) / 3 = 1.25 / 3 = 5/12 (not dyadic: f64 5/12 rounded to f32),
    //    intensity (1 + 3 + 6) / 3 = 10/3 (likewise).
    // B: x (1.5 + 1) / 2 = 1.25, y 0.25, z 0.25, intensity (2 + 8) / 2 = 5.
    // C: p6 itself.
    let expected =
        vec![0.5, 0.5, (5.0f64 / 12.0) as f32, (10.0f64 / 3.0) as f32, 1.25, 0.25, 0.25, 5.0, 3.0, 3.0, 1.0, 7.0];
    assert_eq!(d.means, expected);
    assert_eq!(d.mean(1), &[1.25, 0.25, 0.25, 5.0]);

    let ds = voxel_grid_downsample(&hand_cloud(), &g);
    assert_eq!(ds.dropped_out_of_range, 2);
    assert_eq!(ds.cloud.names(), &["x", "y", "z", "intensity"]);
    assert_eq!(ds.cloud.x(), &[0.5, 1.25, 3.0]);
    assert_eq!(ds.cloud.y(), &[0.5, 0.25, 3.0]);
    assert_eq!(ds.cloud.z(), &[(5.0f64 / 12.0) as f32, 0.25, 1.0]);
    assert_eq!(ds.cloud.intensity().unwrap(), &[(10.0f64 / 3.0) as f32, 5.0, 7.0]);
}

#[test]
fn hand_pillars() {
    // Pillars 0.5 x 0.5 x 4 over [0,2) x [0,2) x [-2,2): dims 4 x 4 x 1.
    // p0 (0.5, 0.25, 1, i 10): x 0.5/0.5 = 1, y 0.5 -> 0, z 3/4 -> 0: pillar (x1, y0).
    // p1 (0.75, 0, -1, i 20): x 1.5 -> 1, y 0, z 0.25 -> 0: same pillar.
    // p2 (1.75, 1.75, 0, i 30): x 3.5 -> 3, y 3: pillar (x3, y3).
    // Pillar (1,0): mean x (0.5+0.75)/2 = 0.625, y 0.125, z 0; centre x (1+0.5)*0.5 = 0.75,
    //   centre y (0+0.5)*0.5 = 0.25. Range p0 sqrt(0.25 + 0.0625 + 1) = sqrt(1.3125),
    //   p1 sqrt(0.5625 + 1) = 1.25.
    // Pillar (3,3): mean = p2, centre (3.5*0.5, 3.5*0.5) = (1.75, 1.75), range sqrt(6.125).
    let grid = VoxelGrid { voxel_size: [0.5, 0.5, 4.0], point_cloud_range: [0.0, 0.0, -2.0, 2.0, 2.0, 2.0] };
    let cloud = Cloud::from_points(&[[0.5, 0.25, 1.0], [0.75, 0.0, -1.0], [1.75, 1.75, 0.0]])
        .with_channel("intensity", vec![10.0, 20.0, 30.0]);
    let h = voxelize_hard(&cloud, &HardVoxelParams { grid, max_points_per_voxel: 3, max_voxels: 10 }).unwrap();
    assert_eq!(h.coords, vec![[0, 0, 1], [0, 3, 3]]);
    let pf = pillar_features(&h, &grid, true).unwrap();
    assert_eq!((pf.num_channels, pf.max_points), (10, 3));
    let z10 = [0.0f32; 10];
    #[rustfmt::skip]
    let expected: Vec<f32> = [
        [0.5, 0.25, 1.0, 10.0, -0.125, 0.125, 1.0, -0.25, 0.0, 1.3125f32.sqrt()],
        [0.75, 0.0, -1.0, 20.0, 0.125, -0.125, -1.0, 0.0, -0.25, 1.25],
        z10,
        [1.75, 1.75, 0.0, 30.0, 0.0, 0.0, 0.0, 0.0, 0.0, 6.125f32.sqrt()],
        z10,
        z10,
    ].concat();
    assert_eq!(pf.features, expected);
    let pf9 = pillar_features(&h, &grid, false).unwrap();
    assert_eq!(pf9.num_channels, 9);
    let expected9: Vec<f32> = expected.chunks(10).flat_map(|r| r[..9].to_vec()).collect();
    assert_eq!(pf9.features, expected9);
}

#[test]
fn empty_cloud() {
    let params = HardVoxelParams::default();
    let cloud = Cloud::default().with_channel("intensity", vec![]);
    let h = voxelize_hard(&cloud, &params).unwrap();
    assert_eq!((h.voxel_count(), h.features.len(), h.kept_points()), (0, 0, 0));
    let d = voxelize_dynamic(&cloud, &params.grid);
    assert_eq!((d.voxel_count(), d.point_voxel.len(), d.means.len()), (0, 0, 0));
    let ds = voxel_grid_downsample(&cloud, &params.grid);
    assert!(ds.cloud.is_empty());
    assert_eq!(ds.cloud.names(), &["x", "y", "z", "intensity"]);
    assert!(pillar_features(&h, &params.grid, true).unwrap().features.is_empty());
}

// =============================================================================================
// (c) Real Ouster scans, W1 configs
// =============================================================================================

fn w1_pillars() -> HardVoxelParams {
    HardVoxelParams {
        grid: VoxelGrid { voxel_size: [0.16, 0.16, 10.0], point_cloud_range: [-51.2, -51.2, -5.0, 51.2, 51.2, 5.0] },
        max_points_per_voxel: 32,
        max_voxels: 60000,
    }
}

fn w1_voxels() -> HardVoxelParams {
    HardVoxelParams {
        grid: VoxelGrid { voxel_size: [0.1, 0.1, 0.2], point_cloud_range: [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0] },
        max_points_per_voxel: 10,
        max_voxels: 160000,
    }
}

/// Invariants that do not need the oracle's grouping.
fn check_invariants(cloud: &Cloud, params: &HardVoxelParams, ctx: &str) {
    let g = &params.grid;
    let n = cloud.len();
    let p = params.max_points_per_voxel as usize;
    let h = voxelize_hard(cloud, params).unwrap();
    let d = voxelize_dynamic(cloud, g);

    // Dynamic: every point's coordinate is the doc formula's; voxel table consistent; voxels
    // numbered in first-point order; counts add up.
    let mut next_new = 0i32;
    let mut counts = vec![0u32; d.voxel_count()];
    for i in 0..n {
        let exp = o_coord(g, cloud.point(i)).map(|c| [c[2], c[1], c[0]]).unwrap_or([-1, -1, -1]);
        assert_eq!(d.point_coords[i], exp, "{ctx}: point {i} coord");
        let v = d.point_voxel[i];
        if v < 0 {
            assert_eq!(exp, [-1, -1, -1]);
            continue;
        }
        assert_eq!(d.voxel_coords[v as usize], exp, "{ctx}: point {i} voxel");
        assert!(v <= next_new, "{ctx}: voxel {v} appears before voxel {next_new}");
        if v == next_new {
            next_new += 1;
        }
        counts[v as usize] += 1;
    }
    assert_eq!(next_new as usize, d.voxel_count());
    assert_eq!(counts, d.num_points, "{ctx}: dynamic num_points");
    let mut sorted = d.voxel_coords.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), d.voxel_count(), "{ctx}: duplicate voxel coords");
    assert_eq!(d.num_points.iter().map(|&c| c as usize).sum::<usize>() + d.dropped_out_of_range, n);

    // Hard: the kept voxels are the first max_voxels dynamic voxels, capped at P points.
    let v_hard = h.voxel_count();
    assert_eq!(v_hard, d.voxel_count().min(params.max_voxels as usize), "{ctx}: hard voxel count");
    assert_eq!(h.coords[..], d.voxel_coords[..v_hard], "{ctx}: hard voxel order");
    assert_eq!(h.features.len(), v_hard * p * cloud.num_channels());
    let mut point_cap = 0;
    for v in 0..v_hard {
        let nd = d.num_points[v] as usize;
        assert_eq!(h.num_points[v] as usize, nd.min(p), "{ctx}: voxel {v} count");
        point_cap += nd.saturating_sub(p);
        for s in 0..p {
            let row = h.point(v, s);
            if s < h.num_points[v] as usize {
                // Every kept point lies in its voxel.
                let c = o_coord(g, [row[0], row[1], row[2]]).expect("kept point in range");
                assert_eq!([c[2], c[1], c[0]], h.coords[v], "{ctx}: voxel {v} slot {s} outside its voxel");
            } else {
                assert!(row.iter().all(|&x| x.to_bits() == 0), "{ctx}: padding not +0.0");
            }
        }
    }
    let voxel_cap: usize = d.num_points[v_hard..].iter().map(|&c| c as usize).sum();
    assert_eq!(h.dropped_point_capacity, point_cap, "{ctx}: dropped_point_capacity");
    assert_eq!(h.dropped_voxel_capacity, voxel_cap, "{ctx}: dropped_voxel_capacity");
    assert_eq!(h.dropped_out_of_range, d.dropped_out_of_range);
    assert_eq!(
        h.kept_points() + h.dropped_out_of_range + h.dropped_point_capacity + h.dropped_voxel_capacity,
        n,
        "{ctx}: hard accounting"
    );

    // Downsample: one point per dynamic voxel, equal to its means.
    let ds = voxel_grid_downsample(cloud, g);
    assert_eq!(ds.cloud.len(), d.voxel_count());
    for (k, col) in ds.cloud.columns().iter().enumerate() {
        let exp: Vec<f32> = (0..d.voxel_count()).map(|v| d.mean(v)[k]).collect();
        assert!(bits(col) == bits(&exp), "{ctx}: downsample channel {k}");
    }
}

#[test]
fn real_scans_w1_configs() {
    for name in common::OUSTER_SCANS {
        let scan = common::load_ouster(name);
        // All six channels (x y z reflectivity ring t) and the 4-channel pillar input.
        let xyzi = scan.with_features(&["intensity".to_string()]).unwrap();
        assert_eq!(xyzi.names(), &["x", "y", "z", "intensity"]);
        for (cfg_name, params) in [("pillars", w1_pillars()), ("voxels", w1_voxels())] {
            params.validate().unwrap();
            for (cloud, cname) in [(&scan, "all channels"), (&xyzi, "xyzi")] {
                let ctx = format!("{name} {cfg_name} {cname}");
                check_invariants(cloud, &params, &ctx);
                check_all_against_oracle(cloud, &params, &ctx);
            }
        }
    }
}

#[test]
fn real_scan_capacity_pressure() {
    // Small caps so both capacity counters are exercised on real data.
    let scan = common::load_ouster("os1-32_scan0.bin").with_features(&["intensity".to_string()]).unwrap();
    let params = HardVoxelParams { max_points_per_voxel: 3, max_voxels: 2000, ..w1_pillars() };
    let h = voxelize_hard(&scan, &params).unwrap();
    assert!(h.dropped_point_capacity > 0 && h.dropped_voxel_capacity > 0);
    check_invariants(&scan, &params, "os1-32 capped");
    check_all_against_oracle(&scan, &params, "os1-32 capped");
}

// =============================================================================================
// (d) Determinism
// =============================================================================================

fn pf_bits(p: &PillarFeatures) -> (Vec<u32>, usize, usize) {
    (bits(&p.features), p.num_channels, p.max_points)
}

#[test]
fn deterministic_runs() {
    for name in ["os1-128_scan0.bin", "os1-32_scan0.bin"] {
        let scan = common::load_ouster(name).with_features(&["intensity".to_string()]).unwrap();
        for params in [w1_pillars(), w1_voxels()] {
            let g = &params.grid;
            let h1 = voxelize_hard(&scan, &params).unwrap();
            let h2 = voxelize_hard(&scan.clone(), &params).unwrap();
            assert_hard_eq(&h1, &h2, "hard rerun");
            assert_dynamic_eq(&voxelize_dynamic(&scan, g), &voxelize_dynamic(&scan, g), "dynamic rerun");
            let (a, b) = (voxel_grid_downsample(&scan, g), voxel_grid_downsample(&scan, g));
            assert_eq!(a.dropped_out_of_range, b.dropped_out_of_range);
            assert_cloud_bits_eq(&a.cloud, b.cloud.names(), b.cloud.columns(), "downsample rerun");
            assert_eq!(
                pf_bits(&pillar_features(&h1, g, true).unwrap()),
                pf_bits(&pillar_features(&h2, g, true).unwrap())
            );
        }
    }
}

// =============================================================================================
// (e) Validation and configuration
// =============================================================================================

fn grid_err(f: impl FnOnce(&mut VoxelGrid)) -> ParamError {
    let mut g = VoxelGrid::default();
    f(&mut g);
    g.validate().expect_err("must be invalid")
}

#[test]
fn validation_names_the_key() {
    assert!(VoxelGrid::default().validate().is_ok());
    assert!(HardVoxelParams::default().validate().is_ok());
    for bad in [0.0, -0.16, f32::NAN, f32::INFINITY] {
        let e = grid_err(|g| g.voxel_size[1] = bad);
        assert_eq!(e.key, "voxel_size[1]", "{bad}");
        assert!(e.allowed.contains("> 0"), "{}", e.allowed);
        assert!(e.to_string().contains("voxel_size[1]"));
    }
    let e = grid_err(|g| g.point_cloud_range[4] = f32::NAN);
    assert_eq!(e.key, "point_cloud_range[4]");
    let e = grid_err(|g| g.point_cloud_range[0] = f32::NEG_INFINITY);
    assert_eq!(e.key, "point_cloud_range[0]");
    // min == max and min > max name the max key.
    let e = grid_err(|g| g.point_cloud_range[3] = g.point_cloud_range[0]);
    assert_eq!(e.key, "point_cloud_range[3]");
    let e = grid_err(|g| g.point_cloud_range[5] = -10.0);
    assert_eq!(e.key, "point_cloud_range[5]");
    // A voxel larger than twice the range rounds to 0 voxels along that axis.
    let e = grid_err(|g| g.voxel_size[2] = 100.0);
    assert_eq!(e.key, "voxel_size[2]");
    // Too many voxels along an axis.
    let e = grid_err(|g| g.voxel_size[0] = 1e-6);
    assert_eq!(e.key, "voxel_size[0]");

    let bad = HardVoxelParams { max_points_per_voxel: 0, ..Default::default() };
    assert_eq!(bad.validate().unwrap_err().key, "max_points_per_voxel");
    let bad = HardVoxelParams { max_voxels: 0, ..Default::default() };
    assert_eq!(bad.validate().unwrap_err().key, "max_voxels");
    let cloud = hand_cloud();
    assert_eq!(voxelize_hard(&cloud, &bad).unwrap_err().key, "max_voxels");
    let mut bad = HardVoxelParams::default();
    bad.grid.voxel_size[0] = -1.0;
    assert_eq!(voxelize_hard(&cloud, &bad).unwrap_err().key, "voxel_size[0]");

    // Pillar features need x, y, z, intensity.
    let xyz = Cloud::from_points(&[[0.5, 0.5, 0.5]]);
    let params = HardVoxelParams { grid: unit_grid(), ..Default::default() };
    let h = voxelize_hard(&xyz, &params).unwrap();
    assert_eq!(pillar_features(&h, &params.grid, false).unwrap_err().key, "voxels.num_channels");
    let mut broken = voxelize_hard(&hand_cloud(), &params).unwrap();
    broken.features.pop();
    assert_eq!(pillar_features(&broken, &params.grid, false).unwrap_err().key, "voxels.features");
}

#[test]
#[should_panic(expected = "voxel_size[0]")]
fn dynamic_panics_on_invalid_grid() {
    let mut g = VoxelGrid::default();
    g.voxel_size[0] = 0.0;
    voxelize_dynamic(&hand_cloud(), &g);
}

#[test]
fn serde_defaults_flatten_and_unknown_keys() {
    let d: HardVoxelParams = serde_yaml::from_str("{}").unwrap();
    assert_eq!(d, HardVoxelParams::default());
    assert_eq!(d.grid.voxel_size, [0.16, 0.16, 4.0]);
    assert_eq!(d.grid.point_cloud_range, [0.0, -39.68, -3.0, 69.12, 39.68, 1.0]);
    assert_eq!((d.max_points_per_voxel, d.max_voxels), (32, 40000));

    let yaml = "voxel_size: [0.1, 0.1, 0.2]\npoint_cloud_range: [-51.2, -51.2, -5, 51.2, 51.2, 3]\n\
                max_points_per_voxel: 10\nmax_voxels: 160000\n";
    let p: HardVoxelParams = serde_yaml::from_str(yaml).unwrap();
    assert_eq!(p, w1_voxels());
    let back: HardVoxelParams = serde_yaml::from_str(&serde_yaml::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);

    // Partial: missing keys take the defaults.
    let p: HardVoxelParams = serde_yaml::from_str("max_voxels: 7").unwrap();
    assert_eq!(p, HardVoxelParams { max_voxels: 7, ..Default::default() });

    // HardVoxelParams has no deny_unknown_fields (the pipeline config flattens it and reports
    // unknown keys itself); a VoxelGrid on its own refuses them.
    let e = serde_yaml::from_str::<VoxelGrid>("voxel_sise: [1, 1, 1]").unwrap_err();
    assert!(e.to_string().contains("voxel_sise"), "{e}");
    assert!(serde_yaml::from_str::<VoxelGrid>("voxel_size: [1, 1]").is_err());
}

// =============================================================================================
// Timing (not a test: run with
// `cargo test --release --test voxel -- --ignored --nocapture time_`)
// =============================================================================================

#[test]
#[ignore]
fn time_voxelize_hard_w1_pillars() {
    let scan = common::load_ouster("os1-128_scan0.bin").with_features(&["intensity".to_string()]).unwrap();
    for (label, params) in [("W1 pillars", w1_pillars()), ("W1 voxels", w1_voxels())] {
        let mut hard = Vec::new();
        let mut dynamic = Vec::new();
        let mut pillars = Vec::new();
        for _ in 0..21 {
            let t = std::time::Instant::now();
            let h = voxelize_hard(&scan, &params).unwrap();
            hard.push(t.elapsed().as_secs_f64() * 1e3);
            let t = std::time::Instant::now();
            let d = voxelize_dynamic(&scan, &params.grid);
            dynamic.push(t.elapsed().as_secs_f64() * 1e3);
            let t = std::time::Instant::now();
            let pf = pillar_features(&h, &params.grid, false).unwrap();
            pillars.push(t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box((h, d, pf));
        }
        for (op, v) in
            [("voxelize_hard", &mut hard), ("voxelize_dynamic", &mut dynamic), ("pillar_features", &mut pillars)]
        {
            v.sort_by(f64::total_cmp);
            println!(
                "{label} {op}: {} points, median {:.3} ms (min {:.3}, max {:.3}) over {} runs",
                scan.len(),
                v[v.len() / 2],
                v[0],
                v[v.len() - 1],
                v.len()
            );
        }
    }
}

/// fp16 emission rounds to nearest even; values worked out by hand from the binary16 format:
/// 1.0 = 0x3C00; 65504 (largest finite) = 0x7BFF; 65520 is the midpoint to 65536 and rounds to even,
/// i.e. up to infinity 0x7C00; 2^-24 (smallest subnormal) = 0x0001; 1 + 2^-11 is the midpoint between
/// 1.0 and 1 + 2^-10 and rounds to the even 0x3C00; -2.5 = 0xC100.
#[test]
fn features_f16_rounding() {
    let input = [1.0f32, 65504.0, 65520.0, 2f32.powi(-24), 1.0 + 2f32.powi(-11), -2.5];
    let bits: Vec<u16> = lidar_kernels::ops::voxel::features_f16(&input).iter().map(|h| h.to_bits()).collect();
    assert_eq!(bits, [0x3C00, 0x7BFF, 0x7C00, 0x0001, 0x3C00, 0xC100]);
}

/// A cloud of street size on the configuration's grids: the downsample grid (10^8 cells) numbers
/// its voxels through the hash table, the pillar grid (640 x 640) through a table over the cells.
/// Both agree with the oracle, on a pool of one thread and of two.
#[test]
fn street_sized_grids_and_thread_counts() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let n = 60_000;
    let mut col = |lo: f32, hi: f32| (0..n).map(|_| rng.random_range(lo..hi)).collect::<Vec<f32>>();
    let (mut x, y, z) = (col(-70.0, 70.0), col(-70.0, 70.0), col(-6.0, 6.0));
    let (intensity, t) = (col(0.0, 255.0), col(0.0, 1e5));
    x[17] = f32::NAN;
    x[18] = f32::INFINITY;
    let cloud = Cloud::from_xyz(x, y, z).with_channel("intensity", intensity).with_channel("t", t);
    let pillars = HardVoxelParams {
        grid: VoxelGrid { voxel_size: [0.16, 0.16, 10.0], point_cloud_range: [-51.2, -51.2, -5.0, 51.2, 51.2, 5.0] },
        max_points_per_voxel: 3,
        max_voxels: 20_000,
    };
    let fine = HardVoxelParams {
        grid: VoxelGrid { voxel_size: [0.2, 0.2, 0.2], point_cloud_range: [-100.0, -100.0, -10.0, 100.0, 100.0, 10.0] },
        ..pillars
    };
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            check_all_against_oracle(&cloud, &pillars, &format!("pillar grid, {threads} threads"));
            check_all_against_oracle(&cloud, &fine, &format!("0.2 m grid, {threads} threads"));
        });
    }
}
