//! `nuvec`: generate text, chat and benchmark language models on nuvec (GPU when present,
//! else CPU). With no `--model`, the default model (SmolLM2-135M-Instruct) is fetched once.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use nuvec::DType;
use nuvec_lm::generate::Draft;
use nuvec_lm::{GenerateOptions, LoadOptions, Loaded, PromptCache, SamplerOptions, Stats, fetch, generate, load};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(name = "nuvec", version, about = "Run language models on nuvec (NVIDIA GPUs and CPUs)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it, then print speeds and peak memory.
    Generate(GenerateArgs),
    /// Chat in a loop: each turn reuses the cache of the conversation so far.
    Chat(ModelArgs),
    /// Measure prefill and decode tokens/s, time to first token and peak memory.
    Bench(BenchArgs),
    /// Save a model (quantized with --quantize) as a folder in MLX's layout.
    Convert(ConvertArgs),
    /// Serve the model over HTTP with OpenAI's API (chat and text completions, streamed).
    Serve(ServeArgs),
    /// Run a program as N ranks of a distributed group on this machine (`nuvec::distributed`).
    Launch(LaunchArgs),
}

#[derive(Args)]
struct LaunchArgs {
    /// The number of ranks (processes).
    #[arg(short = 'n', long, default_value_t = 2)]
    ranks: usize,
    /// Seconds the other ranks get to end on their own after one fails, before they are killed.
    #[arg(long, default_value_t = 30.0)]
    grace: f64,
    /// The program and its arguments (after `--`); each rank finds its group with
    /// `nuvec::distributed::init`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port to listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model's id in requests and /v1/models (default: its file or folder name).
    #[arg(long)]
    model_id: Option<String>,
    /// Requests decoding together at most (default: 256 on a GPU, 16 on the CPU).
    #[arg(long)]
    max_batch: Option<usize>,
    /// Requests waiting at most (more are answered 429).
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Tokens generated when a request does not say.
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// The sampling temperature when a request does not say.
    #[arg(long = "temp", default_value_t = 0.0)]
    temperature: f32,
    /// Requests must carry "Authorization: Bearer KEY" (also from NUVEC_API_KEY).
    #[arg(long, env = "NUVEC_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Prompts that start as earlier ones read their keys and values (0: off): the paged
    /// cache's full blocks, or the caches of this many ended requests with --kv-block-size 0.
    #[arg(long, default_value_t = 8)]
    prompt_cache: usize,
    /// Prompt tokens prefilled per step at most, between the running requests' steps.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// Prompts prefilled together in one forward pass at most (1: one at a time).
    #[arg(long, default_value_t = 64)]
    prefill_rows: usize,
    /// Positions per block of the paged KV cache the requests share (0: caches of their own).
    #[arg(long, default_value_t = 16)]
    kv_block_size: usize,
    /// Positions the paged KV cache holds at most; when full, the newest requests wait.
    #[arg(long, default_value_t = 65536)]
    kv_cache_tokens: usize,
}

#[derive(Args)]
struct ConvertArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The folder to write (config.json, model.safetensors, tokenizer files).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args, Clone)]
struct LoadArgs {
    /// A GGUF file or a Hugging Face folder (default: SmolLM2-135M-Instruct, fetched once).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Activation and weight dtype: float32, float16 or bfloat16.
    #[arg(long)]
    dtype: Option<String>,
    /// Quantize float weights on load: BITS,GROUP (MLX's affine mode), e.g. 4,64.
    #[arg(long)]
    quantize: Option<String>,
    /// Random weights of the shapes the --model folder's config.json gives, with the folder's
    /// tokenizer (for measurements of a model whose weights are not at hand).
    #[arg(long, requires = "model")]
    random_weights: bool,
    /// Split the model over N ranks (tensor parallelism): N processes on this machine, rank r
    /// on GPU r when there are several GPUs (NCCL between them), each loading only its part;
    /// rank 0 prints. Llama-family models (llama, mistral, qwen2, qwen3).
    #[arg(long, value_name = "N", default_value_t = 1)]
    tensor_parallel: usize,
}

#[derive(Args, Clone)]
struct ModelArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long = "temp", default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling: keep tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: i32,
    /// Drop tokens less likely than MIN_P times the most likely.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Penalize tokens of the recent context (1: off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Random seed: the same seed gives the same tokens.
    #[arg(long)]
    seed: Option<u64>,
    /// A system prompt for the chat template.
    #[arg(long)]
    system: Option<String>,
    /// Keep at most this many positions in the KV cache (a rotating cache: attention then
    /// sees a sliding window of them).
    #[arg(long)]
    max_kv_size: Option<i32>,
    /// Keep the KV cache quantized to this many bits (mlx-lm's --kv-bits; 8 or 4 typically).
    #[arg(long, conflicts_with = "max_kv_size")]
    kv_bits: Option<i32>,
    /// The group size of the quantized KV cache (it must divide the head size).
    #[arg(long, default_value_t = 64)]
    kv_group_size: i32,
    /// Keep the KV cache paged: blocks of this many positions (a power of two) in a pool that
    /// grows by blocks.
    #[arg(long, conflicts_with_all = ["max_kv_size", "kv_bits"])]
    kv_block_size: Option<i32>,
    /// Run each decode step op by op instead of as one recorded device graph (GPU only).
    #[arg(long)]
    no_graph: bool,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt ("-" reads standard input); several (repeated) are generated together as a
    /// batch.
    #[arg(long, short, default_value = "Hello! Who are you?")]
    prompt: Vec<String>,
    /// Use the prompt as it is, without the chat template.
    #[arg(long)]
    ignore_chat_template: bool,
    /// Stop when the text contains this (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Speculative decoding with this smaller model (same vocabulary) proposing tokens.
    #[arg(long, conflicts_with = "prompt_lookup")]
    draft_model: Option<PathBuf>,
    /// Speculative decoding by prompt lookup: proposals follow the latest earlier occurrence of
    /// the last N tokens.
    #[arg(long, value_name = "N")]
    prompt_lookup: Option<usize>,
    /// Tokens proposed per speculative step.
    #[arg(long, default_value_t = 3)]
    num_draft: usize,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Random weights of the shapes a config.json gives, instead of a model's files.
    #[arg(long)]
    random: Option<PathBuf>,
    /// Prompt lengths to measure (prefill and time to first token, batch 1).
    #[arg(long, value_delimiter = ',', default_value = "128")]
    prompt_tokens: Vec<usize>,
    /// Batch sizes of the decode measurement.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    batch: Vec<i32>,
    /// Tokens in the cache when decode is timed.
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// Decode steps timed.
    #[arg(long, default_value_t = 64)]
    steps: usize,
    /// Runs of each measurement (the best is kept).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Set on ranks other than 0 of a split model: they compute as rank 0 does, silently.
static QUIET: AtomicBool = AtomicBool::new(false);

/// `println!` on rank 0 (or without ranks) only.
macro_rules! say {
    ($($t:tt)*) => {
        if !QUIET.load(Ordering::Relaxed) {
            println!($($t)*)
        }
    };
}

impl Command {
    /// The `--tensor-parallel` count and the command's name.
    fn tensor_parallel(&self) -> (usize, &'static str) {
        match self {
            Command::Generate(a) => (a.model.load.tensor_parallel, "generate"),
            Command::Bench(a) => (a.model.load.tensor_parallel, "bench"),
            Command::Chat(a) => (a.load.tensor_parallel, "chat"),
            Command::Convert(a) => (a.model.load.tensor_parallel, "convert"),
            Command::Serve(a) => (a.load.tensor_parallel, "serve"),
            Command::Launch(_) => (1, "launch"),
        }
    }
}

/// With `--tensor-parallel N`, this process starts the N ranks (itself again, under
/// `distributed::launch`) and waits for them (`Some`); a rank, or a run without the flag, goes
/// on (`None`).
fn start_ranks(command: &Command) -> Option<Res<()>> {
    let (n, name) = command.tensor_parallel();
    if n <= 1 || std::env::var_os(nuvec::distributed::RANK_VAR).is_some() {
        return None;
    }
    if !matches!(name, "generate" | "bench" | "serve") {
        return Some(Err(format!("--tensor-parallel works with generate, bench and serve, not with {name}").into()));
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    Some(
        std::env::current_exe().map_err(Into::into).and_then(|exe| {
            nuvec::distributed::launch(n, &exe, &args, &[], Duration::from_secs(30)).map_err(Into::into)
        }),
    )
}

/// This rank's group for `--tensor-parallel n` (`None` for 1), started by [`start_ranks`]; a
/// rank other than 0 keeps quiet.
fn rank_group(n: usize) -> Res<Option<nuvec::distributed::Group>> {
    // One group per process: the model's loading and the server ask for it.
    static GROUP: std::sync::OnceLock<Result<nuvec::distributed::Group, String>> = std::sync::OnceLock::new();
    if n <= 1 {
        return Ok(None);
    }
    let group = GROUP.get_or_init(|| nuvec::distributed::init(true).map_err(|e| e.to_string())).clone()?;
    if group.size() != n {
        return Err(format!("--tensor-parallel {n}, but this rank's group has {} ranks", group.size()).into());
    }
    QUIET.store(group.rank() != 0, Ordering::Relaxed);
    Ok(Some(group))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(result) = start_ranks(&cli.command) {
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("nuvec: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let result = run(cli.command);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match std::env::var(nuvec::distributed::RANK_VAR) {
                Ok(r) => eprintln!("nuvec: rank {r}: {e}"),
                Err(_) => eprintln!("nuvec: {e}"),
            }
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Res<()> {
    match command {
        Command::Generate(a) => run_generate(a),
        Command::Chat(a) => run_chat(a),
        Command::Bench(a) => run_bench(a),
        Command::Convert(a) => run_convert(a),
        Command::Serve(a) => run_serve(a),
        Command::Launch(a) => run_launch(a),
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn run_launch(a: LaunchArgs) -> Res<()> {
    let (program, args) = a.command.split_first().ok_or("launch: name a program after --")?;
    if !(a.grace >= 0.0 && a.grace.is_finite()) {
        return Err(format!("launch: --grace {} is not a number of seconds", a.grace).into());
    }
    let grace = Duration::from_secs_f64(a.grace);
    Ok(nuvec::distributed::launch(a.ranks, Path::new(program), args, &[], grace)?)
}

fn load_model(a: &LoadArgs) -> Res<Loaded> {
    let path = match &a.model {
        Some(p) => p.clone(),
        None => fetch::default_model(&mut |msg| eprintln!("nuvec: {msg}"))?,
    };
    let (dtype, quantize) = (parse_dtype(a)?, parse_quantize(a)?);
    let group = rank_group(a.tensor_parallel)?;
    let bar = if QUIET.load(Ordering::Relaxed) { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("a fixed template"));
    bar.set_message(format!("loading {}", display_name(&path)));
    bar.enable_steady_tick(Duration::from_millis(100));
    let options = LoadOptions { dtype, quantize, group };
    let loaded = if a.random_weights { nuvec_lm::load_random(&path, &options, 0) } else { load(&path, &options) };
    let loaded = loaded.and_then(|l| {
        // Read every weight now, so that the first token's time is the model's.
        let params: Vec<nuvec::Array> = l.model.parameters().into_values().collect();
        nuvec::eval(&params)?;
        Ok(l)
    });
    bar.finish_and_clear();
    Ok(loaded?)
}

fn parse_dtype(a: &LoadArgs) -> Res<Option<DType>> {
    Ok(match a.dtype.as_deref() {
        None => None,
        Some("float32" | "f32") => Some(DType::F32),
        Some("float16" | "f16") => Some(DType::F16),
        Some("bfloat16" | "bf16") => Some(DType::BF16),
        Some(other) => return Err(format!("--dtype {other}: use float32, float16 or bfloat16").into()),
    })
}

/// `--quantize BITS,GROUP` as `(group, bits)`.
fn parse_quantize(a: &LoadArgs) -> Res<Option<(i32, i32)>> {
    let Some(s) = a.quantize.as_deref() else { return Ok(None) };
    let parts: Vec<Option<i32>> = s.split(',').map(|x| x.trim().parse::<i32>().ok()).collect();
    match parts.as_slice() {
        [Some(bits), Some(group)] => Ok(Some((*group, *bits))),
        _ => Err(format!("--quantize {s}: give BITS,GROUP, e.g. 4,64").into()),
    }
}

fn display_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

fn sampler(a: &ModelArgs) -> SamplerOptions {
    SamplerOptions {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        seed: a.seed,
        ..Default::default()
    }
}

/// The prompt text of `messages` ([`nuvec_lm::Tokenizer::chat_prompt`]).
fn render(m: &Loaded, messages: &[Value]) -> Res<String> {
    Ok(m.tokenizer.chat_prompt(&Value::from(messages.to_vec()), None)?)
}

/// Token ids of a rendered prompt ([`nuvec_lm::Tokenizer::encode_prompt`]).
fn encode(m: &Loaded, text: &str) -> Res<Vec<u32>> {
    Ok(m.tokenizer.encode_prompt(text)?)
}

fn new_cache(m: &Loaded, a: &ModelArgs) -> PromptCache {
    match (a.max_kv_size, a.kv_bits, a.kv_block_size) {
        (Some(n), ..) => PromptCache::rotating(m.model.as_ref(), n),
        (None, Some(bits), _) => PromptCache::quantized(m.model.as_ref(), a.kv_group_size, bits),
        (None, None, Some(bs)) => PromptCache::paged(m.model.as_ref(), bs),
        (None, None, None) => PromptCache::new(m.model.as_ref()),
    }
}

fn run_generate(a: GenerateArgs) -> Res<()> {
    // What a batch cannot do is refused, not ignored.
    let unsupported = [
        ("--max-kv-size", a.model.max_kv_size.is_some()),
        ("--kv-bits", a.model.kv_bits.is_some()),
        ("--kv-block-size", a.model.kv_block_size.is_some()),
        ("--draft-model", a.draft_model.is_some()),
        ("--prompt-lookup", a.prompt_lookup.is_some()),
    ];
    if let (n @ 2.., Some((flag, _))) = (a.prompt.len(), unsupported.iter().find(|(_, given)| *given)) {
        return Err(format!("{flag} works with one --prompt, not with a batch of {n}").into());
    }
    let m = load_model(&a.model.load)?;
    let mut ids = Vec::new();
    for prompt in &a.prompt {
        let prompt = if prompt == "-" {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
            s
        } else {
            prompt.clone()
        };
        let text = if a.ignore_chat_template {
            prompt
        } else {
            let mut messages = Vec::new();
            if let Some(s) = &a.model.system {
                messages.push(json!({"role": "system", "content": s}));
            }
            messages.push(json!({"role": "user", "content": prompt}));
            render(&m, &messages)?
        };
        ids.push(encode(&m, &text)?);
    }
    let options = GenerateOptions {
        max_tokens: a.model.max_tokens,
        sampler: sampler(&a.model),
        stop: a.stop,
        decode_graph: a.model.no_graph.then_some(false),
        ..Default::default()
    };
    if ids.len() > 1 {
        let start = Instant::now();
        let outputs = nuvec_lm::generate_batch(m.model.as_ref(), Some(&m.tokenizer), &ids, &m.eos, &options)?;
        let seconds = start.elapsed().as_secs_f64();
        for (i, o) in outputs.iter().enumerate() {
            say!("========== {i}\n{}", o.text);
        }
        let tokens: usize = outputs.iter().map(|o| o.tokens.len()).sum();
        say!("==========");
        say!("Batch: {} prompts, {tokens} tokens generated, {:.3} tokens-per-sec", ids.len(), tokens as f64 / seconds);
        say!("Peak memory: {:.3} GB", nuvec_lm::generate::peak_memory() as f64 / 1e9);
        return Ok(());
    }
    let ids = ids.remove(0);
    let mut cache = new_cache(&m, &a.model);
    let draft_model = match &a.draft_model {
        Some(p) => Some(nuvec_lm::load_model(
            p,
            &LoadOptions { dtype: parse_dtype(&a.model.load)?, quantize: None, ..Default::default() },
        )?),
        None => None,
    };
    let draft = match (&draft_model, a.prompt_lookup) {
        (Some(d), _) => Some(Draft::model(d.as_ref())),
        (None, Some(n)) => Some(Draft::PromptLookup { ngram: n }),
        (None, None) => None,
    };
    say!("==========");
    let stats = stream(&m, &mut cache, &ids, options, draft.map(|d| (d, a.num_draft)))?;
    say!("\n==========");
    print_stats(&stats);
    Ok(())
}

/// Streams a generation (speculative with a draft and its proposals per step) to standard
/// output; its stats.
fn stream(
    m: &Loaded,
    cache: &mut PromptCache,
    ids: &[u32],
    options: GenerateOptions,
    draft: Option<(Draft<'_>, usize)>,
) -> Res<Stats> {
    let mut out: Box<dyn Write> =
        if QUIET.load(Ordering::Relaxed) { Box::new(std::io::sink()) } else { Box::new(std::io::stdout().lock()) };
    let mut generation = generate(m.model.as_ref(), Some(&m.tokenizer), cache, ids, &m.eos, options)?;
    if let Some((d, k)) = draft {
        generation = generation.speculative(d, k)?;
    }
    for token in generation.by_ref() {
        out.write_all(token?.text.as_bytes())?;
        out.flush()?;
    }
    Ok(generation.stats)
}

fn print_stats(s: &Stats) {
    say!("Prompt: {} tokens, {:.3} tokens-per-sec", s.prompt_tokens, s.prompt_tps());
    say!("Generation: {} tokens, {:.3} tokens-per-sec", s.generation_tokens, s.generation_tps());
    say!("Peak memory: {:.3} GB", s.peak_memory as f64 / 1e9);
}

fn run_convert(a: ConvertArgs) -> Res<()> {
    let mut m = load_model(&a.model.load)?;
    nuvec_lm::save(m.model.as_mut(), &m.tokenizer, &a.out)?;
    eprintln!("nuvec: wrote {}", a.out.display());
    Ok(())
}

fn run_chat(a: ModelArgs) -> Res<()> {
    let m = load_model(&a.load)?;
    let mut messages: Vec<Value> = Vec::new();
    if let Some(s) = &a.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    let mut cache = new_cache(&m, &a);
    eprintln!("nuvec chat: type a message; 'q' or an empty line at the end of input quits, 'r' resets.");
    let stdin = std::io::stdin();
    loop {
        eprint!(">> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim() == "q" {
            return Ok(());
        }
        if line.trim() == "r" {
            messages.retain(|m| m["role"] == "system");
            cache = new_cache(&m, &a);
            continue;
        }
        messages.push(json!({"role": "user", "content": line.trim_end()}));
        let ids = encode(&m, &render(&m, &messages)?)?;
        let options = GenerateOptions {
            max_tokens: a.max_tokens,
            sampler: sampler(&a),
            decode_graph: a.no_graph.then_some(false),
            ..Default::default()
        };
        let mut reply = String::new();
        {
            let mut out = std::io::stdout().lock();
            let mut generation = generate(m.model.as_ref(), Some(&m.tokenizer), &mut cache, &ids, &m.eos, options)?;
            for token in generation.by_ref() {
                let t = token?;
                reply.push_str(&t.text);
                out.write_all(t.text.as_bytes())?;
                out.flush()?;
            }
        }
        println!();
        messages.push(json!({"role": "assistant", "content": reply}));
    }
}

fn run_bench(a: BenchArgs) -> Res<()> {
    // The bench measures contiguous caches, or paged ones with --kv-block-size.
    if let Some((flag, _)) =
        [("--max-kv-size", a.model.max_kv_size.is_some()), ("--kv-bits", a.model.kv_bits.is_some())]
            .into_iter()
            .find(|(_, given)| *given)
    {
        return Err(format!("bench: {flag} is not measured (--kv-block-size is)").into());
    }
    let (model, name) = match &a.random {
        Some(config) => {
            let options = LoadOptions {
                dtype: parse_dtype(&a.model.load)?,
                quantize: parse_quantize(&a.model.load)?,
                group: rank_group(a.model.load.tensor_parallel)?,
            };
            let m = nuvec_lm::random_model(config, &options, 0)?;
            let params: Vec<nuvec::Array> = m.parameters().into_values().collect();
            nuvec::eval(&params)?;
            (m, format!("random weights, {}", display_name(config)))
        }
        None => {
            let l = load_model(&a.model.load)?;
            let name = display_name(&l.path);
            (l.model, name)
        }
    };
    let model = model.as_ref();
    let vocab = model.config().vocab_size as u32;
    let device = if nuvec_lm::load::on_gpu() { "gpu" } else { "cpu" };
    let repeats = a.repeats.max(1);
    // A fixed token sequence, the same for every model.
    let ids =
        |n: usize| -> Vec<u32> { (0..n as u64).map(|i| ((i * 2_654_435_761 + 7) % vocab as u64) as u32).collect() };
    say!(
        "device {device}, model {name}, quantize {:?}, tensor parallel {}",
        a.model.load.quantize,
        a.model.load.tensor_parallel
    );
    let mut prefill = Vec::new();
    say!("{:>8} {:>14} {:>10}", "prompt", "prefill tok/s", "TTFT ms");
    for &n in &a.prompt_tokens {
        let mut best = f64::INFINITY;
        for _ in 0..repeats {
            let mut cache = PromptCache::new(model);
            let options = GenerateOptions { max_tokens: 1, ..Default::default() };
            let start = Instant::now();
            for t in generate(model, None, &mut cache, &ids(n), &[], options)? {
                t?;
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
        say!("{:>8} {:>14.1} {:>10.2}", n, n as f64 / best, best * 1e3);
        prefill.push(json!({"prompt_tokens": n, "ttft_s": best, "prefill_tokens_per_s": n as f64 / best}));
    }
    let mut decode = Vec::new();
    say!("{:>8} {:>14} {:>10}", "batch", "decode tok/s", "ms/step");
    for &b in &a.batch {
        let mut best = f64::INFINITY;
        for _ in 0..repeats {
            let graph = !a.model.no_graph;
            let context = ids(a.context.max(1));
            best = best.min(decode_seconds(model, b, &context, a.steps.max(1), graph, a.model.kv_block_size)?);
        }
        let tps = b as f64 * a.steps as f64 / best;
        say!("{:>8} {:>14.1} {:>10.3}", b, tps, best / a.steps as f64 * 1e3);
        decode.push(json!({"batch": b, "context": a.context, "steps": a.steps, "decode_tokens_per_s": tps}));
    }
    let peak = nuvec_lm::generate::peak_memory();
    say!("peak memory {:.3} GB", peak as f64 / 1e9);
    if let Some(path) = a.json.as_ref().filter(|_| !QUIET.load(Ordering::Relaxed)) {
        let doc = json!({"device": device, "model": name, "quantize": a.model.load.quantize, "prefill": prefill,
                         "decode": decode, "peak_memory_bytes": peak});
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}

/// Seconds for `steps` greedy decode steps of `batch` rows after a `prompt` prefill, each
/// step started before the previous token is read (as generation runs); with `graph`, through
/// the recorded decode step where the model allows it; paged caches of blocks of `block`
/// positions, if given.
fn decode_seconds(
    model: &dyn nuvec_lm::LanguageModel,
    batch: i32,
    prompt: &[u32],
    steps: usize,
    graph: bool,
    block: Option<i32>,
) -> Res<f64> {
    let mut cache = match block {
        Some(bs) => PromptCache::paged(model, bs).layers,
        None => model.new_cache(),
    };
    let row: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let all: Vec<i32> = (0..batch).flat_map(|_| row.iter().copied()).collect();
    let logits = model.forward(&nuvec::Array::from_slice(&all, [batch, row.len() as i32]), &mut cache);
    let mut next = nuvec_lm::last_logits(&logits).argmax_keepdims(-1);
    nuvec::eval(&[next.clone()])?;
    let mut graph = match graph && model.device_positions() && nuvec_lm::load::on_gpu() {
        true => Some(nuvec_lm::DecodeGraph::new(batch)?),
        false => None,
    };
    // Two steps untimed: the recorded step is made on the second.
    let mut step = |next: &nuvec::Array| -> Res<nuvec::Array> {
        Ok(match &mut graph {
            Some(g) => g.step(model, &mut cache, next)?,
            None => model.forward(&next.astype(DType::I32), &mut cache),
        })
    };
    for _ in 0..2 {
        next = step(&next)?.argmax(-1);
        next.astype(DType::I32).to_vec::<i32>()?;
    }
    let start = Instant::now();
    for _ in 0..steps {
        let logits = step(&next)?;
        let following = logits.argmax(-1);
        nuvec::async_eval(std::slice::from_ref(&following))?;
        // Reading the previous step back is what a generator does each token.
        next.astype(DType::I32).to_vec::<i32>()?;
        next = following;
    }
    next.astype(DType::I32).to_vec::<i32>()?;
    Ok(start.elapsed().as_secs_f64())
}

fn run_serve(a: ServeArgs) -> Res<()> {
    let m = load_model(&a.load)?;
    let options = nuvec_serve::ServeOptions {
        host: a.host,
        port: a.port,
        model_id: a.model_id,
        // A GPU's decode step costs little more for many rows; a CPU's grows with them.
        max_batch: a.max_batch.unwrap_or(if nuvec::default_device().is_cpu() { 16 } else { 256 }),
        max_queue: a.max_queue,
        default_max_tokens: a.max_tokens,
        default_temperature: a.temperature,
        api_key: a.api_key,
        prompt_cache: a.prompt_cache,
        prefill_chunk: a.prefill_chunk,
        prefill_rows: a.prefill_rows,
        kv_block_size: a.kv_block_size,
        kv_cache_tokens: a.kv_cache_tokens,
        group: rank_group(a.load.tensor_parallel)?,
        ..Default::default()
    };
    if options.group.as_ref().is_some_and(|g| g.rank() > 0) {
        // The other ranks step as rank 0's server tells them.
        return Ok(nuvec_serve::follow(m, options)?);
    }
    let server = nuvec_serve::Server::start(m, options)?;
    eprintln!("nuvec: serving on http://{} (OpenAI API under /v1; Ctrl-C stops)", server.addr());
    Ok(server.wait()?)
}
