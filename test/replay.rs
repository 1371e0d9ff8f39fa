mod common;

use lidar_kernels::bag::{self, sample, McapBagWriter};
use lidar_kernels::cloud::{Cloud, Header, PointCloud2, PointLayout, POINTCLOUD2_TYPE};
use lidar_kernels::ops::voxel::voxelize_hard;
use lidar_kernels::pipeline::{Engine, PipelineConfig};
use lidar_kernels::replay::{replay, ReplayOptions};
use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn options(bag: PathBuf, out: Option<PathBuf>) -> ReplayOptions {
    ReplayOptions { bag, topic: None, out, verbose_frames: false, render: None }
}

/// Replaying the sample writes every output topic once per scan, stamped like its input, and the
/// voxels equal the CPU operator run directly on the .bin scans (a path that never touches CDR).
#[test]
fn sample_replay_writes_every_output() {
    let dir = scratch("replay_sample");
    let bag_dir = sample::write_sample_bag(&dir).unwrap();
    let out = dir.join("out.mcap");
    let config = PipelineConfig::default();
    let summary = replay(&options(bag_dir, Some(out.clone())), config.clone(), Engine::cpu()).unwrap();
    assert_eq!(summary.frames, sample::SAMPLE_SCANS.len() as u64);
    assert_eq!(summary.skipped, 0);

    let reader = bag::open(&out).unwrap();
    let topics: Vec<&str> = reader.topics().iter().map(|t| t.name.as_str()).collect();
    for t in ["voxels", "downsampled", "samples", "neighborhoods"] {
        let name = format!("/lidar_kernels/{t}");
        let info = reader.topic(&name).unwrap_or_else(|| panic!("{name} missing from {topics:?}"));
        assert_eq!(info.message_count, sample::SAMPLE_SCANS.len() as u64);
    }
    let voxels: Vec<_> = reader.messages(Some("/lidar_kernels/voxels")).map(Result::unwrap).collect();
    for (i, (m, scan_name)) in voxels.iter().zip(sample::SAMPLE_SCANS).enumerate() {
        assert_eq!(m.log_time_ns, sample::SAMPLE_START_NS + i as u64 * sample::SAMPLE_PERIOD_NS);
        let (header, g) = Cloud::from_cdr(&m.data).unwrap();
        assert_eq!(header.frame_id, sample::SAMPLE_FRAME_ID);
        let scan = common::load_ouster(scan_name);
        let features = Cloud::from_xyz(scan.x().to_vec(), scan.y().to_vec(), scan.z().to_vec())
            .with_channel("intensity", scan.channel("reflectivity").unwrap().to_vec());
        let direct = voxelize_hard(&features, &config.voxelize.params).unwrap();
        assert_eq!(g.cloud.len(), direct.coords.len(), "{scan_name}");
        let col = |n: &str| g.cloud.channel(n).unwrap().iter().map(|&v| v as i32).collect::<Vec<_>>();
        let coords: Vec<[i32; 3]> =
            col("voxel_z").into_iter().zip(col("voxel_y")).zip(col("voxel_x")).map(|((z, y), x)| [z, y, x]).collect();
        assert_eq!(coords, direct.coords);
        assert_eq!(col("num_points"), direct.num_points.iter().map(|&n| n as i32).collect::<Vec<_>>());
    }
}

/// A malformed message and a message of the wrong type are skipped and counted; the frames around
/// them are processed.
#[test]
fn bad_messages_are_skipped_and_counted() {
    let dir = scratch("replay_bad");
    let path = dir.join("bad.mcap");
    let mut w = McapBagWriter::create(&path).unwrap();
    let clouds = w.add_topic("/points", POINTCLOUD2_TYPE).unwrap();
    let scan = common::load_ouster("os1-32_scan0.bin");
    let good = PointCloud2::from_cloud(Header::default(), &scan, &PointLayout::packed_for(&scan)).to_cdr();
    let mut no_x = PointCloud2::from_cloud(Header::default(), &scan, &PointLayout::packed_for(&scan));
    no_x.fields.retain(|f| f.name != "x");
    w.write(clouds, 1, &good).unwrap();
    w.write(clouds, 2, &good[..good.len() / 2]).unwrap();
    w.write(clouds, 3, &no_x.to_cdr()).unwrap();
    w.write(clouds, 4, &good).unwrap();
    w.finish().unwrap();
    let mut config = PipelineConfig::default();
    config.features = vec!["reflectivity".into()];
    config.fps.params.num_samples = 64;
    let summary = replay(&options(path, None), config, Engine::cpu()).unwrap();
    assert_eq!((summary.frames, summary.skipped), (2, 2));
    assert_eq!(summary.stats.malformed, 2);
}

/// Several PointCloud2 topics without --topic is an error that lists them.
#[test]
fn ambiguous_topic_is_an_error() {
    let dir = scratch("replay_ambiguous");
    let path = dir.join("two.mcap");
    let mut w = McapBagWriter::create(&path).unwrap();
    let scan = common::load_ouster("os1-32_scan0.bin");
    let msg = PointCloud2::from_cloud(Header::default(), &scan, &PointLayout::packed_for(&scan)).to_cdr();
    for t in ["/a", "/b"] {
        let h = w.add_topic(t, POINTCLOUD2_TYPE).unwrap();
        w.write(h, 1, &msg).unwrap();
    }
    w.finish().unwrap();
    let err = replay(&options(path, None), PipelineConfig::default(), Engine::cpu()).unwrap_err().to_string();
    assert!(err.contains("/a") && err.contains("/b") && err.contains("--topic"), "{err}");
}

/// Box records on the configured boxes topic go through NMS; the kept boxes written to the output
/// bag are the ones the CPU operator keeps when called directly.
#[test]
fn boxes_topic_goes_through_nms() {
    use lidar_kernels::ops::nms::{nms, Box3d};
    use lidar_kernels::pipeline::outputs::{boxes_from_cloud, boxes_message};
    use rand::{Rng, SeedableRng};
    let dir = scratch("replay_boxes");
    let path = dir.join("boxes.mcap");
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    let n = 300;
    let boxes: Vec<Box3d> = (0..n)
        .map(|_| Box3d {
            x: rng.random_range(-20.0..20.0),
            y: rng.random_range(-20.0..20.0),
            z: 0.0,
            length: rng.random_range(1.0..5.0),
            width: rng.random_range(1.0..3.0),
            height: 1.5,
            yaw: rng.random_range(-3.2..3.2),
        })
        .collect();
    let scores: Vec<f32> = (0..n).map(|_| (rng.random_range(0..20) as f32) / 20.0).collect();
    let labels: Vec<i32> = (0..n).map(|_| rng.random_range(0..3)).collect();
    let config = PipelineConfig::default();
    let mut w = McapBagWriter::create(&path).unwrap();
    let scan = common::load_ouster("os1-32_scan0.bin");
    let clouds = w.add_topic("/points", POINTCLOUD2_TYPE).unwrap();
    w.write(clouds, 1, &PointCloud2::from_cloud(Header::default(), &scan, &PointLayout::packed_for(&scan)).to_cdr())
        .unwrap();
    let topic = w.add_topic(&config.nms.boxes_topic, POINTCLOUD2_TYPE).unwrap();
    let header = Header { stamp_sec: 5, stamp_nanosec: 7, frame_id: "lidar".into() };
    w.write(topic, 2, boxes_message(&header, &boxes, &scores, &labels).cdr()).unwrap();
    w.finish().unwrap();

    let mut cfg = config.clone();
    cfg.features = vec!["reflectivity".into()];
    cfg.fps.params.num_samples = 64;
    let out = dir.join("out.mcap");
    let summary = replay(&options(path, Some(out.clone())), cfg.clone(), Engine::cpu()).unwrap();
    assert_eq!(summary.box_frames, 1);
    let expected = nms(&boxes, &scores, &labels, &cfg.nms.params).unwrap();
    let reader = bag::open(&out).unwrap();
    let kept: Vec<_> = reader.messages(Some("/lidar_kernels/boxes")).map(Result::unwrap).collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].log_time_ns, header.stamp_ns());
    let (h, g) = Cloud::from_cdr(&kept[0].data).unwrap();
    assert_eq!(h, header);
    let (kb, ks, kl) = boxes_from_cloud(&g.cloud).unwrap();
    let idx: Vec<usize> = expected.keep.iter().map(|&k| k as usize).collect();
    assert_eq!(kb, idx.iter().map(|&i| boxes[i]).collect::<Vec<_>>());
    assert_eq!(ks, idx.iter().map(|&i| scores[i]).collect::<Vec<_>>());
    assert_eq!(kl, idx.iter().map(|&i| labels[i]).collect::<Vec<_>>());
}

/// `lidar-kernels replay` exits non-zero when no frame was processed, and with `--strict` when any
/// message was skipped; a bag with one good and one malformed cloud passes without `--strict`.
#[test]
fn replay_exit_status_counts_skipped_frames() {
    let dir = scratch("replay_exit");
    let scan = common::load_ouster(sample::SAMPLE_SCANS[0]);
    let good = PointCloud2::from_cloud(Header::default(), &scan, &PointLayout::packed_for(&scan)).to_cdr();
    let mut no_x = PointCloud2::from_cloud(Header::default(), &scan, &PointLayout::packed_for(&scan));
    no_x.fields.remove(0);
    let write = |name: &str, msgs: &[&[u8]]| {
        let path = dir.join(name);
        let mut w = McapBagWriter::create(&path).unwrap();
        let t = w.add_topic("/points", POINTCLOUD2_TYPE).unwrap();
        for (i, m) in msgs.iter().enumerate() {
            w.write(t, i as u64 + 1, m).unwrap();
        }
        w.finish().unwrap();
        path
    };
    let bad = no_x.to_cdr();
    let mixed = write("mixed.mcap", &[&good, &bad]);
    let all_bad = write("all_bad.mcap", &[&bad, &bad]);
    let run = |bag: &PathBuf, strict: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_lidar-kernels"));
        cmd.args(["replay", "--quiet", "--backend", "cpu", "--config"]).arg(dir.join("fast.yaml")).arg(bag);
        if strict {
            cmd.arg("--strict");
        }
        let out = cmd.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    std::fs::write(dir.join("fast.yaml"), "fps: {num_samples: 16}\n").unwrap();
    assert_eq!(run(&mixed, false).0, Some(0));
    let (code, err) = run(&mixed, true);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--strict: 1 messages were skipped"), "{err}");
    let (code, err) = run(&all_bad, false);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no frame of /points was processed (2 messages skipped)"), "{err}");
}

#[test]
fn soak_outputs_are_periodic_on_the_cpu() {
    // The sample's scans twice over: every frame's outputs equal those of the first pass.
    let dir = scratch("soak");
    let bag = sample::write_sample_bag(&dir).unwrap();
    let reader = bag::open(&bag).unwrap();
    let scans: Vec<Vec<u8>> = reader.messages(Some("/ouster/points")).map(|m| m.unwrap().data).collect();
    let mut config = PipelineConfig::default();
    config.fps.params.num_samples = 256;
    let mut pipeline = lidar_kernels::pipeline::Pipeline::with_engine(config, Engine::cpu());
    let report = lidar_kernels::verify::soak::soak(&mut pipeline, &scans, 2 * scans.len() as u64, &|| None);
    assert!(report.passed(), "{report}");
    assert_eq!((report.failures, report.mismatches.len(), report.scans), (0, 0, scans.len()));
}
