//! Inputs and the comparison for the gather checks of `check-gpu`: the GPU gather of a message
//! against the CPU reference bit for bit, and messages with unusual layouts.

use super::VerifyError;
use crate::cloud::{Cloud, CloudView, Datatype, Header, PointCloud2, PointField, PointLayout};
use crate::gpu::{upload_and_gather, GpuContext};
use std::borrow::Cow;

/// Compares the GPU result of `msg` with the CPU `gather` bit for bit; returns a mismatch text.
pub fn compare_with_cpu(ctx: &GpuContext, msg: &PointCloud2<'_>) -> Result<Result<String, String>, VerifyError> {
    let view = CloudView::new(msg.clone())?;
    let cpu = view.gather();
    let dev = upload_and_gather(ctx, &view)?;
    let host = dev.to_host()?;
    if host.names() != cpu.cloud.names() {
        return Ok(Err(format!("names differ: gpu {:?} cpu {:?}", host.names(), cpu.cloud.names())));
    }
    if dev.dropped_non_finite != cpu.dropped_non_finite || host.len() != cpu.cloud.len() {
        return Ok(Err(format!(
            "counts differ: gpu {} kept / {} dropped, cpu {} / {}",
            host.len(),
            dev.dropped_non_finite,
            cpu.cloud.len(),
            cpu.dropped_non_finite
        )));
    }
    for (c, (g, r)) in host.columns().iter().zip(cpu.cloud.columns()).enumerate() {
        if let Some(i) = g.iter().zip(r).position(|(a, b)| a.to_bits() != b.to_bits()) {
            return Ok(Err(format!(
                "channel '{}' differs first at point {i}: gpu {:?} (0x{:08x}) cpu {:?} (0x{:08x})",
                host.names()[c],
                g[i],
                g[i].to_bits(),
                r[i],
                r[i].to_bits()
            )));
        }
    }
    Ok(Ok(format!(
        "{} points -> {} kept, {} dropped, {} channels [{}]",
        msg.num_points(),
        host.len(),
        dev.dropped_non_finite,
        host.num_channels(),
        host.names().join(",")
    )))
}

/// An organized, big-endian, padded message with every datatype, unaligned fields, a multi-element
/// field, a `_` padding field, float64 values that need rounding or overflow float32, and NaN payloads.
pub fn exotic_message(scan: &Cloud, height: u32) -> PointCloud2<'static> {
    use Datatype::*;
    let f = |n: &str, o: u32, d: Datatype| PointField::new(n, o, d);
    let mut fields = vec![
        f("intensity", 0, Float64),
        f("x", 8, Float32),
        f("y", 12, Float64),
        f("z", 20, Float32),
        f("ring", 24, Uint16),
        f("t", 26, Int32),
        f("reflectivity", 30, Uint8),
        f("i8v", 31, Int8),
        f("i16v", 32, Int16),
        PointField { name: "normal".into(), offset: 34, datatype: Float32 as u8, count: 3 },
        f("u32v", 46, Uint32),
        f("_", 50, Float32), // a padding placeholder (PCL): never a channel
        f("u16v", 54, Uint16),
        f("f32nan", 56, Float32),
    ];
    let ring = fields.remove(4); // field order need not start with x
    fields.insert(0, ring);
    let point_step = 61u32;
    let width = (scan.len() as u32 / height).max(1);
    let n = (width * height) as usize;
    let row_step = width * point_step + 7;
    // The last row stops right after its last point (no trailing padding).
    let mut data = vec![0u8; (row_step * (height - 1) + width * point_step) as usize];
    let (xs, ys, zs) = (scan.x(), scan.y(), scan.z());
    let refl = scan.channel("reflectivity").unwrap_or(xs);
    let ring = scan.channel("ring").unwrap_or(xs);
    let t = scan.channel("t").unwrap_or(xs);
    for i in 0..n {
        let j = i % scan.len();
        let base = (i / width as usize) * row_step as usize + (i % width as usize) * point_step as usize;
        let p = &mut data[base..base + point_step as usize];
        let mut put = |off: usize, b: &[u8]| p[off..off + b.len()].copy_from_slice(b);
        let intensity = match i % 313 {
            0 => f64::from_bits(0x7ff4_0000_dead_beef), // signalling NaN with payload
            1 => f64::from_bits(0xfff8_0000_0000_0001), // negative quiet NaN
            _ => refl[j] as f64 * 1.37 + 1e-12 * (i % 11) as f64,
        };
        put(0, &intensity.to_be_bytes());
        let x = if i % 997 == 5 { f32::NAN } else { xs[j] };
        put(8, &x.to_be_bytes());
        let y = match i % 1000 {
            7 => 1e39,                                 // overflows float32: inf, dropped
            8 => -1e-46,                               // underflows to -0.0
            9 => 1.5e-40,                              // float32 subnormal
            _ => ys[j] as f64 + 1e-9 * (i % 7) as f64, // needs rounding
        };
        put(12, &y.to_be_bytes());
        let z = if i % 1511 == 3 { f32::NEG_INFINITY } else { zs[j] };
        put(20, &z.to_be_bytes());
        put(24, &(ring[j] as u16).to_be_bytes());
        put(26, &(((t[j] as f64) * 1e9) as i32 - 50_000_000 + i as i32 * 977).to_be_bytes());
        put(30, &(refl[j].clamp(0.0, 255.0) as u8).to_be_bytes());
        put(31, &((ring[j] as i32 - 64) as i8).to_be_bytes());
        put(32, &((xs[j] * 1000.0) as i16).to_be_bytes());
        for k in 0..3 {
            put(34 + 4 * k, &(k as f32 + 0.5).to_be_bytes());
        }
        put(46, &(16_777_217u32.wrapping_add((i as u32).wrapping_mul(2_654_435_761) >> 4)).to_be_bytes());
        put(50, &12345.0f32.to_be_bytes());
        put(54, &((i * 37) as u16).to_be_bytes());
        let f32nan = match i % 17 {
            0 => f32::from_bits(0x7fa0_1234),
            1 => f32::from_bits(0xffc0_0001),
            _ => zs[j] * 0.5,
        };
        put(56, &f32nan.to_be_bytes());
    }
    PointCloud2 {
        header: Header::default(),
        height,
        width,
        fields,
        is_bigendian: true,
        point_step,
        row_step,
        data: Cow::Owned(data),
        is_dense: false,
    }
}

/// A packed float32 xyzi message of `copies` concatenated scans with NaN/inf sprinkled in.
pub fn big_message(scan: &Cloud, copies: usize) -> PointCloud2<'static> {
    let n = scan.len() * copies;
    let mut x = Vec::with_capacity(n);
    let mut y = Vec::with_capacity(n);
    let mut z = Vec::with_capacity(n);
    let mut inten = Vec::with_capacity(n);
    let refl = scan.channel("reflectivity").unwrap_or(scan.x());
    for i in 0..n {
        let j = i % scan.len();
        x.push(if i % 101 == 0 { f32::NAN } else { scan.x()[j] + (i / scan.len()) as f32 });
        y.push(if i % 4099 == 17 { f32::INFINITY } else { scan.y()[j] });
        z.push(scan.z()[j]);
        inten.push(refl[j]);
    }
    let cloud = Cloud::from_xyz(x, y, z).with_channel("intensity", inten);
    PointCloud2::from_cloud(Header::default(), &cloud, &PointLayout::packed_f32(&["x", "y", "z", "intensity"]))
}
