//! The upstream side: replica pools, health and selection ([`pool`]). The HTTP exchange with
//! one replica is the transport layer's ([`crate::http::client`]).

pub mod pool;

pub use pool::{block_hashes, ModelPool, ReplicaGuard};
