//! The argument checks of every op of the [`Backend`](crate::Backend) trait, one method per
//! op, named and worded as `ProcessGroupGloo` checks them (the op names are PyTorch's:
//! `"allreduce"`, `"_allgather_base"`, `"alltoall_base"` …). Tensor lists follow the trait's
//! layouts; "same" below means one dtype and one element count ([`At::same`]).

use super::At;
use crate::error::Result;
use crate::options::{BroadcastOptions, ReduceOptions};
use crate::reduce::ReduceOp;
use crate::tensor::Tensor;

/// The checks of one backend's group: its class name (the message prefix), this rank and the
/// group size.
#[derive(Debug, Clone, Copy)]
pub struct Checks<'a> {
    /// `"ProcessGroupGloo"`, `"ProcessGroupNCCL"`, `"StoreBackend"`.
    pub backend: &'a str,
    /// This process's rank in the group.
    pub rank: usize,
    /// The group size.
    pub size: usize,
}

impl<'a> Checks<'a> {
    /// The op `op` of this backend, for its own checks and messages.
    pub fn at(&self, op: &'a str) -> At<'a> {
        At {
            backend: self.backend,
            op,
        }
    }

    /// `broadcast`: the root rank and root tensor exist; all tensors the same.
    ///
    /// # Errors
    /// "invalid root rank: r", "invalid root tensor: i", "invalid tensor type/size …".
    pub fn broadcast(&self, tensors: &[Tensor], opts: &BroadcastOptions) -> Result<()> {
        let at = self.at("broadcast");
        at.root(opts.root_rank, self.size)?;
        at.root_tensor(opts.root_tensor, tensors.len())?;
        at.same(tensors, &tensors[0])
    }

    /// `allreduce`: a non-empty list of same tensors; `op` defined on their dtype.
    ///
    /// # Errors
    /// "requires non-empty tensor list", "invalid tensor type/size …", the reduce-op texts.
    pub fn allreduce(&self, tensors: &[Tensor], op: ReduceOp) -> Result<()> {
        let at = self.at("allreduce");
        at.non_empty(tensors, "")?;
        at.same(tensors, &tensors[0])?;
        at.reduce_op(op, tensors[0].dtype())
    }

    /// `allreduce_coalesced`: a non-empty list of one dtype (sizes may differ); `op` defined on it.
    ///
    /// # Errors
    /// "requires non-empty tensor list", "tensors must all have the same type", the reduce-op texts.
    pub fn allreduce_coalesced(&self, tensors: &[Tensor], op: ReduceOp) -> Result<()> {
        let at = self.at("allreduce_coalesced");
        at.non_empty(tensors, "")?;
        let dtype = tensors[0].dtype();
        if tensors.iter().any(|t| t.dtype() != dtype) {
            return Err(at.invalid("tensors must all have the same type"));
        }
        at.reduce_op(op, dtype)
    }

    /// `reduce`: the root rank and root tensor exist; one tensor; the op defined on its dtype.
    ///
    /// # Errors
    /// "invalid root rank: r", "invalid root tensor: i", "requires a single-element tensor
    /// list", the reduce-op texts.
    pub fn reduce(&self, tensors: &[Tensor], opts: &ReduceOptions) -> Result<()> {
        let at = self.at("reduce");
        at.root(opts.root_rank, self.size)?;
        at.root_tensor(opts.root_tensor, tensors.len())?;
        at.single(tensors)?;
        at.reduce_op(opts.reduce_op, tensors[0].dtype())
    }

    /// `allgather`: `outputs[i]` holds one tensor per rank, each the same as `inputs[i]`.
    ///
    /// # Errors
    /// "requires non-empty input tensor list", "requires input/output tensor lists to have the
    /// same length", "invalid output tensor list at index i (expected length n, got m)",
    /// "invalid tensor type/size …".
    pub fn allgather(&self, outputs: &[Vec<Tensor>], inputs: &[Tensor]) -> Result<()> {
        let at = self.at("allgather");
        at.non_empty(inputs, "input")?;
        if outputs.len() != inputs.len() {
            return Err(at.invalid("requires input/output tensor lists to have the same length"));
        }
        let n = self.size;
        if let Some((i, o)) = outputs.iter().enumerate().find(|(_, o)| o.len() != n) {
            return Err(at.invalid(format!(
                "invalid output tensor list at index {i} (expected length {n}, got {})",
                o.len()
            )));
        }
        at.same(inputs, &inputs[0])?;
        outputs
            .iter()
            .zip(inputs)
            .try_for_each(|(o, i)| at.same(o, i))
    }

    /// `_allgather_base`: `output` has `input`'s dtype and group-size times its elements.
    ///
    /// # Errors
    /// "output tensor must have the same type as input tensor", "output tensor size must be
    /// equal to world_size times input tensor size".
    pub fn allgather_base(&self, output: &Tensor, input: &Tensor) -> Result<()> {
        let at = self.at("_allgather_base");
        if output.dtype() != input.dtype() {
            return Err(at.invalid("output tensor must have the same type as input tensor"));
        }
        if output.numel() != input.numel() * self.size {
            return Err(at.invalid(
                "output tensor size must be equal to world_size times input tensor size",
            ));
        }
        Ok(())
    }

    /// `allgather_coalesced`: one output list per rank, `outputs[r][i]` like `inputs[i]`.
    ///
    /// # Errors
    /// "requires non-empty input tensor list", "output lists should be equal to world size",
    /// "invalid output size", "invalid size of output tensor at index i", "invalid tensor type
    /// at index i".
    pub fn allgather_coalesced(&self, outputs: &[Vec<Tensor>], inputs: &[Tensor]) -> Result<()> {
        let at = self.at("allgather_coalesced");
        at.non_empty(inputs, "input")?;
        if outputs.len() != self.size {
            return Err(at.invalid("output lists should be equal to world size"));
        }
        for o in outputs {
            if o.len() != inputs.len() {
                return Err(at.invalid("invalid output size"));
            }
            for (i, (t, inp)) in o.iter().zip(inputs).enumerate() {
                if t.numel() != inp.numel() {
                    return Err(at.invalid(format!("invalid size of output tensor at index {i}")));
                }
                if t.dtype() != inp.dtype() {
                    return Err(at.invalid(format!("invalid tensor type at index {i}")));
                }
            }
        }
        Ok(())
    }

    /// `allgather_into_tensor_coalesced`: pairs where `outputs[i]` has `inputs[i]`'s dtype and
    /// group-size times its elements.
    ///
    /// # Errors
    /// The [`At::pairs`] text, "invalid tensor type at index i", "invalid size of output tensor
    /// at index i: must be world_size times the input size".
    pub fn allgather_into_tensor_coalesced(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
    ) -> Result<()> {
        let at = self.at("allgather_into_tensor_coalesced");
        at.pairs(outputs, inputs)?;
        for (i, (o, inp)) in outputs.iter().zip(inputs).enumerate() {
            if o.dtype() != inp.dtype() {
                return Err(at.invalid(format!("invalid tensor type at index {i}")));
            }
            if o.numel() != inp.numel() * self.size {
                return Err(at.invalid(format!(
                    "invalid size of output tensor at index {i}: must be world_size times the input size"
                )));
            }
        }
        Ok(())
    }

    /// `gather` to `root`: one input; on the root one output list of one tensor per rank, each
    /// the same as the input; elsewhere no output list. Returns this rank's output tensors
    /// (empty off the root).
    ///
    /// # Errors
    /// "invalid root rank: r", "requires a single-element input tensor list", the
    /// [`At::root_list`] texts, "requires empty output on non-root", "invalid tensor type/size …".
    pub fn gather<'t>(
        &self,
        outputs: &'t [Vec<Tensor>],
        inputs: &[Tensor],
        root: usize,
    ) -> Result<&'t [Tensor]> {
        let at = self.at("gather");
        at.root(root, self.size)?;
        at.single_of(inputs.len(), "input")?;
        self.root_side(at, outputs, root, "output", &inputs[0])
    }

    /// `scatter` from `root`: one output; on the root one input list of one tensor per rank,
    /// each the same as the output; elsewhere no input list. Returns this rank's input tensors
    /// (empty off the root).
    ///
    /// # Errors
    /// "invalid root rank: r", "requires a single-element output tensor list", the
    /// [`At::root_list`] texts, "requires empty input on non-root", "invalid tensor type/size …".
    pub fn scatter<'t>(
        &self,
        outputs: &[Tensor],
        inputs: &'t [Vec<Tensor>],
        root: usize,
    ) -> Result<&'t [Tensor]> {
        let at = self.at("scatter");
        at.root(root, self.size)?;
        at.single_of(outputs.len(), "output")?;
        self.root_side(at, inputs, root, "input", &outputs[0])
    }

    /// The root's list of gather or scatter (`kind` "output"/"input"), like `proto`.
    fn root_side<'t>(
        &self,
        at: At<'_>,
        lists: &'t [Vec<Tensor>],
        root: usize,
        kind: &str,
        proto: &Tensor,
    ) -> Result<&'t [Tensor]> {
        if self.rank != root {
            if !lists.is_empty() {
                return Err(at.invalid(format!("requires empty {kind} on non-root")));
            }
            return Ok(&[]);
        }
        at.root_list(lists, self.size, kind)?;
        at.same(&lists[0], proto)?;
        Ok(&lists[0])
    }

    /// `reduce_scatter`: one output; one input list of one tensor per rank, all of the
    /// output's dtype, this rank's block as large as the output (the others may differ in
    /// size: uneven blocks); `op` defined on the dtype.
    ///
    /// # Errors
    /// "requires a single-element output tensor list", "requires a single-element input list",
    /// "Incorrect input list size …", "invalid tensor type …", "invalid tensor size (input r has
    /// k elements, output m)", the reduce-op texts.
    pub fn reduce_scatter(
        &self,
        outputs: &[Tensor],
        inputs: &[Vec<Tensor>],
        op: ReduceOp,
    ) -> Result<()> {
        let at = self.at("reduce_scatter");
        at.single_of(outputs.len(), "output")?;
        at.root_list(inputs, self.size, "input")?;
        let (out, r) = (&outputs[0], self.rank);
        for t in &inputs[0] {
            at.dtype(t.dtype(), out.dtype())?;
        }
        let mine = inputs[0][r].numel();
        if mine != out.numel() {
            return Err(at.invalid(format!(
                "invalid tensor size (input {r} has {mine} elements, output {})",
                out.numel()
            )));
        }
        at.reduce_op(op, out.dtype())
    }

    /// `_reduce_scatter_base`: `input` has `output`'s dtype and group-size times its elements;
    /// `op` defined on the dtype.
    ///
    /// # Errors
    /// "input tensor must be the same type as the output tensor.", "input tensor must be the
    /// same size as output size times world size", the reduce-op texts.
    pub fn reduce_scatter_base(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<()> {
        let at = self.at("_reduce_scatter_base");
        if output.dtype() != input.dtype() {
            return Err(at.invalid("input tensor must be the same type as the output tensor."));
        }
        if input.numel() != output.numel() * self.size {
            return Err(
                at.invalid("input tensor must be the same size as output size times world size")
            );
        }
        at.reduce_op(op, output.dtype())
    }

    /// `reduce_scatter_tensor_coalesced`: pairs of one dtype where `inputs[i]` has group-size
    /// times `outputs[i]`'s elements; `op` defined on the dtype.
    ///
    /// # Errors
    /// The [`At::pairs`] text, "invalid tensor type at index i", "input tensor i must be the
    /// same size as output size times world size", the reduce-op texts.
    pub fn reduce_scatter_tensor_coalesced(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        op: ReduceOp,
    ) -> Result<()> {
        let at = self.at("reduce_scatter_tensor_coalesced");
        at.pairs(outputs, inputs)?;
        let dtype = inputs[0].dtype();
        for (i, (o, inp)) in outputs.iter().zip(inputs).enumerate() {
            if o.dtype() != dtype || inp.dtype() != dtype {
                return Err(at.invalid(format!("invalid tensor type at index {i}")));
            }
            if inp.numel() != o.numel() * self.size {
                return Err(at.invalid(format!(
                    "input tensor {i} must be the same size as output size times world size"
                )));
            }
        }
        at.reduce_op(op, dtype)
    }

    /// `alltoall`: one input and one output tensor per rank, all of one dtype; what this rank
    /// sends itself as large as what it expects from itself.
    ///
    /// # Errors
    /// "input tensor list size k does not match world size n" (and the output's), "input and
    /// output tensors must have the same type", [`At::self_exchange`]'s text.
    pub fn alltoall(&self, outputs: &[Tensor], inputs: &[Tensor]) -> Result<()> {
        let (at, n, r) = (self.at("alltoall"), self.size, self.rank);
        for (what, list) in [("input", inputs), ("output", outputs)] {
            if list.len() != n {
                return Err(at.invalid(format!(
                    "{what} tensor list size {} does not match world size {n}",
                    list.len()
                )));
            }
        }
        let dtype = inputs[0].dtype();
        if inputs.iter().chain(outputs).any(|t| t.dtype() != dtype) {
            return Err(at.invalid("input and output tensors must have the same type"));
        }
        at.self_exchange(
            r,
            inputs[r].numel(),
            outputs[r].numel(),
            &format!("input and output tensors at index {r} differ in size"),
        )
    }

    /// `alltoall_base` (`all_to_all_single`): one dtype for input and output, the split sizes
    /// of each ([`At::split_counts`]), and what this rank sends itself equal to what it expects
    /// from itself. Returns the (output, input) element counts per rank.
    ///
    /// # Errors
    /// "input and output tensors must have the same dtype (input: .., output: ..)"; the
    /// split-size texts; [`At::self_exchange`]'s text.
    pub fn alltoall_base(
        &self,
        output: &Tensor,
        input: &Tensor,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        let (at, n, r) = (self.at("alltoall_base"), self.size, self.rank);
        if output.dtype() != input.dtype() {
            return Err(at.invalid(format!(
                "input and output tensors must have the same dtype (input: {}, output: {})",
                input.dtype(),
                output.dtype()
            )));
        }
        let outs = at.split_counts(output, output_split_sizes, n, "output")?;
        let ins = at.split_counts(input, input_split_sizes, n, "input")?;
        let why = format!("input and output split sizes disagree at index {r}");
        at.self_exchange(r, ins[r], outs[r], &why)?;
        Ok((outs, ins))
    }

    /// `send` to `dst` (`to_self`: whether the backend can send to its own rank): one tensor,
    /// a peer in the group.
    ///
    /// # Errors
    /// "requires a single-element tensor list", "invalid destination rank …".
    pub fn send(&self, tensors: &[Tensor], dst: usize, to_self: bool) -> Result<()> {
        self.p2p("send", tensors, Some(dst), to_self)
    }

    /// `recv` from `src` (`None`: any source, op `recvAnysource`): as [`Checks::send`].
    ///
    /// # Errors
    /// "requires a single-element tensor list", "invalid source rank …".
    pub fn recv(&self, tensors: &[Tensor], src: Option<usize>, to_self: bool) -> Result<()> {
        let op = if src.is_some() {
            "recv"
        } else {
            "recvAnysource"
        };
        self.p2p(op, tensors, src, to_self)
    }

    fn p2p(
        &self,
        op: &'a str,
        tensors: &[Tensor],
        peer: Option<usize>,
        to_self: bool,
    ) -> Result<()> {
        let at = self.at(op);
        at.single(tensors)?;
        match peer {
            Some(p) => at.peer(p, (self.rank, self.size), to_self),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    const C: Checks = Checks {
        backend: "B",
        rank: 1,
        size: 2,
    };

    fn f32s(n: usize) -> Tensor {
        Tensor::zeros(DType::F32, &[n])
    }

    #[test]
    fn gather_returns_the_roots_list_only_on_the_root() {
        let outs = vec![vec![f32s(2), f32s(2)]];
        assert_eq!(C.gather(&outs, &[f32s(2)], 1).unwrap().len(), 2);
        assert!(C.gather(&[], &[f32s(2)], 0).unwrap().is_empty());
        assert_eq!(
            C.gather(&outs, &[f32s(2)], 0).unwrap_err().message(),
            "B::gather: requires empty output on non-root"
        );
    }

    #[test]
    fn uneven_reduce_scatter_checks_only_this_ranks_block() {
        let ins = vec![vec![f32s(5), f32s(2)]];
        assert!(C.reduce_scatter(&[f32s(2)], &ins, ReduceOp::Sum).is_ok());
        assert!(C.reduce_scatter(&[f32s(5)], &ins, ReduceOp::Sum).is_err());
    }

    #[test]
    fn bitwise_ops_need_integers() {
        let e = C.allreduce(&[f32s(2)], ReduceOp::Band).unwrap_err();
        assert!(
            e.message()
                .starts_with("B::allreduce: Cannot use ReduceOp.BAND"),
            "{e}"
        );
    }
}
