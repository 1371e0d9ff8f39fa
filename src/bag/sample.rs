//! The bundled sample: real Ouster scans (BSD-3, data/ouster) as PointCloud2 messages in the
//! ouster-ros driver's 48-byte point layout.

use crate::bag::{BagError, McapBagWriter, METADATA_FILE};
use crate::cloud::{Cloud, Header, PointCloud2, PointLayout, POINTCLOUD2_TYPE};
use std::path::{Path, PathBuf};

/// The columns of a `.bin` scan of `stride` little-endian float32 values per point. Errors do not
/// repeat the path: every caller names it.
pub fn read_f32_columns(path: &Path, stride: usize) -> std::io::Result<Vec<Vec<f32>>> {
    let bytes = std::fs::read(path)?;
    if bytes.len() % (4 * stride) != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} bytes is not a multiple of {} ({stride} float32 per point)", bytes.len(), 4 * stride),
        ));
    }
    let values: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    Ok((0..stride).map(|k| values.iter().skip(k).step_by(stride).copied().collect()).collect())
}

/// Reads an Ouster `.bin` scan (little-endian float32 `x y z reflectivity ring t`, t in seconds)
/// into a cloud with channels x, y, z, reflectivity, ring, t.
pub fn load_ouster_bin(path: &Path) -> std::io::Result<Cloud> {
    let mut columns = read_f32_columns(path, 6)?;
    let mut column = |k: usize| std::mem::take(&mut columns[k]);
    Ok(Cloud::from_xyz(column(0), column(1), column(2))
        .with_channel("reflectivity", column(3))
        .with_channel("ring", column(4))
        .with_channel("t", column(5)))
}

/// Topic of the sample bag.
pub const SAMPLE_TOPIC: &str = "/ouster/points";
/// frame_id of the sample clouds.
pub const SAMPLE_FRAME_ID: &str = "os_sensor";
/// Name of the bag folder [`write_sample_bag`] creates.
pub const SAMPLE_BAG_NAME: &str = "ouster_sample";
/// The scans of the sample, in message order: three consecutive OS-1-128 scans, then one OS-1-32
/// Every shipped Ouster scan in `data/ouster`, by file name.
pub const OUSTER_SCANS: [&str; 6] = [
    "os1-128_scan0.bin",
    "os1-128_scan1.bin",
    "os1-128_scan2.bin",
    "os0-128_scan0.bin",
    "os2-128_scan0.bin",
    "os1-32_scan0.bin",
];
/// scan (a different sensor, so the point count changes on the last message).
pub const SAMPLE_SCANS: [&str; 4] = ["os1-128_scan0.bin", "os1-128_scan1.bin", "os1-128_scan2.bin", "os1-32_scan0.bin"];
/// Header stamp (and log time) of the first sample message; the next ones follow at 10 Hz.
pub const SAMPLE_START_NS: u64 = 1_700_000_000_000_000_000;
/// Spacing of the sample messages (10 Hz).
pub const SAMPLE_PERIOD_NS: u64 = 100_000_000;

/// Where the Ouster scans are: `$LIDAR_KERNELS_DATA_DIR/ouster` when set, else the crate's
/// `data/ouster`.
pub fn sample_data_dir() -> PathBuf {
    match std::env::var_os("LIDAR_KERNELS_DATA_DIR") {
        Some(d) => PathBuf::from(d).join("ouster"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/ouster"),
    }
}

/// An Ouster scan as a PointCloud2 in the ouster-ros 48-byte point layout
/// ([`PointLayout::ouster`]): intensity = reflectivity, t = t_seconds * 1e9 (uint32, ns),
/// reflectivity, ring, ambient 0, range = |xyz| in mm; height 1.
pub fn ouster_cloud_message(scan: &Cloud, header: Header) -> PointCloud2<'static> {
    let reflectivity = scan.channel("reflectivity").expect("Ouster scan has reflectivity").to_vec();
    let ring = scan.channel("ring").expect("Ouster scan has ring").to_vec();
    let cloud = Cloud::from_xyz(scan.x().to_vec(), scan.y().to_vec(), scan.z().to_vec())
        .with_channel("intensity", reflectivity.clone())
        .with_channel("reflectivity", reflectivity)
        .with_channel("ring", ring);
    let layout = PointLayout::ouster();
    let mut msg = PointCloud2::from_cloud(header, &cloud, &layout);
    // t and range are integers beyond f32's exact range: written from f64 here, not via encode.
    let t = scan.channel("t").expect("Ouster scan has t");
    let offset = |name: &str| layout.fields.iter().find(|f| f.name == name).expect("ouster field").offset as usize;
    let (t_off, range_off, step) = (offset("t"), offset("range"), layout.point_step as usize);
    let data = msg.data.to_mut();
    for i in 0..scan.len() {
        let p = scan.point(i);
        let t_ns = (t[i] as f64 * 1e9).round().clamp(0.0, u32::MAX as f64) as u32;
        let (x, y, z) = (p[0] as f64, p[1] as f64, p[2] as f64);
        let range_mm = ((x * x + y * y + z * z).sqrt() * 1000.0).round().clamp(0.0, u32::MAX as f64) as u32;
        data[i * step + t_off..][..4].copy_from_slice(&t_ns.to_le_bytes());
        data[i * step + range_off..][..4].copy_from_slice(&range_mm.to_le_bytes());
    }
    msg
}

/// Builds the sample bag folder `dir/ouster_sample` (an MCAP bag with metadata.yaml) from
/// [`SAMPLE_SCANS`]: topic [`SAMPLE_TOPIC`], frame [`SAMPLE_FRAME_ID`], 10 Hz stamps from
/// [`SAMPLE_START_NS`], plus the scans' BSD-3 `LICENSE`. An earlier sample there is replaced.
/// Returns the bag folder.
pub fn write_sample_bag(dir: &Path) -> Result<PathBuf, BagError> {
    write_sample_bag_from(&sample_data_dir(), dir)
}

/// [`write_sample_bag`] reading the scans from `data_dir`.
pub fn write_sample_bag_from(data_dir: &Path, dir: &Path) -> Result<PathBuf, BagError> {
    // Every scan is read before anything is written, so a missing scan leaves no half-written bag
    // (an MCAP file without messages or metadata.yaml that would replay as zero frames).
    let scans = SAMPLE_SCANS
        .iter()
        .map(|name| {
            let path = data_dir.join(name);
            load_ouster_bin(&path).map_err(|e| BagError::io(&path, e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bag = dir.join(SAMPLE_BAG_NAME);
    if bag.exists() {
        for name in [METADATA_FILE.to_string(), format!("{SAMPLE_BAG_NAME}_0.mcap"), "LICENSE".to_string()] {
            let p = bag.join(name);
            if p.exists() {
                std::fs::remove_file(&p).map_err(|e| BagError::io(&p, e))?;
            }
        }
    }
    let mut writer = McapBagWriter::create_folder(&bag)?;
    let topic = writer.add_topic(SAMPLE_TOPIC, POINTCLOUD2_TYPE)?;
    for (i, scan) in scans.iter().enumerate() {
        let stamp = SAMPLE_START_NS + i as u64 * SAMPLE_PERIOD_NS;
        let header = Header {
            stamp_sec: (stamp / 1_000_000_000) as i32,
            stamp_nanosec: (stamp % 1_000_000_000) as u32,
            frame_id: SAMPLE_FRAME_ID.to_string(),
        };
        let msg = ouster_cloud_message(scan, header);
        writer.write(topic, stamp, &msg.to_cdr())?;
    }
    let bag = writer.finish()?;
    let license_src = data_dir.join("LICENSE");
    let license_dst = bag.join("LICENSE");
    std::fs::copy(&license_src, &license_dst).map_err(|e| BagError::io(&license_src, e))?;
    Ok(bag)
}
