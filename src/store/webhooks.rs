//! Alerts as webhooks, as the store keeps them ([`WebhookStore`]): the endpoints tenants
//! register, the **outbox** of events, one delivery row per event and endpoint, and which
//! replica sends.
//!
//! **Written with the change that caused it.** An event is a row of `webhook_outbox`, inserted
//! in the same transaction as its cause, so a committed change always has its event and a
//! rolled-back one never does:
//! - `topup.received`: the top-up's transaction (`top_up_once`, both backends);
//! - `balance.low`: the ledger writer's `record` transaction, right after the balances drop
//!   (`balance_alerts` in `sqlite/webhooks.rs` and `postgres/webhooks.rs`): a tenant whose
//!   balance went from at or above its `low_balance` to below it
//!   ([`balance_fell_below`](quipu_core::governance::webhooks::crossing::balance_fell_below));
//! - `key.expiring_7d` / `key.expiring_1d`: no change causes them but time, so the sender's
//!   periodic scan inserts them ([`WebhookStore::emit`]);
//! - `cap.reached_80` / `cap.reached_100`: the same `record` transaction, where a cap pool's
//!   `spent` moves (`charge_caps` in `sqlite/caps.rs` and `postgres/caps.rs`, with
//!   [`cap_events`]), through `emit_in` (each backend's `webhooks.rs`), which inserts one
//!   event inside the caller's open transaction and answers whether it was new.
//!
//! **Once per cause.** `event_id` is unique and every insert is `ON CONFLICT DO NOTHING`: the
//! id is derived from the tenant and the cause
//! ([`Event::cause`](quipu_core::governance::webhooks::event::Event::cause)), so replicas that
//! see the same cause (a key's expiry scanned by all of them, a cap crossed by one) write one
//! event.
//!
//! **Delivery.** One replica at a time holds the sender's lease (`webhook_sender`, renewed
//! while it sends; PostgreSQL by its own clock): it fans new events out into one
//! `webhook_deliveries` row per endpoint that subscribes to them (the operator's endpoints
//! come from the config, so fan-out happens at send time, not in the cause's transaction),
//! then sends the due ones and records each attempt: delivered, retried later, or dead. All
//! state is in these rows, so a restart, or another replica taking the lease over, carries
//! on where the last one stopped (an attempt cut off mid-way is sent again: deliveries are
//! at least once, and the event id tells a receiver it has seen one).
//!
//! **Retention.** Finished deliveries and the events left without any are deleted after
//! 30 days ([`WebhookStore::prune_webhooks`], run by the sender).

use super::{CapPool, StoreResult, TenantId, UnixMs};
use crate::money::Pen;
use async_trait::async_trait;
use quipu_core::billing::pool::CapOwner as PoolOwner;
use quipu_core::governance::caps::CapOwner;
use quipu_core::governance::webhooks::crossing::{cap_levels_crossed, CapLevel};
pub use quipu_core::governance::webhooks::event::WebhookEvent;
use quipu_core::governance::webhooks::event::{CapReached, Event, Soles};

/// The `topup.received` event of a top-up that took the balance to `balance`.
pub fn top_up_received(top_up: &super::TopUp, balance: Pen) -> Event {
    Event::TopupReceived(quipu_core::governance::webhooks::event::TopupReceived {
        topup_id: top_up.id.clone(),
        amount: Soles(top_up.amount),
        balance: Soles(balance),
    })
}

/// The `balance.low` event of a change (`change_id`, a request of the batch) that took the
/// balance below `threshold`, to `balance`.
pub fn balance_low(threshold: Pen, balance: Pen, change_id: &str) -> Event {
    Event::BalanceLow(quipu_core::governance::webhooks::event::BalanceLow {
        threshold: Soles(threshold),
        balance: Soles(balance),
        change_id: change_id.to_owned(),
    })
}

/// The `cap.reached_80` / `cap.reached_100` events a change of what `pool` has spent, from
/// `before` to `after`, fires for a cap of `limit` (see
/// `quipu_core::governance::webhooks::crossing`); both backends' `record` call it as they
/// charge the pool.
pub fn cap_events(pool: &CapPool, limit: Pen, before: Pen, after: Pen) -> Vec<Event> {
    let (owner, key_id) = match &pool.owner {
        PoolOwner::Key(id) => (CapOwner::Key, Some(id.clone())),
        PoolOwner::Tenant => (CapOwner::Tenant, None),
    };
    cap_levels_crossed(limit, before, after)
        .into_iter()
        .map(|level| {
            let reached = CapReached {
                owner,
                key_id: key_id.clone(),
                period: pool.period.period(),
                period_key: pool.period.to_string(),
                cap: Soles(limit),
                spent: Soles(after),
            };
            match level {
                CapLevel::Percent80 => Event::CapReached80(reached),
                CapLevel::Percent100 => Event::CapReached100(reached),
            }
        })
        .collect()
}

/// An endpoint a tenant registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    /// `wh_` and hex.
    pub id: String,
    pub tenant_id: TenantId,
    pub url: String,
    /// The signing secret (stored: the sender needs it to sign).
    pub secret: String,
    /// `*` or the event types, comma-separated
    /// ([`EventFilter::to_text`](quipu_core::governance::webhooks::endpoint::EventFilter::to_text)).
    pub events: String,
    pub created_at: UnixMs,
}

/// An event the sender has not fanned out to its endpoints yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub event_id: String,
    pub tenant_id: TenantId,
    pub kind: String,
}

/// A delivery that is due: its event and endpoint, what was tried so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueDelivery {
    pub event_id: String,
    pub endpoint: String,
    /// Attempts made before this one.
    pub attempts: u32,
    pub tenant_id: TenantId,
    pub kind: String,
    /// The event's JSON, exactly as signed and sent.
    pub body: String,
}

/// What became of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The endpoint answered 2xx (this status).
    Delivered { status: u16 },
    /// Failed; try again at `next_at`.
    Retry {
        next_at: UnixMs,
        status: Option<u16>,
        error: String,
    },
    /// Failed for the last time (or its endpoint is gone).
    Dead { status: Option<u16>, error: String },
}

/// A delivery as listed (tests, the operator).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryInfo {
    pub event_id: String,
    pub endpoint: String,
    pub kind: String,
    /// `pending`, `delivered` or `dead`.
    pub state: String,
    pub attempts: u32,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
}

/// A key that expires soon, for the expiry notices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiringKey {
    pub key_id: String,
    pub tenant_id: TenantId,
    pub tenant_name: String,
    pub expires_at: UnixMs,
}

/// Deliveries waiting, for the backlog gauge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Delivery rows not yet delivered nor dead.
    pub pending: u64,
    /// Events not yet fanned out to their endpoints.
    pub unfanned: u64,
}

/// The endpoints tenants register, the outbox and its deliveries (see the module docs).
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Registers an endpoint (`Conflict` if the id is taken).
    async fn add_endpoint(&self, endpoint: &WebhookEndpoint) -> StoreResult<()>;
    /// The endpoints not deleted, of one tenant or of all, oldest first.
    async fn endpoints(&self, tenant: Option<TenantId>) -> StoreResult<Vec<WebhookEndpoint>>;
    /// Deletes `tenant`'s endpoint `id` (its pending deliveries die when next due); whether
    /// there was one.
    async fn remove_endpoint(&self, tenant: TenantId, id: &str, now: UnixMs) -> StoreResult<bool>;

    /// Inserts events caused by nothing in the store (the expiry notices), each once: an id
    /// already there is left as it is. Returns how many were new.
    async fn emit(&self, events: &[(TenantId, WebhookEvent)]) -> StoreResult<u64>;

    /// Takes or renews the sender's lease for `replica` for `lease_ms`; whether it holds it.
    async fn lead_sender(&self, replica: &str, lease_ms: i64) -> StoreResult<bool>;
    /// Gives the lease up (a clean shutdown), if `replica` holds it.
    async fn resign_sender(&self, replica: &str) -> StoreResult<()>;
    /// Events not fanned out yet, oldest first.
    async fn unfanned(&self, limit: u32) -> StoreResult<Vec<OutboxEvent>>;
    /// Writes the deliveries (event id, endpoint id) of `events`, due at `now`, and marks the
    /// events fanned out, in one transaction. Idempotent.
    async fn fan_out(
        &self,
        events: &[String],
        deliveries: &[(String, String)],
        now: UnixMs,
    ) -> StoreResult<()>;
    /// Pending deliveries due at `now`, the longest due first.
    async fn due(&self, now: UnixMs, limit: u32) -> StoreResult<Vec<DueDelivery>>;
    /// Records an attempt at a pending delivery.
    async fn attempted(
        &self,
        event_id: &str,
        endpoint: &str,
        attempt: &Attempt,
        now: UnixMs,
    ) -> StoreResult<()>;
    async fn backlog(&self) -> StoreResult<Backlog>;
    /// Every delivery of `tenant`'s events (all tenants' if `None`), oldest event first.
    async fn deliveries(&self, tenant: Option<TenantId>) -> StoreResult<Vec<DeliveryInfo>>;
    /// Deletes deliveries finished (delivered or dead) before `before`, then the events
    /// written before it with no delivery left; returns how many rows went. An event's cause
    /// never recurs once it is that old (a top-up, a charge batch, a past period, a key long
    /// expired), so its id is not needed any more to keep it once.
    async fn prune_webhooks(&self, before: UnixMs) -> StoreResult<u64>;
    /// Usable keys (not revoked, disabled or rotated) that expire in `(now, until]`.
    async fn expiring_keys(&self, now: UnixMs, until: UnixMs) -> StoreResult<Vec<ExpiringKey>>;
}

/// `u32` from a count column (attempts), saturating.
pub(crate) fn count_u32(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

/// An HTTP status from its column.
pub(crate) fn status_u16(v: Option<i64>) -> Option<u16> {
    v.and_then(|s| u16::try_from(s).ok())
}

/// An attempt as the delivery row's columns: state, next due time, status, error, done time.
pub(crate) fn attempt_columns(
    attempt: &Attempt,
    now: UnixMs,
) -> (
    &'static str,
    UnixMs,
    Option<i64>,
    Option<&str>,
    Option<UnixMs>,
) {
    match attempt {
        Attempt::Delivered { status } => {
            ("delivered", now, Some(i64::from(*status)), None, Some(now))
        }
        Attempt::Retry {
            next_at,
            status,
            error,
        } => (
            "pending",
            *next_at,
            status.map(i64::from),
            Some(error.as_str()),
            None,
        ),
        Attempt::Dead { status, error } => (
            "dead",
            now,
            status.map(i64::from),
            Some(error.as_str()),
            Some(now),
        ),
    }
}
