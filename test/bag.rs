mod common;

use lidar_kernels::bag::sample::{
    self, SAMPLE_FRAME_ID, SAMPLE_PERIOD_NS, SAMPLE_SCANS, SAMPLE_START_NS, SAMPLE_TOPIC,
};
use lidar_kernels::bag::{self, BagError, BagMessage, McapBagWriter, Storage, WriterOptions};
use lidar_kernels::cloud::{gather, PointLayout, POINTCLOUD2_TYPE};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};

/// A fresh, empty directory under Cargo's per-target temp dir.
fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bag-tests").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const STRING_DEF: &str = "# comment\nstring data\n";
const BYTES_DEF: &str = "uint8[] data\n";

/// Messages (topic, type, log time, payload) on three topics, interleaved, with empty, small and
/// 300 kB payloads, log times not monotonic across topics.
fn sample_messages(seed: u64, n: usize) -> Vec<BagMessage> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let topics =
        [("/a", "test_msgs/msg/Str"), ("/b/bytes", "test_msgs/msg/Bytes"), ("/ouster/points", POINTCLOUD2_TYPE)];
    (0..n)
        .map(|i| {
            let (topic, type_name) = topics[i % 3];
            let len = match i % 5 {
                0 => 0,
                1 => 300_000,
                _ => rng.random_range(1..2000),
            };
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let log_time_ns =
                1_000_000_000 + (i as u64) * 1000 + if i % 3 == 1 { 0 } else { 500 } - (i as u64 % 2) * 700;
            BagMessage { topic: topic.into(), type_name: type_name.into(), log_time_ns, data }
        })
        .collect()
}

fn write_messages(mut w: McapBagWriter, msgs: &[BagMessage]) -> PathBuf {
    let mut handles = std::collections::HashMap::new();
    for m in msgs {
        let h = *handles.entry(m.topic.clone()).or_insert_with(|| match m.type_name.as_str() {
            POINTCLOUD2_TYPE => w.add_topic(&m.topic, POINTCLOUD2_TYPE).unwrap(),
            "test_msgs/msg/Str" => w.add_topic_with_definition(&m.topic, &m.type_name, "ros2msg", STRING_DEF).unwrap(),
            _ => w.add_topic_with_definition(&m.topic, &m.type_name, "ros2msg", BYTES_DEF).unwrap(),
        });
        w.write(h, m.log_time_ns, &m.data).unwrap();
    }
    w.finish().unwrap()
}

fn read_all(path: &Path, topic: Option<&str>) -> Vec<BagMessage> {
    let reader = bag::open(path).unwrap();
    reader.messages(topic).collect::<Result<Vec<_>, _>>().unwrap()
}

fn count(msgs: &[BagMessage], topic: &str) -> u64 {
    msgs.iter().filter(|m| m.topic == topic).count() as u64
}

#[test]
fn mcap_single_file_round_trip() {
    let dir = temp_dir("single");
    let msgs = sample_messages(1, 40);
    for compress in [true, false] {
        let path = dir.join(format!("bag_{compress}.mcap"));
        let opts = WriterOptions { compress, chunk_size: 64 * 1024, ..Default::default() };
        let written = write_messages(McapBagWriter::create_file_with(&path, opts).unwrap(), &msgs);
        assert_eq!(written, path);
        assert!(!dir.join("metadata.yaml").exists());

        let reader = bag::open(&path).unwrap();
        assert_eq!(reader.storage(), Storage::Mcap);
        assert!(reader.damage().is_empty());
        let names: Vec<&str> = reader.topics().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["/a", "/b/bytes", "/ouster/points"]);
        for t in reader.topics() {
            assert_eq!(t.message_count, count(&msgs, &t.name), "{}", t.name);
            assert_eq!(t.serialization_format, "cdr");
            assert!(t.offered_qos_profiles.contains("reliability: 1"));
        }
        assert_eq!(reader.topic("/ouster/points").unwrap().type_name, POINTCLOUD2_TYPE);
        let back = read_all(&path, None);
        assert_eq!(back, msgs, "compress={compress}");
        let only_b = read_all(&path, Some("/b/bytes"));
        let expect_b: Vec<BagMessage> = msgs.iter().filter(|m| m.topic == "/b/bytes").cloned().collect();
        assert_eq!(only_b, expect_b);
    }
}

#[test]
fn mcap_folder_round_trip_and_metadata() {
    let dir = temp_dir("folder").join("my_bag");
    let msgs = sample_messages(2, 30);
    let bag_path = write_messages(McapBagWriter::create_folder(&dir).unwrap(), &msgs);
    assert_eq!(bag_path, dir);
    let mcap_file = dir.join("my_bag_0.mcap");
    assert!(mcap_file.is_file());

    let reader = bag::open(&dir).unwrap();
    assert_eq!(reader.files(), [mcap_file.clone()]);
    let meta = reader.metadata().expect("metadata.yaml read");
    assert_eq!(meta.version, 8);
    assert_eq!(meta.storage_identifier, "mcap");
    assert_eq!(meta.relative_file_paths, ["my_bag_0.mcap"]);
    assert_eq!(meta.message_count, 30);
    let start = msgs.iter().map(|m| m.log_time_ns).min().unwrap();
    let end = msgs.iter().map(|m| m.log_time_ns).max().unwrap();
    assert_eq!(meta.starting_time.nanoseconds_since_epoch, start);
    assert_eq!(meta.duration.nanoseconds, end - start);
    for t in &meta.topics_with_message_count {
        assert_eq!(t.message_count, count(&msgs, &t.topic_metadata.name));
        assert_eq!(t.topic_metadata.serialization_format, "cdr");
    }
    assert_eq!(read_all(&dir, None), msgs);
    // The file alone reads the same.
    assert_eq!(read_all(&mcap_file, None), msgs);

    // Writing into an existing, non-empty folder is refused.
    let err = McapBagWriter::create_folder(&dir).err().expect("refused");
    assert!(err.to_string().contains("not empty"), "{err}");
}

#[test]
fn folder_with_several_files_reads_in_metadata_order() {
    let dir = temp_dir("multi").join("multi");
    std::fs::create_dir_all(&dir).unwrap();
    let first = sample_messages(3, 12);
    let second = sample_messages(4, 9);
    write_messages(McapBagWriter::create(dir.join("multi_1.mcap")).unwrap(), &second);
    write_messages(McapBagWriter::create(dir.join("multi_0.mcap")).unwrap(), &first);
    // Old-style path ("<bag dir>/<file>") for the first, bare file name for the second.
    let yaml = "rosbag2_bagfile_information:\n  version: 4\n  storage_identifier: mcap\n  relative_file_paths:\n    - multi/multi_0.mcap\n    - multi_1.mcap\n";
    std::fs::write(dir.join("metadata.yaml"), yaml).unwrap();
    let all: Vec<BagMessage> = first.iter().chain(&second).cloned().collect();
    assert_eq!(read_all(&dir, None), all);
    let reader = bag::open(&dir).unwrap();
    assert_eq!(reader.topic("/a").unwrap().message_count, count(&all, "/a"));
    assert_eq!(reader.message_count(), 21);

    // Without metadata.yaml the files are found and ordered by index.
    std::fs::remove_file(dir.join("metadata.yaml")).unwrap();
    assert_eq!(read_all(&dir, None), all);

    // A listed file that is missing is named.
    std::fs::write(dir.join("metadata.yaml"), yaml.replace("multi_1.mcap", "multi_7.mcap")).unwrap();
    let err = bag::open(&dir).unwrap_err();
    assert!(matches!(err, BagError::Metadata { .. }), "{err:?}");
    assert!(err.to_string().contains("multi_7.mcap"), "{err}");

    // Unknown storage plugin.
    std::fs::write(
        dir.join("metadata.yaml"),
        yaml.replace("storage_identifier: mcap", "storage_identifier: rosbag_v1"),
    )
    .unwrap();
    let err = bag::open(&dir).unwrap_err();
    assert!(matches!(err, BagError::UnknownStorage { .. }), "{err:?}");
    assert!(err.to_string().contains("rosbag_v1") && err.to_string().contains("metadata.yaml"), "{err}");

    // Whole-file compression is reported as unsupported.
    std::fs::write(dir.join("metadata.yaml"), format!("{yaml}  compression_format: zstd\n  compression_mode: FILE\n"))
        .unwrap();
    let err = bag::open(&dir).unwrap_err();
    assert!(matches!(err, BagError::Unsupported { .. }), "{err:?}");

    // Broken YAML.
    std::fs::write(dir.join("metadata.yaml"), "rosbag2_bagfile_information: [").unwrap();
    let err = bag::open(&dir).unwrap_err();
    assert!(matches!(err, BagError::Metadata { .. }) && err.to_string().contains("metadata.yaml"), "{err}");
}

/// A `.db3` with the schema rosbag2 (Jazzy) creates.
fn write_db3(path: &Path, topics: &[(i64, &str, &str)], messages: &[(i64, i64, i64, Vec<u8>)]) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(
        "CREATE TABLE schema(schema_version INTEGER PRIMARY KEY,ros_distro TEXT NOT NULL);
         CREATE TABLE metadata(id INTEGER PRIMARY KEY,metadata_version INTEGER NOT NULL,metadata TEXT NOT NULL);
         CREATE TABLE topics(id INTEGER PRIMARY KEY,name TEXT NOT NULL,type TEXT NOT NULL,serialization_format TEXT NOT NULL,offered_qos_profiles TEXT NOT NULL,type_description_hash TEXT NOT NULL);
         CREATE TABLE message_definitions(id INTEGER PRIMARY KEY,topic_type TEXT NOT NULL,encoding TEXT NOT NULL,encoded_message_definition TEXT NOT NULL,type_description_hash TEXT NOT NULL);
         CREATE TABLE messages(id INTEGER PRIMARY KEY,topic_id INTEGER NOT NULL,timestamp INTEGER NOT NULL, data BLOB NOT NULL);
         CREATE INDEX timestamp_idx ON messages (timestamp ASC);
         INSERT INTO schema VALUES (4, 'jazzy');",
    )
    .unwrap();
    for (id, name, ty) in topics {
        conn.execute(
            "INSERT INTO topics VALUES (?1, ?2, ?3, 'cdr', ?4, '')",
            rusqlite::params![id, name, ty, bag::DEFAULT_QOS_PROFILES],
        )
        .unwrap();
    }
    for (id, topic_id, ts, data) in messages {
        conn.execute("INSERT INTO messages VALUES (?1, ?2, ?3, ?4)", rusqlite::params![id, topic_id, ts, data])
            .unwrap();
    }
}

#[test]
fn sqlite3_bag_reads_in_timestamp_order() {
    let dir = temp_dir("sqlite").join("db_bag");
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("db_bag_0.db3");
    let topics = [
        (1, "/ouster/points", POINTCLOUD2_TYPE),
        (2, "/diag", "diagnostic_msgs/msg/DiagnosticArray"),
        (3, "/unused", "std_msgs/msg/Empty"),
    ];
    // 50 messages inserted out of time order, with timestamp ties (broken by id).
    let mut rows = Vec::new();
    for i in 0..50i64 {
        let ts = 1_000 + ((i * 37) % 50) / 2 * 10;
        rows.push((i + 1, 1 + i % 2, ts, vec![i as u8; (i as usize * 13) % 97]));
    }
    write_db3(&db, &topics, &rows);
    let mut expected = rows.clone();
    expected.sort_by_key(|r| (r.2, r.0));

    let reader = bag::open(&db).unwrap();
    assert_eq!(reader.storage(), Storage::Sqlite3);
    assert_eq!(reader.topics().len(), 3);
    assert_eq!(reader.topic("/ouster/points").unwrap().message_count, 25);
    assert_eq!(reader.topic("/diag").unwrap().message_count, 25);
    assert_eq!(reader.topic("/unused").unwrap().message_count, 0);
    assert!(reader.topic("/diag").unwrap().offered_qos_profiles.contains("depth: 10"));
    let back = read_all(&db, None);
    assert_eq!(back.len(), 50);
    for (m, r) in back.iter().zip(&expected) {
        assert_eq!(m.log_time_ns, r.2 as u64);
        assert_eq!(m.data, r.3);
        assert_eq!(m.topic, topics[(r.1 - 1) as usize].1);
        assert_eq!(m.type_name, topics[(r.1 - 1) as usize].2);
    }
    let diag = read_all(&db, Some("/diag"));
    let expect_diag: Vec<_> = expected.iter().filter(|r| r.1 == 2).collect();
    assert_eq!(diag.len(), expect_diag.len());
    assert!(diag.iter().zip(expect_diag).all(|(m, r)| m.data == r.3 && m.log_time_ns == r.2 as u64));
    assert!(read_all(&db, Some("/unused")).is_empty());

    // Through a bag folder.
    let yaml = "rosbag2_bagfile_information:\n  version: 8\n  storage_identifier: sqlite3\n  relative_file_paths:\n    - db_bag_0.db3\n";
    std::fs::write(dir.join("metadata.yaml"), yaml).unwrap();
    assert_eq!(read_all(&dir, None), back);

    // A file that is not a database.
    let bad = dir.join("bad.db3");
    std::fs::write(&bad, b"definitely not sqlite").unwrap();
    let err = bag::open(&bad).unwrap_err();
    assert!(matches!(err, BagError::Sqlite { .. }), "{err:?}");
    assert!(err.to_string().contains("bad.db3"), "{err}");
}

#[test]
fn missing_and_unknown_files_are_reported() {
    let dir = temp_dir("errors");
    let missing = dir.join("nope.mcap");
    let err = bag::open(&missing).unwrap_err();
    assert!(matches!(err, BagError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("nope.mcap"), "{err}");

    let txt = dir.join("notes.bag");
    std::fs::write(&txt, "hello").unwrap();
    let err = bag::open(&txt).unwrap_err();
    assert!(matches!(err, BagError::UnknownStorage { .. }), "{err:?}");

    let fake = dir.join("fake.mcap");
    std::fs::write(&fake, "not an mcap file at all").unwrap();
    let err = bag::open(&fake).unwrap_err();
    assert!(err.to_string().contains("fake.mcap") && err.to_string().contains("MCAP"), "{err}");

    let empty_dir = dir.join("empty");
    std::fs::create_dir_all(&empty_dir).unwrap();
    let err = bag::open(&empty_dir).unwrap_err();
    assert!(err.to_string().contains("metadata.yaml"), "{err}");

    // Topic not found lists the topics there are.
    let path = dir.join("t.mcap");
    write_messages(McapBagWriter::create(&path).unwrap(), &sample_messages(5, 6));
    let reader = bag::open(&path).unwrap();
    let items: Vec<_> = reader.messages(Some("/lidar")).collect();
    assert_eq!(items.len(), 1);
    let err = items.into_iter().next().unwrap().unwrap_err();
    assert!(matches!(err, BagError::TopicNotFound { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("/lidar")
            && text.contains("/ouster/points")
            && text.contains("/b/bytes")
            && text.contains("t.mcap"),
        "{text}"
    );

    // A type without a known definition is refused with the list of known ones.
    let mut w = McapBagWriter::create(dir.join("u.mcap")).unwrap();
    let err = w.add_topic("/m", "nav_msgs/msg/Odometry").unwrap_err();
    assert!(err.to_string().contains("nav_msgs/msg/Odometry") && err.to_string().contains(POINTCLOUD2_TYPE), "{err}");
}

#[test]
fn wrong_message_type_on_topic_is_a_clear_error() {
    let dir = temp_dir("wrong_type");
    let path = dir.join("w.mcap");
    let mut w = McapBagWriter::create(&path).unwrap();
    let h = w.add_topic_with_definition(SAMPLE_TOPIC, "std_msgs/msg/String", "ros2msg", STRING_DEF).unwrap();
    w.write(h, 5, &[0, 1, 0, 0, 3, 0, 0, 0, b'h', b'i', 0]).unwrap();
    let good = w.add_topic("/good", POINTCLOUD2_TYPE).unwrap();
    w.write(good, 6, &[0, 1, 0, 0, 1, 2, 3]).unwrap(); // a PointCloud2 cut short
    w.finish().unwrap();

    let reader = bag::open(&path).unwrap();
    let err = reader.require_topic_type(SAMPLE_TOPIC, POINTCLOUD2_TYPE).unwrap_err();
    let first = reader.messages_of_type(SAMPLE_TOPIC, POINTCLOUD2_TYPE).next().unwrap().unwrap_err();
    for e in [&err, &first] {
        assert!(matches!(e, BagError::WrongType { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("std_msgs/msg/String") && text.contains(POINTCLOUD2_TYPE) && text.contains(SAMPLE_TOPIC),
            "{text}"
        );
        assert!(text.contains("w.mcap"), "{text}");
    }
    // Per message as well.
    let msg = reader.messages(Some(SAMPLE_TOPIC)).next().unwrap().unwrap();
    let e = msg.point_cloud().unwrap_err();
    assert!(matches!(e, BagError::WrongType { .. }) && e.to_string().contains("std_msgs/msg/String"), "{e}");
    // Right type, undecodable bytes.
    let msg = reader.messages_of_type("/good", POINTCLOUD2_TYPE).next().unwrap().unwrap();
    let e = msg.point_cloud().unwrap_err();
    assert!(matches!(e, BagError::Decode { .. }), "{e:?}");
    assert!(e.to_string().contains("/good") && e.to_string().contains("truncated"), "{e}");
}

/// Reads `path` fully; returns the reader, the messages read and the error it ended with.
fn read_lossy(path: &Path) -> Result<(bag::BagReader, Vec<BagMessage>, Option<BagError>), BagError> {
    let reader = bag::open(path)?;
    let mut out = Vec::new();
    let mut err = None;
    for item in reader.messages(None) {
        match item {
            Ok(m) => out.push(m),
            Err(e) => err = Some(e),
        }
    }
    Ok((reader, out, err))
}

#[test]
fn truncated_mcap_never_panics_and_reads_a_prefix() {
    let dir = temp_dir("truncated");
    // Small payloads so that every offset can be tried.
    let msgs: Vec<BagMessage> = sample_messages(6, 24)
        .into_iter()
        .map(|mut m| {
            m.data.truncate(300);
            m
        })
        .collect();
    for compress in [false, true] {
        let full_path = dir.join(format!("full_{compress}.mcap"));
        let opts = WriterOptions { compress, chunk_size: 1024, ..Default::default() };
        write_messages(McapBagWriter::create_file_with(&full_path, opts).unwrap(), &msgs);
        let bytes = std::fs::read(&full_path).unwrap();
        let cut_path = dir.join(format!("cut_{compress}.mcap"));
        let (mut errors_at_open, mut partial, mut complete) = (0, 0, 0);
        // Every offset near both ends, every 3rd in between.
        let offsets = (0..bytes.len()).filter(|&i| i < 400 || i + 600 > bytes.len() || i % 3 == 0);
        for len in offsets {
            std::fs::write(&cut_path, &bytes[..len]).unwrap();
            match read_lossy(&cut_path) {
                Err(e) => {
                    errors_at_open += 1;
                    assert!(e.to_string().contains("cut_"), "error does not name the file: {e}");
                }
                Ok((reader, got, err)) => {
                    assert!(got.len() <= msgs.len());
                    assert_eq!(got[..], msgs[..got.len()], "cut at {len}: not a prefix");
                    if got.len() < msgs.len() {
                        let e = err.unwrap_or_else(|| panic!("cut at {len}: {} messages and no error", got.len()));
                        assert!(matches!(e, BagError::Corrupt { .. }), "{e:?}");
                        assert!(e.to_string().contains("cut_"), "{e}");
                        partial += 1;
                    } else {
                        complete += 1;
                    }
                    // Counts from a damaged file cover exactly what can be read.
                    if !reader.damage().is_empty() {
                        assert_eq!(reader.message_count() as usize, got.len(), "cut at {len}");
                    }
                }
            }
        }
        eprintln!(
            "compress={compress}: {} offsets: {errors_at_open} errors at open, {partial} partial, {complete} complete",
            bytes.len()
        );
        assert!(partial > 0 && complete > 0);
    }
}

#[test]
fn corrupted_mcap_bytes_never_panic() {
    let dir = temp_dir("corrupt");
    let msgs: Vec<BagMessage> = sample_messages(7, 12)
        .into_iter()
        .map(|mut m| {
            m.data.truncate(200);
            m
        })
        .collect();
    let full = dir.join("full.mcap");
    let opts = WriterOptions { compress: true, chunk_size: 512, ..Default::default() };
    write_messages(McapBagWriter::create_file_with(&full, opts).unwrap(), &msgs);
    let bytes = std::fs::read(&full).unwrap();
    let bad = dir.join("bad.mcap");
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for _ in 0..1500 {
        let mut b = bytes.clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..b.len());
            b[i] = rng.random();
        }
        std::fs::write(&bad, &b).unwrap();
        // Any outcome but a panic (or an unbounded allocation) is fine.
        let _ = read_lossy(&bad);
    }
}

#[test]
fn a_missing_scan_leaves_the_earlier_sample_whole() {
    let dir = temp_dir("sample-missing-scan");
    let bag_dir = sample::write_sample_bag(&dir).unwrap();
    let before = std::fs::read(bag_dir.join(format!("{}_0.mcap", sample::SAMPLE_BAG_NAME))).unwrap();
    // A data folder holding all but the last scan: the error names the missing one.
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    for name in &SAMPLE_SCANS[..SAMPLE_SCANS.len() - 1] {
        std::fs::copy(common::ouster_dir().join(name), data.join(name)).unwrap();
    }
    let err = sample::write_sample_bag_from(&data, &dir).unwrap_err().to_string();
    assert!(err.contains(SAMPLE_SCANS[SAMPLE_SCANS.len() - 1]), "{err}");
    let after = std::fs::read(bag_dir.join(format!("{}_0.mcap", sample::SAMPLE_BAG_NAME))).unwrap();
    assert!(after == before && bag_dir.join("metadata.yaml").is_file());
    // Into an empty folder: no bag folder at all.
    let empty = temp_dir("sample-missing-scan-empty");
    assert!(sample::write_sample_bag_from(&data, &empty).is_err());
    assert!(!empty.join(sample::SAMPLE_BAG_NAME).exists());
}

#[test]
fn sample_bag_holds_the_ouster_scans() {
    let dir = temp_dir("sample");
    let bag_dir = sample::write_sample_bag(&dir).unwrap();
    assert_eq!(bag_dir, dir.join(sample::SAMPLE_BAG_NAME));
    assert!(bag_dir.join("metadata.yaml").is_file());
    let license = std::fs::read_to_string(bag_dir.join("LICENSE")).unwrap();
    assert_eq!(license, std::fs::read_to_string(common::ouster_dir().join("LICENSE")).unwrap());
    // Writing again replaces it.
    assert_eq!(sample::write_sample_bag(&dir).unwrap(), bag_dir);

    let reader = bag::open(&bag_dir).unwrap();
    assert_eq!(reader.topics().len(), 1);
    let info = reader.require_topic_type(SAMPLE_TOPIC, POINTCLOUD2_TYPE).unwrap();
    assert_eq!(info.message_count, SAMPLE_SCANS.len() as u64);

    let layout = PointLayout::ouster();
    let mut n = 0;
    for (i, item) in reader.messages_of_type(SAMPLE_TOPIC, POINTCLOUD2_TYPE).enumerate() {
        let m = item.unwrap();
        let scan = common::load_ouster(SAMPLE_SCANS[i]);
        let stamp = SAMPLE_START_NS + i as u64 * SAMPLE_PERIOD_NS;
        assert_eq!(m.log_time_ns, stamp);
        let pc = m.point_cloud().unwrap();
        assert_eq!(pc.header.frame_id, SAMPLE_FRAME_ID);
        assert_eq!(pc.header.stamp_ns(), stamp);
        assert_eq!((pc.height, pc.width as usize), (1, scan.len()));
        assert_eq!(pc.point_step, 48);
        assert_eq!(pc.row_step as usize, 48 * scan.len());
        assert_eq!(pc.fields, layout.fields);
        assert!(!pc.is_bigendian);
        let cloud = gather(&pc).unwrap().cloud;
        assert_eq!(cloud.len(), scan.len());
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(cloud.x()), bits(scan.x()), "{}", SAMPLE_SCANS[i]);
        assert_eq!(bits(cloud.y()), bits(scan.y()));
        assert_eq!(bits(cloud.z()), bits(scan.z()));
        let refl = scan.channel("reflectivity").unwrap();
        assert_eq!(cloud.channel("intensity").unwrap(), refl);
        assert_eq!(cloud.channel("reflectivity").unwrap(), refl);
        assert_eq!(cloud.channel("ring").unwrap(), scan.channel("ring").unwrap());
        assert!(cloud.channel("ambient").unwrap().iter().all(|&a| a == 0.0));
        // t (ns) and range (mm) straight from the bytes.
        let t = scan.channel("t").unwrap();
        for p in (0..scan.len()).step_by(97) {
            let at = |off: usize| u32::from_le_bytes(pc.data[p * 48 + off..][..4].try_into().unwrap());
            assert_eq!(at(20), (t[p] as f64 * 1e9).round() as u32);
            let [x, y, z] = scan.point(p).map(|v| v as f64);
            assert_eq!(at(32), ((x * x + y * y + z * z).sqrt() * 1000.0).round() as u32);
        }
        n += 1;
    }
    assert_eq!(n, SAMPLE_SCANS.len());
}

fn python() -> Option<PathBuf> {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-py/bin/python");
    py.is_file().then_some(py)
}

/// Runs test/python/check_sample_bag.py when `.venv-py` exists (test/python/run.sh creates it).
#[test]
fn python_rosbags_checker_accepts_the_sample_bag() {
    let Some(py) = python() else {
        eprintln!("skipped: no .venv-py (run test/python/run.sh)");
        return;
    };
    let dir = temp_dir("python");
    let bag_dir = sample::write_sample_bag(&dir).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("test/python/check_sample_bag.py");
    let out = std::process::Command::new(&py).arg(&script).arg(&bag_dir).output().unwrap();
    assert!(
        out.status.success(),
        "checker failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // And it does notice a mismatch.
    let out = std::process::Command::new(&py)
        .arg(&script)
        .arg(&bag_dir)
        .args(["--scans", "os1-128_scan1.bin", "os1-128_scan0.bin", "os1-128_scan2.bin", "os1-32_scan0.bin"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "checker accepted swapped scans");
}

/// Writes the sample bag for test/python/run.sh: into `$BAG_SAMPLE_OUT` (default
/// `target/python-check`), printing the bag folder's path.
#[test]
#[ignore]
fn write_sample_bag_for_python() {
    let out = std::env::var_os("BAG_SAMPLE_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/python-check"));
    std::fs::create_dir_all(&out).unwrap();
    let bag_dir = sample::write_sample_bag(&out).unwrap();
    println!("SAMPLE_BAG={}", bag_dir.display());
}

/// Every item of a read: the messages, and the damage lines (`Skipped`) and final error apart.
fn read_with_damage(path: &Path) -> (Vec<BagMessage>, Vec<String>, Option<BagError>) {
    let reader = bag::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let (mut got, mut skipped, mut end) = (Vec::new(), Vec::new(), None);
    for item in reader.messages(None) {
        match item {
            Ok(m) => got.push(m),
            Err(e @ BagError::Skipped { .. }) => skipped.push(e.to_string()),
            Err(e) => end = Some(e),
        }
    }
    (got, skipped, end)
}

#[test]
fn damaged_sqlite3_bag_is_read_row_by_row() {
    let dir = temp_dir("sqlite_damaged");
    let db = dir.join("full.db3");
    let topics = [(1, "/ouster/points", POINTCLOUD2_TYPE)];
    // 8 messages of 6 KB: each spans pages of its own (4 KB pages), as scans do.
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let rows: Vec<(i64, i64, i64, Vec<u8>)> =
        (0..8i64).map(|i| (i + 1, 1, 1_000 + i * 100, (0..6000).map(|_| rng.random()).collect())).collect();
    write_db3(&db, &topics, &rows);
    let bytes = std::fs::read(&db).unwrap();
    let original = |m: &BagMessage| rows.iter().find(|r| r.2 as u64 == m.log_time_ns).map(|r| &r.3) == Some(&m.data);

    let cut = dir.join("cut.db3");
    for missing in [1usize, 30, 1000] {
        std::fs::write(&cut, &bytes[..bytes.len() - missing]).unwrap();
        let (got, skipped, end) = read_with_damage(&cut);
        assert!(end.is_none(), "missing {missing}: {end:?}");
        assert!(got.len() >= 7, "missing {missing}: only {} of 8 recovered ({skipped:?})", got.len());
        assert!(got.iter().all(original), "missing {missing}: a recovered message differs from what was written");
        assert!(got.windows(2).all(|w| w[0].log_time_ns < w[1].log_time_ns), "not in timestamp order");
        if got.len() < 8 {
            assert!(skipped.iter().any(|s| s.contains("row by row") && s.contains("cut.db3")), "{skipped:?}");
        }
        eprintln!("db3 missing its last {missing} bytes: {} of 8 messages, lines {skipped:?}", got.len());
    }
    // A page in the middle overwritten: the rows around it are still read.
    let page = 4096;
    for p in [3usize, 6] {
        let mut b = bytes.clone();
        b[p * page..(p + 1) * page].fill(0xa5);
        std::fs::write(&cut, &b).unwrap();
        match bag::open(&cut) {
            // The page held what every query needs (the schema or the topics table).
            Err(e) => {
                assert!(e.to_string().contains("cut.db3"), "{e}");
                eprintln!("db3 with page {p} overwritten: {e}");
            }
            Ok(_) => {
                let (got, skipped, _) = read_with_damage(&cut);
                assert!(got.iter().all(original), "page {p}: a recovered message differs");
                assert!(!got.is_empty(), "page {p}: nothing recovered ({skipped:?})");
                eprintln!("db3 with page {p} overwritten: {} of 8 messages, lines {skipped:?}", got.len());
            }
        }
    }
}

#[test]
fn damaged_mcap_is_read_around_and_up_to_the_cut() {
    let dir = temp_dir("mcap_damaged");
    // 8 scans of 50 KB on two topics: a chunk of all of them spans several 128 KB zstd blocks,
    // the unit a cut zstd stream can still be decoded in.
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let msgs: Vec<BagMessage> = (0..8u64)
        .map(|i| BagMessage {
            topic: if i % 4 == 3 { "/a".into() } else { "/ouster/points".into() },
            type_name: if i % 4 == 3 { "test_msgs/msg/Str".into() } else { POINTCLOUD2_TYPE.into() },
            log_time_ns: 1_000_000_000 + i * 100_000_000,
            data: (0..50_000).map(|k| if k % 3 == 0 { rng.random() } else { (k % 251) as u8 }).collect(),
        })
        .collect();
    for compress in [false, true] {
        // One chunk for all: a cut anywhere in it used to lose every message and the topics.
        let full = dir.join(format!("one_chunk_{compress}.mcap"));
        let opts = WriterOptions { compress, chunk_size: 1 << 20, ..Default::default() };
        write_messages(McapBagWriter::create_file_with(&full, opts).unwrap(), &msgs);
        let bytes = std::fs::read(&full).unwrap();
        let cut = dir.join("cut.mcap");
        let (chunk, chunk_len) = largest_chunk(&bytes).expect("a chunk");
        let mut best = 0;
        for frac in [0.3, 0.5, 0.7, 0.9] {
            let len = chunk + (chunk_len as f64 * frac) as usize;
            std::fs::write(&cut, &bytes[..len]).unwrap();
            let reader = bag::open(&cut).unwrap();
            let (got, _, end) = read_with_damage(&cut);
            // A zstd stream decodes in blocks of up to 128 KB: a cut in the first block loses it.
            if !compress || !got.is_empty() {
                assert!(reader.topic(&msgs[0].topic).is_some(), "cut at {len}: topics lost: {:?}", reader.topics());
            }
            assert_eq!(got[..], msgs[..got.len()], "cut at {len}: not the written prefix");
            let end = end.unwrap_or_else(|| panic!("cut at {len}: no error"));
            assert!(end.to_string().contains("inside the chunk"), "{end}");
            best = best.max(got.len());
        }
        assert!(best >= 4, "compress={compress}: at most {best} of 8 messages recovered from a cut chunk");

        // A chunk opcode byte flipped (0x06 -> 0x66): read as a chunk, and said.
        let many = dir.join(format!("chunks_{compress}.mcap"));
        let opts = WriterOptions { compress, chunk_size: 3000, ..Default::default() };
        write_messages(McapBagWriter::create_file_with(&many, opts).unwrap(), &msgs);
        let mut b = std::fs::read(&many).unwrap();
        let (at, _) = largest_chunk(&b).expect("a chunk");
        b[at] = 0x66;
        std::fs::write(&cut, &b).unwrap();
        let (got, skipped, end) = read_with_damage(&cut);
        assert_eq!(got, msgs, "compress={compress}");
        assert!(end.is_none(), "{end:?}");
        assert!(skipped.iter().any(|s| s.contains("0x66") && s.contains("read as one")), "{skipped:?}");
        // The same record with its body damaged too: skipped, said, the others read.
        b[at + 9 + 30] ^= 0xff;
        std::fs::write(&cut, &b).unwrap();
        let (got, skipped, _) = read_with_damage(&cut);
        assert!(got.len() < msgs.len() && !got.is_empty(), "{} of {}", got.len(), msgs.len());
        assert!(skipped.iter().any(|s| s.contains("0x66")), "{skipped:?}");
    }
}

/// Offset and length of the largest chunk record (opcode 0x06): one that holds messages.
fn largest_chunk(b: &[u8]) -> Option<(usize, usize)> {
    let (mut at, mut best) = (8, None::<(usize, usize)>);
    while at + 9 <= b.len() {
        let len = 9 + u64::from_le_bytes(b[at + 1..at + 9].try_into().unwrap()) as usize;
        if b[at] == 0x06 && best.is_none_or(|(_, l)| len > l) {
            best = Some((at, len));
        }
        at += len;
    }
    best
}
