//! Writing responses the gateway answers itself: JSON bodies, errors, stream headers.
//!
//! Every response carries the request id as `x-request-id` (what the OpenAI SDK reads) and
//! `request-id` (what the Anthropic SDK reads). Responses written here bypass pingora's
//! response filters, so these headers are added here and nowhere else.

use crate::error::{ApiError, ClientFormat, ErrorKind};
use bytes::Bytes;
use http::HeaderValue;
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::OrErr;

fn base_header(status: u16, request_id: &str, more: usize) -> pingora::Result<ResponseHeader> {
    // No case map: header names go out lowercase, which HTTP/1.1 allows and saves a second
    // header map per response.
    let mut h = ResponseHeader::build_no_case(status, Some(2 + more))?;
    let id = HeaderValue::from_str(request_id).or_err(
        pingora::ErrorType::InternalError,
        "request id is not a header value",
    )?;
    h.insert_header("x-request-id", id.clone())?;
    h.insert_header("request-id", id)?;
    Ok(h)
}

/// Writes a complete JSON response.
pub async fn json(
    session: &mut ServerSession,
    request_id: &str,
    status: u16,
    body: Bytes,
) -> pingora::Result<()> {
    let head_only = session.req_header().method == http::Method::HEAD;
    write_json(session, request_id, status, body, None, head_only).await
}

/// Writes an error in the client's format with its status, plus `retry-after` and
/// `x-should-retry` when its kind has them.
pub async fn error(
    session: &mut ServerSession,
    request_id: &str,
    format: ClientFormat,
    err: &ApiError,
) -> pingora::Result<()> {
    let head_only = session.req_header().method == http::Method::HEAD;
    let body = err.body(format, request_id);
    let status = err.status(format);
    write_json(
        session,
        request_id,
        status,
        body,
        Some(&err.kind),
        head_only,
    )
    .await
}

/// Like [`error`], for a request whose head could not be parsed (there is no request to ask
/// whether it was a `HEAD`).
pub async fn error_to_unparsed(
    session: &mut ServerSession,
    request_id: &str,
    format: ClientFormat,
    err: &ApiError,
) -> pingora::Result<()> {
    let body = err.body(format, request_id);
    let status = err.status(format);
    write_json(session, request_id, status, body, Some(&err.kind), false).await
}

async fn write_json(
    session: &mut ServerSession,
    request_id: &str,
    status: u16,
    body: Bytes,
    error: Option<&ErrorKind>,
    head_only: bool,
) -> pingora::Result<()> {
    let mut h = base_header(status, request_id, 4)?;
    h.insert_header("content-type", HeaderValue::from_static("application/json"))?;
    h.insert_header("content-length", HeaderValue::from(body.len()))?;
    if let Some(kind) = error {
        if let Some(s) = kind.retry_after() {
            h.insert_header("retry-after", HeaderValue::from(s))?;
        }
        if kind.forbids_retry() {
            h.insert_header("x-should-retry", HeaderValue::from_static("false"))?;
        }
    }
    session.write_response_header(Box::new(h)).await?;
    if !head_only {
        session.write_response_body(body, true).await?;
    }
    Ok(())
}

/// Ends a stream whose `200` is already out with `error` as the format's error event.
pub async fn stream_error(
    session: &mut ServerSession,
    request_id: &str,
    format: ClientFormat,
    error: &ApiError,
) -> pingora::Result<()> {
    let mut out = Vec::with_capacity(256);
    error.write_sse(format, request_id, &mut out);
    session.write_response_body(Bytes::from(out), false).await?;
    session.write_response_body(Bytes::new(), true).await
}

/// Commits a `200` event stream: chunked, not cached, not buffered by intermediaries.
pub async fn stream_header(session: &mut ServerSession, request_id: &str) -> pingora::Result<()> {
    let mut h = base_header(200, request_id, 4)?;
    h.insert_header(
        "content-type",
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    )?;
    h.insert_header("cache-control", HeaderValue::from_static("no-cache"))?;
    h.insert_header("x-accel-buffering", HeaderValue::from_static("no"))?;
    // Without an explicit chunked encoding pingora would fall back to close-delimited framing.
    h.insert_header("transfer-encoding", HeaderValue::from_static("chunked"))?;
    session.write_response_header(Box::new(h)).await
}

/// The account page's security headers: nothing but this origin's own files may load or be
/// fetched, no inline script or style, no framing, no referrer.
pub const PAGE_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'; object-src 'none'";

/// Writes a static file of the account page, with its type and [`PAGE_CSP`]; revalidated on
/// every load (`no-cache`), so a new binary's page is seen at once.
pub async fn asset(
    session: &mut ServerSession,
    request_id: &str,
    asset: &crate::web::Asset,
) -> pingora::Result<()> {
    let head_only = session.req_header().method == http::Method::HEAD;
    let mut h = base_header(200, request_id, 8)?;
    h.insert_header("content-type", HeaderValue::from_static(asset.content_type))?;
    h.insert_header("content-length", HeaderValue::from(asset.body.len()))?;
    h.insert_header("cache-control", HeaderValue::from_static("no-cache"))?;
    h.insert_header(
        "content-security-policy",
        HeaderValue::from_static(PAGE_CSP),
    )?;
    h.insert_header(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    )?;
    h.insert_header("x-frame-options", HeaderValue::from_static("DENY"))?;
    h.insert_header("referrer-policy", HeaderValue::from_static("no-referrer"))?;
    session.write_response_header(Box::new(h)).await?;
    if !head_only {
        session
            .write_response_body(Bytes::from_static(asset.body), true)
            .await?;
    }
    Ok(())
}
