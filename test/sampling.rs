mod common;

// FPS, KNN and ball query against brute-force oracles written here independently of src/ops
// (plain O(N*K) FPS, O(N*M) neighbour search with a full sort), hand-worked small cases,
// degenerate inputs, parameter validation and the real Ouster scans.

use common::{load_ouster, OUSTER_SCANS};
use lidar_kernels::cloud::Cloud;
use lidar_kernels::ops::fps::{dist2, farthest_point_sample, farthest_point_sample_batched, FpsParams};
use lidar_kernels::ops::neighbors::{
    ball_query, ball_row_full, knn, BallPadding, BallQuery, BallQueryParams, KnnParams, Neighbors,
};
use lidar_kernels::ops::Validate;
use proptest::prelude::*;

// ------------------------------------------------------------------------------------------------
// Independent oracles
// ------------------------------------------------------------------------------------------------

/// The specified distance, written out again: (dx*dx + dy*dy) + dz*dz in f32.
fn sq(p: [f32; 3], q: [f32; 3]) -> f32 {
    let dx = p[0] - q[0];
    let dy = p[1] - q[1];
    let dz = p[2] - q[2];
    (dx * dx + dy * dy) + dz * dz
}

fn finite(p: [f32; 3]) -> bool {
    p.iter().all(|v| v.is_finite())
}

fn pts(c: &Cloud) -> Vec<[f32; 3]> {
    (0..c.len()).map(|i| c.point(i)).collect()
}

/// Plain FPS: update every min distance, then scan the unselected points for the first maximum.
fn fps_oracle(p: &[[f32; 3]], k: usize, start: usize) -> Vec<i32> {
    let n = p.len();
    let mut out = vec![-1i32; k];
    if n == 0 {
        return out;
    }
    let mut taken = vec![false; n];
    let mut md = vec![f32::INFINITY; n];
    let mut cur = start;
    out[0] = cur as i32;
    taken[cur] = true;
    for slot in out.iter_mut().take(n).skip(1) {
        for i in 0..n {
            let d = sq(p[i], p[cur]);
            if d < md[i] {
                md[i] = d;
            }
        }
        let mut best: Option<usize> = None;
        for i in 0..n {
            if taken[i] {
                continue;
            }
            match best {
                None => best = Some(i),
                Some(b) if md[i] > md[b] => best = Some(i),
                _ => {}
            }
        }
        cur = best.unwrap();
        taken[cur] = true;
        *slot = cur as i32;
    }
    out
}

/// All finite points of `p` sorted by (distance to q, index) with a full sort.
fn sorted_by_distance(p: &[[f32; 3]], q: [f32; 3]) -> Vec<(f32, usize)> {
    if !finite(q) {
        return Vec::new();
    }
    let mut all: Vec<(f32, usize)> =
        p.iter().enumerate().filter(|(_, x)| finite(**x)).map(|(i, x)| (sq(*x, q), i)).collect();
    all.sort_unstable_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1)));
    all
}

fn knn_row_from_sorted(sorted: &[(f32, usize)], k: usize) -> (Vec<i32>, Vec<f32>) {
    let mut ind = vec![-1i32; k];
    let mut dd = vec![f32::INFINITY; k];
    for (j, &(d, i)) in sorted.iter().take(k).enumerate() {
        ind[j] = i as i32;
        dd[j] = d;
    }
    (ind, dd)
}

fn knn_oracle(p: &[[f32; 3]], q: &[[f32; 3]], k: usize) -> (Vec<i32>, Vec<f32>) {
    let mut ind = Vec::new();
    let mut dd = Vec::new();
    for &qq in q {
        let (a, b) = knn_row_from_sorted(&sorted_by_distance(p, qq), k);
        ind.extend(a);
        dd.extend(b);
    }
    (ind, dd)
}

/// Scan the points in input order, keep the first `ns` in [rmin^2, r^2), pad.
fn ball_row(p: &[[f32; 3]], q: [f32; 3], radius: f32, min_radius: f32, ns: usize, pad: BallPadding) -> (Vec<i32>, u32) {
    let r2 = radius * radius;
    let rmin2 = min_radius * min_radius;
    let mut row: Vec<i32> = Vec::new();
    for (i, &x) in p.iter().enumerate() {
        if row.len() == ns {
            break;
        }
        let d = sq(x, q);
        if d >= rmin2 && d < r2 {
            row.push(i as i32);
        }
    }
    let count = row.len() as u32;
    let fill = match (pad, row.first()) {
        (BallPadding::FirstFound, Some(&f)) => f,
        _ => -1,
    };
    row.resize(ns, fill);
    (row, count)
}

fn ball_oracle(p: &[[f32; 3]], q: &[[f32; 3]], params: &BallQueryParams) -> (Vec<i32>, Vec<u32>) {
    let mut ind = Vec::new();
    let mut counts = Vec::new();
    for &qq in q {
        let (row, c) = ball_row(p, qq, params.radius, params.min_radius, params.nsample, params.padding);
        ind.extend(row);
        counts.push(c);
    }
    (ind, counts)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

// ------------------------------------------------------------------------------------------------
// Random clouds
// ------------------------------------------------------------------------------------------------

/// Points of one flavour: 0 = coarse lattice (step 0.5, many duplicates and equal distances),
/// 1 = uniform floats, 2 = lattice with rare non-finite coordinates, 3 = flat (z = 0) lattice + floats.
fn point(flavour: u8) -> BoxedStrategy<[f32; 3]> {
    let lattice = (0i32..5, 0i32..5, 0i32..4).prop_map(|(a, b, c)| [a as f32 * 0.5, b as f32 * 0.5, c as f32 * 0.5]);
    let float = (-6.0f32..6.0, -6.0f32..6.0, -2.0f32..2.0).prop_map(|(a, b, c)| [a, b, c]);
    match flavour {
        0 => lattice.boxed(),
        1 => float.boxed(),
        2 => prop_oneof![
            30 => lattice,
            1 => Just([f32::NAN, 0.0, 0.0]),
            1 => Just([0.5, f32::INFINITY, 1.0]),
            1 => Just([0.5, 0.5, f32::NEG_INFINITY]),
        ]
        .boxed(),
        _ => prop_oneof![lattice.prop_map(|p| [p[0], p[1], 0.0]), float.prop_map(|p| [p[0], p[1], 0.0]),].boxed(),
    }
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), Just(1usize), 2usize..8, 60usize..70, 100usize..400, 1800usize..2200]
}

/// A cloud and queries: some queries are cloud points (zero distances), some are random and some
/// lie far outside the cloud.
fn cloud_and_queries() -> impl Strategy<Value = (Vec<[f32; 3]>, Vec<[f32; 3]>)> {
    (size(), 0u8..4, 0usize..40, 0usize..40).prop_flat_map(|(n, flavour, n_own, n_rand)| {
        let cloud = prop::collection::vec(point(flavour), n);
        let own = prop::collection::vec(any::<prop::sample::Index>(), if n == 0 { 0 } else { n_own });
        let rand = prop::collection::vec(
            prop_oneof![
                4 => point(flavour),
                1 => (-100.0f32..100.0, -100.0f32..100.0, -100.0f32..100.0).prop_map(|(a, b, c)| [a, b, c]),
            ],
            n_rand,
        );
        (cloud, own, rand).prop_map(|(cloud, own, rand)| {
            let mut q: Vec<[f32; 3]> = own.iter().map(|ix| cloud[ix.index(cloud.len())]).collect();
            q.extend(rand);
            (cloud, q)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn fps_matches_plain_oracle(
        (cloud, k, start) in (size(), 0u8..4).prop_flat_map(|(n, f)| {
            (prop::collection::vec(point(f), n), prop_oneof![1usize..50, Just(n + 2)], 0..n.max(1))
        })
    ) {
        let c = Cloud::from_points(&cloud);
        let params = FpsParams { num_samples: k, start_index: start };
        let got = farthest_point_sample(&c, &params).unwrap();
        prop_assert_eq!(&got.indices, &fps_oracle(&cloud, k, start));
    }

    #[test]
    fn fps_batched_matches_per_cloud_oracle(
        (clouds, k, start) in (prop::collection::vec((prop_oneof![Just(0usize), 1usize..5, 50usize..300], 0u8..4), 0..6), 1usize..40, 0usize..3)
            .prop_flat_map(|(shapes, k, start)| {
                let clouds: Vec<_> = shapes.into_iter().map(|(n, f)| prop::collection::vec(point(f), n.max(if n == 0 { 0 } else { start + 1 }))).collect();
                (clouds, Just(k), Just(start))
            })
    ) {
        let all: Vec<[f32; 3]> = clouds.iter().flatten().copied().collect();
        let lengths: Vec<usize> = clouds.iter().map(|c| c.len()).collect();
        let params = FpsParams { num_samples: k, start_index: start };
        let got = farthest_point_sample_batched(&Cloud::from_points(&all), &lengths, &params).unwrap();
        prop_assert_eq!(got.num_samples, k);
        prop_assert_eq!(got.indices.len(), clouds.len() * k);
        let mut off = 0;
        prop_assert_eq!(got.offsets[0], 0);
        for (b, cl) in clouds.iter().enumerate() {
            off += cl.len();
            prop_assert_eq!(got.offsets[b + 1], off);
            prop_assert_eq!(&got.indices[b * k..(b + 1) * k], &fps_oracle(cl, k, start)[..]);
        }
    }

    /// A ball-query row holds no -1 exactly when `ball_row_full` says so from its count alone (the
    /// CUDA backend tells the `neighborhoods` message's is_dense from the counts).
    #[test]
    fn ball_row_full_matches_the_rows(
        (cloud, queries) in cloud_and_queries(),
        nsample in 1usize..20,
        radius in 0.1f32..3.0,
        first_found in any::<bool>(),
    ) {
        let padding = if first_found { BallPadding::FirstFound } else { BallPadding::Minus1 };
        let params = BallQueryParams { radius, min_radius: 0.0, nsample, padding };
        let got = ball_query(&Cloud::from_points(&cloud), &Cloud::from_points(&queries), &params).unwrap();
        for (row, &count) in got.indices.chunks(nsample).zip(&got.counts) {
            prop_assert_eq!(ball_row_full(count, nsample, padding), row.iter().all(|&i| i >= 0), "count {}", count);
        }
    }

    #[test]
    fn knn_matches_brute_force((cloud, queries) in cloud_and_queries(), k in 1usize..40, big in any::<bool>()) {
        let k = if big { cloud.len() + 3 } else { k };
        let got = knn(&Cloud::from_points(&cloud), &Cloud::from_points(&queries), &KnnParams { k }).unwrap();
        let (ind, dd) = knn_oracle(&cloud, &queries, k);
        prop_assert_eq!(got.width, k);
        prop_assert_eq!(&got.indices, &ind);
        prop_assert_eq!(bits(&got.dist2), bits(&dd));
    }

    #[test]
    fn ball_query_matches_brute_force(
        (cloud, queries) in cloud_and_queries(),
        radius in prop_oneof![Just(0.5f32), Just(1.0f32), Just(1.5f32), Just(3.0f32), 0.05f32..4.0, Just(500.0f32)],
        min_frac in prop_oneof![3 => Just(0.0f32), 1 => Just(0.5f32), 1 => 0.0f32..0.99],
        nsample in prop_oneof![1usize..40, Just(300usize)],
        first_found in any::<bool>(),
    ) {
        let padding = if first_found { BallPadding::FirstFound } else { BallPadding::Minus1 };
        let params = BallQueryParams { radius, min_radius: radius * min_frac, nsample, padding };
        let got = ball_query(&Cloud::from_points(&cloud), &Cloud::from_points(&queries), &params).unwrap();
        let (ind, counts) = ball_oracle(&cloud, &queries, &params);
        prop_assert_eq!(got.width, nsample);
        prop_assert_eq!(&got.indices, &ind);
        prop_assert_eq!(&got.counts, &counts);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn knn_all_points_of_a_cloud((cloud, _q) in cloud_and_queries(), k in 1usize..24) {
        let c = Cloud::from_points(&cloud);
        let got = knn(&c, &c, &KnnParams { k }).unwrap();
        let (ind, dd) = knn_oracle(&cloud, &cloud, k);
        prop_assert_eq!(&got.indices, &ind);
        prop_assert_eq!(bits(&got.dist2), bits(&dd));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Points straddling the inner and outer ball radius (relative offsets of +-2^-21 and 0) in
    /// random directions around the query, in random order, among filler points: the cell search
    /// must not lose any point whose computed distance passes the test.
    #[test]
    fn neighbors_at_the_radius_boundary(
        centre in (-20.0f32..20.0, -20.0f32..20.0, -3.0f32..3.0),
        radius in 0.05f32..3.0,
        shell in prop::collection::vec(((-1.0f32..1.0, -1.0f32..1.0, -1.0f32..1.0), 0usize..3, any::<bool>()), 40..120),
        filler in prop::collection::vec((-3.0f32..3.0, -3.0f32..3.0, -3.0f32..3.0), 0..200),
        k in 1usize..80,
    ) {
        let c = [centre.0, centre.1, centre.2];
        let scale = [1.0 - 1.0 / 2097152.0, 1.0, 1.0 + 1.0 / 2097152.0];
        let mut cloud: Vec<[f32; 3]> = Vec::new();
        for (i, ((ux, uy, uz), s, inner)) in shell.iter().enumerate() {
            let len = (ux * ux + uy * uy + uz * uz).sqrt().max(1e-3);
            let r = if *inner { radius * 0.5 } else { radius } * scale[*s] / len;
            cloud.push([c[0] + ux * r, c[1] + uy * r, c[2] + uz * r]);
            if let Some(f) = filler.get(i) {
                cloud.push([c[0] + f.0 * radius, c[1] + f.1 * radius, c[2] + f.2 * radius]);
            }
        }
        let queries = vec![c, cloud[0], [c[0] + radius * 0.3, c[1], c[2]]];
        let (pc, qc) = (Cloud::from_points(&cloud), Cloud::from_points(&queries));
        for (min_radius, padding) in [(0.0, BallPadding::Minus1), (radius * 0.5, BallPadding::FirstFound)] {
            let params = BallQueryParams { radius, min_radius, nsample: 400, padding };
            let got = ball_query(&pc, &qc, &params).unwrap();
            let (ind, counts) = ball_oracle(&cloud, &queries, &params);
            prop_assert_eq!(&got.indices, &ind);
            prop_assert_eq!(&got.counts, &counts);
        }
        let got = knn(&pc, &qc, &KnnParams { k }).unwrap();
        let (ind, dd) = knn_oracle(&cloud, &queries, k);
        prop_assert_eq!(&got.indices, &ind);
        prop_assert_eq!(bits(&got.dist2), bits(&dd));
    }
}

// ------------------------------------------------------------------------------------------------
// Hand-worked cases
// ------------------------------------------------------------------------------------------------

fn line(xs: &[f32]) -> Cloud {
    Cloud::from_points(&xs.iter().map(|&x| [x, 0.0, 0.0]).collect::<Vec<_>>())
}

#[test]
fn dist2_formula() {
    // (1-4)^2 + (2-6)^2 = 9 + 16 = 25, + (3-3)^2 = 25.
    assert_eq!(dist2([1.0, 2.0, 3.0], [4.0, 6.0, 3.0]), 25.0);
    // Symmetric bit for bit, never -0.
    let (a, b) = ([0.1f32, -7.3, 2.9], [1e-3f32, 5.5, -0.7]);
    assert_eq!(dist2(a, b).to_bits(), dist2(b, a).to_bits());
    assert_eq!(dist2([-0.0, 0.0, -0.0], [0.0, -0.0, 0.0]).to_bits(), 0.0f32.to_bits());
    assert_eq!(dist2(a, b).to_bits(), sq(a, b).to_bits());
}

#[test]
fn fps_hand_worked_line() {
    // x = 0, 1, 3, 7, 8 on a line, start 0.
    //  j=1: distances to x=0: [0, 1, 9, 49, 64]            -> max 64 at index 4 (x=8)
    //  j=2: to x=8: [64, 49, 25, 1, 0]; min -> [., 1, 9, 1, .] -> max 9 at index 2 (x=3)
    //  j=3: to x=3: [9, 4, 0, 16, 25];  min -> [., 1, ., 1, .] -> tie 1 at 1 and 3 -> lowest, 1
    //  j=4: only index 3 left.  K = 7 > N = 5: two -1.
    let out = farthest_point_sample(&line(&[0.0, 1.0, 3.0, 7.0, 8.0]), &FpsParams { num_samples: 7, start_index: 0 })
        .unwrap();
    assert_eq!(out.indices, vec![0, 4, 2, 1, 3, -1, -1]);
    // Start at index 3 (x=7): to x=7: [49, 36, 16, 0, 1] -> 0 (x=0); then min [., 1, 9, ., 1]
    // -> 2 (x=3); then min with x=3: [., 1, ., ., 1] -> tie 1 at 1 and 4 -> 1; then 4.
    let out = farthest_point_sample(&line(&[0.0, 1.0, 3.0, 7.0, 8.0]), &FpsParams { num_samples: 5, start_index: 3 })
        .unwrap();
    assert_eq!(out.indices, vec![3, 0, 2, 1, 4]);
}

#[test]
fn fps_duplicates_and_degenerate() {
    // [A, A, B] with start 0: min distances after A: [., 0, d] -> 2; then [., 0, .] -> 1
    // (the unselected duplicate; never an already selected index).
    let c = Cloud::from_points(&[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [2.0, 1.0, 1.0]]);
    assert_eq!(
        farthest_point_sample(&c, &FpsParams { num_samples: 4, start_index: 0 }).unwrap().indices,
        vec![0, 2, 1, -1]
    );
    // All points identical: every min distance is 0 -> lowest unselected each time.
    let same = Cloud::from_points(&[[3.0, -2.0, 0.5]; 6]);
    assert_eq!(
        farthest_point_sample(&same, &FpsParams { num_samples: 4, start_index: 2 }).unwrap().indices,
        vec![2, 0, 1, 3]
    );
    // One point, N = 0.
    let one = Cloud::from_points(&[[5.0, 5.0, 5.0]]);
    assert_eq!(
        farthest_point_sample(&one, &FpsParams { num_samples: 3, start_index: 0 }).unwrap().indices,
        vec![0, -1, -1]
    );
    let empty = Cloud::default();
    assert_eq!(
        farthest_point_sample(&empty, &FpsParams { num_samples: 3, start_index: 7 }).unwrap().indices,
        vec![-1, -1, -1]
    );
    // K = 1: only the start.
    assert_eq!(farthest_point_sample(&same, &FpsParams { num_samples: 1, start_index: 5 }).unwrap().indices, vec![5]);
}

#[test]
fn fps_batched_hand_worked() {
    // Cloud 0: x = 0, 1, 3, 7, 8 (see fps_hand_worked_line); cloud 1 empty; cloud 2: x = 5, 6.
    let all = line(&[0.0, 1.0, 3.0, 7.0, 8.0, 5.0, 6.0]);
    let out = farthest_point_sample_batched(&all, &[5, 0, 2], &FpsParams { num_samples: 3, start_index: 0 }).unwrap();
    assert_eq!(out.indices, vec![0, 4, 2, -1, -1, -1, 0, 1, -1]);
    assert_eq!(out.offsets, vec![0, 5, 5, 7]);
    assert_eq!(out.num_samples, 3);
    // No clouds at all.
    let none =
        farthest_point_sample_batched(&Cloud::default(), &[], &FpsParams { num_samples: 3, start_index: 0 }).unwrap();
    assert!(none.indices.is_empty());
    assert_eq!(none.offsets, vec![0]);
}

#[test]
fn knn_hand_worked() {
    // x = 0, 1, -1, 2, 0 (index 4 duplicates index 0); query x = 0.
    // dist2: [0, 1, 1, 4, 0] -> by (dist2, index): (0,0) (0,4) (1,1) (1,2) (4,3).
    let p = line(&[0.0, 1.0, -1.0, 2.0, 0.0]);
    let q = line(&[0.0]);
    let r = knn(&p, &q, &KnnParams { k: 3 }).unwrap();
    assert_eq!(r.indices, vec![0, 4, 1]);
    assert_eq!(r.dist2, vec![0.0, 0.0, 1.0]);
    assert_eq!(r.width, 3);
    let r = knn(&p, &q, &KnnParams { k: 7 }).unwrap();
    assert_eq!(r.indices, vec![0, 4, 1, 2, 3, -1, -1]);
    assert_eq!(r.dist2, vec![0.0, 0.0, 1.0, 1.0, 4.0, f32::INFINITY, f32::INFINITY]);
    // k = 1, two queries: x = 1.6 -> dist2 to 2 is 0.16 (index 3) vs 0.36 to 1; x = -0.5 -> 0.25
    // to index 0, 4 and 2 -> lowest index 0.
    let r = knn(&p, &line(&[1.6, -0.5]), &KnnParams { k: 1 }).unwrap();
    assert_eq!(r.indices, vec![3, 0]);
    assert_eq!(r.dist2, vec![sq([2.0, 0.0, 0.0], [1.6, 0.0, 0.0]), 0.25]);
}

#[test]
fn knn_degenerate() {
    let q = line(&[0.0, 9.0]);
    // N = 0: all padding.
    let r = knn(&Cloud::default(), &q, &KnnParams { k: 2 }).unwrap();
    assert_eq!(r, Neighbors { indices: vec![-1; 4], dist2: vec![f32::INFINITY; 4], width: 2 });
    // M = 0: empty.
    let r = knn(&line(&[1.0]), &Cloud::default(), &KnnParams { k: 2 }).unwrap();
    assert_eq!(r, Neighbors { indices: vec![], dist2: vec![], width: 2 });
    // 300 identical points (grid path, a single cell): the k lowest indices, distance 81 and 0.
    let same = line(&vec![9.0; 300]);
    let r = knn(&same, &q, &KnnParams { k: 4 }).unwrap();
    assert_eq!(r.indices, vec![0, 1, 2, 3, 0, 1, 2, 3]);
    assert_eq!(r.dist2, vec![81.0, 81.0, 81.0, 81.0, 0.0, 0.0, 0.0, 0.0]);
    // Non-finite points are never neighbours; a non-finite query gets padding.
    let p = Cloud::from_points(&[[f32::NAN, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, f32::INFINITY, 0.0], [2.0, 0.0, 0.0]]);
    let r = knn(&p, &Cloud::from_points(&[[0.0, 0.0, 0.0], [f32::NAN, 0.0, 0.0]]), &KnnParams { k: 3 }).unwrap();
    assert_eq!(r.indices, vec![1, 3, -1, -1, -1, -1]);
    assert_eq!(r.dist2, vec![1.0, 4.0, f32::INFINITY, f32::INFINITY, f32::INFINITY, f32::INFINITY]);
}

#[test]
fn ball_query_hand_worked() {
    // x = 0, 1, -1, 2, 0; query x = 0.5: dist2 = [0.25, 0.25, 2.25, 2.25, 0.25] (all exact).
    let p = line(&[0.0, 1.0, -1.0, 2.0, 0.0]);
    let q = line(&[0.5]);
    let run = |radius, min_radius, nsample, padding| {
        ball_query(&p, &q, &BallQueryParams { radius, min_radius, nsample, padding }).unwrap()
    };
    // r = 1 (r2 = 1): indices 0, 1, 4 in input order; padding repeats 0 or is -1.
    assert_eq!(
        run(1.0, 0.0, 5, BallPadding::FirstFound),
        BallQuery { indices: vec![0, 1, 4, 0, 0], counts: vec![3], width: 5 }
    );
    assert_eq!(
        run(1.0, 0.0, 5, BallPadding::Minus1),
        BallQuery { indices: vec![0, 1, 4, -1, -1], counts: vec![3], width: 5 }
    );
    // r = 1.5: r2 = 2.25 is excluded (half-open), same as r = 1.
    assert_eq!(run(1.5, 0.0, 5, BallPadding::Minus1).indices, vec![0, 1, 4, -1, -1]);
    // min_radius 0.5: rmin2 = 0.25 is included (closed).
    assert_eq!(run(1.0, 0.5, 5, BallPadding::Minus1).indices, vec![0, 1, 4, -1, -1]);
    // min_radius 0.6, r = 2: 0.36 <= d < 4 -> indices 2, 3.
    assert_eq!(
        run(2.0, 0.6, 5, BallPadding::FirstFound),
        BallQuery { indices: vec![2, 3, 2, 2, 2], counts: vec![2], width: 5 }
    );
    // nsample 2 < found: the first two in input order.
    assert_eq!(run(2.0, 0.0, 2, BallPadding::FirstFound), BallQuery { indices: vec![0, 1], counts: vec![2], width: 2 });
    // Nothing in [0.3^2, 0.4^2): all -1 in both modes, count 0.
    assert_eq!(
        run(0.4, 0.3, 3, BallPadding::FirstFound),
        BallQuery { indices: vec![-1, -1, -1], counts: vec![0], width: 3 }
    );
    assert_eq!(
        run(0.4, 0.3, 3, BallPadding::Minus1),
        BallQuery { indices: vec![-1, -1, -1], counts: vec![0], width: 3 }
    );
}

#[test]
fn ball_query_degenerate() {
    let params = BallQueryParams { radius: 0.1, min_radius: 0.0, nsample: 3, padding: BallPadding::FirstFound };
    let q = line(&[9.0, 0.0]);
    assert_eq!(
        ball_query(&Cloud::default(), &q, &params).unwrap(),
        BallQuery { indices: vec![-1; 6], counts: vec![0, 0], width: 3 }
    );
    assert_eq!(
        ball_query(&q, &Cloud::default(), &params).unwrap(),
        BallQuery { indices: vec![], counts: vec![], width: 3 }
    );
    // 300 identical points at x = 9: the first three; the query at 0 has none.
    let same = line(&vec![9.0; 300]);
    assert_eq!(
        ball_query(&same, &q, &params).unwrap(),
        BallQuery { indices: vec![0, 1, 2, -1, -1, -1], counts: vec![3, 0], width: 3 }
    );
    // Non-finite points and queries: never in a ball.
    let p = Cloud::from_points(&[[f32::NAN, 0.0, 0.0], [0.0, 0.0, 0.05], [f32::INFINITY, 0.0, 0.0]]);
    let q = Cloud::from_points(&[[0.0, 0.0, 0.0], [0.0, f32::NAN, 0.0]]);
    assert_eq!(
        ball_query(&p, &q, &params).unwrap(),
        BallQuery { indices: vec![1, 1, 1, -1, -1, -1], counts: vec![1, 0], width: 3 }
    );
}

// ------------------------------------------------------------------------------------------------
// Parameters
// ------------------------------------------------------------------------------------------------

#[test]
fn parameter_validation() {
    let c = line(&[0.0, 1.0, 2.0]);
    assert_eq!(
        farthest_point_sample(&c, &FpsParams { num_samples: 2, start_index: 3 }).unwrap_err().key,
        "start_index"
    );
    assert_eq!(
        farthest_point_sample(&c, &FpsParams { num_samples: 0, start_index: 0 }).unwrap_err().key,
        "num_samples"
    );
    assert!(FpsParams { num_samples: 1, start_index: 99 }.validate().is_ok()); // checked against N at run time
    let p = FpsParams { num_samples: 2, start_index: 1 };
    assert_eq!(farthest_point_sample_batched(&c, &[1, 1], &p).unwrap_err().key, "lengths");
    assert_eq!(farthest_point_sample_batched(&c, &[2, 1], &p).unwrap_err().key, "start_index");
    assert!(farthest_point_sample_batched(&c, &[2, 0, 1, 0], &p).is_err()); // cloud 2 has 1 point
    assert!(farthest_point_sample_batched(&c, &[3, 0], &p).is_ok());

    assert_eq!(knn(&c, &c, &KnnParams { k: 0 }).unwrap_err().key, "k");
    let ok = BallQueryParams { radius: 1.0, min_radius: 0.0, nsample: 4, padding: BallPadding::Minus1 };
    assert!(ok.validate().is_ok());
    for (bad, key) in [
        (BallQueryParams { radius: 0.0, ..ok.clone() }, "radius"),
        (BallQueryParams { radius: -1.0, ..ok.clone() }, "radius"),
        (BallQueryParams { radius: f32::NAN, ..ok.clone() }, "radius"),
        (BallQueryParams { radius: f32::INFINITY, ..ok.clone() }, "radius"),
        (BallQueryParams { min_radius: -0.1, ..ok.clone() }, "min_radius"),
        (BallQueryParams { min_radius: 1.0, ..ok.clone() }, "min_radius"),
        (BallQueryParams { min_radius: f32::NAN, ..ok.clone() }, "min_radius"),
        (BallQueryParams { nsample: 0, ..ok.clone() }, "nsample"),
    ] {
        assert_eq!(bad.validate().unwrap_err().key, key, "{bad:?}");
        assert_eq!(ball_query(&c, &c, &bad).unwrap_err().key, key);
    }
    assert!(KnnParams::default().validate().is_ok());
    assert!(BallQueryParams::default().validate().is_ok());
}

#[test]
fn parameters_from_yaml() {
    let f: FpsParams = serde_yaml::from_str("num_samples: 8").unwrap();
    assert_eq!(f, FpsParams { num_samples: 8, start_index: 0 });
    let f: FpsParams = serde_yaml::from_str("num_samples: 8\nstart_index: 3").unwrap();
    assert_eq!(f.start_index, 3);
    assert!(serde_yaml::from_str::<FpsParams>("num_samples: 8\nstart: 3").is_err());
    let k: KnnParams = serde_yaml::from_str("k: 32").unwrap();
    assert_eq!(k.k, 32);
    let b: BallQueryParams = serde_yaml::from_str("radius: 2.0\nnsample: 16\npadding: minus_one").unwrap();
    assert_eq!(b, BallQueryParams { radius: 2.0, min_radius: 0.0, nsample: 16, padding: BallPadding::Minus1 });
    let b: BallQueryParams =
        serde_yaml::from_str("radius: 2.0\nmin_radius: 0.5\nnsample: 16\npadding: first_found").unwrap();
    assert_eq!(b.padding, BallPadding::FirstFound);
    assert_eq!(b.min_radius, 0.5);
    assert!(serde_yaml::from_str::<BallQueryParams>("radius: 2.0\nnsample: 16\npadding: FirstFound").is_err());
    assert!(
        serde_yaml::from_str::<BallQueryParams>("radius: 2.0\nnsample: 16\npadding: minus_one\nmax_radius: 3").is_err()
    );
    let round: BallQueryParams = serde_yaml::from_str(&serde_yaml::to_string(&b).unwrap()).unwrap();
    assert_eq!(round, b);
}

// ------------------------------------------------------------------------------------------------
// Real scans
// ------------------------------------------------------------------------------------------------

fn xyz(c: &Cloud) -> Cloud {
    Cloud::from_xyz(c.x().to_vec(), c.y().to_vec(), c.z().to_vec())
}

#[test]
fn fps_ouster_scan0_known_prefix_and_oracle() {
    let scan = load_ouster("os1-128_scan0.bin");
    assert_eq!(scan.len(), 107_647);
    let out = farthest_point_sample(&scan, &FpsParams { num_samples: 4096, start_index: 0 }).unwrap();
    // Computed independently by PyTorch3D sample_farthest_points and fpsample.
    assert_eq!(&out.indices[..10], &[0, 45184, 45610, 39325, 45611, 6407, 54302, 48405, 64409, 41877]);
    assert_eq!(out.indices, fps_oracle(&pts(&scan), 4096, 0));
    // Only x, y, z matter.
    assert_eq!(
        farthest_point_sample(&xyz(&scan), &FpsParams { num_samples: 64, start_index: 0 }).unwrap().indices,
        out.indices[..64]
    );
}

/// KNN k = 16, 32 and ball query r = 1 m, 2 m (nsample 32, both paddings) of FPS-sampled queries
/// into the full scan, against the oracles (one full sort per query serves both k).
fn check_scan_neighbors(name: &str, n_queries: usize) {
    let scan = load_ouster(name);
    let p = pts(&scan);
    let fps = farthest_point_sample(&scan, &FpsParams { num_samples: n_queries, start_index: 0 }).unwrap();
    let qi: Vec<usize> = fps.indices.iter().map(|&i| i as usize).collect();
    let queries = scan.select(&qi);
    let qp = pts(&queries);
    let k16 = knn(&scan, &queries, &KnnParams { k: 16 }).unwrap();
    let k32 = knn(&scan, &queries, &KnnParams { k: 32 }).unwrap();
    let balls: Vec<(BallQueryParams, BallQuery)> =
        [(1.0, BallPadding::FirstFound), (2.0, BallPadding::Minus1), (2.0, BallPadding::FirstFound)]
            .into_iter()
            .map(|(radius, padding)| {
                let params = BallQueryParams { radius, min_radius: 0.0, nsample: 32, padding };
                let got = ball_query(&scan, &queries, &params).unwrap();
                (params, got)
            })
            .collect();
    for (m, &q) in qp.iter().enumerate() {
        let sorted = sorted_by_distance(&p, q);
        for got in [&k16, &k32] {
            let k = got.width;
            let (ind, dd) = knn_row_from_sorted(&sorted, k);
            assert_eq!(&got.indices[m * k..(m + 1) * k], &ind[..], "{name} knn k={k} query {m}");
            assert_eq!(bits(&got.dist2[m * k..(m + 1) * k]), bits(&dd), "{name} knn k={k} query {m}");
        }
        for (params, got) in &balls {
            let (row, count) = ball_row(&p, q, params.radius, params.min_radius, params.nsample, params.padding);
            assert_eq!(&got.indices[m * 32..(m + 1) * 32], &row[..], "{name} ball {params:?} query {m}");
            assert_eq!(got.counts[m], count);
        }
    }
    // The queries are scan points: each is its own nearest neighbour at distance 0 unless an
    // earlier duplicate exists.
    for (m, &i) in qi.iter().enumerate() {
        assert_eq!(k16.dist2[m * 16], 0.0);
        assert!(k16.indices[m * 16] as usize <= i);
    }
}

#[test]
fn neighbors_ouster_scan0_vs_oracle() {
    check_scan_neighbors("os1-128_scan0.bin", 512);
}

#[test]
fn neighbors_other_ouster_scans_vs_oracle() {
    for name in &OUSTER_SCANS[1..] {
        check_scan_neighbors(name, 64);
    }
}

#[test]
fn batched_fps_on_scans_equals_single() {
    // Two real scans back to back (os1-32 and every 4th point of os0-128, 20000) plus an empty cloud.
    let a = load_ouster("os1-32_scan0.bin");
    let every4: Vec<usize> = (0..20_000).map(|i| i * 4).collect();
    let b = load_ouster("os0-128_scan0.bin").select(&every4);
    let all: Vec<[f32; 3]> = pts(&a).into_iter().chain(pts(&b)).collect();
    let params = FpsParams { num_samples: 512, start_index: 7 };
    let batched = farthest_point_sample_batched(&Cloud::from_points(&all), &[a.len(), 0, b.len()], &params).unwrap();
    assert_eq!(&batched.indices[..512], &farthest_point_sample(&a, &params).unwrap().indices[..]);
    assert_eq!(&batched.indices[512..1024], &[-1; 512][..]);
    assert_eq!(&batched.indices[1024..], &farthest_point_sample(&b, &params).unwrap().indices[..]);
}

#[test]
fn deterministic_on_a_real_scan() {
    let scan = load_ouster("os1-128_scan1.bin");
    let p = FpsParams { num_samples: 1024, start_index: 5 };
    let f1 = farthest_point_sample(&scan, &p).unwrap();
    let f2 = farthest_point_sample(&scan, &p).unwrap();
    assert_eq!(f1, f2);
    let q = scan.select(&f1.indices.iter().map(|&i| i as usize).collect::<Vec<_>>());
    let kp = KnnParams { k: 24 };
    let (n1, n2) = (knn(&scan, &q, &kp).unwrap(), knn(&scan, &q, &kp).unwrap());
    assert_eq!(n1.indices, n2.indices);
    assert_eq!(bits(&n1.dist2), bits(&n2.dist2));
    let bp = BallQueryParams { radius: 1.5, min_radius: 0.2, nsample: 48, padding: BallPadding::FirstFound };
    assert_eq!(ball_query(&scan, &q, &bp).unwrap(), ball_query(&scan, &q, &bp).unwrap());
}
