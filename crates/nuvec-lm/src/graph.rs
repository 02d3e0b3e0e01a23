//! The decode step recorded once as a device graph (a CUDA graph) and launched whole for every
//! later token: a step of a large model is hundreds of kernels, and launching them one by one
//! costs more host time than the device needs to run them.
//!
//! A recorded step reads fixed memory: the token ids and the positions are written into
//! buffers of the step's own before each launch, the caches have a fixed capacity (a power of
//! two, or a pool of blocks whose table is refreshed in place) and are written in place at the
//! device-held position, and attention is bounded by the device-held lengths
//! ([`LanguageModel::forward_at`]). The first step at a capacity runs
//! eagerly (it loads the kernels), the second records; a cache that grows, or buffers that
//! moved, start over. Recurrent caches (linear-attention layers) are written in place too: their
//! state by the recurrence's kernel, their convolution window over the one before. Where nothing
//! can be recorded (the CPU, a model or cache that needs host positions, a cache not updated in
//! place) steps run eagerly, with the same results.

use nuvec::transforms::{DeviceGraph, write_into};
use nuvec::{Array, DType};

use crate::Result;
use crate::cache::{KvCache, Positions};
use crate::models::LanguageModel;

/// A model's recorded decode step for one batch size (see the module docs).
pub struct DecodeGraph {
    batch: i32,
    /// Fixed inputs on the device: token ids `[B, 1]` and positions `[2, B]` (starts, then
    /// lengths); `None` on the CPU, where steps take fresh arrays.
    inputs: Option<(Array, Array)>,
    state: State,
    /// Recordings whose caches were not updated in place (the next records again, up to
    /// [`RECORDINGS`]).
    misses: u8,
}

/// Recordings tried before steps run eagerly for good: a cache update is done in place only
/// when nothing else holds the cache's old buffer at that moment.
const RECORDINGS: u8 = 3;

enum State {
    /// The next step runs eagerly, then the one after records.
    Warm,
    /// The next step records.
    Record,
    /// Recorded over the caches' buffers (their storages, to notice a move).
    Ready { graph: DeviceGraph, buffers: Vec<usize> },
    /// Not recordable: steps run eagerly.
    Off,
}

/// The storages of the caches' buffers (and block tables), as addresses.
fn buffers(caches: &[KvCache]) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for a in caches.iter().flat_map(|c| c.arrays().into_iter().chain(c.page_table().cloned())) {
        out.push(std::sync::Arc::as_ptr(&a.data()?.storage) as usize);
    }
    Ok(out)
}

/// Whether decode steps are recorded unless asked otherwise: not with `NUVEC_LM_GRAPH=0`.
pub(crate) fn recording_wanted() -> bool {
    std::env::var("NUVEC_LM_GRAPH").map_or(true, |v| v != "0")
}

/// Before the step after `graph`'s: a recorded step's launch rewrites the logits `arrays` were
/// computed from, so their work is queued first (an evaluation thread may not have got to it
/// yet). Nothing to do after an eager step.
pub(crate) fn queue_before_launch(graph: Option<&DecodeGraph>, arrays: impl IntoIterator<Item = Array>) -> Result<()> {
    if graph.is_some_and(DecodeGraph::recorded) {
        nuvec::eval(&arrays.into_iter().collect::<Vec<_>>())?;
    }
    Ok(())
}

/// `NUVEC_LM_LOG=1`: the engine's and the decode graph's decisions on stderr.
pub(crate) fn log(message: impl FnOnce() -> String) {
    if std::env::var("NUVEC_LM_LOG").is_ok_and(|v| v != "0") {
        eprintln!("nuvec-lm: {}", message());
    }
}

impl DecodeGraph {
    /// A step for `batch` rows on the default device; nothing is recorded until the second
    /// step.
    pub fn new(batch: i32) -> Result<DecodeGraph> {
        DecodeGraph::recording(batch, true)
    }

    /// [`DecodeGraph::new`], recording only when `record` (otherwise every step runs eagerly
    /// from the same device-held inputs).
    pub(crate) fn recording(batch: i32, record: bool) -> Result<DecodeGraph> {
        let device = nuvec::default_device();
        let inputs = if device.is_cpu() {
            None
        } else {
            // Dense buffers of their own (zeros alone are a broadcast scalar).
            let tokens = nuvec::ops::zeros([batch, 1], DType::I32).contiguous();
            let positions = nuvec::ops::zeros([2, batch], DType::I32).contiguous();
            nuvec::eval(&[tokens.clone(), positions.clone()])?;
            Some((tokens, positions))
        };
        let state = if inputs.is_some() && record { State::Warm } else { State::Off };
        Ok(DecodeGraph { batch, inputs, state, misses: 0 })
    }

    /// Whether the step is launched as a recorded graph.
    pub fn recorded(&self) -> bool {
        matches!(self.state, State::Ready { .. })
    }

    /// The logits `[B, 1, vocab]` of `tokens [B, 1]` at the caches' next position (every row
    /// at the same one), the caches taking the new keys and values. The logits of a recorded
    /// step live in its memory: read them (or evaluate what is computed from them) before the
    /// next step.
    pub fn step(&mut self, model: &dyn LanguageModel, caches: &mut [KvCache], tokens: &Array) -> Result<Array> {
        let start = caches.first().map_or(0, KvCache::offset);
        self.step_rows(model, caches, tokens, &vec![start; self.batch as usize])
    }

    /// [`DecodeGraph::step`] with each row at its own position `starts[b]` (sequences of
    /// different lengths in caches made by [`KvCache::stack`]).
    pub fn step_rows(
        &mut self,
        model: &dyn LanguageModel,
        caches: &mut [KvCache],
        tokens: &Array,
        starts: &[i32],
    ) -> Result<Array> {
        let b = self.batch;
        if starts.len() != b as usize {
            return Err(crate::Error::Config(format!(
                "DecodeGraph: {} positions for a step of {b} rows",
                starts.len()
            )));
        }
        let start = starts.iter().copied().max().unwrap_or(0);
        let host: Vec<i32> = starts.iter().copied().chain(starts.iter().map(|s| s + 1)).collect();
        let host = Array::from_slice(&host, [2, b]);
        let tokens = tokens.reshape([b, 1]).astype(DType::I32);
        let Some((fixed_tokens, positions)) = &self.inputs else {
            return Ok(model.forward_at(&tokens, caches, &Positions::rows(&host)));
        };
        write_into(fixed_tokens, &tokens)?;
        write_into(positions, &host)?;
        let at = Positions::rows(positions);
        // Paged caches take the step's blocks. A cache about to grow, or a pool or block
        // table that moved, moves buffers: run eagerly and record afresh after.
        let mut moved = false;
        for c in caches.iter_mut() {
            moved |= c.prepare(b, start + 1)?;
        }
        let capacity = caches.iter().map(KvCache::capacity).min().unwrap_or(0);
        if moved || start + 1 > capacity {
            self.state = State::Warm;
        }
        if let State::Ready { graph, buffers: held } = &self.state {
            if *held == buffers(caches)? {
                graph.launch()?;
                for c in caches.iter_mut() {
                    c.advance(1);
                }
                return Ok(graph.outputs()[0].clone());
            }
            log(|| "the caches moved: recording the decode step again".into());
            self.state = State::Warm;
        }
        match self.state {
            State::Record => {
                let before = buffers(caches)?;
                let logits = model.forward_at(fixed_tokens, caches, &at);
                // The caches are outputs too: every launch rewrites them in place.
                let outputs = std::iter::once(logits).chain(caches.iter().flat_map(KvCache::arrays)).collect();
                match DeviceGraph::record(outputs) {
                    Ok(graph) => {
                        let logits = graph.outputs()[0].clone();
                        if buffers(caches)? == before {
                            log(|| format!("recorded the decode step: {} operations", graph.len()));
                            self.state = State::Ready { graph, buffers: before };
                        } else {
                            // The launch ran this step; its arrays keep the memory they live in.
                            self.misses += 1;
                            let again = self.misses < RECORDINGS;
                            log(|| format!("the caches were not updated in place (recording again: {again})"));
                            self.state = if again { State::Warm } else { State::Off };
                        }
                        Ok(logits)
                    }
                    Err(e) => {
                        // Nothing recorded ran, so caches updated in place still hold what they
                        // held: run this step eagerly, and the rest.
                        if buffers(caches)? != before {
                            return Err(crate::Error::Array(e));
                        }
                        log(|| format!("cannot record the decode step ({e}): decoding without a graph"));
                        for c in caches.iter_mut() {
                            c.advance(-1);
                        }
                        self.state = State::Off;
                        self.eager(model, caches, fixed_tokens, &at)
                    }
                }
            }
            State::Warm => {
                self.state = State::Record;
                self.eager(model, caches, fixed_tokens, &at)
            }
            _ => self.eager(model, caches, fixed_tokens, &at),
        }
    }

    fn eager(
        &self,
        model: &dyn LanguageModel,
        caches: &mut [KvCache],
        tokens: &Array,
        at: &Positions,
    ) -> Result<Array> {
        let logits = model.forward_at(tokens, caches, at);
        let mut arrays = vec![logits.clone()];
        arrays.extend(caches.iter().flat_map(KvCache::arrays));
        nuvec::async_eval(&arrays)?;
        Ok(logits)
    }
}
