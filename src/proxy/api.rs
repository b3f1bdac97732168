//! The request flow of every route: catalog answers, and for the API routes
//! auth → body → translate → rate limits → admission → upstream (see [`super::relay`]).
//!
//! Every early exit writes a well-formed error in the endpoint's shape and leaves `ctx` saying
//! what happened, for `finish`.

use super::relay;
use super::respond;
use super::route::Route;
use super::{Gateway, RequestCtx};
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::metrics::m;
use crate::money::Pen;
use crate::translate::{chat, messages, UpstreamRequest};
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use std::time::Duration;

/// A refused request's body is read and discarded (so the connection can be reused) up to this
/// many times the body limit, within [`DRAIN_TIMEOUT`]; a longer or slower one — declared or
/// chunked — closes the connection instead, so no client can keep the gateway reading.
const DRAIN_FACTOR: usize = 4;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn handle(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
) -> pingora::Result<()> {
    session.set_read_timeout(Some(gw.config.server.client_read_timeout));
    session.set_write_timeout(Some(gw.config.server.client_write_timeout));
    // Pingora drains an unread body before reusing a connection; bound that too.
    session.set_total_drain_timeout(Some(DRAIN_TIMEOUT));
    // HTTP/1.1 keeps idle connections forever by default; bound them (a client's
    // `Connection: close` still wins). A draining server closes each connection after its
    // request.
    if gw.life.draining() {
        session.set_keepalive(None);
    } else {
        session.set_keepalive(Some(gw.config.server.keepalive_timeout_s));
    }
    // The head exactly as it arrived (pingora keeps it), not a re-estimate from parsed parts.
    let head = session
        .as_http1()
        .map_or(0, |h1| h1.get_headers_raw_bytes().len());
    let max_head = gw.config.server.max_header_bytes;
    if head > max_head {
        let e = ApiError::new(
            ErrorKind::HeadersTooLarge,
            format!("the request head is {head} bytes, over the {max_head}-byte limit"),
        );
        return drain_then_error(gw, session, ctx, &e).await;
    }
    match ctx.route {
        Route::Models => respond::json(session, ctx, 200, gw.catalog.models.clone()).await,
        Route::Pricing => respond::json(session, ctx, 200, gw.catalog.pricing.clone()).await,
        Route::Plans => respond::json(session, ctx, 200, gw.catalog.plans.clone()).await,
        Route::Health => {
            respond::json(
                session,
                ctx,
                200,
                Bytes::from_static(b"{\"status\":\"ok\"}"),
            )
            .await
        }
        Route::Model => {
            let id = session
                .req_header()
                .uri
                .path()
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            match gw.catalog.model(&id) {
                Some(body) => respond::json(session, ctx, 200, body).await,
                None => {
                    let e = ApiError::new(
                        ErrorKind::ModelNotFound,
                        format!(
                            "model `{id}` does not exist; valid models are {}",
                            gw.config.slug_list()
                        ),
                    );
                    respond::error(session, ctx, ctx.format, &e).await
                }
            }
        }
        Route::NotFound | Route::Unrouted => {
            let path = session.req_header().uri.path().to_owned();
            let e = ApiError::new(
                ErrorKind::RouteNotFound,
                format!("no route for {} {path}", session.req_header().method),
            );
            drain_then_error(gw, session, ctx, &e).await
        }
        Route::MethodNotAllowed => {
            let e = ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!(
                    "{} is not allowed on {}",
                    session.req_header().method,
                    session.req_header().uri.path()
                ),
            );
            drain_then_error(gw, session, ctx, &e).await
        }
        Route::Chat | Route::Messages | Route::CountTokens => api(gw, session, ctx).await,
    }
}

/// Fails `ctx` with `err`, written in the request's format.
async fn fail(
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    err: &ApiError,
) -> pingora::Result<()> {
    if ctx.outcome == "ok" {
        ctx.outcome = "refused";
    }
    respond::error(session, ctx, ctx.format, err).await
}

/// Answers with an error without having read (all of) the body: drains the rest first,
/// bounded (see [`DRAIN_FACTOR`]), so the connection can be reused; closes it otherwise.
async fn drain_then_error(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    err: &ApiError,
) -> pingora::Result<()> {
    let cap = gw.config.server.max_body_bytes.saturating_mul(DRAIN_FACTOR);
    let skip_drain = content_length(session).is_some_and(|n| n > cap) || expects_continue(session);
    if skip_drain || !drain_body(session, cap).await {
        session.set_keepalive(None);
    }
    fail(session, ctx, err).await
}

/// Reads and discards the rest of the request body: true if it ended within `cap` bytes and
/// [`DRAIN_TIMEOUT`]. Counts bytes itself, since a chunked body declares no length.
async fn drain_body(session: &mut ServerSession, cap: usize) -> bool {
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

/// `YYYY-MM-DD`.
fn is_date(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

/// Checks the headers of the messages format.
fn check_version(session: &ServerSession) -> Result<(), ApiError> {
    for name in ["compat-version", "anthropic-version"] {
        let mut values = session.req_header().headers.get_all(name).iter();
        if let Some(v) = values.next() {
            let ok = v.to_str().is_ok_and(is_date) && values.next().is_none();
            if !ok {
                return Err(ApiError::invalid(
                    name,
                    format!("the {name} header must be one date like 2023-06-01"),
                ));
            }
        }
    }
    Ok(())
}

fn is_json_content_type(session: &ServerSession) -> bool {
    match session.req_header().headers.get(http::header::CONTENT_TYPE) {
        None => true, // many clients omit it; the body is still checked to be JSON
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

/// Reads the request body, up to the configured limit.
async fn read_body(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
) -> pingora::Result<Option<Vec<u8>>> {
    let max = gw.config.server.max_body_bytes;
    let too_large = || {
        ApiError::new(
            ErrorKind::RequestTooLarge,
            format!("the request body is larger than the {max}-byte limit"),
        )
    };
    let declared = content_length(session);
    if declared.is_some_and(|n| n > max) {
        drain_then_error(gw, session, ctx, &too_large()).await?;
        return Ok(None);
    }
    if expects_continue(session) {
        session.write_continue_response().await?;
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(16 * 1024).min(max));
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > max {
                    drain_then_error(gw, session, ctx, &too_large()).await?;
                    return Ok(None);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(Some(body)),
            Err(e) => {
                // The client stopped sending (timeout) or went away: nothing sensible to answer
                // on a broken connection, but try.
                session.set_keepalive(None);
                ctx.outcome = "client_disconnected";
                let err = ApiError::invalid_body(format!("could not read the request body: {e}"));
                let _ = respond::error(session, ctx, ctx.format, &err).await;
                return Ok(None);
            }
        }
    }
}

async fn api(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
) -> pingora::Result<()> {
    if gw.in_flight.load(std::sync::atomic::Ordering::Relaxed) > gw.config.server.max_in_flight {
        let e = ApiError::new(
            ErrorKind::Overloaded { retry_after: 1 },
            "the gateway is at capacity; retry shortly",
        );
        return drain_then_error(gw, session, ctx, &e).await;
    }
    if ctx.format == ClientFormat::Messages {
        if let Err(e) = check_version(session) {
            return drain_then_error(gw, session, ctx, &e).await;
        }
    }
    let principal = match gw
        .keys
        .authenticate(&session.req_header().headers, ctx.format)
    {
        Ok(p) => p,
        Err(e) => {
            m().auth_failures
                .with_label_values(&[ctx.route.as_str()])
                .inc();
            return drain_then_error(gw, session, ctx, &e).await;
        }
    };
    ctx.principal = Some(principal.clone());
    if !is_json_content_type(session) {
        let e = ApiError::invalid_body(
            "the request body must be JSON (Content-Type: application/json)",
        );
        return drain_then_error(gw, session, ctx, &e).await;
    }
    let Some(body) = read_body(gw, session, ctx).await? else {
        return Ok(());
    };

    if ctx.route == Route::CountTokens {
        return count_tokens(gw, session, ctx, &body).await;
    }

    let translated = match ctx.format {
        ClientFormat::Chat => chat::chat_to_upstream(&body, &gw.config),
        ClientFormat::Messages => messages::messages_to_upstream(&body, &gw.config),
    };
    let req: UpstreamRequest = match translated {
        Ok(r) => r,
        Err(e) => return fail(session, ctx, &e).await,
    };
    drop(body);
    ctx.model = Some(req.model);
    ctx.stream = req.stream;

    if gw.ledger.backlogged() {
        // The store has been unreachable long enough for store.max_unstored_rows rows to
        // queue: admitting more would put money at risk that no ledger holds yet.
        let e = ApiError::new(
            ErrorKind::Overloaded { retry_after: 5 },
            "the gateway cannot record charges right now (its billing store is unreachable); retry shortly",
        );
        return fail(session, ctx, &e).await;
    }
    if let Err(l) = gw.limits.admit(&principal) {
        m().rate_limited
            .with_label_values(&[&principal.tenant_name, l.scope, l.limit])
            .inc();
        let e = ApiError::new(
            ErrorKind::RateLimited {
                retry_after: l.retry_after,
            },
            format!(
                "rate limit reached: {} per minute for this {}; retry in {} s",
                l.limit, l.scope, l.retry_after
            ),
        );
        return fail(session, ctx, &e).await;
    }

    let model = &gw.config.models[req.model];
    let (worst_input, prompt_estimate) = prompt_bounds(&req, model.context_window);
    let worst = model
        .prices
        .worst_case(worst_input, u64::from(req.max_tokens));
    match gw.accounts.reserve(principal.tenant_id, worst).await {
        Ok(r) => {
            ctx.reservation = Some(r);
            ctx.prompt_estimate = prompt_estimate;
            ctx.arm_settlement_fallback(gw);
        }
        Err(crate::billing::Refusal::Insufficient { needed, available }) => {
            m().billing_refused
                .with_label_values(&[&principal.tenant_name])
                .inc();
            let e = ApiError::new(
                ErrorKind::InsufficientBalance,
                format!(
                    "insufficient balance: this request may cost up to {} and {} is available; top up to continue",
                    fmt_cost(needed),
                    available.format_soles()
                ),
            );
            return fail(session, ctx, &e).await;
        }
        Err(crate::billing::Refusal::StoreUnavailable(detail)) => {
            log::error!("admission failed, store unavailable: {detail}");
            let e = ApiError::new(
                ErrorKind::Overloaded { retry_after: 1 },
                "the gateway cannot verify the balance right now; retry shortly",
            );
            return fail(session, ctx, &e).await;
        }
    }
    m().reservations_open.inc();
    let result = relay::completion(gw, session, ctx, req).await;
    m().reservations_open.dec();
    result
}

/// Tokens a chat template may add around the messages (role markers, a default system prompt,
/// tool-use instructions) beyond what their JSON bytes already bound.
pub const TEMPLATE_ALLOWANCE: u64 = 512;
/// Bytes of prompt JSON per token for the input estimate of a request whose upstream reported
/// no input tokens. Real tokenizers average 3–4.5 bytes per token on text and JSON overhead adds
/// bytes that are not tokens, so 4 rarely overstates and never exceeds the reservation.
pub const PROMPT_BYTES_PER_TOKEN: u64 = 4;

/// `(worst-case input tokens, input estimate)` of a request.
///
/// Worst case: the upstream refuses `prompt + max_tokens > context window` (vLLM, SGLang), so
/// the input is at most `context_window - max_tokens`. Below that, a text prompt is bounded by
/// its bytes (every token covers at least one) plus [`TEMPLATE_ALLOWANCE`]; an image costs
/// hundreds to thousands of tokens whatever its URL's length, so a prompt with one is given the
/// whole bound. Should an upstream still report more, the charge is capped at the reservation
/// anyway (see `settle`).
///
/// Estimate: `prompt_bytes / PROMPT_BYTES_PER_TOKEN` (at least 1, at most the worst case), what
/// is billed when the upstream reports no input tokens (a cut stream).
pub fn prompt_bounds(req: &UpstreamRequest, context_window: u64) -> (u64, u64) {
    let bound = context_window.saturating_sub(u64::from(req.max_tokens));
    let prompt = req.body.get(req.prompt_range.clone()).unwrap_or(&req.body);
    let has_images = memchr::memmem::find(prompt, b"\"image_url\"").is_some();
    let bytes = req.prompt_bytes as u64;
    let worst = if has_images {
        bound
    } else {
        bytes.saturating_add(TEMPLATE_ALLOWANCE).min(bound)
    };
    let estimate = (bytes / PROMPT_BYTES_PER_TOKEN).max(1).min(worst);
    (worst, estimate)
}

/// Costs shown to tenants: soles with céntimos, or the exact amount when under a céntimo.
fn fmt_cost(p: Pen) -> String {
    if p < Pen::from_centimos(1) {
        format!("S/ {}", p.to_decimal())
    } else {
        p.format_soles()
    }
}

async fn count_tokens(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    body: &[u8],
) -> pingora::Result<()> {
    let (model, tokenize_body) = match messages::count_tokens_to_upstream(body, &gw.config) {
        Ok(r) => r,
        Err(e) => return fail(session, ctx, &e).await,
    };
    ctx.model = Some(model);
    if let Err(l) = gw.limits.admit(ctx.principal.as_deref().ok_or_else(|| {
        pingora::Error::explain(pingora::ErrorType::InternalError, "no principal")
    })?) {
        let e = ApiError::new(
            ErrorKind::RateLimited {
                retry_after: l.retry_after,
            },
            format!("rate limit reached; retry in {} s", l.retry_after),
        );
        return fail(session, ctx, &e).await;
    }
    match relay::tokenize(gw, session, ctx, model, &tokenize_body).await {
        Ok(Some(upstream)) => match messages::tokenize_to_count_tokens(&upstream) {
            Ok(out) => respond::json(session, ctx, 200, Bytes::from(out)).await,
            Err(e) => fail(session, ctx, &e).await,
        },
        // The client went away: nobody to answer.
        Ok(None) => Ok(()),
        Err(e) => fail(session, ctx, &e).await,
    }
}

/// How long a non-streaming upstream error body may take to arrive.
pub const ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, EMBEDDED_DEFAULT};
    use serde_json::json;

    fn bounds(body: serde_json::Value) -> (UpstreamRequest, (u64, u64)) {
        let c = Config::parse(EMBEDDED_DEFAULT, "test").unwrap();
        let req = chat::chat_to_upstream(&serde_json::to_vec(&body).unwrap(), &c).unwrap();
        let window = c.models[req.model].context_window;
        let b = prompt_bounds(&req, window);
        (req, b)
    }

    #[test]
    fn text_is_bounded_by_its_bytes_and_an_image_by_the_window() {
        let text = json!({"model": "aguila", "max_tokens": 1000,
            "messages": [{"role": "user", "content": "hola, ¿qué tal?"}]});
        let (req, (worst, estimate)) = bounds(text);
        let bytes = req.prompt_bytes as u64;
        assert_eq!(worst, bytes + TEMPLATE_ALLOWANCE);
        assert_eq!(estimate, bytes / PROMPT_BYTES_PER_TOKEN);
        // A few bytes of URL can be thousands of image tokens: the whole bound is reserved.
        let image = json!({"model": "aguila", "max_tokens": 1000, "messages": [{"role": "user",
            "content": [{"type": "text", "text": "what is it"},
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]});
        let (req, (worst, estimate)) = bounds(image);
        assert_eq!(worst, 131_072 - 1000);
        assert_eq!(estimate, req.prompt_bytes as u64 / PROMPT_BYTES_PER_TOKEN);
        // The upstream refuses prompt + max_tokens > window, so that bound caps any estimate.
        // (colibri: a 32,768-token window; max_tokens is clamped to 8,192.)
        let long = json!({"model": "colibri", "max_tokens": 8192,
            "messages": [{"role": "user", "content": "x".repeat(30_000)}]});
        let (req, (worst, estimate)) = bounds(long);
        assert_eq!(worst, 32_768 - 8192);
        assert_eq!(estimate, req.prompt_bytes as u64 / PROMPT_BYTES_PER_TOKEN);
        // The text of a message cannot fake an image part.
        let fake = json!({"model": "aguila", "max_tokens": 1000,
            "messages": [{"role": "user", "content": "say \"image_url\" twice"}]});
        let (req, (worst, _)) = bounds(fake);
        assert_eq!(worst, req.prompt_bytes as u64 + TEMPLATE_ALLOWANCE);
    }
}
