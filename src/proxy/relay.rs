//! The upstream exchange of an admitted request, and the relay of its answer.
//!
//! 1. **Pick and send, with failover.** A replica is picked (see `upstream::pool`); connect
//!    failures, connections that break before any response byte, and `503`s are retried on
//!    another replica — always before any byte reached the client, never after.
//! 2. **Errors before the first byte** are real HTTP errors with the mapped status.
//! 3. **Non-streaming** answers are read whole (bounded) and translated.
//! 4. **Streams** are translated incrementally ([`super::stream`]).
//!
//! **Timeouts: one deadline per phase.** A non-streaming request has `request_ms` for the whole
//! exchange (response header and body together); a stream has `first_byte_ms` from the request
//! being sent to the first body byte (the response header comes within the same deadline), then
//! `idle_ms` between chunks. Retries on another replica share the deadline of the request they retry.

use super::{queue, Failure, Gateway, Outcome, Reply, RequestCtx};
use super::{settle, stream};
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::h1::Method;
use crate::http::client::{self, Call, UpstreamError, UpstreamResponse};
use crate::http::deadline;
use crate::metrics::m;
use crate::translate::chat::{Chat, ChatContext};
use crate::translate::messages::Messages;
use crate::translate::responses::Responses;
use crate::translate::upstream_error::{map_upstream_error, UpstreamFailure};
use crate::translate::{
    malformed_stream, Format, ResponseContext, StreamTranslator, UpstreamRequest,
};
use crate::upstream::{block_hashes, ReplicaGuard};
use crate::usage::{usage_of_completion, Usage};
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use std::time::{Duration, Instant};

/// Largest non-streaming upstream body accepted.
const MAX_UPSTREAM_BODY: usize = 64 * 1024 * 1024;
/// Largest upstream error body read.
const MAX_ERROR_BODY: usize = 1024 * 1024;
/// How long a non-streaming upstream error body may take to arrive.
const ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Resolves when the client closes its connection (or sends bytes it should not).
pub(super) async fn client_gone(session: &mut ServerSession) {
    let _ = session.read_body_or_idle(true).await;
}

/// The client went away while the upstream had its request: counted, and billed for its input
/// (estimated at settlement, since the upstream's report never comes) and no output.
fn client_left(ctx: &mut RequestCtx) -> Failure {
    m().client_disconnects
        .with_label_values(&[ctx.route.as_str()])
        .inc();
    ctx.usage = Some(Usage::default());
    Failure::client_gone()
}

/// Consumes the request: once the upstream has answered nothing is resent, so its body (up to
/// the body limit; coding agents send hundreds of KiB) is freed here instead of living as long
/// as the response, and the names the response needs are moved, not copied. The terms it is
/// settled on go with them, for the `usage.cost` the answer writes (an unadmitted request,
/// which never gets here, would settle nothing: cost 0).
fn response_context(gw: &Gateway, ctx: &RequestCtx, req: UpstreamRequest) -> ResponseContext {
    let model = &gw.config.models[req.model];
    let charging = ctx
        .admitted
        .as_ref()
        .map(|a| settle::charging(a, req.model))
        .unwrap_or_default();
    ResponseContext {
        request_id: ctx.request_id.clone(),
        client_model: req.client_model,
        slug: model.slug.clone(),
        upstream_model: model.upstream_model.clone(),
        tool_name_map: req.tool_name_map,
        charging,
    }
}

/// What the chat format's answer is given: the client's usage wish, the configured reasoning
/// field.
fn chat_context(gw: &Gateway, base: ResponseContext, client_wants_usage: bool) -> ChatContext {
    ChatContext {
        base,
        client_wants_usage,
        reasoning: gw.config.streaming.chat_reasoning_field,
    }
}

/// The next replica for `req` not in `tried`: picked at once, or, for a scheduled model, the
/// slot its queue grants (`queue`). `Ok(None)`: no replica can take it.
async fn next_replica<'g>(
    gw: &'g Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    req: &UpstreamRequest,
    prompt_blocks: &[u64],
    tried: &mut Vec<usize>,
    place: &mut queue::Place,
) -> Result<Option<ReplicaGuard<'g>>, Failure> {
    let pool = &gw.pools[req.model];
    let Some(dispatcher) = pool.dispatcher.as_deref() else {
        return Ok(pool.pick(prompt_blocks, tried));
    };
    // A replica the queue chose that became unusable meanwhile is skipped like a failed one.
    while tried.len() < pool.replicas.len() {
        let granted = queue::slot(
            gw,
            session,
            ctx,
            pool,
            dispatcher,
            req,
            prompt_blocks,
            tried,
            place,
        )
        .await?;
        match granted {
            queue::Granted::Guard(guard) => return Ok(Some(guard)),
            queue::Granted::Unusable(i) => tried.push(i),
        }
    }
    Ok(None)
}

/// Picks replicas and sends until one answers (see the module docs for what is retried). The
/// deadline for the response header starts when the first attempt is sent (a wait in a
/// saturated model's queue does not eat it), and is returned for the rest of the phase.
async fn send<'g>(
    gw: &'g Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    req: &UpstreamRequest,
    prompt_blocks: &[u64],
) -> Result<(UpstreamResponse, ReplicaGuard<'g>, tokio::time::Instant), Failure> {
    let model = &gw.config.models[req.model];
    let pool = &gw.pools[req.model];
    let mut tried: Vec<usize> = Vec::new();
    let mut place = queue::Place::default();
    let mut phase_deadline = None;
    loop {
        let next =
            next_replica(gw, session, ctx, req, prompt_blocks, &mut tried, &mut place).await?;
        let Some(guard) = next else {
            let msg = if tried.is_empty() {
                format!(
                    "no healthy replica serves `{}` right now; retry shortly",
                    model.slug
                )
            } else {
                format!("every replica of `{}` failed; retry shortly", model.slug)
            };
            return Err(Failure::new(
                Outcome::UpstreamUnavailable,
                ApiError::new(ErrorKind::Overloaded { retry_after: 1 }, msg),
            ));
        };
        if !tried.is_empty() {
            m().upstream_retries.with_label_values(&[&model.slug]).inc();
        }
        ctx.upstream.attempts += 1;
        ctx.upstream.replica = Some(guard.index);
        // One deadline for the phase that ends with the first body byte (stream) or with the
        // whole body (non-stream), from the first attempt; see the module docs.
        let header_deadline = *phase_deadline.get_or_insert_with(|| {
            let now = tokio::time::Instant::now();
            if req.stream {
                deadline(now, model.timeouts.first_byte)
            } else {
                deadline(now, model.timeouts.request)
            }
        });
        let target = guard.target();
        let call = Call {
            method: Method::Post,
            target,
            timeouts: &model.timeouts,
            path: guard.replica().chat_path(),
            body: &req.body,
            request_id: &ctx.request_id,
            api_key: model.upstream_api_key.as_deref(),
            header_deadline,
        };
        let started = Instant::now();
        let result = tokio::select! {
            r = client::send(&gw.connector, &call) => r,
            _ = client_gone(session) => {
                ctx.upstream.time += started.elapsed();
                // The upstream has the request (a non-streamed answer's header comes with its
                // body): bill its input, estimated, as a stream cut before its first chunk is.
                return Err(client_left(ctx));
            }
        };
        ctx.upstream.time += started.elapsed();
        match result {
            Ok(resp) if resp.status == 503 => {
                guard.failed("status_503");
                let retry_after = resp.retry_after;
                tried.push(guard.index);
                drop(guard);
                drop(resp);
                if tried.len() >= pool.replicas.len() {
                    return Err(Failure::new(
                        Outcome::UpstreamUnavailable,
                        ApiError::new(
                            ErrorKind::Overloaded {
                                retry_after: retry_after.unwrap_or(1),
                            },
                            format!("`{}` is overloaded; retry shortly", model.slug),
                        ),
                    ));
                }
            }
            Ok(resp) => return Ok((resp, guard, header_deadline)),
            Err(UpstreamError::Timeout) => {
                // Not a replica failure: a slow first byte is usually a long queue, and
                // ejecting would push the load onto the others. Health checks catch hung ones.
                return Err(Failure::new(
                    Outcome::Timeout,
                    ApiError::new(
                        ErrorKind::UpstreamTimeout,
                        format!("`{}` did not start answering in time", model.slug),
                    ),
                ));
            }
            Err(e) => {
                // A certificate that does not verify is the operator's to fix, not a passing
                // fault: say so plainly.
                let tls = guard.replica().tls;
                let hint = match e {
                    UpstreamError::Tls(_) => " (check the model's upstream_tls: CA bundle, server name, client certificate)",
                    // TLS 1.3 reports a refused client certificate after the handshake.
                    UpstreamError::Reset(_) if tls => " (an https:// replica that closes at once may require a client certificate: upstream_tls.client_cert)",
                    _ => "",
                };
                log::warn!(
                    "request {} to {} failed before any response: {e}{hint}",
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
) -> Reply {
    let model = &gw.config.models[req.model];
    let pool = &gw.pools[req.model];
    let blocks = if pool.uses_affinity() {
        block_hashes(&req.body[req.prompt_range.clone()])
    } else {
        Vec::new()
    };
    let (mut resp, guard, phase_deadline) = match send(gw, session, ctx, &req, &blocks).await {
        Ok(sent) => sent,
        Err(f) => return f.into(),
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
        return Failure::new(Outcome::UpstreamError, e).into();
    }
    guard.succeeded();
    let (streaming, wants_usage) = (req.stream, req.client_wants_usage);
    drop(blocks);
    let rctx = response_context(gw, ctx, req);
    if streaming {
        let translator: Box<dyn StreamTranslator> = match ctx.format {
            ClientFormat::Chat => Box::new(Chat::stream(chat_context(gw, rctx, wants_usage))),
            ClientFormat::Messages => Box::new(Messages::stream(rctx)),
            ClientFormat::Responses => match ctx.responses.as_ref() {
                Some(turn) => Box::new(Responses::stream(turn.context(rctx))),
                None => return missing_turn(gw, resp),
            },
        };
        return stream::relay(gw, session, ctx, resp, translator, phase_deadline).await;
    }
    let started = Instant::now();
    let read = tokio::select! {
        r = resp.read_all_by(MAX_UPSTREAM_BODY, phase_deadline) => Some(r),
        _ = client_gone(session) => None,
    };
    ctx.upstream.time += started.elapsed();
    let body = match read {
        Some(Ok(body)) => body,
        None => {
            resp.finish(&gw.connector);
            // The upstream accepted the request and worked on it until the cancel; its report
            // never comes. Bill the input (estimated at settlement), no output: nothing was
            // delivered.
            return client_left(ctx).into();
        }
        Some(Err(e)) => {
            resp.finish(&gw.connector);
            let error = match e {
                UpstreamError::Timeout => ApiError::new(
                    ErrorKind::UpstreamTimeout,
                    format!("`{}` did not finish in time", model.slug),
                ),
                e => malformed_stream(&e.to_string()),
            };
            return Failure::new(Outcome::UpstreamError, error).into();
        }
    };
    resp.finish(&gw.connector);
    let translated = match ctx.format {
        ClientFormat::Chat => Chat::respond(&body, &chat_context(gw, rctx, wants_usage)),
        ClientFormat::Messages => Messages::respond(&body, &rctx),
        ClientFormat::Responses => match ctx.responses.as_mut() {
            Some(turn) => {
                let translated = Responses::respond(&body, &turn.context(rctx));
                if let (Ok((out, _)), true) = (&translated, turn.conversation.is_some()) {
                    turn.object = Some(out.clone());
                }
                translated
            }
            None => return Failure::new(Outcome::InternalError, super::internal_error()).into(),
        },
    };
    match translated {
        Ok((out, usage)) => {
            ctx.usage = Some(usage);
            Reply::Json(Bytes::from(out))
        }
        Err(e) => {
            // The tokens were spent even though the answer is unusable: bill them.
            ctx.usage = usage_of_completion(&body);
            Failure::new(Outcome::UpstreamError, e).into()
        }
    }
}

/// A Responses API request that reached the relay without its [`super::responses::Turn`]: a
/// bug, answered as one.
fn missing_turn(gw: &Gateway, resp: UpstreamResponse) -> Reply {
    log::error!("a Responses API request reached the relay without its turn");
    resp.finish(&gw.connector);
    Failure::new(Outcome::InternalError, super::internal_error()).into()
}
