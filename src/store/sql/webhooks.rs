//! The webhook statements both backends send (see `store::webhooks`): endpoints, the outbox,
//! deliveries and the expiring keys. The sender's lease is per backend (PostgreSQL uses its
//! own clock).

use super::Cols;
use super::{Sql, SqlValue};
use crate::store::sql_money::pen_from_text;
use crate::store::webhooks::WebhookEvent;
use crate::store::webhooks::{
    count_u32, status_u16, DeliveryInfo, DueDelivery, ExpiringKey, OutboxEvent, WebhookEndpoint,
};
use crate::store::StoreResult;
use crate::store::{StoreError, TenantId};
use quipu_core::money::Pen;

/// ($1 event id, $2 tenant, $3 type, $4 body, $5 created at): once per id; the values are
/// [`event_values`].
pub static INSERT_EVENT: Sql = Sql::text(
    "INSERT INTO webhook_outbox (event_id, tenant_id, kind, body, created_at)
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO NOTHING",
);

/// An outbox row's body: the event as the endpoints receive it.
pub fn event_body(event: &WebhookEvent) -> StoreResult<String> {
    let invalid =
        |e: &dyn std::fmt::Display| StoreError::Invalid(format!("webhook event {}: {e}", event.id));
    let body = event.to_json().map_err(|e| invalid(&e))?;
    String::from_utf8(body).map_err(|e| invalid(&e))
}

/// [`INSERT_EVENT`]'s values for `event` of `tenant`, `body` its [`event_body`].
pub fn event_values<'a>(
    event: &'a WebhookEvent,
    tenant: TenantId,
    body: &'a str,
) -> [SqlValue<'a>; 5] {
    [
        SqlValue::Text(&event.id),
        SqlValue::Int(tenant),
        SqlValue::Text(event.event.kind()),
        SqlValue::Text(body),
        SqlValue::Int(event.created.saturating_mul(1000)),
    ]
}

/// A tenant's name and `low_balance` threshold ([`name_and_threshold`]).
pub static TENANT_ALERT_RULES: Sql =
    Sql::text("SELECT name, low_balance FROM tenants WHERE id = $1");

pub fn name_and_threshold(c: &mut Cols<'_>) -> StoreResult<(String, Option<Pen>)> {
    let name = c.text()?;
    let low = c
        .opt_text()?
        .map(|t| pen_from_text(&t, "tenants.low_balance"))
        .transpose()?;
    Ok((name, low))
}

/// A tenant's name.
pub use super::tenants::TENANT_NAME;

pub static INSERT_ENDPOINT: Sql = Sql::text(
    "INSERT INTO webhook_endpoints (id, tenant_id, url, secret, events, created_at)
     VALUES ($1, $2, $3, $4, $5, $6)",
);

/// The endpoints not deleted, of tenant $1 or all when it is `NULL` ([`endpoint`]).
pub static ENDPOINTS: Sql = Sql::text(
    "SELECT id, tenant_id, url, secret, events, created_at FROM webhook_endpoints
      WHERE deleted_at IS NULL AND (CAST($1 AS BIGINT) IS NULL OR tenant_id = $1)
      ORDER BY created_at, id",
);

pub fn endpoint(c: &mut Cols<'_>) -> StoreResult<WebhookEndpoint> {
    Ok(WebhookEndpoint {
        id: c.text()?,
        tenant_id: c.int()?,
        url: c.text()?,
        secret: c.text()?,
        events: c.text()?,
        created_at: c.int()?,
    })
}

/// ($1 id, $2 tenant, $3 now).
pub static REMOVE_ENDPOINT: Sql = Sql::text(
    "UPDATE webhook_endpoints SET deleted_at = $3
      WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL",
);

/// At most $1 events not fanned out, oldest first ([`outbox_event`]).
pub static UNFANNED: Sql = Sql::text(
    "SELECT event_id, tenant_id, kind FROM webhook_outbox WHERE fanned = 0 ORDER BY seq LIMIT $1",
);

pub fn outbox_event(c: &mut Cols<'_>) -> StoreResult<OutboxEvent> {
    Ok(OutboxEvent {
        event_id: c.text()?,
        tenant_id: c.int()?,
        kind: c.text()?,
    })
}

/// ($1 event id, $2 endpoint, $3 due at).
pub static INSERT_DELIVERY: Sql = Sql::text(
    "INSERT INTO webhook_deliveries (event_id, endpoint, next_at) VALUES ($1, $2, $3)
     ON CONFLICT (event_id, endpoint) DO NOTHING",
);

pub static MARK_FANNED: Sql = Sql::text("UPDATE webhook_outbox SET fanned = 1 WHERE event_id = $1");

/// At most $2 pending deliveries due at $1 ([`due_delivery`]).
pub static DUE: Sql = Sql::text(
    "SELECT d.event_id, d.endpoint, d.attempts, o.tenant_id, o.kind, o.body
       FROM webhook_deliveries d JOIN webhook_outbox o ON o.event_id = d.event_id
      WHERE d.state = 'pending' AND d.next_at <= $1
      ORDER BY d.next_at, o.seq LIMIT $2",
);

pub fn due_delivery(c: &mut Cols<'_>) -> StoreResult<DueDelivery> {
    Ok(DueDelivery {
        event_id: c.text()?,
        endpoint: c.text()?,
        attempts: count_u32(c.int()?),
        tenant_id: c.int()?,
        kind: c.text()?,
        body: c.text()?,
    })
}

/// ($1 event, $2 endpoint, $3 state, $4 next at, $5 status, $6 error, $7 done at).
pub static ATTEMPTED: Sql = Sql::text(
    "UPDATE webhook_deliveries
        SET state = $3, attempts = attempts + 1, next_at = $4, last_status = $5,
            last_error = $6, done_at = $7
      WHERE event_id = $1 AND endpoint = $2 AND state = 'pending'",
);

pub static BACKLOG: Sql = Sql::text(
    "SELECT (SELECT COUNT(*) FROM webhook_deliveries WHERE state = 'pending'),
            (SELECT COUNT(*) FROM webhook_outbox WHERE fanned = 0)",
);

/// Deliveries of tenant $1's events, or all when it is `NULL` ([`delivery_info`]).
pub static DELIVERIES: Sql = Sql::text(
    "SELECT d.event_id, d.endpoint, o.kind, d.state, d.attempts, d.last_status, d.last_error
       FROM webhook_deliveries d JOIN webhook_outbox o ON o.event_id = d.event_id
      WHERE CAST($1 AS BIGINT) IS NULL OR o.tenant_id = $1
      ORDER BY o.seq, d.endpoint",
);

pub fn delivery_info(c: &mut Cols<'_>) -> StoreResult<DeliveryInfo> {
    Ok(DeliveryInfo {
        event_id: c.text()?,
        endpoint: c.text()?,
        kind: c.text()?,
        state: c.text()?,
        attempts: count_u32(c.int()?),
        last_status: status_u16(c.opt_int()?),
        last_error: c.opt_text()?,
    })
}

/// Usable keys expiring in ($1, $2] ([`expiring_key`]).
pub static EXPIRING_KEYS: Sql = Sql::text(
    "SELECT k.id, k.tenant_id, t.name, k.expires_at
       FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
      WHERE k.revoked_at IS NULL AND k.disabled = 0 AND k.rotated_to IS NULL
        AND k.expires_at > $1 AND k.expires_at <= $2
      ORDER BY k.expires_at, k.id",
);

pub fn expiring_key(c: &mut Cols<'_>) -> StoreResult<ExpiringKey> {
    Ok(ExpiringKey {
        key_id: c.text()?,
        tenant_id: c.int()?,
        tenant_name: c.text()?,
        expires_at: c.int()?,
    })
}

/// Finished deliveries done before $1.
pub static PRUNE_DELIVERIES: Sql =
    Sql::text("DELETE FROM webhook_deliveries WHERE state <> 'pending' AND done_at < $1");

/// Fanned-out events written before $1 with no delivery left.
pub static PRUNE_EVENTS: Sql = Sql::text(
    "DELETE FROM webhook_outbox
      WHERE fanned = 1 AND created_at < $1
        AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = webhook_outbox.event_id)",
);
