//! The bundled sample: real Ouster scans (BSD-3, data/ouster) as PointCloud2 messages in the
//! ouster-ros driver's 48-byte point layout.

use crate::cloud::Cloud;
use std::path::Path;

/// Reads an Ouster `.bin` scan (little-endian float32 `x y z reflectivity ring t`, t in seconds)
/// into a cloud with channels x, y, z, reflectivity, ring, t.
pub fn load_ouster_bin(path: &Path) -> std::io::Result<Cloud> {
    let bytes = std::fs::read(path)?;
    if bytes.len() % 24 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {} bytes is not a multiple of 24 (6 float32 per point)", path.display(), bytes.len()),
        ));
    }
    let values: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let column = |k: usize| values.iter().skip(k).step_by(6).copied().collect::<Vec<f32>>();
    Ok(Cloud::from_xyz(column(0), column(1), column(2))
        .with_channel("reflectivity", column(3))
        .with_channel("ring", column(4))
        .with_channel("t", column(5)))
}
