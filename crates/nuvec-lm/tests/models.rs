//! Random-weight tiny models of each architecture, made and saved by Hugging Face
//! transformers (scripts/lm-fixtures.py), against the logits and greedy tokens transformers
//! recorded; caches and bad input.

use std::path::{Path, PathBuf};

use nuvec::{Array, DType};
use nuvec_lm::generate::Draft;
use nuvec_lm::{
    GenerateOptions, KvCache, LanguageModel, LoadOptions, PromptCache, Tokenizer, generate, last_logits, load,
    load_model, tokens,
};
use serde_json::Value;

const ARCHS: [&str; 9] =
    ["llama", "llama_linear", "llama_yarn", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "gemma3"];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny").join(name)
}

fn expected(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("expected.json")).unwrap()).unwrap()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn model(name: &str) -> Box<dyn LanguageModel> {
    load_model(&fixture(name), &LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() }).unwrap()
}

/// The tokens `generate` gives (text through the word tokenizer, no EOS).
fn generated(m: &dyn LanguageModel, cache: &mut PromptCache, ids: &[u32], options: GenerateOptions) -> Vec<u32> {
    generate(m, Some(&word_tokenizer()), cache, ids, &[], options).unwrap().map(|t| t.unwrap().token).collect()
}

/// The largest difference between `a` and `b`, relative to `b`'s largest magnitude.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn logits_match_transformers() {
    for name in ARCHS {
        let e = expected(name);
        let ids = u32s(&e["ids"]);
        let want: Vec<f32> = e["logits"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r.as_array().unwrap().iter())
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let m = model(name);
        let mut cache = m.new_cache();
        let got: Vec<f32> = m.forward(&tokens(&ids), &mut cache).to_vec().unwrap();
        let d = rel_diff(&got, &want);
        assert!(d < 1e-4, "{name}: logits differ from transformers' by {d} (relative)");
    }
}

#[test]
fn prefill_whole_equals_chunks_and_token_by_token() {
    // Gemma 3's sliding layers (4 keys) hold rotating caches; Qwen3-Next's linear layers carry
    // their recurrent state from piece to piece.
    for name in ["llama", "qwen3", "qwen3_moe", "qwen3_next", "gemma3"] {
        let ids = u32s(&expected(name)["ids"]);
        let m = model(name);
        let last = |logits: Array| -> Vec<f32> { last_logits(&logits).to_vec().unwrap() };
        let mut whole = m.new_cache();
        let a = last(m.forward(&tokens(&ids), &mut whole));
        let mut chunked = m.new_cache();
        let mut b = Vec::new();
        for c in ids.chunks(5) {
            b = last(m.forward(&tokens(c), &mut chunked));
        }
        let mut single = m.new_cache();
        let mut c = Vec::new();
        for &t in &ids {
            c = last(m.forward(&tokens(&[t]), &mut single));
        }
        assert!(rel_diff(&b, &a) < 1e-5, "{name}: chunked prefill differs");
        assert!(rel_diff(&c, &a) < 1e-5, "{name}: token-by-token differs");
        assert_eq!(whole[0].offset(), ids.len() as i32);
        assert_eq!(single[1].offset(), ids.len() as i32);
    }
}

/// A multimodal Gemma 3 checkpoint (`text_config`, the language model under
/// `model.language_model.`, a vision tower beside it) loads as its language model.
#[test]
fn gemma3_multimodal_checkpoint_loads_its_language_model() {
    let dir = std::env::temp_dir().join(format!("nuvec-lm-gemma3-mm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("gemma3").join("config.json")).unwrap()).unwrap();
    let config = serde_json::json!({"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 8}});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut weights = nuvec::io::load_safetensors(fixture("gemma3").join("model.safetensors")).unwrap();
    weights = weights.into_iter().map(|(k, v)| (k.replacen("model.", "model.language_model.", 1), v)).collect();
    weights.insert("model.vision_tower.patch.weight".into(), nuvec::ops::zeros([2, 2], DType::F32));
    let list: Vec<(&str, &Array)> = weights.iter().map(|(k, v)| (k.as_str(), v)).collect();
    nuvec::io::save_safetensors(dir.join("model.safetensors"), &list, None).unwrap();
    let m = load_model(&dir, &LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() }).unwrap();
    assert_eq!(m.config().model_type, "gemma3_text");
    let ids = tokens(&u32s(&expected("gemma3")["ids"]));
    let a: Vec<f32> = m.forward(&ids, &mut m.new_cache()).to_vec().unwrap();
    let b: Vec<f32> = model("gemma3").forward(&ids, &mut model("gemma3").new_cache()).to_vec().unwrap();
    assert_eq!(a, b);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A word-level tokenizer of the tiny models' 128 ids ("t0" .. "t127").
fn word_tokenizer() -> Tokenizer {
    let vocab: serde_json::Map<String, Value> = (0..128).map(|i| (format!("t{i}"), Value::from(i))).collect();
    let spec = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    Tokenizer::from_json(&spec.to_string()).unwrap()
}

#[test]
fn greedy_generation_matches_transformers() {
    for name in ARCHS {
        let e = expected(name);
        let (ids, want) = (u32s(&e["ids"]), u32s(&e["greedy"]));
        let m = model(name);
        let mut cache = PromptCache::new(m.as_ref());
        let options = GenerateOptions { max_tokens: want.len(), ..Default::default() };
        let got: Vec<u32> = generated(m.as_ref(), &mut cache, &ids, options);
        assert_eq!(got, want, "{name}: greedy tokens differ from transformers'");
        // The cache holds the prompt and every generated token but the last.
        assert_eq!(cache.tokens.len(), ids.len() + want.len() - 1);
    }
}

#[test]
fn prompt_cache_reuses_the_shared_prefix() {
    let tok = word_tokenizer();
    for name in ["llama", "qwen3_next"] {
        let m = model(name);
        let ids = u32s(&expected(name)["ids"]);
        let options = GenerateOptions { max_tokens: 4, ..Default::default() };
        let mut cache = PromptCache::new(m.as_ref());
        let first: Vec<u32> = generated(m.as_ref(), &mut cache, &ids, options.clone());
        // The next turn: the first prompt, its reply and more.
        let mut next = ids.clone();
        next.extend(&first);
        next.extend([9, 10, 11]);
        let mut g = generate(m.as_ref(), Some(&tok), &mut cache, &next, &[], options.clone()).unwrap();
        let reused: Vec<u32> = g.by_ref().map(|t| t.unwrap().token).collect();
        assert_eq!(g.stats.prompt_tokens, 3 + 1, "{name}: only the new tokens (and the reply's last) run");
        let alone = |p: &[u32]| generated(m.as_ref(), &mut PromptCache::new(m.as_ref()), p, options.clone());
        assert_eq!(reused, alone(&next), "{name}");
        // A prompt that leaves the held tokens far back: attention caches drop the rest, while
        // recurrent ones cannot go back past their last pass and start over.
        let other: Vec<u32> = ids[..5].iter().copied().chain([1, 2, 3]).collect();
        let mut g = generate(m.as_ref(), Some(&tok), &mut cache, &other, &[], options.clone()).unwrap();
        let got: Vec<u32> = g.by_ref().map(|t| t.unwrap().token).collect();
        let ran = if name == "qwen3_next" { other.len() } else { 3 };
        assert_eq!(g.stats.prompt_tokens, ran, "{name}");
        assert_eq!(got, alone(&other), "{name}: after going back");
    }
}

#[test]
fn seeded_sampling_repeats() {
    let m = model("qwen2");
    let ids = u32s(&expected("qwen2")["ids"]);
    let run = |seed| {
        let mut options = GenerateOptions { max_tokens: 8, ..Default::default() };
        options.sampler.temperature = 1.0;
        options.sampler.top_p = 0.9;
        options.sampler.top_k = 20;
        options.sampler.seed = Some(seed);
        let mut cache = PromptCache::new(m.as_ref());
        generated(m.as_ref(), &mut cache, &ids, options)
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8), "different seeds gave the same 8 tokens");
}

#[test]
fn bad_input_gives_clear_errors() {
    let err = |r: nuvec_lm::Result<Box<dyn LanguageModel>>| r.err().expect("an error").to_string();
    let missing = err(load_model(Path::new("/nonexistent/model"), &LoadOptions::default()));
    assert!(missing.contains("/nonexistent/model"), "{missing}");

    let dir = std::env::temp_dir().join(format!("nuvec-lm-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture("llama").join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("llama").join("config.json")).unwrap()).unwrap();
    let write = |edit: &dyn Fn(&mut Value)| {
        let mut c = config.clone();
        edit(&mut c);
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    };
    write(&|c| c["model_type"] = "gpt9".into());
    let unknown = err(load_model(&dir, &LoadOptions::default()));
    assert!(unknown.contains("model_type 'gpt9' is not supported"), "{unknown}");
    write(&|c| c["intermediate_size"] = 80.into());
    let shape = err(load_model(&dir, &LoadOptions::default()));
    assert!(shape.contains("mlp.gate_proj.weight") && shape.contains("[80, 64], given [96, 64]"), "{shape}");
    write(&|c| c["num_attention_heads"] = 3.into());
    let heads = err(load_model(&dir, &LoadOptions::default()));
    assert!(heads.contains("not a multiple"), "{heads}");
    write(&|c| c["model_type"] = "qwen3_moe".into());
    let experts = err(load_model(&dir, &LoadOptions::default()));
    assert!(experts.contains("num_experts"), "{experts}");
    write(&|c| c["hidden_act"] = "relu2".into());
    let act = err(load_model(&dir, &LoadOptions::default()));
    assert!(act.contains("hidden_activation 'relu2'"), "{act}");
    let no_tokenizer = load(&fixture("llama"), &LoadOptions::default()).err().expect("no tokenizer.json").to_string();
    assert!(no_tokenizer.contains("tokenizer.json"), "{no_tokenizer}");
    std::fs::remove_dir_all(&dir).unwrap();

    let m = model("llama");
    let mut cache = PromptCache::new(m.as_ref());
    let tok = word_tokenizer();
    let long = vec![1u32; 300];
    let e =
        generate(m.as_ref(), Some(&tok), &mut cache, &long, &[], GenerateOptions::default()).err().unwrap().to_string();
    assert!(e.contains("300 tokens") && e.contains("context of 256"), "{e}");
    let e =
        generate(m.as_ref(), Some(&tok), &mut cache, &[], &[], GenerateOptions::default()).err().unwrap().to_string();
    assert!(e.contains("no tokens"), "{e}");
    let mut options = GenerateOptions::default();
    options.sampler.top_p = 0.0;
    let e = generate(m.as_ref(), Some(&tok), &mut cache, &[1], &[], options).err().unwrap().to_string();
    assert!(e.contains("top_p"), "{e}");
}

/// Qwen3-Next's sizes that do not fit together are errors naming them, never panics.
#[test]
fn qwen3_next_bad_configs_give_clear_errors() {
    let err = |r: nuvec_lm::Result<Box<dyn LanguageModel>>| r.err().expect("an error").to_string();
    let dir = std::env::temp_dir().join(format!("nuvec-lm-bad-next-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture("qwen3_next").join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("qwen3_next").join("config.json")).unwrap()).unwrap();
    // What is wrong, the edit that makes it so, and the words the error must have.
    type Case<'a> = (&'a str, &'a dyn Fn(&mut Value), &'a str);
    let cases: [Case; 10] = [
        ("value heads", &|c| c["linear_num_value_heads"] = 3.into(), "not a multiple of linear_num_key_heads"),
        (
            "missing",
            &|c| c.as_object_mut().unwrap().remove("linear_key_head_dim").map(drop).unwrap_or(()),
            "linear_key_head_dim is missing",
        ),
        ("zero", &|c| c["linear_value_head_dim"] = 0.into(), "linear_value_head_dim must be positive"),
        ("kernel", &|c| c["linear_conv_kernel_dim"] = 1.into(), "linear_conv_kernel_dim must be at least 2"),
        ("kind", &|c| c["layer_types"][2] = "sliding_attention".into(), "layer type 'sliding_attention'"),
        (
            "count",
            &|c| c["layer_types"] = serde_json::json!(["full_attention"]),
            "layer_types has 1 entries for 4 layers",
        ),
        ("rotary", &|c| c["rope_parameters"]["partial_rotary_factor"] = 0.1.into(), "partial_rotary_factor"),
        ("experts", &|c| c["num_experts_per_tok"] = 9.into(), "num_experts_per_tok"),
        ("activation", &|c| c["hidden_act"] = "gelu".into(), "hidden_act 'gelu'"),
        ("shape", &|c| c["linear_value_head_dim"] = 16.into(), "in_proj_qkvz.weight"),
    ];
    for (what, edit, want) in cases {
        let mut c = config.clone();
        edit(&mut c);
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
        let e = err(load_model(&dir, &LoadOptions::default()));
        assert!(e.contains(want), "{what}: {e}");
    }
    // The interval decides the layers' kinds without layer_types.
    let mut c = config.clone();
    c.as_object_mut().unwrap().remove("layer_types");
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let m = load_model(&dir, &LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() }).unwrap();
    let ids = tokens(&u32s(&expected("qwen3_next")["ids"]));
    let a: Vec<f32> = m.forward(&ids, &mut m.new_cache()).to_vec().unwrap();
    let b: Vec<f32> = model("qwen3_next").forward(&ids, &mut model("qwen3_next").new_cache()).to_vec().unwrap();
    assert_eq!(a, b);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cache_grows_past_its_step() {
    let mut c = KvCache::new();
    let k = Array::from_slice(&vec![1f32; 2 * 300 * 4], [1, 2, 300, 4]);
    let (a, _) = c.update_and_fetch(&k, &k);
    assert_eq!(a.shape(), &[1, 2, 300, 4]);
    let one = Array::from_slice(&[2f32; 8], [1, 2, 1, 4]);
    let (b, _) = c.update_and_fetch(&one, &one);
    assert_eq!(b.shape(), &[1, 2, 301, 4]);
    let v: Vec<f32> = b.to_vec().unwrap();
    assert_eq!(v[300 * 4], 2.0);
    assert_eq!(v[299 * 4], 1.0);
    assert_eq!(c.trim(5), 5);
    assert_eq!(c.offset(), 296);
}

/// Decode steps with the positions on the device (recorded as a graph on a GPU) give the
/// logits of plain steps, also across the caches' growth past a power of two; in bfloat16 the
/// GPU's paged kernel runs them.
#[test]
fn device_position_steps_equal_plain_steps() {
    let cases = [("llama", 250, DType::F32), ("llama_yarn", 9, DType::F32), ("mistral", 9, DType::F32)];
    let more = [
        ("qwen2", 9, DType::F32),
        ("qwen3", 9, DType::F32),
        ("qwen3_moe", 9, DType::F32),
        ("qwen3_next", 9, DType::F32),
        ("llama", 250, DType::BF16),
        ("qwen3", 9, DType::BF16),
        ("qwen3_next", 9, DType::BF16),
    ];
    for (name, prompt, dtype) in cases.into_iter().chain(more) {
        let m = load_model(&fixture(name), &LoadOptions { dtype: Some(dtype), quantize: None, ..Default::default() })
            .unwrap();
        let tolerance = if dtype == DType::F32 { 1e-5 } else { 3e-2 };
        let ids: Vec<u32> = (0..prompt).map(|i| (i * 37 + 5) % 128).collect();
        let (mut plain, mut at) = (m.new_cache(), m.new_cache());
        let first = last_logits(&m.forward(&tokens(&ids), &mut plain));
        let _ = m.forward(&tokens(&ids), &mut at);
        let mut graph = nuvec_lm::DecodeGraph::new(1).unwrap();
        let mut next = first.argmax_keepdims(-1).astype(DType::I32);
        for step in 0..12 {
            let f32s = |l: Array| -> Vec<f32> { last_logits(&l).astype(DType::F32).to_vec().unwrap() };
            let want = f32s(m.forward(&next, &mut plain));
            let got = f32s(graph.step(m.as_ref(), &mut at, &next).unwrap());
            let d = rel_diff(&got, &want);
            // On failure, say whether the caches' keys or the attention over them differ.
            let keys = |c: &KvCache| -> Vec<f32> {
                let k = &c.arrays()[0];
                let s = k.shape().to_vec();
                k.slice(&[0, 0, 0, 0], &[s[0], s[1], c.offset(), s[3]], &[1, 1, 1, 1])
                    .astype(DType::F32)
                    .to_vec()
                    .unwrap()
            };
            let layers: Vec<f32> = (0..plain.len())
                .filter(|&i| !plain[i].is_recurrent())
                .map(|i| rel_diff(&keys(&at[i]), &keys(&plain[i])))
                .collect();
            assert!(d < tolerance, "{name} {dtype}: step {step} differs by {d} (relative); keys by {layers:?}");
            assert_eq!(at[0].offset(), plain[0].offset());
            next = Array::from_slice(&[argmax(&want) as i32], [1, 1]);
        }
        // On a GPU the step is recorded once the caches settle.
        assert_eq!(graph.recorded(), !nuvec::default_device().is_cpu(), "{name}: recording");
    }
    // Greedy generation through the device-position steps gives the transformers tokens.
    let e = expected("qwen3");
    let (ids, want) = (u32s(&e["ids"]), u32s(&e["greedy"]));
    let m = model("qwen3");
    let options = GenerateOptions { max_tokens: want.len(), decode_graph: Some(true), ..Default::default() };
    assert_eq!(generated(m.as_ref(), &mut PromptCache::new(m.as_ref()), &ids, options), want);
}

/// Paged caches (blocks of 4 positions, so the pool grows 4 → 8 → 16 blocks) give the
/// contiguous caches' logits in prefill (whole and in chunks) and in decode steps with the
/// positions on the device (recorded as a graph on a GPU), and transformers' greedy tokens.
#[test]
fn paged_cache_equals_contiguous() {
    for name in ["llama", "qwen3_moe", "gemma3"] {
        let m = model(name);
        let e = expected(name);
        let ids = u32s(&e["ids"]);
        let last = |logits: Array| -> Vec<f32> { last_logits(&logits).to_vec().unwrap() };
        let mut plain = m.new_cache();
        let want = last(m.forward(&tokens(&ids), &mut plain));
        let mut whole = PromptCache::paged(m.as_ref(), 4).layers;
        assert!(rel_diff(&last(m.forward(&tokens(&ids), &mut whole)), &want) < 1e-5, "{name}: paged prefill");
        let mut paged = PromptCache::paged(m.as_ref(), 4).layers;
        let mut got = Vec::new();
        for c in ids.chunks(5) {
            got = last(m.forward(&tokens(c), &mut paged));
        }
        assert!(rel_diff(&got, &want) < 1e-5, "{name}: paged prefill in chunks");
        let mut graph = nuvec_lm::DecodeGraph::new(1).unwrap();
        let mut next = Array::from_slice(&[argmax(&want) as i32], [1, 1]);
        for step in 0..14 {
            let want = last(m.forward(&next, &mut plain));
            let got = last(graph.step(m.as_ref(), &mut paged, &next).unwrap());
            assert!(rel_diff(&got, &want) < 1e-5, "{name}: paged step {step} differs");
            next = Array::from_slice(&[argmax(&want) as i32], [1, 1]);
        }
        assert_eq!(paged[0].offset(), ids.len() as i32 + 14);
        assert_eq!(paged[0].arrays()[0].shape()[0], 8, "{name}: 26 positions in blocks of 4 take a pool of 8");
        assert_eq!(graph.recorded(), !nuvec::default_device().is_cpu(), "{name}: recording over paged caches");
        // Greedy generation through paged caches gives transformers' tokens.
        let want = u32s(&e["greedy"]);
        let options = GenerateOptions { max_tokens: want.len(), ..Default::default() };
        assert_eq!(generated(m.as_ref(), &mut PromptCache::paged(m.as_ref(), 4), &ids, options), want, "{name}");
    }
}

/// Several prompts of different lengths decoded together give each the tokens it gets alone.
#[test]
fn batched_generation_equals_one_by_one() {
    for name in ["llama", "qwen3", "qwen3_moe", "qwen3_next", "gemma3"] {
        let m = model(name);
        let base = u32s(&expected(name)["ids"]);
        let prompts: Vec<Vec<u32>> =
            vec![base.clone(), base[..3].to_vec(), (0..40).map(|i| (i * 11 + 3) % 128).collect()];
        let options = GenerateOptions { max_tokens: 10, ..Default::default() };
        let batch = nuvec_lm::generate_batch(m.as_ref(), Some(&word_tokenizer()), &prompts, &[], &options).unwrap();
        for (p, got) in prompts.iter().zip(&batch) {
            let alone = generated(m.as_ref(), &mut PromptCache::new(m.as_ref()), p, options.clone());
            assert_eq!(got.tokens, alone, "{name}: a batched sequence differs from decoding it alone");
            assert_eq!(got.text, word_tokenizer().decode(&alone).unwrap());
        }
        // An end-of-sequence token ends its row only.
        let stop = batch[1].tokens[2];
        let end = batch[1].tokens.iter().position(|&t| t == stop).unwrap();
        let ended = nuvec_lm::generate_batch(m.as_ref(), None, &prompts, &[stop], &options).unwrap();
        assert_eq!(ended[1].tokens, batch[1].tokens[..=end].to_vec());
        assert_eq!(ended[1].finish, nuvec_lm::FinishReason::Stop);
        let tok = word_tokenizer();
        let ended = nuvec_lm::generate_batch(m.as_ref(), Some(&tok), &prompts, &[stop], &options).unwrap();
        assert_eq!(ended[1].text, tok.decode(&batch[1].tokens[..end]).unwrap(), "the EOS token stays out of the text");
    }
    let m = model("llama");
    let err = nuvec_lm::generate_batch(m.as_ref(), None, &[vec![1], vec![]], &[], &GenerateOptions::default());
    assert!(err.unwrap_err().to_string().contains("every prompt"));
}

/// A quantized cache (8 and 4 bits) gives the logits of the contiguous one within its
/// precision, in prefill and decoding, and trims as it does.
#[test]
fn quantized_cache_equals_contiguous_within_precision() {
    // The tiny fixtures' heads of 16 are below the smallest group: a random model of heads of 64.
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("llama").join("config.json")).unwrap()).unwrap();
    config["hidden_size"] = Value::from(128);
    config["num_attention_heads"] = Value::from(2);
    config["num_key_value_heads"] = Value::from(1);
    config["head_dim"] = Value::from(64);
    let dir = std::env::temp_dir().join(format!("nuvec-kvq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let m = nuvec_lm::random_model(
        &path,
        &LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() },
        7,
    )
    .unwrap();
    let ids: Vec<u32> = (0..300).map(|i| (i * 13 + 1) % 128).collect();
    for (bits, tolerance) in [(8, 0.02), (4, 0.25)] {
        let mut plain = m.new_cache();
        let mut packed: Vec<KvCache> = (0..plain.len()).map(|_| KvCache::quantized(64, bits)).collect();
        let f32s = |l: Array| -> Vec<f32> { last_logits(&l).to_vec().unwrap() };
        let want = f32s(m.forward(&tokens(&ids), &mut plain));
        let got = f32s(m.forward(&tokens(&ids), &mut packed));
        let d = rel_diff(&got, &want);
        assert!(d > 0.0 && d < tolerance, "{bits} bits: prefill differs by {d}");
        for &t in &[5u32, 77, 3] {
            let d = rel_diff(&f32s(m.forward(&tokens(&[t]), &mut packed)), &f32s(m.forward(&tokens(&[t]), &mut plain)));
            assert!(d < tolerance, "{bits} bits: a decode step differs by {d}");
        }
        assert_eq!(packed[0].offset(), 303);
        assert_eq!(packed[0].trim(3), 3);
        assert_eq!(plain[0].trim(3), 3);
        let d = rel_diff(&f32s(m.forward(&tokens(&[9]), &mut packed)), &f32s(m.forward(&tokens(&[9]), &mut plain)));
        assert!(d < tolerance, "{bits} bits: after a trim, differs by {d}");
    }
    // Generation through a quantized prompt cache; a group that does not divide the heads fails.
    let mut cache = PromptCache::quantized(m.as_ref(), 64, 8);
    let options = GenerateOptions { max_tokens: 4, ..Default::default() };
    assert_eq!(generated(m.as_ref(), &mut cache, &ids[..20], options.clone()).len(), 4);
    let mut bad = PromptCache::quantized(m.as_ref(), 128, 8);
    let err = generate(m.as_ref(), None, &mut bad, &ids[..20], &[], options).unwrap().next().unwrap();
    assert!(err.unwrap_err().to_string().contains("group"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |best, (i, x)| if *x > v[best] { i } else { best })
}

#[test]
fn rotating_cache_equals_windowed_attention() {
    use nuvec::fast::{AttentionOptions, scaled_dot_product_attention as sdpa};
    let window = 6;
    let mut rot = KvCache::rotating(window, 0);
    let mut cont = KvCache::new();
    let mut key = nuvec::random::key(1);
    let mut draw = |l: i32| {
        let (next, now) = nuvec::random::split2(&key);
        key = next;
        nuvec::random::normal([1, 2, l, 8], DType::F32, 0.0, 1.0, Some(&now))
    };
    // Decode steps, a prefill chunk past the window, then decode again (wrapping the buffer).
    for (step, l) in [1, 1, 1, 5, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1].into_iter().enumerate() {
        let (q, k, v) = (draw(l), draw(l), draw(l));
        let (kr, vr) = rot.update_and_fetch(&k, &v);
        let (kc, vc) = cont.update_and_fetch(&k, &v);
        let windowed = AttentionOptions::causal().window(window);
        let ro = if l > 1 { sdpa(&q, &kr, &vr, 0.3, &windowed) } else { sdpa(&q, &kr, &vr, 0.3, &Default::default()) };
        let co = sdpa(&q, &kc, &vc, 0.3, &windowed);
        let (a, b): (Vec<f32>, Vec<f32>) = (ro.to_vec().unwrap(), co.to_vec().unwrap());
        assert!(rel_diff(&a, &b) < 1e-5, "step {step} (L = {l}): rotating differs from windowed attention");
        assert!(kr.shape()[2] < window + l, "step {step}: the rotating cache holds {} keys", kr.shape()[2]);
    }
    assert_eq!(rot.offset(), cont.offset());
    assert_eq!(rot.trim(1), 0, "a wrapped rotating cache cannot trim");
}

#[test]
fn rotating_prompt_cache_generates_within_the_window() {
    // While the window holds every position, rotating and contiguous caches agree.
    let m = model("llama");
    let ids = u32s(&expected("llama")["ids"]);
    let want = u32s(&expected("llama")["greedy"]);
    let mut cache = PromptCache::rotating(m.as_ref(), 64);
    let options = GenerateOptions { max_tokens: want.len(), ..Default::default() };
    let got: Vec<u32> = generated(m.as_ref(), &mut cache, &ids, options);
    assert_eq!(got, want);
}

#[test]
fn speculative_greedy_equals_plain_greedy() {
    let tok = word_tokenizer();
    let target = model("llama");
    let draft_model = model("qwen2");
    // A prompt that repeats itself, so that prompt lookup finds proposals too.
    let mut ids = u32s(&expected("llama")["ids"]);
    ids.extend(ids.clone());
    let options = GenerateOptions { max_tokens: 20, ..Default::default() };
    let mut plain_cache = PromptCache::new(target.as_ref());
    let plain: Vec<u32> = generated(target.as_ref(), &mut plain_cache, &ids, options.clone());
    // The model as its own draft: every proposal is accepted (the path of full agreement).
    for (name, k) in [("draft model", 3), ("draft model", 1), ("itself", 3), ("itself", 5), ("prompt lookup", 4)] {
        let draft = match name {
            "draft model" => Draft::model(draft_model.as_ref()),
            "itself" => Draft::model(target.as_ref()),
            _ => Draft::PromptLookup { ngram: 2 },
        };
        let mut cache = PromptCache::new(target.as_ref());
        let g = generate(target.as_ref(), Some(&tok), &mut cache, &ids, &[], options.clone()).unwrap();
        let got: Vec<u32> = g.speculative(draft, k).unwrap().map(|t| t.unwrap().token).collect();
        assert_eq!(got, plain, "{name}, {k} proposals per step");
        assert_eq!(cache.tokens.len() as i32, cache.layers[0].offset(), "{name}: the cache holds its tokens");
        // The last token is held too when it ran as an accepted proposal.
        let all: Vec<u32> = ids.iter().chain(&plain).copied().collect();
        assert!(all.starts_with(&cache.tokens) && cache.tokens.len() + 1 >= all.len(), "{name}");
    }
    // Refused: penalties, rotating caches.
    let mut options = GenerateOptions::default();
    options.sampler.repetition_penalty = 1.1;
    let mut cache = PromptCache::new(target.as_ref());
    let g = generate(target.as_ref(), Some(&tok), &mut cache, &ids, &[], options).unwrap();
    assert!(g.speculative(Draft::PromptLookup { ngram: 2 }, 2).err().unwrap().to_string().contains("penalties"));
    let mut rotating = PromptCache::rotating(target.as_ref(), 64);
    let g = generate(target.as_ref(), Some(&tok), &mut rotating, &ids, &[], GenerateOptions::default()).unwrap();
    assert!(g.speculative(Draft::PromptLookup { ngram: 2 }, 2).err().unwrap().to_string().contains("rotating"));
}

/// Speculative decoding over Qwen3-Next's recurrent layers: a verifying pass keeps every step's
/// state, so rejected proposals are taken back; a draft model with recurrent layers takes back
/// its single-token steps. Greedy tokens equal plain greedy decoding either way.
#[test]
fn speculative_greedy_rolls_back_recurrent_layers() {
    let tok = word_tokenizer();
    let (next, llama) = (model("qwen3_next"), model("llama"));
    let mut ids = u32s(&expected("qwen3_next")["ids"]);
    ids.extend(ids.clone());
    let options = GenerateOptions { max_tokens: 20, ..Default::default() };
    let cases: [(&dyn LanguageModel, &str, usize); 6] = [
        (next.as_ref(), "llama", 3),
        (next.as_ref(), "itself", 4),
        (next.as_ref(), "prompt lookup", 4),
        (next.as_ref(), "llama", 15),
        (llama.as_ref(), "qwen3_next", 3),
        (llama.as_ref(), "qwen3_next", 6),
    ];
    for (target, name, k) in cases {
        let plain = generated(target, &mut PromptCache::new(target), &ids, options.clone());
        let draft = match name {
            "llama" => Draft::model(llama.as_ref()),
            "itself" => Draft::model(target),
            "qwen3_next" => Draft::model(next.as_ref()),
            _ => Draft::PromptLookup { ngram: 2 },
        };
        let mut cache = PromptCache::new(target);
        let g = generate(target, Some(&tok), &mut cache, &ids, &[], options.clone()).unwrap();
        let got: Vec<u32> = g.speculative(draft, k).unwrap().map(|t| t.unwrap().token).collect();
        let target_name = &target.config().model_type;
        assert_eq!(got, plain, "{target_name} with {name} proposing {k}");
        assert!(cache.layers.iter().all(|c| c.offset() == cache.tokens.len() as i32), "{target_name}, {name}");
    }
    // A verifying pass longer than the recurrent caches keep is refused.
    let mut cache = PromptCache::new(next.as_ref());
    let g = generate(next.as_ref(), Some(&tok), &mut cache, &ids, &[], options).unwrap();
    let e = g.speculative(Draft::PromptLookup { ngram: 2 }, 16).err().unwrap().to_string();
    assert!(e.contains("at most 15 proposals"), "{e}");
}

/// A recurrent cache asked to keep steps takes back positions of its last forward pass (of at
/// most `ROLLBACK_STEPS`), or of its last passes when asked for more; past that, or when not
/// asked, `trim` takes nothing back and says so.
/// A linear-attention layer's window, and on a GPU its state, are written over the buffers
/// they held, by prompts and by decode steps alike (a recorded decode step replays over those
/// buffers), with the logits of a fresh run over the same tokens.
#[test]
fn recurrent_caches_are_updated_in_place() {
    let m = model("qwen3_next");
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 128).collect();
    // The CPU's recurrence writes a new state.
    let states = !nuvec::default_device().is_cpu();
    let buffers = |c: &[KvCache]| -> Vec<usize> {
        let arrays: Vec<Array> = c.iter().filter(|c| c.is_recurrent()).flat_map(KvCache::arrays).collect();
        nuvec::eval(&arrays).unwrap();
        let at = |a: &Array| std::sync::Arc::as_ptr(&a.data().unwrap().storage) as usize;
        // Each cache's window, then its state.
        arrays.iter().enumerate().map(|(i, a)| if i % 2 == 0 || states { at(a) } else { 0 }).collect()
    };
    let mut c = m.new_cache();
    m.forward(&tokens(&ids[..8]), &mut c);
    let held = buffers(&c);
    assert_eq!(held.len(), 4, "two recurrent layers, a window and a state each");
    let mut last = Vec::new();
    for &t in &ids[8..] {
        last = last_logits(&m.forward(&tokens(&[t]), &mut c)).to_vec::<f32>().unwrap();
        assert_eq!(buffers(&c), held, "a decode step moved a recurrent buffer");
    }
    m.forward(&tokens(&ids[..4]), &mut c);
    assert_eq!(buffers(&c), held, "a prompt moved a recurrent buffer");
    let mut fresh = m.new_cache();
    let want = last_logits(&m.forward(&tokens(&ids), &mut fresh)).to_vec::<f32>().unwrap();
    assert!(rel_diff(&last, &want) < 1e-5);
}

#[test]
fn recurrent_cache_trims_back_into_its_steps() {
    use nuvec_lm::cache::ROLLBACK_STEPS;
    let m = model("qwen3_next");
    let ids: Vec<u32> = (0..30).map(|i| (i * 29 + 11) % 128).collect();
    let last = |logits: Array| -> Vec<f32> { last_logits(&logits).to_vec().unwrap() };
    // The logits after `ids[..n]` and then `t`, from fresh caches.
    let fresh = |n: usize, t: u32| {
        let mut c = m.new_cache();
        m.forward(&tokens(&ids[..n]), &mut c);
        last(m.forward(&tokens(&[t]), &mut c))
    };
    let recurrent = |c: &[KvCache]| c.iter().filter(|c| c.is_recurrent()).count();
    assert_eq!(recurrent(&m.new_cache()), 2);
    // Nothing kept unless asked: a pass of 5 cannot be taken back.
    let mut c = m.new_cache();
    m.forward(&tokens(&ids[..8]), &mut c);
    m.forward(&tokens(&ids[8..13]), &mut c);
    assert_eq!(c[0].trim(1), 0);
    assert!(!c[0].keeps_steps());
    // One pass of 5 taken back 3 and then 1 more: the state after its first step.
    let mut c = m.new_cache();
    c.iter_mut().for_each(|c| c.keep_steps(1));
    m.forward(&tokens(&ids[..8]), &mut c);
    m.forward(&tokens(&ids[8..13]), &mut c);
    assert!(c.iter_mut().all(|c| c.trim(3) == 3));
    assert!(c.iter_mut().all(|c| c.trim(1) == 1));
    assert_eq!(c[0].offset(), 9);
    assert!(rel_diff(&last(m.forward(&tokens(&[ids[9]]), &mut c)), &fresh(9, ids[9])) < 1e-5);
    // Single-token passes: the last one alone when keeping one, three when asked.
    let mut c = m.new_cache();
    c.iter_mut().for_each(|c| c.keep_steps(1));
    m.forward(&tokens(&ids[..6]), &mut c);
    for &t in &ids[6..9] {
        m.forward(&tokens(&[t]), &mut c);
    }
    assert_eq!(c[0].trim(2), 0, "two passes back, keeping one");
    assert_eq!(c[0].offset(), 9);
    let mut c = m.new_cache();
    c.iter_mut().for_each(|c| c.keep_steps(3));
    m.forward(&tokens(&ids[..6]), &mut c);
    for &t in &ids[6..9] {
        m.forward(&tokens(&[t]), &mut c);
    }
    assert!(c.iter_mut().all(|c| c.trim(3) == 3));
    assert_eq!(c[0].trim(1), 0, "the prompt's pass went once three steps followed");
    assert!(rel_diff(&last(m.forward(&tokens(&[ids[6]]), &mut c)), &fresh(6, ids[6])) < 1e-5);
    // A pass longer than ROLLBACK_STEPS cannot be taken back (an attention cache can).
    let mut c = m.new_cache();
    c.iter_mut().for_each(|c| c.keep_steps(1));
    m.forward(&tokens(&ids[..ROLLBACK_STEPS as usize + 1]), &mut c);
    assert_eq!(c[0].trim(1), 0);
    assert_eq!(c[1].trim(1), 1);
    // Rows joined and taken out of a batch: each continues as alone.
    let rows: Vec<Vec<KvCache>> = [5usize, 9]
        .iter()
        .map(|&n| {
            let mut c = m.new_cache();
            m.forward(&tokens(&ids[..n]), &mut c);
            c
        })
        .collect();
    let joined: Vec<KvCache> =
        (0..rows[0].len()).map(|l| KvCache::stack(&[rows[0][l].clone(), rows[1][l].clone()])).collect();
    let mut second: Vec<KvCache> = joined.iter().map(|c| c.select(&[1], 9)).collect();
    assert!(rel_diff(&last(m.forward(&tokens(&[ids[9]]), &mut second)), &fresh(9, ids[9])) < 1e-5);
    // Emptied, a recurrent cache stays recurrent; the wrong kind of cache is an error.
    assert!(KvCache::recurrent().emptied().is_recurrent());
    let mut wrong = vec![KvCache::new(); 4];
    let e = m.forward(&tokens(&ids[..3]), &mut wrong).check().unwrap_err().to_string();
    assert!(e.contains("recurrent cache"), "{e}");
    let e = m.forward(&tokens(&ids[..3]), &mut m.new_cache()[..2]).check().unwrap_err().to_string();
    assert!(e.contains("2 caches for 4 layers"), "{e}");
    let flat = Array::from_slice(&[1i32, 2, 3], [3]);
    let e = m.forward(&flat, &mut m.new_cache()).check().unwrap_err().to_string();
    assert!(e.contains("tokens must be [B, L]"), "{e}");
}

/// Qwen3-Next's other caches and steps: prefill in pieces longer than `ROLLBACK_STEPS`, paged
/// and rotating caches on its attention layers, decode steps with the positions on the device,
/// and prompts padded together (`Positions::valid`) that continue as each alone.
#[test]
fn qwen3_next_caches_and_padded_rows() {
    let m = model("qwen3_next");
    let e = expected("qwen3_next");
    let (ids, want) = (u32s(&e["ids"]), u32s(&e["greedy"]));
    let last = |logits: Array| -> Vec<f32> { last_logits(&logits).to_vec().unwrap() };
    let long: Vec<u32> = (0..45).map(|i| (i * 37 + 5) % 128).collect();
    let mut whole = m.new_cache();
    let a = last(m.forward(&tokens(&long), &mut whole));
    for piece in [7, 20] {
        let mut c = m.new_cache();
        let mut b = Vec::new();
        for p in long.chunks(piece) {
            b = last(m.forward(&tokens(p), &mut c));
        }
        assert!(rel_diff(&b, &a) < 1e-5, "pieces of {piece}");
    }
    let options = GenerateOptions { max_tokens: want.len(), ..Default::default() };
    for (kind, mut cache) in
        [("paged", PromptCache::paged(m.as_ref(), 4)), ("rotating", PromptCache::rotating(m.as_ref(), 64))]
    {
        assert!(cache.layers[0].is_recurrent() && !cache.layers[1].is_recurrent(), "{kind}");
        assert_eq!(generated(m.as_ref(), &mut cache, &ids, options.clone()), want, "{kind} caches");
    }
    // Decode steps through the decode graph (positions on the device) equal plain steps.
    let (mut plain, mut at) = (m.new_cache(), m.new_cache());
    let first = last_logits(&m.forward(&tokens(&ids), &mut plain));
    let _ = m.forward(&tokens(&ids), &mut at);
    let mut graph = nuvec_lm::DecodeGraph::new(1).unwrap();
    let mut next = first.argmax_keepdims(-1).astype(DType::I32);
    for step in 0..6 {
        let want = last(m.forward(&next, &mut plain));
        let got = last(graph.step(m.as_ref(), &mut at, &next).unwrap());
        assert!(rel_diff(&got, &want) < 1e-5, "decode graph step {step}");
        next = Array::from_slice(&[argmax(&want) as i32], [1, 1]);
    }
    // Recurrent caches are updated in place, so the steps are recorded as a graph on the GPU.
    assert_eq!(graph.recorded(), !nuvec::default_device().is_cpu(), "recording over recurrent caches");
    // Three prompts (2, 7 and 12 tokens) in one pass padded to 12: the pads stay out of the
    // recurrent states and convolution windows; then one step of each row, as alone.
    let prompts = [&ids[..2], &long[..7], &ids[..]];
    let (b, l) = (3, 12);
    let mut padded = vec![0i32; b * l];
    for (r, p) in prompts.iter().enumerate() {
        for (j, &t) in p.iter().enumerate() {
            padded[r * l + j] = t as i32;
        }
    }
    let rows = |v: Vec<i32>| Array::from_slice(&v, [b as i32]);
    let valid: Vec<i32> = prompts.iter().map(|p| p.len() as i32).collect();
    let at =
        nuvec_lm::Positions::new(rows(vec![0; b]), rows(vec![l as i32; b])).fresh().with_valid(rows(valid.clone()));
    let mut batch = m.new_cache();
    m.forward_at(&Array::from_slice(&padded, [b as i32, l as i32]), &mut batch, &at);
    let step = nuvec_lm::Positions::new(rows(valid.clone()), rows(valid.iter().map(|v| v + 1).collect()));
    let got: Vec<f32> =
        last_logits(&m.forward_at(&Array::from_slice(&[9, 9, 9], [3, 1]), &mut batch, &step)).to_vec().unwrap();
    let v = got.len() / b;
    for (r, p) in prompts.iter().enumerate() {
        let mut c = m.new_cache();
        m.forward(&tokens(p), &mut c);
        let alone = last(m.forward(&tokens(&[9]), &mut c));
        assert!(rel_diff(&got[r * v..(r + 1) * v], &alone) < 1e-5, "row {r} of {} tokens, padded", p.len());
    }
}

#[test]
fn quantized_save_loads_back_identically() {
    // Qwen3-MoE's and Qwen3-Next's experts of 48 features stay in floating point (48 is no
    // multiple of 32); Qwen3-Next saved in MLX's layout (norms with their 1) loads back as it is.
    for name in ["qwen3", "qwen3_moe", "qwen3_next"] {
        let options = LoadOptions { dtype: Some(DType::F32), quantize: Some((32, 4)), ..Default::default() };
        let mut m = load_model(&fixture(name), &options).unwrap();
        let dir = std::env::temp_dir().join(format!("nuvec-lm-save-{name}-{}", std::process::id()));
        nuvec_lm::save(m.as_mut(), &word_tokenizer(), &dir).unwrap();
        let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["quantization"], serde_json::json!({"group_size": 32, "bits": 4}));
        let back = load(&dir, &LoadOptions::default()).unwrap();
        let ids = tokens(&u32s(&expected(name)["ids"]));
        let a: Vec<f32> = m.forward(&ids, &mut m.new_cache()).to_vec().unwrap();
        let b: Vec<f32> = back.model.forward(&ids, &mut back.model.new_cache()).to_vec().unwrap();
        assert_eq!(a, b, "{name}");
        // Quantized on load, 8-bit weights stay close to the float model (4-bit ones of these
        // random weights drift by about a third of the largest logit).
        let want: Vec<f32> = model(name).forward(&ids, &mut model(name).new_cache()).to_vec().unwrap();
        let q8 = load_model(
            &fixture(name),
            &LoadOptions { dtype: Some(DType::F32), quantize: Some((32, 8)), ..Default::default() },
        )
        .unwrap();
        let c: Vec<f32> = q8.forward(&ids, &mut q8.new_cache()).to_vec().unwrap();
        // Qwen3-Next's random weights drift more (transformers' with the same rounding too).
        let tolerance = if name == "qwen3_next" { 0.1 } else { 0.03 };
        assert!(rel_diff(&c, &want) < tolerance, "{name} 8-bit: {}", rel_diff(&c, &want));
        assert!(rel_diff(&a, &want) > rel_diff(&c, &want), "{name}: 4 bits are coarser than 8");
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // Experts whose features split into groups are quantized too (gather_qmm), and saved so:
    // a random model of experts of 64 features.
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("qwen3_moe").join("config.json")).unwrap()).unwrap();
    config["moe_intermediate_size"] = Value::from(64);
    let dir = std::env::temp_dir().join(format!("nuvec-lm-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let float = LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() };
    let want = nuvec_lm::random_model(&dir.join("config.json"), &float, 3).unwrap();
    let q8 = LoadOptions { quantize: Some((32, 8)), ..float };
    let mut q = nuvec_lm::random_model(&dir.join("config.json"), &q8, 3).unwrap();
    assert!(q.parameters().contains_key("model.layers.0.mlp.switch_mlp.down_proj.scales"));
    let ids = tokens(&u32s(&expected("qwen3_moe")["ids"]));
    let a: Vec<f32> = want.forward(&ids, &mut want.new_cache()).to_vec().unwrap();
    let b: Vec<f32> = q.forward(&ids, &mut q.new_cache()).to_vec().unwrap();
    assert!(rel_diff(&b, &a) < 0.03, "8-bit experts: {}", rel_diff(&b, &a));
    nuvec_lm::save(q.as_mut(), &word_tokenizer(), &dir).unwrap();
    let back = load(&dir, &LoadOptions::default()).unwrap();
    let c: Vec<f32> = back.model.forward(&ids, &mut back.model.new_cache()).to_vec().unwrap();
    assert_eq!(b, c, "quantized experts saved and loaded back");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn logprobs_logit_bias_and_stop_strings() {
    let tok = word_tokenizer();
    let m = model("mistral");
    let ids = u32s(&expected("mistral")["ids"]);
    let mut options = GenerateOptions { max_tokens: 6, ..Default::default() };
    options.sampler.top_logprobs = 3;
    let mut cache = PromptCache::new(m.as_ref());
    for t in generate(m.as_ref(), Some(&tok), &mut cache, &ids, &[], options.clone()).unwrap() {
        let t = t.unwrap();
        assert_eq!(t.top_logprobs.len(), 3);
        // Greedy: the token is the most likely one, with its log-probability.
        assert_eq!(t.top_logprobs[0].0, t.token);
        assert!((t.top_logprobs[0].1 - t.logprob).abs() < 1e-6 && t.logprob <= 0.0);
        assert!(t.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));
        assert!(t.top_logprobs.iter().map(|a| a.1.exp()).sum::<f32>() <= 1.0 + 1e-5);
    }
    // A large bias makes a token the greedy choice.
    options.sampler.logit_bias = vec![(77, 1000.0)];
    let mut cache = PromptCache::new(m.as_ref());
    let got: Vec<u32> = generated(m.as_ref(), &mut cache, &ids, options.clone());
    assert_eq!(got, vec![77; 6]);
    // A stop string ends generation and stays out of the text ("t77 t77 ..." with the
    // word tokenizer's decoder joining by spaces).
    options.stop = vec!["t77 t77".into()];
    let mut cache = PromptCache::new(m.as_ref());
    let out: Vec<nuvec_lm::Generated> =
        generate(m.as_ref(), Some(&tok), &mut cache, &ids, &[], options).unwrap().map(|t| t.unwrap()).collect();
    let text: String = out.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(out.last().unwrap().finish, Some(nuvec_lm::FinishReason::Stop));
    assert!(out.len() < 6 && !text.contains("t77 t77"), "{} tokens, {text:?}", out.len());
}

/// Continuous batching: requests joining a running batch at different steps, with their own
/// lengths, limits and stop strings, each get the tokens and text of decoding them alone; a
/// cancelled request leaves the batch and the others go on; bad requests are refused.
#[test]
fn engine_requests_equal_decoding_alone() {
    use nuvec_lm::engine::{Engine, Request};
    let tok = word_tokenizer();
    for name in ["llama", "qwen3", "qwen3_moe", "qwen3_next", "gemma3"] {
        let m = model(name);
        let base = u32s(&expected(name)["ids"]);
        let prompts: Vec<Vec<u32>> = vec![
            base.clone(),
            base[..3].to_vec(),
            (0..40).map(|i| (i * 11 + 3) % 128).collect(),
            (0..9).map(|i| (i * 7 + 1) % 128).collect(),
            base[1..].to_vec(),
        ];
        let options = |i: usize| GenerateOptions { max_tokens: 4 + 3 * i, ..Default::default() };
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| generated(m.as_ref(), &mut PromptCache::new(m.as_ref()), p, options(i)))
            .collect();
        // A stop string made of request 2's third token ends it there.
        let stop = tok.decode(&alone[2][2..3]).unwrap();
        // Whole prompts as requests join, and prompts prefilled 8 tokens a step between the
        // batch's steps; caches of their own, or blocks of one pool (shared by prompts that
        // start alike with the prefix cache on).
        for (budget, paged, prefixes) in [(usize::MAX, false, 0), (8, false, 0), (usize::MAX, true, 0), (8, true, 4)] {
            // Recurrent layers' states live in caches of their own (engine_refuses_...).
            if paged && name == "qwen3_next" {
                continue;
            }
            let mut engine = Engine::new(m.as_ref(), Some(&tok), &[], 3).with_prefill_budget(budget);
            if paged {
                engine = engine.with_prefix_cache(prefixes).with_paged_kv(4, 256);
            }
            let mut got: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
            let mut text = vec![String::new(); prompts.len()];
            let mut finished = vec![None; prompts.len()];
            let mut step = 0;
            loop {
                // Requests come in over the first steps; the batch holds at most three.
                if let Some(prompt) = prompts.get(step) {
                    let mut o = options(step);
                    if step == 2 {
                        o.stop = vec![stop.clone()];
                    }
                    engine.add(step as u64, Request { prompt: prompt.clone(), options: o, constraint: None }).unwrap();
                }
                if step == 6 {
                    assert!(engine.cancel(4), "request 4 is waiting or running");
                }
                if engine.is_idle() {
                    break;
                }
                for (id, event) in engine.step() {
                    let e = event.unwrap();
                    let i = id as usize;
                    assert!(finished[i].is_none(), "{name}: request {i} went on after it finished");
                    got[i].push(e.token);
                    text[i].push_str(&e.text);
                    finished[i] = e.finish;
                }
                step += 1;
                assert!(step < 200, "{name}: the engine did not finish");
            }
            for i in [0, 1, 3] {
                let how = format!("budget {budget}, paged {paged}, prefixes {prefixes}");
                assert_eq!(got[i], alone[i], "{name} ({how}): request {i} differs from decoding it alone");
                assert_eq!(text[i], tok.decode(&alone[i]).unwrap(), "{name}: request {i}'s text");
                assert_eq!(finished[i], Some(nuvec_lm::FinishReason::Length));
            }
            assert_eq!(got[2], alone[2][..3].to_vec(), "{name}: the stop string ends request 2 at its token");
            assert_eq!(text[2], tok.decode(&alone[2][..2]).unwrap() + " ", "{name}: text up to the stop string");
            assert_eq!(finished[2], Some(nuvec_lm::FinishReason::Stop));
            assert!(finished[4].is_none() && got[4].len() < alone[4].len(), "{name}: the cancelled request stopped");
            if let Some(blocks) = engine.kv_blocks() {
                assert_eq!(blocks.held, 0, "{name}: blocks still held after every request ended");
                assert_eq!(blocks.cached > 0, prefixes > 0, "{name}: full blocks stay cached with the prefix cache");
            }
        }
    }
    let m = model("llama");
    let mut engine = Engine::new(m.as_ref(), None, &[], 2);
    let empty = engine.add(1, Request { prompt: vec![], options: GenerateOptions::default(), constraint: None });
    assert!(empty.unwrap_err().to_string().contains("no tokens"));
    let long = engine.add(2, Request { prompt: vec![1; 1000], options: GenerateOptions::default(), constraint: None });
    assert!(long.unwrap_err().to_string().contains("context"));
    assert!(engine.is_idle());
    // The model's context (256) ends a request whatever its max_tokens.
    let options = GenerateOptions { max_tokens: 100, ..Default::default() };
    engine.add(3, Request { prompt: vec![7; 250], options, constraint: None }).unwrap();
    let mut got = Vec::new();
    while !engine.is_idle() {
        got.extend(engine.step().into_iter().map(|(_, e)| e.unwrap()));
    }
    assert_eq!(got.len(), 6);
    assert_eq!(got.last().unwrap().finish, Some(nuvec_lm::FinishReason::Length));
}

/// Prompts waiting together run in one forward pass, rows padded to the longest (a prompt of
/// one token, and one much longer, run apart): each request still gets the tokens of
/// decoding it alone, over caches of their own or one pool.
#[test]
fn engine_prefills_waiting_prompts_together() {
    use nuvec_lm::engine::{Engine, Request};
    // Qwen3-Next's recurrent layers keep the pads out of their states (not paged: see
    // engine_refuses_paged_kv_for_recurrent_layers).
    for name in ["llama", "qwen3", "qwen3_next", "gemma3"] {
        let m = model(name);
        let prompt = |n: usize, r: usize| -> Vec<u32> { (0..n).map(|i| ((i * 7 + r * 13 + 3) % 128) as u32).collect() };
        let prompts = [prompt(10, 0), prompt(9, 1), prompt(12, 2), prompt(1, 3), prompt(40, 4)];
        let options = |i: usize| GenerateOptions { max_tokens: 3 + i, ..Default::default() };
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| generated(m.as_ref(), &mut PromptCache::new(m.as_ref()), p, options(i)))
            .collect();
        for paged in [false, true].into_iter().filter(|&p| !p || name != "qwen3_next") {
            let mut engine = Engine::new(m.as_ref(), None, &[], 8);
            if paged {
                engine = engine.with_prefix_cache(2).with_paged_kv(4, 256);
            }
            for (i, p) in prompts.iter().enumerate() {
                engine.add(i as u64, Request { prompt: p.clone(), options: options(i), constraint: None }).unwrap();
            }
            let got = run_to_idle(&mut engine, prompts.len());
            for i in 0..prompts.len() {
                assert_eq!(got[i], alone[i], "{name}, paged {paged}: request {i} differs from decoding it alone");
            }
            // The first four in one pass (the one-token prompt has nothing to run), the long one
            // in another.
            assert_eq!(engine.prefill_passes(), 2, "{name}, paged {paged}");
            if let Some(blocks) = engine.kv_blocks() {
                assert_eq!(blocks.held, 0, "{name}: blocks still held");
            }
        }
    }
}

/// Prompt caching across requests: a conversation's next turn starts from the caches of the
/// turn before (its prompt and the reply fed back), runs only the rest, and gets the tokens
/// of decoding it alone; unrelated prompts start afresh; the oldest caches are dropped.
#[test]
fn engine_reuses_the_caches_of_earlier_requests() {
    use nuvec_lm::engine::{Engine, Request};
    for name in ["llama", "gemma3", "qwen3_next"] {
        let m = model(name);
        let ask = |p: &[u32], max: usize| Request {
            prompt: p.to_vec(),
            options: GenerateOptions { max_tokens: max, ..Default::default() },
            constraint: None,
        };
        let run = |engine: &mut Engine, id: u64, request: Request| -> Vec<u32> {
            engine.add(id, request).unwrap();
            let mut out = Vec::new();
            while !engine.is_idle() {
                out.extend(engine.step().into_iter().map(|(_, e)| e.unwrap().token));
            }
            out
        };
        let alone = |p: &[u32], max: usize| {
            let options = GenerateOptions { max_tokens: max, ..Default::default() };
            generated(m.as_ref(), &mut PromptCache::new(m.as_ref()), p, options)
        };
        let mut engine = Engine::new(m.as_ref(), None, &[], 4).with_prefix_cache(2);
        let first: Vec<u32> = (0..20).map(|i| (i * 7 + 2) % 128).collect();
        let reply = run(&mut engine, 1, ask(&first, 6));
        assert_eq!(engine.reused_tokens(1), Some(0));
        // The next turn: the first prompt, the reply, three new tokens.
        let second: Vec<u32> = first.iter().chain(&reply).chain(&[5, 9, 11]).copied().collect();
        let got = run(&mut engine, 2, ask(&second, 8));
        // The kept cache holds the prompt and the reply: the step started ahead of reading the
        // last token fed it too.
        assert_eq!(engine.reused_tokens(2), Some(first.len() + reply.len()), "{name}");
        assert_eq!(got, alone(&second, 8), "{name}: the next turn differs from decoding it alone");
        // A prompt that is all cached still runs its last token: the kept caches go back over
        // the reply fed after it, which recurrent caches cannot (they start afresh).
        let again = run(&mut engine, 3, ask(&second, 8));
        let reused = if name == "qwen3_next" { 0 } else { second.len() - 1 };
        assert_eq!(engine.reused_tokens(3), Some(reused), "{name}");
        assert_eq!(again, got);
        let other: Vec<u32> = (0..9).map(|i| (i * 5 + 100) % 128).collect();
        let fresh = run(&mut engine, 4, ask(&other, 4));
        assert_eq!(engine.reused_tokens(4), Some(0));
        assert_eq!(fresh, alone(&other, 4));
        // Two entries kept: the first conversation's turns were dropped.
        run(&mut engine, 5, ask(&[1, 2, 3], 2));
        run(&mut engine, 6, ask(&second, 2));
        assert_eq!(engine.reused_tokens(6), Some(0), "{name}: the oldest caches go");
    }
}

/// A paged engine refuses the requests of a model with recurrent layers, naming why (their
/// states per request are not in the pool).
#[test]
fn engine_refuses_paged_kv_for_recurrent_layers() {
    use nuvec_lm::engine::{Engine, Request};
    let m = model("qwen3_next");
    assert!(!Engine::can_page(m.as_ref()) && Engine::can_page(model("llama").as_ref()));
    let mut engine = Engine::new(m.as_ref(), None, &[], 4).with_paged_kv(4, 256);
    let ask = Request { prompt: vec![1, 2, 3], options: GenerateOptions::default(), constraint: None };
    let e = engine.add(0, ask).unwrap_err().to_string();
    assert!(e.contains("recurrent") && e.contains("paged KV cache"), "{e}");
    assert!(engine.is_idle());
}

/// The paged engine: a pool too small for every request at once preempts the newest (they
/// resume and end as decoding alone would); prompts that start alike share blocks; clients
/// going away at random points leave no block held.
/// Four prompts of 10 tokens.
fn four_prompts() -> Vec<Vec<u32>> {
    (0..4).map(|r| (0..10).map(|i| (i * 13 + r * 31 + 5) % 128).collect()).collect()
}

/// Steps `engine` until it is idle: the tokens of requests `0..n`, by id.
fn run_to_idle(engine: &mut nuvec_lm::engine::Engine, n: usize) -> Vec<Vec<u32>> {
    let mut got = vec![Vec::new(); n];
    for step in 0.. {
        if engine.is_idle() {
            return got;
        }
        for (id, e) in engine.step() {
            got[id as usize].push(e.unwrap().token);
        }
        assert!(step < 500, "the engine did not finish");
    }
    unreachable!()
}

/// Seeded sampling through a paged engine that preempts gives each request the tokens it gets
/// alone: a preempted request resumes from its sampler's state, whatever its batch sampled.
#[test]
fn paged_engine_preemption_keeps_seeded_sampling() {
    use nuvec_lm::engine::{Engine, Request};
    let m = model("llama");
    let options = |seed: u64| {
        let sampler = nuvec_lm::sample::SamplerOptions { temperature: 1.0, seed: Some(seed), ..Default::default() };
        GenerateOptions { max_tokens: 12, sampler, ..Default::default() }
    };
    let prompts = four_prompts();
    let mut engine = Engine::new(m.as_ref(), None, &[], 4).with_paged_kv(4, 48);
    for (i, p) in prompts.iter().enumerate() {
        engine.add(i as u64, Request { prompt: p.clone(), options: options(i as u64), constraint: None }).unwrap();
    }
    let got = run_to_idle(&mut engine, prompts.len());
    assert!(engine.kv_blocks().unwrap().preemptions > 0, "a pool of 12 blocks preempts");
    for (i, p) in prompts.iter().enumerate() {
        let alone = generated(m.as_ref(), &mut PromptCache::new(m.as_ref()), p, options(i as u64));
        assert_eq!(got[i], alone, "request {i} differs from sampling it alone");
    }
}

#[test]
fn paged_engine_preempts_shares_blocks_and_leaks_none() {
    use nuvec_lm::engine::{Engine, Request};
    for name in ["llama", "gemma3"] {
        let m = model(name);
        let alone = |p: &[u32], max: usize| {
            let options = GenerateOptions { max_tokens: max, ..Default::default() };
            generated(m.as_ref(), &mut PromptCache::new(m.as_ref()), p, options)
        };
        let ask = |p: &[u32], max: usize| Request {
            prompt: p.to_vec(),
            options: GenerateOptions { max_tokens: max, ..Default::default() },
            constraint: None,
        };
        // Four requests of up to 22 positions (6 blocks of 4) in a pool of 12 blocks.
        let prompts = four_prompts();
        let mut engine = Engine::new(m.as_ref(), None, &[], 4).with_paged_kv(4, 48);
        for (i, p) in prompts.iter().enumerate() {
            engine.add(i as u64, ask(p, 12)).unwrap();
        }
        let got = run_to_idle(&mut engine, prompts.len());
        for (i, p) in prompts.iter().enumerate() {
            assert_eq!(got[i], alone(p, 12), "{name}: request {i} differs from decoding it alone");
        }
        let blocks = engine.kv_blocks().unwrap();
        assert!(blocks.preemptions > 0, "{name}: a pool of 12 blocks preempts");
        assert_eq!((blocks.held, blocks.cached), (0, 0), "{name}");
        // A prompt longer than the pool is refused when added.
        let err = engine.add(9, ask(&[3; 48], 1)).unwrap_err().to_string();
        assert!(err.contains("KV cache holds 48 positions"), "{err}");
        // One that leaves one position free gets its two tokens; a third does not fit.
        let long: Vec<u32> = (0..47).map(|i| (i * 3 + 1) % 128).collect();
        for (max, fits) in [(2, true), (3, false)] {
            engine.add(10, ask(&long, max)).unwrap();
            let mut events = Vec::new();
            while !engine.is_idle() {
                events.extend(engine.step().into_iter().map(|(_, e)| e));
            }
            let tokens: Vec<u32> = events.iter().filter_map(|e| e.as_ref().ok().map(|g| g.token)).collect();
            assert_eq!(tokens, alone(&long, 2), "{name}");
            let last = events.last().unwrap();
            match fits {
                true => assert!(last.is_ok()),
                false => assert!(last.as_ref().unwrap_err().to_string().contains("fill the KV cache of 48 positions")),
            }
        }
        assert_eq!(engine.kv_blocks().unwrap().held, 0);

        // Prefix caching: a conversation's next turn reads the blocks of the turn before.
        let mut engine = Engine::new(m.as_ref(), None, &[], 4).with_prefix_cache(1).with_paged_kv(4, 256);
        let first: Vec<u32> = (0..21).map(|i| (i * 7 + 2) % 128).collect();
        engine.add(1, ask(&first, 6)).unwrap();
        let mut reply = Vec::new();
        while !engine.is_idle() {
            reply.extend(engine.step().into_iter().map(|(_, e)| e.unwrap().token));
        }
        let second: Vec<u32> = first.iter().chain(&reply).chain(&[5, 9, 11]).copied().collect();
        engine.add(2, ask(&second, 8)).unwrap();
        let mut again = Vec::new();
        while !engine.is_idle() {
            again.extend(engine.step().into_iter().map(|(_, e)| e.unwrap().token));
        }
        let reused = engine.reused_tokens(2).unwrap();
        assert!(
            reused >= 20 && reused.is_multiple_of(4),
            "{name}: {reused} tokens reused, whole blocks of the first turn"
        );
        assert_eq!(again, alone(&second, 8), "{name}: the next turn differs from decoding it alone");
        assert_eq!(engine.kv_blocks().unwrap().held, 0);
        // Choices of one prompt (`n` > 1) added together: the later ones read the first one's
        // prompt blocks as soon as it has run them.
        let mut engine = Engine::new(m.as_ref(), None, &[], 4).with_prefix_cache(1).with_paged_kv(4, 256);
        for id in 0..3 {
            engine.add(id, ask(&first, 5)).unwrap();
        }
        let mut choices = vec![Vec::new(); 3];
        while !engine.is_idle() {
            for (id, e) in engine.step() {
                choices[id as usize].push(e.unwrap().token);
            }
        }
        let reused: Vec<usize> = (0..3).map(|id| engine.reused_tokens(id).unwrap()).collect();
        assert_eq!(reused, vec![0, 20, 20], "{name}");
        assert!(choices.iter().all(|c| *c == alone(&first, 5)), "{name}: choices differ from decoding alone");

        // Fault injection: requests sharing starts, some cancelled at random steps, in a pool
        // that preempts; the rest end as decoding alone would, and no block stays held.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let stem: Vec<u32> = (0..12).map(|i| (i * 5 + 1) % 128).collect();
        let jobs: Vec<(Vec<u32>, usize, Option<usize>)> = (0..24)
            .map(|r| {
                let own = (0..1 + next(9)).map(|i| ((i * 3 + r * 17) % 128) as u32);
                let prompt: Vec<u32> = stem[..next(13) as usize].iter().copied().chain(own).collect();
                let cancel = (next(3) == 0).then(|| next(12) as usize);
                (prompt, 2 + next(10) as usize, cancel)
            })
            .collect();
        let mut engine = Engine::new(m.as_ref(), None, &[], 6).with_prefix_cache(1).with_paged_kv(4, 40);
        let mut got = vec![Vec::new(); jobs.len()];
        let mut steps_in = vec![0usize; jobs.len()];
        let mut cancelled = vec![false; jobs.len()];
        let mut step = 0;
        loop {
            // Three requests come in each step.
            for (j, job) in jobs.iter().enumerate().skip(3 * step).take(3) {
                engine.add(j as u64, ask(&job.0, job.1)).unwrap();
            }
            for (j, job) in jobs.iter().enumerate().take(3 * step + 3) {
                if job.2 == Some(steps_in[j]) && !cancelled[j] {
                    cancelled[j] = engine.cancel(j as u64);
                }
                steps_in[j] += 1;
            }
            if engine.is_idle() && 3 * step >= jobs.len() {
                break;
            }
            for (id, e) in engine.step() {
                got[id as usize].push(e.unwrap().token);
            }
            step += 1;
            assert!(step < 1000, "{name}: the engine did not finish");
        }
        for (j, (prompt, max, _)) in jobs.iter().enumerate() {
            if !cancelled[j] {
                assert_eq!(got[j], alone(prompt, *max), "{name}: request {j} differs from decoding it alone");
            }
        }
        assert!(cancelled.iter().any(|c| *c), "{name}: some requests were cancelled");
        let blocks = engine.kv_blocks().unwrap();
        assert_eq!(blocks.held, 0, "{name}: blocks leaked");
        assert!(blocks.preemptions > 0 && blocks.cached > 0, "{name}: {blocks:?}");
        assert!(got.iter().zip(&jobs).any(|(g, j)| g.len() == j.1 && j.0.len() > 12), "{name}: nothing shared a block");
    }
}

/// Each of `ranks` threads loads `name` split over a local group of that many ranks
/// (tensor parallelism) and runs `f` on its part, on the default device or, with `own_gpus`,
/// rank `r` on GPU `r`; the results in rank order.
fn on_ranks<T: Send>(name: &str, ranks: usize, own_gpus: bool, f: impl Fn(&dyn LanguageModel) -> T + Sync) -> Vec<T> {
    let groups = nuvec::distributed::Group::local(ranks);
    std::thread::scope(|s| {
        let jobs: Vec<_> = groups
            .into_iter()
            .map(|g| {
                let f = &f;
                s.spawn(move || {
                    let device = if own_gpus { nuvec::Device::gpu(g.rank() as u32) } else { nuvec::default_device() };
                    nuvec::with_stream(device, || {
                        let options = LoadOptions { dtype: Some(DType::F32), group: Some(g), ..Default::default() };
                        f(load_model(&fixture(name), &options).unwrap().as_ref())
                    })
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

/// A model split over two ranks gives every rank the logits and greedy tokens of the whole
/// model, each rank holding half the heads, MLP features and vocabulary; untied and tied heads,
/// biases (qwen2), per-head norms (qwen3), RoPE scaling (llama_linear).
#[test]
fn tensor_parallel_model_equals_the_whole() {
    for name in ["llama", "llama_linear", "mistral", "qwen2", "qwen3"] {
        let ids = u32s(&expected(name)["ids"]);
        let whole = model(name);
        let want: Vec<f32> = whole.forward(&tokens(&ids), &mut whole.new_cache()).to_vec().unwrap();
        let options = GenerateOptions { max_tokens: 8, ..Default::default() };
        let greedy = generated(whole.as_ref(), &mut PromptCache::new(whole.as_ref()), &ids, options.clone());
        let shapes = |m: &dyn LanguageModel| {
            let layer = |p: &str| m.parameters()[&format!("model.layers.0.{p}.weight")].shape().to_vec();
            [layer("self_attn.q_proj"), layer("self_attn.o_proj"), layer("mlp.down_proj")]
        };
        // Rows of the input projections, columns of the output ones.
        let mut halves = shapes(whole.as_ref());
        (halves[0][0], halves[1][1], halves[2][1]) = (halves[0][0] / 2, halves[1][1] / 2, halves[2][1] / 2);
        let ranks = on_ranks(name, 2, false, |m| {
            let shapes = shapes(m);
            let logits: Vec<f32> = m.forward(&tokens(&ids), &mut m.new_cache()).to_vec().unwrap();
            let tokens = generated(m, &mut PromptCache::new(m), &ids, options.clone());
            (shapes, logits, tokens)
        });
        for (rank, (shapes, logits, tokens)) in ranks.iter().enumerate() {
            assert_eq!(shapes, &halves, "{name}: rank {rank}'s parts");
            let d = rel_diff(logits, &want);
            assert!(d < 1e-5, "{name}: rank {rank}'s logits differ from the whole model's by {d}");
            assert_eq!(tokens, &greedy, "{name}: rank {rank}'s greedy tokens");
        }
        assert_eq!(ranks[0].1, ranks[1].1, "{name}: the ranks' logits are not identical");
    }
}

/// What cannot be split says why, on every rank.
#[test]
fn tensor_parallel_refusals_name_the_reason() {
    let errors = |name: &str, ranks: usize| {
        let groups = nuvec::distributed::Group::local(ranks);
        std::thread::scope(|s| {
            let jobs: Vec<_> = groups
                .into_iter()
                .map(|g| {
                    s.spawn(move || {
                        let options = LoadOptions { group: Some(g), ..Default::default() };
                        load_model(&fixture(name), &options).err().map(|e| e.to_string()).unwrap_or_default()
                    })
                })
                .collect();
            jobs.into_iter().map(|j| j.join().unwrap()).collect::<Vec<_>>()
        })
    };
    for e in errors("llama", 3) {
        assert!(e.contains("3 ranks") && e.contains("4 query heads"), "{e}");
    }
    for e in errors("qwen3_moe", 2) {
        assert!(e.contains("mixture-of-experts"), "{e}");
    }
    for e in errors("gemma3", 2) {
        assert!(e.contains("gemma3_text") && e.contains("cannot be split"), "{e}");
    }
}

/// Two GPUs of one process, a rank on each, their sums through NCCL: the whole model's logits.
/// Skips without two GPUs and NCCL.
#[test]
fn tensor_parallel_over_two_gpus_through_nccl() {
    if nuvec::cuda::device_count() < 2 || nuvec::cuda::nccl::nccl_unavailable_reason().is_some() {
        eprintln!("SKIPPED: needs two GPUs and NCCL");
        return;
    }
    let ids = u32s(&expected("qwen3")["ids"]);
    let whole = model("qwen3");
    let want: Vec<f32> = whole.forward(&tokens(&ids), &mut whole.new_cache()).to_vec().unwrap();
    for (rank, (nccl, logits)) in on_ranks("qwen3", 2, true, |m| {
        let logits: Vec<f32> = m.forward(&tokens(&ids), &mut m.new_cache()).to_vec().unwrap();
        (m.group().unwrap().uses_nccl(), logits)
    })
    .into_iter()
    .enumerate()
    {
        assert!(nccl, "rank {rank} did not sum through NCCL");
        let d = rel_diff(&logits, &want);
        assert!(d < 1e-5, "rank {rank}'s logits differ from the whole model's by {d}");
    }
}
