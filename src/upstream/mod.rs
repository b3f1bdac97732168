//! The upstream side: replica pools and selection ([`pool`]) and the HTTP exchange with one
//! replica ([`client`]).

pub mod client;
pub mod pool;

pub use pool::{block_hashes, ModelPool, ReplicaGuard};
