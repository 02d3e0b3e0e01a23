//! A tiny random Llama written as a GGUF file with every ggml block type llama.cpp's
//! quantizations use (Q4_0 … Q8_0, Q2_K … Q6_K), loaded quantized, against the same model
//! written with float32 tensors holding the file's dequantized values (the reading the
//! nuvec-io tests check against the gguf package); Llama 3's RoPE factors read back as its
//! `llama3` scaling.

use std::path::{Path, PathBuf};

use nuvec::io::GgufFile;
use nuvec::{DType, f16};
use nuvec_lm::{LoadOptions, load_model, tokens};

const HIDDEN: usize = 256;
const FFN: usize = 512;
const VOCAB: usize = 96;

/// A GGUF metadata value this writer writes.
enum Meta {
    U32(u32),
    F32(f32),
    Str(&'static str),
}

/// A tensor to write: name, shape (outermost first), ggml type, bytes.
struct Tensor {
    name: String,
    shape: Vec<usize>,
    ty: u32,
    bytes: Vec<u8>,
}

/// Writes a version 3 GGUF file with 32-byte alignment.
fn write_gguf(path: &Path, meta: &[(&str, Meta)], tensors: &[Tensor]) {
    let mut out = Vec::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for (key, value) in meta {
        string(&mut out, key);
        match value {
            Meta::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::F32(v) => {
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                string(&mut out, s);
            }
        }
    }
    let align = |n: usize| n.div_ceil(32) * 32;
    let mut offset = 0;
    for t in tensors {
        string(&mut out, &t.name);
        out.extend((t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            out.extend((d as u64).to_le_bytes());
        }
        out.extend(t.ty.to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offset = align(offset + t.bytes.len());
    }
    out.resize(align(out.len()), 0);
    for t in tensors {
        out.extend(&t.bytes);
        out.resize(align(out.len()), 0);
    }
    std::fs::write(path, out).unwrap();
}

/// A seeded generator of bytes and small floats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn uniform(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}

/// Random blocks of ggml type `ty` for a `[rows, cols]` tensor: random bytes, with the
/// float16 scales at their offsets in each block set so that values are about ±0.05.
fn blocks(rng: &mut Rng, ty: u32, rows: usize, cols: usize) -> Vec<u8> {
    // (elements and bytes per block, offsets of float16 scales, scale magnitude)
    let (elems, size, at, scale): (usize, usize, &[usize], f32) = match ty {
        2 => (32, 18, &[0], 6e-3),
        3 => (32, 20, &[0, 2], 6e-3),
        6 => (32, 22, &[0], 3e-3),
        7 => (32, 24, &[0, 2], 3e-3),
        8 => (32, 34, &[0], 4e-4),
        10 => (256, 84, &[80, 82], 1e-3),
        11 => (256, 110, &[108], 4e-4),
        12 => (256, 144, &[0, 2], 1e-4),
        13 => (256, 176, &[0, 2], 5e-5),
        14 => (256, 210, &[208], 5e-5),
        _ => unreachable!(),
    };
    let mut out = Vec::with_capacity(rows * cols / elems * size);
    for _ in 0..rows * cols / elems {
        let mut b: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
        for &o in at {
            b[o..o + 2].copy_from_slice(&f16::from_f32(rng.uniform(scale)).to_le_bytes());
        }
        out.extend(b);
    }
    out
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("nuvec-lm-gguf-{}-{name}", std::process::id()))
}

#[test]
fn every_block_type_loads_quantized_as_its_float_reading() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let ones = |n: usize| Vec::from_iter((0..n).flat_map(|_| 1f32.to_le_bytes()));
    let norm = |name: String, n: usize| Tensor { name, shape: vec![n], ty: 0, bytes: ones(n) };
    let mut tensors = vec![];
    let quant = |rng: &mut Rng, name: String, ty: u32, rows: usize, cols: usize| Tensor {
        name,
        shape: vec![rows, cols],
        ty,
        bytes: blocks(rng, ty, rows, cols),
    };
    // Layer 0's q, k, v and gate, up are alike (joined into one product each); layer 1's
    // differ, with the 16-value scales that are requantized to 8 bits.
    let layers = [[12, 12, 12, 2, 6, 6, 8], [10, 11, 7, 13, 12, 14, 3]];
    for (i, types) in layers.iter().enumerate() {
        let shapes = [
            ("attn_q", HIDDEN, HIDDEN),
            ("attn_k", HIDDEN / 2, HIDDEN),
            ("attn_v", HIDDEN / 2, HIDDEN),
            ("attn_output", HIDDEN, HIDDEN),
            ("ffn_gate", FFN, HIDDEN),
            ("ffn_up", FFN, HIDDEN),
            ("ffn_down", HIDDEN, FFN),
        ];
        for (&ty, (name, rows, cols)) in types.iter().zip(shapes) {
            tensors.push(quant(&mut rng, format!("blk.{i}.{name}.weight"), ty, rows, cols));
        }
        tensors.push(norm(format!("blk.{i}.attn_norm.weight"), HIDDEN));
        tensors.push(norm(format!("blk.{i}.ffn_norm.weight"), HIDDEN));
    }
    tensors.push(quant(&mut rng, "token_embd.weight".into(), 12, VOCAB, HIDDEN));
    tensors.push(quant(&mut rng, "output.weight".into(), 14, VOCAB, HIDDEN));
    tensors.push(norm("output_norm.weight".into(), HIDDEN));
    // Llama 3.2's RoPE scaling as llama.cpp's converter writes it: each pair's period stretch.
    let factors: Vec<f32> = (0..32)
        .map(|i| {
            let wavelen = 2.0 * std::f32::consts::PI * 10000f32.powf(i as f32 / 32.0);
            let smooth = ((8192.0 / wavelen - 1.0) / 3.0).clamp(0.0, 1.0);
            1.0 / ((1.0 - smooth) / 32.0 + smooth)
        })
        .collect();
    let bytes = factors.iter().flat_map(|f| f.to_le_bytes()).collect();
    tensors.push(Tensor { name: "rope_freqs.weight".into(), shape: vec![32], ty: 0, bytes });
    let meta = [
        ("general.architecture", Meta::Str("llama")),
        ("llama.block_count", Meta::U32(2)),
        ("llama.embedding_length", Meta::U32(HIDDEN as u32)),
        ("llama.feed_forward_length", Meta::U32(FFN as u32)),
        ("llama.attention.head_count", Meta::U32(4)),
        ("llama.attention.head_count_kv", Meta::U32(2)),
        ("llama.vocab_size", Meta::U32(VOCAB as u32)),
        ("llama.context_length", Meta::U32(64)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("llama.rope.freq_base", Meta::F32(10000.0)),
    ];
    let (quantized, float) = (temp("quantized.gguf"), temp("float.gguf"));
    write_gguf(&quantized, &meta, &tensors);
    let file = GgufFile::open(&quantized).unwrap();
    let floats: Vec<Tensor> = tensors
        .iter()
        .map(|t| {
            let v: Vec<f32> = file.get(&t.name).unwrap().astype(DType::F32).to_vec().unwrap();
            Tensor {
                name: t.name.clone(),
                shape: t.shape.clone(),
                ty: 0,
                bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            }
        })
        .collect();
    write_gguf(&float, &meta, &floats);

    let options = LoadOptions { dtype: Some(DType::F32), quantize: None };
    let (mut q, f) = (load_model(&quantized, &options).unwrap(), load_model(&float, &options).unwrap());
    let mut scales = 0;
    q.visit_mut("", &mut |name, _| scales += name.ends_with(".scales") as usize);
    assert_eq!(scales, 2 * 7 + 2, "every projection and both embeddings stay quantized");
    let scaling = q.config().rope_scaling.clone().unwrap();
    let num = |k: &str| scaling[k].as_f64().unwrap();
    assert_eq!(scaling["rope_type"], "llama3");
    assert_eq!([num("factor"), num("low_freq_factor"), num("high_freq_factor")], [32.0, 1.0, 4.0]);

    let ids: Vec<u32> = (0..12).map(|i| (i * 37 % VOCAB) as u32).collect();
    let logits = |m: &dyn nuvec_lm::LanguageModel| -> Vec<f32> {
        let mut cache = m.new_cache();
        m.forward(&tokens(&ids), &mut cache).astype(DType::F32).to_vec().unwrap()
    };
    let (got, want) = (logits(q.as_ref()), logits(f.as_ref()));
    let top = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    // The K-quants' scale products are float16 and the 16-value scales 8-bit groups: a few
    // thousandths of the logits' range; a misplaced level or row would be of its order.
    assert!(diff <= 1e-2 * top, "largest logit difference {diff} of {top}");
    assert!(want.iter().all(|x| x.is_finite()) && top > 0.0);
    for p in [quantized, float] {
        std::fs::remove_file(p).unwrap();
    }
}
