//! Every Metal kernel of the mlx-lm 0.32.2 wheel through `fast::MetalKernel`, each against its
//! composition of ordinary operations (or, for the loss derivatives, the derivative of the
//! composition). `metal_kernel.rs` has the Gated DeltaNet, SSM, `qk_norm` and
//! `rms_norm_sigmoid_gate` kernels; this file has the others, and a test that the two files
//! together cover every kernel the wheel builds. The kernels are read from the wheel at test
//! time (never committed); without a GPU their translations are compiled with NVRTC.

use nuvec::fast::{MetalKernel, TemplateArg};
use nuvec::{Array, DType, ops, transforms::vjp};

use crate::metal_kernel::{Case, close, compile_all, config, mlx_lm_kernels, rms, wavy};
use crate::{custom_gpu as gpu, custom_nvrtc as nvrtc};

/// The modules of the wheel that build Metal kernels, with the kernels each builds, in order.
const MODULES: [(&str, &[&str]); 13] = [
    (
        "models/gated_delta",
        &[
            "gated_delta_step",
            "gated_delta_step_mask",
            "gated_delta_step_vec",
            "gated_delta_step_vec_mask",
            "gated_delta_step_xtree",
            "gated_delta_step_packed_btree",
        ],
    ),
    ("models/ssm", &["ssm_kernel"]),
    ("kernels/qk_norm", &["qk_norm"]),
    ("kernels/rms_norm_sigmoid_gate", &["rms_norm_sigmoid_gate"]),
    ("kernels/expert_routing", &["expert_routing"]),
    ("kernels/norm_add_norm", &["norm_add_norm", "norm_add", "norm_add_norm_pre_norm"]),
    ("kernels/post_expert_norm_combine", &["post_expert_norm_combine"]),
    ("kernels/qk_norm_rope", &["qk_norm_rope"]),
    ("models/rwkv7", &["wkv7_kernel"]),
    // kimi_k3 also imports gated_delta, whose six kernels come first.
    ("models/kimi_k3", &["attnres_mix"]),
    ("models/deepseek_v41", &["deepseek_v41_sinkhorn"]),
    ("models/bitlinear_layers", &["bitlinear_matmul"]),
    ("tuner/losses", &["kl_forward", "kl_backward", "js_forward", "js_backward"]),
];

/// The kernels `module` builds (its own, after those of modules it imports), or `None` where
/// the wheel cannot be read (a skip, or a failure under `NUVEC_REQUIRE_NVRTC=1`).
fn kernels(module: &str) -> Option<Vec<MetalKernel>> {
    let all = mlx_lm_kernels(&format!("mlx_lm/{module}.py"))?;
    let own = MODULES.iter().find(|(m, _)| *m == module).expect("a listed module").1;
    Some(all[all.len() - own.len()..].to_vec())
}

fn kernel(module: &str, name: &str) -> Option<MetalKernel> {
    kernels(module).map(|ks| ks.into_iter().find(|k| k.name() == name).expect("a listed kernel"))
}

fn values(n: i32, seed: f32) -> Array {
    Array::from_slice(&wavy(n as usize, seed), [n as usize])
}

fn f32s(a: &Array) -> Vec<f32> {
    a.astype(DType::F32).to_vec::<f32>().unwrap()
}

/// `x` rounded to `dtype` and read back as float32, as a kernel's `static_cast<T>` does.
fn round(x: &Array, dtype: DType) -> Array {
    x.astype(dtype).astype(DType::F32)
}

/// MLX's threads for a row of `dim` values (`mlx_lm/kernels/_common.py`'s `row_threads`).
fn row_threads(dim: i32) -> i32 {
    (dim / 8 / 32 * 32).clamp(32, 1024)
}

/// A case and what its composition gives for each output.
type Checked = (Case, Vec<Array>);

/// `expert_routing`: sigmoid scores of the router logits, the top K of score + bias (ties to the
/// lower expert), and their scores normalised and scaled. Six tokens of 40 experts (two per
/// lane); six tokens make 192 threads of a 256-thread threadgroup, so the grid guard runs.
fn routing_case(k: &MetalKernel, dtype: DType) -> Checked {
    let (n, e, top) = (6, 40, 4);
    let (mult, eps, scale) = (1.5f32, 1e-20f32, 2.5f32);
    let logits = values(n * e, 0.9).reshape([n, e]).astype(dtype);
    // Equal biases for experts 5 apart, so equal logits tie.
    let bias_v: Vec<f32> = (0..e).map(|j| (j % 5) as f32 * 0.01).collect();
    let x = f32s(&logits);
    let (mut inds, mut weights) = (vec![], vec![]);
    for t in 0..n as usize {
        let score: Vec<f32> = (0..e as usize)
            .map(|j| {
                let v = x[t * e as usize + j] * mult;
                let y = 1.0 / (1.0 + v.abs().exp());
                if v < 0.0 { y } else { 1.0 - y }
            })
            .collect();
        let mut order: Vec<usize> = (0..e as usize).collect();
        order.sort_by(|&a, &b| (score[b] + bias_v[b]).total_cmp(&(score[a] + bias_v[a])).then(a.cmp(&b)));
        let picked = &order[..top as usize];
        let total = picked.iter().fold(0.0f32, |acc, &j| score[j] + acc);
        inds.extend(picked.iter().map(|&j| j as u32));
        weights.extend(picked.iter().map(|&j| score[j] / (total + eps) * scale));
    }
    let case = Case {
        kernel: k.clone(),
        inputs: vec![logits, Array::from_slice(&bias_v, [e as usize]), mult.into(), eps.into(), scale.into()],
        outputs: vec![(vec![n, top], DType::U32), (vec![n, top], DType::F32)],
        config: config(((n * 32) as u32, 1, 1), (256, 1, 1), vec![("E", e.into()), ("K", top.into())]),
    };
    let want = vec![
        Array::from_slice(&inds, [(n * top) as usize]).reshape([n, top]),
        Array::from_slice(&weights, [(n * top) as usize]),
    ];
    (case, want)
}

/// `norm_add_norm`, `norm_add` and `norm_add_norm_pre_norm` on rows of 1000 (96 threads, three
/// SIMD-groups, a ragged last pass): the branch post-normed (its weight applied first when
/// `post_scale`), added to the float32 stream with the gate weights, and the sum pre-normed.
fn norm_add_cases(ks: &[MetalKernel], dtype: DType, post_scale: bool) -> Vec<Checked> {
    let (n, d) = (3, 1000);
    let tg = row_threads(d);
    let (post_eps, pre_eps) = (1e-6f32, 1e-5f32);
    let branch = values(n * d, 0.3).reshape([n, d]).astype(dtype);
    let stream = values(n * d, 1.9).reshape([n, d]) * 0.5;
    let alpha = values(d, 2.6) * 0.2 + 1.0;
    let beta = values(d, 3.4) * 0.2 + 0.5;
    let post_w = (values(d, 4.1) * 0.1 + 1.0).astype(dtype);
    let pre_w = (values(d, 5.3) * 0.1 + 1.0).astype(dtype);
    let mut v = branch.astype(DType::F32);
    if post_scale {
        v = round(&(post_w.astype(DType::F32) * &v), dtype);
    }
    let normed_branch = round(&rms(&v, post_eps), dtype);
    let new_stream = &alpha * &stream + &beta * normed_branch;
    let normed = (rms(&new_stream, pre_eps) * pre_w.astype(DType::F32)).astype(dtype);
    let cfg = |with: Vec<(&str, TemplateArg)>| {
        let mut t = vec![("T", dtype.into()), ("D", d.into()), ("TG", tg.into())];
        t.extend(with);
        config(((n * tg) as u32, 1, 1), (tg as u32, 1, 1), t)
    };
    let gated = vec![("POST_SCALE", TemplateArg::Bool(post_scale))];
    let mut inputs =
        vec![branch, stream, alpha.clone(), beta, if post_scale { post_w } else { alpha }, post_eps.into()];
    let add = Case {
        kernel: ks[1].clone(),
        inputs: inputs.clone(),
        outputs: vec![(vec![n, d], DType::F32)],
        config: cfg(gated.clone()),
    };
    inputs.extend([pre_w.clone(), pre_eps.into()]);
    let add_norm = Case {
        kernel: ks[0].clone(),
        inputs,
        outputs: vec![(vec![n, d], DType::F32), (vec![n, d], dtype)],
        config: cfg(gated),
    };
    let pre = Case {
        kernel: ks[2].clone(),
        inputs: vec![new_stream.clone(), pre_w, pre_eps.into()],
        outputs: vec![(vec![n, d], dtype)],
        config: cfg(vec![]),
    };
    vec![(add_norm, vec![new_stream.clone(), normed.clone()]), (add, vec![new_stream]), (pre, vec![normed])]
}

/// `post_expert_norm_combine`: each of K = 3 expert rows of 1000 normed with the weight as its
/// input scale, then added with the router weights in order, rounding to T after each.
fn combine_case(k: &MetalKernel, dtype: DType) -> Checked {
    let (n, top, d) = (4, 3, 1000);
    let tg = (2 * row_threads(d)).min(1024);
    let eps = 1e-6f32;
    let experts = values(n * top * d, 0.6).reshape([n, top, d]).astype(dtype);
    let weights = values(n * top, 1.2).reshape([n, top]).abs() * 0.3;
    let norm_w = (values(d, 2.8) * 0.1 + 1.0).astype(dtype);
    let x = experts.astype(DType::F32) * norm_w.astype(DType::F32);
    let inv = ((&x * &x).mean_keepdims(-1) + eps as f64).rsqrt();
    let term = x * inv * round(&weights, dtype).expand_dims(-1);
    let mut acc = ops::zeros(&[n, d][..], DType::F32);
    for j in 0..top {
        acc = round(&(acc + term.i((.., j))), dtype);
    }
    let case = Case {
        kernel: k.clone(),
        inputs: vec![experts, weights, norm_w, eps.into()],
        outputs: vec![(vec![n, d], dtype)],
        config: config(
            ((n * tg) as u32, 1, 1),
            (tg as u32, 1, 1),
            vec![("T", dtype.into()), ("D", d.into()), ("K", top.into()), ("TG", tg.into())],
        ),
    };
    (case, vec![acc])
}

/// `qk_norm_rope`: `qk_norm`, then the rotation of `mx.fast.rope(traditional=True)` at
/// positions `offset[b] + l`, for a batch of 2 prompts of 3 tokens with their own offsets.
fn qk_norm_rope_case(k: &MetalKernel, dtype: DType) -> Checked {
    let (b, l, hq, hk, d) = (2, 3, 4, 2, 64);
    let (scale, eps, base) = (0.125f32, 1e-6f32, 10000f32);
    let offsets = [5i32, 17];
    let n = b * l;
    let width = 2 * (hq + hk) * d;
    let qkvg = values(n * width, 0.4).reshape([b, l, width]).astype(dtype);
    let rows = qkvg.reshape([n, 2 * (hq + hk), d]);
    let part = |from: i32, to: i32| rows.slice(&[0, from, 0], &[n, to, d], &[1, 1, 1]);
    let q = round(&(round(&rms(&part(0, hq), eps), dtype) * scale as f64), dtype);
    let key = round(&rms(&part(hq, hq + hk), eps), dtype);
    // cos and sin of each token's position times each pair's frequency, [n, 1, d / 2].
    let log2_base = base.log2();
    let (mut cos, mut sin) = (vec![], vec![]);
    for t in 0..n {
        let pos = (t % l + offsets[(t / l) as usize]) as f64;
        for i in 0..d / 2 {
            let theta = pos * (-(i as f64 / (d / 2) as f64) * log2_base as f64).exp2();
            cos.push(theta.cos() as f32);
            sin.push(theta.sin() as f32);
        }
    }
    let half = (d / 2) as usize;
    let (c, s) = (
        Array::from_slice(&cos, [n as usize * half]).reshape([n, 1, d / 2]),
        Array::from_slice(&sin, [n as usize * half]).reshape([n, 1, d / 2]),
    );
    let rotate = |x: Array, heads: i32| {
        let pairs = x.reshape([n, heads, d / 2, 2]);
        let (x0, x1) = (pairs.i((.., .., .., 0)), pairs.i((.., .., .., 1)));
        let y = ops::stack(&[&x0 * &c - &x1 * &s, &x1 * &c + &x0 * &s], -1);
        y.reshape([b, l, heads, d]).astype(dtype)
    };
    let case = Case {
        kernel: k.clone(),
        inputs: vec![
            qkvg,
            scale.into(),
            eps.into(),
            Array::from_slice(&offsets, [2]),
            Array::from(l),
            log2_base.into(),
        ],
        outputs: vec![(vec![b, l, hq, d], dtype), (vec![b, l, hk, d], dtype)],
        config: config(
            ((n * (hq + hk) * 32) as u32, 1, 1),
            (256, 1, 1),
            vec![
                ("T", dtype.into()),
                ("D", d.into()),
                ("HQ", hq.into()),
                ("HK", hk.into()),
                ("OFFSET_STRIDE", 1.into()),
            ],
        ),
    };
    (case, vec![rotate(q, hq), rotate(key, hk)])
}

/// `wkv7_kernel` (RWKV-7's recurrence) over 3 steps, and the step of `_wkv7_step_ops` looped:
/// `state = state * w + v kᵀ + (state a) bᵀ`, `y = state r`, in float32.
fn wkv7_case(k: &MetalKernel, dtype: DType) -> Checked {
    let (b, t, h, d) = (2, 3, 2, 64);
    let len = b * t * h * d;
    let shaped = |x: Array| x.reshape([b, t, h, d]).astype(dtype);
    let r = shaped(values(len, 0.1) * 0.3);
    let w = shaped(values(len, 0.5).abs() * 0.03 + 0.9);
    let kk = shaped(values(len, 0.9) * 0.2);
    let v = shaped(values(len, 1.3) * 0.5);
    let a = shaped(values(len, 1.7) * -0.1);
    let bb = shaped(values(len, 2.1) * 0.1);
    let state0 = (values(b * h * d * d, 2.5).reshape([b, h, d, d]) * 0.1).astype(dtype);
    let f = |x: &Array, i: i32| x.astype(DType::F32).i((.., i)).expand_dims(2); // [B, H, 1, D]
    let mut s = state0.astype(DType::F32);
    let mut ys = vec![];
    for i in 0..t {
        let sa = (&s * f(&a, i)).sum_keepdims(-1); // [B, H, Dv, 1]
        let vv = v.astype(DType::F32).i((.., i)).expand_dims(-1); // [B, H, Dv, 1]
        s = &s * f(&w, i) + vv * f(&kk, i) + sa * f(&bb, i);
        ys.push((&s * f(&r, i)).sum(-1));
    }
    let y = ops::stack(&ys, 1).astype(dtype);
    let case = Case {
        kernel: k.clone(),
        inputs: vec![r, w, kk, v, a, bb, state0, Array::from(t)],
        outputs: vec![(vec![b, t, h, d], dtype), (vec![b, h, d, d], dtype)],
        config: config(
            (32, d as u32, (b * h) as u32),
            (32, 4, 1),
            vec![("InT", dtype.into()), ("H", h.into()), ("D", d.into())],
        ),
    };
    (case, vec![y, s.astype(dtype)])
}

/// `attnres_mix` (Kimi K3's attention residuals): a softmax over K = 3 stored blocks and the
/// partial sum of their logits against `w_eff`, mixing them; rows of 700 over 512 threads.
fn attnres_case(k: &MetalKernel, dtype: DType) -> Checked {
    let (top, n, d, threads) = (3, 5, 700, 512);
    let eps = 1e-6f32;
    let raw = values(top * n * d, 0.2).reshape([top, n, d]).astype(dtype);
    let inv_rms = values(top * n, 1.4).reshape([top, n]).abs() * 0.5 + 0.5;
    let partial = values(n * d, 2.3).reshape([n, d]).astype(dtype);
    let w_eff = (values(d, 3.7) * 0.05).astype(dtype);
    // mlx-lm's `_attn_res_combine`.
    let pf = partial.astype(DType::F32);
    let w = w_eff.astype(DType::F32);
    let p_logit = pf.matmul(&w) * ((&pf * &pf).mean(-1) + eps as f64).rsqrt();
    let logits = ops::concatenate(&[raw.astype(DType::F32).matmul(&w) * &inv_rms, p_logit.expand_dims(0)], 0);
    let p = logits.softmax(0);
    let mixed = (p.slice(&[0, 0], &[top, n], &[1, 1]).expand_dims(-1) * raw.astype(DType::F32)).sum(0)
        + p.i(top).expand_dims(-1) * &pf;
    let case = Case {
        kernel: k.clone(),
        inputs: vec![raw, inv_rms, partial, w_eff, Array::from_slice(&[eps], [1]), Array::from(n)],
        outputs: vec![(vec![n, d], dtype)],
        config: config(
            (threads as u32, n as u32, 1),
            (threads as u32, 1, 1),
            vec![("InT", dtype.into()), ("K", top.into()), ("D", d.into()), ("THREADS", threads.into())],
        ),
    };
    (case, vec![mixed.astype(dtype)])
}

/// `deepseek_v41_sinkhorn`: 300 matrices of 4×4 (a partial threadgroup, which `comb_shape`
/// guards), the columns normalised, then rows and columns 4 more times.
fn sinkhorn_case(k: &MetalKernel) -> Checked {
    let (m, hc, iters) = (300, 4, 5);
    let eps = 1e-6f32;
    let comb = (values(m * hc * hc, 0.7).reshape([m, hc, hc]) * 0.5).exp();
    let mut want = &comb / (comb.sum_keepdims(-2) + eps as f64);
    for _ in 1..iters {
        want = &want / (want.sum_keepdims(-1) + eps as f64);
        want = &want / (want.sum_keepdims(-2) + eps as f64);
    }
    let case = Case {
        kernel: k.clone(),
        inputs: vec![comb, Array::from_slice(&[eps], [1])],
        outputs: vec![(vec![m, hc, hc], DType::F32)],
        config: config((m as u32, 1, 1), (256, 1, 1), vec![("HC", hc.into()), ("ITERS", iters.into())]),
    };
    (case, vec![want])
}

/// `bitlinear_matmul`: ternary weights packed four to a byte (output row `r + j·out/4` in bits
/// `2j`), the product with x, scaled by (or divided by) the weight scale.
fn bitlinear_case(k: &MetalKernel, dtype: DType, invert: bool) -> Checked {
    let (rows, inf, outf) = (3, 256, 48);
    let packed_rows = outf / 4;
    let bytes: Vec<u8> = (0..packed_rows * inf).map(|i| ((i * 37 + i / 7) % 256) as u8).collect();
    let mut w = vec![0f32; (outf * inf) as usize];
    for r in 0..packed_rows {
        for c in 0..inf {
            let byte = bytes[(r * inf + c) as usize];
            for j in 0..4 {
                w[((r + j * packed_rows) * inf + c) as usize] = ((byte >> (2 * j)) & 3) as f32 - 1.0;
            }
        }
    }
    let x = values(rows * inf, 1.6).reshape([rows, inf]).astype(dtype);
    let scale = 0.75f32;
    let w = Array::from_slice(&w, [(outf * inf) as usize]).reshape([outf, inf]);
    let product = x.astype(DType::F32).matmul(&w.transpose(&[1, 0]));
    let want = if invert { product / scale as f64 } else { product * scale as f64 };
    let case = Case {
        kernel: k.clone(),
        inputs: vec![
            x,
            Array::from_slice(&bytes, [(packed_rows * inf) as usize]).reshape([packed_rows, inf]),
            Array::from_slice(&[scale], [1]).astype(dtype),
        ],
        outputs: vec![(vec![rows, outf], dtype)],
        config: config(
            (32, (rows * packed_rows) as u32, 1),
            (32, 1, 1),
            vec![
                ("T", dtype.into()),
                ("invert_weight_scales", TemplateArg::Bool(invert)),
                ("in_features", inf.into()),
                ("out_features", outf.into()),
            ],
        ),
    };
    (case, vec![want.astype(dtype)])
}

/// `(kl, js, kl_q)` of rows of logits, as mlx-lm's CPU path composes them: `kl = Σ p (log p −
/// log q)`; `js = (kl(p‖m) + kl(q‖m)) / 2` with `m = (p + q) / 2`, and `kl_q = kl(q‖m)`.
fn divergences(q: &Array, p: &Array) -> (Array, Array, Array) {
    let lq = q - q.logsumexp_keepdims(-1);
    let lp = p - p.logsumexp_keepdims(-1);
    let kl = (lp.exp() * (&lp - &lq)).sum(-1);
    let lm = &lp + ((&lq - &lp).exp() + 1.0).log() - 2f64.ln();
    let kl_p = (lp.exp() * (&lp - &lm)).sum(-1);
    let kl_q = (lq.exp() * (&lq - &lm)).sum(-1);
    (kl, (kl_p + &kl_q) * 0.5, kl_q)
}

/// The four loss kernels over 3 rows of V logits (V = 300: one partial block of 4096; V = 5000:
/// a full block and a partial one), with the derivatives' cotangents; `mlx_lm/tuner/losses.py`.
fn loss_cases(ks: &[MetalKernel], dtype: DType, v: i32) -> Vec<Checked> {
    let n = 3;
    let q = (values(n * v, 0.3).reshape([n, v]) * 2.0).astype(dtype);
    let p = (values(n * v, 1.1).reshape([n, v]) * 2.0).astype(dtype);
    let cot = (values(n, 2.2) + 3.5).astype(dtype);
    let (qf, pf, cf) = (q.astype(DType::F32), p.astype(DType::F32), cot.astype(DType::F32));
    let (kl, js, kl_q) = divergences(&qf, &pf);
    let (_, dkl) = vjp(|q: &Array| divergences(q, &pf).0, &qf, &cf).unwrap();
    let (_, djs) = vjp(|q: &Array| divergences(q, &pf).1, &qf, &cf).unwrap();
    let cfg = || config((1024, n as u32, 1), (1024, 1, 1), vec![("T", dtype.into()), ("V", v.into())]);
    let row = vec![n];
    let case = |i: usize, inputs: Vec<Array>, outputs: Vec<(Vec<i32>, DType)>| Case {
        kernel: ks[i].clone(),
        inputs,
        outputs,
        config: cfg(),
    };
    vec![
        (case(0, vec![q.clone(), p.clone()], vec![(row.clone(), dtype)]), vec![kl]),
        (case(1, vec![q.clone(), p.clone(), cot.clone()], vec![(vec![n, v], dtype)]), vec![dkl]),
        (case(2, vec![q.clone(), p.clone()], vec![(row.clone(), dtype), (row, dtype)]), vec![js, kl_q.clone()]),
        (case(3, vec![q, p, cot, kl_q.astype(dtype)], vec![(vec![n, v], dtype)]), vec![djs]),
    ]
}

/// Every case of this file at `dtype`, named, or `None` where the wheel cannot be read.
fn all_cases(dtype: DType) -> Option<Vec<(String, Checked)>> {
    let mut all = vec![];
    let mut push = |name: &str, c: Checked| all.push((format!("{name} {dtype:?}"), c));
    push("expert_routing", routing_case(&kernel("kernels/expert_routing", "expert_routing")?, dtype));
    let norm_add = kernels("kernels/norm_add_norm")?;
    for post_scale in [true, false] {
        for (c, name) in
            norm_add_cases(&norm_add, dtype, post_scale).into_iter().zip(["norm_add_norm", "norm_add", "pre_norm"])
        {
            push(&format!("{name} post_scale={post_scale}"), c);
        }
    }
    push(
        "post_expert_norm_combine",
        combine_case(&kernel("kernels/post_expert_norm_combine", "post_expert_norm_combine")?, dtype),
    );
    push("qk_norm_rope", qk_norm_rope_case(&kernel("kernels/qk_norm_rope", "qk_norm_rope")?, dtype));
    push("wkv7", wkv7_case(&kernel("models/rwkv7", "wkv7_kernel")?, dtype));
    push("attnres_mix", attnres_case(&kernel("models/kimi_k3", "attnres_mix")?, dtype));
    if dtype == DType::F32 {
        push("sinkhorn", sinkhorn_case(&kernel("models/deepseek_v41", "deepseek_v41_sinkhorn")?));
    }
    let bitlinear = kernel("models/bitlinear_layers", "bitlinear_matmul")?;
    for invert in [false, true] {
        push(&format!("bitlinear invert={invert}"), bitlinear_case(&bitlinear, dtype, invert));
    }
    let losses = kernels("tuner/losses")?;
    for v in [300, 5000] {
        for (c, name) in
            loss_cases(&losses, dtype, v).into_iter().zip(["kl_forward", "kl_backward", "js_forward", "js_backward"])
        {
            push(&format!("{name} V={v}"), c);
        }
    }
    Some(all)
}

// ---- without a GPU --------------------------------------------------------------------------

#[test]
fn every_kernel_of_the_wheel_is_tested() {
    // The modules of the wheel that call `mx.fast.metal_kernel`, found by reading it.
    let Ok(wheel) = crate::metal_kernel::mlx_lm_wheel() else {
        assert!(std::env::var("NUVEC_REQUIRE_NVRTC").as_deref() != Ok("1"), "the mlx-lm wheel is unavailable");
        return;
    };
    let list = "import sys, zipfile\n\
                z = zipfile.ZipFile(sys.argv[1])\n\
                for n in sorted(z.namelist()):\n\
                \x20   if n.endswith('.py') and b'metal_kernel(' in z.read(n): print(n[7:-3])";
    let out =
        std::process::Command::new(crate::metal_kernel::python()).args(["-c", list]).arg(&wheel).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let found: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
    let mut listed: Vec<String> = MODULES.iter().map(|(m, _)| m.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed, "modules of the wheel that build Metal kernels");
    for (module, names) in MODULES {
        let Some(got) = kernels(module) else { return };
        assert_eq!(got.iter().map(|k| k.name()).collect::<Vec<_>>(), names, "{module}");
    }
}

#[test]
fn mlx_lm_kernels_compile_with_nvrtc() {
    let Some(f32_cases) = all_cases(DType::F32) else { return };
    if !nvrtc() {
        return;
    }
    let mut cases: Vec<Case> = f32_cases.into_iter().map(|(_, (c, _))| c).collect();
    for dtype in [DType::BF16, DType::F16] {
        cases.extend(all_cases(dtype).unwrap().into_iter().map(|(_, (c, _))| c));
    }
    compile_all(&cases);
}

// ---- on the GPU -----------------------------------------------------------------------------

#[test]
fn mlx_lm_kernels_match_their_compositions() {
    if !gpu() {
        return;
    }
    for dtype in [DType::F32, DType::BF16] {
        let Some(cases) = all_cases(dtype) else { return };
        for (name, (case, want)) in cases {
            let got = case.call();
            assert_eq!(got.len(), want.len(), "{name}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("{name} output {i}");
                if g.dtype() == DType::U32 {
                    assert_eq!(g.to_vec::<u32>().unwrap(), w.astype(DType::U32).to_vec::<u32>().unwrap(), "{what}");
                    continue;
                }
                let tol = if dtype == DType::F32 { 2e-4 } else { 2e-2 };
                close(&f32s(g), &f32s(w), tol, &what);
            }
        }
    }
}
