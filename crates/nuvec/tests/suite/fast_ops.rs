//! `nuvec::fast` norms, RoPE, SwiGLU and cross entropy against float64 loops written here:
//! rows of 1 to 65536 features (non-multiples of 8 included), several batch shapes, every
//! float dtype, contiguous and strided inputs; the fused primitive against its composition;
//! fused derivatives against the composition's; bad arguments named in the error. The tests
//! run on the default device, so a GPU run (`NUVEC_REQUIRE_GPU=1`) checks its kernels.
//! Derivatives against finite differences and vmap are in `transforms_ops.rs`.

use nuvec::fast::{self, FastOp, RopeParams};
use nuvec::transforms::vjp_flat;

use crate::epsilon;
use nuvec::{Array, DType};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn values(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| lo + (hi - lo) * self.unit()).collect()
    }
}

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];
/// (rows, features): rows of 1..65536, non-multiples of 8 among them.
// (67, 1536), (20000, 16) and (5000, 640) give the GPU's register-row kernels several rows per
// block and, for the last two, several per group of threads (with one warp per row, and with
// groups of several warps and their barriers).
const SHAPES: [(i32, i32); 11] =
    [(1, 1), (3, 7), (5, 8), (4, 33), (17, 256), (2, 1000), (3, 4099), (2, 8192), (1, 65536), (67, 1536), (20000, 16)];

/// The epsilon the tests pass, as the float32 the operations receive.
const EPS5: f64 = 1e-5f32 as f64;

fn f64s(a: &Array) -> Vec<f64> {
    a.astype(DType::F64).to_vec::<f64>().unwrap_or_else(|e| panic!("{e}"))
}

/// `values` in `dtype`, laid out as `[rows, d]` but strided when `strided` (the transpose of
/// a `[d, rows]` array), and the values as the dtype rounded them.
fn input(values: &[f64], rows: i32, d: i32, dtype: DType, strided: bool) -> (Array, Vec<f64>) {
    let a = if strided {
        let t: Vec<f64> = (0..d as usize)
            .flat_map(|j| (0..rows as usize).map(move |i| (i, j)))
            .map(|(i, j)| values[i * d as usize + j])
            .collect();
        Array::from_slice(&t, [d, rows]).astype(dtype).t()
    } else {
        Array::from_slice(values, [rows, d]).astype(dtype)
    };
    let rounded = f64s(&a);
    (a, rounded)
}

/// Rounding to `dtype` (a few times) plus `float32` accumulation over `d` terms.
fn close(what: &str, got: &[f64], want: &[f64], dtype: DType, d: i32) {
    let acc = if dtype == DType::F64 { epsilon(DType::F64) } else { epsilon(DType::F32) };
    close_within(what, got, want, 4.0 * epsilon(dtype) + acc * (16.0 + (d as f64).sqrt()));
}

/// `|got − want| ≤ tol · (1 + |want|)` element by element.
fn close_within(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}: element {i}: {g} vs {w} (tolerance {tol:e} relative)");
    }
}

fn rms_ref(x: &[f64], d: usize, w: Option<&[f64]>, eps: f64) -> Vec<f64> {
    x.chunks(d)
        .flat_map(|r| {
            let n = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
            r.iter().enumerate().map(move |(j, v)| v * n * w.map_or(1.0, |w| w[j]))
        })
        .collect()
}

fn layer_ref(x: &[f64], d: usize, w: Option<&[f64]>, b: Option<&[f64]>, eps: f64) -> Vec<f64> {
    x.chunks(d)
        .flat_map(|r| {
            let mu = r.iter().sum::<f64>() / d as f64;
            let var = r.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / d as f64;
            let n = 1.0 / (var + eps).sqrt();
            r.iter().enumerate().map(move |(j, v)| (v - mu) * n * w.map_or(1.0, |w| w[j]) + b.map_or(0.0, |b| b[j]))
        })
        .collect()
}

#[test]
fn norms_match_float64_over_shapes_dtypes_and_layouts() {
    let mut rng = Rng(7);
    for &(rows, d) in &SHAPES {
        let n = (rows * d) as usize;
        let xv = rng.values(n, -3.0, 3.0);
        let rv = rng.values(n, -1.0, 1.0);
        let wv = rng.values(d as usize, 0.5, 1.5);
        let bv = rng.values(d as usize, -0.5, 0.5);
        for dtype in DTYPES {
            for strided in [false, true] {
                let what = |op: &str| format!("{op} {rows}x{d} {dtype:?} strided={strided}");
                let (x, xr) = input(&xv, rows, d, dtype, strided);
                let (w, wr) = input(&wv, 1, d, dtype, false);
                let w = w.reshape([d]);
                let (b, br) = input(&bv, 1, d, dtype, false);
                let b = b.reshape([d]);
                let y = fast::rms_norm(&x, &w, 1e-5);
                assert_eq!((y.shape(), y.dtype()), (&[rows, d][..], dtype));
                close(&what("rms_norm"), &f64s(&y), &rms_ref(&xr, d as usize, Some(&wr), EPS5), dtype, d);
                let y = fast::rms_norm(&x, None, 1e-5);
                close(&what("rms_norm (no weight)"), &f64s(&y), &rms_ref(&xr, d as usize, None, EPS5), dtype, d);
                let y = fast::layer_norm(&x, &w, &b, 1e-5);
                let want = layer_ref(&xr, d as usize, Some(&wr), Some(&br), EPS5);
                close(&what("layer_norm"), &f64s(&y), &want, dtype, d);
                let y = fast::layer_norm(&x, None, None, 1e-5);
                close(&what("layer_norm (plain)"), &f64s(&y), &layer_ref(&xr, d as usize, None, None, EPS5), dtype, d);

                let (r, rr) = input(&rv, rows, d, dtype, !strided);
                let (h, y) = fast::add_rms_norm(&x, &r, &w, 1e-6);
                // h is rounded to the dtype before the norm reads it, as in the composition.
                let hr: Vec<f64> = f64s(&(&x + &r));
                let hsum: Vec<f64> = xr.iter().zip(&rr).map(|(a, b)| a + b).collect();
                close(&what("add_rms_norm h"), &f64s(&h), &hsum, dtype, 1);
                close(
                    &what("add_rms_norm y"),
                    &f64s(&y),
                    &rms_ref(&hr, d as usize, Some(&wr), 1e-6f32 as f64),
                    dtype,
                    d,
                );
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn rope_ref(
    x: &[f64],
    shape: &[i32],
    dims: usize,
    traditional: bool,
    inv_freq: &[f64],
    scale: f64,
    offsets: &[i32],
    forward: bool,
) -> Vec<f64> {
    let (t, d) = (shape[shape.len() - 2] as usize, shape[shape.len() - 1] as usize);
    let per_batch = x.len() / shape[0] as usize;
    let mut out = x.to_vec();
    for (row, chunk) in out.chunks_mut(d).enumerate() {
        let batch = row * d / per_batch;
        let pos = (offsets[batch.min(offsets.len() - 1)] as f64 + (row % t) as f64) * scale;
        let src = &x[row * d..row * d + d];
        for (i, f) in inv_freq.iter().enumerate().take(dims / 2) {
            let (a, b) = if traditional { (2 * i, 2 * i + 1) } else { (i, i + dims / 2) };
            let th = pos * f;
            let (c, s) = (th.cos(), if forward { th.sin() } else { -th.sin() });
            chunk[a] = src[a] * c - src[b] * s;
            chunk[b] = src[a] * s + src[b] * c;
        }
    }
    out
}

/// (shape, dims, traditional, base (else freqs), scale, offsets: one, or one per batch row)
type RopeCase = (Vec<i32>, usize, bool, bool, f64, Vec<i32>);

#[test]
fn rope_matches_float64_over_layouts_offsets_and_dtypes() {
    let mut rng = Rng(11);
    let cases: Vec<RopeCase> = vec![
        (vec![1, 4, 1, 128], 128, false, true, 1.0, vec![37]),
        (vec![2, 3, 5, 64], 64, true, true, 1.0, vec![0]),
        (vec![2, 2, 7, 80], 32, false, true, 0.25, vec![5, 1000]),
        (vec![3, 9, 12], 6, true, false, 2.0, vec![2, 0, 9]),
        (vec![1, 32, 33, 128], 128, false, false, 1.0, vec![4095]),
        // Odd halves and odd row lengths (the GPU's per-element paths, a partial last chunk of
        // copied features), and rows enough for several per GPU thread row.
        (vec![2, 3, 4, 10], 10, false, true, 1.0, vec![3, 8]),
        (vec![2, 3, 4, 11], 6, false, true, 1.0, vec![3, 8]),
        (vec![2, 3, 4, 11], 6, true, true, 1.0, vec![0]),
        (vec![3, 40, 600, 128], 128, false, true, 1.0, vec![3, 0, 700]),
    ];
    for (shape, dims, traditional, with_base, scale, offsets) in cases {
        let n: i32 = shape.iter().product();
        let xv = rng.values(n as usize, -2.0, 2.0);
        let half = dims / 2;
        let base = 10000.0f64;
        let freqs: Vec<f32> = (0..half).map(|i| 1.0 + 3.0 * i as f32).collect();
        let inv_freq: Vec<f64> = if with_base {
            (0..half).map(|i| (-(i as f64) * base.ln() / half as f64).exp()).collect()
        } else {
            freqs.iter().map(|&f| 1.0 / f as f64).collect()
        };
        let offset = if offsets.len() == 1 {
            Array::from(offsets[0])
        } else {
            Array::from_slice(&offsets, [offsets.len() as i32])
        };
        let freq_arr = Array::from_slice(&freqs, [half as i32]);
        for dtype in DTYPES {
            let x = Array::from_slice(&xv, shape.as_slice()).astype(dtype);
            let xr = f64s(&x);
            let (b, f) = if with_base { (Some(base as f32), None) } else { (None, Some(&freq_arr)) };
            let y = fast::rope(&x, dims as i32, traditional, b, scale as f32, &offset, f);
            let what = format!("rope {shape:?} dims {dims} trad {traditional} {dtype:?}");
            let want = rope_ref(&xr, &shape, dims, traditional, &inv_freq, scale, &offsets, true);
            // Angles (up to ~4000 radians here) are float32: their error is ~position · 2⁻²⁴.
            let max_pos = (offsets.iter().max().copied().unwrap_or(0) as f64 + shape[shape.len() - 2] as f64) * scale;
            let tol = 4.0 * epsilon(dtype) + (16.0 + 4.0 * max_pos) * epsilon(DType::F32);
            close_within(&what, &f64s(&y), &want, tol);
            // The inverse rotation undoes it: the cotangent path.
            let g = Array::from_slice(&xv, shape.as_slice()).astype(dtype);
            let op = FastOp::Rope(RopeParams {
                dims: dims as i32,
                traditional,
                base: b,
                scale: scale as f32,
                forward: true,
            });
            let mut inputs = vec![x.clone(), offset.clone()];
            inputs.extend(f.cloned());
            let f_op = op.clone();
            let (_, d) = vjp_flat(move |a| Ok(f_op.composition(a)), &inputs, std::slice::from_ref(&g)).unwrap();
            let want = rope_ref(&f64s(&g), &shape, dims, traditional, &inv_freq, scale, &offsets, false);
            close_within(&format!("{what} (vjp)"), &f64s(&d[0]), &want, tol);
        }
    }
}

#[test]
fn swiglu_and_cross_entropy_match_float64() {
    let mut rng = Rng(13);
    for &(rows, d) in &SHAPES {
        let n = (rows * d) as usize;
        let (gv, uv) = (rng.values(n, -6.0, 6.0), rng.values(n, -2.0, 2.0));
        let targets: Vec<i32> = (0..rows).map(|r| if r % 5 == 4 { -100 } else { (r * 7919) % d }).collect();
        for dtype in DTYPES {
            for strided in [false, true] {
                let what = |op: &str| format!("{op} {rows}x{d} {dtype:?} strided={strided}");
                let (g, gr) = input(&gv, rows, d, dtype, strided);
                let (u, ur) = input(&uv, rows, d, dtype, false);
                let y = fast::swiglu(&g, &u);
                let want: Vec<f64> = gr.iter().zip(&ur).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
                close(&what("swiglu"), &f64s(&y), &want, dtype, 1);

                let t = Array::from_slice(&targets, [rows]);
                let loss = fast::cross_entropy(&g, &t);
                assert_eq!(loss.dtype(), if dtype == DType::F64 { DType::F64 } else { DType::F32 });
                let want: Vec<f64> = gr
                    .chunks(d as usize)
                    .zip(&targets)
                    .map(|(r, &t)| {
                        if t < 0 {
                            return 0.0;
                        }
                        let m = r.iter().cloned().fold(f64::MIN, f64::max);
                        m + r.iter().map(|v| (v - m).exp()).sum::<f64>().ln() - r[t as usize]
                    })
                    .collect();
                // The loss is float32 whatever the logits (float64 for float64): accumulation only.
                let loss_dtype = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
                close(&what("cross_entropy"), &f64s(&loss), &want, loss_dtype, d);
            }
        }
    }
}

/// `rope_kv_write` against `rope` and writes done here: one and three new positions, whole and
/// partial rotations, halves and interleaved pairs, `base` and `freqs`, every float dtype but
/// float64; the caches' other rows unchanged.
#[test]
fn rope_kv_write_matches_rope_and_the_writes() {
    let mut rng = Rng(31);
    let (b, hq, kv, d, cap) = (2, 4, 2, 64, 16);
    let start = [5i32, 9];
    for l in [1, 3] {
        for dims in [64, 32] {
            for traditional in [false, true] {
                for with_freqs in [false, true] {
                    for dtype in [DType::F32, DType::BF16, DType::F16] {
                        let what = format!(
                            "rope_kv_write L={l} dims={dims} traditional={traditional} freqs={with_freqs} {dtype:?}"
                        );
                        let h = hq + 2 * kv;
                        let qkv = Array::from_slice(&rng.values((b * l * h * d) as usize, -2.0, 2.0), [b, l, h, d])
                            .astype(dtype);
                        let mut cache = |seed: f64| {
                            Array::from_slice(
                                &rng.values((b * kv * cap * d) as usize, seed - 1.0, seed),
                                [b, kv, cap, d],
                            )
                            .astype(dtype)
                        };
                        let (kc, vc) = (cache(0.0), cache(5.0));
                        let starts = Array::from_slice(&start, [b]);
                        let freqs = Array::from_slice(&rng.values((dims / 2) as usize, 1.0, 100.0), [dims / 2])
                            .astype(DType::F32);
                        let (base, f) = if with_freqs { (None, Some(&freqs)) } else { (Some(1e4), None) };
                        let (q, k, v) =
                            fast::rope_kv_write(&qkv, hq, &kc, &vc, &starts, dims, traditional, base, 1.0, f);
                        let heads = |from: i32, n: i32| {
                            qkv.slice(&[0, 0, from, 0], &[b, l, from + n, d], &[1, 1, 1, 1]).transpose(&[0, 2, 1, 3])
                        };
                        let rotated = fast::rope(&heads(0, hq + kv), dims, traditional, base, 1.0, &starts, f);
                        let want_q = rotated.slice(&[0, 0, 0, 0], &[b, hq, l, d], &[1, 1, 1, 1]);
                        close(&format!("{what}: q"), &f64s(&q), &f64s(&want_q), dtype, 1);
                        // The caches: rows start[b] + t replaced by the new keys (rotated) and values.
                        for (name, got, old, new) in [
                            ("k_cache", &k, &kc, rotated.slice(&[0, hq, 0, 0], &[b, hq + kv, l, d], &[1, 1, 1, 1])),
                            ("v_cache", &v, &vc, heads(hq + kv, kv)),
                        ] {
                            let (mut want, new) = (f64s(old), f64s(&new));
                            for (bi, hi, t) in
                                (0..b).flat_map(|bi| (0..kv).flat_map(move |hi| (0..l).map(move |t| (bi, hi, t))))
                            {
                                let row = (((bi * kv + hi) * cap + start[bi as usize] + t) * d) as usize;
                                let src = (((bi * kv + hi) * l + t) * d) as usize;
                                want[row..row + d as usize].copy_from_slice(&new[src..src + d as usize]);
                            }
                            close(&format!("{what}: {name}"), &f64s(got), &want, dtype, 1);
                        }
                        // The same writes through rows naming those positions of the caches seen
                        // as pools of rows ([B·Hkv·S, D]), as a paged cache's block table names them.
                        let rows: Vec<i32> = (0..b)
                            .flat_map(|bi| {
                                (0..l).flat_map(move |t| {
                                    (0..kv).map(move |hi| (bi * kv + hi) * cap + start[bi as usize] + t)
                                })
                            })
                            .collect();
                        let rows = Array::from_slice(&rows, [b, l, kv]);
                        let by_rows = fast::rope_kv_write_rows(
                            &qkv,
                            hq,
                            &kc,
                            &vc,
                            &starts,
                            &rows,
                            dims,
                            traditional,
                            base,
                            1.0,
                            f,
                        );
                        for (name, x, y) in [("q", &q, &by_rows.0), ("k", &k, &by_rows.1), ("v", &v, &by_rows.2)] {
                            assert_eq!(f64s(x), f64s(y), "{what}: {name} through rows");
                        }
                    }
                }
            }
        }
    }
    // Bad arguments are named.
    let x = Array::from_slice(&[0.0f32; 64], [1, 1, 4, 16]);
    let c = Array::from_slice(&[0.0f32; 64], [1, 1, 4, 16]);
    let s = Array::from_slice(&[0i32], [1]);
    let msg = |(q, _, _): (Array, Array, Array)| q.check().expect_err("must fail").to_string();
    assert!(msg(fast::rope_kv_write(&x, 3, &c, &c, &s, 16, false, Some(1e4), 1.0, None)).contains("heads"));
    assert!(
        msg(fast::rope_kv_write(&x, 2, &c.reshape([1, 1, 2, 32]), &c, &s, 16, false, Some(1e4), 1.0, None))
            .contains("k_cache")
    );
    assert!(msg(fast::rope_kv_write(&x, 2, &c, &c, &s, 15, false, Some(1e4), 1.0, None)).contains("dims"));
    assert!(
        msg(fast::rope_kv_write(&x, 2, &c, &c, &Array::from_slice(&[0i32, 1], [2]), 16, false, Some(1e4), 1.0, None))
            .contains("start")
    );
    let rows = Array::from_slice(&[0i32, 1], [1, 1, 2]);
    let e = msg(fast::rope_kv_write_rows(&x, 2, &c, &c, &s, &rows, 16, false, Some(1e4), 1.0, None));
    assert!(e.contains("rope_kv_write_rows: rows must be int32 of shape [1, 1, 1]"), "{e}");
    let e = msg(fast::rope_kv_write_rows(&x, 2, &c.reshape([64]), &c, &s, &rows, 16, false, Some(1e4), 1.0, None));
    assert!(e.contains("k_cache must be [.., 16]"), "{e}");
}

/// `rms_norm_matmul` and `swiglu_matmul` against float64: 1 to 9 rows (the GPU's GEMV takes up
/// to 2 with its prologue, `NUVEC_GEMV_MAX_ROWS` up to 8), lengths with and without a tail of fewer than 8, leading axes,
/// gate and up as the halves of one joined product (strided rows), with and without `c`, and
/// `b` transposed (the GPU's fused path) or row-major (its fallback), rows of no features;
/// derivatives against the composition's.
#[test]
fn products_with_a_prologue_match_float64() {
    let mut rng = Rng(29);
    for &(lead, k, n) in &[(&[1][..], 256, 384), (&[3, 1][..], 1000, 72), (&[8][..], 300, 40), (&[9][..], 64, 24)] {
        let rows: i32 = lead.iter().product();
        let shape = |last: i32| [lead, &[last]].concat();
        let (xv, wv, bv) = (
            rng.values((rows * k) as usize, -2.0, 2.0),
            rng.values(k as usize, 0.5, 1.5),
            rng.values((k * n) as usize, -0.5, 0.5),
        );
        let (jv, cv) = (rng.values((rows * 2 * k) as usize, -3.0, 3.0), rng.values((rows * n) as usize, -1.0, 1.0));
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let x = Array::from_slice(&xv, shape(k).as_slice()).astype(dtype);
            let w = Array::from_slice(&wv, [k]).astype(dtype);
            // b as the transposed weight [n, k] (a Linear's), and as a row-major [k, n].
            let wt = Array::from_slice(&bv, [n, k]).astype(dtype);
            let joined = Array::from_slice(&jv, shape(2 * k).as_slice()).astype(dtype);
            let c = Array::from_slice(&cv, shape(n).as_slice()).astype(dtype);
            let r = lead.len() as i32;
            let half = |from: i32| {
                let (mut lo, mut hi) = (vec![0; lead.len() + 1], shape(2 * k));
                (lo[r as usize], hi[r as usize]) = (from, from + k);
                joined.slice(&lo, &hi, &vec![1; lead.len() + 1])
            };
            let (gate, up) = (half(0), half(k));
            let (xr, wr, btr) = (f64s(&x), f64s(&w), f64s(&wt));
            let (gr, ur, cr) = (f64s(&gate), f64s(&up), f64s(&c));
            // y[i, j] = Σ_l a[i, l] · bt[j, l], and Σ_l |a[i, l] · bt[j, l]|, which bounds the
            // error of a sum whose terms cancel.
            let product = |a: &[f64]| -> (Vec<f64>, Vec<f64>) {
                let dot = |f: fn(f64) -> f64| -> Vec<f64> {
                    a.chunks(k as usize)
                        .flat_map(|row| {
                            btr.chunks(k as usize).map(move |col| row.iter().zip(col).map(|(p, q)| f(p * q)).sum())
                        })
                        .collect()
                };
                (dot(|v| v), dot(f64::abs))
            };
            let close = |what: &str, got: &Array, (want, size): &(Vec<f64>, Vec<f64>)| {
                let tol = 4.0 * epsilon(dtype) + epsilon(DType::F32) * (16.0 + (k as f64).sqrt());
                for (i, ((g, w), m)) in f64s(got).iter().zip(want).zip(size).enumerate() {
                    assert!((g - w).abs() <= tol * (1.0 + m), "{what}: element {i}: {g} vs {w} (terms' size {m})");
                }
            };
            let normed = rms_ref(&xr, k as usize, Some(&wr), EPS5);
            let gated: Vec<f64> = gr.iter().zip(&ur).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let (want_norm, want_gated) = (product(&normed), product(&gated));
            let want_add = (want_gated.0.iter().zip(&cr).map(|(y, c)| y + c).collect(), want_gated.1.clone());
            for (layout, b) in [("W^T", wt.t()), ("row-major", wt.t().copy())] {
                let what = |op: &str| format!("{op} {lead:?}x{k} -> {n} {dtype:?} b {layout}");
                let y = fast::rms_norm_matmul(&x, &w, 1e-5, &b);
                assert_eq!((y.shape(), y.dtype()), (shape(n).as_slice(), dtype), "{}", what("rms_norm_matmul"));
                close(&what("rms_norm_matmul"), &y, &want_norm);
                close(&what("swiglu_matmul"), &fast::swiglu_matmul(&gate, &up, &b, None), &want_gated);
                close(&what("swiglu_matmul + c"), &fast::swiglu_matmul(&gate, &up, &b, Some(&c)), &want_add);
            }
        }
        // Derivatives (float32) are the composition's.
        let x = Array::from_slice(&xv, shape(k).as_slice()).astype(DType::F32);
        let w = Array::from_slice(&wv, [k]).astype(DType::F32);
        let b = Array::from_slice(&bv, [n, k]).astype(DType::F32).t();
        let g = Array::from_slice(&cv, shape(n).as_slice()).astype(DType::F32);
        let inputs = [x.clone(), w.clone(), b.clone()];
        let (_, fused) =
            vjp_flat(|a| Ok(vec![fast::rms_norm_matmul(&a[0], &a[1], 1e-5, &a[2])]), &inputs, std::slice::from_ref(&g))
                .unwrap();
        let (_, comp) =
            vjp_flat(|a| Ok(vec![fast::rms_norm(&a[0], &a[1], 1e-5).matmul(&a[2])]), &inputs, std::slice::from_ref(&g))
                .unwrap();
        for (i, (f, c)) in fused.iter().zip(&comp).enumerate() {
            close(&format!("rms_norm_matmul cotangent {i}"), &f64s(f), &f64s(c), DType::F32, k * n);
        }
        let inputs = [x.clone(), x.sin(), b.clone(), g.clone()];
        let (_, fused) = vjp_flat(
            |a| Ok(vec![fast::swiglu_matmul(&a[0], &a[1], &a[2], Some(&a[3]))]),
            &inputs,
            std::slice::from_ref(&g),
        )
        .unwrap();
        let (_, comp) =
            vjp_flat(|a| Ok(vec![&a[3] + &fast::swiglu(&a[0], &a[1]).matmul(&a[2])]), &inputs, &[g]).unwrap();
        for (i, (f, c)) in fused.iter().zip(&comp).enumerate() {
            close(&format!("swiglu_matmul cotangent {i}"), &f64s(f), &f64s(c), DType::F32, k * n);
        }
    }
    // Rows of no features: an empty sum, so zeros (plus c).
    let (e, b0) = (Array::from_slice(&[0.0f32; 0], [2, 0]), Array::from_slice(&[0.0f32; 0], [0, 3]));
    let c = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    let y = fast::rms_norm_matmul(&e, &Array::from_slice(&[0.0f32; 0], [0]), 1e-5, &b0);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0; 6]);
    let y = fast::swiglu_matmul(&e, &e, &b0, Some(&c));
    assert_eq!(y.to_vec::<f32>().unwrap(), c.to_vec::<f32>().unwrap());
}

/// The loss and the logits' gradient evaluated together against float64: the cotangent
/// computed, pending, and depending on the loss; ignored and out-of-range targets.
#[test]
fn cross_entropy_loss_and_gradient_together_match_float64() {
    let mut rng = Rng(23);
    // Rows the joint loss-and-gradient kernel takes in one block (1000), in clusters of two and
    // five blocks (40000; 160000 in bf16 — in float32 it needs more than 8 and takes two
    // kernels), and rows it leaves to the two kernels (7 and 70001: not whole 16-byte vectors).
    for &(rows, d) in &[(5, 7), (9, 1000), (3, 70001), (4, 40000), (2, 160000)] {
        let xv = rng.values((rows * d) as usize, -6.0, 6.0);
        let targets: Vec<i32> = (0..rows)
            .map(|r| {
                if r == 1 {
                    -100
                } else if r == 2 {
                    d + 3
                } else {
                    (r * 31) % d
                }
            })
            .collect();
        let t = Array::from_slice(&targets, [rows]);
        let cot: Vec<f64> = (0..rows).map(|r| 0.5 + r as f64 / 7.0).collect();
        for dtype in [DType::F32, DType::BF16, DType::F64] {
            let x = Array::from_slice(&xv, [rows, d]).astype(dtype);
            let xr = f64s(&x);
            let loss_dtype = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
            for how in ["computed", "pending", "loss-dependent"] {
                let what = format!("cross_entropy with gradient {rows}x{d} {dtype:?} cotangent {how}");
                let g = Array::from_slice(&cot, [rows]).astype(loss_dtype);
                g.eval().unwrap();
                let t2 = t.clone();
                let (outs, grads) = match how {
                    "computed" => {
                        vjp_flat(move |p| Ok(vec![fast::cross_entropy(&p[0], &t2)]), std::slice::from_ref(&x), &[g])
                    }
                    // The cotangent is still to compute when the loss is.
                    "pending" => vjp_flat(
                        move |p| Ok(vec![fast::cross_entropy(&p[0], &t2)]),
                        std::slice::from_ref(&x),
                        &[&g * 1.0],
                    ),
                    // loss²/2 with cotangent g: the loss's cotangent g·loss needs the loss first.
                    _ => vjp_flat(
                        move |p| {
                            let l = fast::cross_entropy(&p[0], &t2);
                            Ok(vec![&l * &l * 0.5])
                        },
                        std::slice::from_ref(&x),
                        &[g],
                    ),
                }
                .unwrap();
                nuvec::eval(&(&outs[0], &grads[0])).unwrap();
                let mut want_loss = Vec::new();
                let mut want_dx = Vec::new();
                let mut floor = Vec::new();
                for (r, row) in xr.chunks(d as usize).enumerate() {
                    let tr = targets[r];
                    let m = row.iter().cloned().fold(f64::MIN, f64::max);
                    let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                    let loss = if tr < 0 {
                        0.0
                    } else if tr >= d {
                        f64::NAN
                    } else {
                        lse - row[tr as usize]
                    };
                    let counted = tr >= 0 && tr < d;
                    let gl = if how == "loss-dependent" { cot[r] * loss } else { cot[r] };
                    want_loss.push(if how == "loss-dependent" { loss * loss * 0.5 } else { loss });
                    for (i, v) in row.iter().enumerate() {
                        let onehot = if i as i32 == tr { 1.0 } else { 0.0 };
                        want_dx.push(if counted { gl * ((v - lse).exp() - onehot) } else { 0.0 });
                        // Element by element: the dtype's rounding of each value, and the
                        // statistics' float32 error (log-sum-exp, ~64 ulp) times the row's scale.
                        floor.push(if counted { 64.0 * epsilon(loss_dtype) * gl.abs() } else { 0.0 });
                    }
                }
                close(&format!("{what}: loss"), &f64s(&outs[0]), &want_loss, loss_dtype, d);
                let got = f64s(&grads[0]);
                for (i, ((g, w), f)) in got.iter().zip(&want_dx).zip(&floor).enumerate() {
                    let ok = (g - w).abs() <= 4.0 * epsilon(dtype) * w.abs() + f || (g.is_nan() && w.is_nan());
                    assert!(ok, "{what}: gradient element {i}: {g} vs {w}");
                }
            }
        }
    }
}

/// One Adam update against float64 arithmetic, with and without decay and bias correction,
/// over every float dtype and strided inputs; in `float32` the fused kernel and the
/// composition agree bit for bit (the same operations in the same order).
#[test]
fn adam_step_matches_float64_and_its_composition() {
    let mut rng = Rng(11);
    let settings = [
        fast::AdamParams { beta1: 0.9, beta2: 0.999, eps: 1e-8, decay: 1.0, step: 1e-3, scale: 1.0 },
        fast::AdamParams { beta1: 0.8, beta2: 0.95, eps: 1e-6, decay: 0.999, step: 0.05, scale: 3.5 },
    ];
    for a in settings {
        for dtype in DTYPES {
            for (rows, d, strided) in [(3, 7, false), (64, 1000, false), (40, 33, true)] {
                let n = (rows * d) as usize;
                let (p, pw) = input(&rng.values(n, -2.0, 2.0), rows, d, dtype, strided);
                let (g, gw) = input(&rng.values(n, -1.0, 1.0), rows, d, dtype, false);
                let (m, mw) = input(&rng.values(n, -0.5, 0.5), rows, d, dtype, strided);
                let (v, vw) = input(&rng.values(n, 0.0, 0.3), rows, d, dtype, false);
                let (np, nm, nv) = fast::adam_step(&p, &g, &m, &v, &a);
                let f = |x: f32| x as f64;
                let mut want = (Vec::new(), Vec::new(), Vec::new());
                for i in 0..n {
                    let m1 = mw[i] * f(a.beta1) + gw[i] * f(1.0 - a.beta1);
                    let v1 = vw[i] * f(a.beta2) + gw[i] * gw[i] * f(1.0 - a.beta2);
                    let p1 = pw[i] * f(a.decay) - m1 * f(a.step) / (v1.sqrt() * f(a.scale) + f(a.eps));
                    want.0.push(p1);
                    want.1.push(m1);
                    want.2.push(v1);
                }
                let what = |o: &str| format!("adam_step {o} {dtype} [{rows}, {d}] strided {strided} {a:?}");
                close(&what("p"), &f64s(&np), &want.0, dtype, 1);
                close(&what("m"), &f64s(&nm), &want.1, dtype, 1);
                close(&what("v"), &f64s(&nv), &want.2, dtype, 1);
                if dtype == DType::F32 && nuvec::default_device() == nuvec::Device::cpu() {
                    let c = FastOp::AdamStep(a).composition(&[p, g, m, v]);
                    for (fused, composed) in [(&np, &c[0]), (&nm, &c[1]), (&nv, &c[2])] {
                        assert_eq!(
                            fused.to_vec::<f32>().unwrap(),
                            composed.to_vec::<f32>().unwrap(),
                            "{}",
                            what("bits")
                        );
                    }
                }
            }
        }
    }
    let x = Array::from_slice(&[1.0f32, 2.0], [2]);
    let (bad, _, _) = fast::adam_step(&x, &x.reshape([1, 2]), &x, &x, &settings[0]);
    assert!(bad.error().unwrap().to_string().contains("adam_step"));
}

/// The fused derivative primitives against the derivative of the composition.
#[test]
fn fused_derivatives_match_the_composition() {
    let mut rng = Rng(17);
    // The last three shapes give each GPU derivative group several rows (the next row's loads,
    // the weight partials accumulated across rows); 2048 and 512 features are held in equal
    // shares by groups of 32·2^k threads (the layer norm's one-reduction kernel), the others not.
    for &(rows, d) in &[(3, 7), (4, 256), (2, 4099), (37, 2048), (600, 64), (20000, 64), (5000, 640), (3000, 512)] {
        let n = (rows * d) as usize;
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let x = Array::from_slice(&rng.values(n, -2.0, 2.0), [rows, d]).astype(dtype);
            let r = Array::from_slice(&rng.values(n, -2.0, 2.0), [rows, d]).astype(dtype);
            let w = Array::from_slice(&rng.values(d as usize, 0.5, 1.5), [d]).astype(dtype);
            let b = Array::from_slice(&rng.values(d as usize, -1.0, 1.0), [d]).astype(dtype);
            let c = Array::from_slice(&rng.values(n, -1.0, 1.0), [rows, d]).astype(dtype);
            let targets = Array::from_slice(
                &(0..rows).map(|i| if i == 1 { -1 } else { (i * 31) % d }).collect::<Vec<i32>>(),
                [rows],
            );
            let cases: Vec<(&str, FastOp, Vec<Array>, Vec<Array>)> = vec![
                (
                    "rms_norm",
                    FastOp::RmsNorm { eps: 1e-5, weighted: true },
                    vec![x.clone(), w.clone()],
                    vec![c.clone()],
                ),
                (
                    "add_rms_norm",
                    FastOp::AddRmsNorm { eps: 1e-5, weighted: true },
                    vec![x.clone(), r.clone(), w.clone()],
                    vec![r.clone(), c.clone()],
                ),
                (
                    "layer_norm",
                    FastOp::LayerNorm { eps: 1e-5, weighted: true, biased: true },
                    vec![x.clone(), w.clone(), b.clone()],
                    vec![c.clone()],
                ),
                ("swiglu", FastOp::SwiGlu, vec![x.clone(), r.clone()], vec![c.clone()]),
                (
                    "cross_entropy",
                    FastOp::CrossEntropy,
                    vec![x.clone(), targets.clone()],
                    vec![Array::from_slice(&rng.values(rows as usize, 0.5, 2.0), [rows]).astype(DType::F32)],
                ),
            ];
            for (name, op, inputs, cots) in cases {
                let (fused_op, comp_op) = (op.clone(), op.clone());
                let (_, fused) = vjp_flat(
                    move |a| {
                        Ok(nuvec::Array::from_op_multi(
                            fused_op.name(),
                            nuvec::graph::Primitive::Fast(fused_op.clone()),
                            a.to_vec(),
                        ))
                    },
                    &inputs,
                    &cots,
                )
                .unwrap();
                let ref_op = comp_op.clone();
                let (_, comp) = vjp_flat(move |a| Ok(comp_op.composition(a)), &inputs, &cots).unwrap();
                // The composition in float64 on the same (exactly widened) values. The residual
                // add's sum is rounded to the dtype by definition: the reference adds it first.
                let wide = |xs: &[Array]| -> Vec<Array> {
                    xs.iter().map(|a| if a.dtype().is_float() { a.astype(DType::F64) } else { a.clone() }).collect()
                };
                let mut ref_inputs = inputs.clone();
                if name == "add_rms_norm" {
                    ref_inputs[0] = &inputs[0] + &inputs[1];
                    ref_inputs[1] = nuvec::ops::zeros_like(&inputs[1]);
                }
                let (_, exact) =
                    vjp_flat(move |a| Ok(ref_op.composition(a)), &wide(&ref_inputs), &wide(&cots)).unwrap();
                for (i, (f, c)) in fused.iter().zip(&comp).enumerate() {
                    if !inputs[i].dtype().is_float() {
                        continue;
                    }
                    assert_eq!((f.shape(), f.dtype()), (c.shape(), c.dtype()), "{name} input {i}");
                    let what = format!("{name} {rows}x{d} {dtype:?} d(input {i})");
                    if f.ndim() < inputs[0].ndim() {
                        // A weight's or bias's cotangent sums over rows: the fused kernels
                        // accumulate in float32, the composition rounds each row's term to the
                        // dtype (and the CPU runs the composition for both). Both are held to
                        // the float64 composition: the dtype's rounding, and a float32 sum's
                        // error growing as √rows, relative to the largest cotangent.
                        let ex = f64s(&exact[i]);
                        let scale = ex.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                        let tol = (8.0 * epsilon(dtype) + 4.0 * (rows as f64).sqrt() * epsilon(DType::F32)) * scale;
                        for (label, got) in [("", f), (" (composition)", c)] {
                            for (j, (g, e)) in f64s(got).iter().zip(&ex).enumerate() {
                                assert!(
                                    (g - e).abs() <= tol,
                                    "{what}{label}: element {j}: {g} vs {e} (tolerance {tol:e})"
                                );
                            }
                        }
                    } else {
                        close(&what, &f64s(f), &f64s(c), dtype, d * rows);
                    }
                }
            }
        }
    }
}

#[test]
fn bad_arguments_fail_naming_them() {
    let x = Array::from_slice(&[1.0f32; 24], [2, 3, 4]);
    let msg = |a: &Array| a.clone().check().expect_err("must fail").to_string();
    let w3 = Array::from_slice(&[1.0f32; 3], [3]);
    assert!(msg(&fast::rms_norm(&x, &w3, 1e-5)).contains("weight"));
    assert!(msg(&fast::layer_norm(&x, None, &w3, 1e-5)).contains("bias"));
    assert!(msg(&fast::rms_norm(&Array::from_slice(&[1i32; 4], [4]), None, 1e-5)).contains("floating"));
    assert!(msg(&fast::rms_norm(&Array::from(1.0f32), None, 1e-5)).contains("axis"));
    let (h, y) = fast::add_rms_norm(&x, &w3, None, 1e-5);
    assert!(msg(&h).contains("residual") && msg(&y).contains("residual"));
    let off = Array::from(0);
    assert!(msg(&fast::rope(&x, 3, false, Some(1e4), 1.0, &off, None)).contains("dims"));
    assert!(msg(&fast::rope(&x, 6, false, Some(1e4), 1.0, &off, None)).contains("dims"));
    assert!(msg(&fast::rope(&x, 4, false, None, 1.0, &off, None)).contains("base and freqs"));
    assert!(msg(&fast::rope(&x, 4, false, Some(1e4), 1.0, &off, &w3)).contains("base and freqs"));
    let f3 = Array::from_slice(&[1.0f32; 3], [3]);
    assert!(msg(&fast::rope(&x, 4, false, None, 1.0, &off, &f3)).contains("freqs"));
    assert!(
        msg(&fast::rope(&x, 4, false, Some(1e4), 1.0, &Array::from_slice(&[0, 1, 2], [3]), None)).contains("offset")
    );
    assert!(msg(&fast::rope(&x, 4, false, Some(1e4), 1.0, &Array::from(0.5f32), None)).contains("offset"));
    assert!(msg(&fast::rope(&x.reshape([6, 4]), 4, false, Some(1e4), 1.0, &off, None)).contains("3-D"));
    assert!(msg(&fast::swiglu(&x, &w3)).contains("up"));
    let (w4, b45) = (Array::from_slice(&[1.0f32; 4], [4]), Array::from_slice(&[1.0f32; 20], [4, 5]));
    assert!(msg(&fast::rms_norm_matmul(&x, &w3, 1e-5, &b45)).contains("rms_norm_matmul: weight"));
    assert!(msg(&fast::rms_norm_matmul(&x, &w4, 1e-5, &b45.t())).contains("b must be [4, N]"));
    assert!(msg(&fast::swiglu_matmul(&x, &x.reshape([6, 4]), &b45, None)).contains("swiglu_matmul: up"));
    assert!(msg(&fast::swiglu_matmul(&x, &x, &b45, Some(&w4))).contains("swiglu_matmul: c"));
    let ints = |shape: &[i32]| Array::from_slice(&vec![1i32; shape.iter().product::<i32>() as usize], shape);
    let y = fast::rms_norm_matmul(&ints(&[2, 4]), &ints(&[4]), 1e-5, &ints(&[4, 5]));
    assert!(msg(&y).contains("floating"));
    assert!(msg(&fast::cross_entropy(&x, &Array::from_slice(&[0i32; 3], [3]))).contains("targets"));
    assert!(msg(&fast::cross_entropy(&x, &Array::from_slice(&[0.0f32; 6], [2, 3]))).contains("targets"));
    // Out-of-range targets give NaN, never a read outside the row.
    let loss = fast::cross_entropy(&x, &Array::from_slice(&[0, 4, 1, 9, -1, 3], [2, 3]));
    let v = loss.to_vec::<f32>().unwrap();
    assert!(v[1].is_nan() && v[3].is_nan() && v[4] == 0.0 && v[0].is_finite());
}
