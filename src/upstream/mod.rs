//! The upstream side: replica pools and selection ([`pool`]), the HTTP exchange with one
//! replica ([`client`], with its response framing in [`crate::h1`]), and the replicas' host
//! names resolved at start ([`resolve`]).

pub mod client;
pub mod pool;
pub mod resolve;

pub use pool::{block_hashes, ModelPool, ReplicaGuard};
