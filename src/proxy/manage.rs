//! A managing key's writes on `/v1/keys` (tenant self-service):
//!
//! | method | path | body | answer |
//! |---|---|---|---|
//! | POST | `/v1/keys` | settings | the new key, its secret shown once |
//! | PATCH | `/v1/keys/{id}` | settings (absent: kept; `null`: cleared) | the key as it is now |
//! | DELETE | `/v1/keys/{id}` | | `{"key_id", "revoked_now"}` |
//! | POST | `/v1/keys/{id}/rotate` | `{"grace"?: "24h"}` | the new key; the old one works until the grace ends |
//!
//! The settings are the operator's (`ops::KeyChange`: `label`, `rpm`, `tpm`, `models`,
//! `budget`, `expires_at`, `disabled`, `priority`), never `manage` nor `tenant`; what they may
//! be, and which keys a managing key may touch, is `ops::self_service`. A key without the
//! `manage` scope is refused before its body is read (`403 permission_error`); a key of
//! another tenant or an unknown id is `404 not_found_error`; beyond the managing key's or the
//! operator's limits is `403` naming the limit. Errors come in the chat shape, like every
//! account route.
//!
//! The writes go through the store, off the API path, in the account routes' turns (see
//! [`super::account`]); after one, this replica reloads its key snapshot at once (the others
//! within `store.key_refresh`, as after an operator's write), so a revoked key stops here
//! before the answer is sent.

use super::account::authenticate;
use super::{body, Failure, Gateway, Outcome, Reply, RequestCtx};
use crate::error::{ApiError, ErrorKind};
use crate::governance::models::Catalog;
use crate::ops::self_service::{self, Manager};
use crate::ops::{parse_grace, KeyChange, OpsError};
use crate::route::key_path;
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use serde::Deserialize;

/// `POST /v1/keys/{id}/rotate`'s body.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Rotate {
    /// `24h`, `90m`, `7d`; none: the old secret stops at once.
    #[serde(default)]
    grace: Option<String>,
}

/// Which write a request is.
enum Write {
    Create,
    Update(String),
    Revoke(String),
    Rotate(String),
}

fn write_of(method: &http::Method, path: &str) -> Option<Write> {
    let target = key_path(path);
    match (method.as_str(), target) {
        ("POST", None) => Some(Write::Create),
        ("PATCH", Some((id, false))) => Some(Write::Update(id.to_owned())),
        ("DELETE", Some((id, false))) => Some(Write::Revoke(id.to_owned())),
        ("POST", Some((id, true))) => Some(Write::Rotate(id.to_owned())),
        _ => None,
    }
}

/// Answers a write on `/v1/keys`.
pub async fn handle(gw: &Gateway, session: &mut ServerSession, ctx: &mut RequestCtx) -> Reply {
    let caller = match authenticate(gw, session, ctx) {
        Ok(c) => c,
        Err(reply) => return reply,
    };
    let p = &caller.principal;
    if !p.rules.manage {
        return Failure::refused_unread(ApiError::new(
            ErrorKind::Forbidden,
            "this key may not manage keys: only a key with the manage scope may create, change, \
             rotate or revoke keys (the operator gives it)",
        ))
        .into();
    }
    let header = session.req_header();
    let Some(write) = write_of(&header.method, header.uri.path()) else {
        return Failure::refused_unread(ApiError::new(
            ErrorKind::MethodNotAllowed,
            format!("{} is not allowed on {}", header.method, header.uri.path()),
        ))
        .into();
    };
    let body = match body::read(session, &gw.config.server).await {
        Ok(b) => b,
        Err(f) => return f.into(),
    };
    let turn = match gw.account_reads.turn().await {
        Ok(t) => t,
        Err(f) => return f.into(),
    };
    let store = gw.account_reads.store();
    let catalog = Catalog::of(&gw.config);
    let me = Manager {
        key_id: &p.key_id,
        tenant: p.tenant_id,
    };
    let done = match &write {
        Write::Create => match settings(&body) {
            Ok(change) => json(self_service::create(store, &catalog, me, &change).await),
            Err(e) => Err(e),
        },
        Write::Update(id) => match settings(&body) {
            Ok(change) => json(self_service::update(store, &catalog, me, id, &change).await),
            Err(e) => Err(e),
        },
        Write::Revoke(id) => json(self_service::revoke(store, &catalog, me, id).await),
        Write::Rotate(id) => match grace(&body) {
            Ok(ms) => json(self_service::rotate(store, &catalog, me, id, ms).await),
            Err(e) => Err(e),
        },
    };
    let answer = match done {
        Ok(b) => b,
        Err(e) => return failed(e),
    };
    // This replica serves the change before it answers; the others at their next refresh.
    if let Err(e) = gw.keys.refresh(store).await {
        log::warn!("API key refresh after a key write failed (the next one retries): {e}");
    }
    drop(turn);
    log::info!(
        "request {}: key {} of tenant {} {}",
        ctx.request_id,
        p.key_id,
        p.tenant_name,
        match &write {
            Write::Create => "created a key".to_owned(),
            Write::Update(id) => format!("changed key {id}"),
            Write::Revoke(id) => format!("revoked key {id}"),
            Write::Rotate(id) => format!("rotated key {id}"),
        }
    );
    Reply::Json(answer)
}

/// A key's settings: a JSON object of [`KeyChange`]'s fields.
fn settings(body: &[u8]) -> Result<KeyChange, OpsError> {
    serde_json::from_slice(body)
        .map_err(|e| OpsError::Invalid(format!("invalid key settings: {e}")))
}

/// The rotation's grace in milliseconds (an empty body: none).
fn grace(body: &[u8]) -> Result<i64, OpsError> {
    let r: Rotate = if body.iter().all(u8::is_ascii_whitespace) {
        Rotate::default()
    } else {
        serde_json::from_slice(body).map_err(|e| OpsError::Invalid(format!("invalid body: {e}")))?
    };
    r.grace.as_deref().map_or(Ok(0), parse_grace)
}

fn json<T: serde::Serialize>(r: Result<T, OpsError>) -> Result<Bytes, OpsError> {
    r.and_then(|v| {
        serde_json::to_vec(&v)
            .map(Bytes::from)
            .map_err(|e| OpsError::Store(format!("cannot render the answer: {e}")))
    })
}

/// An operation's failure as the tenant is told it.
fn failed(e: OpsError) -> Reply {
    let (outcome, error) = match e {
        OpsError::Forbidden(m) => (Outcome::Refused, ApiError::new(ErrorKind::Forbidden, m)),
        OpsError::NotFound(m) => (Outcome::Refused, ApiError::new(ErrorKind::KeyNotFound, m)),
        OpsError::Invalid(m) => (Outcome::Refused, ApiError::invalid_body(m)),
        OpsError::Store(m) => {
            log::error!("a key write failed: {m}");
            (
                Outcome::InternalError,
                ApiError::new(
                    ErrorKind::Overloaded { retry_after: 1 },
                    "the gateway cannot write to its store right now; retry shortly",
                ),
            )
        }
        OpsError::Conflict(m) => {
            log::error!("a key write failed: {m}");
            (Outcome::InternalError, super::internal_error())
        }
    };
    Failure::new(outcome, error).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_read_from_the_method_and_path() {
        let w = |m: &str, p: &str| write_of(&m.parse().unwrap(), p);
        assert!(matches!(w("POST", "/v1/keys"), Some(Write::Create)));
        assert!(matches!(w("PATCH", "/v1/keys/key_1"), Some(Write::Update(id)) if id == "key_1"));
        assert!(matches!(w("DELETE", "/v1/keys/key_1/"), Some(Write::Revoke(id)) if id == "key_1"));
        assert!(
            matches!(w("POST", "/v1/keys/key_1/rotate"), Some(Write::Rotate(id)) if id == "key_1")
        );
        assert!(w("PATCH", "/v1/keys").is_none());
    }

    #[test]
    fn bodies_are_read_strictly() {
        assert_eq!(grace(b"").unwrap(), 0);
        assert_eq!(grace(br#"{"grace": "24h"}"#).unwrap(), 86_400_000);
        assert!(grace(br#"{"grace": "soon"}"#).is_err());
        assert!(settings(br#"{"tenant": "other"}"#).is_err());
        assert!(settings(br#"{"budget": {"amount": "1.00", "period": "day"}}"#).is_ok());
    }
}
