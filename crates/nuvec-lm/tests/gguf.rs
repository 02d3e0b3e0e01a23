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
    Str(String),
    Bools(Vec<bool>),
}

/// A tensor to write: name, shape (outermost first), ggml type, bytes.
struct Tensor {
    name: String,
    shape: Vec<usize>,
    ty: u32,
    bytes: Vec<u8>,
}

/// Writes a version 3 GGUF file with 32-byte alignment.
fn write_gguf(path: &Path, meta: &[(String, Meta)], tensors: &[Tensor]) {
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
            Meta::Bools(b) => {
                out.extend(9u32.to_le_bytes());
                out.extend(7u32.to_le_bytes());
                out.extend((b.len() as u64).to_le_bytes());
                out.extend(b.iter().map(|&v| v as u8));
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
        ("general.architecture", Meta::Str("llama".into())),
        ("llama.block_count", Meta::U32(2)),
        ("llama.embedding_length", Meta::U32(HIDDEN as u32)),
        ("llama.feed_forward_length", Meta::U32(FFN as u32)),
        ("llama.attention.head_count", Meta::U32(4)),
        ("llama.attention.head_count_kv", Meta::U32(2)),
        ("llama.vocab_size", Meta::U32(VOCAB as u32)),
        ("llama.context_length", Meta::U32(64)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("llama.rope.freq_base", Meta::F32(10000.0)),
    ]
    .map(|(k, v)| (k.to_string(), v));
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

    let options = LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() };
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

/// llama.cpp's name of a Hugging Face tensor (its converter's table for these families).
fn gguf_name(hf: &str, gemma: bool) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, name) = rest.split_once('.').unwrap();
    let (module, param) = name.rsplit_once('.').unwrap();
    let g = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" if gemma => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "mlp.gate" => "ffn_gate_inp",
        m => panic!("no GGUF name for {m}"),
    };
    format!("blk.{layer}.{g}.{param}")
}

/// llama.cpp's converter's row order of a Q or K projection: each head's two halves
/// interleaved.
fn permute(w: &nuvec::Array, heads: i32) -> nuvec::Array {
    let s = w.shape().to_vec();
    w.reshape(vec![heads, 2, s[0] / heads / 2, s[1]]).transpose(&[0, 2, 1, 3]).reshape(s)
}

fn f32_tensor(name: String, a: &nuvec::Array) -> Tensor {
    let v: Vec<f32> = a.astype(DType::F32).to_vec().unwrap();
    let shape = a.shape().iter().map(|&d| d as usize).collect();
    Tensor { name, shape, ty: 0, bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect() }
}

/// The tiny Hugging Face models of tests/fixtures/tiny written as llama.cpp's converter
/// writes them (names, Q/K row order, stacked experts, Gemma's norms as `1 + weight`,
/// metadata keys) load from the GGUF file to transformers' logits.
#[test]
fn hugging_face_models_converted_as_llama_cpp_does_load_from_gguf() {
    use serde_json::Value;
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny");
    let mut failed = vec![];
    for name in ["llama", "llama_linear", "llama_yarn", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma3"] {
        let dir = tiny.join(name);
        let read = |f: &str| -> Value { serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap() };
        let (c, e) = (read("config.json"), read("expected.json"));
        let gemma = name == "gemma3";
        let arch = match c["model_type"].as_str().unwrap() {
            "mistral" => "llama",
            "qwen3_moe" => "qwen3moe",
            "gemma3_text" => "gemma3",
            a => a,
        };
        let int = |k: &str| c[k].as_i64().map(|v| v as i32);
        let (heads, kv) = (int("num_attention_heads").unwrap(), int("num_key_value_heads").unwrap());
        let rope = &c["rope_parameters"];
        let full = if gemma { &rope["full_attention"] } else { rope };
        let mut meta: Vec<(String, Meta)> = vec![("general.architecture".into(), Meta::Str(arch.into()))];
        let mut key = |k: &str, v: Meta| meta.push((format!("{arch}.{k}"), v));
        for (k, hf) in [
            ("context_length", "max_position_embeddings"),
            ("embedding_length", "hidden_size"),
            ("block_count", "num_hidden_layers"),
            ("feed_forward_length", "intermediate_size"),
            ("attention.head_count", "num_attention_heads"),
            ("attention.head_count_kv", "num_key_value_heads"),
            ("attention.key_length", "head_dim"),
            ("attention.value_length", "head_dim"),
            ("vocab_size", "vocab_size"),
            ("expert_count", "num_local_experts"),
            ("expert_used_count", "num_experts_per_tok"),
            ("expert_feed_forward_length", "moe_intermediate_size"),
            ("attention.sliding_window", "sliding_window"),
        ] {
            if let Some(v) = int(hf) {
                key(k, Meta::U32(v as u32));
            }
        }
        key("attention.layer_norm_rms_epsilon", Meta::F32(c["rms_norm_eps"].as_f64().unwrap() as f32));
        key("rope.freq_base", Meta::F32(full["rope_theta"].as_f64().unwrap() as f32));
        match full["rope_type"].as_str().unwrap() {
            "linear" | "yarn" => {
                key("rope.scaling.type", Meta::Str(full["rope_type"].as_str().unwrap().into()));
                key("rope.scaling.factor", Meta::F32(full["factor"].as_f64().unwrap() as f32));
                if let Some(n) = full["original_max_position_embeddings"].as_f64() {
                    key("rope.scaling.original_context_length", Meta::U32(n as u32));
                }
            }
            _ => {}
        }
        if gemma {
            key("rope.freq_base_swa", Meta::F32(rope["sliding_attention"]["rope_theta"].as_f64().unwrap() as f32));
            key("final_logit_softcapping", Meta::F32(c["final_logit_softcapping"].as_f64().unwrap() as f32));
            // This tiny model's layer kinds and attention scale are not Gemma 3's usual ones,
            // which llama.cpp assumes: the keys its loader reads for them.
            let types = c["layer_types"].as_array().unwrap();
            key(
                "attention.sliding_window_pattern",
                Meta::Bools(types.iter().map(|t| t == "sliding_attention").collect()),
            );
            key("attention.scale", Meta::F32(1.0 / (c["query_pre_attn_scalar"].as_f64().unwrap() as f32).sqrt()));
        }

        let weights = nuvec::io::load(dir.join("model.safetensors")).unwrap();
        let mut tensors = vec![];
        let mut experts: std::collections::BTreeMap<String, Vec<(i32, nuvec::Array)>> = Default::default();
        for (hf, w) in &weights {
            if let Some((prefix, rest)) = hf.split_once(".mlp.experts.") {
                let (e, proj) = rest.split_once('.').unwrap();
                let proj = proj.trim_end_matches("_proj.weight");
                let layer = prefix.trim_start_matches("model.layers.");
                experts
                    .entry(format!("blk.{layer}.ffn_{proj}_exps.weight"))
                    .or_default()
                    .push((e.parse().unwrap(), w.clone()));
                continue;
            }
            let mut w = w.clone();
            if arch == "llama" && hf.ends_with("q_proj.weight") {
                w = permute(&w, heads);
            } else if arch == "llama" && hf.ends_with("k_proj.weight") {
                w = permute(&w, kv);
            }
            if gemma && hf.ends_with("norm.weight") {
                w = w.astype(DType::F32) + 1.0;
            }
            tensors.push(f32_tensor(gguf_name(hf, gemma), &w));
        }
        if full["rope_type"] == "llama3" {
            // The converter's rope_freqs.weight: each pair's period stretch.
            let num = |k: &str| full[k].as_f64().unwrap() as f32;
            let (factor, low, high, old) = (
                num("factor"),
                num("low_freq_factor"),
                num("high_freq_factor"),
                num("original_max_position_embeddings"),
            );
            let dim = int("head_dim").unwrap();
            let f: Vec<f32> = (0..dim / 2)
                .map(|i| {
                    let wavelen = 2.0 * std::f32::consts::PI * num("rope_theta").powf(2.0 * i as f32 / dim as f32);
                    if wavelen < old / high {
                        1.0
                    } else if wavelen > old / low {
                        factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        1.0 / ((1.0 - smooth) / factor + smooth)
                    }
                })
                .collect();
            tensors.push(f32_tensor("rope_freqs.weight".into(), &nuvec::Array::from_slice(&f, [dim / 2])));
        }
        for (gname, mut list) in experts {
            list.sort_by_key(|(e, _)| *e);
            let stacked = nuvec::ops::stack(&list.into_iter().map(|(_, w)| w).collect::<Vec<_>>(), 0);
            tensors.push(f32_tensor(gname, &stacked));
        }
        let path = temp(&format!("{name}.gguf"));
        write_gguf(&path, &meta, &tensors);
        let m = load_model(&path, &LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() })
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        std::fs::remove_file(&path).unwrap();

        let ids: Vec<u32> = e["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let want: Vec<f32> = e["logits"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r.as_array().unwrap().iter())
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let mut cache = m.new_cache();
        let got: Vec<f32> = m.forward(&tokens(&ids), &mut cache).astype(DType::F32).to_vec().unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        let top = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        if diff > 1e-4 * top {
            failed.push(format!("{name}: largest logit difference {diff} of {top}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
