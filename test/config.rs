use lidar_kernels::pipeline::{FpsInput, PipelineConfig, VoxelMode};
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
            err.contains("bad.yaml") && err.contains(&format!("invalid parameter {section}{key} =")),
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

/// Every key is optional: a partial section keeps the defaults of the keys it leaves out.
#[test]
fn partial_sections_merge_over_the_defaults() {
    let d = PipelineConfig::default();
    let c = PipelineConfig::from_yaml("fps: {enabled: false}\nneighbors: {enabled: false}", "t").unwrap();
    assert!(!c.fps.enabled && !c.neighbors.enabled && c.fps.params == d.fps.params);
    let c = PipelineConfig::from_yaml("fps: {start_index: 7}", "t").unwrap();
    assert_eq!((c.fps.params.start_index, c.fps.params.num_samples), (7, d.fps.params.num_samples));
    let c = PipelineConfig::from_yaml("neighbors: {ball_query: {radius: 2}}", "t").unwrap();
    assert_eq!(c.neighbors.ball_query.radius, 2.0);
    assert_eq!(c.neighbors.ball_query.nsample, d.neighbors.ball_query.nsample);
    let c = PipelineConfig::from_yaml("nms: {kind: circle}", "t").unwrap();
    assert_eq!(c.nms.params.kind, lidar_kernels::ops::nms::NmsKind::Circle);
    assert_eq!(c.nms.params.threshold, d.nms.params.threshold);
    let c = PipelineConfig::from_yaml("voxelize: {max_voxels: 9}", "t").unwrap();
    assert_eq!((c.voxelize.params.max_voxels, c.voxelize.params.grid), (9, d.voxelize.params.grid));
    let c = PipelineConfig::from_yaml("fps: {input: downsampled}", "t").unwrap();
    assert_eq!(c.fps.input, FpsInput::Downsampled);
}

/// Stage combinations that cannot run are refused naming both keys, once.
#[test]
fn stage_rules_name_both_keys() {
    for (yaml, needs) in [
        ("fps: {enabled: false}", ["neighbors.enabled", "fps.enabled"]),
        ("fps: {input: downsampled}\ndownsample: {enabled: false}", ["fps.input: downsampled", "downsample.enabled"]),
    ] {
        let err = PipelineConfig::from_yaml(yaml, "bad.yaml").unwrap_err().to_string();
        for key in needs {
            assert_eq!(err.matches(key).count(), 1, "{yaml}: {err}");
        }
        // The chain an `anyhow` binary prints (`{:#}`) says it once too.
        let chained = format!("{:#}", anyhow::Error::new(PipelineConfig::from_yaml(yaml, "bad.yaml").unwrap_err()));
        assert_eq!(chained, err);
    }
    // The same rule with the downsampled cloud on: accepted.
    PipelineConfig::from_yaml("fps: {input: downsampled}", "ok.yaml").unwrap();
}

/// A value of the wrong type or out of its type's range is named by its full path, once, also
/// inside the sections whose keys come from an operator's parameter struct.
#[test]
fn bad_values_are_named_by_full_path_once() {
    for (yaml, key) in [
        ("fps: {num_samples: x}", "fps.num_samples"),
        ("neighbors: {ball_query: {nsample: -1}}", "neighbors.ball_query.nsample"),
        ("voxelize: {voxel_size: [1, 2]}", "voxelize.voxel_size"),
        ("nms: {kind: cirle}", "nms.kind"),
        ("downsample: {point_cloud_range: yes}", "downsample.point_cloud_range"),
        ("fps: {input: sideways}", "fps.input"),
    ] {
        let err = PipelineConfig::from_yaml(yaml, "bad.yaml").unwrap_err();
        let text = format!("{:#}", anyhow::Error::new(err));
        assert!(text.starts_with(&format!("config bad.yaml: {key}: ")), "{yaml}: {text}");
        assert_eq!(text.matches(key).count(), 1, "{yaml}: {text}");
    }
}
