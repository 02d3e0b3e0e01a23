//! User functions recorded as one node (`custom_function`, `checkpoint`): the payload
//! [`CustomFn`] holds the body over flat inputs, the optional rules and the outputs' specs. The
//! transforms (`crate::transforms`) run the body and apply the rules.

use std::fmt;
use std::sync::Arc;

use crate::array::Array;
use crate::error::Result;
use crate::storage::Spec;

pub(crate) type Body = Arc<dyn Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync>;
pub(crate) type VjpRule = Arc<dyn Fn(&[Array], &[Array], &[Array]) -> Result<Vec<Array>> + Send + Sync>;
pub(crate) type JvpRule = Arc<dyn Fn(&[Array], &[Array]) -> Result<Vec<Array>> + Send + Sync>;
pub(crate) type VmapRule = Arc<dyn Fn(&[Array], &[Option<i32>]) -> Result<(Vec<Array>, Vec<i32>)> + Send + Sync>;

/// The payload of a recorded custom call: the body over flat inputs and the optional rules.
#[derive(Clone)]
pub struct CustomFn(pub(crate) Arc<CustomInner>);

pub(crate) struct CustomInner {
    pub(crate) name: &'static str,
    pub(crate) body: Body,
    pub(crate) vjp: Option<VjpRule>,
    pub(crate) jvp: Option<JvpRule>,
    pub(crate) vmap: Option<VmapRule>,
    pub(crate) outputs: Vec<Spec>,
}

impl PartialEq for CustomFn {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for CustomFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CustomFn({}, vjp: {}, jvp: {}, vmap: {})",
            self.0.name,
            self.0.vjp.is_some(),
            self.0.jvp.is_some(),
            self.0.vmap.is_some()
        )
    }
}

impl CustomFn {
    pub(crate) fn name(&self) -> &'static str {
        self.0.name
    }

    /// The outputs' shapes and dtypes (from recording the body once).
    pub(crate) fn output_specs(&self) -> &[Spec] {
        &self.0.outputs
    }
}
