//! The fixed benchmark workloads: the arrays `shared/bench/workloads.py --dump DIR` writes, each
//! `DIR/NAME.bin` (raw little-endian) described by `DIR/manifest.json` (dtype and shape).

use super::VerifyError;
use std::collections::HashMap;
use std::path::Path;

/// An array's entry in manifest.json (its `sha` is not needed here).
#[derive(serde::Deserialize)]
struct ManifestArray {
    dtype: String,
    shape: Vec<usize>,
}

/// The bytes of array `name`, checked against manifest.json: its dtype must be `dtype` (of
/// `elem` bytes), its last dimension `width` (a 1-D array has width 1), and the file must hold
/// exactly the elements of its shape. Returns the bytes and the number of rows.
fn read_array(dir: &Path, name: &str, dtype: &str, elem: usize, width: usize) -> Result<(Vec<u8>, usize), VerifyError> {
    let manifest = dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).map_err(|e| VerifyError::workload(&manifest, e))?;
    // JSON is YAML: serde_yaml reads the manifest, no JSON crate for one file.
    let arrays: HashMap<String, ManifestArray> =
        serde_yaml::from_str(&text).map_err(|e| VerifyError::workload(&manifest, e))?;
    let array = arrays.get(name).ok_or_else(|| VerifyError::workload(&manifest, format!("no array {name}")))?;
    let shape = &array.shape;
    if array.dtype != dtype {
        return Err(VerifyError::workload(&manifest, format!("{name} is {}, expected {dtype}", array.dtype)));
    }
    let last = if shape.len() > 1 { shape[shape.len() - 1] } else { 1 };
    if shape.is_empty() || last != width {
        return Err(VerifyError::workload(&manifest, format!("{name} has shape {shape:?}, expected rows of {width}")));
    }
    let bin = dir.join(format!("{name}.bin"));
    let bytes = std::fs::read(&bin).map_err(|e| VerifyError::workload(&bin, e))?;
    let elements: usize = shape.iter().product();
    if bytes.len() != elements * elem {
        return Err(VerifyError::workload(
            &bin,
            format!(
                "{} bytes, but manifest.json gives {name} the shape {shape:?} of {dtype} ({} bytes)",
                bytes.len(),
                elements * elem
            ),
        ));
    }
    Ok((bytes, elements / width))
}

/// A float32 array as rows of `width` values, row-major; returns the values and the row count.
pub(crate) fn workload_f32(dir: &Path, name: &str, width: usize) -> Result<(Vec<f32>, usize), VerifyError> {
    let (bytes, rows) = read_array(dir, name, "float32", 4, width)?;
    Ok((bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect(), rows))
}

/// An int64 index array (`w3b_queries_idx`, ...) as indices.
pub(crate) fn workload_indices(dir: &Path, name: &str) -> Result<Vec<usize>, VerifyError> {
    let (bytes, _rows) = read_array(dir, name, "int64", 8, 1)?;
    bytes
        .chunks_exact(8)
        .map(|b| {
            let i = i64::from_le_bytes(b.try_into().expect("8 bytes"));
            usize::try_from(i)
                .map_err(|_| VerifyError::workload(&dir.join(format!("{name}.bin")), format!("index {i}")))
        })
        .collect()
}

/// An `[..., 3]` float32 array as x, y, z columns.
pub(crate) fn workload_xyz(dir: &Path, name: &str) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>), VerifyError> {
    let (v, _rows) = workload_f32(dir, name, 3)?;
    let column = |k: usize| v.iter().skip(k).step_by(3).copied().collect::<Vec<f32>>();
    Ok((column(0), column(1), column(2)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A workloads directory as workloads.py writes it (json.dump, indent 1).
    fn dump(tag: &str, arrays: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("lk_workloads_{tag}_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let entries: Vec<String> = arrays
            .iter()
            .map(|(name, dtype, shape, bytes)| {
                std::fs::write(dir.join(format!("{name}.bin")), bytes).unwrap();
                let dims: Vec<String> = shape.iter().map(|d| format!("   {d}")).collect();
                format!(
                    " \"{name}\": {{\n  \"dtype\": \"{dtype}\",\n  \"shape\": [\n{}\n  ],\n  \"sha\": \"0123456789abcdef\"\n }}",
                    dims.join(",\n")
                )
            })
            .collect();
        std::fs::write(dir.join("manifest.json"), format!("{{\n{}\n}}", entries.join(",\n"))).unwrap();
        dir
    }

    #[test]
    fn arrays_read_back_with_their_manifest_shapes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(20261206);
        let xyz: Vec<f32> = (0..2 * 5 * 3).map(|_| rng.random_range(-80.0..80.0)).collect();
        let idx: Vec<i64> = (0..7).map(|_| rng.random_range(0..1_000_000)).collect();
        let scores: Vec<f32> = (0..9).map(|_| rng.random()).collect();
        let dir = dump(
            "ok",
            &[
                ("w_xyz", "float32", vec![2, 5, 3], xyz.iter().flat_map(|v| v.to_le_bytes()).collect()),
                ("w_idx", "int64", vec![7], idx.iter().flat_map(|v| v.to_le_bytes()).collect()),
                ("w_scores", "float32", vec![9], scores.iter().flat_map(|v| v.to_le_bytes()).collect()),
            ],
        );
        let (x, y, z) = workload_xyz(&dir, "w_xyz").unwrap();
        assert_eq!(x.len(), 10);
        for i in 0..10 {
            assert_eq!([x[i], y[i], z[i]], [xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2]]);
        }
        let got: Vec<i64> = workload_indices(&dir, "w_idx").unwrap().into_iter().map(|i| i as i64).collect();
        assert_eq!(got, idx);
        assert_eq!(workload_f32(&dir, "w_scores", 1).unwrap(), (scores, 9));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_mismatch_with_the_manifest_is_an_error_naming_it() {
        let floats = |n: usize| vec![0u8; 4 * n];
        let dir = dump(
            "bad",
            &[
                ("short", "float32", vec![4, 3], floats(11)),
                ("idx", "int64", vec![3], vec![0u8; 24]),
                ("boxes", "float32", vec![2, 7], floats(14)),
            ],
        );
        let err = |r: Result<(Vec<f32>, usize), VerifyError>| r.expect_err("an error").to_string();
        assert!(err(workload_f32(&dir, "short", 3)).contains("44 bytes"));
        assert!(err(workload_f32(&dir, "idx", 1)).contains("idx is int64, expected float32"));
        assert!(err(workload_f32(&dir, "boxes", 4)).contains("expected rows of 4"));
        assert!(err(workload_f32(&dir, "absent", 1)).contains("no array absent"));
        assert_eq!(workload_f32(&dir, "boxes", 7).unwrap().1, 2);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
