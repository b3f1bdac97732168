//! The transport layer: client connections in, upstream exchanges out.
//!
//! - [`server`]: the client side — the connection loop behind the listeners (connection cap,
//!   request-head deadline, keep-alive, drain) that hands each request to a [`ServeRequest`].
//! - [`client`]: one HTTP/1.1 exchange with an upstream replica, on pingora's connector and
//!   connection pool (Quipu's own response framing, [`crate::h1`]).
//!
//! The proxy sees only this contract: a `ServerSession` per request, and [`client::send`] /
//! [`client::UpstreamResponse`] for the upstream. Everything about sockets lives here.

pub mod client;
pub mod server;

pub use server::{ConnLimits, Frontend, Lifecycle, ServeRequest};

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
