//! The upstream side: replica pools and selection ([`pool`]), the queue of a pool whose
//! replicas have finite slots ([`dispatch`]), their health checks ([`health`]), and their host
//! names kept resolved while the gateway runs ([`resolve`]). The
//! HTTP exchange with one replica is the transport layer's ([`crate::http::client`]).

pub mod dispatch;
pub mod health;
pub mod load;
pub mod pool;
pub mod resolve;

pub use pool::{block_hashes, ModelPool, ReplicaGuard};
