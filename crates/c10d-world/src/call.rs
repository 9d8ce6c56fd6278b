//! The call style of every collective: what PyTorch requires is a positional argument, what
//! PyTorch takes as a keyword argument is a builder method of [`Collective`] that may be left
//! out, and the call ends in [`Collective::run`] (blocking, PyTorch's `async_op=False`) or
//! [`Collective::start`] (PyTorch's `async_op=True`, returns a [`Work`]).
//!
//! ```no_run
//! # use c10d_world as dist;
//! # use dist::{ReduceOp, Rank, Tensor};
//! # fn main() -> c10d_core::Result<()> {
//! # let t = Tensor::from_vec(vec![1.0f32; 4]);
//! # let sub = dist::new_group(Some(&[0, 1]), Default::default())?;
//! dist::all_reduce(&t).op(ReduceOp::Avg).group(&sub).run()?; // blocking
//! let work = dist::all_reduce(&t).start()?; // asynchronous
//! work.wait()?;
//! dist::broadcast(&t, 1).group(&sub).run()?; // src = global rank 1
//! dist::broadcast(&t, Rank::Group(1)).group(&sub).run()?; // group_src = 1
//! # Ok(()) }
//! ```
//!
//! The same builder is returned by the [`World`] methods and by the free functions (bound to
//! [`World::global`]).

use crate::world::{GroupMember, World};
use c10d_core::{DistError, OpType, Result, Work};
use std::time::Duration;

/// A rank given to a collective: a global rank (PyTorch's `src` / `dst` / `peer`) or a rank
/// within the op's group (PyTorch's `group_src` / `group_dst` / `group_peer`). A plain `usize`
/// converts into [`Rank::Global`], so `broadcast(&t, 1)` means `src=1`.
///
/// PyTorch takes the two forms as two optional arguments and fails at run time when both or
/// neither are given; one enum makes both impossible. [`Rank::from_pair`] converts PyTorch's pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rank {
    /// A rank in the default group (WORLD).
    Global(usize),
    /// A rank within the op's group.
    Group(usize),
}

impl From<usize> for Rank {
    fn from(global: usize) -> Rank {
        Rank::Global(global)
    }
}

impl Rank {
    /// PyTorch's optional pair (`src`, `group_src`) as one rank.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Can't specify both group_rank and global_rank" when both
    /// are given, "Must specify global_rank or group_rank" when neither is.
    pub fn from_pair(global: Option<usize>, group: Option<usize>) -> Result<Rank> {
        Rank::optional_pair(global, group)?
            .ok_or_else(|| DistError::invalid("Must specify global_rank or group_rank"))
    }

    /// [`Rank::from_pair`] where neither is allowed (`recv`'s any source): `Ok(None)` then.
    ///
    /// # Errors
    /// "Can't specify both group_rank and global_rank" when both are given.
    pub fn optional_pair(global: Option<usize>, group: Option<usize>) -> Result<Option<Rank>> {
        match (global, group) {
            (Some(_), Some(_)) => Err(DistError::invalid(
                "Can't specify both group_rank and global_rank",
            )),
            (Some(r), None) => Ok(Some(Rank::Global(r))),
            (None, Some(g)) => Ok(Some(Rank::Group(g))),
            (None, None) => Ok(None),
        }
    }

    /// The (global, group) pair PyTorch's internals take.
    pub(crate) fn pair(self) -> (Option<usize>, Option<usize>) {
        match self {
            Rank::Global(r) => (Some(r), None),
            Rank::Group(g) => (None, Some(g)),
        }
    }
}

/// The keyword arguments every collective takes, as one op sees them when it launches.
#[derive(Debug, Clone, Copy)]
pub struct Keywords<'a> {
    /// PyTorch's `group` (`None` = WORLD).
    pub(crate) group: Option<&'a GroupMember>,
    /// The op's timeout (`None` = the group backend's).
    pub(crate) timeout: Option<Duration>,
    /// PyTorch's `async_op`.
    pub(crate) async_op: bool,
}

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// The per-op part of a collective call (its positional arguments and op-specific keywords).
/// Implemented by this crate's argument types only (`AllReduce`, `Broadcast`, ...).
pub trait Call: sealed::Sealed {
    /// What [`Collective::run`] returns: `()`, or the sender's global rank for `recv`.
    type Output;
    /// Runs the op to completion (`async_op=False`).
    #[doc(hidden)]
    fn run(self, world: &World, kw: &Keywords<'_>) -> Result<Self::Output>;
}

/// Ops that can run asynchronously ([`Collective::start`]): those PyTorch runs with
/// `async_op=True` (all but `monitored_barrier`), on [`c10d_core::Tensor`]s or
/// [`c10d_core::TensorView`]s — not on plain slices, which are borrowed only for the call.
pub trait AsyncCall: Call {
    /// The op name in PyTorch's texts.
    #[doc(hidden)]
    const NAME: &'static str;
    /// The op type of the completed [`Work`] a non-member gets from [`Collective::start`].
    #[doc(hidden)]
    const OP_TYPE: OpType;
    /// Launches the op; `None` when this rank is not a member of the group or a
    /// coalescing block recorded the op.
    #[doc(hidden)]
    fn launch(&self, world: &World, kw: &Keywords<'_>) -> Result<Option<Work>>;
}

/// One collective call being put together: the [`World`], the keywords every op shares
/// (`group`, `timeout`) and the op's own arguments `A`. Ends in [`Collective::run`] or
/// [`Collective::start`]; dropping it unused does nothing (hence `#[must_use]`).
#[must_use = "a collective does nothing until `.run()` or `.start()` is called"]
#[derive(Debug)]
pub struct Collective<'a, A> {
    world: &'a World,
    group: Option<&'a GroupMember>,
    timeout: Option<Duration>,
    pub(crate) args: A,
}

impl<'a, A: Call> Collective<'a, A> {
    /// A call of `args` on `world` with every keyword at its default.
    pub(crate) fn new(world: &'a World, args: A) -> Self {
        Collective {
            world,
            group: None,
            timeout: None,
            args,
        }
    }

    /// PyTorch's `group=`: the group to run on (default WORLD). Takes `&GroupMember` or an
    /// `Option<&GroupMember>` (`None` = WORLD). On a [`GroupMember::NonGroupMember`] the op
    /// logs PyTorch's warning and does nothing (see [`Collective::run`]).
    pub fn group(mut self, group: impl Into<Option<&'a GroupMember>>) -> Self {
        self.group = group.into();
        self
    }

    /// The op's timeout (PyTorch's C++ options field; the Python functions have no such
    /// argument except `monitored_barrier`). Default: the group backend's timeout. For
    /// `send`/`recv` it bounds the blocking wait; an `isend`/`irecv` [`Work`] is waited by the
    /// caller.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// [`Collective::timeout`] when `timeout` is given (ops made of other ops pass theirs on).
    pub(crate) fn within(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout.or(self.timeout);
        self
    }

    fn keywords(&self, async_op: bool) -> Keywords<'a> {
        Keywords {
            group: self.group,
            timeout: self.timeout,
            async_op,
        }
    }

    /// Runs the op and waits for it (PyTorch's `async_op=False`). On a non-member of the
    /// group it returns at once (after PyTorch's warning); `recv` then returns −1.
    ///
    /// # Errors
    /// The op's argument errors (with PyTorch's texts, listed on the op's constructor) and
    /// its failure (timeout, dead peer, mismatch ...).
    pub fn run(self) -> Result<A::Output> {
        let kw = self.keywords(false);
        self.args.run(self.world, &kw)
    }
}

impl<'a, A: AsyncCall> Collective<'a, A> {
    /// Launches the op and returns its [`Work`] (PyTorch's `async_op=True`).
    ///
    /// Where PyTorch returns `None`, this returns a [`Work`] that is already complete: on a
    /// non-member of the group, a successful one (there is nothing to wait for); inside a
    /// [`World::coalescing_manager`] block that records the op, one whose `wait` fails as
    /// PyTorch's `_IllegalWork` does — wait on the block's
    /// [`crate::CoalescingManager`] instead.
    ///
    /// # Errors
    /// The op's argument errors; a launch failure of the backend.
    pub fn start(self) -> Result<Work> {
        let kw = self.keywords(true);
        if let Some(w) = self.args.launch(self.world, &kw)? {
            return Ok(w);
        }
        let result = match kw.group {
            Some(GroupMember::NonGroupMember) => Ok(()),
            _ => Err(DistError::invalid(format!(
                "Illegal to call wait in IllegalWork class: {} was recorded by a coalescing_manager block; wait on the block's CoalescingManager",
                A::NAME
            ))),
        };
        Ok(Work::completed(A::OP_TYPE, 0, result, Vec::new()))
    }
}

/// Implements [`Call`] and [`AsyncCall`] for an argument type whose blocking form returns `()`:
/// `unit_op!([generics] Type, "name", OpType::X, |args, world, kw| launch-expression);`.
macro_rules! unit_op {
    ([$($g:tt)*] $ty:ty, $name:literal, $op_type:expr, |$a:ident, $w:ident, $kw:ident| $launch:expr) => {
        impl<$($g)*> $crate::call::Sealed for $ty {}
        impl<$($g)*> $crate::call::Call for $ty {
            type Output = ();
            fn run(self, world: &World, kw: &$crate::call::Keywords<'_>) -> Result<()> {
                $crate::call::AsyncCall::launch(&self, world, kw).map(drop)
            }
        }
        impl<$($g)*> $crate::call::AsyncCall for $ty {
            const NAME: &'static str = $name;
            const OP_TYPE: c10d_core::OpType = $op_type;
            fn launch(
                &self,
                $w: &World,
                $kw: &$crate::call::Keywords<'_>,
            ) -> Result<Option<Work>> {
                let $a = self;
                $launch
            }
        }
    };
}
pub(crate) use unit_op;

/// Adds an optional keyword argument to one op's [`Collective`]:
/// `keyword!([generics] Type, /// doc \n name: ty => |args, value| assignment);`.
macro_rules! keyword {
    ([$($g:tt)*] $ty:ty, $(#[$doc:meta])* $name:ident: $arg:ty => |$a:ident, $v:ident| $set:expr) => {
        impl<'a, $($g)*> $crate::call::Collective<'a, $ty> {
            $(#[$doc])*
            pub fn $name(mut self, $v: $arg) -> Self {
                let $a = &mut self.args;
                $set;
                self
            }
        }
    };
}
pub(crate) use keyword;
