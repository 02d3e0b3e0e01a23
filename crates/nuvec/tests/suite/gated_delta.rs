//! `fast::gated_delta` and `fast::gated_delta_steps` (Gated DeltaNet's recurrence) against a
//! float64 loop written here: grouped heads (`Hv` = 1, 2 and 4 times `Hk`), `Dk ≠ Dv`, 0 to 37
//! steps, 1 to 3 batch rows, per-head and per-key-channel gates, masks, a given state or none,
//! `q`/`k`/`v` in float32, float16 and bfloat16, states in and out in every storage dtype. Also:
//! the fused kernel against the composition, the steps' last state against the last state, a
//! prompt run in pieces against it whole, strided inputs, bad arguments, derivatives against
//! finite differences of the float64 loop, vmap against a loop, and mlx-lm's `gated_delta_ops`
//! (fixtures recorded by `scripts/mlx_fixtures_gated_delta.py`). The tests run on the default
//! device, so a GPU run checks its kernel.

use crate::fixture::{Fixture, Tolerance, compare};
use crate::{Rng, epsilon};
use nuvec::fast::{self, FastOp, GatedDeltaParams, StepOptions};
use nuvec::transforms::{jvp_flat, vjp_flat, vmap_flat};
use nuvec::{Array, DType, ops};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gated_delta.bin");

/// Batch rows, steps, key heads, value heads, key and value head sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) b: usize,
    pub(crate) t: usize,
    pub(crate) hk: usize,
    pub(crate) hv: usize,
    pub(crate) dk: usize,
    pub(crate) dv: usize,
}

const fn dims(b: usize, t: usize, hk: usize, hv: usize, dk: usize, dv: usize) -> Dims {
    Dims { b, t, hk, hv, dk, dv }
}

impl Dims {
    fn qk(&self) -> Vec<i32> {
        [self.b, self.t, self.hk, self.dk].map(|d| d as i32).to_vec()
    }
    fn v(&self) -> Vec<i32> {
        [self.b, self.t, self.hv, self.dv].map(|d| d as i32).to_vec()
    }
    fn gate(&self, channel: bool) -> Vec<i32> {
        let mut s = self.beta();
        if channel {
            s.push(self.dk as i32);
        }
        s
    }
    fn beta(&self) -> Vec<i32> {
        [self.b, self.t, self.hv].map(|d| d as i32).to_vec()
    }
    fn state(&self) -> Vec<i32> {
        [self.b, self.hv, self.dv, self.dk].map(|d| d as i32).to_vec()
    }
    fn steps(&self) -> Vec<i32> {
        [self.b, self.t, self.hv, self.dv, self.dk].map(|d| d as i32).to_vec()
    }
}

/// One call's arrays and the values they hold (as their dtypes rounded them).
#[derive(Clone)]
struct Call {
    d: Dims,
    channel: bool,
    /// `[q, k, v, g, beta]`.
    x: Vec<Array>,
    state: Option<Array>,
    mask: Option<Array>,
    /// The values of `x`, then of the state (zeros without one).
    vals: Vec<Vec<f64>>,
    mask_vals: Option<Vec<bool>>,
}

impl Call {
    fn options(&self, storage: Option<DType>) -> StepOptions {
        StepOptions { storage, mask: self.mask.clone() }
    }
    fn run(&self, storage: Option<DType>) -> (Array, Array) {
        let x = &self.x;
        fast::gated_delta_with(&x[0], &x[1], &x[2], &x[3], &x[4], self.state.as_ref(), &self.options(storage))
    }
    fn run_steps(&self, storage: Option<DType>) -> (Array, Array) {
        let x = &self.x;
        fast::gated_delta_steps_with(&x[0], &x[1], &x[2], &x[3], &x[4], self.state.as_ref(), &self.options(storage))
    }
    /// The recorded primitive's inputs: the state as `scan` makes it when none is given.
    fn op_inputs(&self) -> Vec<Array> {
        let mut inputs = self.x.clone();
        inputs.push(self.state.clone().unwrap_or_else(|| ops::zeros(&self.d.state()[..], DType::F32)));
        inputs.extend(self.mask.clone());
        inputs
    }
    fn reference(&self) -> Reference {
        let v = &self.vals;
        reference(&self.d, [&v[0], &v[1], &v[2], &v[3], &v[4]], self.channel, &v[5], self.mask_vals.as_deref())
    }
}

fn uniform(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|_| lo + (hi - lo) * rng.unit()).collect()
}

fn f64s(a: &Array) -> Vec<f64> {
    a.astype(DType::F64).to_vec::<f64>().unwrap_or_else(|e| panic!("{e}"))
}

fn array(values: &[f64], shape: &[i32], dtype: DType) -> Array {
    Array::from_slice(values, shape).astype(dtype)
}

/// Random inputs as a model's are: keys and queries of about unit norm, gates in (0.5, 1), `β`
/// in (0, 1). `dtype` is `q`'s, `k`'s and `v`'s, `gate` the gates' and `β`'s; `state` the given
/// state's dtype, if any. The mask pads each row but the first on the left and drops one step.
fn call(rng: &mut Rng, d: Dims, dtype: DType, gate: DType, channel: bool, masked: bool, state: Option<DType>) -> Call {
    let a = (3.0 / d.dk.max(1) as f64).sqrt();
    let n = |s: &[i32]| s.iter().product::<i32>() as usize;
    let specs: Vec<(Vec<i32>, f64, f64, DType)> = vec![
        (d.qk(), -a, a, dtype),
        (d.qk(), -a, a, dtype),
        (d.v(), -1.0, 1.0, dtype),
        (d.gate(channel), 0.5, 1.0, gate),
        (d.beta(), 0.0, 1.0, gate),
    ];
    let x: Vec<Array> = specs.iter().map(|(s, lo, hi, dt)| array(&uniform(rng, n(s), *lo, *hi), s, *dt)).collect();
    let state = state.map(|dt| array(&uniform(rng, n(&d.state()), -0.5, 0.5), &d.state(), dt));
    let mask_vals = masked.then(|| {
        let mut m = vec![true; d.b * d.t];
        for b in 1..d.b {
            for t in 0..b.min(d.t.saturating_sub(1)) {
                m[b * d.t + t] = false;
            }
        }
        if d.t > 0 && d.b > 0 {
            m[d.t / 2] = false;
        }
        m
    });
    let mask = mask_vals.as_ref().map(|m| Array::from_slice(m, [d.b as i32, d.t as i32]));
    let mut vals: Vec<Vec<f64>> = x.iter().map(f64s).collect();
    vals.push(state.as_ref().map_or_else(|| vec![0.0; n(&d.state())], f64s));
    Call { d, channel, x, state, mask, vals, mask_vals }
}

/// The float64 loop's outputs: `y`, the last state and every step's state.
pub(crate) struct Reference {
    pub(crate) y: Vec<f64>,
    pub(crate) last: Vec<f64>,
    pub(crate) steps: Vec<f64>,
}

/// The recurrence in float64, one value head and one state row at a time.
pub(crate) fn reference(d: &Dims, x: [&[f64]; 5], channel: bool, state: &[f64], mask: Option<&[bool]>) -> Reference {
    let [q, k, v, g, beta] = x;
    let Dims { b, t, hk, hv, dk, dv } = *d;
    let mut s = state.to_vec();
    let mut y = vec![0.0; b * t * hv * dv];
    let mut steps = vec![0.0; b * t * hv * dv * dk];
    for bi in 0..b {
        for h in 0..hv {
            let kh = h / (hv / hk);
            for ti in 0..t {
                let bt = bi * t + ti;
                let at = (bt * hk + kh) * dk;
                let head = bt * hv + h;
                let keep = mask.is_none_or(|m| m[bt]);
                for i in 0..dv {
                    let row = &mut s[((bi * hv + h) * dv + i) * dk..][..dk];
                    if keep {
                        let mut kv = 0.0;
                        for j in 0..dk {
                            row[j] *= if channel { g[head * dk + j] } else { g[head] };
                            kv += row[j] * k[at + j];
                        }
                        let delta = (v[head * dv + i] - kv) * beta[head];
                        let mut o = 0.0;
                        for j in 0..dk {
                            row[j] += delta * k[at + j];
                            o += row[j] * q[at + j];
                        }
                        y[head * dv + i] = o;
                    }
                    steps[(head * dv + i) * dk..][..dk].copy_from_slice(row);
                }
            }
        }
    }
    Reference { y, last: s, steps }
}

/// `|got − want| ≤ tol·(1 + |want|)` element by element, with the shapes equal.
fn close(what: &str, got: &Array, shape: &[i32], want: &[f64], tol: f64) {
    assert_eq!(got.shape(), shape, "{what}: shape");
    let got = f64s(got);
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}: element {i}: {g} vs {w} (tolerance {tol:e})");
    }
}

/// An output in `dtype` against float64: its rounding (twice, for margin) and float32's
/// accumulated error.
fn tolerance(dtype: DType) -> f64 {
    2.0 * epsilon(dtype) + 1e-5
}

fn bits_equal(what: &str, a: &Array, b: &Array) {
    assert_eq!((a.shape(), a.dtype()), (b.shape(), b.dtype()), "{what}: shape and dtype");
    assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap(), "{what}: bits");
}

fn on_cpu() -> bool {
    nuvec::default_device() == nuvec::Device::cpu()
}

const SHAPES: [Dims; 7] = [
    dims(1, 1, 1, 1, 4, 4),
    dims(2, 37, 2, 4, 16, 8),
    dims(3, 1, 1, 4, 8, 12),
    dims(1, 37, 2, 8, 20, 6),
    dims(2, 0, 1, 2, 8, 4),
    dims(1, 5, 1, 1, 128, 130),
    dims(3, 6, 3, 3, 5, 3),
];

#[test]
fn matches_float64_over_shapes_gates_masks_and_dtypes() {
    let mut rng = Rng(0x6a7e_d0e1);
    let mut count = 0;
    for d in SHAPES {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for variant in 0..4usize {
                let (channel, masked) = (variant & 1 == 1, variant & 2 == 2);
                let state = [None, Some(DType::F32), Some(DType::BF16)][(variant + count) % 3];
                let storage = [None, Some(DType::F16), Some(DType::BF16), Some(DType::F32)][(variant + 2 * count) % 4];
                let gate = if variant == 3 { DType::BF16 } else { DType::F32 };
                let c = call(&mut rng, d, dtype, gate, channel, masked, state);
                let want = c.reference();
                let what = format!("{d:?} {dtype} gate {gate} channel {channel} masked {masked} state {state:?}");
                let kept = storage.or(state).unwrap_or(DType::F32);
                let (y, s) = c.run(storage);
                close(&format!("y {what}"), &y, &d.v(), &want.y, tolerance(dtype));
                assert_eq!(y.dtype(), dtype, "y's dtype {what}");
                close(&format!("state {what} storage {storage:?}"), &s, &d.state(), &want.last, tolerance(kept));
                assert_eq!(s.dtype(), kept, "the state's dtype {what} storage {storage:?}");
                // Every step's state: float32 unless a storage dtype is asked for.
                let (ys, steps) = c.run_steps(storage);
                let kept = storage.unwrap_or(DType::F32);
                close(&format!("steps {what} storage {storage:?}"), &steps, &d.steps(), &want.steps, tolerance(kept));
                assert_eq!(steps.dtype(), kept, "the states' dtype {what}");
                bits_equal(&format!("y of gated_delta_steps {what}"), &ys, &y);
                count += 1;
            }
        }
    }
    assert_eq!(count, SHAPES.len() * 12);
}

/// The fused kernel (the default path on the CPU) against the composition, over every dtype
/// the shape rule admits for `q`, `k` and `v` (float64 included) and every storage dtype.
#[test]
fn fused_kernel_matches_the_composition() {
    use nuvec::graph::{Primitive, backend_for};
    let mut rng = Rng(0x6a7e_d0e2);
    let cpu = backend_for(nuvec::Device::cpu()).unwrap();
    for (i, d) in
        [dims(2, 9, 2, 4, 32, 16), dims(1, 3, 1, 1, 128, 40), dims(3, 1, 4, 8, 16, 16)].into_iter().enumerate()
    {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            for (j, storage) in [DType::F32, DType::F16, DType::BF16].into_iter().enumerate() {
                for steps in [false, true] {
                    let (channel, masked) = ((i + j) % 2 == 1, (i + j + steps as usize).is_multiple_of(2));
                    let gate = if j == 2 { DType::F16 } else { DType::F32 };
                    let state = [Some(DType::F32), None, Some(DType::BF16)][(i + j) % 3];
                    let c = call(&mut rng, d, dtype, gate, channel, masked, state);
                    let p = GatedDeltaParams { steps, storage, masked };
                    let op = FastOp::GatedDelta(p);
                    let inputs = c.op_inputs();
                    if fast::fused_enabled() && on_cpu() {
                        let specs: Vec<_> = inputs.iter().map(Array::spec).collect();
                        assert!(cpu.supports(&Primitive::Fast(op.clone()), &specs, &[]), "the CPU runs {p:?} fused");
                    }
                    let (y, s) = if steps { c.run_steps(Some(storage)) } else { c.run(Some(storage)) };
                    let composed = op.composition(&inputs);
                    let what = format!("{d:?} {dtype} {p:?} channel {channel} state {state:?}");
                    let out_tol =
                        |dt: DType| if dt == DType::F32 || dt == DType::F64 { 2e-6 } else { 1.01 * epsilon(dt) };
                    close(&format!("y {what}"), &y, composed[0].shape(), &f64s(&composed[0]), out_tol(dtype));
                    close(&format!("state {what}"), &s, composed[1].shape(), &f64s(&composed[1]), out_tol(storage));
                    assert_eq!((y.dtype(), s.dtype()), (composed[0].dtype(), composed[1].dtype()), "{what}");
                }
            }
        }
    }
}

#[test]
fn steps_end_in_the_state_gated_delta_returns() {
    let mut rng = Rng(0x6a7e_d0e3);
    // 5 and 4 steps keep the CPU kernel's blocks row-major, 20 transposed (steps stay row-major).
    for (d, masked) in
        [(dims(2, 5, 1, 2, 16, 8), false), (dims(3, 4, 2, 2, 8, 8), true), (dims(2, 20, 1, 2, 40, 24), true)]
    {
        for storage in [DType::F32, DType::BF16] {
            let c = call(&mut rng, d, DType::BF16, DType::F32, masked, masked, Some(DType::F32));
            let (y, last) = c.run(Some(storage));
            let (ys, steps) = c.run_steps(Some(storage));
            let what = format!("{d:?} masked {masked} storage {storage}");
            bits_equal(&format!("last step {what}"), &steps.i((.., -1)), &last);
            bits_equal(&format!("y {what}"), &ys, &y);
        }
    }
    // The docs' example: plain gated_delta_steps keeps float32 states.
    let q = ops::ones([1, 2, 1, 4], DType::F32) * 0.5;
    let g = ops::ones([1, 2, 1], DType::F32);
    let (_, states) = fast::gated_delta_steps(&q, &q, &q, &g, &g, Some(&ops::zeros([1, 1, 4, 4], DType::BF16)));
    assert_eq!(states.dtype(), DType::F32);
}

/// A prompt run in pieces, each starting from the state the last one returned, equals running
/// it whole (bit for bit on the CPU: each row's arithmetic does not depend on the split, nor on
/// the layout its kernel picks for the piece's length).
#[test]
fn a_prompt_in_pieces_equals_it_whole() {
    let mut rng = Rng(0x6a7e_d0e4);
    // Dk 40: channels in the partials and past them.
    let d = dims(2, 37, 2, 4, 40, 12);
    for (dtype, channel, masked) in [(DType::F32, false, false), (DType::BF16, true, true), (DType::F16, false, true)] {
        let c = call(&mut rng, d, dtype, DType::F32, channel, masked, Some(DType::F32));
        let (y, s) = c.run(None);
        let mut state = c.state.clone().unwrap();
        let mut ys = Vec::new();
        for (lo, hi) in [(0, 1), (1, 17), (17, 18), (18, 18), (18, 37)] {
            let piece = |a: &Array| a.i((.., lo..hi));
            let x: Vec<Array> = c.x.iter().map(piece).collect();
            let options = StepOptions { storage: None, mask: c.mask.as_ref().map(piece) };
            let (yp, sp) = fast::gated_delta_with(&x[0], &x[1], &x[2], &x[3], &x[4], Some(&state), &options);
            ys.push(yp);
            state = sp;
        }
        let joined = ops::concatenate(&ys, 1);
        let what = format!("{dtype} channel {channel} masked {masked}");
        if on_cpu() {
            bits_equal(&format!("y {what}"), &joined, &y);
            bits_equal(&format!("state {what}"), &state, &s);
        } else {
            close(&format!("y {what}"), &joined, &d.v(), &f64s(&y), tolerance(dtype));
            close(&format!("state {what}"), &state, &d.state(), &f64s(&s), tolerance(DType::F32));
        }
    }
}

/// Transposed, sliced and broadcast inputs give what their contiguous copies give.
#[test]
fn strided_inputs_match_contiguous_ones() {
    let mut rng = Rng(0x6a7e_d0e5);
    let d = dims(2, 7, 2, 4, 24, 12);
    for (dtype, channel) in [(DType::F32, false), (DType::BF16, true)] {
        let c = call(&mut rng, d, dtype, DType::F32, channel, true, Some(DType::F32));
        let (b, t, hk, hv, dk, dv) = (d.b as i32, d.t as i32, d.hk as i32, d.hv as i32, d.dk as i32, d.dv as i32);
        // q: the transpose of [B, Hk, T, Dk]; k: every other element of a wider last axis.
        let q = c.x[0].transpose(&[0, 2, 1, 3]).contiguous().transpose(&[0, 2, 1, 3]);
        let wide = ops::stack(&[c.x[1].clone(), c.x[1].zeros_like()], -1).reshape([b, t, hk, 2 * dk]);
        let k = wide.slice(&[0, 0, 0, 0], &[b, t, hk, 2 * dk], &[1, 1, 1, 2]);
        // v: [T, B, Hv, Dv] swapped; β: one value per head broadcast over batch rows and steps.
        let v = c.x[2].swapaxes(0, 1).contiguous().swapaxes(0, 1);
        let g = c.x[3].moveaxis(-1, 0).contiguous().moveaxis(0, -1);
        let beta = c.x[4].i((0..1, 0..1)).broadcast_to([b, t, hv]);
        let state = c.state.as_ref().unwrap().swapaxes(2, 3).contiguous().swapaxes(2, 3);
        let m = c.mask.as_ref().unwrap();
        let mask = ops::stack(&[m.clone(), m.clone()], 0).i((1, .., ..));
        let options = StepOptions { storage: None, mask: Some(mask) };
        let (y, s) = fast::gated_delta_with(&q, &k, &v, &g, &beta, Some(&state), &options);
        let dense = |a: &Array| Array::from_raw_bytes(&a.to_bytes().unwrap(), a.shape(), a.dtype());
        let options = StepOptions { storage: None, mask: Some(dense(&options.mask.unwrap())) };
        let (yd, sd) = fast::gated_delta_with(
            &dense(&q),
            &dense(&k),
            &dense(&v),
            &dense(&g),
            &dense(&beta),
            Some(&dense(&state)),
            &options,
        );
        let what = format!("{dtype} channel {channel}");
        assert_eq!(y.shape(), &[b, t, hv, dv]);
        bits_equal(&format!("y {what}"), &y, &yd);
        bits_equal(&format!("state {what}"), &s, &sd);
    }
}

/// Prompts of no steps (T = 0) return the state as given, in the storage dtype, and no
/// outputs; so do empty batches and heads of no features, fused and composed.
#[test]
fn empty_prompts_and_heads() {
    let mut rng = Rng(0x6a7e_d0e6);
    for d in [dims(2, 0, 1, 2, 8, 4), dims(0, 3, 1, 2, 8, 4), dims(1, 3, 1, 2, 0, 4), dims(1, 3, 1, 2, 4, 0)] {
        for storage in [None, Some(DType::BF16)] {
            let c = call(&mut rng, d, DType::F32, DType::F32, d.b > 1, true, Some(DType::F32));
            let want = c.reference();
            let (y, s) = c.run(storage);
            let what = format!("{d:?} storage {storage:?}");
            close(&format!("y {what}"), &y, &d.v(), &want.y, 0.0);
            close(&format!("state {what}"), &s, &d.state(), &want.last, tolerance(storage.unwrap_or(DType::F32)));
            let (_, steps) = c.run_steps(storage);
            close(&format!("steps {what}"), &steps, &d.steps(), &want.steps, tolerance(DType::BF16));
            let p = GatedDeltaParams { steps: false, storage: storage.unwrap_or(DType::F32), masked: true };
            let composed = FastOp::GatedDelta(p).composition(&c.op_inputs());
            close(&format!("composed y {what}"), &composed[0], &d.v(), &want.y, 0.0);
            close(&format!("composed state {what}"), &composed[1], &d.state(), &f64s(&s), 0.0);
        }
    }
}

#[test]
fn bad_arguments_fail_naming_them() {
    let d = dims(2, 3, 2, 4, 8, 6);
    let c = call(&mut Rng(7), d, DType::F32, DType::F32, false, false, Some(DType::F32));
    let [q, k, v, g, beta] = <[Array; 5]>::try_from(c.x.clone()).unwrap();
    let state = c.state.clone().unwrap();
    let f32s = |shape: &[i32]| ops::zeros(shape, DType::F32);
    let mask = |shape: &[i32], dtype: DType| Some(ops::zeros(shape, dtype));
    type Args = (Array, Array, Array, Array, Array, Option<Array>, StepOptions);
    let ok: Args =
        (q.clone(), k.clone(), v.clone(), g.clone(), beta.clone(), Some(state.clone()), StepOptions::default());
    let with = |f: &dyn Fn(&mut Args)| {
        let mut a = ok.clone();
        f(&mut a);
        a
    };
    let cases: Vec<(&str, Args)> = vec![
        ("q must be 4-D", with(&|a| a.0 = f32s(&[2, 3, 16]))),
        ("q must be floating point", with(&|a| a.0 = q.astype(DType::I32))),
        ("k must have q's shape", with(&|a| a.1 = f32s(&[2, 3, 2, 6]))),
        ("q, k and v must share a dtype", with(&|a| a.1 = k.astype(DType::BF16))),
        ("q, k and v must share a dtype", with(&|a| a.2 = v.astype(DType::F16))),
        ("v must be 4-D", with(&|a| a.2 = f32s(&[2, 3, 24]))),
        ("v must be [2, 3, Hv, Dv]", with(&|a| a.2 = f32s(&[2, 4, 4, 6]))),
        ("v's heads (3) must be a multiple", with(&|a| a.2 = f32s(&[2, 3, 3, 6]))),
        ("g must be [2, 3, 4]", with(&|a| a.3 = f32s(&[2, 3, 2]))),
        ("g must be [2, 3, 4]", with(&|a| a.3 = f32s(&[2, 3, 4, 6]))),
        ("g must be float32, float16 or bfloat16", with(&|a| a.3 = g.astype(DType::F64))),
        ("beta must be [2, 3, 4]", with(&|a| a.4 = f32s(&[2, 3, 4, 1]))),
        ("beta must be float32, float16 or bfloat16", with(&|a| a.4 = beta.astype(DType::I32))),
        ("state must be [2, 4, 6, 8]", with(&|a| a.5 = Some(f32s(&[2, 4, 8, 6])))),
        ("state must be float32, float16 or bfloat16", with(&|a| a.5 = Some(state.astype(DType::F64)))),
        ("mask must be bool of shape [2, 3]", with(&|a| a.6.mask = mask(&[2, 3], DType::F32))),
        ("mask must be bool of shape [2, 3]", with(&|a| a.6.mask = mask(&[3, 2], DType::Bool))),
        ("storage must be float32, float16 or bfloat16, got", with(&|a| a.6.storage = Some(DType::F64))),
        ("storage must be float32, float16 or bfloat16, got", with(&|a| a.6.storage = Some(DType::I32))),
        // Without a state the zeros it starts from cannot hide a bad q or v.
        ("q must be 4-D", with(&|a| (a.0, a.5) = (f32s(&[2, 16]), None))),
        ("v must be 4-D", with(&|a| (a.2, a.5) = (f32s(&[2, 3, 24]), None))),
    ];
    let fails = |what: &str, out: &Array, op: &str, reason: &str| {
        let e = out.clone().check().expect_err(what).to_string();
        assert!(e.contains(op) && e.contains(reason), "{what}: {e}");
        // The caller's line, not the library's.
        assert!(e.contains("gated_delta.rs") && e.contains("tests"), "{what}: no caller location in {e}");
    };
    for (reason, (q, k, v, g, beta, state, options)) in cases {
        let (y, s) = fast::gated_delta_with(&q, &k, &v, &g, &beta, state.as_ref(), &options);
        fails(reason, &y, "gated_delta:", reason);
        fails(reason, &s, "gated_delta:", reason);
        let (y, s) = fast::gated_delta_steps_with(&q, &k, &v, &g, &beta, state.as_ref(), &options);
        fails(reason, &y, "gated_delta_steps:", reason);
        fails(reason, &s, "gated_delta_steps:", reason);
    }
    // A failed input fails both outputs with its own error.
    let bad = f32s(&[2]).reshape([3]);
    let (y, s) = fast::gated_delta(&bad, &k, &v, &g, &beta, None);
    assert!(y.is_failed() && s.is_failed());
}

/// `<c, f(x)>` of the float64 loop for outputs `y` and the last state (or every step's).
fn objective(c: &Call, x: &[Vec<f64>], cots: &[Vec<f64>], steps: bool) -> f64 {
    let r = reference(&c.d, [&x[0], &x[1], &x[2], &x[3], &x[4]], c.channel, &x[5], c.mask_vals.as_deref());
    let s = if steps { &r.steps } else { &r.last };
    r.y.iter().zip(&cots[0]).map(|(a, b)| a * b).sum::<f64>() + s.iter().zip(&cots[1]).map(|(a, b)| a * b).sum::<f64>()
}

/// vjp and jvp (the composition's, as the fused op defines them) against central differences
/// of the float64 loop, for each input alone along a random direction.
#[test]
fn derivatives_match_finite_differences() {
    let mut rng = Rng(0x6a7e_d0e7);
    for (d, channel, masked, steps) in [
        (dims(1, 3, 1, 1, 3, 2), false, false, false),
        (dims(2, 4, 1, 2, 3, 4), true, false, false),
        (dims(2, 3, 1, 2, 4, 3), false, true, true),
        (dims(1, 2, 2, 4, 2, 3), true, true, false),
    ] {
        let c = call(&mut rng, d, DType::F32, DType::F32, channel, masked, Some(DType::F32));
        let mut primals = c.x.clone();
        primals.push(c.state.clone().unwrap());
        let out_shapes = [d.v(), if steps { d.steps() } else { d.state() }];
        let cot_vals: Vec<Vec<f64>> =
            out_shapes.iter().map(|s| uniform(&mut rng, s.iter().product::<i32>() as usize, -1.0, 1.0)).collect();
        let cots: Vec<Array> = cot_vals.iter().zip(&out_shapes).map(|(v, s)| array(v, s, DType::F32)).collect();
        let cot_vals: Vec<Vec<f64>> = cots.iter().map(f64s).collect();
        let mask = c.mask.clone();
        let f = move |a: &[Array]| -> nuvec::Result<Vec<Array>> {
            let options = StepOptions { storage: None, mask: mask.clone() };
            let (y, s) = if steps {
                fast::gated_delta_steps_with(&a[0], &a[1], &a[2], &a[3], &a[4], Some(&a[5]), &options)
            } else {
                fast::gated_delta_with(&a[0], &a[1], &a[2], &a[3], &a[4], Some(&a[5]), &options)
            };
            Ok(vec![y, s])
        };
        let (_, grads) = vjp_flat(&f, &primals, &cots).unwrap();
        for (i, name) in ["q", "k", "v", "g", "beta", "state"].into_iter().enumerate() {
            let dir_vals = uniform(&mut rng, c.vals[i].len(), -1.0, 1.0);
            let dir = array(&dir_vals, primals[i].shape(), DType::F32);
            let dir_vals = f64s(&dir);
            let h = 1e-6;
            let at = |s: f64| {
                let mut x = c.vals.clone();
                x[i].iter_mut().zip(&dir_vals).for_each(|(x, d)| *x += s * d);
                objective(&c, &x, &cot_vals, steps)
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let from_vjp: f64 = f64s(&grads[i]).iter().zip(&dir_vals).map(|(a, b)| a * b).sum();
            let tangents: Vec<Array> =
                primals.iter().enumerate().map(|(j, p)| if j == i { dir.clone() } else { p.zeros_like() }).collect();
            let (_, t) = jvp_flat(&f, &primals, &tangents).unwrap();
            let from_jvp: f64 =
                t.iter().zip(&cot_vals).map(|(t, c)| f64s(t).iter().zip(c).map(|(a, b)| a * b).sum::<f64>()).sum();
            assert_eq!((grads[i].shape(), grads[i].dtype()), (primals[i].shape(), DType::F32), "d{name}");
            for (how, v) in [("vjp", from_vjp), ("jvp", from_jvp)] {
                assert!(
                    (v - fd).abs() <= 1e-4 * (1.0 + fd.abs()),
                    "{how} d{name} {d:?} channel {channel} masked {masked} steps {steps}: {v} vs {fd}"
                );
            }
        }
    }
}

/// `|got − want|` within `tol` of `want`'s largest magnitude everywhere, and the difference's
/// norm within `tol / 4` of `want`'s: half-precision kernels against a float32 composition.
fn near(what: &str, got: &Array, want: &Array, tol: f64) {
    assert_eq!((got.shape(), got.dtype()), (want.shape(), want.dtype()), "{what}: shape and dtype");
    let (g, w) = (f64s(got), f64s(want));
    let scale = w.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
    let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-30);
    let mut diff = 0.0;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= tol * scale, "{what}: element {i}: {a} vs {b} (largest {scale:e})");
        diff += (a - b) * (a - b);
    }
    let rel = diff.sqrt() / norm;
    assert!(rel <= tol / 4.0, "{what}: relative error {rel:e} over the whole array");
}

/// The derivative at Qwen3-Next's head sizes (on a GPU, the chunked backward kernels) against
/// the composition's: prompts of 1 step to several chunks ending mid-chunk, grouped heads, the
/// state in float32 or bfloat16, gates in float32 or bfloat16, and cotangents of `y`, of the
/// state or of both.
#[test]
fn chunked_derivative_matches_the_composition() {
    use nuvec::graph::{Primitive, backend_for};
    let mut rng = Rng(0x6a7e_d0e9);
    let on_gpu = !on_cpu();
    for (d, dtype, gate, state, cot_y, cot_s) in [
        (dims(1, 1, 1, 1, 128, 128), DType::BF16, DType::F32, DType::F32, true, true),
        (dims(2, 70, 1, 2, 128, 128), DType::BF16, DType::F32, DType::F32, true, true),
        (dims(1, 200, 2, 4, 128, 128), DType::F16, DType::BF16, DType::F32, true, false),
        (dims(1, 129, 1, 1, 128, 128), DType::BF16, DType::F32, DType::BF16, false, true),
    ] {
        let c = call(&mut rng, d, dtype, gate, false, false, Some(state));
        let p = GatedDeltaParams { steps: false, storage: state, masked: false };
        let primals = c.op_inputs();
        let cot = |on: bool, shape: Vec<i32>, dt: DType, rng: &mut Rng| {
            let n = shape.iter().product::<i32>() as usize;
            if on { array(&uniform(rng, n, -1.0, 1.0), &shape, dt) } else { ops::zeros(&shape[..], dt) }
        };
        let cots = vec![cot(cot_y, d.v(), dtype, &mut rng), cot(cot_s, d.state(), state, &mut rng)];
        let mut inputs = primals.clone();
        inputs.extend(cots.iter().cloned());
        let op = FastOp::GatedDeltaVjp(p);
        if on_gpu && fast::fused_enabled() {
            let specs: Vec<_> = inputs.iter().map(Array::spec).collect();
            let gpu = backend_for(nuvec::default_device()).unwrap();
            assert!(gpu.supports(&Primitive::Fast(op.clone()), &specs, &[]), "the GPU runs {d:?}'s derivative fused");
        }
        let f = |a: &[Array]| -> nuvec::Result<Vec<Array>> {
            let (y, s) = fast::gated_delta(&a[0], &a[1], &a[2], &a[3], &a[4], Some(&a[5]));
            Ok(vec![y, s])
        };
        let (_, got) = vjp_flat(f, &primals, &cots).unwrap();
        let want = op.composition(&inputs);
        for (i, name) in ["q", "k", "v", "g", "beta", "state"].into_iter().enumerate() {
            let what = format!("d{name} {d:?} {dtype} gate {gate} state {state} cotangents y {cot_y} state {cot_s}");
            near(&what, &got[i], &want[i], 3.0 * epsilon(dtype));
        }
    }
}

/// vmap over a new leading axis (of some inputs, the others shared) against a loop.
#[test]
fn vmap_over_a_leading_axis_matches_a_loop() {
    let mut rng = Rng(0x6a7e_d0e8);
    let d = dims(2, 4, 1, 2, 8, 4);
    for (channel, masked, axes) in [
        (false, false, [Some(0); 7]),
        (true, true, [Some(0), Some(0), None, Some(0), None, Some(0), Some(0)]),
        (false, true, [None, Some(0), Some(0), None, Some(0), None, None]),
    ] {
        let items: Vec<Call> =
            (0..3).map(|_| call(&mut rng, d, DType::F32, DType::F32, channel, masked, Some(DType::F32))).collect();
        let args = |c: &Call| {
            let mut a = c.x.clone();
            a.push(c.state.clone().unwrap());
            a.push(c.mask.clone().unwrap_or_else(|| ops::ones([d.b as i32, d.t as i32], DType::Bool)));
            a
        };
        // Unmapped inputs are the first item's in every item.
        let per_item: Vec<Vec<Array>> = items
            .iter()
            .map(|c| {
                args(c)
                    .into_iter()
                    .zip(args(&items[0]))
                    .zip(axes)
                    .map(|((a, f), ax)| if ax.is_some() { a } else { f })
                    .collect()
            })
            .collect();
        let batched: Vec<Array> = (0..7)
            .map(|j| match axes[j] {
                Some(_) => ops::stack(&per_item.iter().map(|a| a[j].clone()).collect::<Vec<_>>(), 0),
                None => per_item[0][j].clone(),
            })
            .collect();
        let f = move |a: &[Array]| -> nuvec::Result<Vec<Array>> {
            let options = StepOptions { storage: None, mask: masked.then(|| a[6].clone()) };
            let (y, s) = fast::gated_delta_with(&a[0], &a[1], &a[2], &a[3], &a[4], Some(&a[5]), &options);
            Ok(vec![y, s])
        };
        let got = vmap_flat(f, &axes, &[0, 0])(&batched).unwrap();
        for (o, name) in ["y", "state"].into_iter().enumerate() {
            let want = ops::stack(&per_item.iter().map(|a| f(a).unwrap()[o].clone()).collect::<Vec<_>>(), 0);
            let what = format!("vmap {name} channel {channel} masked {masked} axes {axes:?}");
            close(&what, &got[o], want.shape(), &f64s(&want), 2e-6);
        }
    }
}

/// mlx-lm's `gated_delta_ops` (MLX 0.32.4 on the CPU): `y` and the last state.
#[test]
fn mlx_gated_delta_ops_match() {
    let bytes = std::fs::read(FIXTURE).expect("fixture file");
    let fx = Fixture::parse(&bytes).expect("fixture parses");
    assert!(fx.cases.len() >= 9, "only {} cases", fx.cases.len());
    let mut failures = Vec::new();
    for case in &fx.cases {
        assert_eq!(case.op, "gated_delta_ops", "{}", case.name);
        let flag = |key: &str| case.params.get(key).and_then(|v| v.as_bool()).expect(key);
        let x: Vec<Array> = case.inputs.iter().map(|t| t.to_array()).collect();
        let mut rest = x[5..].iter();
        let state = if flag("state") { rest.next().cloned() } else { None };
        let mask = if flag("mask") { rest.next().cloned() } else { None };
        let options = StepOptions { storage: None, mask };
        let (y, s) = fast::gated_delta_with(&x[0], &x[1], &x[2], &x[3], &x[4], state.as_ref(), &options);
        // MLX sums in its own order: float32's rounding over the steps; y in q's dtype.
        let t = |d: DType| match d {
            DType::F32 => Tolerance::close(2e-5, 2e-5),
            d => Tolerance::close(2.0 * epsilon(d), 2.0 * epsilon(d)),
        };
        for (i, (got, tol)) in [(y, t(x[0].dtype())), (s, t(DType::F32))].into_iter().enumerate() {
            let r = got
                .to_bytes()
                .map_err(|e| e.to_string())
                .and_then(|b| compare(&case.outputs[i], got.dtype(), got.shape(), &b, tol).map_err(|m| m.to_string()));
            if let Err(m) = r {
                failures.push(format!("{} output {i}: {m}", case.name));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// Times `fast::gated_delta` on Qwen3-Next's linear attention (16 key heads, 32 value heads,
/// 128 features each): decode steps of 1 to 8 rows, chunks of 4 to 64 steps, a 512-token
/// prefill. Run it as is (the fused kernel) and with `NUVEC_FUSED=0` (the composition):
/// `cargo test --release -p nuvec --test suite gated_delta::timing -- --ignored --nocapture`;
/// `GATED_DELTA_CASES=<text>` keeps the cases whose label (`B 1 T 512 float32`) holds it.
#[test]
#[ignore]
fn timing() {
    let mut rng = Rng(0x6a7e_d0e9);
    let path = if fast::fused_enabled() { "fused" } else { "composition" };
    for (b, t, dtype) in [
        (1, 1, DType::F32),
        (2, 1, DType::F32),
        (4, 1, DType::F32),
        (8, 1, DType::F32),
        (1, 1, DType::BF16),
        (8, 1, DType::BF16),
        (1, 4, DType::F32),
        (1, 16, DType::F32),
        (1, 64, DType::F32),
        (1, 512, DType::F32),
        (1, 512, DType::BF16),
    ] {
        let label = format!("B {b} T {t} {dtype}");
        if std::env::var("GATED_DELTA_CASES").is_ok_and(|f| !label.contains(&f)) {
            continue;
        }
        let d = dims(b, t, 16, 32, 128, 128);
        let c = call(&mut rng, d, dtype, DType::F32, false, false, Some(DType::F32));
        let run = || {
            let (y, s) = c.run(None);
            nuvec::eval(&(&y, &s)).unwrap();
        };
        run();
        let mut times = Vec::new();
        let start = std::time::Instant::now();
        while times.len() < 5 || (start.elapsed().as_secs_f64() < 2.0 && times.len() < 1000) {
            let t0 = std::time::Instant::now();
            run();
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let (median, min, n) = (times[times.len() / 2], times[0], times.len());
        println!("gated_delta {path} {label}: median {median:.3} ms, min {min:.3} ms ({n} runs)");
    }
}
