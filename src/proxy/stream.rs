//! Relaying a streamed answer: each upstream read is decoded ([`crate::sse`]) and translated
//! ([`crate::translate`]) and the result written at once — no buffering of the reply, no
//! reparse.
//!
//! The `200` is committed with the first output, so a stream that fails before producing
//! anything still gets a real HTTP error. An upstream silent past its idle timeout, or one that
//! resets or sends garbage, ends the stream with an error frame in the client's format. A
//! client that goes away cancels the upstream request at once (its connection is closed, which
//! makes vLLM abort the generation); the tokens generated so far are billed.
//!
//! **Pings.** No ping goes out before the upstream's response header has arrived with a `200`:
//! until then the client may still get a real HTTP status (a `429`, a `5xx`, a `504` when the
//! header does not come in `first_byte_ms`), which a ping would turn into an error frame under a
//! committed `200`. Once the upstream has answered `200` it has committed to a stream, and
//! pings keep the client's connection alive through a long prefill (coding agents give up on a
//! silent connection); an upstream that fails after that ends the stream with an error frame.
//! Only a format with a keep-alive event pings ([`StreamTranslator::pings`]).

use super::relay::client_gone;
use super::{respond, Failure, Gateway, Outcome, Reply, RequestCtx, Streamed};
use crate::error::{ApiError, ErrorKind};
use crate::http::client::{Read, UpstreamError, UpstreamResponse};
use crate::http::deadline;
use crate::metrics::m;
use crate::sse::SseDecoder;
use crate::translate::{feed_stream, finish_stream, malformed_stream, StreamEnd, StreamTranslator};
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::time::sleep_until;

/// Most client bytes gathered from already-arrived upstream chunks before a write.
const COALESCE_BYTES: usize = 16 * 1024;

/// How long a finished stream waits for the upstream's end of body (the chunked terminator
/// after `[DONE]`, usually in the same read or the next): a body read to its end lets the
/// connection go back to the pool instead of a new connection per stream.
const TAIL_WAIT: Duration = Duration::from_millis(50);

/// Relays a stream; see the module docs.
pub async fn relay(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    mut resp: UpstreamResponse,
    mut translator: Box<dyn StreamTranslator>,
    first_byte_deadline: tokio::time::Instant,
) -> Reply {
    let Some(model_id) = ctx.model else {
        resp.finish(&gw.connector);
        return Failure::new(Outcome::InternalError, super::internal_error()).into();
    };
    let model = &gw.config.models[model_id];
    let mut decoder = SseDecoder::default();
    // Cleared after every write and reused; it grows once if a burst of events needs more. Kept
    // small because every open stream holds one.
    let mut out: Vec<u8> = Vec::with_capacity(1024);
    // A stream whose head went out while it waited in a queue is committed already.
    let mut committed = ctx.head_sent;
    // Here the upstream's header has arrived with a 200: pings may start (module docs, *Pings*).
    let pings = translator.pings();
    let ping_every = gw.config.streaming.ping_interval;
    let mut last_upstream = tokio::time::Instant::now();
    let mut next_ping = deadline(last_upstream, ping_every);
    let mut saw_data = false;
    // The upstream's body was read to its end (so its connection can be reused).
    let mut upstream_ended = false;
    let mut client_left = false;
    let mut timed_out = false;
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
                            ctx.upstream.ttft = Some(ctx.started.elapsed());
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
                                Poll::Ready(Err(e)) => {
                                    upstream_done = true;
                                    upstream_broke(&ctx.request_id, &e, translator.as_mut(), &mut out);
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
                    Err(e) => {
                        upstream_done = true;
                        upstream_broke(&ctx.request_id, &e, translator.as_mut(), &mut out);
                    }
                }
            }
            _ = sleep_until(idle_deadline) => {
                upstream_done = true;
                timed_out = true;
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
                    m().streams_open.dec();
                    ctx.usage = Some(translator.usage());
                    ctx.upstream.time += stream_started.elapsed();
                    resp.finish(&gw.connector);
                    return Failure::new(failed_outcome(timed_out), e).into();
                }
                if respond::stream_header(session, &ctx.request_id)
                    .await
                    .is_err()
                {
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
    ctx.upstream.time += stream_started.elapsed();
    ctx.usage = Some(translator.usage());
    if let Some(turn) = ctx.responses.as_mut() {
        turn.object = translator.take_object();
    }
    let status = if committed { 200 } else { 0 };
    if client_left {
        m().client_disconnects
            .with_label_values(&[ctx.route.as_str()])
            .inc();
        // Closing the upstream connection makes the server abort the generation.
        resp.finish(&gw.connector);
        session.set_keepalive(None);
        return Reply::Streamed(Streamed {
            status,
            outcome: Outcome::ClientDisconnected,
            error: None,
        });
    }
    if !committed {
        resp.finish(&gw.connector);
        // The upstream ended without a byte of output (nothing to commit): say so.
        let e = translator
            .error()
            .cloned()
            .unwrap_or_else(|| malformed_stream("the stream ended without output"));
        let outcome = match translator.end() {
            StreamEnd::Failed => failed_outcome(timed_out),
            StreamEnd::Open | StreamEnd::Complete => Outcome::UpstreamError,
        };
        return Failure::new(outcome, e).into();
    }
    // End the client's stream first: reading the upstream's tail must not delay it.
    let ended = session.write_response_body(Bytes::new(), true).await;
    if translator.end() == StreamEnd::Complete && !upstream_ended {
        read_tail(&mut resp).await;
    }
    resp.finish(&gw.connector);
    let (outcome, error) = match translator.end() {
        StreamEnd::Failed => (
            failed_outcome(timed_out),
            translator.error().map(|e| e.kind.label()),
        ),
        StreamEnd::Open | StreamEnd::Complete => (Outcome::Ok, None),
    };
    if ended.is_err() {
        session.set_keepalive(None);
    }
    Reply::Streamed(Streamed {
        status,
        outcome,
        error,
    })
}

/// The outcome of a stream the translator ended as failed.
fn failed_outcome(timed_out: bool) -> Outcome {
    if timed_out {
        Outcome::Timeout
    } else {
        Outcome::UpstreamError
    }
}

/// A stream whose upstream broke (reset, garbage framing): logged, and ended for the client
/// with an error frame in its format.
fn upstream_broke(
    request_id: &str,
    error: &UpstreamError,
    translator: &mut dyn StreamTranslator,
    out: &mut Vec<u8>,
) {
    log::warn!("request {request_id}: upstream stream broke: {error}");
    translator.on_failure(
        &ApiError::new(
            ErrorKind::Upstream,
            "the model server closed the stream unexpectedly",
        ),
        out,
    );
}

/// Reads what is left of a finished stream's upstream body (nothing of use: its last event has
/// been translated), bounded by [`TAIL_WAIT`]. The timer is only armed if the end has not
/// arrived already.
async fn read_tail(resp: &mut UpstreamResponse) {
    let until = deadline(tokio::time::Instant::now(), TAIL_WAIT);
    while let Ok(Ok(Read::Data(_))) = tokio::time::timeout_at(until, resp.read()).await {}
}
