//! The transport layer: client connections in, upstream exchanges out.
//!
//! - [`server`]: the client side — the connection loop behind the listeners (connection cap,
//!   TLS handshake, protocol choice, request-head deadline, HTTP/1.1 keep-alive and pipelining,
//!   drain) that hands each request to a [`ServeRequest`];
//! - [`tls`]: the listeners' certificates (rustls through pingora), reloadable;
//! - [`h2`]: HTTP/2 connections from clients (over TLS, or h2c), with their abuse limits;
//! - [`client`]: one HTTP/1.1 exchange with an upstream replica, plain or TLS, on pingora's
//!   connector and connection pool (Quipu's own response framing, [`crate::h1`]), with a typed
//!   [`client::UpstreamError`];
//! - [`upstream_tls`]: the CA bundles and client certificates of `https://` replicas.
//!
//! The proxy sees only this contract: a pingora `ServerSession` per request (the same for
//! HTTP/1.1 and HTTP/2), [`ServeRequest`] / [`Served`], and [`client::send`] /
//! [`client::UpstreamResponse`] for the upstream. Everything about sockets lives here.

pub mod client;
pub mod h2;
pub mod server;
pub mod tls;
pub mod upstream_tls;

pub use server::{ConnLimits, Frontend, Lifecycle, ServeRequest, Served};

use std::time::Duration;
use tokio::time::Instant;

/// `base + d`, or a time far beyond any deadline when that overflows (a configured timeout of
/// `u64::MAX` ms means "never", not a panic).
pub fn deadline(base: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 86_400);
    base.checked_add(d)
        .or_else(|| base.checked_add(FAR))
        .unwrap_or(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_never_overflows() {
        let now = Instant::now();
        assert_eq!(
            deadline(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert!(deadline(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
    }
}
