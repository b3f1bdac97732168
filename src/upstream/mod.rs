//! The upstream side: replica pools and selection ([`pool`]) and the HTTP exchange with one
//! replica ([`client`], with its response framing in [`crate::h1`]).

pub mod client;
pub mod pool;

pub use pool::{block_hashes, ModelPool, ReplicaGuard};
