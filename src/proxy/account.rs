//! The account routes — `GET /v1/account`, `/v1/usage`, `/v1/keys`, `/v1/requests`,
//! `/v1/topups` — answered to the tenant's own API key: its balance, what this replica holds
//! in flight, its usage and history. Read-only: they are neither metered nor billed, and never
//! touch a reservation.
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
use tokio::sync::Semaphore;

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

/// Answers an account route.
pub async fn handle(
    gw: &Gateway,
    session: &ServerSession,
    ctx: &mut RequestCtx,
    route: AccountRoute,
) -> Reply {
    let header = session.req_header();
    // The API's key rules: a bearer token or `x-api-key`.
    let caller = match gw
        .keys
        .authenticate(&header.headers, ClientFormat::Messages)
    {
        Ok(c) => c,
        Err(e) => {
            m().auth_failures
                .with_label_values(&[ctx.route.as_str()])
                .inc();
            return Failure::refused_unread(e).into();
        }
    };
    ctx.caller = Some(caller.clone());
    let now = now_ms();
    let ask = match ask(route, &Query::parse(header.uri.query().unwrap_or("")), now) {
        Ok(a) => a,
        Err(e) => return Failure::refused_unread(e).into(),
    };
    let reads = &gw.account_reads;
    let Ok(Ok(_turn)) = tokio::time::timeout(MAX_WAIT, reads.permits.acquire()).await else {
        return Failure::refused_unread(ApiError::new(
            ErrorKind::Overloaded { retry_after: 1 },
            "too many account queries at once on this gateway; retry shortly",
        ))
        .into();
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
        Ask::Keys(q) => view::keys(store, tenant, &q, defaults).await.and_then(json),
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
                OpsError::NotFound(_) | OpsError::Conflict(_) => {
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
