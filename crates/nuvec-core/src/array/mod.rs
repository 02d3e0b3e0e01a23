//! `Array`: a lazy, immutable, cheaply cloned n-dimensional array.

mod construct;
mod display;
mod read;

use std::panic::Location;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use smallvec::SmallVec;

pub use construct::{ArrayLiteral, ScalarOrArray};

use crate::device::{Device, Stream, default_stream};
use crate::dtype::DType;
use crate::error::{Error, OpErrorKind, Result};
use crate::primitive::Primitive;
use crate::shape::{Shape, elem_count};
use crate::storage::{Data, Spec};

/// A lazy n-dimensional array.
///
/// Cloning is cheap (a reference count). Operations record a graph and never fail on the spot:
/// a bad call gives a *failed* array, and the error surfaces at [`Array::eval`],
/// [`Array::item`], [`Array::to_vec`] or [`Array::check`].
///
/// ```
/// use nuvec::{array, Array};
/// let a = array![[1.0, 2.0], [3.0, 4.0]];
/// let b = (&a + 1.0) * &a;
/// assert_eq!(b.to_vec::<f32>().unwrap(), vec![2.0, 6.0, 12.0, 20.0]);
/// let bad = a.reshape([3]);
/// assert!(bad.is_failed());
/// ```
#[derive(Clone)]
pub struct Array {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    pub(crate) stream: Stream,
    pub(crate) state: Mutex<State>,
    /// Recorded while a transform traces: evaluation keeps its node (in `traced`) so the
    /// transform can still walk the graph through it.
    pub(crate) tracer: bool,
    /// The node of an evaluated tracer.
    pub(crate) traced: OnceLock<(Arc<Node>, usize)>,
}

pub(crate) enum State {
    /// Evaluated.
    Ready(Data),
    /// To be computed by `node` (output number `index`).
    Pending { node: Arc<Node>, index: usize },
    /// Recording or evaluation failed.
    Failed(Error),
    /// The bytes were handed to the one consumer that could still read them.
    Donated,
}

/// A recorded operation: a primitive applied to input arrays.
pub(crate) struct Node {
    pub(crate) primitive: Primitive,
    pub(crate) inputs: Vec<Array>,
    pub(crate) outputs: SmallVec<[Spec; 1]>,
    /// All outputs, for multi-output nodes (set once after creation).
    pub(crate) siblings: OnceLock<Vec<Weak<Inner>>>,
    /// Held while the node runs, so concurrent evaluations run it once.
    pub(crate) run: Mutex<()>,
    /// The thread whose evaluation will run the node (0: none yet). Another evaluation that
    /// needs it waits for it instead of walking its inputs too.
    pub(crate) claim: std::sync::atomic::AtomicU64,
}

// Dropping the last handle of a long unevaluated chain would otherwise recurse once per node
// (array -> node -> input array -> ...) and overflow the stack; nodes this drop owns alone are
// unlinked with an explicit stack instead.
impl Drop for Node {
    fn drop(&mut self) {
        let mut stack: Vec<Array> = std::mem::take(&mut self.inputs);
        while let Some(a) = stack.pop() {
            let Some(inner) = Arc::into_inner(a.inner) else { continue };
            let Inner { state, traced, .. } = inner;
            let pending = match state.into_inner().unwrap_or_else(|e| e.into_inner()) {
                State::Pending { node, .. } => Some(node),
                _ => None,
            };
            for node in pending.into_iter().chain(traced.into_inner().map(|(n, _)| n)) {
                if let Some(mut node) = Arc::into_inner(node) {
                    stack.append(&mut node.inputs);
                }
            }
        }
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for Array {
    /// An evaluated `float32` scalar zero.
    fn default() -> Self {
        Array::from(0.0f32)
    }
}

impl Array {
    fn with_state(shape: Shape, dtype: DType, state: State) -> Array {
        Array {
            inner: Arc::new(Inner {
                shape,
                dtype,
                stream: default_stream(),
                state: Mutex::new(state),
                tracer: crate::transforms::tracing(),
                traced: OnceLock::new(),
            }),
        }
    }

    /// An evaluated array over existing data (for backends, I/O and transforms).
    pub fn from_data(shape: impl Into<Shape>, dtype: DType, data: Data) -> Array {
        Array::with_state(shape.into(), dtype, State::Ready(data))
    }

    /// A failed array: `op` was called at the caller's location with bad arguments.
    #[track_caller]
    pub fn failed(op: &'static str, kind: OpErrorKind) -> Array {
        Array::from_error(Error::Op { op, at: Location::caller(), kind })
    }

    /// A failed array holding `error`.
    pub fn from_error(error: Error) -> Array {
        Array::with_state(Shape::new(), DType::F32, State::Failed(error))
    }

    /// Records `primitive` on `inputs` (one output). Failed inputs propagate their error;
    /// inputs the primitive rejects give a failed array naming `op`.
    #[track_caller]
    pub fn from_op(op: &'static str, primitive: Primitive, inputs: Vec<Array>) -> Array {
        let mut outs = Array::from_op_multi(op, primitive, inputs);
        if outs.len() == 1 {
            outs.pop().unwrap_or_default()
        } else {
            Array::failed(op, OpErrorKind::InvalidArgument(format!("expected one output, got {}", outs.len())))
        }
    }

    /// Records a primitive with several outputs. On failure every output is the failed array.
    #[track_caller]
    pub fn from_op_multi(op: &'static str, primitive: Primitive, inputs: Vec<Array>) -> Vec<Array> {
        if let Some(err) = inputs.iter().find_map(|a| a.record_error()) {
            return vec![Array::from_error(err)];
        }
        let specs: Vec<Spec> = inputs.iter().map(Array::spec).collect();
        let outputs = match primitive.output_specs(&specs) {
            Ok(o) => o,
            Err(kind) => return vec![Array::failed(op, kind)],
        };
        Array::from_node(primitive, inputs, outputs)
    }

    /// Records a node whose output specs were computed by the caller (no validation).
    pub(crate) fn from_node(primitive: Primitive, inputs: Vec<Array>, outputs: Vec<Spec>) -> Vec<Array> {
        let n = outputs.len();
        let node = Arc::new(Node {
            primitive,
            inputs,
            outputs: outputs.into_iter().collect(),
            siblings: OnceLock::new(),
            run: Mutex::new(()),
            claim: std::sync::atomic::AtomicU64::new(0),
        });
        let stream = default_stream();
        let tracer = crate::transforms::tracing();
        let arrays: Vec<Array> = (0..n)
            .map(|index| {
                let spec = &node.outputs[index];
                Array {
                    inner: Arc::new(Inner {
                        shape: spec.shape.clone(),
                        dtype: spec.dtype,
                        stream,
                        state: Mutex::new(State::Pending { node: node.clone(), index }),
                        tracer,
                        traced: OnceLock::new(),
                    }),
                }
            })
            .collect();
        if n > 1 {
            let _ = node.siblings.set(arrays.iter().map(|a| Arc::downgrade(&a.inner)).collect());
        }
        arrays
    }

    /// The error this array failed with while being recorded or evaluated, if any.
    pub fn error(&self) -> Option<Error> {
        match &*self.inner.lock() {
            State::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }

    /// The error of a failed array, for propagation at record time.
    pub(crate) fn record_error(&self) -> Option<Error> {
        self.error()
    }

    /// Whether the array failed.
    pub fn is_failed(&self) -> bool {
        matches!(&*self.inner.lock(), State::Failed(_))
    }

    /// The array itself, or its error, without evaluating anything.
    pub fn check(self) -> Result<Array> {
        match self.error() {
            Some(e) => Err(e),
            None => Ok(self),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[i32] {
        &self.inner.shape
    }

    /// The shape as a fixed-size array, or an error naming the actual number of dimensions.
    pub fn shape_n<const N: usize>(&self) -> Result<[i32; N]> {
        self.shape().try_into().map_err(|_| {
            Error::InvalidArgument(format!("expected {N} dimensions, the array has shape {:?}", self.shape()))
        })
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.inner.shape.len()
    }

    /// Number of elements.
    pub fn size(&self) -> usize {
        elem_count(&self.inner.shape)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// Bytes per element.
    pub fn itemsize(&self) -> usize {
        self.inner.dtype.size()
    }

    /// Bytes of all elements.
    pub fn nbytes(&self) -> usize {
        self.size() * self.itemsize()
    }

    /// The stream the array was recorded on.
    pub fn stream(&self) -> Stream {
        self.inner.stream
    }

    /// The device the array was recorded on.
    pub fn device(&self) -> Device {
        self.inner.stream.device
    }

    /// Shape and dtype.
    pub fn spec(&self) -> Spec {
        Spec { shape: self.inner.shape.clone(), dtype: self.inner.dtype }
    }

    /// Whether both handles name the same array (not merely equal values).
    pub fn is(&self, other: &Array) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether the array holds its values (evaluated or constant).
    pub fn is_evaluated(&self) -> bool {
        matches!(&*self.inner.lock(), State::Ready(_))
    }

    /// Computes the array (and what it depends on).
    pub fn eval(&self) -> Result<()> {
        crate::eval::eval_arrays(std::slice::from_ref(self))
    }

    /// The evaluated contents (storage and layout). Low level: for backends and I/O.
    pub fn data(&self) -> Result<Data> {
        self.eval()?;
        match &*self.inner.lock() {
            State::Ready(d) => Ok(d.clone()),
            State::Failed(e) => Err(e.clone()),
            _ => Err(crate::storage::internal("evaluated array holds no data")),
        }
    }

    /// Identity of the storage, when evaluated: arrays that share bytes share this.
    pub fn buffer_id(&self) -> Option<usize> {
        match &*self.inner.lock() {
            State::Ready(d) => Some(Arc::as_ptr(&d.storage) as *const u8 as usize),
            _ => None,
        }
    }

    /// The node computing this array (and which of its outputs it is), also after evaluation
    /// for arrays recorded while a transform traced. `None` for constants.
    pub(crate) fn node(&self) -> Option<(Arc<Node>, usize)> {
        match &*self.inner.lock() {
            State::Pending { node, index } => Some((node.clone(), *index)),
            _ => self.inner.traced.get().cloned(),
        }
    }

    /// Whether two handles are the same array.
    pub fn is_same(&self, other: &Array) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
