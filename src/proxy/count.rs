//! `POST /v1/messages/count_tokens`: the prompt, translated as a create request's would be,
//! counted by a replica's own tokenizer. How each server counts is planned by
//! [`crate::upstream_profile::count`]; this drives the calls, with failover on connect errors,
//! and detects a replica's server first when its model says `server = "auto"`.
//!
//! The whole exchange, failovers and detection included, has the model's `first_byte_ms`.

use super::relay::client_gone;
use super::{Failure, Gateway, Outcome, Reply, RequestCtx};
use crate::config::{Model, ModelId};
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::h1::Method;
use crate::http::client::{self, Call, Target, UpstreamError};
use crate::http::deadline;
use crate::metrics::m;
use crate::translate::malformed_stream;
use crate::translate::messages;
use crate::translate::upstream_error::{map_upstream_error, UpstreamFailure};
use crate::upstream::ModelPool;
use crate::upstream_profile::count::{CountError, Next, PromptCount};
use crate::upstream_profile::{Server, ServerChoice};
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use std::time::Instant;
use tokio::time::Instant as Deadline;

/// Largest tokenizer answer read (llama.cpp's lists every token id).
const MAX_ANSWER: usize = 4 * 1024 * 1024;
/// Largest `/v1/models` answer read when detecting a server.
const MAX_MODELS: usize = 256 * 1024;

/// Answers a count-tokens request.
pub async fn count_tokens(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    body: &[u8],
) -> Reply {
    let (model, chat_body) = match messages::count_tokens_to_upstream(body, &gw.config) {
        Ok(r) => r,
        Err(e) => return Failure::refused(e).into(),
    };
    ctx.model = Some(model);
    let Some(caller) = ctx.caller.clone() else {
        return Failure::new(Outcome::InternalError, super::internal_error()).into();
    };
    if let Err(f) = super::api::rate_limit(gw, &caller).await {
        return f.into();
    }
    let by = deadline(Deadline::now(), gw.config.models[model].timeouts.first_byte);
    let started = Instant::now();
    let result = tokio::select! {
        r = count(gw, ctx, model, chat_body, by) => Some(r),
        _ = client_gone(session) => None,
    };
    ctx.upstream.time += started.elapsed();
    match result {
        Some(Ok(n)) => {
            let mut out = Vec::with_capacity(32);
            out.extend_from_slice(b"{\"input_tokens\":");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.push(b'}');
            Reply::Json(Bytes::from(out))
        }
        Some(Err(f)) => f.into(),
        None => {
            m().client_disconnects
                .with_label_values(&[ctx.route.as_str()])
                .inc();
            Failure::client_gone().into()
        }
    }
}

/// Counts on the first replica that answers.
async fn count(
    gw: &Gateway,
    ctx: &mut RequestCtx,
    model_id: ModelId,
    chat_body: Vec<u8>,
    by: Deadline,
) -> Result<u64, Failure> {
    let model = &gw.config.models[model_id];
    let pool = &gw.pools[model_id];
    let mut tried = Vec::new();
    loop {
        let guard = pool.pick(&[], &tried).ok_or_else(|| {
            Failure::new(
                Outcome::UpstreamUnavailable,
                ApiError::new(
                    ErrorKind::Overloaded { retry_after: 1 },
                    format!("no healthy replica serves `{}` right now", model.slug),
                ),
            )
        })?;
        ctx.upstream.attempts += 1;
        ctx.upstream.replica = Some(guard.index);
        let replica = guard.replica();
        let target = guard.target();
        let server = server_of(gw, ctx, pool, guard.index, model, by).await;
        let (mut plan, mut call) = PromptCount::start(
            server,
            &replica.api_base,
            model.tokenize_path.as_deref(),
            chat_body.clone(),
        );
        let mut first = true;
        loop {
            let answer = post(gw, ctx, model, target, &call, by).await;
            let (status, body) = match answer {
                Ok(a) => a,
                Err(UpstreamError::Timeout) => return Err(timed_out()),
                // Nothing answered yet on this replica: another may.
                Err(e) if first && !matches!(e, UpstreamError::Framing(_)) => {
                    guard.failed(e.kind());
                    tried.push(guard.index);
                    break;
                }
                Err(e) => {
                    return Err(Failure::new(
                        Outcome::UpstreamError,
                        malformed_stream(&e.to_string()),
                    ))
                }
            };
            first = false;
            match plan.answer(status, &body) {
                Next::Send(next) => call = next,
                Next::Counted(n) => {
                    guard.succeeded();
                    return Ok(n);
                }
                Next::Failed(e) => return Err(count_failed(model, server, e, &guard)),
            }
        }
    }
}

/// The server a replica runs: configured, detected earlier, or detected now (vLLM when it
/// cannot be told; see `upstream_profile`).
async fn server_of(
    gw: &Gateway,
    ctx: &RequestCtx,
    pool: &ModelPool,
    index: usize,
    model: &Model,
    by: Deadline,
) -> Server {
    if let ServerChoice::Known(s) = model.server {
        return s;
    }
    if let Some(s) = pool.detected_server(index) {
        return s;
    }
    let replica = &pool.replicas[index].replica;
    let models_path = format!("{}/models", replica.api_base);
    let Ok(target) = pool.target(index) else {
        return Server::Vllm;
    };
    let call = client::Call {
        method: Method::Get,
        target,
        timeouts: &model.timeouts,
        path: &models_path,
        body: &[],
        request_id: &ctx.request_id,
        api_key: model.upstream_api_key.as_deref(),
        header_deadline: by,
    };
    let detected = match client::send(&gw.connector, &call).await {
        Ok(mut resp) => {
            let ok = resp.status == 200;
            let body = resp.read_all_by(MAX_MODELS, by).await;
            resp.finish(&gw.connector);
            match body {
                Ok(b) if ok => Server::detect(&b),
                _ => None,
            }
        }
        Err(_) => None,
    };
    match detected {
        Some(s) => {
            pool.set_detected_server(index, s);
            s
        }
        None => {
            log::debug!(
                "could not tell which server replica {} of {} runs; assuming vLLM",
                replica.url,
                model.slug
            );
            Server::Vllm
        }
    }
}

/// One call of the exchange; returns the status and the body.
async fn post(
    gw: &Gateway,
    ctx: &RequestCtx,
    model: &Model,
    target: Target<'_>,
    call: &crate::upstream_profile::count::Call,
    by: Deadline,
) -> Result<(u16, Bytes), UpstreamError> {
    let c = Call {
        method: Method::Post,
        target,
        timeouts: &model.timeouts,
        path: &call.path,
        body: &call.body,
        request_id: &ctx.request_id,
        api_key: model.upstream_api_key.as_deref(),
        header_deadline: by,
    };
    let mut resp = client::send(&gw.connector, &c).await?;
    let status = resp.status;
    let body = resp.read_all_by(MAX_ANSWER, by).await;
    resp.finish(&gw.connector);
    Ok((status, body?))
}

fn timed_out() -> Failure {
    Failure::new(
        Outcome::Timeout,
        ApiError::new(
            ErrorKind::UpstreamTimeout,
            "the tokenizer did not answer in time",
        ),
    )
}

/// A count the server could not make, in the messages format.
fn count_failed(
    model: &Model,
    server: Server,
    e: CountError,
    guard: &crate::upstream::ReplicaGuard<'_>,
) -> Failure {
    let error = match e {
        CountError::Unsupported(why) => ApiError::new(
            ErrorKind::TokenizerUnavailable,
            format!("`{}` cannot count tokens: {why}", model.slug),
        ),
        CountError::Malformed(what) => malformed_stream(what),
        CountError::Upstream { status, body } => {
            if status >= 500 {
                guard.failed(&format!("status_{status}"));
            }
            log::debug!("{server} refused a token count with {status}");
            map_upstream_error(
                &UpstreamFailure {
                    status,
                    body: &body,
                    retry_after: None,
                    upstream_model: &model.upstream_model,
                    slug: &model.slug,
                },
                ClientFormat::Messages,
            )
        }
    };
    Failure::new(Outcome::UpstreamError, error)
}
