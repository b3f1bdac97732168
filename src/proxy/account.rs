//! The account routes — `GET /v1/account`, `/v1/usage`, `/v1/keys`, `/v1/requests`,
//! `/v1/topups` — answered to the tenant's own API key: its balance, what this replica holds
//! in flight, its usage and history. Read-only: they are neither metered nor billed, and never
//! touch a reservation. (A managing key's writes on `/v1/keys` are [`super::manage`]'s; they
//! share the authentication and the turns here.)
//!
//! The key is read as the API reads it (`Authorization: Bearer` or `x-api-key`, see `auth`);
//! a missing, unknown or revoked key is a 401 and every answer is about the key's own tenant
//! only. Errors come in the chat shape (`{"error": {…}}`), as on every `/v1` route of no format.
//!
//! Unlike the API routes these read the store (a few indexed queries, see `store::usage`), so
//! at most [`MAX_CONCURRENT`] run at once per replica; one that waits longer than
//! [`MAX_WAIT`] for its turn is answered `503` with `retry-after`, and the store keeps its
//! connections for the ledger and the leases. The JSON is built by `ops::account`, which the
//! admin API's `/admin/tenants/{name}/…` routes share.

use super::{Failure, Gateway, Outcome, Reply, RequestCtx};
use crate::account::page::Listing;
use crate::account::query::Query;
use crate::account::{self as params, UsageParams};
use crate::auth::Caller;
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::metrics::m;
use crate::ops::account::{self as view, Local};
use crate::ops::OpsError;
use crate::route::AccountRoute;
use crate::store::{now_ms, Store};
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};

/// Account queries one replica runs at once.
pub const MAX_CONCURRENT: usize = 4;
/// Longest a query waits for its turn before the client is told to retry.
pub const MAX_WAIT: Duration = Duration::from_secs(2);

/// What the account routes read from: the store, a few queries at a time.
pub struct AccountReads {
    pub(super) store: Arc<dyn Store>,
    pub(super) permits: Semaphore,
}

impl AccountReads {
    pub fn new(store: Arc<dyn Store>) -> AccountReads {
        AccountReads {
            store,
            permits: Semaphore::new(MAX_CONCURRENT),
        }
    }
}

/// A request's parameters, read before it waits for a turn (a bad one costs no query).
enum Ask {
    Account { offset_ms: i64 },
    Usage(UsageParams),
    Keys(params::page::PageParams),
    Requests(params::page::PageParams),
    TopUps(params::page::PageParams),
}

fn ask(route: AccountRoute, q: &Query, now: i64) -> Result<Ask, ApiError> {
    Ok(match route {
        AccountRoute::Account => Ask::Account {
            offset_ms: params::account_params(q)?,
        },
        AccountRoute::Usage => Ask::Usage(UsageParams::parse(q, now)?),
        AccountRoute::Keys => Ask::Keys(params::list_params(q, Listing::Keys)?),
        AccountRoute::Requests => Ask::Requests(params::list_params(q, Listing::Requests)?),
        AccountRoute::TopUps => Ask::TopUps(params::list_params(q, Listing::TopUps)?),
    })
}

/// Authenticates an account route's caller as the API does (a bearer token or `x-api-key`).
pub(super) fn authenticate(
    gw: &Gateway,
    session: &ServerSession,
    ctx: &mut RequestCtx,
) -> Result<Arc<Caller>, Reply> {
    match gw
        .keys
        .authenticate(&session.req_header().headers, ClientFormat::Messages)
    {
        Ok(c) => {
            ctx.caller = Some(c.clone());
            Ok(c)
        }
        Err(e) => {
            m().auth_failures
                .with_label_values(&[ctx.route.as_str()])
                .inc();
            Err(Failure::refused_unread(e).into())
        }
    }
}

impl AccountReads {
    /// The store the account routes read and the key writes go through.
    pub(super) fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    /// A turn to use the store: at most [`MAX_CONCURRENT`] at once; a `503` after
    /// [`MAX_WAIT`].
    pub(super) async fn turn(&self) -> Result<SemaphorePermit<'_>, Failure> {
        match tokio::time::timeout(MAX_WAIT, self.permits.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(Failure::refused_unread(ApiError::new(
                ErrorKind::Overloaded { retry_after: 1 },
                "too many account queries at once on this gateway; retry shortly",
            ))),
        }
    }
}

/// Answers an account route (`GET`; the writes of `/v1/keys` are [`super::manage`]'s).
pub async fn handle(
    gw: &Gateway,
    session: &mut ServerSession,
    ctx: &mut RequestCtx,
    route: AccountRoute,
) -> Reply {
    let method = &session.req_header().method;
    if route == AccountRoute::Keys && method != http::Method::GET && method != http::Method::HEAD {
        return super::manage::handle(gw, session, ctx).await;
    }
    let caller = match authenticate(gw, session, ctx) {
        Ok(c) => c,
        Err(reply) => return reply,
    };
    let header = session.req_header();
    let now = now_ms();
    let ask = match ask(route, &Query::parse(header.uri.query().unwrap_or("")), now) {
        Ok(a) => a,
        Err(e) => return Failure::refused_unread(e).into(),
    };
    let reads = &gw.account_reads;
    let _turn = match reads.turn().await {
        Ok(t) => t,
        Err(f) => return f.into(),
    };
    let store = reads.store.as_ref();
    let p = &caller.principal;
    let tenant = p.tenant_id;
    let defaults = &gw.config.limits;
    let body = match ask {
        Ask::Account { offset_ms } => {
            let held = || gw.accounts.view(tenant);
            let local = Local {
                replica: gw.accounts.replica(),
                held: &held,
            };
            view::account(
                store,
                tenant,
                Some(&p.key_id),
                local,
                defaults,
                offset_ms,
                now,
            )
            .await
            .and_then(json)
        }
        Ask::Usage(q) => view::usage(store, tenant, &q).await.and_then(json),
        Ask::Keys(q) => view::keys(store, tenant, &q, defaults, now)
            .await
            .and_then(json),
        Ask::Requests(q) => view::requests(store, tenant, &q).await.and_then(json),
        Ask::TopUps(q) => view::top_ups(store, tenant, &q).await.and_then(json),
    };
    match body {
        Ok(b) => Reply::Json(b),
        Err(e) => {
            log::error!(
                "request {}: {} of tenant {}: {e}",
                ctx.request_id,
                ctx.route.as_str(),
                p.tenant_name
            );
            let (outcome, error) = match e {
                OpsError::Store(_) => (
                    Outcome::InternalError,
                    ApiError::new(
                        ErrorKind::Overloaded { retry_after: 1 },
                        "the gateway cannot read the account right now (its store is unreachable); retry shortly",
                    ),
                ),
                OpsError::Invalid(m) => (Outcome::Refused, ApiError::invalid_body(m)),
                OpsError::NotFound(_) | OpsError::Conflict(_) | OpsError::Forbidden(_) => {
                    (Outcome::InternalError, super::internal_error())
                }
            };
            Failure::new(outcome, error).into()
        }
    }
}

fn json<T: serde::Serialize>(v: T) -> Result<Bytes, OpsError> {
    serde_json::to_vec(&v)
        .map(Bytes::from)
        .map_err(|e| OpsError::Store(format!("cannot render the answer: {e}")))
}
