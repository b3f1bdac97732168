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

/// An HTTP/1.0 request without `Connection: keep-alive`: its connection closes after the
/// answer (RFC 9112 §9.3).
pub fn http10_close(session: &ServerSession) -> bool {
    let h = session.req_header();
    h.version == http::Version::HTTP_10
        && !h.headers.get_all(http::header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("keep-alive"))
            })
        })
}

/// Whether an HTTP/1.1 request head has a line that ends in a bare LF. `httparse` accepts one
/// as a line end, but a proxy in front of the gateway may not, and would then read
/// `X-Foo: a\nAuthorization: …` as one header where the gateway reads two: a request
/// smuggling risk, refused here before anything reads the head.
pub fn has_bare_lf(session: &ServerSession) -> bool {
    let Some(h1) = session.as_http1() else {
        return false;
    };
    let raw = h1.get_headers_raw_bytes();
    memchr::memchr_iter(b'\n', &raw).any(|i| i == 0 || raw[i - 1] != b'\r')
}

/// Whether a head that failed to parse failed because its request target is longer than a
/// URI may be (`http::Uri` takes at most 65,534 bytes): a request line that long is over
/// `server.max_header_bytes` too, and gets its `431` rather than a bare `400`.
///
/// Pingora reports it as `InvalidHTTPHeader` with the context `invalid uri {target}` and no
/// typed cause, and every other head error it raises is cut to a few hundred bytes: an error
/// that carries more than a URI's worth of text is this one. The unit test below pins that
/// behaviour, so a pingora upgrade that changes it fails there, not in service.
pub fn target_too_long(e: &pingora::Error) -> bool {
    const MAX_URI: usize = u16::MAX as usize - 1;
    matches!(e.etype(), pingora::ErrorType::InvalidHTTPHeader)
        && e.context
            .as_ref()
            .is_some_and(|c| c.as_str().len() > MAX_URI)
}

/// Pingora's reason for refusing an absolute-form request target whose authority is not the
/// `Host` header (pinned with the pingora version: the framing tests fail if it changes).
const HOST_DIFFERS: &str = "Host header differs from request-target authority";

/// Serves an absolute-form request (`POST http://host/v1/chat/completions`) whose `Host`
/// names another authority, which pingora refuses. That refusal guards a proxy that routes by
/// one while a backend routes by the other; Quipu is the origin of its routes and routes by the
/// path alone, and RFC 9112 §3.2.2 says an origin server MUST then ignore `Host` and use the
/// target's authority. Pingora read the head whole before its check, so the request goes on
/// with `Host` set to the target's authority, once the rest of pingora's checks of the head
/// (`Content-Length`, `Transfer-Encoding`) pass. The target itself never leaves the gateway:
/// only its path is routed. True if the request can be served.
pub fn adopt_target_authority(session: &mut ServerSession, e: &pingora::Error) -> bool {
    let host_differs = matches!(e.etype(), pingora::ErrorType::InvalidHTTPHeader)
        && e.context
            .as_ref()
            .is_some_and(|c| c.as_str() == HOST_DIFFERS);
    if !host_differs || session.as_http1().is_none() {
        return false;
    }
    let target = http::Uri::try_from(session.req_header().raw_path());
    let Some(authority) = target.ok().and_then(|t| t.authority().cloned()) else {
        return false;
    };
    let Ok(host) = http::HeaderValue::from_str(authority.as_str()) else {
        return false;
    };
    if session
        .req_header_mut()
        .insert_header(http::header::HOST, host)
        .is_err()
    {
        return false;
    }
    session
        .as_http1()
        .is_some_and(|h1| h1.validate_request().is_ok())
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
        // Pingora bounds each read on HTTP/1.1 (`set_read_timeout`) but not on HTTP/2.
        let read = tokio::time::timeout(server.client_read_timeout, session.read_request_body())
            .await
            .unwrap_or_else(|_| {
                Err(pingora::Error::explain(
                    pingora::ErrorType::ReadTimedout,
                    "the request body stopped arriving",
                ))
            });
        match read {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_target_too_long_for_a_uri_is_told_apart() {
        let long = [b"/v1/models?x=".as_slice(), &[b'a'; 70_000]].concat();
        let e = pingora::http::RequestHeader::build("GET", &long, None).unwrap_err();
        assert!(target_too_long(&e), "a target over 65,534 bytes");
        let e = pingora::http::RequestHeader::build("GET", b"/a b\x01", None);
        if let Err(e) = e {
            assert!(!target_too_long(&e), "{e}");
        }
    }
}
