//! The upstream exchange of an admitted request, and the relay of its answer.
//!
//! 1. **Pick and send, with failover.** A replica is picked (see `upstream::pool`); connect
//!    failures, connections that break before any response byte, and `503`s are retried on
//!    another replica — always before any byte reached the client, never after.
//! 2. **Errors before the first byte** are real HTTP errors with the mapped status.
//! 3. **Non-streaming** answers are read whole (bounded) and translated.
//! 4. **Streams** are translated incrementally: each upstream read is decoded and translated
//!    and the result written at once. The `200` is committed with the first output, so a
//!    stream that fails before producing anything still gets a real HTTP error. While the
//!    upstream is silent, messages streams get `ping`s (see *Pings* below); an upstream silent
//!    past its idle timeout, or one that resets or sends garbage, ends the stream with an error
//!    frame in the client's format. A client that goes away cancels the upstream request at
//!    once (its connection is closed, which makes vLLM abort the generation); the tokens
//!    generated so far are billed.
//!
//! **Timeouts: one deadline per phase.** A non-streaming request has `request_ms` for the whole
//! exchange (response header and body together); a stream has `first_byte_ms` from the request
//! being sent to the first body byte (the response header comes within the same deadline), then
//! `idle_ms` between chunks. A `count_tokens` call has `first_byte_ms` for its whole exchange.
//! Retries on another replica share the deadline of the request they retry.
//!
//! **Pings.** No ping goes out before the upstream's response header has arrived with a `200`:
//! until then the client may still get a real HTTP status (a `429`, a `5xx`, a `504` when the
//! header does not come in `first_byte_ms`), which a ping would turn into an error frame under a
//! committed `200`. Once the upstream has answered `200` it has committed to a stream, and
//! pings keep the client's connection alive through a long prefill (coding agents give up on a
//! silent connection); an upstream that fails after that ends the stream with an error frame.

use super::api::ERROR_BODY_TIMEOUT;
use super::conn::deadline;
use super::respond;
use super::{Gateway, RequestCtx};
use crate::config::ModelId;
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::metrics::m;
use crate::sse::SseDecoder;
use crate::translate::chat::{upstream_to_chat, ChatStream};
use crate::translate::messages::{upstream_to_message, MessagesStream};
use crate::translate::upstream_error::{map_upstream_error, UpstreamFailure};
use crate::translate::{
    feed_stream, finish_stream, malformed_stream, ResponseContext, StreamEnd, StreamTranslator,
    UpstreamRequest,
};
use crate::upstream::client::{self, Call, Read, SendError, UpstreamResponse};
use crate::upstream::{block_hashes, ReplicaGuard};
use crate::usage::{usage_of_completion, Usage};
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::time::sleep_until;

/// Largest non-streaming upstream body accepted.
const MAX_UPSTREAM_BODY: usize = 64 * 1024 * 1024;
/// Largest upstream error body read.
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// What became of sending the request.
enum Sent<'a> {
    /// The response (a connection and its read buffer, ~100 bytes).
    Response(UpstreamResponse, ReplicaGuard<'a>),
    /// An error was (or could not be) written to the client; nothing more to do.
    Done,
}

/// Resolves when the client closes its connection (or sends bytes it should not).
async fn client_gone(session: &mut ServerSession) {
    let _ = session.read_body_or_idle(true).await;
}

/// Consumes the request: once the upstream has answered nothing is resent, so its body (up to
/// the body limit; coding agents send hundreds of KiB) is freed here instead of living as long
/// as the response, and the names the response needs are moved, not copied.
fn response_context(gw: &Gateway, ctx: &RequestCtx, req: UpstreamRequest) -> ResponseContext {
    let model = &gw.config.models[req.model];
    ResponseContext {
        request_id: ctx.request_id.clone(),
        client_model: req.client_model,
        slug: model.slug.clone(),
        upstream_model: model.upstream_model.clone(),
        tool_name_map: req.tool_name_map,
    }
}

/// Picks replicas and sends until one answers (see the module docs for what is retried).
async fn send<'g>(
    gw: &'g Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    req: &UpstreamRequest,
    prompt_blocks: &[u64],
    header_deadline: tokio::time::Instant,
) -> pingora::Result<Sent<'g>> {
    let model = &gw.config.models[req.model];
    let pool = &gw.pools[req.model];
    let mut tried: Vec<usize> = Vec::new();
    loop {
        let Some(guard) = pool.pick(prompt_blocks, &tried) else {
            let msg = if tried.is_empty() {
                format!(
                    "no healthy replica serves `{}` right now; retry shortly",
                    model.slug
                )
            } else {
                format!("every replica of `{}` failed; retry shortly", model.slug)
            };
            ctx.outcome = "upstream_unavailable";
            let e = ApiError::new(ErrorKind::Overloaded { retry_after: 1 }, msg);
            respond::error(session, ctx, ctx.format, &e).await?;
            return Ok(Sent::Done);
        };
        if !tried.is_empty() {
            m().upstream_retries.with_label_values(&[&model.slug]).inc();
        }
        ctx.attempts += 1;
        ctx.replica = Some(guard.index);
        let path = guard.replica().chat_path();
        let call = Call {
            replica: guard.replica(),
            timeouts: &model.timeouts,
            path,
            body: &req.body,
            request_id: &ctx.request_id,
            api_key: model.upstream_api_key.as_deref(),
            header_deadline,
        };
        let started = Instant::now();
        let result = tokio::select! {
            r = client::send(&gw.connector, &call) => r,
            _ = client_gone(session) => {
                ctx.upstream_time += started.elapsed();
                ctx.outcome = "client_disconnected";
                m().client_disconnects.with_label_values(&[ctx.route.as_str()]).inc();
                // The upstream has the request (a non-streamed answer's header comes with its
                // body): bill its input, estimated, as a stream cut before its first chunk is.
                ctx.usage = Some(Usage::default());
                return Ok(Sent::Done);
            }
        };
        ctx.upstream_time += started.elapsed();
        match result {
            Ok(resp) if resp.status == 503 => {
                guard.failed("status_503");
                let retry_after = resp.retry_after;
                tried.push(guard.index);
                drop(guard);
                drop(resp);
                if tried.len() >= pool.replicas.len() {
                    ctx.outcome = "upstream_unavailable";
                    let e = ApiError::new(
                        ErrorKind::Overloaded {
                            retry_after: retry_after.unwrap_or(1),
                        },
                        format!("`{}` is overloaded; retry shortly", model.slug),
                    );
                    respond::error(session, ctx, ctx.format, &e).await?;
                    return Ok(Sent::Done);
                }
            }
            Ok(resp) => return Ok(Sent::Response(resp, guard)),
            Err(SendError::Timeout) => {
                // Not a replica failure: a slow first byte is usually a long queue, and
                // ejecting would push the load onto the others. Health checks catch hung ones.
                ctx.outcome = "timeout";
                let e = ApiError::new(
                    ErrorKind::UpstreamTimeout,
                    format!("`{}` did not start answering in time", model.slug),
                );
                respond::error(session, ctx, ctx.format, &e).await?;
                return Ok(Sent::Done);
            }
            Err(e) => {
                log::warn!(
                    "request {} to {} failed before any response: {e}",
                    ctx.request_id,
                    guard.replica().url
                );
                guard.failed(e.kind());
                tried.push(guard.index);
            }
        }
    }
}

/// Answers a chat or messages request from the upstream.
pub async fn completion(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    req: UpstreamRequest,
) -> pingora::Result<()> {
    let model = &gw.config.models[req.model];
    let pool = &gw.pools[req.model];
    let blocks = if pool.uses_affinity() {
        block_hashes(&req.body[req.prompt_range.clone()])
    } else {
        Vec::new()
    };
    // One deadline for the phase that ends with the first body byte (stream) or with the whole
    // body (non-stream); see the module docs.
    let sent_at = tokio::time::Instant::now();
    let phase_deadline = if req.stream {
        deadline(sent_at, model.timeouts.first_byte)
    } else {
        deadline(sent_at, model.timeouts.request)
    };
    let sent = send(gw, session, ctx, &req, &blocks, phase_deadline).await?;
    let Sent::Response(mut resp, guard) = sent else {
        return Ok(());
    };
    if resp.status != 200 {
        let body = resp
            .read_all(MAX_ERROR_BODY, ERROR_BODY_TIMEOUT)
            .await
            .unwrap_or_default();
        // A 5xx for this request (a bad input that crashed a handler, a context error) says
        // little about the replica; 503s (handled above), connect failures and resets do, and
        // a dead engine fails its health check.
        guard.succeeded();
        let e = map_upstream_error(
            &UpstreamFailure {
                status: resp.status,
                body: &body,
                retry_after: resp.retry_after,
                upstream_model: &model.upstream_model,
                slug: &model.slug,
            },
            ctx.format,
        );
        resp.finish(&gw.connector);
        ctx.outcome = "upstream_error";
        return respond::error(session, ctx, ctx.format, &e).await;
    }
    guard.succeeded();
    let (model_id, streaming, wants_usage) = (req.model, req.stream, req.client_wants_usage);
    drop(blocks);
    let rctx = response_context(gw, ctx, req);
    if streaming {
        let translator: Box<dyn StreamTranslator> = match ctx.format {
            ClientFormat::Chat => Box::new(ChatStream::new(
                rctx,
                wants_usage,
                gw.config.streaming.chat_reasoning_field,
            )),
            ClientFormat::Messages => Box::new(MessagesStream::new(rctx)),
        };
        stream(gw, session, ctx, resp, translator, model_id, phase_deadline).await
    } else {
        let started = Instant::now();
        let read = tokio::select! {
            r = resp.read_all_by(MAX_UPSTREAM_BODY, phase_deadline) => Some(r),
            _ = client_gone(session) => None,
        };
        ctx.upstream_time += started.elapsed();
        let Some(read) = read else {
            ctx.outcome = "client_disconnected";
            m().client_disconnects
                .with_label_values(&[ctx.route.as_str()])
                .inc();
            resp.finish(&gw.connector);
            // The upstream accepted the request and worked on it until the cancel; its report
            // never comes. Bill the input (`settle` estimates it when none was reported), no
            // output: nothing was delivered.
            ctx.usage = Some(Usage::default());
            return Ok(());
        };
        let body = match read {
            Ok(b) => b,
            Err(detail) => {
                ctx.outcome = "upstream_error";
                resp.finish(&gw.connector);
                let e = if detail.contains("timed out") {
                    ApiError::new(
                        ErrorKind::UpstreamTimeout,
                        format!("`{}` did not finish in time", model.slug),
                    )
                } else {
                    malformed_stream(&detail)
                };
                return respond::error(session, ctx, ctx.format, &e).await;
            }
        };
        resp.finish(&gw.connector);
        let translated = match ctx.format {
            ClientFormat::Chat => {
                upstream_to_chat(&body, &rctx, gw.config.streaming.chat_reasoning_field)
            }
            ClientFormat::Messages => upstream_to_message(&body, &rctx),
        };
        match translated {
            Ok((out, usage)) => {
                ctx.usage = Some(usage);
                respond::json(session, ctx, 200, Bytes::from(out)).await
            }
            Err(e) => {
                // The tokens were spent even though the answer is unusable: bill them.
                ctx.usage = usage_of_completion(&body);
                ctx.outcome = "upstream_error";
                respond::error(session, ctx, ctx.format, &e).await
            }
        }
    }
}

/// Relays a stream; see the module docs.
async fn stream(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    mut resp: UpstreamResponse,
    mut translator: Box<dyn StreamTranslator>,
    model_id: ModelId,
    first_byte_deadline: tokio::time::Instant,
) -> pingora::Result<()> {
    let model = &gw.config.models[model_id];
    let mut decoder = SseDecoder::default();
    // Cleared after every write and reused; it grows once if a burst of events needs more. Kept
    // small because every open stream holds one.
    let mut out: Vec<u8> = Vec::with_capacity(1024);
    let mut committed = false;
    // Here the upstream's header has arrived with a 200: pings may start (module docs, *Pings*).
    let pings = ctx.format == ClientFormat::Messages;
    let ping_every = gw.config.streaming.ping_interval;
    let mut last_upstream = tokio::time::Instant::now();
    let mut next_ping = deadline(last_upstream, ping_every);
    let mut saw_data = false;
    // The upstream's body was read to its end (so its connection can be reused).
    let mut upstream_ended = false;
    let mut client_left = false;
    let stream_started = Instant::now();
    m().streams_open.inc();

    loop {
        // Before the first byte, the deadline set when the request was sent (not a second
        // `first_byte_ms` from the header); after it, `idle_ms` from the last chunk.
        let idle_deadline = if saw_data {
            deadline(last_upstream, model.timeouts.idle)
        } else {
            first_byte_deadline
        };
        let mut upstream_done = false;
        tokio::select! {
            r = resp.read() => {
                match r {
                    Ok(Read::Data(bytes)) => {
                        if !saw_data {
                            saw_data = true;
                            ctx.ttft = Some(ctx.started.elapsed());
                        }
                        last_upstream = tokio::time::Instant::now();
                        next_ping = deadline(last_upstream, ping_every);
                        feed_stream(&mut decoder, translator.as_mut(), bytes, &mut out);
                        // What the upstream has already sent goes to the client in one write,
                        // not one per upstream chunk (what pingora's own proxy does too) —
                        // once the stream is committed: before that, the first output goes
                        // alone, so a failure right behind it still finds the `200` sent and
                        // the output delivered, not replaced by an HTTP error.
                        while committed && out.len() < COALESCE_BYTES && translator.end() == StreamEnd::Open {
                            let next = {
                                let read = resp.read();
                                tokio::pin!(read);
                                std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await
                            };
                            match next {
                                Poll::Ready(Ok(Read::Data(more))) => {
                                    feed_stream(&mut decoder, translator.as_mut(), more, &mut out);
                                }
                                Poll::Ready(Ok(Read::End)) => {
                                    upstream_done = true;
                                    upstream_ended = true;
                                    finish_stream(&mut decoder, translator.as_mut(), &mut out);
                                    break;
                                }
                                Poll::Ready(Err(detail)) => {
                                    upstream_done = true;
                                    upstream_broke(&ctx.request_id, &detail, translator.as_mut(), &mut out);
                                    break;
                                }
                                Poll::Pending => break,
                            }
                        }
                    }
                    Ok(Read::End) => {
                        upstream_done = true;
                        upstream_ended = true;
                        finish_stream(&mut decoder, translator.as_mut(), &mut out);
                    }
                    Err(detail) => {
                        upstream_done = true;
                        upstream_broke(&ctx.request_id, &detail, translator.as_mut(), &mut out);
                    }
                }
            }
            _ = sleep_until(idle_deadline) => {
                upstream_done = true;
                ctx.outcome = "timeout";
                translator.on_failure(
                    &ApiError::new(ErrorKind::UpstreamTimeout, "the model stopped sending before finishing"),
                    &mut out,
                );
            }
            _ = sleep_until(next_ping), if pings => {
                next_ping = deadline(tokio::time::Instant::now(), ping_every);
                translator.on_idle(&mut out);
            }
            _ = client_gone(session) => {
                client_left = true;
            }
        }
        if client_left {
            break;
        }
        if !out.is_empty() {
            if !committed {
                if translator.end() == StreamEnd::Failed {
                    // Nothing reached the client yet: a real HTTP error is still possible.
                    let e = translator
                        .error()
                        .cloned()
                        .unwrap_or_else(|| malformed_stream("failed before any output"));
                    if ctx.outcome == "ok" {
                        ctx.outcome = "upstream_error";
                    }
                    out.clear();
                    m().streams_open.dec();
                    ctx.usage = Some(translator.usage());
                    ctx.upstream_time += stream_started.elapsed();
                    resp.finish(&gw.connector);
                    return respond::error(session, ctx, ctx.format, &e).await;
                }
                if respond::stream_header(session, ctx).await.is_err() {
                    client_left = true;
                    break;
                }
                committed = true;
            }
            let chunk = Bytes::copy_from_slice(&out);
            out.clear();
            if session.write_response_body(chunk, false).await.is_err() {
                client_left = true;
                break;
            }
        }
        if upstream_done || translator.end() != StreamEnd::Open {
            break;
        }
    }
    m().streams_open.dec();
    ctx.upstream_time += stream_started.elapsed();
    ctx.usage = Some(translator.usage());
    if client_left {
        ctx.outcome = "client_disconnected";
        m().client_disconnects
            .with_label_values(&[ctx.route.as_str()])
            .inc();
        // Closing the upstream connection makes the server abort the generation.
        resp.finish(&gw.connector);
        session.set_keepalive(None);
        return Ok(());
    }
    if translator.end() == StreamEnd::Failed {
        if ctx.outcome == "ok" {
            ctx.outcome = "upstream_error";
        }
        ctx.error = translator.error().map(|e| e.kind.label());
    }
    if committed {
        // End the client's stream first: reading the upstream's tail must not delay it.
        let ended = session.write_response_body(Bytes::new(), true).await;
        if translator.end() == StreamEnd::Complete && !upstream_ended {
            read_tail(&mut resp).await;
        }
        resp.finish(&gw.connector);
        ended?;
    } else {
        resp.finish(&gw.connector);
        // The upstream ended without a byte of output (nothing to commit): say so.
        let e = translator
            .error()
            .cloned()
            .unwrap_or_else(|| malformed_stream("the stream ended without output"));
        return respond::error(session, ctx, ctx.format, &e).await;
    }
    Ok(())
}

/// A stream whose upstream broke (reset, garbage framing): logged, and ended for the client
/// with an error frame in its format.
fn upstream_broke(
    request_id: &str,
    detail: &str,
    translator: &mut dyn StreamTranslator,
    out: &mut Vec<u8>,
) {
    log::warn!("request {request_id}: upstream stream broke: {detail}");
    translator.on_failure(
        &ApiError::new(
            ErrorKind::Upstream,
            "the model server closed the stream unexpectedly",
        ),
        out,
    );
}

/// Most client bytes gathered from already-arrived upstream chunks before a write.
const COALESCE_BYTES: usize = 16 * 1024;

/// How long a finished stream waits for the upstream's end of body (the chunked terminator
/// after `[DONE]`, usually in the same read or the next): a body read to its end lets the
/// connection go back to the pool instead of a new connection per stream.
const TAIL_WAIT: Duration = Duration::from_millis(50);

/// Reads what is left of a finished stream's upstream body (nothing of use: its last event has
/// been translated), bounded by [`TAIL_WAIT`]. The timer is only armed if the end has not
/// arrived already.
async fn read_tail(resp: &mut UpstreamResponse) {
    let until = deadline(tokio::time::Instant::now(), TAIL_WAIT);
    while let Ok(Ok(Read::Data(_))) = tokio::time::timeout_at(until, resp.read()).await {}
}

/// Asks a replica's tokenizer (`/tokenize`) to count a prompt; returns the upstream body, or
/// `None` when the client went away first (the upstream call is then dropped). The whole
/// exchange, failovers included, has `first_byte_ms`.
pub async fn tokenize(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    model_id: ModelId,
    body: &[u8],
) -> Result<Option<Vec<u8>>, ApiError> {
    let model = &gw.config.models[model_id];
    let by = deadline(tokio::time::Instant::now(), model.timeouts.first_byte);
    let started = Instant::now();
    let result = tokio::select! {
        r = tokenize_exchange(gw, ctx, model_id, body, by) => Some(r),
        _ = client_gone(session) => None,
    };
    ctx.upstream_time += started.elapsed();
    match result {
        Some(r) => r.map(Some),
        None => {
            ctx.outcome = "client_disconnected";
            m().client_disconnects
                .with_label_values(&[ctx.route.as_str()])
                .inc();
            Ok(None)
        }
    }
}

async fn tokenize_exchange(
    gw: &Gateway,
    ctx: &mut RequestCtx,
    model_id: ModelId,
    body: &[u8],
    by: tokio::time::Instant,
) -> Result<Vec<u8>, ApiError> {
    let model = &gw.config.models[model_id];
    let pool = &gw.pools[model_id];
    let timed_out = || {
        ApiError::new(
            ErrorKind::UpstreamTimeout,
            "the tokenizer did not answer in time",
        )
    };
    let mut tried = Vec::new();
    loop {
        let guard = pool.pick(&[], &tried).ok_or_else(|| {
            ApiError::new(
                ErrorKind::Overloaded { retry_after: 1 },
                format!("no healthy replica serves `{}` right now", model.slug),
            )
        })?;
        ctx.attempts += 1;
        ctx.replica = Some(guard.index);
        let call = Call {
            replica: guard.replica(),
            timeouts: &model.timeouts,
            path: &model.tokenize_path,
            body,
            request_id: &ctx.request_id,
            api_key: model.upstream_api_key.as_deref(),
            header_deadline: by,
        };
        let mut resp = match client::send(&gw.connector, &call).await {
            Ok(r) => r,
            Err(SendError::Timeout) => return Err(timed_out()),
            Err(e) => {
                guard.failed(e.kind());
                tried.push(guard.index);
                continue;
            }
        };
        let status = resp.status;
        let read = resp.read_all_by(MAX_ERROR_BODY * 4, by).await;
        resp.finish(&gw.connector);
        let body = match read {
            Ok(b) => b,
            Err(d) if d.contains("timed out") => return Err(timed_out()),
            Err(d) => return Err(malformed_stream(&d)),
        };
        return match status {
            200 => {
                guard.succeeded();
                Ok(body.to_vec())
            }
            404 | 405 | 501 => Err(ApiError::new(
                ErrorKind::TokenizerUnavailable,
                format!(
                    "`{}` cannot count tokens: its server offers no tokenizer at {}",
                    model.slug, model.tokenize_path
                ),
            )),
            _ => {
                if status >= 500 {
                    guard.failed(&format!("status_{status}"));
                }
                Err(map_upstream_error(
                    &UpstreamFailure {
                        status,
                        body: &body,
                        retry_after: None,
                        upstream_model: &model.upstream_model,
                        slug: &model.slug,
                    },
                    ClientFormat::Messages,
                ))
            }
        };
    }
}
