//! Waiting for a slot of a saturated model (one with `max_concurrency`; see
//! `upstream::dispatch` and the core's `schedule`).
//!
//! A request that finds every slot it may use taken waits here, in its tenant's queue, until
//! the scheduler dispatches it. Meanwhile:
//!
//! - **a client that hangs up** leaves the queue at once; the request never reached the
//!   upstream, so it is charged nothing and its reservation is released;
//! - **a streaming client** that has waited `scheduling.stream_head_after_ms` gets its `200`
//!   head and then the format's keep-alive every ping interval (an SSE comment; the messages
//!   format's `ping` event), so its own timeout does not fire; from then on every failure is an
//!   error event in the stream (see `Gateway::conclude`);
//! - **a refusal** (its tenant's queue is full, its wait passed `queue_timeout`: `429
//!   queue_full`; the pool's queue is full, or no replica it may use is up: `503`/`529`) is
//!   answered in the format's shape with `retry-after`, nothing charged.

use super::relay::client_gone;
use super::{respond, Failure, Gateway, Outcome, RequestCtx};
use crate::error::{ApiError, ErrorKind};
use crate::http::deadline;
use crate::schedule::{Millis, Priority, Refusal};
use crate::translate::{wire, UpstreamRequest};
use crate::upstream::dispatch::{Admission, Dispatcher};
use crate::upstream::{ModelPool, ReplicaGuard};
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use std::time::Instant;
use tokio::time::sleep_until;

/// `retry-after` for a tenant whose own queue is full or whose wait timed out.
const QUEUE_FULL_RETRY: u64 = 2;
/// `retry-after` for a pool whose whole queue is full.
const OVERLOADED_RETRY: u64 = 1;

/// What one request of a scheduled pool carries from one attempt to the next: when it first
/// arrived (a retry keeps its place in the fair order and its timeout).
#[derive(Debug, Default)]
pub(super) struct Place {
    arrived: Option<Millis>,
}

/// What the queue granted an attempt.
pub(super) enum Granted<'g> {
    /// Send on this replica (its slot is held with the guard).
    Guard(ReplicaGuard<'g>),
    /// The replica it chose became unusable meanwhile: the caller tries another.
    Unusable(usize),
}

/// The slot for the next attempt of `req` on `pool`, not on `exclude`; `Err` to answer the
/// client.
#[expect(
    clippy::too_many_arguments,
    reason = "the request path's pieces, passed through once"
)]
pub(super) async fn slot<'g>(
    gw: &'g Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    pool: &'g ModelPool,
    dispatcher: &'g Dispatcher,
    req: &UpstreamRequest,
    blocks: &[u64],
    exclude: &[usize],
    place: &mut Place,
) -> Result<Granted<'g>, Failure> {
    let tenant = ctx.caller.as_ref().map_or(0, |c| c.principal.tenant_id);
    let prompt = ctx.admitted.as_ref().map_or(0, |a| a.input_estimate);
    let size = req.prompt_size();
    let mut ticket = dispatcher.ticket(tenant, prompt, u64::from(size.max_tokens));
    if let Some(caller) = ctx.caller.as_ref() {
        ticket = ticket.weight(caller.principal.weight);
        if caller.principal.batch {
            ticket = ticket.priority(Priority::Batch);
        }
    }
    if let Some(at) = place.arrived {
        ticket.arrived = at;
    }
    place.arrived = Some(ticket.arrived);
    if let Some(i) = pool.preferred(blocks) {
        ticket = ticket.prefer(i);
    }
    let ticket = ticket.exclude(exclude.to_vec());
    let waiting_since = Instant::now();
    let slot = match dispatcher.enqueue(ticket) {
        Admission::Run(slot) => slot,
        Admission::Refused(r) => return Err(refused(&pool.slug, r)),
        Admission::Queued(mut queued) => {
            let granted = wait(gw, session, ctx, &mut queued).await;
            ctx.upstream.queued += waiting_since.elapsed();
            match granted {
                Ok(slot) => slot,
                Err(f) => return Err(f),
            }
        }
    };
    let index = slot.dispatch.replica;
    Ok(match pool.pick_at(slot, blocks) {
        Some(guard) => Granted::Guard(guard),
        None => Granted::Unusable(index),
    })
}

/// Waits for `queued`'s turn, watching the client and, for a stream, keeping it alive.
async fn wait<'g>(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    queued: &mut crate::upstream::dispatch::Queued<'g>,
) -> Result<crate::upstream::dispatch::Slot<'g>, Failure> {
    let scheduling = &gw.config.scheduling;
    let ping_every = gw.config.streaming.ping_interval;
    let mut next_beat = if ctx.head_sent {
        deadline(tokio::time::Instant::now(), ping_every)
    } else {
        deadline(tokio::time::Instant::now(), scheduling.stream_head_after)
    };
    let slug = ctx
        .model
        .map(|m| gw.config.models[m].slug.clone())
        .unwrap_or_default();
    loop {
        tokio::select! {
            biased;
            answer = queued.granted() => {
                return answer.map_err(|r| refused(&slug, r));
            }
            _ = client_gone(session) => {
                // It never reached the upstream: `usage` stays `None`, nothing is billed.
                return Err(Failure::client_gone());
            }
            _ = sleep_until(next_beat), if ctx.stream => {
                if keep_alive(session, ctx).await.is_err() {
                    return Err(Failure::client_gone());
                }
                next_beat = deadline(tokio::time::Instant::now(), ping_every);
            }
        }
    }
}

/// Sends the stream's head (once) and the format's keep-alive frame.
async fn keep_alive(session: &mut ServerSession, ctx: &mut RequestCtx) -> pingora::Result<()> {
    if !ctx.head_sent {
        respond::stream_header(session, &ctx.request_id).await?;
        ctx.head_sent = true;
    }
    let frame = Bytes::from_static(wire(ctx.format).keepalive);
    session.write_response_body(frame, false).await
}

/// The answer to a request the queue did not run (nothing was sent upstream: nothing billed).
fn refused(slug: &str, r: Refusal) -> Failure {
    let (outcome, kind, message) = match r {
        Refusal::TenantQueueFull => (
            Outcome::Refused,
            ErrorKind::QueueFull {
                retry_after: QUEUE_FULL_RETRY,
            },
            format!(
                "`{slug}` is saturated and this account already has as many requests waiting \
                 for it as it may; retry shortly"
            ),
        ),
        Refusal::Timeout => (
            Outcome::Refused,
            ErrorKind::QueueFull {
                retry_after: QUEUE_FULL_RETRY,
            },
            format!(
                "`{slug}` is saturated and this request waited too long for a slot; retry shortly"
            ),
        ),
        Refusal::ClusterOverloaded => (
            Outcome::UpstreamUnavailable,
            ErrorKind::Overloaded {
                retry_after: OVERLOADED_RETRY,
            },
            format!("`{slug}` is overloaded; retry shortly"),
        ),
        Refusal::NoReplica | Refusal::Duplicate => (
            Outcome::UpstreamUnavailable,
            ErrorKind::Overloaded {
                retry_after: OVERLOADED_RETRY,
            },
            format!("no healthy replica serves `{slug}` right now; retry shortly"),
        ),
    };
    Failure::new(outcome, ApiError::new(kind, message))
}
