//! The upstream side: replica pools and selection ([`pool`]), their health checks
//! ([`health`]), and their host names kept resolved while the gateway runs ([`resolve`]). The
//! HTTP exchange with one replica is the transport layer's ([`crate::http::client`]).

pub mod health;
pub mod pool;
pub mod resolve;

pub use pool::{block_hashes, ModelPool, ReplicaGuard};
