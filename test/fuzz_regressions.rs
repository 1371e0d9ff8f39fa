//! Fuzz findings as regression tests. Every stored finding (`fuzz/regressions/<target>/`) and every
//! seed (`fuzz/corpus/<target>/`) goes through the fuzz targets' own harness (fuzz/src/harness.rs,
//! included below: the same calls and the same property checks as `scripts/fuzz.sh`), and each
//! finding has a test of what the library does with it instead.
//!
//! The ROS target (ros_param_conversion) needs the `ros` feature and is not replayed here.

#[path = "../fuzz/src/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lidar_kernels::bag::{self, BagError};
use lidar_kernels::cloud::CloudView;
use lidar_kernels::pipeline::{ConfigError, PipelineConfig};

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `fuzz/<kind>/<target>/`, sorted (an absent folder has none).
fn inputs(kind: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = fuzz_dir().join(kind).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
    files.sort();
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

fn finding(target: &str, name: &str) -> Vec<u8> {
    let path = fuzz_dir().join("regressions").join(target).join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every seed and finding of `target` through its harness, each input timed.
fn replay(target: &str, run: fn(&[u8])) {
    let all: Vec<_> = inputs("corpus", target).into_iter().chain(inputs("regressions", target)).collect();
    assert!(!all.is_empty(), "no seeds for {target}");
    for (path, data) in all {
        let t = Instant::now();
        run(&data);
        // libFuzzer's -timeout is 10 s; a sound input takes milliseconds.
        assert!(t.elapsed() < Duration::from_secs(5), "{}: {:?}", path.display(), t.elapsed());
    }
}

#[test]
fn cdr_pointcloud2_inputs() {
    replay("cdr_pointcloud2", harness::cdr_pointcloud2);
}

#[test]
fn layout_gather_inputs() {
    replay("layout_gather", harness::layout_gather);
}

#[test]
fn mcap_reader_inputs() {
    replay("mcap_reader", harness::mcap_reader);
}

#[test]
fn sqlite_reader_inputs() {
    replay("sqlite_reader", harness::sqlite_reader);
}

#[test]
fn box_records_inputs() {
    replay("box_records", harness::box_records);
}

#[test]
fn config_yaml_inputs() {
    replay("config_yaml", harness::config_yaml);
}

// ---- layout_gather: timeout-empty-cloud-4e9-rows ------------------------------------------------

/// A 117-byte cloud of width 0 and height 0xfe000000: valid (no points, so no data needed), and
/// `gather` walked its 4.26e9 empty rows one by one (seconds per message; libFuzzer timeout).
/// Fixed in src/cloud/layout.rs (`for_each_point` returns at once for width 0).
#[test]
fn empty_cloud_with_billions_of_rows_gathers_at_once() {
    let data = finding("layout_gather", "timeout-empty-cloud-4e9-rows");
    let view = CloudView::decode(&data).unwrap();
    assert_eq!((view.msg.height, view.msg.width), (0xfe00_0000, 0));
    assert!(view.is_empty());
    let t = Instant::now();
    let g = view.gather();
    assert!(t.elapsed() < Duration::from_millis(100), "gather took {:?}", t.elapsed());
    assert!(g.cloud.is_empty());
    assert_eq!(g.dropped_non_finite, 0);
    // The pipeline gives an empty frame for it, as for any empty cloud.
    let mut p = lidar_kernels::pipeline::Pipeline::new(PipelineConfig::default());
    let t = Instant::now();
    let _ = p.process_cdr(&data);
    assert!(t.elapsed() < Duration::from_secs(1), "process_cdr took {:?}", t.elapsed());
}

// ---- mcap_reader: string lengths past the record -----------------------------------------------

/// The largest single allocation made by this thread while `f` runs.
fn largest_allocation(f: impl FnOnce()) -> usize {
    LARGEST.with(|l| l.set(0));
    TRACK.with(|t| t.set(true));
    f();
    TRACK.with(|t| t.set(false));
    LARGEST.with(Cell::get)
}

thread_local! {
    static TRACK: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

struct Tracking;

// SAFETY: forwards to the system allocator; only records sizes in thread-local cells.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

fn note(size: usize) {
    let _ = TRACK.try_with(|t| {
        if t.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// Writes `data` as `<name>` in a scratch folder of this test and returns the path.
fn scratch_bag(name: &str, data: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lidar_kernels_fuzz_regressions_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, data).unwrap();
    path
}

/// Every item of a bag's `messages(None)`, or the error of `open`.
fn read_all(path: &Path) -> Result<Vec<Result<bag::BagMessage, BagError>>, BagError> {
    let reader = bag::open(path)?;
    let items = reader.messages(None).collect();
    Ok(items)
}

/// Every item of a read, printed (the test output shows what each damaged file gives).
fn read_and_show(name: &str) -> Result<Vec<Result<bag::BagMessage, BagError>>, BagError> {
    let path = scratch_bag(name, &finding("mcap_reader", name));
    let items = read_all(&path);
    match &items {
        Err(e) => eprintln!("{name}: open: {e}"),
        Ok(items) => {
            let messages = items.iter().filter(|i| i.is_ok()).count();
            eprintln!("{name}: {messages} messages");
            for e in items.iter().filter_map(|i| i.as_ref().err()) {
                eprintln!("  {e}");
            }
        }
    }
    items
}

/// MCAP files of 0.1 to 11 KB whose records claim what the file does not hold:
/// - `metadata_huge_name`, `oom-metadata-string-map`: Metadata records with a name or a map
///   declared about 4 GiB long, which mcap 0.24 (binrw 0.12's `count`) reserved before reading:
///   4 GiB of address space for 100 bytes (an abort where overcommit is strict or `ulimit -v` is
///   set). The reader needs no Metadata record and no longer parses them.
/// - `summary_channel_huge_topic`: the same for a summary Channel's topic: the summary is said to
///   be unreadable and the data section is read.
/// - `oom-chunk-uncompressed-size`: a zstd chunk whose header claims 4294967295 uncompressed
///   bytes, which mcap's LinearReader zero-filled before decompressing (4 GiB resident, 10 s; an
///   OOM kill on an 8 GB Jetson): the chunk is said to be skipped.
///
/// Each is read in milliseconds with no allocation above 64 MiB.
#[test]
fn mcap_claims_past_the_file_allocate_nothing_large() {
    for (name, said) in [
        ("metadata_huge_name.mcap", None),
        ("oom-metadata-string-map.mcap", None),
        ("summary_channel_huge_topic.mcap", Some("summary section is unreadable")),
        (
            "oom-chunk-uncompressed-size.mcap",
            Some("its header says 4294967295 (the CRC matches): its messages are read"),
        ),
    ] {
        let t = Instant::now();
        let mut items = None;
        let largest = largest_allocation(|| items = Some(read_and_show(name)));
        assert!(largest < 64 << 20, "{name}: an allocation of {largest} bytes");
        assert!(t.elapsed() < Duration::from_secs(1), "{name}: {:?}", t.elapsed());
        let items = items.unwrap().unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(said) = said {
            assert!(
                items.iter().any(|i| matches!(i, Err(e @ BagError::Skipped { .. }) if e.to_string().contains(said))),
                "{name}: no line saying '{said}' in {items:?}"
            );
        }
    }
}

/// An 89-byte file: magic, then an Attachment record (opcode 0x09) whose body ends inside its
/// header. mcap 0.24's `parse_record` sliced `body[header_len..body.len() - 4]` unchecked ("slice
/// index starts at 38 but ends at 37"), a panic out of `messages()`. The reader does not parse
/// attachments; the file ends without a Footer, which is the error.
#[test]
fn mcap_attachment_shorter_than_its_header_is_no_panic() {
    let name = "crash-attachment-shorter-than-its-header.mcap";
    let items = read_and_show(name).unwrap();
    assert!(items.iter().all(|i| i.is_err()), "{items:?}");
    assert!(matches!(items.last(), Some(Err(BagError::Corrupt { .. }))), "{items:?}");
}

/// An MCAP file whose summary Statistics give a channel a message count near 2^64:
/// `BagReader::message_count` summed the topics' counts with `+` ("attempt to add with
/// overflow"), as `open` did over the files of a bag. Both sums saturate. The fuzzer's file
/// changed the counts but not the summary CRC, which the reader now checks: the test puts the
/// CRC right so that the counts are believed.
#[test]
fn mcap_message_counts_near_2_pow_64_saturate() {
    let name = "crash-statistics-message-count-overflow.mcap";
    let mut bytes = finding("mcap_reader", name);
    let n = bytes.len();
    let (footer, crc_at) = (n - 8 - 29, n - 8 - 4);
    let summary_start = u64::from_le_bytes(bytes[footer + 9..footer + 17].try_into().unwrap()) as usize;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[summary_start..crc_at]);
    bytes[crc_at..crc_at + 4].copy_from_slice(&crc.finalize().to_le_bytes());
    let path = scratch_bag(name, &bytes);
    let reader = bag::open(&path).unwrap();
    let counts: Vec<u64> = reader.topics().iter().map(|t| t.message_count).collect();
    let exact = counts.iter().try_fold(0u64, |s, &c| s.checked_add(c));
    assert!(exact.is_none(), "the counts {counts:?} do not overflow: the finding is not exercised");
    assert_eq!(reader.message_count(), u64::MAX);
    harness::mcap_reader(&bytes);
}

// ---- config_yaml: neighbour widths ---------------------------------------------------------------

/// `neighbors.knn.k` / `neighbors.ball_query.nsample` of 2e9 loaded (the operators accept up to
/// 2^31 - 1), and the first frame allocated queries x k indices: 300 GB for a 40-point cloud. The
/// nodes' parameters already stop at 65536; the config now refuses more, naming the key.
#[test]
fn neighbour_widths_past_65536_are_refused() {
    for (yaml, section, key) in [
        ("neighbors: {mode: knn, knn: {k: 65537}}", "neighbors.knn", "k"),
        ("neighbors: {ball_query: {nsample: 2000000000}}", "neighbors.ball_query", "nsample"),
    ] {
        match PipelineConfig::from_yaml(yaml, "bad.yaml") {
            Err(ConfigError::Invalid { section: s, error, .. }) => {
                assert_eq!((s, error.key.as_str(), error.allowed.as_str()), (section, key, "1 ..= 65536"), "{yaml}")
            }
            other => panic!("{yaml}: {other:?}"),
        }
    }
    let ok = PipelineConfig::from_yaml("neighbors: {knn: {k: 65536}, ball_query: {nsample: 65536}}", "ok.yaml");
    harness::run_config(ok.unwrap());
    for (_, data) in inputs("regressions", "config_yaml") {
        harness::config_yaml(&data);
    }
}

/// `fps.num_samples: 2147483647` (in range) padded every frame's FPS output to K indices: 8 GiB
/// (twice: host copy and backend copy) for a 40-point cloud. The pipeline now samples min(K, N)
/// (src/pipeline/stages.rs): the same samples, the padding was never used.
#[test]
fn fps_of_2e31_samples_takes_the_cloud_size() {
    let cfg = PipelineConfig::from_yaml(
        std::str::from_utf8(&finding("config_yaml", "oom-fps-num-samples-2e31.yaml")).unwrap(),
        "fps.yaml",
    )
    .unwrap();
    assert_eq!(cfg.fps.params.num_samples, 2147483647);
    let mut p = lidar_kernels::pipeline::Pipeline::new(cfg);
    let mut samples = None;
    let largest = largest_allocation(|| {
        let frame = p.process_cdr(harness::fixture_cloud_cdr()).unwrap();
        samples = Some(frame.results.samples.clone().unwrap());
    });
    assert!(largest < 64 << 20, "an allocation of {largest} bytes");
    let samples = samples.unwrap();
    // 40 points, 2 of them not finite: every one of the 38 others, once.
    assert_eq!(samples.len(), 38);
    let mut sorted = samples.clone();
    sorted.sort();
    assert_eq!(sorted, (0..38).collect::<Vec<i32>>());
}

// ---- layout_gather: fields overlapping at one byte ---------------------------------------------

/// A cloud of `points` one-byte records with x, y, z and `extra` more uint8 fields, all at offset 0.
fn overlapping_fields_message(extra: usize, points: usize) -> Vec<u8> {
    use lidar_kernels::cloud::{Datatype, Header, PointCloud2, PointField};
    let names = ["x".to_string(), "y".into(), "z".into()].into_iter().chain((0..extra).map(|i| format!("c{i}")));
    PointCloud2 {
        header: Header::default(),
        height: 1,
        width: points as u32,
        fields: names.map(|n| PointField::new(&n, 0, Datatype::Uint8)).collect(),
        is_bigendian: false,
        point_step: 1,
        row_step: points as u32,
        data: std::borrow::Cow::Owned(vec![7; points]),
        is_dense: true,
    }
    .to_cdr()
}

/// 203 uint8 fields at offset 0 of 1-byte records: valid, and the gather made one float per point
/// and field, 37 times the message's size (the layout_gather property "gathered floats <= 4 x
/// message bytes"); at 4 MB (2 M points, 87 k fields) that is 700 GB, an abort on a node or in
/// `replay`. validate now refuses more channels than point_step + 3 (src/cloud/layout.rs), and
/// checks duplicate names with a set (it compared every pair: seconds at 87 k fields).
#[test]
fn fields_overlapping_at_one_byte_are_refused_before_the_gather() {
    use lidar_kernels::cloud::CloudError;
    let data = finding("layout_gather", "overlapping-fields-1000x203-floats");
    let e = CloudView::decode(&data).unwrap_err();
    assert_eq!(e, CloudError::TooManyChannels { channels: 203, point_step: 1 });
    assert!(e.to_string().contains("fields overlap"), "{e}");

    let big = overlapping_fields_message(87_000, 2_000_000);
    let t = Instant::now();
    let largest = largest_allocation(|| {
        let e = CloudView::decode(&big).unwrap_err();
        assert_eq!(e, CloudError::TooManyChannels { channels: 87_003, point_step: 1 });
        let mut p = lidar_kernels::pipeline::Pipeline::new(PipelineConfig::default());
        assert!(p.process_cdr(&big).is_err());
    });
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    assert!(largest < 64 << 20, "an allocation of {largest} bytes");
    // point_step + 3 channels (x, y, z and one field per byte) still gather.
    let ok = overlapping_fields_message(1, 100);
    assert_eq!(CloudView::decode(&ok).unwrap().gather().cloud.num_channels(), 4);
}
