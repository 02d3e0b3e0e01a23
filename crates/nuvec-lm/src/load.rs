//! Loading a model and its tokenizer: a Hugging Face folder (`config.json`, safetensors,
//! sharded or not, mlx-community's affine-quantized weights included) or a GGUF file.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use nuvec::distributed::Group;
use nuvec::io::{GgufFile, GgufValue, SafetensorsFile};
use nuvec::nn::{Embedding, Linear, Params, QuantSpec};
use nuvec::{Array, DType};
use serde_json::Value;

use crate::config::{ModelConfig, ids};
use crate::models::switch::SwitchLinear;
use crate::models::{LanguageModel, build, quantize};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// How to load.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// The dtype of activations and float weights (`None`: the checkpoint's for safetensors;
    /// for GGUF, `float16` on a GPU and `float32` on the CPU).
    pub dtype: Option<DType>,
    /// Quantize float weights on load: `(group_size, bits)`, MLX's affine mode.
    pub quantize: Option<(i32, i32)>,
    /// The ranks to split the model over (tensor parallelism, [`LanguageModel::shard`]): this
    /// process loads its rank's part; from a Hugging Face folder it reads only that part's
    /// bytes. `None`, or a group of one, loads the whole model.
    pub group: Option<Group>,
}

/// A model ready to generate: weights, tokenizer, and the tokens that end a reply.
pub struct Loaded {
    /// The model.
    pub model: Box<dyn LanguageModel>,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Tokens that end generation (the tokenizer's, `config.json`'s and
    /// `generation_config.json`'s).
    pub eos: Vec<u32>,
    /// Where it came from.
    pub path: PathBuf,
}

/// Loads the model at `path`, a `.gguf` file or a Hugging Face folder, with its tokenizer.
/// Errors name the file and what is wrong (missing, unknown architecture, a weight of the
/// wrong shape).
pub fn load(path: &Path, options: &LoadOptions) -> Result<Loaded> {
    if path.is_file() {
        let file = GgufFile::open(path)?;
        let model = model_from_gguf(&file, options)?;
        let tokenizer = Tokenizer::from_gguf(file.metadata())?;
        let eos = tokenizer.eos.clone();
        return Ok(Loaded { model, tokenizer, eos, path: path.to_path_buf() });
    }
    with_tokenizer(load_model(path, options)?, path)
}

/// `model` with the tokenizer of the folder `dir` and the tokens that end generation (the
/// tokenizer's, `config.json`'s and `generation_config.json`'s).
fn with_tokenizer(model: Box<dyn LanguageModel>, dir: &Path) -> Result<Loaded> {
    let tokenizer = Tokenizer::from_dir(dir)?;
    let mut eos = tokenizer.eos.clone();
    eos.extend(model.config().eos_tokens());
    if let Ok(t) = std::fs::read_to_string(dir.join("generation_config.json"))
        && let Ok(v) = serde_json::from_str::<Value>(&t)
    {
        eos.extend(ids(v.get("eos_token_id")));
    }
    eos.sort_unstable();
    eos.dedup();
    Ok(Loaded { model, tokenizer, eos, path: dir.to_path_buf() })
}

/// The folder `dir`'s model with random weights ([`random_model`] of its `config.json`) and
/// its real tokenizer: a server or benchmark of a model's shapes and vocabulary without its
/// weights' files.
pub fn load_random(dir: &Path, options: &LoadOptions, seed: u64) -> Result<Loaded> {
    with_tokenizer(random_model(&dir.join("config.json"), options, seed)?, dir)
}

/// The model alone (no tokenizer) at `path`: a `.gguf` file or a Hugging Face folder.
pub fn load_model(path: &Path, options: &LoadOptions) -> Result<Box<dyn LanguageModel>> {
    if path.is_file() {
        return model_from_gguf(&GgufFile::open(path)?, options);
    }
    if !path.is_dir() {
        return Err(Error::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder")));
    }
    let config_path = path.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;
    let config = ModelConfig::from_json(&text)?;
    let group = split_over(options);
    // Split over ranks, the weights are read once the model's parts have their shapes.
    let whole = match group {
        None => Some(crate::models::sanitize(&config, read_safetensors(path)?)?),
        Some(_) => None,
    };
    let names: BTreeSet<String> = match &whole {
        Some(w) => w.keys().cloned().collect(),
        None => safetensors_files(path)?.iter().flat_map(|f| f.names().into_iter().map(String::from)).collect(),
    };
    let tied = config.tie_word_embeddings.unwrap_or(false) || !names.contains("lm_head.weight");
    let mut model = build(&config, tied)?;
    if let Some(q) = &config.quantization {
        // mlx-community: the layers with scales are quantized.
        quantize(model.as_mut(), |layer, _| {
            let (group, bits) = q.of(layer);
            names.contains(&format!("{layer}.scales")).then(|| QuantSpec::new(group, bits, "affine"))
        })?;
    }
    let weights = match (whole, group) {
        (Some(w), _) => w,
        (None, Some(g)) => {
            model.shard(g)?;
            read_parts(path, model.as_ref(), g)?
        }
        (None, None) => unreachable!("the whole checkpoint is read without a group"),
    };
    model.load_weights(&weights, true).map_err(|e| Error::Weights(format!("{}: {e}", path.display())))?;
    finish(model.as_mut(), options, None)?;
    Ok(model)
}

/// A model of the architecture the `config.json` at `path` describes, with random weights
/// (normal with standard deviation 0.02, norms at one) in `options.dtype` (default
/// `bfloat16`), quantized as `options` asks: for benchmarks of real shapes without their files.
pub fn random_model(path: &Path, options: &LoadOptions, seed: u64) -> Result<Box<dyn LanguageModel>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let config = ModelConfig::from_json(&text)?;
    let mut model = build(&config, config.tie_word_embeddings.unwrap_or(false))?;
    if let Some(g) = split_over(options) {
        model.shard(g)?;
    }
    let dtype = options.dtype.unwrap_or(DType::BF16);
    let mut key = nuvec::random::key(seed);
    model.visit_mut("", &mut |name, p| {
        p.value = if name.ends_with("norm.weight") {
            nuvec::ops::ones(p.value.shape().to_vec(), dtype)
        } else {
            let (next, now) = nuvec::random::split2(&key);
            key = next;
            nuvec::random::normal(p.value.shape().to_vec(), dtype, 0.0, 0.02, Some(&now))
        };
    });
    finish(model.as_mut(), &LoadOptions { dtype: None, ..options.clone() }, None)?;
    Ok(model)
}

/// Saves `model` and `tokenizer` as a Hugging Face folder in MLX's layout, as `mlx_lm.convert`
/// writes it: `model.safetensors` (quantized layers as packed `weight`, `scales` and `biases`),
/// `config.json` (with a `quantization` entry, per layer where layers differ),
/// `tokenizer.json` and `tokenizer_config.json` (special tokens, chat template). [`load`]
/// reads it back.
pub fn save(model: &mut dyn LanguageModel, tokenizer: &Tokenizer, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut config = model.config().clone();
    // Each quantized layer's group size and bits.
    let mut layers: BTreeMap<String, (i32, i32)> = BTreeMap::new();
    model.visit_layers_mut("", &mut |path, layer| {
        let q = if let Some(l) = layer.downcast_ref::<Linear>() {
            l.quantized.as_ref()
        } else if let Some(e) = layer.downcast_ref::<Embedding>() {
            e.quantized.as_ref()
        } else {
            layer.downcast_ref::<SwitchLinear>().and_then(|s| s.quantized.as_ref())
        };
        if let Some(q) = q {
            layers.insert(path.to_string(), (q.group_size, q.bits));
        }
    });
    config.quantization = most_common(&layers).map(|(group_size, bits)| {
        let own = layers
            .iter()
            .filter(|(_, q)| **q != (group_size, bits))
            .map(|(l, (g, b))| (l.clone(), serde_json::json!({"group_size": g, "bits": b})))
            .collect();
        crate::config::QuantConfig { group_size, bits, layers: own }
    });
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
    };
    let json = serde_json::to_string_pretty(&config).map_err(|e| Error::Config(e.to_string()))?;
    write("config.json", json)?;
    model.save_weights(&dir.join("model.safetensors"))?;
    write("tokenizer.json", tokenizer.inner().to_string(true).map_err(|e| Error::Tokenizer(e.to_string()))?)?;
    let name = |id: u32| tokenizer.inner().id_to_token(id);
    let mut tc = serde_json::Map::new();
    if let Some((_, bos)) = &tokenizer.bos {
        tc.insert("bos_token".into(), bos.clone().into());
    }
    if let Some(eos) = tokenizer.eos.first().and_then(|&e| name(e)) {
        tc.insert("eos_token".into(), eos.into());
    }
    if let Some(t) = &tokenizer.chat_template {
        tc.insert("chat_template".into(), t.clone().into());
    }
    write("tokenizer_config.json", serde_json::to_string_pretty(&tc).map_err(|e| Error::Config(e.to_string()))?)
}

/// The `(group_size, bits)` most layers have.
fn most_common(layers: &BTreeMap<String, (i32, i32)>) -> Option<(i32, i32)> {
    let mut counts: BTreeMap<(i32, i32), usize> = BTreeMap::new();
    for q in layers.values() {
        *counts.entry(*q).or_default() += 1;
    }
    counts.into_iter().max_by_key(|(_, n)| *n).map(|(q, _)| q)
}

/// The group `options` asks to split the model over, unless it has one rank.
fn split_over(options: &LoadOptions) -> Option<&Group> {
    options.group.as_ref().filter(|g| g.size() > 1)
}

/// The safetensors files of a folder, opened (headers read): the shards an index lists, or
/// every `*.safetensors`.
fn safetensors_files(dir: &Path) -> Result<Vec<SafetensorsFile>> {
    let index = dir.join("model.safetensors.index.json");
    let paths: Vec<PathBuf> = if index.exists() {
        nuvec::io::safetensors_index(&index)?.into_keys().map(|f| dir.join(f)).collect()
    } else {
        safetensors_in(dir)?
    };
    if paths.is_empty() {
        return Err(Error::Weights(format!("{}: no *.safetensors files", dir.display())));
    }
    paths.iter().map(|p| SafetensorsFile::open(p).map_err(Error::from)).collect()
}

/// This rank's part of each weight of `model`, already split over `group`
/// ([`LanguageModel::shard`]), read from the folder `dir`: a weight whose shape is the
/// checkpoint's is read whole, one split along an axis only that part's bytes.
fn read_parts(dir: &Path, model: &dyn LanguageModel, group: &Group) -> Result<Params> {
    let files = safetensors_files(dir)?;
    let mut owner: HashMap<String, usize> = HashMap::new();
    for (i, f) in files.iter().enumerate() {
        owner.extend(f.names().into_iter().map(|n| (n.to_string(), i)));
    }
    let (n, rank) = (group.size(), group.rank());
    let mut out = Params::new();
    let mut failed = None;
    model.visit("", &mut |name, p| {
        let Some(&i) = owner.get(name) else { return };
        let part = files[i].info(name).map_err(Error::from).and_then(|(full, _)| {
            let local = p.shape();
            let split: Vec<usize> = (0..full.len().min(local.len())).filter(|&a| full[a] != local[a]).collect();
            match split[..] {
                [] if full.len() == local.len() => Ok(files[i].get(name)?),
                [a] if full.len() == local.len() && full[a] == local[a] * n as i32 => {
                    Ok(files[i].get_part(name, a, n, rank)?)
                }
                _ => Err(Error::Weights(format!(
                    "{}: '{name}' is {full:?} in the checkpoint, not {local:?} on each of {n} ranks",
                    dir.display()
                ))),
            }
        });
        match part {
            Ok(a) => {
                out.insert(name.to_string(), a);
            }
            Err(e) => failed = failed.take().or(Some(e)),
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    // As a whole load would: a tensor the model has no place for is an error.
    if let Some(extra) = owner.keys().find(|k| !out.contains_key(*k)) {
        return Err(Error::Weights(format!("{}: tensor '{extra}' has no place in the model", dir.display())));
    }
    Ok(out)
}

/// Each weight of `model` (split over ranks after a whole load) in a buffer of its own, so that
/// the whole weights it was cut from are freed.
fn own_parts(model: &mut dyn LanguageModel) -> Result<()> {
    let mut failed = None;
    model.visit_mut("", &mut |_, p| {
        let (shape, dtype) = (p.value.shape().to_vec(), p.value.dtype());
        match p.value.to_bytes() {
            Ok(bytes) => p.value = Array::from_raw_bytes(&bytes, shape, dtype),
            Err(e) => failed = failed.take().or(Some(e)),
        }
    });
    failed.map_or(Ok(()), |e| Err(e.into()))
}

/// The folder's `*.safetensors` files, sorted.
fn safetensors_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

/// The safetensors of a folder: the shards an index lists, or every `*.safetensors`.
fn read_safetensors(dir: &Path) -> Result<Params> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        return nuvec::io::load_safetensors_index(&index).map_err(Error::from);
    }
    let files = safetensors_in(dir)?;
    if files.is_empty() {
        return Err(Error::Weights(format!("{}: no *.safetensors files", dir.display())));
    }
    let mut out = Params::new();
    for f in files {
        out.extend(nuvec::io::load_safetensors(&f)?);
    }
    Ok(out)
}

/// Casts and quantizes as `options` asks; `default_dtype` applies when `options` names none.
fn finish(model: &mut dyn LanguageModel, options: &LoadOptions, default_dtype: Option<DType>) -> Result<()> {
    if let Some(dtype) = options.dtype.or(default_dtype) {
        model.set_dtype(dtype);
    }
    finish_quantized(model, options)
}

/// [`finish`] for a GGUF's model, whose quantized layers' scales and biases are `float16`
/// values: kept so beside `float32` activations (the products dequantize in `float32` all the
/// same), half the bytes of `float32` ones to read per token.
fn finish_gguf(model: &mut dyn LanguageModel, options: &LoadOptions, default_dtype: DType) -> Result<()> {
    let dtype = options.dtype.unwrap_or(default_dtype);
    model.set_dtype(dtype);
    if dtype == DType::F32 {
        model.visit_mut("", &mut |name, p| {
            if name.ends_with(".scales") || name.ends_with(".biases") {
                p.value = p.value.astype(DType::F16);
            }
        });
    }
    finish_quantized(model, options)
}

/// The rest of [`finish`]: `--quantize`, then the joined projections.
fn finish_quantized(model: &mut dyn LanguageModel, options: &LoadOptions) -> Result<()> {
    if let Some((group, bits)) = options.quantize {
        // Layers whose rows do not split into groups stay in floating point, as mlx-lm's.
        let fits = |w: &Array| w.dtype().is_float() && w.shape().last().is_some_and(|&n| n % group == 0);
        quantize(model, |_, w| fits(w).then(|| QuantSpec::new(group, bits, "affine")))?;
    }
    model.fuse_projections();
    Ok(())
}

/// The Hugging Face name of a GGUF tensor of a model of `model_type` (llama.cpp's converter's
/// names, inverted).
fn hf_name(gguf: &str, model_type: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, name) = rest.split_once('.')?;
    let (module, param) = name.rsplit_once('.')?;
    let gemma = model_type == "gemma3_text";
    let hf = match module {
        "attn_norm" => "input_layernorm",
        // Gemma's norm before the MLP; Llama's only norm after attention.
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" => "post_attention_layernorm",
        "post_ffw_norm" => "post_feedforward_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        // Experts stacked as `switch.rs` holds them, and their router.
        "ffn_gate_inp" => "mlp.gate",
        "ffn_gate_exps" => "mlp.switch_mlp.gate_proj",
        "ffn_up_exps" => "mlp.switch_mlp.up_proj",
        "ffn_down_exps" => "mlp.switch_mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{param}"))
}

/// Rows of a `[heads · D, ..]` projection in Hugging Face's order, from llama.cpp's, which
/// interleaves each head's two halves for its RoPE.
fn unpermute(x: &Array, heads: i32) -> Array {
    let rows = x.shape()[0];
    let d = rows / heads;
    let order: Vec<i32> = (0..rows).map(|r| (r / d) * d + (r % d % (d / 2)) * 2 + (r % d) / (d / 2)).collect();
    x.take(&Array::from_slice(&order, [rows]), 0)
}

fn model_from_gguf(file: &GgufFile, options: &LoadOptions) -> Result<Box<dyn LanguageModel>> {
    let path = file.path();
    let meta: &BTreeMap<String, GgufValue> = file.metadata();
    let mut config = ModelConfig::from_gguf(meta)?;
    // Llama 3.x files carry their RoPE scaling as per-pair factors, not as metadata.
    if file.tensors().iter().any(|t| t.name == "rope_freqs.weight") {
        let factors: Vec<f32> = file.get("rope_freqs.weight")?.astype(DType::F32).to_vec()?;
        config.rope_scaling = Some(crate::rope::llama3_from_factors(&factors, config.rope_theta, config.head_dim())?);
    }
    if config.model_type == "qwen3_moe" {
        // Layers without stacked experts keep a dense MLP.
        let sparse = |i: i32| file.tensors().iter().any(|t| t.name == format!("blk.{i}.ffn_gate_exps.weight"));
        config.mlp_only_layers = Some((0..config.num_hidden_layers).filter(|&i| !sparse(i)).collect());
    }
    let permuted = config.model_type == "llama" || config.model_type == "mistral";
    // llama.cpp's converter stores Gemma's norms with the 1 of their `1 + weight` added.
    let shifted = config.model_type == "gemma3_text";
    let mut weights = Params::new();
    let mut bits: BTreeMap<String, i32> = BTreeMap::new();
    // The CPU's fused quantized products read 4 and 8 bits: 5-bit blocks are widened to 8.
    let widths: &[i32] = if on_gpu() { &[] } else { &[4, 8] };
    for t in file.tensors() {
        let Some(name) = hf_name(&t.name, &config.model_type) else {
            if t.name == "rope_freqs.weight" {
                continue;
            }
            return Err(Error::Weights(format!("{}: tensor '{}' has no place in the model", path.display(), t.name)));
        };
        let heads = if name.contains("q_proj.") {
            Some(config.num_attention_heads)
        } else if name.contains("k_proj.") {
            Some(config.kv_heads())
        } else {
            None
        };
        let fix = |x: Array| match heads {
            Some(h) if permuted => unpermute(&x, h),
            _ => x,
        };
        let layer = name.strip_suffix(".weight").unwrap_or(&name).to_string();
        let float = matches!(t.ggml_type, 0 | 1 | 30);
        let mut keep = |w: Array, scales: Array, biases: Array, b: i32| {
            bits.insert(layer.clone(), b);
            weights.insert(format!("{layer}.scales"), fix(scales));
            weights.insert(format!("{layer}.biases"), fix(biases));
            weights.insert(name.clone(), fix(w));
        };
        match file.affine(&t.name, widths)? {
            Some(q) => keep(q.w, q.scales, q.biases, q.bits),
            // Scales per 16 values (Q6_K, Q3_K, Q2_K) have no affine form: requantized to 8
            // bits in groups of 32, within a 255th of a group's range of the file's values.
            None if !float && t.shape.last().is_some_and(|&k| k % 32 == 0) => {
                let (w, scales, biases) = nuvec::ops::quantize(&file.get(&t.name)?, 32, 8, "affine");
                let biases = biases.expect("affine quantization has biases");
                keep(w, scales.astype(DType::F16), biases.astype(DType::F16), 8);
            }
            None if shifted && t.name.ends_with("norm.weight") => {
                weights.insert(name, fix(file.get(&t.name)?.astype(DType::F32) - 1.0));
            }
            None => {
                weights.insert(name, fix(file.get(&t.name)?));
            }
        }
    }
    let tied = !weights.contains_key("lm_head.weight");
    let mut model = build(&config, tied)?;
    quantize(model.as_mut(), |layer, _| bits.get(layer).map(|&b| QuantSpec::new(32, b, "affine")))?;
    model.load_weights(&weights, true).map_err(|e| Error::Weights(format!("{}: {e}", path.display())))?;
    drop(weights);
    if let Some(g) = split_over(options) {
        // A GGUF's blocks are converted whole; each rank keeps its part of them.
        model.shard(g)?;
        own_parts(model.as_mut())?;
    }
    finish_gguf(model.as_mut(), options, if on_gpu() { DType::F16 } else { DType::F32 })?;
    Ok(model)
}

/// Whether arrays go to a GPU by default.
pub fn on_gpu() -> bool {
    !nuvec::default_device().is_cpu()
}
