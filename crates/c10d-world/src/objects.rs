//! Object collectives (`all_gather_object`, `gather_object`, `broadcast_object_list`,
//! `scatter_object_list`, `send_object_list`, `recv_object_list`) over `serde`.
//!
//! Objects are pickled, as PyTorch pickles them (`serde-pickle`: written with protocol 3,
//! read up to protocol 5), so a PyTorch rank and a Rust rank of one group exchange objects:
//! a Python `list` of `tuple`s arrives as a `Vec` of Rust tuples, a `dict` as a map or a struct,
//! `str` as `String`, `bytes` as `serde_bytes::ByteBuf`. Reading never runs code: a call of a
//! callable the reader does not know (a `__reduce__` naming `os.system`, a class from a
//! module) is refused with an error, and a plain instance arrives as its attribute dict, so a
//! Python rank should send plain data. Limits of `serde-pickle` (c10d-rs's reader): integers
//! fit in `i64`, strings and bytes under 4 GiB; a memoised value referenced many times is
//! copied each time.
//!
//! **Hostile pickles.** Unlike PyTorch (whose `pickle.loads` reads anything, and runs code),
//! a peer's pickle is first scanned, opcode by opcode and without building anything, by a
//! bounded walker ([`PickleLimits`]), and refused when the reader would hold more than the
//! bound: a memoised value counts as its size at every reference (the "billion laughs", a
//! list of a million references to one list), copies made while parsing count (`DUP`, a `PUT`
//! of a `GET`), a declared length (`BINUNICODE`, `BINBYTES8`, `LONG4`) must fit in the bytes
//! received, and nesting must stay within the depth bound. The bounds: the expanded size at
//! most max(64 MiB, 32 × the pickle's length) (no pickle without shared references reaches it:
//! an opcode byte makes at most one 32-byte value), depth at most 500; `C10D_OBJECT_MAX_BYTES`
//! (the 64 MiB floor) and `C10D_OBJECT_MAX_DEPTH` change them. The op then fails with an
//! [`DistError::InvalidArgument`] naming the sender and the bound, e.g.
//! `recv_object_list: refused the object from rank 1 (global rank 1) (212 pickle bytes):
//! pickle expands past the 64 MiB bound (...)`; the scan's own memory is a few words per
//! opcode and it stops at the bound.
//!
//! The wire pattern follows PyTorch 2.15 so that the same collectives run:
//! `all_gather_object` = one `all_gather_into_tensor` of the sizes (int64) + one of the payloads
//! padded to the largest (uint8); `gather_object` = all-gather (list) of
//! sizes + gather; `broadcast_object_list` = broadcast of the sizes + broadcast of the
//! concatenated payloads; `scatter_object_list` = broadcast of the largest size + scatter of
//! padded payloads + scatter of sizes; `send/recv_object_list` = sizes then payloads.
//!
//! They share the call style of the tensor collectives ([`crate::call`]), blocking only as in
//! PyTorch: the root is a [`Rank`] (global or group rank, default global 0, any source for
//! `recv_object_list`); non-members get a warning and return without communicating.

use crate::call::{keyword, Call, Collective, Keywords, Rank};
use crate::world::{GroupMember, World};
use c10d_core::{DType, DistError, ProcessGroup, Result, Tensor};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use crate::pickle_scan::PickleLimits;

/// The pickle of `obj` (protocol 3, which every Python 3 reads): what the object collectives
/// send, and what a Python peer's `pickle.loads` reads.
///
/// # Errors
/// [`DistError::InvalidArgument`] when `serde-pickle` cannot represent `obj`.
pub fn encode<T: Serialize>(obj: &T) -> Result<Vec<u8>> {
    serde_pickle::to_vec(obj, serde_pickle::SerOptions::new())
        .map_err(|e| DistError::invalid(format!("object collective: cannot serialize object: {e}")))
}

/// `T` from a pickle (protocols 0 to 5, e.g. a Python peer's `pickle.dumps`), never running
/// code: calls of callables other than `serde-pickle`'s few known builtins are refused. The
/// pickle is first checked against [`PickleLimits::from_env`] (see the module docs).
///
/// # Errors
/// [`DistError::InvalidArgument`] for a pickle that names a class or function, a malformed
/// pickle, data that does not fit `T`, or a pickle past the limits.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    decode_limited(bytes, &PickleLimits::from_env(), None)
}

/// Who sent an object: its group rank and global rank.
#[derive(Clone, Copy, Debug)]
struct Peer {
    group: usize,
    global: usize,
}

impl Peer {
    /// Group rank `r` of `pg`, with its global rank.
    fn of(w: &World, pg: &ProcessGroup, r: usize) -> Result<Peer> {
        Ok(Peer {
            group: r,
            global: w.get_global_rank(pg, r)?,
        })
    }
}

/// [`decode`] under `limits`; errors name `from` when given.
fn decode_limited<T: DeserializeOwned>(
    bytes: &[u8],
    limits: &PickleLimits,
    from: Option<Peer>,
) -> Result<T> {
    let who = from.map_or(String::new(), |p| {
        format!(" from rank {} (global rank {})", p.group, p.global)
    });
    if let Err(why) = crate::pickle_scan::check(bytes, limits) {
        return Err(DistError::invalid(format!(
            "object collective: refused the object{who} ({} pickle bytes): {why}",
            bytes.len()
        )));
    }
    serde_pickle::from_slice(bytes, serde_pickle::DeOptions::new()).map_err(|e| {
        DistError::invalid(format!(
            "object collective: cannot read the object{who} (a pickle of plain data is expected; calls of unknown callables are refused): {e}"
        ))
    })
}

/// [`decode`] of the object `from` sent.
fn decode_from<T: DeserializeOwned>(bytes: &[u8], from: Peer) -> Result<T> {
    decode_limited(bytes, &PickleLimits::from_env(), Some(from))
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

/// One object per padded uint8 tensor, each the first `sizes[i]` bytes of `outs[i]`, sent by
/// group rank `i` of `pg`.
fn decode_each<T: DeserializeOwned>(
    w: &World,
    pg: &ProcessGroup,
    outs: &[Tensor],
    sizes: &[usize],
) -> Result<Vec<T>> {
    outs.iter()
        .zip(sizes)
        .enumerate()
        .map(|(r, (t, &s))| {
            let from = Peer::of(w, pg, r)?;
            t.read(|b: &[u8]| decode_from(&b[..s], from))?
        })
        .collect()
}

/// Fills `objs` from the concatenated payload of objects of `sizes` bytes.
fn decode_concat<T: DeserializeOwned>(
    payload: &Tensor,
    sizes: &[usize],
    objs: &mut [T],
    from: Peer,
) -> Result<()> {
    payload.read(|b: &[u8]| -> Result<()> {
        let mut off = 0;
        for (slot, s) in objs.iter_mut().zip(sizes) {
            *slot = decode_from(&b[off..off + s], from)?;
            off += s;
        }
        Ok(())
    })?
}

impl World {
    /// All-gathers one object size (int64) per rank of `g` (`n` ranks), checked by
    /// [`peer_sizes`].
    fn all_gather_sizes(
        &self,
        g: &GroupMember,
        t: Timeout,
        n: usize,
        mine: usize,
    ) -> Result<Vec<usize>> {
        let size = Tensor::from_vec(vec![mine as i64]);
        let sizes: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(DType::I64, &[1])).collect();
        self.all_gather(&sizes, &size).group(g).within(t).run()?;
        peer_sizes(
            sizes
                .iter()
                .map(|t| t.to_vec::<i64>().map(|v| v[0]))
                .collect::<Result<_>>()?,
        )
    }

    /// The group an object collective runs on as a member handle, with its process group;
    /// `None` for non-members (after PyTorch's warning).
    fn object_group(
        &self,
        kw: &Keywords<'_>,
        op: &str,
    ) -> Result<Option<(ProcessGroup, GroupMember)>> {
        let pg = self.op_group(kw.group, op)?;
        Ok(pg.map(|pg| (pg.clone(), GroupMember::Group(pg))))
    }

    /// `all_gather_object(object_list, obj, group=None)`: `.run()` returns every rank's object
    /// in group-rank order (empty on a non-member). Blocking only, as in PyTorch.
    ///
    /// # Errors
    /// Serialization errors; the collectives' errors.
    pub fn all_gather_object<'a, T: Serialize + DeserializeOwned>(
        &'a self,
        obj: &'a T,
    ) -> Collective<'a, AllGatherObject<'a, T>> {
        Collective::new(self, AllGatherObject { obj })
    }

    /// `gather_object(obj, object_gather_list=None, dst=0, group=None, group_dst=None)`:
    /// `.run()` gives the root `Some(objects)`, other ranks `None`.
    ///
    /// # Errors
    /// As [`World::all_gather_object`]; root errors as [`World::gather`].
    pub fn gather_object<'a, T: Serialize + DeserializeOwned>(
        &'a self,
        obj: &'a T,
    ) -> Collective<'a, GatherObject<'a, T>> {
        Collective::new(self, GatherObject { obj, dst: None })
    }

    /// `broadcast_object_list(object_list, src=0, group=None, group_src=None)`: every rank
    /// passes a list of the same length; after the call all hold the root's objects.
    ///
    /// # Errors
    /// As [`World::broadcast`]; "broadcast_object_list: cannot deserialize ..." when lengths
    /// differ from the root's.
    pub fn broadcast_object_list<'a, T: Serialize + DeserializeOwned>(
        &'a self,
        object_list: &'a mut [T],
    ) -> Collective<'a, BroadcastObjectList<'a, T>> {
        Collective::new(
            self,
            BroadcastObjectList {
                object_list,
                src: None,
            },
        )
    }

    /// `scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=0,
    /// group=None, group_src=None)`: the root passes one object per group rank
    /// (`.scatter_object_input_list(..)`); `.run()` gives every rank its own (`None` on a
    /// non-member).
    ///
    /// # Errors
    /// "Argument ``scatter_list`` must be specified on source rank." and the other
    /// [`World::scatter`] errors; serialization errors.
    pub fn scatter_object_list<T: Serialize + DeserializeOwned>(
        &self,
    ) -> Collective<'_, ScatterObjectList<'_, T>> {
        let args = ScatterObjectList {
            input: &[],
            src: None,
        };
        Collective::new(self, args)
    }

    /// `send_object_list(object_list, dst, group=None, group_dst=None)`.
    ///
    /// # Errors
    /// As [`World::send`]; serialization errors.
    pub fn send_object_list<'a, T: Serialize>(
        &'a self,
        object_list: &'a [T],
        dst: impl Into<Rank>,
    ) -> Collective<'a, SendObjectList<'a, T>> {
        let dst = dst.into();
        Collective::new(self, SendObjectList { object_list, dst })
    }

    /// `recv_object_list(object_list, src=None, group=None, group_src=None)`: fills
    /// `object_list` (same length as the sender's list); `.run()` returns the sender's global
    /// rank (−1 on a non-member). Without `.src(..)` any source matches.
    ///
    /// # Errors
    /// As [`World::recv`]; deserialization errors.
    pub fn recv_object_list<'a, T: DeserializeOwned>(
        &'a self,
        object_list: &'a mut [T],
    ) -> Collective<'a, RecvObjectList<'a, T>> {
        Collective::new(
            self,
            RecvObjectList {
                object_list,
                src: None,
            },
        )
    }
}

type Timeout = Option<std::time::Duration>;

/// Implements the sealed [`Call`] for an object collective's arguments: `object_op!(Type,
/// "name", [bounds], Output, |args, world, kw| body)` (blocking only, as in PyTorch). Errors
/// of this module's helpers ("object collective: ...") are told with the op's name.
macro_rules! object_op {
    ($ty:ident, $name:literal, [$($b:tt)*], $out:ty, |$a:ident, $w:ident, $kw:ident| $body:block) => {
        impl<T: $($b)*> crate::call::Sealed for $ty<'_, T> {}
        impl<T: $($b)*> Call for $ty<'_, T> {
            type Output = $out;
            fn run(self, $w: &World, $kw: &Keywords<'_>) -> Result<$out> {
                let $a = self;
                let result: Result<$out> = (|| $body)();
                result.map_err(|e| name_the_op(e, $name))
            }
        }
    };
}

/// `e` with a leading "object collective" replaced by the op's name (other errors, from the
/// collectives, already name theirs).
fn name_the_op(e: DistError, op: &str) -> DistError {
    match e.message().strip_prefix("object collective:") {
        Some(rest) => e.map_message(|_| format!("{op}:{rest}")),
        None => e,
    }
}

/// Arguments of [`World::all_gather_object`].
#[derive(Debug)]
pub struct AllGatherObject<'a, T> {
    obj: &'a T,
}
object_op!(
    AllGatherObject,
    "all_gather_object",
    [Serialize + DeserializeOwned],
    Vec<T>,
    |a, w, kw| {
        let Some((pg, g)) = w.object_group(kw, "all_gather_object")? else {
            return Ok(Vec::new());
        };
        let n = pg.size();
        let bytes = encode(a.obj)?;
        // PyTorch 2.15: both exchanges are `all_gather_into_tensor` (`all_gather_single`).
        let size = Tensor::from_vec(vec![bytes.len() as i64]);
        let all = Tensor::zeros(DType::I64, &[n]);
        w.all_gather_into_tensor(&all, &size)
            .group(&g)
            .within(kw.timeout)
            .run()?;
        let sizes = peer_sizes(all.to_vec::<i64>()?)?;
        let max = sizes.iter().copied().max().unwrap_or(0);
        let input = padded(bytes, max);
        let flat = Tensor::zeros(DType::U8, &[max * n]);
        w.all_gather_into_tensor(&flat, &input)
            .group(&g)
            .within(kw.timeout)
            .run()?;
        let outs = (0..n)
            .map(|r| flat.flat_slice(r * max, max))
            .collect::<Result<Vec<Tensor>>>()?;
        decode_each(w, &pg, &outs, &sizes)
    }
);

/// The root of an object collective: `root` when given, else global rank 0.
fn root_or_global0(w: &World, pg: &ProcessGroup, root: Option<Rank>) -> Result<usize> {
    let (global, group) = root.map_or((None, None), Rank::pair);
    w.root_or_global0(pg, global, group)
}

/// Arguments of [`World::gather_object`].
#[derive(Debug)]
pub struct GatherObject<'a, T> {
    obj: &'a T,
    dst: Option<Rank>,
}
object_op!(
    GatherObject,
    "gather_object",
    [Serialize + DeserializeOwned],
    Option<Vec<T>>,
    |a, w, kw| {
        let Some((pg, g)) = w.object_group(kw, "gather_object")? else {
            return Ok(None);
        };
        let root = root_or_global0(w, &pg, a.dst)?;
        let n = pg.size();
        let bytes = encode(a.obj)?;
        let sizes = w.all_gather_sizes(&g, kw.timeout, n, bytes.len())?;
        let max = sizes.iter().copied().max().unwrap_or(0);
        let input = padded(bytes, max);
        let is_root = pg.rank() == root;
        let outs: Vec<Tensor> = if is_root {
            (0..n).map(|_| Tensor::zeros(DType::U8, &[max])).collect()
        } else {
            Vec::new()
        };
        let gather = w.gather(&input).gather_list(&outs).dst(Rank::Group(root));
        gather.group(&g).within(kw.timeout).run()?;
        Ok(if is_root {
            Some(decode_each(w, &pg, &outs, &sizes)?)
        } else {
            None
        })
    }
);
keyword!([T] GatherObject<'a, T>, /// PyTorch's `dst=` ([`Rank::Global`], default 0) or `group_dst=` ([`Rank::Group`]).
    dst: impl Into<Rank> => |a, dst| a.dst = Some(dst.into()));

/// Arguments of [`World::broadcast_object_list`].
#[derive(Debug)]
pub struct BroadcastObjectList<'a, T> {
    object_list: &'a mut [T],
    src: Option<Rank>,
}
object_op!(
    BroadcastObjectList,
    "broadcast_object_list",
    [Serialize + DeserializeOwned],
    (),
    |a, w, kw| {
        let Some((pg, g)) = w.object_group(kw, "broadcast_object_list")? else {
            return Ok(());
        };
        let root_group = root_or_global0(w, &pg, a.src)?;
        let root = Rank::Group(root_group);
        let me = root_group == pg.rank();
        let encoded: Vec<Vec<u8>> = if me {
            a.object_list.iter().map(encode).collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let sizes = if me {
            Tensor::from_vec(encoded.iter().map(|b| b.len() as i64).collect::<Vec<_>>())
        } else {
            Tensor::zeros(DType::I64, &[a.object_list.len()])
        };
        w.broadcast(&sizes, root)
            .group(&g)
            .within(kw.timeout)
            .run()?;
        let sizes = peer_sizes(sizes.to_vec::<i64>()?)?;
        let total: usize = sizes.iter().sum();
        let payload = if me {
            Tensor::from_vec(encoded.concat())
        } else {
            Tensor::zeros(DType::U8, &[total])
        };
        w.broadcast(&payload, root)
            .group(&g)
            .within(kw.timeout)
            .run()?;
        if !me {
            let from = Peer::of(w, &pg, root_group)?;
            decode_concat(&payload, &sizes, a.object_list, from)?;
        }
        Ok(())
    }
);
keyword!([T] BroadcastObjectList<'a, T>, /// PyTorch's `src=` ([`Rank::Global`], default 0) or `group_src=` ([`Rank::Group`]).
    src: impl Into<Rank> => |a, src| a.src = Some(src.into()));

/// Arguments of [`World::scatter_object_list`].
#[derive(Debug)]
pub struct ScatterObjectList<'a, T> {
    input: &'a [T],
    src: Option<Rank>,
}
object_op!(
    ScatterObjectList,
    "scatter_object_list",
    [Serialize + DeserializeOwned],
    Option<T>,
    |a, w, kw| {
        let Some((pg, g)) = w.object_group(kw, "scatter_object_list")? else {
            return Ok(None);
        };
        let root = root_or_global0(w, &pg, a.src)?;
        let me = pg.rank() == root;
        if me && a.input.is_empty() {
            return Err(DistError::invalid(
                "Argument ``scatter_list`` must be specified on source rank.",
            ));
        }
        let input = if me { a.input } else { &[] }; // ignored off the source, as in PyTorch
        let encoded: Vec<Vec<u8>> = input.iter().map(encode).collect::<Result<_>>()?;
        let lens: Vec<i64> = encoded.iter().map(|b| b.len() as i64).collect();
        let (src, t) = (Rank::Group(root), kw.timeout);
        let max = Tensor::from_vec(vec![lens.iter().copied().max().unwrap_or(0)]);
        w.broadcast(&max, src).group(&g).within(t).run()?;
        let max = peer_sizes(max.to_vec::<i64>()?)?[0];
        let out = Tensor::zeros(DType::U8, &[max]);
        let ins: Vec<Tensor> = encoded.into_iter().map(|b| padded(b, max)).collect();
        w.scatter(&out)
            .scatter_list(&ins)
            .src(src)
            .group(&g)
            .within(t)
            .run()?;
        let size_out = Tensor::zeros(DType::I64, &[1]);
        let size_ins: Vec<Tensor> = lens
            .into_iter()
            .map(|l| Tensor::from_vec(vec![l]))
            .collect();
        let scatter = w.scatter(&size_out).scatter_list(&size_ins).src(src);
        scatter.group(&g).within(t).run()?;
        let s = peer_sizes(size_out.to_vec::<i64>()?)?[0];
        let from = Peer::of(w, &pg, root)?;
        Ok(Some(out.read(|b: &[u8]| {
            decode_from(&b[..s.min(b.len())], from)
        })??))
    }
);
keyword!([T] ScatterObjectList<'a, T>, /// PyTorch's `scatter_object_input_list=`: one object per group rank, on the source only.
    scatter_object_input_list: &'a [T] => |a, list| a.input = list);
keyword!([T] ScatterObjectList<'a, T>, /// PyTorch's `src=` ([`Rank::Global`], default 0) or `group_src=` ([`Rank::Group`]).
    src: impl Into<Rank> => |a, src| a.src = Some(src.into()));

/// Arguments of [`World::send_object_list`].
#[derive(Debug)]
pub struct SendObjectList<'a, T> {
    object_list: &'a [T],
    dst: Rank,
}
object_op!(
    SendObjectList,
    "send_object_list",
    [Serialize],
    (),
    |a, w, kw| {
        let Some((_, g)) = w.object_group(kw, "send_object_list")? else {
            return Ok(());
        };
        let encoded: Vec<Vec<u8>> = a.object_list.iter().map(encode).collect::<Result<_>>()?;
        let sizes = Tensor::from_vec(encoded.iter().map(|b| b.len() as i64).collect::<Vec<_>>());
        w.send(&sizes, a.dst).group(&g).within(kw.timeout).run()?;
        let payload = Tensor::from_vec(encoded.concat());
        w.send(&payload, a.dst).group(&g).within(kw.timeout).run()
    }
);

/// Arguments of [`World::recv_object_list`].
#[derive(Debug)]
pub struct RecvObjectList<'a, T> {
    object_list: &'a mut [T],
    src: Option<Rank>,
}
object_op!(
    RecvObjectList,
    "recv_object_list",
    [DeserializeOwned],
    i64,
    |a, w, kw| {
        let Some((pg, g)) = w.object_group(kw, "recv_object_list")? else {
            return Ok(-1);
        };
        let sizes = Tensor::zeros(DType::I64, &[a.object_list.len()]);
        let mut recv = w.recv(&sizes).group(&g).within(kw.timeout);
        if let Some(src) = a.src {
            recv = recv.src(src);
        }
        let sender = recv.run()?;
        let sizes = peer_sizes(sizes.to_vec::<i64>()?)?;
        let payload = Tensor::zeros(DType::U8, &[sizes.iter().sum()]);
        let from = Rank::Group(w.get_group_rank(&pg, sender as usize)?);
        w.recv(&payload)
            .src(from)
            .group(&g)
            .within(kw.timeout)
            .run()?;
        let from = Peer {
            group: w.get_group_rank(&pg, sender as usize)?,
            global: sender as usize,
        };
        decode_concat(&payload, &sizes, a.object_list, from)?;
        Ok(sender)
    }
);
keyword!([T] RecvObjectList<'a, T>, /// PyTorch's `src=` ([`Rank::Global`]) or `group_src=` ([`Rank::Group`]); default: any source.
    src: impl Into<Rank> => |a, src| a.src = Some(src.into()));

#[cfg(test)]
mod tests {
    use super::{name_the_op, peer_sizes};
    use c10d_core::DistError;

    #[test]
    fn helper_errors_name_the_op_and_others_are_left_alone() {
        let e = name_the_op(peer_sizes(vec![-1]).unwrap_err(), "gather_object").to_string();
        assert!(
            e.contains("gather_object: a peer announced an object of -1 bytes"),
            "{e}"
        );
        let other = name_the_op(DistError::invalid("object collective"), "gather_object");
        assert_eq!(other.message(), "object collective");
    }

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

#[cfg(test)]
mod hostile {
    use super::{decode_limited, Peer, PickleLimits};
    use crate::pickle_scan::tests::{deep, huge_length, memo_bomb};

    #[test]
    fn refusals_name_the_sender_and_the_bound() {
        let from = Some(Peer {
            group: 1,
            global: 3,
        });
        let l = PickleLimits::default();
        let e = decode_limited::<serde_pickle::Value>(&memo_bomb(9, 10), &l, from).unwrap_err();
        let e = super::name_the_op(e, "recv_object_list").to_string();
        assert!(
            e.contains("recv_object_list: refused the object from rank 1 (global rank 3)")
                && e.contains("pickle expands past the 64 MiB bound"),
            "{e}"
        );
        let e = decode_limited::<serde_pickle::Value>(&deep(5000), &l, from).unwrap_err();
        assert!(
            e.to_string()
                .contains("deeper than the bound of 500 levels"),
            "{e}"
        );
        let e = decode_limited::<String>(&huge_length(), &l, from).unwrap_err();
        assert!(
            e.to_string()
                .contains("declares a length of 4294967295 bytes"),
            "{e}"
        );
        let e = decode_limited::<String>(b"\x80\x02K\x01.", &l, from).unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot read the object from rank 1 (global rank 3)"),
            "{e}"
        );
    }
}
