//! Shapes and dtypes of an op's tensors packed into words, so that a typical entry keeps them
//! inline in its slot: a header (inputs | outputs << 32 | same << 63), one word per tensor
//! (dtype code | ndim << 8), then all sizes. `same`: the outputs have the inputs' shapes and
//! dtypes (in-place ops) and are not stored again.

use crate::dtype::DType;
use crate::tensor::Tensor;

/// Sizes and PyTorch dtype names of a tensor list.
pub(crate) type Listed = (Vec<Vec<i64>>, Vec<String>);

/// The tensors of one op as they will be packed.
#[derive(Clone, Copy)]
pub(crate) enum Packing<'a> {
    /// One tensor, both input and output (an in-place op on one tensor, the common case):
    /// header, tensor word, sizes.
    One(&'a Tensor),
    /// Anything else.
    Many {
        inputs: &'a [Tensor],
        /// Empty when `same`.
        outputs: &'a [Tensor],
        same: bool,
    },
}

/// The header word of `inputs` and `outputs` tensors.
fn header(inputs: usize, outputs: usize, same: bool) -> u64 {
    inputs as u64 | (outputs as u64) << 32 | (same as u64) << 63
}

/// The word of one tensor: dtype code | ndim << 8.
fn tensor_word(t: &Tensor) -> u64 {
    t.dtype().code() as u64 | (t.dim() as u64) << 8
}

impl<'a> Packing<'a> {
    /// Plans the packing of `inputs` and `outputs` (in-place ops pass one slice twice, which
    /// is recognised without comparing shapes).
    #[inline(always)]
    pub fn of(inputs: &'a [Tensor], outputs: &'a [Tensor]) -> Packing<'a> {
        match inputs {
            [t] if std::ptr::eq(inputs, outputs) => Packing::One(t),
            _ => Packing::many(inputs, outputs),
        }
    }

    fn many(inputs: &'a [Tensor], outputs: &'a [Tensor]) -> Packing<'a> {
        let same = inputs.len() == outputs.len()
            && (inputs.iter().zip(outputs))
                .all(|(a, b)| a.dtype() == b.dtype() && a.shape() == b.shape());
        let outputs = if same { &[][..] } else { outputs };
        Packing::Many {
            inputs,
            outputs,
            same,
        }
    }

    /// Words the packing takes.
    #[inline(always)]
    pub fn len(&self) -> usize {
        match *self {
            Packing::One(t) => 2 + t.dim(),
            Packing::Many {
                inputs, outputs, ..
            } => {
                let tensors = inputs.iter().chain(outputs);
                1 + inputs.len() + outputs.len() + tensors.map(Tensor::dim).sum::<usize>()
            }
        }
    }

    /// Calls `put(i, word)` for the words `0..self.len()` in order.
    #[inline(always)]
    pub fn write(&self, mut put: impl FnMut(usize, u64)) {
        match *self {
            Packing::One(t) => {
                put(0, header(1, 0, true));
                put(1, tensor_word(t));
                for (i, &d) in t.shape().iter().enumerate() {
                    put(2 + i, d as u64);
                }
            }
            Packing::Many {
                inputs,
                outputs,
                same,
            } => {
                put(0, header(inputs.len(), outputs.len(), same));
                let tensors = || inputs.iter().chain(outputs);
                let sizes = tensors().flat_map(|t| t.shape().iter().map(|&d| d as u64));
                let words = tensors().map(tensor_word).chain(sizes);
                words.enumerate().for_each(|(i, w)| put(1 + i, w));
            }
        }
    }

    /// The words as a vector.
    pub fn words(&self) -> Vec<u64> {
        let mut v = vec![0; self.len()];
        self.write(|i, w| v[i] = w);
        v
    }
}

/// (inputs, outputs) of packed `words`, each as size lists (`[[4, 2], [8]]`) and PyTorch's
/// dtype names. Words cut short decode to what they hold.
pub(crate) fn decode(words: &[u64]) -> (Listed, Listed) {
    let Some(&head) = words.first() else {
        return Default::default();
    };
    let n_in = (head & 0xffff_ffff) as usize;
    let n_out = ((head >> 32) & 0x7fff_ffff) as usize;
    let tensors = &words[1..(1 + n_in + n_out).min(words.len())];
    let mut sizes = words[1 + tensors.len()..].iter();
    let mut list = |ts: &[u64]| -> Listed {
        ts.iter()
            .map(|&t| {
                let dims = sizes.by_ref().take((t >> 8) as usize);
                let name = DType::from_code((t & 0xff) as u8).map_or("?", |d| d.torch_name());
                (dims.map(|&d| d as i64).collect(), name.to_string())
            })
            .unzip()
    };
    let ins = list(&tensors[..n_in.min(tensors.len())]);
    let outs = list(&tensors[n_in.min(tensors.len())..]);
    if head >> 63 == 1 {
        (ins.clone(), ins)
    } else {
        (ins, outs)
    }
}
