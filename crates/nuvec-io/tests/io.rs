//! Round trips of every dtype through safetensors, .npy and .npz; files written by NumPy and
//! the safetensors package (tests/data, made by make_fixtures.py); corrupt and truncated files.

use std::path::{Path, PathBuf};

use nuvec as _; // the backends
use nuvec_core::{Array, DType};

const ALL: [DType; 14] = DType::ALL;

/// A fresh directory under the system's temporary one, removed on drop.
struct Dir(PathBuf);
impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("nuvec-io-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn at(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// A [2, 3] array of `d` with distinct elements (0/1 for booleans).
fn sample(d: DType, seed: u8) -> Array {
    let n = 6 * d.size();
    let bytes: Vec<u8> = (0..n)
        .map(|i| if d == DType::Bool { (i as u8 + seed) % 2 } else { (i as u8).wrapping_mul(37).wrapping_add(seed) })
        .collect();
    let mut bytes = bytes;
    if matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::Complex64) {
        // Finite floats: clear each element's (or part's) top exponent bit.
        let part = if d == DType::Complex64 { 4 } else { d.size() };
        for c in bytes.chunks_exact_mut(part) {
            *c.last_mut().unwrap() &= 0x3f;
        }
    }
    Array::from_raw_bytes(&bytes, [2, 3], d)
}

fn same(a: &Array, b: &Array) {
    assert_eq!(a.dtype(), b.dtype());
    assert_eq!(a.shape(), b.shape());
    assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap(), "{:?}", a.dtype());
}

#[test]
fn safetensors_round_trips_every_dtype() {
    let dir = Dir::new("st");
    let arrays: Vec<(String, Array)> =
        ALL.iter().enumerate().map(|(i, &d)| (format!("t.{d:?}"), sample(d, i as u8))).collect();
    let refs: Vec<(&str, &Array)> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
    let meta = [("who".to_string(), "nuvec".to_string())].into_iter().collect();
    let path = dir.at("all.safetensors");
    nuvec_io::save_safetensors(&path, &refs, Some(meta)).unwrap();
    let file = nuvec_io::SafetensorsFile::open(&path).unwrap();
    assert_eq!(file.metadata().unwrap()["who"], "nuvec");
    assert_eq!(file.names().len(), ALL.len());
    for (name, a) in &arrays {
        assert_eq!(file.info(name).unwrap(), (vec![2, 3], a.dtype()));
        same(&file.get(name).unwrap(), a);
    }
    let all = nuvec_io::load(&path).unwrap();
    assert_eq!(all.len(), ALL.len());
    // A strided view is written as its elements in row-major order.
    let t = sample(DType::F32, 3).transpose(&[1, 0]);
    nuvec_io::save_safetensors(&path, &[("t", &t)], None).unwrap();
    same(&nuvec_io::load_safetensors(&path).unwrap()["t"], &t);
}

#[test]
fn safetensors_parts_are_the_slices_of_the_whole() {
    let dir = Dir::new("parts");
    let path = dir.at("parts.safetensors");
    let x = Array::from_slice(&(0..48).map(|i| i as f32).collect::<Vec<_>>(), [2, 4, 6]);
    let b = x.astype(DType::BF16);
    nuvec_io::save_safetensors(&path, &[("x", &x), ("b", &b)], None).unwrap();
    let file = nuvec_io::SafetensorsFile::open(&path).unwrap();
    for (name, a) in [("x", &x), ("b", &b)] {
        for (axis, parts) in [(0, 2), (1, 4), (1, 2), (2, 3), (2, 1)] {
            for index in 0..parts {
                let len = a.shape()[axis] / parts as i32;
                let (mut lo, mut hi) = (vec![0; 3], a.shape().to_vec());
                (lo[axis], hi[axis]) = (index as i32 * len, (index as i32 + 1) * len);
                let want = a.slice(&lo, &hi, &[1, 1, 1]);
                same(&file.get_part(name, axis, parts, index).unwrap(), &want);
            }
        }
    }
    for (axis, parts, index, why) in
        [(3, 2, 0, "axis 3 of a 3-dimensional"), (2, 4, 0, "does not split"), (0, 2, 2, "part 2 of 2")]
    {
        let e = file.get_part("x", axis, parts, index).unwrap_err().to_string();
        assert!(e.contains(why) && e.contains("'x'"), "{e}");
    }
}

#[test]
fn npy_and_npz_round_trip_every_numpy_dtype() {
    let dir = Dir::new("npy");
    let arrays: Vec<(String, Array)> = ALL
        .iter()
        .filter(|&&d| d != DType::BF16)
        .enumerate()
        .map(|(i, &d)| (format!("{d:?}"), sample(d, i as u8)))
        .collect();
    for (name, a) in &arrays {
        let path = dir.at(&format!("{name}.npy"));
        nuvec_io::save_npy(&path, a).unwrap();
        same(&nuvec_io::load_npy(&path).unwrap(), a);
    }
    let refs: Vec<(&str, &Array)> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
    for compressed in [false, true] {
        let path = dir.at("all.npz");
        nuvec_io::save_npz(&path, &refs, compressed).unwrap();
        let back = nuvec_io::load_npz(&path).unwrap();
        assert_eq!(back.len(), arrays.len());
        for (name, a) in &arrays {
            same(&back[name], a);
        }
    }
    // 0-d and empty arrays.
    for a in [Array::scalar(1.5, DType::F32), Array::from_raw_bytes(&[], [0, 3], DType::I16)] {
        let path = dir.at("edge.npy");
        nuvec_io::save_npy(&path, &a).unwrap();
        same(&nuvec_io::load_npy(&path).unwrap(), &a);
    }
    // bfloat16 has no NumPy type: an error naming the array.
    let err = nuvec_io::save_npz(dir.at("bf.npz"), &[("w", &sample(DType::BF16, 0))], false).unwrap_err();
    assert!(err.to_string().contains("array 'w'") && err.to_string().contains("bfloat16"), "{err}");
}

#[test]
fn files_written_by_numpy_and_safetensors_read_back() {
    let want = |i: usize| i as f32 / 8.0 - 0.5;
    let st = nuvec_io::load(data("numpy.safetensors")).unwrap();
    assert_eq!(st["f32"].shape(), [3, 4]);
    assert_eq!(st["f32"].to_vec::<f32>().unwrap(), (0..12).map(want).collect::<Vec<_>>());
    assert_eq!(st["f16"].dtype(), DType::F16);
    assert_eq!(st["f16"].astype(DType::F32).to_vec::<f32>().unwrap(), (0..12).map(want).collect::<Vec<_>>());
    assert_eq!(st["i64"].to_vec::<i64>().unwrap(), [-3, -2, -1, 0, 1, 2]);
    assert_eq!(st["u8"].to_vec::<u8>().unwrap(), [0, 50, 100, 150, 200]);
    assert_eq!(st["bool"].to_vec::<bool>().unwrap(), [true, false, true]);
    assert_eq!(st["scalar"].shape(), [] as [i32; 0]);
    assert_eq!(st["scalar"].item::<f64>().unwrap(), 2.5);
    let file = nuvec_io::SafetensorsFile::open(data("numpy.safetensors")).unwrap();
    assert_eq!(file.metadata().unwrap()["note"], "fixture");

    let shards = nuvec_io::load(data("shards.safetensors.index.json")).unwrap();
    assert_eq!(shards.keys().collect::<Vec<_>>(), ["a.bias", "a.weight", "b.weight"]);
    assert_eq!(shards["b.weight"].shape(), [4, 3]);
    assert_eq!(shards["b.weight"].to_vec::<f32>().unwrap()[..3], [want(0), want(4), want(8)]);

    let npz = nuvec_io::load(data("numpy.npz")).unwrap();
    assert_eq!(npz["i32"].to_vec::<i32>().unwrap(), [-4, -3, -2, -1, 0, 1, 2, 3]);
    assert_eq!(npz["big"].to_vec::<i32>().unwrap(), [0, 1, 2, 3, 4, 5]);
    assert_eq!(npz["fortran"].shape(), [3, 4]);
    assert_eq!(npz["fortran"].to_vec::<f64>().unwrap(), (0..12).map(|i| want(i) as f64).collect::<Vec<_>>());
    assert_eq!(npz["c64"].dtype(), DType::Complex64);
    let c = npz["c64"].to_vec::<nuvec_core::Complex64>().unwrap();
    assert_eq!(c.iter().map(|z| z.re).collect::<Vec<_>>(), (0..4).map(want).collect::<Vec<_>>());
    assert_eq!(c.iter().map(|z| z.im).collect::<Vec<_>>(), (4..8).map(want).collect::<Vec<_>>());
    assert_eq!(npz["empty"].shape(), [0, 3]);
    let f = nuvec_io::load_npy(data("fortran.npy")).unwrap();
    assert_eq!(f.shape(), [2, 3, 4]);
    assert_eq!(f.to_vec::<i16>().unwrap(), (0..24).collect::<Vec<i16>>());
}

#[test]
fn corrupt_and_truncated_files_are_errors_naming_the_file() {
    let dir = Dir::new("bad");
    let good = std::fs::read(data("numpy.safetensors")).unwrap();
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("cut.safetensors", good[..good.len() - 10].to_vec(), "not a whole safetensors file"),
        ("short.safetensors", good[..5].to_vec(), ""),
        ("header.safetensors", [&good[..8], &b"{not json"[..], &good[17..]].concat(), ""),
        ("empty.safetensors", Vec::new(), ""),
    ];
    for (name, bytes, says) in cases {
        let path = dir.at(name);
        std::fs::write(&path, bytes).unwrap();
        let err = nuvec_io::load_safetensors(&path).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains(says), "{err}");
    }
    let file = nuvec_io::SafetensorsFile::open(data("numpy.safetensors")).unwrap();
    let err = file.get("missing").unwrap_err().to_string();
    assert!(err.contains("tensor 'missing'") && err.contains("numpy.safetensors"), "{err}");

    let npy = std::fs::read(data("fortran.npy")).unwrap();
    for (name, bytes) in [("cut.npy", npy[..npy.len() - 4].to_vec()), ("magic.npy", b"NUMPY and more".to_vec())] {
        let path = dir.at(name);
        std::fs::write(&path, bytes).unwrap();
        let err = nuvec_io::load_npy(&path).unwrap_err().to_string();
        assert!(err.contains(name), "{err}");
    }
    let npz = std::fs::read(data("numpy.npz")).unwrap();
    let path = dir.at("cut.npz");
    std::fs::write(&path, &npz[..npz.len() / 2]).unwrap();
    assert!(nuvec_io::load_npz(&path).unwrap_err().to_string().contains("cut.npz"));
    assert!(nuvec_io::load(dir.at("x.bin")).is_err());
    assert!(nuvec_io::load_npy(dir.at("absent.npy")).unwrap_err().to_string().contains("absent.npy"));
}

/// NumPy and the safetensors package read what nuvec writes: every dtype they have, bit for
/// bit. Needs `NUVEC_IO_PYTHONPATH`, a directory holding `numpy` and `safetensors` (`.ci/run`
/// installs them); without it the test says SKIPPED.
#[test]
fn numpy_and_safetensors_read_what_nuvec_writes() {
    let Some(pythonpath) = std::env::var_os("NUVEC_IO_PYTHONPATH") else {
        eprintln!("SKIPPED numpy_and_safetensors_read_what_nuvec_writes: NUVEC_IO_PYTHONPATH is not set");
        return;
    };
    let dir = Dir::new("py");
    let arrays: Vec<(String, Array)> =
        ALL.iter().filter(|&&d| d != DType::BF16).map(|&d| (format!("{d:?}"), sample(d, 7))).collect();
    let refs: Vec<(&str, &Array)> = arrays.iter().map(|(n, a)| (n.as_str(), a)).collect();
    nuvec_io::save_safetensors(dir.at("all.safetensors"), &refs, None).unwrap();
    nuvec_io::save_npz(dir.at("all.npz"), &refs, true).unwrap();
    nuvec_io::save_npy(dir.at("one.npy"), &arrays[3].1).unwrap();
    // Each file's arrays as `name shape hex-bytes` lines, sorted.
    let script = r#"
import sys, numpy as np
from safetensors.numpy import load_file
d = sys.argv[1]
def show(tag, m):
    for k in sorted(m):
        a = np.ascontiguousarray(m[k])
        print(tag, k, "x".join(map(str, a.shape)), a.astype(a.dtype.newbyteorder("<")).tobytes().hex())
show("st", load_file(d + "/all.safetensors"))
show("npz", dict(np.load(d + "/all.npz")))
show("npy", {"one": np.load(d + "/one.npy")})
"#;
    let out = std::process::Command::new("python3")
        .env("PYTHONPATH", pythonpath)
        .arg("-c")
        .arg(script)
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let hex = |a: &Array| a.to_bytes().unwrap().iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mut want: Vec<String> = Vec::new();
    for tag in ["st", "npz"] {
        let mut sorted: Vec<&(String, Array)> = arrays.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        want.extend(sorted.iter().map(|(n, a)| format!("{tag} {n} 2x3 {}", hex(a))));
    }
    want.push(format!("npy one 2x3 {}", hex(&arrays[3].1)));
    assert_eq!(text.lines().collect::<Vec<_>>(), want);
}
