//! The API routes (`/v1/chat/completions`, `/v1/messages`, `/v1/messages/count_tokens`,
//! `/v1/responses`): capacity → format headers → auth → body → translate → rate limits →
//! admission (the quote reserved against the balance) → the upstream exchange
//! ([`super::relay`]). The stored-response routes stop after auth ([`super::responses`]).
//!
//! Every step that refuses returns a [`Failure`] saying why; nothing here writes a response
//! except the relay of a stream.

use super::ctx::{Admitted, Books};
use super::{body, count, relay, responses, Failure, Gateway, Outcome, Reply, RequestCtx};
use crate::billing::policy::{self, display::cost_text};
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::metrics::m;
use crate::money::Pen;
use crate::route::ApiRoute;
use crate::store::webhooks::{cap_events, WebhookEvent};
use crate::translate::chat::Chat;
use crate::translate::messages::Messages;
use crate::translate::{wire, Format, UpstreamRequest};
use pingora::protocols::http::ServerSession;
use quipu_core::governance::caps::{ActiveCap, CapRefusal};
use quipu_core::governance::webhooks::crossing::CapLevel;
use quipu_core::governance::webhooks::event::{Event, Soles};

/// Answers an API request.
pub async fn handle(gw: &Gateway, session: &mut ServerSession, ctx: &mut RequestCtx) -> Reply {
    match admit_and_relay(gw, session, ctx).await {
        Ok(reply) | Err(reply) => reply,
    }
}

/// The API flow; `Err` carries an early answer (a refusal), `Ok` the relay's.
async fn admit_and_relay(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
) -> Result<Reply, Reply> {
    let server = &gw.config.server;
    if gw.in_flight.load(std::sync::atomic::Ordering::Relaxed) > server.max_in_flight {
        return Err(Failure::refused_unread(ApiError::new(
            ErrorKind::Overloaded { retry_after: 1 },
            "the gateway is at capacity; retry shortly",
        ))
        .into());
    }
    check_format_headers(session, ctx.format)
        .map_err(|e| Reply::from(Failure::refused_unread(e)))?;
    let caller = gw
        .keys
        .authenticate(&session.req_header().headers, ctx.format)
        .map_err(|e| {
            m().auth_failures
                .with_label_values(&[ctx.route.as_str()])
                .inc();
            Reply::from(Failure::refused_unread(e))
        })?;
    ctx.caller = Some(caller.clone());
    if let Some(ApiRoute::Response | ApiRoute::ResponseInputItems) = ctx.route.api() {
        // A stored response: read or deleted, nothing sent upstream, nothing billed.
        return Ok(responses::stored(gw, session, ctx).await);
    }
    if !body::is_json(session) {
        return Err(Failure::refused_unread(ApiError::invalid_body(
            "the request body must be JSON (Content-Type: application/json)",
        ))
        .into());
    }
    let body = body::read(session, server).await.map_err(Reply::from)?;

    let translated = match ctx.route.api() {
        Some(ApiRoute::CountTokens) => {
            return Ok(count::count_tokens(gw, session, ctx, &body).await)
        }
        Some(ApiRoute::Chat) => Chat::to_upstream(&body, &gw.config, &ctx.request_id),
        Some(ApiRoute::Messages) => Messages::to_upstream(&body, &gw.config, &ctx.request_id),
        Some(ApiRoute::Responses) => responses::translate(gw, ctx, &body).await,
        Some(ApiRoute::Response | ApiRoute::ResponseInputItems) | None => {
            log::error!("route {} reached the API handler", ctx.route.as_str());
            return Err(Failure::new(Outcome::InternalError, super::internal_error()).into());
        }
    };
    let req: UpstreamRequest = translated.map_err(|e| Reply::from(Failure::refused(e)))?;
    drop(body);
    ctx.model = Some(req.model);
    ctx.stream = req.stream;
    admit(gw, ctx, &req).await.map_err(Reply::from)?;
    m().reservations_open.inc();
    let reply = relay::completion(gw, session, ctx, req).await;
    m().reservations_open.dec();
    Ok(reply)
}

/// The format's version headers ([`crate::translate::Wire::version_headers`]: the messages
/// format's `anthropic-version` / `compat-version`), when sent, are one date like
/// `2023-06-01`.
fn check_format_headers(session: &ServerSession, format: ClientFormat) -> Result<(), ApiError> {
    for &name in wire(format).version_headers {
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

/// Admission: the ledger can take more rows, the caller is within its rate limits, and its
/// tenant's balance covers the request's quote, which is reserved.
async fn admit(gw: &Gateway, ctx: &mut RequestCtx, req: &UpstreamRequest) -> Result<(), Failure> {
    if gw.ledger.backlogged() {
        // The store has been unreachable long enough for store.max_unstored_rows rows to
        // queue: admitting more would put money at risk that no ledger holds yet.
        return Err(Failure::refused(ApiError::new(
            ErrorKind::Overloaded { retry_after: 5 },
            "the gateway cannot record charges right now (its billing store is unreachable); retry shortly",
        )));
    }
    let Some(caller) = ctx.caller.clone() else {
        return Err(Failure::new(
            Outcome::InternalError,
            super::internal_error(),
        ));
    };
    let model = &gw.config.models[req.model];
    if let Some(allowed) = &caller.principal.models {
        allowed.check(&req.client_model, &model.slug).map_err(|e| {
            Failure::refused(ApiError::new(ErrorKind::PermissionDenied, e.to_string()))
        })?;
    }
    rate_limit(gw, &caller).await?;
    let quote = policy::quote(req.prompt_size(), model.context_window, &model.prices);
    let p = &caller.principal;
    let holder = crate::billing::caps::CapHolder {
        tenant: p.tenant_id,
        key_id: &p.key_id,
        rules: &p.rules,
        tenant_rules: &p.tenant_rules,
    };
    // The clock is read only for a request with caps to count (most have none).
    let now = holder
        .has_caps()
        .then(crate::billing::caps::period_clock_ms);
    let prepared = match now {
        Some(now) => caller.caps.get(holder, now).map_err(|e| {
            log::error!(
                "the cap periods of tenant {} cannot be counted: {e}",
                p.tenant_name
            );
            Failure::new(Outcome::InternalError, super::internal_error())
        })?,
        None => None,
    };
    let claims = prepared.as_ref().map_or(&[][..], |c| &c.claims[..]);
    match gw
        .accounts
        .reserve_with_caps(p.tenant_id, quote.worst, claims)
        .await
    {
        Ok(reservation) => {
            // All or nothing: a reservation holds every cap in force.
            let caps = prepared.as_ref().map_or_else(Vec::new, |c| c.ids.clone());
            ctx.admitted = Some(Admitted {
                reservation,
                input_estimate: quote.input_estimate,
                caps,
                books: Books {
                    config: gw.config.clone(),
                    accounts: gw.accounts.clone(),
                    ledger: gw.ledger.clone(),
                },
            });
            Ok(())
        }
        Err(crate::billing::Refusal::CapReached { index, available }) => {
            let found = prepared
                .as_ref()
                .and_then(|c| Some((c.actives.get(index)?, c.claims.get(index)?)));
            let (Some((active, claim)), Some(now)) = (found, now) else {
                return Err(Failure::new(
                    Outcome::InternalError,
                    super::internal_error(),
                ));
            };
            let worst = quote.worst;
            Err(cap_reached(gw, p, (*active, claim), available, worst, now))
        }
        Err(crate::billing::Refusal::Insufficient { needed, available }) => {
            m().billing_refused
                .with_label_values(&[&p.tenant_name])
                .inc();
            Err(Failure::refused(ApiError::new(
                ErrorKind::InsufficientBalance,
                format!(
                    "insufficient balance: this request may cost up to {} and {} is available; top up to continue",
                    cost_text(needed),
                    available.format_soles()
                ),
            )))
        }
        Err(crate::billing::Refusal::StoreUnavailable(detail)) => {
            log::error!("admission failed, store unavailable: {detail}");
            Err(Failure::refused(ApiError::new(
                ErrorKind::Overloaded { retry_after: 1 },
                "the gateway cannot verify the balance right now; retry shortly",
            )))
        }
    }
}

/// The refusal of a request by a cap with `available` left: 429 until the period ends (402 for
/// a `total` cap), naming the cap; counted, and told to the tenant's webhooks once per period
/// (`cap.reached_100`, see `Accounts::cap_refused`).
fn cap_reached(
    gw: &Gateway,
    p: &crate::auth::Principal,
    (active, claim): (ActiveCap, &crate::billing::CapClaim),
    available: crate::money::Pen,
    worst: crate::money::Pen,
    now: i64,
) -> Failure {
    let refusal = CapRefusal::reached(active, available, worst, p.tenant_rules.zone, now);
    m().cap_refused
        .with_label_values(&[&p.tenant_name, active.owner.as_str()])
        .inc();
    // Spending may stop short of 100 % (see `Accounts::cap_refused`): a cap 80 % spent or held
    // that refuses a request has been reached; a single request too big for a cap that has
    // room is not.
    let spent_or_held = active.cap.amount - available;
    if CapLevel::Percent80.reached(active.cap.amount, spent_or_held) {
        if let Some(Event::CapReached100(mut reached)) =
            cap_events(&claim.pool, active.cap.amount, Pen::ZERO, active.cap.amount).pop()
        {
            reached.spent = Soles(spent_or_held);
            let event = WebhookEvent::new(&p.tenant_name, now, Event::CapReached100(reached));
            gw.accounts.cap_refused(&claim.pool, event);
        }
    }
    Failure::refused(ApiError::new(
        ErrorKind::BudgetExceeded {
            retry_after: refusal.retry_after,
        },
        refusal.to_string(),
    ))
}

/// Counts the request against its key's and tenant's rate limits (in memory; see `ratelimit`
/// for the one case a request waits for the store).
pub async fn rate_limit(gw: &Gateway, caller: &crate::auth::Caller) -> Result<(), Failure> {
    let p = &caller.principal;
    gw.limits
        .admit(&p.limits, &caller.windows)
        .await
        .map_err(|l| {
            let (scope, limit): (&str, &str) = (l.scope.into(), l.limit.into());
            m().rate_limited
                .with_label_values(&[&p.tenant_name, scope, limit])
                .inc();
            Failure::refused(ApiError::new(
                ErrorKind::RateLimited {
                    retry_after: l.retry_after,
                },
                format!(
                    "rate limit reached: {limit} per minute for this {scope}; retry in {} s",
                    l.retry_after
                ),
            ))
        })
}
