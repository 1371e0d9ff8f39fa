//! The detector's CPU reference: boxes where objects stand, ground where the road is, results
//! that do not depend on the order of the points, and parameters refused with their key.

use lidar_kernels::cloud::Cloud;
use lidar_kernels::ops::detect::{detect, DetectParams, PointClass};
use lidar_kernels::pipeline::PipelineConfig;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

/// A flat road at z = -1.7 and car-sized boxes (their visible surfaces) standing on it.
fn scene(rng: &mut rand::rngs::StdRng, cars: &[[f32; 3]]) -> Cloud {
    let mut pts = Vec::new();
    for _ in 0..30_000 {
        pts.push([rng.random_range(-40.0..40.0), rng.random_range(-40.0..40.0), -1.7 + rng.random_range(-0.03..0.03)]);
    }
    for &[cx, cy, yaw] in cars {
        let (s, c) = yaw.sin_cos();
        for _ in 0..800 {
            // Points on the four sides, from 0.3 m above the road to the roof.
            let (u, v) = match rng.random_range(0..4) {
                0 => (2.2, rng.random_range(-0.9..0.9)),
                1 => (-2.2, rng.random_range(-0.9..0.9)),
                2 => (rng.random_range(-2.2..2.2), 0.9),
                _ => (rng.random_range(-2.2..2.2), -0.9),
            };
            let z = -1.7 + rng.random_range(0.3..1.5);
            pts.push([cx + u * c - v * s, cy + u * s + v * c, z]);
        }
    }
    Cloud::from_points(&pts)
}

#[test]
fn finds_each_car_on_a_flat_road() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let cars = [[10.0, 3.0, 0.3], [-15.0, -8.0, 1.2], [20.0, -12.0, -0.7]];
    let cloud = scene(&mut rng, &cars);
    let d = detect(&cloud, &DetectParams::default()).unwrap();
    // Every road point is ground, every car point is not.
    assert!(d.point_class[..30_000].iter().all(|&c| c == PointClass::Ground as u8));
    assert!(d.point_class[30_000..].iter().all(|&c| c == PointClass::Object as u8));
    assert_eq!(d.keep.len(), 3, "{:?}", d.clusters);
    for &[cx, cy, yaw] in &cars {
        let c = d.kept().find(|c| (c.bbox.x - cx).hypot(c.bbox.y - cy) < 0.2).expect("a box on each car");
        assert_eq!(c.class, 0, "{c:?}");
        assert!((c.bbox.length - 4.4).abs() < 0.1 && (c.bbox.width - 1.8).abs() < 0.1, "{c:?}");
        // Headings are found to the fitted 1-degree step, modulo pi.
        let dy = (c.bbox.yaw - yaw).rem_euclid(std::f32::consts::PI);
        assert!(dy.min(std::f32::consts::PI - dy) < 0.02, "{c:?}");
        assert_eq!(c.points, 800);
    }
    // Each cluster's label is its lowest point index, ids follow the labels.
    for (id, c) in d.clusters.iter().enumerate() {
        assert_eq!(d.labels[c.label as usize], id as i32);
        assert!(d.labels[..c.label as usize].iter().all(|&l| l != id as i32));
    }
}

/// Points on one end of a car at `(cx, cy)` whose length runs along `dir` (unit): the end nearer
/// the origin, 1.8 m wide and curved 0.5 m deep, 0.3 to 1.5 m above the road.
fn car_end(rng: &mut rand::rngs::StdRng, cx: f32, cy: f32, dir: [f32; 2]) -> Vec<[f32; 3]> {
    let toward = if cx * dir[0] + cy * dir[1] > 0.0 { -1.0 } else { 1.0 };
    (0..600)
        .map(|_| {
            let v: f32 = rng.random_range(-0.9..0.9);
            // A rounded end: the corners sit 0.5 m behind the middle.
            let u = toward * (2.2 - 0.5 * (v / 0.9).powi(2));
            let z = -1.7 + rng.random_range(0.3..1.5);
            [cx + u * dir[0] - v * dir[1], cy + u * dir[1] + v * dir[0], z]
        })
        .collect()
}

#[test]
fn a_car_seen_end_on_is_completed_behind_its_end() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let road = scene(&mut rng, &[]);
    let mut pts: Vec<[f32; 3]> = (0..road.len()).map(|i| [road.x()[i], road.y()[i], road.z()[i]]).collect();
    // One car straight ahead driving away, one to the left front coming towards the sensor.
    let ahead = [20.0f32, 0.0];
    let (s, c) = 3.9f32.sin_cos();
    let left = [12.0f32, 9.0];
    pts.extend(car_end(&mut rng, ahead[0], ahead[1], [1.0, 0.0]));
    pts.extend(car_end(&mut rng, left[0], left[1], [c, s]));
    let p = DetectParams::default();
    let d = detect(&Cloud::from_points(&pts), &p).unwrap();
    assert_eq!(d.keep.len(), 2, "{:?}", d.clusters);
    for centre in [ahead, left] {
        let car = d
            .kept()
            .find(|k| (k.bbox.x - centre[0]).hypot(k.bbox.y - centre[1]) < 0.5)
            .unwrap_or_else(|| panic!("a completed car at {centre:?}: {:?}", d.clusters));
        assert_eq!(car.class, 0, "{car:?}");
        assert_eq!(car.bbox.length, p.boxes.end_on_length_m);
        assert!((car.bbox.width - 1.8).abs() < 0.05, "{car:?}");
    }
    // The same end turned to point its long side at the sensor hides no car: not completed.
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let mut sideways: Vec<[f32; 3]> = (0..road.len()).map(|i| [road.x()[i], road.y()[i], road.z()[i]]).collect();
    sideways.extend(car_end(&mut rng, 20.0, 2.2, [0.0, 1.0]).into_iter().map(|q| [q[0], q[1] - 2.2, q[2]]));
    let d = detect(&Cloud::from_points(&sideways), &p).unwrap();
    let k = d.kept().next().expect("a box");
    assert_ne!(k.class, 0, "{k:?}");
    assert!(k.bbox.length < 2.2, "{k:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]
    /// Shuffling the points renumbers them but changes no box: every box bit, class and point
    /// count is a function of the point set.
    #[test]
    fn boxes_do_not_depend_on_point_order(seed in any::<u64>()) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let cars: Vec<[f32; 3]> = (0..4).map(|k| [-30.0 + 18.0 * k as f32, rng.random_range(-20.0..20.0), rng.random_range(-3.0..3.0)]).collect();
        let cloud = scene(&mut rng, &cars);
        let mut order: Vec<usize> = (0..cloud.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let shuffled = cloud.select(&order);
        let p = DetectParams::default();
        let (a, b) = (detect(&cloud, &p).unwrap(), detect(&shuffled, &p).unwrap());
        let key = |d: &lidar_kernels::ops::detect::Detections| {
            let mut v: Vec<_> = d.clusters.iter().map(|c| {
                let b = c.bbox;
                ([b.x, b.y, b.z, b.length, b.width, b.height, b.yaw, c.score, c.clearance].map(f32::to_bits), c.points, c.class)
            }).collect();
            v.sort();
            v
        };
        prop_assert_eq!(key(&a), key(&b));
        for (new, &old) in order.iter().enumerate() {
            prop_assert_eq!(a.point_class[old], b.point_class[new]);
        }
    }
}

#[test]
fn detect_keys_are_optional_and_bad_values_name_their_path() {
    let cfg = PipelineConfig::from_yaml("detect: {enabled: true, cluster: {min_points: 5}}", "inline").unwrap();
    assert!(cfg.detect.enabled);
    assert_eq!(cfg.detect.params.cluster.min_points, 5);
    assert_eq!(cfg.detect.params.cluster.max_points, DetectParams::default().cluster.max_points);
    let e = PipelineConfig::from_yaml("detect: {ground: {max_height_m: 0.1}}", "inline").unwrap_err().to_string();
    assert!(e.contains("detect.") && e.contains("ground.max_height_m"), "{e}");
    let e = PipelineConfig::from_yaml("detect: {boxes: {classes: {car: {width: [2, 1]}}}}", "inline")
        .unwrap_err()
        .to_string();
    assert!(e.contains("detect.") && e.contains("boxes.classes.car.width"), "{e}");
    let e = PipelineConfig::from_yaml("detect: {cluster: {cell_m: 0.001}}", "inline").unwrap_err().to_string();
    assert!(e.contains("detect.") && e.contains("cluster.cell_m") && e.contains("cells a side"), "{e}");
    // A completed car shorter than the end it was completed from would move towards the sensor.
    let e = PipelineConfig::from_yaml("detect: {boxes: {end_on_length_m: 1.5}}", "inline").unwrap_err().to_string();
    assert!(e.contains("detect.boxes.end_on_length_m") && e.contains("car_end_on"), "{e}");
    let e = PipelineConfig::from_yaml("detect: {boxes: {angle: 4}}", "inline").unwrap_err().to_string();
    assert!(e.contains("detect.boxes.angle"), "{e}");
}

#[test]
fn empty_and_tiny_clouds() {
    let p = DetectParams::default();
    let d = detect(&Cloud::default(), &p).unwrap();
    assert!(d.point_class.is_empty() && d.clusters.is_empty() && d.keep.is_empty());
    // A point far outside the range is out of range, nothing else.
    let d = detect(&Cloud::from_points(&[[500.0, 0.0, 0.0], [1.0, 1.0, -1.7]]), &p).unwrap();
    assert_eq!(d.point_class, vec![PointClass::OutOfRange as u8, PointClass::Ground as u8]);
    assert_eq!(d.labels, vec![-1, -1]);
}
