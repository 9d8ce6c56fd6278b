//! Init-method rendezvous (`env://`, `tcp://`, `file://`), delegated to
//! `c10d_store::rendezvous`.

pub(crate) use c10d_store::rendezvous::rendezvous_with_env;
