//! Compiled element-wise programs (`Primitive::Compiled`): one pass over the elements in
//! chunks that stay in cache, each step running the CPU kernel of its primitive on the chunk.
//! Every element takes the same kernel path it takes unfused, so results are bit-identical,
//! while the intermediates never travel to memory.

use rayon::prelude::*;

use nuvec_core::primitive::compiled::{Program, Step};
use nuvec_core::storage::{Data, HostBuffer, Layout, Operand, Output};
use nuvec_core::{Result, Shape};

use crate::{binary, copy, internal, unary};

/// Elements per chunk: a multiple of every SIMD width, large enough that per-chunk calls cost
/// little (the compile record in bench/results), small enough that a chunk's values stay cached.
const CHUNK: usize = 1 << 16;

/// Runs `program` on `inputs` (all of the outputs' shape) into `outputs`.
pub fn eval(program: &Program, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let n = outputs.first().map_or(0, Output::size);
    // Dense inputs are read in place and broadcast scalars as one element; anything else is
    // copied to row-major first.
    let inputs: Vec<Operand> =
        inputs.into_iter().map(|x| if scalar(&x) { Ok(x) } else { copy::row_major(x) }).collect::<Result<_>>()?;
    let mut buffers: Vec<HostBuffer> =
        outputs.iter().map(|o| HostBuffer::uninit(n * o.dtype.size())).collect::<Result<_>>()?;
    // Per chunk, its slice of every output.
    let mut slices: Vec<Vec<&mut [u8]>> = (0..n.div_ceil(CHUNK)).map(|_| Vec::new()).collect();
    for (buf, o) in buffers.iter_mut().zip(outputs.iter()) {
        for (c, s) in buf.bytes_mut().chunks_mut(CHUNK * o.dtype.size()).enumerate() {
            slices[c].push(s);
        }
    }
    slices.into_par_iter().enumerate().try_for_each(|(c, outs)| chunk(program, &inputs, c * CHUNK, outs))?;
    for (o, buf) in outputs.iter_mut().zip(buffers) {
        o.data = Some(Data::from_host_buffer(&o.shape, buf));
    }
    Ok(())
}

/// Whether every stride is zero (a broadcast scalar).
fn scalar(x: &Operand) -> bool {
    x.data.layout.strides.iter().all(|&s| s == 0)
}

/// Elements `start..start + len` of every output, `len` the slices' length.
fn chunk(program: &Program, inputs: &[Operand], start: usize, mut outs: Vec<&mut [u8]>) -> Result<()> {
    let len = outs.first().map_or(0, |s| s.len() / program.dtype(program.outputs[0]).size());
    let shape = Shape::from_slice(&[len as i32]);
    let mut values: Vec<Operand> = inputs
        .iter()
        .map(|x| {
            let (stride, offset) =
                if scalar(x) { (0, x.data.layout.offset) } else { (1, x.data.layout.offset + start) };
            let layout = Layout::new(&shape, [stride].into_iter().collect(), offset);
            Operand {
                shape: shape.clone(),
                dtype: x.dtype,
                data: Data { storage: x.data.storage.clone(), layout },
                donated: false,
            }
        })
        .collect();
    for (step, dtype) in &program.steps {
        let mut out = Output { shape: shape.clone(), dtype: *dtype, data: None };
        let v = |i: usize| values[i].clone();
        match *step {
            Step::Unary(op, a) => unary::eval(op, v(a), &mut out)?,
            Step::Binary(op, a, b) => binary::eval(op, v(a), v(b), &mut out)?,
            Step::Select(c, a, b) => binary::select(v(c), v(a), v(b), &mut out)?,
            Step::AsType(_, a) => copy::astype(v(a), &mut out)?,
        }
        let data = out.data.ok_or_else(|| internal("compiled: a step produced no output"))?;
        values.push(Operand { shape: shape.clone(), dtype: *dtype, data, donated: false });
    }
    for (slot, &o) in outs.iter_mut().zip(&program.outputs) {
        let x = copy::row_major(values[o].clone())?;
        let size = x.dtype.size();
        let host = x.data.storage.host_buffer().ok_or_else(|| internal("compiled: a value is not on the host"))?;
        let at = x.data.layout.offset * size;
        let bytes = host.bytes().get(at..at + slot.len()).ok_or_else(|| internal("compiled: a value is short"))?;
        slot.copy_from_slice(bytes);
    }
    Ok(())
}
