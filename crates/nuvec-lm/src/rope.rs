//! Rotary position embeddings with the scalings of `config.json`'s `rope_scaling`: none
//! (`default`), `linear`, `dynamic` (NTK, past the trained context), `llama3` and `yarn`, as
//! Hugging Face's and mlx-lm's.

use std::collections::BTreeMap;
use std::f32::consts::PI;

use serde_json::Value;

use nuvec::{Array, DType, fast};

use crate::config::ModelConfig;
use crate::{Error, Result};

/// How a model rotates its queries and keys.
#[derive(Clone, Debug)]
pub struct Rope {
    /// Features rotated (the head size).
    pub dims: i32,
    /// Adjacent pairs rotate together (GPT-J style) instead of the two halves.
    pub traditional: bool,
    base: f32,
    /// Positions are multiplied by this (`1 / factor` for `linear`).
    scale: f32,
    /// Per-pair periods (`llama3`, `yarn`), in place of `base`.
    freqs: Option<Array>,
    /// The rotated features are multiplied by this (`yarn`'s attention factor).
    mscale: f32,
    /// `dynamic`: the scaling factor and the trained context.
    dynamic: Option<(f32, i32)>,
}

impl Rope {
    /// The rotation `config` describes; an error names an unknown scaling or a missing field.
    pub fn from_config(config: &ModelConfig) -> Result<Rope> {
        Rope::for_layers(config, "full_attention")
    }

    /// The rotation of `config`'s layers of `kind` (`full_attention` or `sliding_attention`,
    /// which may differ: [`ModelConfig::rope_parameters`]).
    pub fn for_layers(config: &ModelConfig, kind: &str) -> Result<Rope> {
        Rope::partial(config, kind, config.head_dim())
    }

    /// [`Rope::for_layers`] rotating the first `dims` features of each head alone (a partial
    /// rotary factor: [`ModelConfig::rotary_dims`]); the periods are those of `dims` features.
    pub fn partial(config: &ModelConfig, kind: &str, dims: i32) -> Result<Rope> {
        let (base, scaling) = config.rope_parameters(kind);
        let mut rope = Rope { dims, traditional: false, base, scale: 1.0, freqs: None, mscale: 1.0, dynamic: None };
        let Some(s) = &scaling else { return Ok(rope) };
        let kind = s.get("rope_type").or_else(|| s.get("type")).and_then(|v| v.as_str()).unwrap_or("default");
        let num = |key: &str, default: Option<f32>| -> Result<f32> {
            match s.get(key).and_then(|v| v.as_f64()) {
                Some(v) => Ok(v as f32),
                None => default.ok_or_else(|| Error::Config(format!("rope_scaling '{kind}' needs '{key}'"))),
            }
        };
        let half: Vec<f32> = (0..dims / 2).map(|i| base.powf(2.0 * i as f32 / dims as f32)).collect();
        match kind {
            "default" => {}
            "linear" => rope.scale = 1.0 / num("factor", None)?,
            "dynamic" => {
                let trained = config.max_position_embeddings.unwrap_or(2048);
                let trained = num("original_max_position_embeddings", Some(trained as f32))? as i32;
                rope.dynamic = Some((num("factor", None)?, trained));
            }
            "llama3" => rope.freqs = Some(Array::from_slice(&llama3(&half, &num)?, [dims / 2])),
            "yarn" => {
                let (freqs, mscale) = yarn(&half, dims, base, &num)?;
                rope.freqs = Some(Array::from_slice(&freqs, [dims / 2]));
                rope.mscale = mscale;
            }
            other => {
                return Err(Error::Config(format!(
                    "rope_scaling type '{other}' is not supported (default, linear, dynamic, llama3, yarn are)"
                )));
            }
        }
        Ok(rope)
    }

    /// `x [B, H, L, D]` rotated for positions `offset..offset + L`.
    pub fn apply(&self, x: &Array, offset: i32) -> Array {
        let mut base = self.base;
        if let Some((factor, trained)) = self.dynamic {
            let len = offset + x.shape()[2];
            if len > trained {
                let ratio = factor * len as f32 / trained as f32 - (factor - 1.0);
                base *= ratio.powf(self.dims as f32 / (self.dims as f32 - 2.0));
            }
        }
        self.rotate(x, base, &Array::scalar(offset, DType::I32))
    }

    /// `x [B, H, L, D]` rotated for positions `start[b]..start[b] + L` of each row, `start [B]`
    /// held on the device (`int32`). `dynamic` scaling depends on the length on the host and
    /// gives a failed array here ([`Rope::device_positions`] says so beforehand).
    pub fn apply_at(&self, x: &Array, start: &Array) -> Array {
        if !self.device_positions() {
            let why = "start: dynamic scaling needs the positions on the host, not on the device";
            return Array::failed("rope", nuvec::OpErrorKind::InvalidArgument(why.into()));
        }
        self.rotate(x, self.base, start)
    }

    /// The query heads of `qkv [B, L, Hq + 2·Hkv, D]` rotated at positions `start[b] + l`, and
    /// `k_cache` and `v_cache` with the rotated keys and the values written there
    /// ([`fast::rope_kv_write`]); `None` when this rotation is not that operation's (`yarn`'s
    /// attention factor, `dynamic` scaling).
    pub fn kv_write(
        &self,
        qkv: &Array,
        q_heads: i32,
        k_cache: &Array,
        v_cache: &Array,
        start: &Array,
    ) -> Option<(Array, Array, Array)> {
        if !self.writes_kv() {
            return None;
        }
        let base = self.freqs.is_none().then_some(self.base);
        let write = |f| {
            fast::rope_kv_write(qkv, q_heads, k_cache, v_cache, start, self.dims, self.traditional, base, self.scale, f)
        };
        Some(write(self.freqs.as_ref()))
    }

    /// [`Rope::kv_write`] into pools of rows, a paged cache's ([`fast::rope_kv_write_rows`]):
    /// head `h` of position `l` of row `b` goes to row `rows[b, l, h]`.
    pub fn kv_write_rows(
        &self,
        qkv: &Array,
        q_heads: i32,
        pools: (&Array, &Array),
        start: &Array,
        rows: &Array,
    ) -> Option<(Array, Array, Array)> {
        if !self.writes_kv() {
            return None;
        }
        let base = self.freqs.is_none().then_some(self.base);
        let (dims, trad, scale, f) = (self.dims, self.traditional, self.scale, self.freqs.as_ref());
        Some(fast::rope_kv_write_rows(qkv, q_heads, pools.0, pools.1, start, rows, dims, trad, base, scale, f))
    }

    /// Whether [`Rope::kv_write`] and [`Rope::kv_write_rows`] do this rotation (not `yarn`'s
    /// attention factor, nor `dynamic` scaling).
    pub fn writes_kv(&self) -> bool {
        self.mscale == 1.0 && self.device_positions()
    }

    /// Whether [`Rope::apply_at`] works: every scaling but `dynamic`.
    pub fn device_positions(&self) -> bool {
        self.dynamic.is_none()
    }

    fn rotate(&self, x: &Array, base: f32, offset: &Array) -> Array {
        let x = if self.mscale != 1.0 { x * self.mscale } else { x.clone() };
        match &self.freqs {
            Some(f) => fast::rope(&x, self.dims, self.traditional, None, self.scale, offset, f),
            None => fast::rope(&x, self.dims, self.traditional, Some(base), self.scale, offset, None),
        }
    }
}

/// Llama 3's periods: long wavelengths stretched by `factor`, short ones kept, a smooth
/// blend between.
fn llama3(half: &[f32], num: &dyn Fn(&str, Option<f32>) -> Result<f32>) -> Result<Vec<f32>> {
    let factor = num("factor", None)?;
    let low = num("low_freq_factor", Some(1.0))?;
    let high = num("high_freq_factor", Some(4.0))?;
    let old = num("original_max_position_embeddings", Some(8192.0))?;
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    Ok(half
        .iter()
        .map(|&f| {
            let wavelen = 2.0 * PI * f;
            if wavelen > low_wavelen {
                f * factor
            } else if wavelen > high_wavelen {
                let smooth = (old / wavelen - low) / (high - low);
                f / ((1.0 - smooth) / factor + smooth)
            } else {
                f
            }
        })
        .collect())
}

/// The `llama3` `rope_scaling` whose periods are `base`'s stretched by `factors` (a GGUF's
/// `rope_freqs.weight`, one per pair of `dims`): Llama 3.1's and 3.2's parameters when they
/// give those periods, else the ones fitted to them; an error when no `llama3` scaling does.
pub fn llama3_from_factors(factors: &[f32], base: f32, dims: i32) -> Result<BTreeMap<String, Value>> {
    let half: Vec<f32> = (0..dims / 2).map(|i| base.powf(2.0 * i as f32 / dims as f32)).collect();
    let bad = || {
        Error::Config(format!(
            "rope_freqs.weight ({} values) is not a llama3 RoPE scaling of {dims} features",
            factors.len()
        ))
    };
    if factors.len() != half.len() || factors.iter().any(|f| !(f.is_finite() && *f >= 1.0)) {
        return Err(bad());
    }
    let factor = factors.iter().fold(1f32, |m, &f| m.max(f));
    let scaling = |low: f32, high: f32, old: f32| {
        let mut m = BTreeMap::new();
        m.insert("rope_type".to_string(), Value::from("llama3"));
        m.insert("factor".to_string(), Value::from(factor));
        m.insert("low_freq_factor".to_string(), Value::from(low));
        m.insert("high_freq_factor".to_string(), Value::from(high));
        m.insert("original_max_position_embeddings".to_string(), Value::from(old));
        m
    };
    let fits = |m: &BTreeMap<String, Value>| {
        let num = |key: &str, _: Option<f32>| Ok(m[key].as_f64().unwrap_or(0.0) as f32);
        llama3(&half, &num)
            .is_ok_and(|p| p.iter().zip(&half).zip(factors).all(|((p, h), f)| (p / h - f).abs() <= 1e-3 * f))
    };
    let known = scaling(1.0, 4.0, 8192.0);
    if fits(&known) {
        return Ok(known);
    }
    // Between the two wavelengths the blend weight is old / wavelen − low over high − low,
    // a line in 1 / wavelen: two blended pairs give it, up to a common scale of the three.
    // With fewer, low and high keep Llama 3's ratio (1 and 4) and old is what fits.
    let wavelen = |h: &f32| 2.0 * PI * h;
    let blend: Vec<(f32, f32)> = factors
        .iter()
        .zip(&half)
        .filter(|(f, _)| **f > 1.0 + 1e-4 && **f < factor * (1.0 - 1e-4))
        .map(|(f, h)| (1.0 / wavelen(h), (1.0 / f - 1.0 / factor) / (1.0 - 1.0 / factor)))
        .collect();
    let fitted = match blend[..] {
        [(x0, s0), .., (x1, s1)] if x0 != x1 => {
            // s = a·x − b with a = old / (high − low), b = low / (high − low): high − low = 1.
            let a = (s1 - s0) / (x1 - x0);
            let b = a * x0 - s0;
            scaling(b, 1.0 + b, a)
        }
        [(x0, s0)] => scaling(1.0, 4.0, (3.0 * s0 + 1.0) / x0),
        _ => {
            // No blended pair: old / 4 above the last kept wavelength, old below the first
            // stretched one.
            let kept = factors.iter().zip(&half).filter(|(f, _)| **f <= 1.0 + 1e-4).map(|(_, h)| wavelen(h));
            let stretched = factors.iter().zip(&half).filter(|(f, _)| **f > 1.0 + 1e-4).map(|(_, h)| wavelen(h));
            let (lo, hi) = (4.0 * kept.fold(0f32, f32::max), stretched.fold(f32::INFINITY, f32::min));
            scaling(1.0, 4.0, if hi.is_finite() && lo > 0.0 { (lo * hi).sqrt() } else { lo.max(1.0) })
        }
    };
    if fits(&fitted) { Ok(fitted) } else { Err(bad()) }
}

/// YaRN's periods (interpolated below a band of wavelengths, extrapolated above it, ramped
/// between) and its attention factor.
fn yarn(half: &[f32], dims: i32, base: f32, num: &dyn Fn(&str, Option<f32>) -> Result<f32>) -> Result<(Vec<f32>, f32)> {
    let factor = num("factor", None)?;
    let trained = num("original_max_position_embeddings", Some(4096.0))?;
    let (beta_fast, beta_slow) = (num("beta_fast", Some(32.0))?, num("beta_slow", Some(1.0))?);
    let (mscale, mscale_all) = (num("mscale", Some(1.0))?, num("mscale_all_dim", Some(0.0))?);
    let dim_of = |rotations: f32| dims as f32 * (trained / (rotations * 2.0 * PI)).ln() / (2.0 * base.ln());
    let low = dim_of(beta_fast).floor().max(0.0);
    let mut high = dim_of(beta_slow).ceil().min(dims as f32 - 1.0);
    if high == low {
        high += 0.001;
    }
    let get_mscale = |m: f32| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
    let freqs = half
        .iter()
        .enumerate()
        .map(|(i, &extra)| {
            let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
            let mask = 1.0 - ramp;
            let inter = factor * extra;
            inter * extra / (inter * mask + extra * (1.0 - mask))
        })
        .collect();
    Ok((freqs, get_mscale(mscale) / get_mscale(mscale_all)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's `rope_freqs.weight` for a `llama3` scaling: the periods' stretch per pair.
    fn factors(base: f32, dims: i32, factor: f32, low: f32, high: f32, old: f32) -> Vec<f32> {
        let half: Vec<f32> = (0..dims / 2).map(|i| base.powf(2.0 * i as f32 / dims as f32)).collect();
        let p = [("factor", factor), ("low_freq_factor", low), ("high_freq_factor", high)];
        let num = |key: &str, _: Option<f32>| Ok(p.iter().find(|(k, _)| *k == key).map_or(old, |(_, v)| *v));
        llama3(&half, &num).unwrap().iter().zip(&half).map(|(p, h)| p / h).collect()
    }

    #[test]
    fn llama3_scaling_is_recovered_from_its_factors() {
        // Llama 3.2's parameters come back as they are.
        let s = llama3_from_factors(&factors(500000.0, 64, 32.0, 1.0, 4.0, 8192.0), 500000.0, 64).unwrap();
        let get = |s: &BTreeMap<String, Value>, k: &str| s[k].as_f64().unwrap() as f32;
        assert_eq!(get(&s, "factor"), 32.0);
        assert_eq!((get(&s, "low_freq_factor"), get(&s, "high_freq_factor")), (1.0, 4.0));
        assert_eq!(get(&s, "original_max_position_embeddings"), 8192.0);
        // Others are fitted: the same periods, with high − low = 1.
        let want = factors(10000.0, 128, 8.0, 2.0, 6.0, 2048.0);
        let s = llama3_from_factors(&want, 10000.0, 128).unwrap();
        let (low, high, old) =
            (get(&s, "low_freq_factor"), get(&s, "high_freq_factor"), get(&s, "original_max_position_embeddings"));
        assert!((low - 0.5).abs() < 1e-3 && (high - 1.5).abs() < 1e-3 && (old - 512.0).abs() < 0.5, "{s:?}");
        let got = factors(10000.0, 128, 8.0, low, high, old);
        assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-3 * b));
        // One blended pair, and none: parameters that give the same periods.
        for old in [16.0, 4.0] {
            let want = factors(10000.0, 16, 8.0, 1.0, 4.0, old);
            let s = llama3_from_factors(&want, 10000.0, 16).unwrap();
            let (low, high, old) =
                (get(&s, "low_freq_factor"), get(&s, "high_freq_factor"), get(&s, "original_max_position_embeddings"));
            let got = factors(10000.0, 16, 8.0, low, high, old);
            assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-3 * b), "{got:?} against {want:?}");
        }
        // Factors no llama3 scaling gives are an error.
        let mut odd = want.clone();
        odd[3] = 2.0;
        let e = llama3_from_factors(&odd, 10000.0, 128).unwrap_err().to_string();
        assert!(e.contains("rope_freqs.weight"), "{e}");
        assert!(llama3_from_factors(&want[..10], 10000.0, 128).is_err());
    }
}
