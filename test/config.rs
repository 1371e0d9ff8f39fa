use lidar_kernels::pipeline::{PipelineConfig, VoxelMode};
use std::path::Path;

fn config_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config"))
}

#[test]
fn shipped_pipeline_config_parses() {
    let cfg = PipelineConfig::load(&config_dir().join("pipeline.yaml")).unwrap();
    assert_eq!(cfg.voxelize.mode, VoxelMode::Hard);
    assert_eq!(cfg.voxelize.params.max_voxels, 60000);
    assert_eq!(cfg.voxelize.params.grid.voxel_size, [0.16, 0.16, 10.0]);
    assert_eq!(cfg.fps.params.num_samples, 4096);
    assert_eq!(cfg.nms.params.score_threshold, f32::NEG_INFINITY);
}

#[test]
fn empty_config_is_the_default() {
    assert_eq!(PipelineConfig::from_yaml("{}", "inline").unwrap(), PipelineConfig::default());
}

/// A bad value is refused with the key's path and the allowed range.
#[test]
fn invalid_values_name_key_and_range() {
    let cases = [
        ("voxelize: {max_voxels: 0}", "voxelize.", "max_voxels"),
        ("voxelize: {voxel_size: [0.1, -1, 0.1]}", "voxelize.", "voxel_size[1]"),
        ("downsample: {point_cloud_range: [0, 0, 0, -1, 1, 1]}", "downsample.", "point_cloud_range[3]"),
        ("fps: {num_samples: 0}", "fps.", "num_samples"),
        (
            "neighbors: {ball_query: {radius: 1.0, min_radius: 2.0, nsample: 8, padding: minus_one}}",
            "neighbors.ball_query.",
            "min_radius",
        ),
        ("nms: {kind: axis_aligned, threshold: 1.5}", "nms.", "threshold"),
    ];
    for (yaml, section, key) in cases {
        let err = PipelineConfig::from_yaml(yaml, "bad.yaml").unwrap_err().to_string();
        assert!(
            err.contains("bad.yaml") && err.contains(&format!("{section}invalid parameter {key}")),
            "{yaml}: {err}"
        );
    }
}

#[test]
fn unknown_keys_and_bad_enums_are_refused() {
    for (yaml, needle) in [
        ("voxelise: {}", "voxelise"),
        ("voxelize: {max_voxel: 3}", "unknown key 'voxelize.max_voxel'"),
        ("nms: {kind: circle, threshold: 1, radius: 2}", "unknown key 'nms.radius'"),
        ("voxelize: {mode: sparse}", "sparse"),
        ("neighbors: {ball_query: {radius: 1, nsample: 4, padding: zeros}}", "zeros"),
    ] {
        let err = PipelineConfig::from_yaml(yaml, "bad.yaml").unwrap_err().to_string();
        assert!(err.contains(needle), "{yaml}: {err}");
    }
}
