//! Object collectives (`all_gather_object`, `gather_object`, `broadcast_object_list`,
//! `scatter_object_list`, `send_object_list`, `recv_object_list`) over `serde`.
//!
//! Objects are encoded with `bincode` 1 (PyTorch pickles; a Rust peer cannot read pickles, so
//! these do not interoperate with Python ranks). The wire pattern follows PyTorch so that the
//! same collectives run: `all_gather_object` = one all-gather of the sizes (int64) + one
//! all-gather of the payloads padded to the largest (uint8); `gather_object` = all-gather of
//! sizes + gather; `broadcast_object_list` = broadcast of the sizes + broadcast of the
//! concatenated payloads; `scatter_object_list` = broadcast of the largest size + scatter of
//! padded payloads + scatter of sizes; `send/recv_object_list` = sizes then payloads.
//!
//! Every function takes the root as a global rank (`src`/`dst`) or a group rank
//! (`group_src`/`group_dst`); non-members get a warning and return without communicating.

use crate::call::Rank;
use crate::world::{GroupMember, World};
use c10d_core::{DType, DistError, Result, Tensor};
use serde::de::DeserializeOwned;
use serde::Serialize;

fn encode<T: Serialize>(obj: &T) -> Result<Vec<u8>> {
    bincode::serialize(obj)
        .map_err(|e| DistError::invalid(format!("object collective: cannot serialize object: {e}")))
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    bincode::deserialize(bytes).map_err(|e| {
        DistError::invalid(format!("object collective: cannot deserialize object: {e}"))
    })
}

/// Largest serialized object a peer may announce (bytes); anything larger is taken as garbage.
const MAX_OBJECT_BYTES: i64 = 1 << 34;

/// Validates object sizes announced by peers: each in `0..=MAX_OBJECT_BYTES`, their sum too.
fn peer_sizes(sizes: Vec<i64>) -> Result<Vec<usize>> {
    let mut total: i64 = 0;
    for &s in &sizes {
        if !(0..=MAX_OBJECT_BYTES).contains(&s) {
            return Err(DistError::backend(format!(
                "object collective: a peer announced an object of {s} bytes (expected 0..={MAX_OBJECT_BYTES}); \
                 the ranks disagree on the call or a peer sent garbage"
            )));
        }
        total = total.saturating_add(s);
    }
    if total > MAX_OBJECT_BYTES {
        return Err(DistError::backend(format!(
            "object collective: peers announced {total} bytes of objects in one call (limit {MAX_OBJECT_BYTES})"
        )));
    }
    Ok(sizes.into_iter().map(|s| s as usize).collect())
}

/// `bytes` zero-padded to `len`, as a uint8 tensor (takes the buffer: no copy).
fn padded(mut bytes: Vec<u8>, len: usize) -> Tensor {
    bytes.resize(len, 0);
    Tensor::from_vec(bytes)
}

/// One object per padded uint8 tensor, each the first `sizes[i]` bytes of `outs[i]`.
fn decode_each<T: DeserializeOwned>(outs: &[Tensor], sizes: &[usize]) -> Result<Vec<T>> {
    outs.iter()
        .zip(sizes)
        .map(|(t, &s)| t.read(|b: &[u8]| decode(&b[..s]))?)
        .collect()
}

/// Fills `objs` from the concatenated payload of objects of `sizes` bytes.
fn decode_concat<T: DeserializeOwned>(
    payload: &Tensor,
    sizes: &[usize],
    objs: &mut [T],
) -> Result<()> {
    payload.read(|b: &[u8]| -> Result<()> {
        let mut off = 0;
        for (slot, s) in objs.iter_mut().zip(sizes) {
            *slot = decode(&b[off..off + s])?;
            off += s;
        }
        Ok(())
    })?
}

impl World {
    /// All-gathers one object size (int64) per rank of `g` (`n` ranks), checked by
    /// [`peer_sizes`].
    fn all_gather_sizes(&self, g: &GroupMember, n: usize, mine: usize) -> Result<Vec<usize>> {
        let size = Tensor::from_vec(vec![mine as i64]);
        let sizes: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(DType::I64, &[1])).collect();
        self.all_gather(&sizes, &size).group(g).run()?;
        peer_sizes(
            sizes
                .iter()
                .map(|t| t.to_vec::<i64>().map(|v| v[0]))
                .collect::<Result<_>>()?,
        )
    }

    /// `all_gather_object(object_list, obj, group)`: returns every rank's object in group-rank
    /// order (empty on a non-member).
    ///
    /// # Errors
    /// Serialization errors; the collectives' errors.
    pub fn all_gather_object<T: Serialize + DeserializeOwned>(
        &self,
        obj: &T,
        group: Option<&GroupMember>,
    ) -> Result<Vec<T>> {
        let Some(pg) = self.op_group(group, "all_gather_object")? else {
            return Ok(Vec::new());
        };
        let g = GroupMember::Group(pg.clone());
        let n = pg.size();
        let bytes = encode(obj)?;
        let sizes = self.all_gather_sizes(&g, n, bytes.len())?;
        let max = sizes.iter().copied().max().unwrap_or(0);
        let input = padded(bytes, max);
        let outs: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(DType::U8, &[max])).collect();
        self.all_gather(&outs, &input).group(&g).run()?;
        decode_each(&outs, &sizes)
    }

    /// `gather_object(obj, object_gather_list, dst, group, group_dst)`: the root (default
    /// global 0) gets `Some(objects)`, other ranks `None`.
    ///
    /// # Errors
    /// As [`World::all_gather_object`]; root errors as [`World::gather`].
    pub fn gather_object<T: Serialize + DeserializeOwned>(
        &self,
        obj: &T,
        dst: Option<usize>,
        group: Option<&GroupMember>,
        group_dst: Option<usize>,
    ) -> Result<Option<Vec<T>>> {
        let Some(pg) = self.op_group(group, "gather_object")? else {
            return Ok(None);
        };
        let g = GroupMember::Group(pg.clone());
        let root = self.root_or_global0(&pg, dst, group_dst)?;
        let n = pg.size();
        let bytes = encode(obj)?;
        let sizes = self.all_gather_sizes(&g, n, bytes.len())?;
        let max = sizes.iter().copied().max().unwrap_or(0);
        let input = padded(bytes, max);
        if pg.rank() == root {
            let outs: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(DType::U8, &[max])).collect();
            let dst = Rank::Group(root);
            self.gather(&input)
                .gather_list(&outs)
                .dst(dst)
                .group(&g)
                .run()?;
            Ok(Some(decode_each(&outs, &sizes)?))
        } else {
            self.gather(&input).dst(Rank::Group(root)).group(&g).run()?;
            Ok(None)
        }
    }

    /// `broadcast_object_list(object_list, src, group, group_src)`: every rank passes a list of
    /// the same length; after the call all hold the root's objects.
    ///
    /// # Errors
    /// As [`World::broadcast`]; "broadcast_object_list: ..." when lengths differ from the root's.
    pub fn broadcast_object_list<T: Serialize + DeserializeOwned>(
        &self,
        objs: &mut [T],
        src: Option<usize>,
        group: Option<&GroupMember>,
        group_src: Option<usize>,
    ) -> Result<()> {
        let Some(pg) = self.op_group(group, "broadcast_object_list")? else {
            return Ok(());
        };
        let g = GroupMember::Group(pg.clone());
        let root = self.root_or_global0(&pg, src, group_src)?;
        let me = pg.rank() == root;
        let encoded: Vec<Vec<u8>> = if me {
            objs.iter().map(encode).collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let sizes = if me {
            Tensor::from_vec(encoded.iter().map(|b| b.len() as i64).collect::<Vec<_>>())
        } else {
            Tensor::zeros(DType::I64, &[objs.len()])
        };
        self.broadcast(&sizes, Rank::Group(root)).group(&g).run()?;
        let sizes = peer_sizes(sizes.to_vec::<i64>()?)?;
        let total: usize = sizes.iter().sum();
        let payload = if me {
            Tensor::from_vec(encoded.concat())
        } else {
            Tensor::zeros(DType::U8, &[total])
        };
        self.broadcast(&payload, Rank::Group(root))
            .group(&g)
            .run()?;
        if !me {
            decode_concat(&payload, &sizes, objs)?;
        }
        Ok(())
    }

    /// `scatter_object_list(output, input_list, src, group, group_src)`: the root passes one
    /// object per group rank; every rank gets its own (`None` on a non-member).
    ///
    /// # Errors
    /// "Argument ``scatter_list`` must be specified on source rank." and the other
    /// [`World::scatter`] errors; serialization errors.
    pub fn scatter_object_list<T: Serialize + DeserializeOwned>(
        &self,
        scatter_list: Option<&[T]>,
        src: Option<usize>,
        group: Option<&GroupMember>,
        group_src: Option<usize>,
    ) -> Result<Option<T>> {
        let Some(pg) = self.op_group(group, "scatter_object_list")? else {
            return Ok(None);
        };
        let g = GroupMember::Group(pg.clone());
        let root = self.root_or_global0(&pg, src, group_src)?;
        let me = pg.rank() == root;
        let encoded: Vec<Vec<u8>> = match (me, scatter_list) {
            (true, Some(l)) => l.iter().map(encode).collect::<Result<_>>()?,
            (true, None) => {
                return Err(DistError::invalid(
                    "Argument ``scatter_list`` must be specified on source rank.",
                ))
            }
            (false, _) => Vec::new(),
        };
        let size_ins: Vec<Tensor> = encoded
            .iter()
            .map(|b| Tensor::from_vec(vec![b.len() as i64]))
            .collect();
        let max = Tensor::from_vec(vec![encoded
            .iter()
            .map(|b| b.len() as i64)
            .max()
            .unwrap_or(0)]);
        self.broadcast(&max, Rank::Group(root)).group(&g).run()?;
        let max = peer_sizes(max.to_vec::<i64>()?)?[0];
        let out = Tensor::zeros(DType::U8, &[max]);
        let ins: Vec<Tensor> = encoded.into_iter().map(|b| padded(b, max)).collect();
        let src = Rank::Group(root);
        let ins: &[Tensor] = if me { &ins } else { &[] };
        self.scatter(&out)
            .scatter_list(ins)
            .src(src)
            .group(&g)
            .run()?;
        let size_out = Tensor::zeros(DType::I64, &[1]);
        let size_ins: &[Tensor] = if me { &size_ins } else { &[] };
        let scatter = self.scatter(&size_out).scatter_list(size_ins);
        scatter.src(src).group(&g).run()?;
        let s = peer_sizes(size_out.to_vec::<i64>()?)?[0];
        Ok(Some(out.read(|b: &[u8]| decode(&b[..s.min(b.len())]))??))
    }

    /// `send_object_list(object_list, dst, group, group_dst)`.
    ///
    /// # Errors
    /// As [`World::send`]; serialization errors.
    pub fn send_object_list<T: Serialize>(
        &self,
        objs: &[T],
        dst: Option<usize>,
        group: Option<&GroupMember>,
        group_dst: Option<usize>,
    ) -> Result<()> {
        let Some(pg) = self.op_group(group, "send_object_list")? else {
            return Ok(());
        };
        let g = GroupMember::Group(pg.clone());
        let encoded: Vec<Vec<u8>> = objs.iter().map(encode).collect::<Result<_>>()?;
        let sizes = Tensor::from_vec(encoded.iter().map(|b| b.len() as i64).collect::<Vec<_>>());
        let dst = Rank::from_pair(dst, group_dst)?;
        self.send(&sizes, dst).group(&g).run()?;
        let payload = Tensor::from_vec(encoded.concat());
        self.send(&payload, dst).group(&g).run()
    }

    /// `recv_object_list(object_list, src, group, group_src)`: fills `objs` (same length as the
    /// sender's list) and returns the sender's global rank (−1 on a non-member).
    ///
    /// # Errors
    /// As [`World::recv`]; deserialization errors.
    pub fn recv_object_list<T: DeserializeOwned>(
        &self,
        objs: &mut [T],
        src: Option<usize>,
        group: Option<&GroupMember>,
        group_src: Option<usize>,
    ) -> Result<i64> {
        let Some(pg) = self.op_group(group, "recv_object_list")? else {
            return Ok(-1);
        };
        let g = GroupMember::Group(pg.clone());
        let sizes = Tensor::zeros(DType::I64, &[objs.len()]);
        let mut recv = self.recv(&sizes).group(&g);
        if let Some(src) = Rank::optional_pair(src, group_src)? {
            recv = recv.src(src);
        }
        let sender = recv.run()?;
        let sizes = peer_sizes(sizes.to_vec::<i64>()?)?;
        let payload = Tensor::zeros(DType::U8, &[sizes.iter().sum()]);
        let from = self.get_group_rank(&pg, sender as usize)?;
        self.recv(&payload).src(Rank::Group(from)).group(&g).run()?;
        decode_concat(&payload, &sizes, objs)?;
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use super::peer_sizes;

    #[test]
    fn garbage_sizes_from_peers_are_errors_not_allocations() {
        assert_eq!(peer_sizes(vec![0, 3, 5]).unwrap(), vec![0, 3, 5]);
        assert!(peer_sizes(vec![-1])
            .unwrap_err()
            .to_string()
            .contains("-1 bytes"));
        assert!(peer_sizes(vec![i64::MAX]).is_err());
        assert!(peer_sizes(vec![1 << 33, 1 << 33, 1])
            .unwrap_err()
            .to_string()
            .contains("limit"));
    }
}
