//! The contract of a client format: one folder under `translate/` (`chat/`, `messages/`,
//! `responses/`) implements [`Format`] on a unit type of its own, and imports only from
//! [`super::common`], [`super::stream_core`] and the other shared modules of `translate/`,
//! never from another format's folder.
//!
//! What a format writes is its own: its request translation, its non-streaming answer, its
//! stream frames (a [`StreamFormat`] run by the stream core) and the facts in [`Wire`]. What
//! formats do alike is not: the stream lifecycle (metering, the held finish, end and error,
//! pings) is the stream core's; an error's rendering and status in each format
//! ([`ApiError::body`], [`ApiError::write_sse`], [`crate::error::ErrorKind::status`], the
//! context-overflow wording of [`super::upstream_error`]) are exhaustive matches on
//! [`ClientFormat`] in those modules, which sit below `translate/`.
//!
//! A new format is a new [`ClientFormat`] variant and a folder that implements [`Format`];
//! the compiler then lists every place that must decide what it does (each `match` on the
//! variant: [`super::wire`], the error shapes, the proxy's dispatch, the conformance list and
//! the fuzz targets' table), and the tests that fail until it has its recorded-stream
//! fixtures and its fuzz targets (`tests/conformance.rs`).
//!
//! [`ApiError::body`]: crate::error::ApiError::body
//! [`ApiError::write_sse`]: crate::error::ApiError::write_sse

use crate::config::Config;
use crate::error::{ApiError, ClientFormat};
use crate::translate::stream_core::{Stream, StreamFormat};
use crate::translate::UpstreamRequest;
use crate::usage::Usage;

/// What the gateway reads of a format outside translation: how its clients authenticate, and
/// the headers it checks before reading the body.
#[derive(Debug)]
pub struct Wire {
    /// Its SDKs may send the key as `x-api-key` (besides `Authorization: Bearer`); a request
    /// without a key is told both ways.
    pub x_api_key: bool,
    /// Version headers that, when sent, must be one date like `2023-06-01`.
    pub version_headers: &'static [&'static str],
    /// What keeps a stream alive before its first event (a request waiting in a saturated
    /// model's queue): a frame every client of the format skips.
    pub keepalive: &'static [u8],
}

/// An SSE comment: every conforming SSE reader skips it.
pub const SSE_COMMENT_KEEPALIVE: &[u8] = b": waiting for a slot\n\n";

/// One client format (see the module docs).
pub trait Format {
    /// Its variant: how requests, errors and metrics name it.
    const FORMAT: ClientFormat;
    /// Its authentication and header facts.
    const WIRE: Wire;

    /// A translated create request: the [`UpstreamRequest`], and whatever else the format's
    /// answer needs from the request.
    type Request: AsRef<UpstreamRequest>;
    /// What its response translators are given: the request's names ([`ResponseContext`])
    /// and what the request left for the answer.
    ///
    /// [`ResponseContext`]: crate::translate::ResponseContext
    type Context;
    /// What it writes of a stream, run by the stream core.
    type Writer: StreamFormat;

    /// A create request's body → the upstream request. `request_id` is the gateway's id of
    /// the request, the base of ids the format mints. (A Responses API request that continues
    /// a stored conversation is translated in two steps around the store read:
    /// [`super::responses::parse_request`], [`super::responses::responses_to_upstream`].)
    fn to_upstream(
        body: &[u8],
        config: &Config,
        request_id: &str,
    ) -> Result<Self::Request, ApiError>;

    /// A non-streaming upstream completion → the client's body and the usage to bill.
    fn respond(upstream_body: &[u8], ctx: &Self::Context) -> Result<(Vec<u8>, Usage), ApiError>;

    /// The translator of a streamed answer.
    fn stream(ctx: Self::Context) -> Stream<Self::Writer>;
}

impl AsRef<UpstreamRequest> for UpstreamRequest {
    fn as_ref(&self) -> &UpstreamRequest {
        self
    }
}
