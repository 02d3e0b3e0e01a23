//! The one attention router: [`plan_attention`] decides how every attention runs, and the
//! operation runs exactly its plan. There is no other routing code.

use std::panic::Location;

use crate::backend::backend_for;
use crate::device::{DeviceKind, default_stream};
use crate::dtype::DType;
use crate::error::{Error, OpErrorKind, Result};
use crate::primitive::Primitive;
use crate::primitive::fast::{AttentionKernel, check_attention};
use crate::storage::Spec;

use super::{AttentionOptions, FastOp};

/// How an attention runs and the memory it needs beyond its inputs and output.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionPlan {
    /// The kernel or composition.
    pub kernel: AttentionKernel,
    /// Bytes of scratch the kernel allocates (the partial results of a two-pass vector kernel).
    pub scratch_bytes: usize,
    /// The largest score-sized intermediate, in bytes (`float32` scores): 0 for kernels.
    pub max_intermediate_bytes: usize,
    /// Whether `max_score_bytes` changed the plan.
    pub capped: bool,
}

/// Query rows per block of a causal composition of more rows than this (uncapped).
const CAUSAL_BLOCK_ROWS: i32 = 512;

/// Queries up to which the vector kernel runs, one query row per block of threads.
pub const VECTOR_MAX_QUERIES: i32 = 8;

/// Blocks a vector kernel's partitions fill: one per SM of a 132-SM GPU (H100, H200), rounded
/// down to a whole number per key-value head, so that no SM takes two while another idles.
const VECTOR_TARGET_BLOCKS: i64 = 132;

/// Fewest keys in one partition of a two-pass vector kernel.
const VECTOR_MIN_KEYS_PER_BLOCK: i32 = 256;

/// Most partitions of one row (the kernels merge them in shared memory).
const VECTOR_MAX_PARTITIONS: i64 = 128;

/// Key partitions of one query row that attends `lk` keys, when `heads` key-value heads
/// (batch × heads, each a block's worth of query rows) run at once: as many blocks as fill the
/// GPU once, each with at least 256 keys, at most 128. The kernel computes the same for each
/// row of several queries from that row's own keys, so a row's result does not depend on the
/// rows beside it.
pub fn vector_blocks(heads: i64, lk: i32) -> i32 {
    spread(VECTOR_TARGET_BLOCKS, heads, lk)
}

/// Key partitions of one query row of a paged attention over `lk` keys (the block table's
/// capacity) in blocks of `block_size` positions: as [`vector_blocks`], and twice as many for
/// blocks under 64 positions, whose copies are smaller and need more of them in flight (two
/// blocks of threads per SM).
pub fn paged_blocks(heads: i64, lk: i32, block_size: i32) -> i32 {
    let target = if block_size < 64 { 2 * VECTOR_TARGET_BLOCKS } else { VECTOR_TARGET_BLOCKS };
    spread(target, heads, lk)
}

/// Partitions so that `heads` rows make about `target` blocks, each of at least 256 keys, at
/// most 128.
/// The fewest keys a partition takes: `NUVEC_ATTENTION_MIN_KEYS` (a tuning knob, a multiple
/// of 64), else `VECTOR_MIN_KEYS_PER_BLOCK`.
fn min_keys_per_block() -> i32 {
    static KEYS: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *KEYS.get_or_init(|| {
        let knob = std::env::var("NUVEC_ATTENTION_MIN_KEYS").ok().and_then(|v| v.parse::<i32>().ok());
        knob.filter(|&k| k >= 64 && k % 64 == 0).unwrap_or(VECTOR_MIN_KEYS_PER_BLOCK)
    })
}

fn spread(target: i64, heads: i64, lk: i32) -> i32 {
    let want = (target / heads.max(1)).min(VECTOR_MAX_PARTITIONS);
    let least = min_keys_per_block();
    let most = (lk.max(1) + least - 1) / least;
    want.clamp(1, most as i64) as i32
}

/// Plans the attention of `q [B, Hq, Lq, D]` over `k [B, Hkv, Lk, D]` and `v [B, Hkv, Lk, Dv]`
/// of `dtype` with `options`, on the default stream's device. A pure function of the shapes,
/// the dtype, the options and the device's backend; allocates nothing.
///
/// - Up to 8 queries, on a GPU with a vector kernel for them: [`AttentionKernel::Vector`], in
///   one pass, or in two with the keys split when the rows alone would not fill the GPU. On
///   the CPU (`float32`, no mask array or sinks): [`AttentionKernel::Vector`] in one pass.
/// - More queries, on a GPU with a tiled kernel for the head size and dtype:
///   [`AttentionKernel::Tiled`].
/// - Otherwise (other head sizes, dtypes or options): the composition — all rows at once
///   ([`AttentionKernel::Composed`]), or in blocks of rows ([`AttentionKernel::ComposedBlocks`])
///   when its scores would pass `max_score_bytes` (the most rows under the cap) or when more
///   than 512 causal queries would compute scores they mask (blocks of 512 rows, each reading
///   only the keys before its last row); 2 to 8 causal queries run one row per block, each as
///   it would decode alone.
///
/// A cap of 0, or one below a single query row's scores (`B · Hq · Lk' · 4` bytes, `Lk'` the
/// keys a row may attend), is an error naming the smallest admissible cap. Kernels hold no
/// scores, so a cap never changes them.
///
/// ```
/// use nuvec::DType;
/// use nuvec::fast::{AttentionKernel, AttentionOptions, plan_attention};
/// let opts = AttentionOptions::causal().max_score_bytes(512 << 20);
/// let q = [1, 16, 1024, 256];
/// let kv = [1, 2, 33792, 256];
/// let plan = plan_attention(&q, &kv, &kv, DType::BF16, &opts).unwrap();
/// assert!(plan.max_intermediate_bytes <= 512 << 20);
/// let tiny = AttentionOptions::causal().max_score_bytes(1000);
/// if let Ok(p) = plan_attention(&q, &kv, &kv, DType::BF16, &tiny) {
///     assert!(!matches!(p.kernel, AttentionKernel::Composed | AttentionKernel::ComposedBlocks { .. }));
/// }
/// ```
#[track_caller]
pub fn plan_attention(
    q: &[i32],
    k: &[i32],
    v: &[i32],
    dtype: DType,
    options: &AttentionOptions<'_>,
) -> Result<AttentionPlan> {
    let at = Location::caller();
    let fail = |kind: OpErrorKind| Error::Op { op: "scaled_dot_product_attention", at, kind };
    let mask = options.mask_array().map(|m| (m.shape(), m.dtype()));
    let sinks = options.sinks.map(|s| (s.shape(), s.dtype()));
    let out = check_attention(q, k, v, dtype, mask, sinks, options.window).map_err(fail)?;
    let (b, hq, lq) = (q[0] as usize, q[1] as usize, q[2]);
    let (lk, dv) = (k[2], v[3] as usize);
    let causal = options.is_causal();

    // Keys one block of `rows` query rows may attend, and its scores' bytes.
    let keys = |rows: i32| -> usize {
        match options.window {
            Some(w) => (lk as i64).min(w as i64 + rows as i64 - 1).max(0) as usize,
            None => lk.max(0) as usize,
        }
    };
    let block_bytes = |rows: i32| rows.max(0) as usize * b * hq * keys(rows) * 4;
    if let Some(cap) = options.max_score_bytes {
        let one_row = block_bytes(1);
        if cap == 0 || (cap < one_row && lq > 0) {
            return Err(fail(OpErrorKind::InvalidArgument(format!(
                "max_score_bytes {cap} is below one query row's scores; the smallest admissible cap is {}",
                one_row.max(1)
            ))));
        }
    }

    let device = default_stream().device;
    let gpu = device.kind == DeviceKind::Gpu;
    // The CPU's kernel covers a few query rows (decoding) in one pass.
    if lq > 0 && lk > 0 && (gpu || lq <= VECTOR_MAX_QUERIES) {
        let mut inputs: Vec<Spec> =
            [q, k, v].iter().map(|s| Spec { shape: s.iter().copied().collect(), dtype }).collect();
        inputs.extend(mask.map(|(s, d)| Spec { shape: s.iter().copied().collect(), dtype: d }));
        inputs.extend(sinks.map(|(s, d)| Spec { shape: s.iter().copied().collect(), dtype: d }));
        let candidate = if !gpu {
            AttentionKernel::Vector { passes: 1, blocks: 1 }
        } else if lq <= VECTOR_MAX_QUERIES {
            let blocks = vector_blocks(b as i64 * k[1] as i64, options.window.map_or(lk, |w| w.min(lk)));
            AttentionKernel::Vector { passes: if blocks > 1 { 2 } else { 1 }, blocks }
        } else {
            AttentionKernel::Tiled
        };
        let primitive = Primitive::Fast(FastOp::Attention(super::attention::params(options, 1.0, candidate)));
        if backend_for(device).is_ok_and(|be| be.supports(&primitive, &inputs, &out)) {
            let scratch = match candidate {
                AttentionKernel::Vector { passes: 2, blocks } => b * hq * lq as usize * blocks as usize * (dv * 4 + 8),
                _ => 0,
            };
            return Ok(AttentionPlan {
                kernel: candidate,
                scratch_bytes: scratch,
                max_intermediate_bytes: 0,
                capped: false,
            });
        }
    }

    if causal && (2..=VECTOR_MAX_QUERIES).contains(&lq) {
        // The serial rule: each row as it would decode alone.
        let plan = AttentionKernel::ComposedBlocks { rows: 1 };
        return Ok(AttentionPlan {
            kernel: plan,
            scratch_bytes: 0,
            max_intermediate_bytes: block_bytes(1),
            capped: false,
        });
    }
    // The most rows under the cap (a block's keys grow with its rows under a window).
    let capped_rows = options.max_score_bytes.filter(|&cap| block_bytes(lq) > cap).map(|cap| {
        let (mut lo, mut hi) = (1, lq);
        while lo < hi {
            let mid = lo + (hi - lo + 1) / 2;
            if block_bytes(mid) <= cap { lo = mid } else { hi = mid - 1 }
        }
        lo
    });
    // Causal rows in blocks read only the keys before them: half the work of all rows at once
    // over every key, and no mask outside the diagonal blocks.
    let causal_rows = (causal && lq > CAUSAL_BLOCK_ROWS).then_some(CAUSAL_BLOCK_ROWS);
    let (kernel, bytes, capped) = match (capped_rows, causal_rows) {
        (Some(r), Some(c)) if c <= r => (AttentionKernel::ComposedBlocks { rows: c }, block_bytes(c), false),
        (Some(r), _) => (AttentionKernel::ComposedBlocks { rows: r }, block_bytes(r), true),
        (None, Some(c)) => (AttentionKernel::ComposedBlocks { rows: c }, block_bytes(c), false),
        (None, None) => (AttentionKernel::Composed, block_bytes(lq), false),
    };
    Ok(AttentionPlan { kernel, scratch_bytes: 0, max_intermediate_bytes: bytes, capped })
}
