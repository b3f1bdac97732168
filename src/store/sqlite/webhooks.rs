//! The webhook outbox on SQLite ([`WebhookStore`]; see `store::webhooks`), and the inserts
//! other transactions make in it: [`emit_in`] (any event, inside the caller's transaction),
//! [`balance_alerts`] (`record`'s low-balance crossings) and [`top_up_event`].

use super::{execute, query, query_opt, sql_err, write_tx, SqliteStore};
use crate::money::Pen;
use crate::store::rows::{tenant_missing, DbError};
use crate::store::sql::webhooks as q;
use crate::store::sql::SqlValue::{Int, OptInt, OptText, Text};
use crate::store::webhooks::{
    attempt_columns, Attempt, Backlog, DeliveryInfo, DueDelivery, ExpiringKey, OutboxEvent,
    WebhookEndpoint, WebhookEvent, WebhookStore,
};
use crate::store::{now_ms, StoreError, StoreResult, TenantId, TopUp, UnixMs};
use async_trait::async_trait;
use quipu_core::governance::webhooks::crossing::balance_fell_below;
use rusqlite::{Connection, OptionalExtension};

/// Inserts `event` of `tenant` into the outbox inside the caller's open transaction `tx`;
/// whether it was new (an event with its id may be there already: once per cause).
pub fn emit_in(tx: &Connection, tenant: TenantId, event: &WebhookEvent) -> StoreResult<bool> {
    let body = q::event_body(event)?;
    let values = q::event_values(event, tenant, &body);
    Ok(execute(tx, &q::INSERT_EVENT, &values)? == 1)
}

/// `balance.low` for a tenant whose balance `record` took from `before` to `after`, if that
/// crossed its threshold; `change_id` names the change (a request of the batch).
pub(super) fn balance_alerts(
    tx: &Connection,
    tenant: TenantId,
    (before, after): (Pen, Pen),
    change_id: &str,
) -> StoreResult<()> {
    let Some((name, Some(threshold))) = query_opt(
        tx,
        &q::TENANT_ALERT_RULES,
        &[Int(tenant)],
        q::name_and_threshold,
    )?
    else {
        return Ok(());
    };
    if !balance_fell_below(before, after, threshold) {
        return Ok(());
    }
    let event = crate::store::webhooks::balance_low(threshold, after, change_id);
    emit_in(tx, tenant, &WebhookEvent::new(&name, now_ms(), event)).map(drop)
}

/// `topup.received` for a top-up just written in `tx`.
pub(super) fn top_up_event(tx: &Connection, top_up: &TopUp, balance: Pen) -> StoreResult<()> {
    let name = query_opt(tx, &q::TENANT_NAME, &[Int(top_up.tenant_id)], |c| c.text())?
        .ok_or_else(|| tenant_missing(top_up.tenant_id))?;
    let event = crate::store::webhooks::top_up_received(top_up, balance);
    emit_in(
        tx,
        top_up.tenant_id,
        &WebhookEvent::new(&name, top_up.at, event),
    )
    .map(drop)
}

fn lead(conn: &mut Connection, replica: &str, lease_ms: i64) -> StoreResult<bool> {
    let now = now_ms();
    let holder: Option<String> = conn
        .query_row(
            "INSERT INTO webhook_sender (id, holder, until) VALUES (1, ?1, ?2 + ?3)
             ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, until = excluded.until
              WHERE webhook_sender.holder = excluded.holder OR webhook_sender.until < ?2
             RETURNING holder",
            rusqlite::params![replica, now, lease_ms],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql_err)?;
    Ok(holder.as_deref() == Some(replica))
}

fn fan_out(
    conn: &mut Connection,
    events: &[String],
    deliveries: &[(String, String)],
    now: UnixMs,
) -> StoreResult<()> {
    let tx = write_tx(conn)?;
    for (event, endpoint) in deliveries {
        execute(
            &tx,
            &q::INSERT_DELIVERY,
            &[Text(event), Text(endpoint), Int(now)],
        )?;
    }
    for event in events {
        execute(&tx, &q::MARK_FANNED, &[Text(event)])?;
    }
    tx.commit().map_err(sql_err)
}

fn emit(conn: &mut Connection, events: &[(TenantId, WebhookEvent)]) -> StoreResult<u64> {
    let tx = write_tx(conn)?;
    let mut new = 0;
    for (tenant, event) in events {
        new += u64::from(emit_in(&tx, *tenant, event)?);
    }
    tx.commit().map_err(sql_err)?;
    Ok(new)
}

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn add_endpoint(&self, e: &WebhookEndpoint) -> StoreResult<()> {
        let e = e.clone();
        self.run(move |conn| {
            let values = [
                Text(&e.id),
                Int(e.tenant_id),
                Text(&e.url),
                Text(&e.secret),
                Text(&e.events),
                Int(e.created_at),
            ];
            execute(conn, &q::INSERT_ENDPOINT, &values)
                .map_err(|err| {
                    if err.is_unique_violation() {
                        StoreError::Conflict(format!("webhook endpoint {} exists", e.id))
                    } else {
                        err.into()
                    }
                })
                .map(drop)
        })
        .await
    }

    async fn endpoints(&self, tenant: Option<TenantId>) -> StoreResult<Vec<WebhookEndpoint>> {
        self.run(move |conn| Ok(query(conn, &q::ENDPOINTS, &[OptInt(tenant)], q::endpoint)?))
            .await
    }

    async fn remove_endpoint(&self, tenant: TenantId, id: &str, now: UnixMs) -> StoreResult<bool> {
        let id = id.to_owned();
        self.run(move |conn| {
            Ok(execute(
                conn,
                &q::REMOVE_ENDPOINT,
                &[Text(&id), Int(tenant), Int(now)],
            )? == 1)
        })
        .await
    }

    async fn emit(&self, events: &[(TenantId, WebhookEvent)]) -> StoreResult<u64> {
        if events.is_empty() {
            return Ok(0);
        }
        let events = events.to_vec();
        self.run(move |conn| emit(conn, &events)).await
    }

    async fn lead_sender(&self, replica: &str, lease_ms: i64) -> StoreResult<bool> {
        let replica = replica.to_owned();
        self.run(move |conn| lead(conn, &replica, lease_ms)).await
    }

    async fn resign_sender(&self, replica: &str) -> StoreResult<()> {
        let replica = replica.to_owned();
        self.run(move |conn| {
            conn.execute(
                "UPDATE webhook_sender SET until = 0 WHERE holder = ?1",
                [&replica],
            )
            .map_err(sql_err)
            .map(drop)
        })
        .await
    }

    async fn unfanned(&self, limit: u32) -> StoreResult<Vec<OutboxEvent>> {
        self.run(move |conn| {
            Ok(query(
                conn,
                &q::UNFANNED,
                &[Int(i64::from(limit))],
                q::outbox_event,
            )?)
        })
        .await
    }

    async fn fan_out(
        &self,
        events: &[String],
        deliveries: &[(String, String)],
        now: UnixMs,
    ) -> StoreResult<()> {
        let (events, deliveries) = (events.to_vec(), deliveries.to_vec());
        self.run(move |conn| fan_out(conn, &events, &deliveries, now))
            .await
    }

    async fn due(&self, now: UnixMs, limit: u32) -> StoreResult<Vec<DueDelivery>> {
        self.run(move |conn| {
            Ok(query(
                conn,
                &q::DUE,
                &[Int(now), Int(i64::from(limit))],
                q::due_delivery,
            )?)
        })
        .await
    }

    async fn attempted(
        &self,
        event_id: &str,
        endpoint: &str,
        attempt: &Attempt,
        now: UnixMs,
    ) -> StoreResult<()> {
        let (event_id, endpoint, attempt) =
            (event_id.to_owned(), endpoint.to_owned(), attempt.clone());
        self.run(move |conn| {
            let (state, next_at, status, error, done) = attempt_columns(&attempt, now);
            let values = [
                Text(&event_id),
                Text(&endpoint),
                Text(state),
                Int(next_at),
                OptInt(status),
                OptText(error),
                OptInt(done),
            ];
            execute(conn, &q::ATTEMPTED, &values)?;
            Ok(())
        })
        .await
    }

    async fn backlog(&self) -> StoreResult<Backlog> {
        self.run(move |conn| {
            let b = query_opt(conn, &q::BACKLOG, &[], |c| {
                Ok(Backlog {
                    pending: u64::try_from(c.int()?).unwrap_or(0),
                    unfanned: u64::try_from(c.int()?).unwrap_or(0),
                })
            })?;
            Ok(b.unwrap_or_default())
        })
        .await
    }

    async fn deliveries(&self, tenant: Option<TenantId>) -> StoreResult<Vec<DeliveryInfo>> {
        self.run(move |conn| {
            Ok(query(
                conn,
                &q::DELIVERIES,
                &[OptInt(tenant)],
                q::delivery_info,
            )?)
        })
        .await
    }

    async fn prune_webhooks(&self, before: UnixMs) -> StoreResult<u64> {
        self.run(move |conn| {
            let tx = write_tx(conn)?;
            let n = execute(&tx, &q::PRUNE_DELIVERIES, &[Int(before)])?
                + execute(&tx, &q::PRUNE_EVENTS, &[Int(before)])?;
            tx.commit().map_err(sql_err)?;
            Ok(n as u64)
        })
        .await
    }

    async fn expiring_keys(&self, now: UnixMs, until: UnixMs) -> StoreResult<Vec<ExpiringKey>> {
        self.run(move |conn| {
            Ok(query(
                conn,
                &q::EXPIRING_KEYS,
                &[Int(now), Int(until)],
                q::expiring_key,
            )?)
        })
        .await
    }
}
