//! The simulated NCCL: the rank side (`comm`, `link`, `group`, `ops`, `faults`, `transport`), the hub that
//! joins ranks of different processes (`hub`, `compute`, over `wire`), and the exported
//! `nccl*` functions (`api`).

pub mod api;
pub mod codes;
pub mod comm;
pub mod compute;
pub mod faults;
pub mod group;
pub mod hub;
pub mod link;
pub mod ops;
pub mod transport;
pub mod wire;
