//! The admin HTTP API: the operator commands over HTTP, on their own listener.
//!
//! Bound to loopback by default and only started when `server.admin_token` is set. Every
//! request needs `Authorization: Bearer <admin token>`, compared in constant time. Tenants
//! never see this listener: it shares nothing with the API listener but the store.
//!
//! | method | path | body / query | does |
//! |---|---|---|---|
//! | GET | `/admin/tenants` | | list tenants and balances |
//! | POST | `/admin/tenants` | `{"name"}` | create a tenant |
//! | GET | `/admin/keys` | `?tenant=` | list keys |
//! | POST | `/admin/keys` | `{"tenant", …settings}` | create a key (secret returned once); the settings below |
//! | PATCH | `/admin/keys/{id}` | settings | change a key's settings (absent: kept; `null`: cleared) |
//! | POST | `/admin/keys/{id}/rotate` | `{"grace"?: "24h"}` | a new secret with the same settings; the old one works until the grace ends |
//! | POST | `/admin/keys/{id}/revoke` | | revoke a key |
//! | PATCH | `/admin/tenants/{name}` | `{"weight"?, "monthly_cap"?, "time_zone"?, "low_balance"?}` | what governs a tenant |
//! | POST | `/admin/topups` | `{"tenant","amount","note"?,"idempotency_key"?}` | top up (amount as a decimal string; a repeated key adds nothing) |
//! | GET | `/admin/statement` | `?tenant=&from=&to=` | a statement |
//! | GET | `/admin/tenants/{name}/account` | `?utc_offset=` | the tenant's account, as its keys see it on `GET /v1/account` |
//! | GET | `/admin/tenants/{name}/usage` | `?from=&to=&utc_offset=&group_by=&limit=&cursor=` | its usage, as `GET /v1/usage` |
//! | GET | `/admin/tenants/{name}/keys` | `?limit=&cursor=` | its keys with their spend, as `GET /v1/keys` |
//! | GET | `/admin/tenants/{name}/requests` | `?limit=&cursor=` | its requests, newest first, as `GET /v1/requests` |
//! | GET | `/admin/tenants/{name}/topups` | `?limit=&cursor=` | its top-ups, newest first, as `GET /v1/topups` |
//!
//! A key's settings (`ops::KeyChange`): `label`, `rpm`, `tpm`, `models` (slugs, alias names or
//! globs), `budget` (`{"amount": "5.00", "period": "day"|"week"|"month"|"total"}`),
//! `expires_at` (RFC 3339), `disabled`, `manage` (it may manage its tenant's keys on
//! `/v1/keys`), `priority` (`interactive` or `batch`).
//!
//! The `/admin/tenants/{name}/…` routes answer exactly what the tenant's own keys get from the
//! account routes (`ops::account`, one implementation): the operator sees what the tenant sees.

use crate::account::page::Listing;
use crate::account::query::Query;
use crate::account::{self as params, UsageParams};
use crate::auth::{bearer_token, Bearer};
use crate::billing::Accounts;
use crate::config::Config;
use crate::error::ApiError;
use crate::keys::constant_time_eq;
use crate::ops::account::{self as view, Local};
use crate::ops::{self, OpsError, Output};
use crate::store::{now_ms, Store, TenantId};
use async_trait::async_trait;

mod keys;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde::Deserialize;
use std::sync::Arc;

/// Largest admin request body.
const MAX_BODY: usize = 64 * 1024;

pub struct AdminApp {
    store: Arc<dyn Store>,
    config: Arc<Config>,
    token: String,
    /// This replica's money in flight, for the account route.
    accounts: Arc<Accounts>,
}

impl AdminApp {
    pub fn new(
        store: Arc<dyn Store>,
        config: Arc<Config>,
        token: String,
        accounts: Arc<Accounts>,
    ) -> AdminApp {
        AdminApp {
            store,
            config,
            token,
            accounts,
        }
    }

    /// `/admin/tenants/{name}/{what}`: what the tenant's keys read on the account routes.
    async fn tenant_view(&self, name: &str, what: &str, q: &Query) -> http::Response<Vec<u8>> {
        let store = self.store.as_ref();
        let tenant: TenantId = match view::tenant_named(store, name).await {
            Ok(t) => t,
            Err(e) => return error(e.http_status(), e.message()),
        };
        let now = now_ms();
        let defaults = &self.config.limits;
        let bad = |e: ApiError| error(400, &e.message);
        let answer = match what {
            "account" => match params::account_params(q) {
                Ok(offset_ms) => {
                    let held = || self.accounts.view(tenant);
                    let local = Local {
                        replica: self.accounts.replica(),
                        held: &held,
                    };
                    value(view::account(store, tenant, None, local, defaults, offset_ms, now).await)
                }
                Err(e) => return bad(e),
            },
            "usage" => match UsageParams::parse(q, now) {
                Ok(p) => value(view::usage(store, tenant, &p).await),
                Err(e) => return bad(e),
            },
            "keys" => match params::list_params(q, Listing::Keys) {
                Ok(p) => value(view::keys(store, tenant, &p, defaults, now).await),
                Err(e) => return bad(e),
            },
            "requests" => match params::list_params(q, Listing::Requests) {
                Ok(p) => value(view::requests(store, tenant, &p).await),
                Err(e) => return bad(e),
            },
            "topups" => match params::list_params(q, Listing::TopUps) {
                Ok(p) => value(view::top_ups(store, tenant, &p).await),
                Err(e) => return bad(e),
            },
            _ => return error(404, "no such admin route"),
        };
        match answer {
            Ok(v) => reply(200, v),
            Err(e) => error(e.http_status(), e.message()),
        }
    }
}

fn value<T: serde::Serialize>(r: Result<T, OpsError>) -> Result<serde_json::Value, OpsError> {
    r.and_then(|v| {
        serde_json::to_value(v).map_err(|e| OpsError::Store(format!("cannot render: {e}")))
    })
}

#[derive(Deserialize)]
struct NewTenant {
    name: String,
}

#[derive(Deserialize)]
struct NewTopUp {
    tenant: String,
    amount: String,
    #[serde(default)]
    note: String,
    /// Makes a retried POST safe: the same key tops up once.
    #[serde(default)]
    idempotency_key: Option<String>,
}

fn reply(status: u16, body: serde_json::Value) -> http::Response<Vec<u8>> {
    let body = serde_json::to_vec(&body).unwrap_or_default();
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .body(body)
        .unwrap_or_default()
}

fn error(status: u16, message: &str) -> http::Response<Vec<u8>> {
    reply(status, serde_json::json!({"error": {"message": message}}))
}

async fn read_json<T: for<'de> Deserialize<'de>>(session: &mut ServerSession) -> Result<T, String> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BODY {
                    return Err("request body too large".into());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return Err(format!("cannot read the body: {e}")),
        }
    }
    serde_json::from_slice(&body).map_err(|e| format!("invalid JSON body: {e}"))
}

fn result(r: Result<Output, OpsError>, created: bool) -> http::Response<Vec<u8>> {
    match r {
        Ok(o) => reply(if created { 201 } else { 200 }, o.json),
        Err(e) => error(e.http_status(), e.message()),
    }
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        // Read exactly as the API listener reads a key (one header, `Bearer` in any case).
        let authorized = match bearer_token(&session.req_header().headers) {
            Bearer::Token(t) => constant_time_eq(t.as_bytes(), self.token.as_bytes()),
            Bearer::Absent | Bearer::Malformed | Bearer::Repeated => false,
        };
        if !authorized {
            return error(
                401,
                "admin token required: Authorization: Bearer <server.admin_token>",
            );
        }
        let method = session.req_header().method.clone();
        let path = session
            .req_header()
            .uri
            .path()
            .trim_end_matches('/')
            .to_owned();
        let query = Query::parse(session.req_header().uri.query().unwrap_or(""));
        let q = |name: &str| query.get(name).map(str::to_owned);
        let store = self.store.as_ref();
        match (method.as_str(), path.as_str()) {
            ("GET", "/admin/tenants") => result(
                ops::list_tenants(store).await.map(|r| Output::of(&r)),
                false,
            ),
            ("POST", "/admin/tenants") => match read_json::<NewTenant>(session).await {
                Ok(t) => result(
                    ops::create_tenant(store, &t.name)
                        .await
                        .map(|r| Output::of(&r)),
                    true,
                ),
                Err(e) => error(400, &e),
            },
            ("GET", "/admin/keys") => {
                let tenant = q("tenant");
                result(
                    ops::list_keys(store, tenant.as_deref())
                        .await
                        .map(|r| Output::of(&r)),
                    false,
                )
            }
            ("POST", "/admin/keys") => self.create_key(session).await,
            (_, p) if p.starts_with("/admin/keys/") => {
                let rest = p["/admin/keys/".len()..].to_owned();
                self.key_route(method.as_str(), &rest, session).await
            }
            ("PATCH", p) if p.starts_with("/admin/tenants/") => {
                let name = crate::account::query::decode(&p["/admin/tenants/".len()..]);
                match read_json::<ops::TenantChange>(session).await {
                    Ok(change) => result(
                        ops::update_tenant(store, &name, &change)
                            .await
                            .map(|r| Output::of(&r)),
                        false,
                    ),
                    Err(e) => error(400, &e),
                }
            }
            ("POST", "/admin/topups") => match read_json::<NewTopUp>(session).await {
                Ok(t) => {
                    let done = ops::top_up(
                        store,
                        &t.tenant,
                        &t.amount,
                        &t.note,
                        self.config.billing.min_top_up,
                        t.idempotency_key.as_deref(),
                    )
                    .await;
                    if done.is_ok() {
                        // Requests that found the balance all spent ask the store again.
                        if let Ok(Some(tenant)) = store.tenant_by_name(&t.tenant).await {
                            self.accounts.money_arrived(tenant.id);
                        }
                    }
                    result(done.map(|r| Output::of(&r)), true)
                }
                Err(e) => error(400, &e),
            },
            ("GET", "/admin/statement") => match q("tenant") {
                Some(tenant) => result(
                    ops::statement(store, &tenant, q("from").as_deref(), q("to").as_deref())
                        .await
                        .map(|r| Output::of(&r)),
                    false,
                ),
                None => error(400, "`tenant` query parameter required"),
            },
            ("GET", p) if p.starts_with("/admin/tenants/") => {
                let rest = &p["/admin/tenants/".len()..];
                match rest.split_once('/') {
                    Some((name, what)) if !name.is_empty() => {
                        let name = crate::account::query::decode(name);
                        self.tenant_view(&name, what, &query).await
                    }
                    _ => error(404, "no such admin route"),
                }
            }
            _ => error(404, "no such admin route"),
        }
    }
}
