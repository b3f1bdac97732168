//! Quipu's protocol core: everything about the wire formats and money that needs no I/O.
//!
//! - [`config`]: the validated configuration (`conf/quipu.toml`).
//! - [`account`]: the tenant's own view of its money: query strings, periods and pages of
//!   `/v1/account`, `/v1/usage`, `/v1/keys`, `/v1/requests`, `/v1/topups`.
//! - [`error`]: one client-visible error type, rendered in each client format.
//! - [`money`]: exact amounts in soles (pico-soles in an `i128`) and rates.
//! - [`billing`]: billing policy — what a request reserves, how it settles, price rules.
//! - [`governance`]: what a key or tenant may do — model lists, spend caps and their periods,
//!   expiry, self-service limits — and the webhooks that tell about it.
//! - [`usage`]: token usage and where each protocol's fields come from.
//! - [`sse`]: the incremental Server-Sent Events decoder and encoders.
//! - [`h1`]: HTTP/1.1 response framing for the upstream client (head, chunked bodies).
//! - [`protocol`]: serde wire types.
//! - [`route`]: the table of endpoints (method and path → route).
//! - [`translate`]: the pure translators between the client formats and the upstream.
//! - [`upstream_profile`]: what differs between vLLM, SGLang and llama.cpp, one module each.
//! - `testing` (tests and the `test-util` feature only): replaying upstream bytes through a
//!   stream translator.
//!
//! A separate crate so that fuzzing, benchmarking and testing the translators does not build
//! the proxy (pingora) at all.

// Also set here, not only in Cargo.toml: the crate's `[lints]` table relaxes `unsafe_code` to
// `deny` so that the allocation-counting bench can opt out; the library itself must not.
#![forbid(unsafe_code)]

pub mod account;
pub mod ascii;
pub mod billing;
pub mod config;
pub mod error;
pub mod governance;
pub mod h1;
pub mod money;
pub mod protocol;
pub mod route;
pub mod schedule;
pub mod sse;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod translate;
pub mod upstream_profile;
pub mod usage;
