//! GPU benchmark of nuvec's fused operations (`nuvec::fast`) on GPU 0: RMS norm forward and
//! backward, the residual add + RMS norm, layer norm forward and backward, SwiGLU forward and
//! backward, rotary embeddings (prefill, decode, backward) and the cross-entropy loss (forward,
//! and forward with the logits' gradient), each as a bandwidth against the copy ceiling; and
//! scaled-dot-product attention with grouped heads, decoding as a bandwidth and prefill in
//! TFLOP/s; and Gated DeltaNet's recurrence (`fast::gated_delta`), decoding as a bandwidth over
//! its state and prefill in TFLOP/s. All bf16 (the recurrence's state and gate are float32).
//!
//! ```text
//! cargo run --release -p nuvec --example bench_fast                       # every case
//! cargo run --release -p nuvec --example bench_fast -- --out fast.tsv     # also write the TSV lines
//! cargo run --release -p nuvec --example bench_fast -- --only rms_norm    # cases whose name contains "rms_norm"
//! cargo run --release -p nuvec --example bench_fast -- --only sdpa        # the attention cases
//! cargo run --release -p nuvec --example bench_fast -- --only gated_delta # the recurrence's cases
//! NUVEC_GDN_PACKED=0 cargo run --release -p nuvec --example bench_fast -- --only gated_delta
//!                                                                         # without the packed kernel
//! NUVEC_FUSED=0 cargo run --release -p nuvec --example bench_fast         # the compositions instead
//! ```
//!
//! Without a usable GPU it prints why and exits with status 0. `bench/gpu_fast_peers.py` times
//! the same cases in PyTorch (eager, `torch.compile`, `F.rms_norm`, the flash attention
//! backend), Liger Kernel and flash-linear-attention (the gated delta rule), and
//! `scripts/gpu-check.sh` (with `GPU_CHECK_FAST=1`) runs both and prints them side by side.
//!
//! # Method
//!
//! As `bench_gpu`'s (the harness is `bench_harness/mod.rs`): the copy ceiling
//! `ceiling_copy_memcpy` (a 1 GiB `cuMemcpyDtoD`) is measured first, whatever `--only` says;
//! each case runs warm-up iterations, then batches of iterations ending with a synchronize, and
//! reports the median over batches of batch time / iterations; inputs smaller than 3× L2 rotate
//! among copies. A forward iteration records the operation and evaluates its outputs. A backward
//! iteration records the operation inside `nuvec::transforms::vjp_flat`, with a fixed
//! cotangent, and evaluates only the inputs' cotangents: the forward's output, which the
//! derivative kernels do not read, is never computed, and tracing is part of the time as it is
//! in a training step. `cross_entropy_fwdbwd_*` evaluates the loss and the logits' cotangent in
//! one `eval`, with the cotangent `1/N` per row (the gradient of the mean loss), which runs
//! both as one kernel (`FastOp::CrossEntropyWithGrad`, one read of the logits). An attention
//! iteration records `fast::scaled_dot_product_attention` and evaluates its output; before it
//! is timed, a line `# <name>: plan <kernel> (...)` gives `fast::plan_attention`'s route for
//! its shapes (`Vector { passes, blocks }`, `Tiled`, `Composed`, `ComposedBlocks { rows }`):
//! without a tiled kernel, prefill runs as the composition, which holds the scores
//! (`B·32·L·L` of them, 1 GiB in bf16 at B1 L4096, 4 GiB at B4 L4096 and at B1 L8192 full).
//!
//! # Cases and bytes
//!
//! Bytes are those an ideal kernel reads plus writes (bf16: 2 bytes; int32 targets and `float32`
//! losses and cotangents of the loss: 4), per iteration:
//!
//! * `rms_norm_fwd_bf16_{T}x{H}`, T in {1, 16, 4096, 32768}, H in {2048, 4096, 8192}: read
//!   `x` and `w`, write `y`.
//! * `rms_norm_bwd_bf16_{T}x{H}`, T in {16, 4096, 32768}: read `x`, `g`, `w`, write `dx`,
//!   `dw`.
//! * `add_rms_norm_fwd_bf16_{T}x4096`, T in {4096, 32768}: read `x`, `r`, `w`, write `h`, `y`.
//! * `layer_norm_fwd_bf16_{T}x4096` (read `x`, `w`, `b`, write `y`) and
//!   `layer_norm_bwd_bf16_{T}x4096` (read `x`, `g`, `w`, write `dx`, `dw`, `db`), T in
//!   {4096, 32768}.
//! * `swiglu_fwd_bf16_{T}x14336` (read gate, up, write out) and `swiglu_bwd_bf16_{T}x14336`
//!   (read gate, up, `g`, write dgate, dup), T in {4096, 32768}.
//! * `rope_fwd_bf16_{B}x32x{T}x128` for (B, T) in {(1, 4096), (4, 4096)},
//!   `rope_fwd_bf16_32x32x1x128_decode` (offset 1000), `rope_bwd_bf16_1x32x4096x128`: read `x`
//!   (or `g`), write the result; base 10000, all 128 dims rotated, halves (not traditional).
//! * `cross_entropy_fwd_bf16_4096x{V}` (read logits and targets, write the loss) and
//!   `cross_entropy_fwdbwd_bf16_4096x{V}` (also read the cotangent and write the logits'
//!   gradient), V in {32000, 128256, 152064}.
//!
//! Attention, `q [B, 32, Lq, 128]` over `k`, `v [B, 8, Lk, 128]` (grouped heads, 4 query heads
//! per key-value head), scale `1/sqrt(128)`:
//!
//! * `sdpa_decode_bf16_B{B}_Lq{Lq}_Lk{Lk}`: read `q`, `k`, `v`, write the output
//!   (`2·B·8·Lk·128·2 + 2·B·32·Lq·128·2` bytes; the cache dominates). Lq = 1 (no mask) for
//!   (B, Lk) in {(1, 4096), (1, 32768), (1, 131072), (8, 8192), (32, 8192), (64, 4096)};
//!   Lq = 4, causal (the queries are the last 4 of the Lk positions, aligned lower right), for
//!   (B, Lk) in {(1, 32768), (32, 8192)}.
//! * `sdpa_prefill_bf16_B{B}_L{L}_{causal|full}`, Lq = Lk = L, in TFLOP/s (unit `TFLOP/s`,
//!   fraction `-`: this benchmark measures no compute ceiling) of `4·B·32·L·L·D` FLOPs (the
//!   two products), halved when causal: D 128 causal at B1 L4096, B4 L4096, B1 L8192, B1 L16384
//!   and B1 L32768, full at B1 L8192 and B8 L4096; `_D64` and `_D256` at B1 L8192, causal and
//!   full.
//! * `sdpa_fwdbwd_bf16_B{B}_L{L}_causal`: the forward and the cotangents of `q`, `k` and `v`
//!   (a training step's attention), in TFLOP/s of 3.5 times the forward's FLOPs (the backward
//!   counted as 2.5, as FlashAttention does), for (B, L) in {(1, 2048), (1, 4096), (4, 4096),
//!   (1, 8192)}. Against the forward cases of the same shapes, the backward alone.
//!
//! Gated DeltaNet at Qwen3-Next's heads: q, k `[B, T, 16, 128]`, v `[B, T, 32, 128]` (bf16),
//! a float32 gate per head in (0.93, 0.98), bf16 beta, a float32 state `[B, 32, 128, 128]`:
//!
//! * `gated_delta_decode_bf16_B{B}`, T = 1, B in {1, 8, 32, 64}: a bandwidth of the state's
//!   bytes read and written (`2·B·32·128·128·4`; q, k, v and y add under 1%), the fraction
//!   against the copy ceiling; `_rows` times the same with a mask that keeps every row, which
//!   runs the one-row-per-warp kernel instead of the packed one.
//! * `gated_delta_prefill_bf16_B1_T{T}`, T in {4096, 8192, 32768}, from a given state, in
//!   TFLOP/s of the recurrence's `7·B·T·32·128·128` FLOPs (decay, `S k`, the update, `S q`),
//!   fraction `-`: the chunked kernels (`NUVEC_GDN_CHUNKED=0`: the packed one); `_rows` as for
//!   decoding.
//! * `gated_delta_bwd_bf16_B1_T{T}`, T in {4096, 8192, 32768}: the derivative alone (the vjp of
//!   `y` and the last state, from a given state, at random cotangents), in TFLOP/s of twice the
//!   forward's FLOPs, `14·B·T·32·128·128`: the chunked backward kernels.
//!
//! A mixture of experts' products at Qwen3-Next's shapes (`ops::gather_mm`): 512 experts of
//! `[512, 2048]` (bf16, read transposed as `SwitchLinear` does), each token's 10 choices sorted
//! by expert as mlx-lm's `SwitchGLU` sorts them, rows `[10·T, 1, 2048]`:
//!
//! * `gather_mm_decode_bf16_T{T}`, T in {1, 8, 64} tokens: GB/s of the distinct chosen experts'
//!   weights, the fraction against the copy ceiling.
//! * `gather_mm_prefill_bf16_T4096`: TFLOP/s of `2·10·T·512·2048`.
//! * `gather_qmm_decode_q4_bf16_T{T}` and `gather_qmm_prefill_q4_bf16_T4096`: the same through
//!   `ops::gather_qmm` with the experts in 4 bits (groups of 64, MLX's affine format), the
//!   decode bandwidth over the chosen experts' packed weights, scales and biases.
//!
//! Latency-bound cases (1 and 16 tokens, decode rope, every attention decode case, every
//! gated delta decode case) add a row `<name>_us`: microseconds per call, unit `us`.
//!
//! # Targets
//!
//! Where the case's main tensor (`x`, gate or logits) is at least 64 MiB: forward at least 85%
//! of the copy ceiling, backward (and forward + backward) at least 75%. Smaller cases, and the
//! attention cases, have none.
//!
//! # `NUVEC_FUSED=0`
//!
//! Backends then decline every fused primitive, so the same case names measure the operations'
//! compositions and their derivatives (attention's plan lines then say `Composed`, or
//! `ComposedBlocks` one row at a time for the 4 causal queries); compare the TSV of such a run
//! with a default one to see what fusion buys.
//!
//! # Output
//!
//! As `bench_gpu`: a table on stdout as cases finish (with the attention cases' `# ... plan`
//! lines), then `name<TAB>value<TAB>unit<TAB>fraction` per case (also written line by line to
//! `--out PATH`); exit status 1 when a case failed.
//! Environment: `NUVEC_BENCH_BATCH_MS` (100), `NUVEC_BENCH_BATCHES` (5, at least 3),
//! `NUVEC_BENCH_WARMUP` (3).

mod bench_harness;

use bench_harness::{Bench, Outputs, Row, copy_ceiling, random, randoms, time_outputs};
use nuvec::transforms::vjp_flat;
use nuvec::{Array, DType, fast, ops};

/// Forward target: fraction of the copy ceiling.
const TARGET_FWD: f64 = 0.85;
/// Backward (and forward + backward) target: fraction of the copy ceiling.
const TARGET_BWD: f64 = 0.75;
/// Main tensors smaller than this finish in a few microseconds, where launches rather than
/// bandwidth decide: no target.
const TARGET_MIN_BYTES: usize = 64 << 20;
/// Every case's dtype.
const DT: DType = DType::BF16;
/// Bytes per element of [`DT`].
const ELEM: usize = 2;
/// Norm epsilon (its value does not change the work).
const EPS: f32 = 1e-5;
/// Attention's query heads (LLaMA-3-8B's).
const ATTN_HQ: i32 = 32;
/// Attention's key-value heads, each shared by `ATTN_HQ / ATTN_HKV` query heads.
const ATTN_HKV: i32 = 8;
/// Attention's head size (of queries, keys and values).
const ATTN_D: i32 = 128;

fn main() {
    bench_harness::main_with("bench_fast", run_all);
}

fn run_all(b: &mut Bench) {
    copy_ceiling(b);
    rms_norm(b);
    add_rms_norm(b);
    layer_norm(b);
    swiglu(b);
    rope(b);
    cross_entropy(b);
    sdpa_decode(b);
    sdpa_prefill(b);
    sdpa_fwdbwd(b);
    gated_delta(b);
    gated_delta_bwd(b);
    gather_mm(b);
    gather_qmm(b);
}

/// `goal` when the main tensor is big enough for bandwidth to decide.
fn target(tensor_bytes: usize, goal: f64) -> Option<f64> {
    (tensor_bytes >= TARGET_MIN_BYTES).then_some(goal)
}

/// Whether `tokens` rows are too few to fill the GPU, so that time per call is what matters.
fn latency_bound(tokens: i32) -> bool {
    tokens <= 16
}

/// A timed operation from a closure; naming the bound here gives the closure its signature.
fn op(f: impl Fn(usize) -> nuvec::Result<Vec<Array>> + 'static) -> Outputs {
    Box::new(f)
}

/// A timed operation of one output.
fn one(f: impl Fn(usize) -> Array + 'static) -> Outputs {
    Box::new(move |i| Ok(vec![f(i)]))
}

/// The cotangents of `primals` through `f` for the output cotangents `cots`. The outputs are
/// dropped unevaluated, so only what the derivative needs runs.
fn grads(f: impl FnOnce(&[Array]) -> Vec<Array>, primals: &[Array], cots: &[Array]) -> nuvec::Result<Vec<Array>> {
    vjp_flat(|p| Ok(f(p)), primals, cots).map(|(_, g)| g)
}

/// A per-feature parameter near 1 (a norm's weight), so that outputs keep their scale.
fn param(h: i32, seed: u32) -> nuvec::Result<Array> {
    let w = (random(&[h], DType::F32, seed)? * 0.25f32 + 1.0f32).astype(DT);
    w.eval()?;
    Ok(w)
}

/// `rms_norm` forward over every shape, backward over those of more than one token.
fn rms_norm(b: &mut Bench) {
    for t in [1i32, 16, 4096, 32768] {
        for h in [2048i32, 4096, 8192] {
            let x_bytes = t as usize * h as usize * ELEM;
            let w_bytes = h as usize * ELEM;
            let k = b.copies(x_bytes);
            let bytes = (2 * x_bytes + w_bytes) as f64;
            let name = format!("rms_norm_fwd_bf16_{t}x{h}");
            b.bandwidth_outputs(&name, bytes, target(x_bytes, TARGET_FWD), latency_bound(t), || {
                let xs = randoms(k, &[t, h], DT, 100)?;
                let w = param(h, 110)?;
                Ok(one(move |i| fast::rms_norm(&xs[i % k], &w, EPS)))
            });
            if t == 1 {
                continue;
            }
            let k = b.copies(2 * x_bytes);
            let bytes = (3 * x_bytes + 2 * w_bytes) as f64;
            let name = format!("rms_norm_bwd_bf16_{t}x{h}");
            b.bandwidth_outputs(&name, bytes, target(x_bytes, TARGET_BWD), latency_bound(t), || {
                let xs = randoms(k, &[t, h], DT, 100)?;
                let gs = randoms(k, &[t, h], DT, 120)?;
                let w = param(h, 110)?;
                Ok(op(move |i| {
                    let fwd = |p: &[Array]| vec![fast::rms_norm(&p[0], &p[1], EPS)];
                    grads(fwd, &[xs[i % k].clone(), w.clone()], &[gs[i % k].clone()])
                }))
            });
        }
    }
}

/// `add_rms_norm` forward: the residual stream `h` and the normalised `y`.
fn add_rms_norm(b: &mut Bench) {
    let h = 4096i32;
    for t in [4096i32, 32768] {
        let x_bytes = t as usize * h as usize * ELEM;
        let k = b.copies(2 * x_bytes);
        let bytes = (4 * x_bytes + h as usize * ELEM) as f64;
        let name = format!("add_rms_norm_fwd_bf16_{t}x{h}");
        b.bandwidth_outputs(&name, bytes, target(x_bytes, TARGET_FWD), false, || {
            let xs = randoms(k, &[t, h], DT, 200)?;
            let rs = randoms(k, &[t, h], DT, 210)?;
            let w = param(h, 220)?;
            Ok(op(move |i| {
                let (h, y) = fast::add_rms_norm(&xs[i % k], &rs[i % k], &w, EPS);
                Ok(vec![h, y])
            }))
        });
    }
}

/// `layer_norm` with weight and bias, forward and backward.
fn layer_norm(b: &mut Bench) {
    let h = 4096i32;
    for t in [4096i32, 32768] {
        let x_bytes = t as usize * h as usize * ELEM;
        let p_bytes = h as usize * ELEM;
        let k = b.copies(x_bytes);
        let name = format!("layer_norm_fwd_bf16_{t}x{h}");
        b.bandwidth_outputs(&name, (2 * x_bytes + 2 * p_bytes) as f64, target(x_bytes, TARGET_FWD), false, || {
            let xs = randoms(k, &[t, h], DT, 300)?;
            let (w, bias) = (param(h, 310)?, random(&[h], DT, 320)?);
            Ok(one(move |i| fast::layer_norm(&xs[i % k], &w, &bias, EPS)))
        });
        let k = b.copies(2 * x_bytes);
        let name = format!("layer_norm_bwd_bf16_{t}x{h}");
        b.bandwidth_outputs(&name, (3 * x_bytes + 3 * p_bytes) as f64, target(x_bytes, TARGET_BWD), false, || {
            let xs = randoms(k, &[t, h], DT, 300)?;
            let gs = randoms(k, &[t, h], DT, 330)?;
            let (w, bias) = (param(h, 310)?, random(&[h], DT, 320)?);
            Ok(op(move |i| {
                let fwd = |p: &[Array]| vec![fast::layer_norm(&p[0], &p[1], &p[2], EPS)];
                grads(fwd, &[xs[i % k].clone(), w.clone(), bias.clone()], &[gs[i % k].clone()])
            }))
        });
    }
}

/// `swiglu` of a LLaMA-3-8B-sized MLP (14336 hidden), forward and backward.
fn swiglu(b: &mut Bench) {
    let ffn = 14336i32;
    for t in [4096i32, 32768] {
        let bytes = t as usize * ffn as usize * ELEM;
        let k = b.copies(2 * bytes);
        let name = format!("swiglu_fwd_bf16_{t}x{ffn}");
        b.bandwidth_outputs(&name, (3 * bytes) as f64, target(bytes, TARGET_FWD), false, || {
            let gates = randoms(k, &[t, ffn], DT, 400)?;
            let ups = randoms(k, &[t, ffn], DT, 410)?;
            Ok(one(move |i| fast::swiglu(&gates[i % k], &ups[i % k])))
        });
        let k = b.copies(3 * bytes);
        let name = format!("swiglu_bwd_bf16_{t}x{ffn}");
        b.bandwidth_outputs(&name, (5 * bytes) as f64, target(bytes, TARGET_BWD), false, || {
            let gates = randoms(k, &[t, ffn], DT, 400)?;
            let ups = randoms(k, &[t, ffn], DT, 410)?;
            let gs = randoms(k, &[t, ffn], DT, 420)?;
            Ok(op(move |i| {
                let fwd = |p: &[Array]| vec![fast::swiglu(&p[0], &p[1])];
                grads(fwd, &[gates[i % k].clone(), ups[i % k].clone()], &[gs[i % k].clone()])
            }))
        });
    }
}

/// `rope` on `[B, 32, T, 128]` (32 heads of 128): prefill, decode at position 1000, and the
/// backward of the single-sequence prefill.
fn rope(b: &mut Bench) {
    const HEADS: i32 = 32;
    const D: i32 = 128;
    let rot = |x: &Array, offset: &Array| fast::rope(x, D, false, Some(10000.0), 1.0, offset, None);
    for (batch, t, offset, tag) in [(1i32, 4096i32, 0i32, ""), (4, 4096, 0, ""), (32, 1, 1000, "_decode")] {
        let shape = [batch, HEADS, t, D];
        let x_bytes = (batch * HEADS * t * D) as usize * ELEM;
        let k = b.copies(x_bytes);
        let name = format!("rope_fwd_bf16_{batch}x{HEADS}x{t}x{D}{tag}");
        b.bandwidth_outputs(&name, (2 * x_bytes) as f64, target(x_bytes, TARGET_FWD), latency_bound(t), || {
            let xs = randoms(k, &shape, DT, 500)?;
            let off = Array::from(offset);
            Ok(one(move |i| rot(&xs[i % k], &off)))
        });
    }
    let (batch, t) = (1i32, 4096i32);
    let shape = [batch, HEADS, t, D];
    let x_bytes = (batch * HEADS * t * D) as usize * ELEM;
    let k = b.copies(x_bytes);
    let name = format!("rope_bwd_bf16_{batch}x{HEADS}x{t}x{D}");
    b.bandwidth_outputs(&name, (2 * x_bytes) as f64, target(x_bytes, TARGET_BWD), false, || {
        let xs = randoms(k, &shape, DT, 500)?;
        let gs = randoms(k, &shape, DT, 510)?;
        let off = Array::from(0i32);
        Ok(op(move |i| grads(|p: &[Array]| vec![rot(&p[0], &off)], &[xs[i % k].clone()], &[gs[i % k].clone()])))
    });
}

/// `cross_entropy` over 4096 rows of LLaMA-2, LLaMA-3 and Qwen-2 vocabularies: the loss alone,
/// and the loss with the logits' gradient.
fn cross_entropy(b: &mut Bench) {
    let n = 4096i32;
    for v in [32000i32, 128256, 152064] {
        let l_bytes = n as usize * v as usize * ELEM;
        let k = b.copies(l_bytes);
        // Targets spread over the vocabulary, all in range.
        let targets = || -> nuvec::Result<Array> {
            let t = (ops::arange_dtype(0, n, 1, DType::I32) * 7919i32) % v;
            t.eval()?;
            Ok(t)
        };
        let name = format!("cross_entropy_fwd_bf16_{n}x{v}");
        b.bandwidth_outputs(&name, (l_bytes + 8 * n as usize) as f64, target(l_bytes, TARGET_FWD), false, || {
            let ls = randoms(k, &[n, v], DT, 600)?;
            let t = targets()?;
            Ok(one(move |i| fast::cross_entropy(&ls[i % k], &t)))
        });
        let name = format!("cross_entropy_fwdbwd_bf16_{n}x{v}");
        let bytes = (2 * l_bytes + 12 * n as usize) as f64;
        b.bandwidth_outputs(&name, bytes, target(l_bytes, TARGET_BWD), false, || {
            let ls = randoms(k, &[n, v], DT, 600)?;
            let t = targets()?;
            // The cotangent of the mean loss.
            let g = ops::full([n], 1.0f32 / n as f32);
            g.eval()?;
            Ok(op(move |i| {
                let (mut outs, mut gs) = vjp_flat(
                    |p| Ok(vec![fast::cross_entropy(&p[0], &t)]),
                    &[ls[i % k].clone()],
                    std::slice::from_ref(&g),
                )?;
                Ok(vec![outs.remove(0), gs.remove(0)])
            }))
        });
    }
}

/// Elements of `shape`.
fn elems(shape: &[i32]) -> usize {
    shape.iter().map(|&d| d as usize).product()
}

/// Attention's scale, `1/sqrt(D)`.
fn attn_scale() -> f32 {
    (ATTN_D as f32).sqrt().recip()
}

/// Prints, as a `#` line, how `fast::plan_attention` routes an attention of these shapes (the
/// kernel, or the composition), so that the run shows which route each case timed.
fn show_plan(name: &str, q: &[i32], kv: &[i32], opts: &fast::AttentionOptions<'_>) {
    match fast::plan_attention(q, kv, kv, DT, opts) {
        Ok(p) => println!(
            "# {name}: plan {:?} (scratch {} B, largest intermediate {} B)",
            p.kernel, p.scratch_bytes, p.max_intermediate_bytes
        ),
        Err(e) => println!("# {name}: no plan: {}", e.to_string().lines().next().unwrap_or("")),
    }
}

/// A case in TFLOP/s, `flops` per iteration of an [`Outputs`] operation. Unlike the harness's
/// `Bench::compute` (matrix products, against the matmul ceiling that `bench_gpu` measures and
/// this benchmark does not), it has no ceiling and no target: its fraction is `-`.
fn tflops_case(b: &mut Bench, name: &str, flops: f64, setup: impl FnOnce() -> nuvec::Result<Outputs>) {
    if !b.wanted(name) {
        return;
    }
    // The operation and its inputs are dropped before the cache is cleared.
    let result = setup().and_then(|op| time_outputs(&*op));
    let _ = nuvec::cuda::clear_cache(0);
    match result {
        Ok(t) => b.push(Row {
            name: name.into(),
            value: flops / t.median / 1e12,
            unit: "TFLOP/s",
            fraction: None,
            target: String::new(),
            detail: Bench::detail(&t),
        }),
        Err(e) => b.failed(name, "TFLOP/s", &e),
    }
}

/// `scaled_dot_product_attention` decoding over a key-value cache: `q [B, 32, Lq, 128]`,
/// `k`, `v [B, 8, Lk, 128]`; one query without a mask, or 4 causal queries (the last 4 of the
/// `Lk` positions: speculative verification). A bandwidth (the cache read once), and the
/// microseconds per call.
fn sdpa_decode(b: &mut Bench) {
    let scale = attn_scale();
    let shapes = [
        (1i32, 1i32, 4096i32),
        (1, 1, 32768),
        (1, 1, 131072),
        (8, 1, 8192),
        (32, 1, 8192),
        (64, 1, 4096),
        (1, 4, 32768),
        (32, 4, 8192),
    ];
    for (batch, lq, lk) in shapes {
        let q_shape = [batch, ATTN_HQ, lq, ATTN_D];
        let kv_shape = [batch, ATTN_HKV, lk, ATTN_D];
        let (q_bytes, kv_bytes) = (elems(&q_shape) * ELEM, elems(&kv_shape) * ELEM);
        // A single query attends every key, causal or not: it takes no mask.
        let opts = if lq > 1 { fast::AttentionOptions::causal() } else { fast::AttentionOptions::default() };
        // Read q, k and v, write the output (q's size).
        let bytes = (2 * kv_bytes + 2 * q_bytes) as f64;
        let k = b.copies(2 * kv_bytes + q_bytes);
        let name = format!("sdpa_decode_bf16_B{batch}_Lq{lq}_Lk{lk}");
        b.bandwidth_outputs(&name, bytes, None, true, || {
            show_plan(&name, &q_shape, &kv_shape, &opts);
            let qs = randoms(k, &q_shape, DT, 700)?;
            let ks = randoms(k, &kv_shape, DT, 710)?;
            let vs = randoms(k, &kv_shape, DT, 720)?;
            Ok(one(move |i| fast::scaled_dot_product_attention(&qs[i % k], &ks[i % k], &vs[i % k], scale, &opts)))
        });
    }
}

/// `scaled_dot_product_attention` forward over a whole sequence (prefill): `q [B, 32, L, D]`,
/// `k`, `v [B, 8, L, D]`, causal or full, in TFLOP/s of `4·B·Hq·L²·D` (half that causal); D is
/// 128 unless the name ends in `_D{D}`.
fn sdpa_prefill(b: &mut Bench) {
    for (batch, l, causal, d) in PREFILL {
        let scale = (d as f32).sqrt().recip();
        let q_shape = [batch, ATTN_HQ, l, d];
        let kv_shape = [batch, ATTN_HKV, l, d];
        let opts = if causal { fast::AttentionOptions::causal() } else { fast::AttentionOptions::default() };
        // q·kᵀ and p·v, 2 FLOPs per multiply-add each; causal (Lq == Lk) attends half the keys.
        let full = 4.0 * f64::from(batch) * f64::from(ATTN_HQ) * f64::from(l) * f64::from(l) * f64::from(d);
        let flops = if causal { full / 2.0 } else { full };
        let k = b.copies((elems(&q_shape) + 2 * elems(&kv_shape)) * ELEM);
        let suffix = if d == ATTN_D { String::new() } else { format!("_D{d}") };
        let name = format!("sdpa_prefill_bf16_B{batch}_L{l}_{}{suffix}", if causal { "causal" } else { "full" });
        tflops_case(b, &name, flops, || {
            show_plan(&name, &q_shape, &kv_shape, &opts);
            let qs = randoms(k, &q_shape, DT, 730)?;
            let ks = randoms(k, &kv_shape, DT, 740)?;
            let vs = randoms(k, &kv_shape, DT, 750)?;
            Ok(one(move |i| fast::scaled_dot_product_attention(&qs[i % k], &ks[i % k], &vs[i % k], scale, &opts)))
        });
    }
}

/// The prefill cases: (B, L, causal, D).
const PREFILL: [(i32, i32, bool, i32); 11] = [
    (1, 4096, true, 128),
    (4, 4096, true, 128),
    (1, 8192, true, 128),
    (1, 8192, false, 128),
    (1, 16384, true, 128),
    (8, 4096, false, 128),
    (1, 32768, true, 128),
    (1, 8192, true, 64),
    (1, 8192, false, 64),
    (1, 8192, true, 256),
    (1, 8192, false, 256),
];

/// Attention's forward and the cotangents of `q`, `k` and `v` (causal, Lq = Lk = L), in
/// TFLOP/s of 3.5 times the forward's FLOPs.
fn sdpa_fwdbwd(b: &mut Bench) {
    let scale = attn_scale();
    for (batch, l) in [(1i32, 2048i32), (1, 4096), (4, 4096), (1, 8192)] {
        let q_shape = [batch, ATTN_HQ, l, ATTN_D];
        let kv_shape = [batch, ATTN_HKV, l, ATTN_D];
        let opts = fast::AttentionOptions::causal();
        let forward = 2.0 * f64::from(batch) * f64::from(ATTN_HQ) * f64::from(l) * f64::from(l) * f64::from(ATTN_D);
        let k = b.copies((2 * elems(&q_shape) + 2 * elems(&kv_shape)) * ELEM);
        let name = format!("sdpa_fwdbwd_bf16_B{batch}_L{l}_causal");
        tflops_case(b, &name, 3.5 * forward, || {
            show_plan(&name, &q_shape, &kv_shape, &opts);
            let qs = randoms(k, &q_shape, DT, 760)?;
            let ks = randoms(k, &kv_shape, DT, 770)?;
            let vs = randoms(k, &kv_shape, DT, 780)?;
            let cots = randoms(k, &q_shape, DT, 790)?;
            Ok(Box::new(move |i| {
                let f = |x: &[Array]| vec![fast::scaled_dot_product_attention(&x[0], &x[1], &x[2], scale, &opts)];
                let (q, kk, v) = (qs[i % k].clone(), ks[i % k].clone(), vs[i % k].clone());
                grads(f, &[q, kk, v], std::slice::from_ref(&cots[i % k]))
            }))
        });
    }
}

/// Gated DeltaNet's query and key heads (Qwen3-Next's).
const GDN_HK: i32 = 16;
/// Its value heads, each reading key head `h / 2`.
const GDN_HV: i32 = 32;
/// Its head size, of keys and values.
const GDN_D: i32 = 128;

/// One gated delta call's inputs: q, k (of length about 1/2, as the model's normalised ones
/// give a contracting recurrence), v, a float32 gate per head, bf16 beta, a float32 state.
struct GdnInputs {
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    state: Array,
}

fn gdn_inputs(batch: i32, t: i32, seed: u32) -> nuvec::Result<GdnInputs> {
    let qk = [batch, t, GDN_HK, GDN_D];
    let per_head = [batch, t, GDN_HV];
    let scale = (GDN_D as f32).sqrt().recip();
    let q = (random(&qk, DType::F32, seed)? * scale).astype(DT);
    let k = (random(&qk, DType::F32, seed + 1)? * scale).astype(DT);
    let v = random(&[batch, t, GDN_HV, GDN_D], DT, seed + 2)?;
    let g = random(&per_head, DType::F32, seed + 3)? * 0.025f32 + 0.955f32;
    let beta = (random(&per_head, DType::F32, seed + 4)? * 0.25f32 + 0.5f32).astype(DT);
    let state = random(&[batch, GDN_HV, GDN_D, GDN_D], DType::F32, seed + 5)? * 0.1f32;
    nuvec::eval(&[&q, &k, &g, &beta, &state])?;
    Ok(GdnInputs { q, k, v, g, beta, state })
}

/// `fast::gated_delta` at Qwen3-Next's heads: decoding (one step) as a bandwidth over the
/// state, prefill in TFLOP/s of the recurrence's FLOPs; each by the packed kernel and (`_rows`,
/// through a mask that keeps every step) the row kernel.
fn gated_delta(b: &mut Bench) {
    for batch in [1i32, 8, 32, 64] {
        let state_bytes = (batch * GDN_HV * GDN_D * GDN_D) as usize * 4;
        let k = b.copies(state_bytes);
        for (suffix, masked) in [("", false), ("_rows", true)] {
            let name = format!("gated_delta_decode_bf16_B{batch}{suffix}");
            b.bandwidth_outputs(&name, (2 * state_bytes) as f64, None, true, || {
                let xs: Vec<GdnInputs> =
                    (0..k).map(|j| gdn_inputs(batch, 1, 800 + 10 * j as u32)).collect::<Result<_, _>>()?;
                let mask = masked.then(|| ops::ones(&[batch, 1][..], DType::Bool));
                let options = fast::StepOptions { storage: None, mask };
                Ok(op(move |i| {
                    let x = &xs[i % k];
                    let (y, s) = fast::gated_delta_with(&x.q, &x.k, &x.v, &x.g, &x.beta, Some(&x.state), &options);
                    Ok(vec![y, s])
                }))
            });
        }
    }
    for t in [4096i32, 8192, 32768] {
        let flops = 7.0 * f64::from(t) * f64::from(GDN_HV) * f64::from(GDN_D) * f64::from(GDN_D);
        let k = b.copies((2 * GDN_HK + GDN_HV) as usize * t as usize * GDN_D as usize * ELEM);
        for (suffix, masked) in [("", false), ("_rows", true)] {
            let name = format!("gated_delta_prefill_bf16_B1_T{t}{suffix}");
            tflops_case(b, &name, flops, || {
                let xs: Vec<GdnInputs> =
                    (0..k).map(|j| gdn_inputs(1, t, 850 + 10 * j as u32)).collect::<Result<_, _>>()?;
                let mask = masked.then(|| ops::ones(&[1, t][..], DType::Bool));
                let options = fast::StepOptions { storage: None, mask };
                Ok(op(move |i| {
                    let x = &xs[i % k];
                    let (y, s) = fast::gated_delta_with(&x.q, &x.k, &x.v, &x.g, &x.beta, Some(&x.state), &options);
                    Ok(vec![y, s])
                }))
            });
        }
    }
}

/// The derivative of `fast::gated_delta` alone at Qwen3-Next's heads (the forward's outputs
/// are never evaluated: the vjp primitive takes the inputs and the cotangents), in TFLOP/s of
/// twice the forward's FLOPs.
fn gated_delta_bwd(b: &mut Bench) {
    for t in [4096i32, 8192, 32768] {
        let flops = 14.0 * f64::from(t) * f64::from(GDN_HV) * f64::from(GDN_D) * f64::from(GDN_D);
        let k = b.copies((2 * GDN_HK + 2 * GDN_HV) as usize * t as usize * GDN_D as usize * ELEM);
        tflops_case(b, &format!("gated_delta_bwd_bf16_B1_T{t}"), flops, || {
            let xs: Vec<(GdnInputs, Vec<Array>)> = (0..k)
                .map(|j| -> nuvec::Result<_> {
                    let seed = 870 + 10 * j as u32;
                    let dy = random(&[1, t, GDN_HV, GDN_D], DT, seed + 6)?;
                    let ds = random(&[1, GDN_HV, GDN_D, GDN_D], DType::F32, seed + 7)? * 0.1f32;
                    nuvec::eval(&[&dy, &ds])?;
                    Ok((gdn_inputs(1, t, seed)?, vec![dy, ds]))
                })
                .collect::<Result<_, _>>()?;
            Ok(op(move |i| {
                let (x, cots) = &xs[i % k];
                let primals = [&x.q, &x.k, &x.v, &x.g, &x.beta, &x.state].map(Array::clone);
                let f = |a: &[Array]| {
                    let (y, s) = fast::gated_delta(&a[0], &a[1], &a[2], &a[3], &a[4], Some(&a[5]));
                    Ok(vec![y, s])
                };
                Ok(nuvec::transforms::vjp_flat(f, &primals, cots)?.1)
            }))
        });
    }
}

/// Experts of the mixture-of-experts cases, and their rows and columns (Qwen3-Next's).
const MOE_E: i32 = 512;
const MOE_N: i32 = 512;
const MOE_K: i32 = 2048;
/// Experts per token.
const MOE_TOP: i32 = 10;

/// Token `t`'s `j`-th expert in set `c` (distinct over `j`; bench/gpu_fast_peers.py picks alike).
fn moe_expert(t: i32, j: i32, c: i32) -> i32 {
    (t * 37 + j * 53 + c * 101 + (t * t * 7) % MOE_E) % MOE_E
}

/// `T` tokens' choices in set `c`, sorted, and how many distinct experts they name.
fn moe_choices(t: i32, c: i32) -> (Vec<u32>, usize) {
    let mut v: Vec<u32> = (0..t).flat_map(|t| (0..MOE_TOP).map(move |j| moe_expert(t, j, c) as u32)).collect();
    v.sort_unstable();
    let mut d = v.clone();
    d.dedup();
    (v, d.len())
}

/// `T` tokens' rows `[10·T, 1, 2048]` (random, `seed`) and their sorted choices in set `c`,
/// evaluated.
fn moe_rows(t: i32, c: i32, seed: u32) -> nuvec::Result<(Array, Array)> {
    let (idx, _) = moe_choices(t, c);
    let x = random(&[t * MOE_TOP, 1, MOE_K], DT, seed)?;
    let idx = Array::from_slice(&idx, [t * MOE_TOP]);
    nuvec::eval(&[&x, &idx])?;
    Ok((x, idx))
}

/// `ops::gather_qmm` through the same experts quantized to 4 bits in groups of 64 (MLX's
/// affine format): decoding as a bandwidth over the chosen experts' packed weights, scales and
/// biases, prefill in TFLOP/s.
fn gather_qmm(b: &mut Bench) {
    let quantized = || -> nuvec::Result<(Array, Array, Array)> {
        let w = (random(&[MOE_E, MOE_N, MOE_K], DType::F32, 900)? * 0.02f32).astype(DT);
        let (wq, s, bias) = ops::quantize(&w, 64, 4, "affine");
        let bias = bias.ok_or_else(|| nuvec::Error::Backend("affine quantization without biases".into()))?;
        nuvec::eval(&[&wq, &s, &bias])?;
        Ok((wq, s, bias))
    };
    // Packed levels, then a scale and a bias per 64.
    let expert_bytes = (MOE_N * MOE_K) as usize / 2 + 2 * (MOE_N * MOE_K / 64) as usize * ELEM;
    let run = |x: &Array, q: &(Array, Array, Array), idx: &Array| {
        ops::gather_qmm(x, &q.0, &q.1, Some(&q.2), None, Some(idx), true, 64, 4, "affine", true)
    };
    for t in [1i32, 8, 64] {
        let (_, distinct) = moe_choices(t, 0);
        let bytes = distinct * expert_bytes;
        let k = b.copies(bytes);
        let name = format!("gather_qmm_decode_q4_bf16_T{t}");
        b.bandwidth_outputs(&name, bytes as f64, None, true, || {
            let q = quantized()?;
            let sets = (0..k).map(|c| moe_rows(t, c as i32, 910 + c as u32)).collect::<Result<Vec<_>, _>>()?;
            Ok(one(move |i| run(&sets[i % k].0, &q, &sets[i % k].1)))
        });
    }
    let t = 4096;
    let flops = 2.0 * f64::from(t * MOE_TOP) * f64::from(MOE_N) * f64::from(MOE_K);
    tflops_case(b, &format!("gather_qmm_prefill_q4_bf16_T{t}"), flops, || {
        let q = quantized()?;
        let (x, idx) = moe_rows(t, 0, 930)?;
        Ok(one(move |_| run(&x, &q, &idx)))
    });
}

/// `ops::gather_mm` through 512 experts (see the module's documentation).
fn gather_mm(b: &mut Bench) {
    let weights = || -> nuvec::Result<Array> {
        let w = (random(&[MOE_E, MOE_N, MOE_K], DType::F32, 900)? * 0.02f32).astype(DT);
        w.eval()?;
        Ok(w)
    };
    let expert_bytes = (MOE_N * MOE_K) as usize * ELEM;
    for t in [1i32, 8, 64] {
        let (_, distinct) = moe_choices(t, 0);
        let bytes = distinct * expert_bytes;
        let k = b.copies(bytes);
        let name = format!("gather_mm_decode_bf16_T{t}");
        b.bandwidth_outputs(&name, bytes as f64, None, true, || {
            let w = weights()?;
            let sets = (0..k).map(|c| moe_rows(t, c as i32, 910 + c as u32)).collect::<Result<Vec<_>, _>>()?;
            Ok(one(move |i| {
                let (x, idx) = &sets[i % k];
                ops::gather_mm(x, &w.swapaxes(-1, -2), None, Some(idx), true)
            }))
        });
    }
    let t = 4096;
    let flops = 2.0 * f64::from(t * MOE_TOP) * f64::from(MOE_N) * f64::from(MOE_K);
    tflops_case(b, &format!("gather_mm_prefill_bf16_T{t}"), flops, || {
        let w = weights()?;
        let (x, idx) = moe_rows(t, 0, 930)?;
        Ok(one(move |_| ops::gather_mm(&x, &w.swapaxes(-1, -2), None, Some(&idx), true)))
    });
}
