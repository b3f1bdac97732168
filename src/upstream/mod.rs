//! The upstream side: replica pools, health and selection ([`pool`]), and the replicas' host
//! names resolved at start ([`resolve`]). The HTTP exchange with one replica is the transport
//! layer's ([`crate::http::client`]).

pub mod pool;
pub mod resolve;

pub use pool::{block_hashes, ModelPool, ReplicaGuard};
