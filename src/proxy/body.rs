//! The request's head and body as the API routes read them: the head-size limit, the JSON
//! content type, the body (bounded), and draining a body that is refused unread.

use super::Failure;
use crate::config::Server;
use crate::error::{ApiError, ErrorKind};
use pingora::protocols::http::ServerSession;
use std::time::Duration;

/// A refused request's body is read and discarded (so the connection can be reused) up to this
/// many times the body limit, within [`DRAIN_TIMEOUT`]; a longer or slower one — declared or
/// chunked — closes the connection instead, so no client can keep the gateway reading.
const DRAIN_FACTOR: usize = 4;
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The `431` for a request head over `server.max_header_bytes`, measured on the head exactly as
/// it arrived (pingora keeps it), not re-estimated from parsed parts.
pub fn head_too_large(session: &ServerSession, server: &Server) -> Option<ApiError> {
    let head = session
        .as_http1()
        .map_or(0, |h1| h1.get_headers_raw_bytes().len());
    let max = server.max_header_bytes;
    (head > max).then(|| {
        ApiError::new(
            ErrorKind::HeadersTooLarge,
            format!("the request head is {head} bytes, over the {max}-byte limit"),
        )
    })
}

/// Reads and discards the rest of a refused request's body: true if it ended within the drain
/// bound ([`DRAIN_FACTOR`] × the body limit, [`DRAIN_TIMEOUT`]), so the connection can be
/// reused. A body declared longer, or one behind `Expect: 100-continue` (never sent unless
/// asked), is not read at all. Counts bytes itself, since a chunked body declares no length.
pub async fn drain(session: &mut ServerSession, server: &Server) -> bool {
    let cap = server.max_body_bytes.saturating_mul(DRAIN_FACTOR);
    if content_length(session).is_some_and(|n| n > cap) || expects_continue(session) {
        return false;
    }
    let drain = async {
        let mut seen = 0usize;
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) => {
                    seen = seen.saturating_add(chunk.len());
                    if seen > cap {
                        return false;
                    }
                }
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    };
    tokio::time::timeout(DRAIN_TIMEOUT, drain)
        .await
        .unwrap_or(false)
}

fn content_length(session: &ServerSession) -> Option<usize> {
    session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

fn expects_continue(session: &ServerSession) -> bool {
    session
        .req_header()
        .headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// A JSON content type, or none (many clients omit it; the body is still checked to be JSON).
pub fn is_json(session: &ServerSession) -> bool {
    match session.req_header().headers.get(http::header::CONTENT_TYPE) {
        None => true,
        Some(v) => v
            .to_str()
            .map(|s| {
                let mime = s.split(';').next().unwrap_or("").trim();
                mime.eq_ignore_ascii_case("application/json")
                    || mime.to_ascii_lowercase().ends_with("+json")
            })
            .unwrap_or(false),
    }
}

/// Reads the request body, up to `server.max_body_bytes`.
pub async fn read(session: &mut ServerSession, server: &Server) -> Result<Vec<u8>, Failure> {
    let max = server.max_body_bytes;
    let too_large = || {
        Failure::refused_unread(ApiError::new(
            ErrorKind::RequestTooLarge,
            format!("the request body is larger than the {max}-byte limit"),
        ))
    };
    let declared = content_length(session);
    if declared.is_some_and(|n| n > max) {
        return Err(too_large());
    }
    if expects_continue(session) && session.write_continue_response().await.is_err() {
        return Err(Failure::client_gone());
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(16 * 1024).min(max));
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > max {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) => {
                // The client stopped sending (timeout) or went away: nothing sensible to answer
                // on a broken connection, but try.
                session.set_keepalive(None);
                return Err(Failure {
                    body_unread: false,
                    ..Failure::new(
                        super::Outcome::ClientDisconnected,
                        ApiError::invalid_body(format!("could not read the request body: {e}")),
                    )
                });
            }
        }
    }
}
