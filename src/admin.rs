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
//! | POST | `/admin/keys` | `{"tenant","label"?,"rpm"?,"tpm"?}` | create a key (secret returned once) |
//! | POST | `/admin/keys/{id}/revoke` | | revoke a key |
//! | POST | `/admin/topups` | `{"tenant","amount","note"?,"idempotency_key"?}` | top up (amount as a decimal string; a repeated key adds nothing) |
//! | GET | `/admin/statement` | `?tenant=&from=&to=` | a statement |

use crate::auth::{bearer_token, Bearer};
use crate::config::Config;
use crate::keys::constant_time_eq;
use crate::ops::{self, OpsError, Output};
use crate::store::{KeyLimits, Store};
use async_trait::async_trait;
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
}

impl AdminApp {
    pub fn new(store: Arc<dyn Store>, config: Arc<Config>, token: String) -> AdminApp {
        AdminApp {
            store,
            config,
            token,
        }
    }
}

#[derive(Deserialize)]
struct NewTenant {
    name: String,
}

#[derive(Deserialize)]
struct NewKey {
    tenant: String,
    #[serde(default)]
    label: String,
    #[serde(default)]
    rpm: Option<u64>,
    #[serde(default)]
    tpm: Option<u64>,
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

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then_some(v)
    })
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Decodes `%XX` and `+` in a query value.
fn decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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
        let query = session.req_header().uri.query().unwrap_or("").to_owned();
        let q = |name: &str| query_param(&query, name).map(decode);
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
            ("POST", "/admin/keys") => match read_json::<NewKey>(session).await {
                Ok(k) => {
                    let limits = KeyLimits {
                        requests_per_minute: k.rpm,
                        tokens_per_minute: k.tpm,
                    };
                    result(
                        ops::create_key(store, &k.tenant, &k.label, limits)
                            .await
                            .map(|r| Output::of(&r)),
                        true,
                    )
                }
                Err(e) => error(400, &e),
            },
            ("POST", p) if p.starts_with("/admin/keys/") && p.ends_with("/revoke") => {
                let id = &p["/admin/keys/".len()..p.len() - "/revoke".len()];
                result(
                    ops::revoke_key(store, id).await.map(|r| Output::of(&r)),
                    false,
                )
            }
            ("POST", "/admin/topups") => match read_json::<NewTopUp>(session).await {
                Ok(t) => result(
                    ops::top_up(
                        store,
                        &t.tenant,
                        &t.amount,
                        &t.note,
                        self.config.billing.min_top_up,
                        t.idempotency_key.as_deref(),
                    )
                    .await
                    .map(|r| Output::of(&r)),
                    true,
                ),
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
            _ => error(404, "no such admin route"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        assert_eq!(
            query_param("tenant=acme&from=2026-01-01", "from"),
            Some("2026-01-01")
        );
        assert_eq!(decode("a%20b+c"), "a b c");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
        assert_eq!(decode("%C3%B1"), "ñ");
        assert_eq!(decode("%ñ1"), "%ñ1");
    }
}
