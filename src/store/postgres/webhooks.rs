//! The webhook outbox on PostgreSQL ([`WebhookStore`]; see `store::webhooks`), and the inserts
//! other transactions make in it: [`emit_in`] (any event, inside the caller's transaction),
//! [`balance_alerts`] (`record`'s low-balance crossings) and [`top_up_event`]. The sender's
//! lease is timed by the database's clock, so replicas' clocks need not agree.

use super::{execute, query, query_opt, PgResult, PgStore};
use crate::money::Pen;
use crate::store::rows::{conflict_if_unique, tenant_missing, Taken};
use crate::store::sql::webhooks as q;
use crate::store::sql::SqlValue::{Int, OptInt, OptText, Text};
use crate::store::sql_money::pen_from_text;
use crate::store::webhooks::{
    attempt_columns, Attempt, Backlog, DeliveryInfo, DueDelivery, ExpiringKey, OutboxEvent,
    WebhookEndpoint, WebhookEvent, WebhookStore,
};
use crate::store::{now_ms, StoreResult, TenantId, TopUp, UnixMs};
use async_trait::async_trait;
use quipu_core::governance::webhooks::crossing::balance_fell_below;
use std::collections::BTreeMap;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient, Row};

/// Inserts `event` of `tenant` into the outbox inside the caller's open transaction `tx`;
/// whether it was new (an event with its id may be there already: once per cause).
pub(crate) async fn emit_in(
    tx: &impl GenericClient,
    tenant: TenantId,
    event: &WebhookEvent,
) -> PgResult<bool> {
    let body = q::event_body(event)?;
    let values = q::event_values(event, tenant, &body);
    Ok(execute(tx, &q::INSERT_EVENT, &values).await? == 1)
}

/// `balance.low` for each tenant whose balance `record` just lowered across its threshold.
/// `after` are the rows of `record`'s balance update (`id, balance::text, low_balance, name`),
/// `charged` what it took from each, `first_new` a new request row of each (the change the
/// alert names).
pub(super) async fn balance_alerts(
    tx: &impl GenericClient,
    after: &[Row],
    charged: &BTreeMap<TenantId, Pen>,
    first_new: &BTreeMap<TenantId, String>,
) -> PgResult<()> {
    for row in after {
        let tenant: TenantId = row.try_get(0)?;
        let Some(threshold) = row.try_get::<_, Option<String>>(2)? else {
            continue;
        };
        let threshold = pen_from_text(&threshold, "tenants.low_balance")?;
        let balance = pen_from_text(&row.try_get::<_, String>(1)?, "tenants.balance")?;
        let before = balance + charged.get(&tenant).copied().unwrap_or(Pen::ZERO);
        if !balance_fell_below(before, balance, threshold) {
            continue;
        }
        let event = crate::store::webhooks::balance_low(
            threshold,
            balance,
            first_new.get(&tenant).map_or("", String::as_str),
        );
        let name: String = row.try_get(3)?;
        emit_in(tx, tenant, &WebhookEvent::new(&name, now_ms(), event)).await?;
    }
    Ok(())
}

/// `topup.received` for a top-up just written in `tx`.
pub(super) async fn top_up_event(
    tx: &impl GenericClient,
    top_up: &TopUp,
    balance: Pen,
) -> PgResult<()> {
    let name = query_opt(tx, &q::TENANT_NAME, &[Int(top_up.tenant_id)], |c| c.text())
        .await?
        .ok_or_else(|| tenant_missing(top_up.tenant_id))?;
    let event = crate::store::webhooks::top_up_received(top_up, balance);
    emit_in(
        tx,
        top_up.tenant_id,
        &WebhookEvent::new(&name, top_up.at, event),
    )
    .await?;
    Ok(())
}

async fn lead(client: &Client, replica: &str, lease_ms: i64) -> PgResult<bool> {
    let row = client
        .query_typed_opt(
            concat!(
                "INSERT INTO webhook_sender (id, holder, until) VALUES (1, $1, ",
                db_now_ms!(),
                " + $2)
                 ON CONFLICT (id) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until
                  WHERE webhook_sender.holder = EXCLUDED.holder OR webhook_sender.until < ",
                db_now_ms!(),
                " RETURNING holder"
            ),
            &[(&replica, Type::TEXT), (&lease_ms, Type::INT8)],
        )
        .await?;
    Ok(match row {
        Some(r) => r.try_get::<_, String>(0)? == replica,
        None => false,
    })
}

async fn fan_out(
    client: &mut Client,
    events: &[String],
    deliveries: &[(String, String)],
    now: UnixMs,
) -> PgResult<()> {
    let tx = client.transaction().await?;
    for (event, endpoint) in deliveries {
        execute(
            &tx,
            &q::INSERT_DELIVERY,
            &[Text(event), Text(endpoint), Int(now)],
        )
        .await?;
    }
    for event in events {
        execute(&tx, &q::MARK_FANNED, &[Text(event)]).await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn emit(client: &mut Client, events: &[(TenantId, WebhookEvent)]) -> PgResult<u64> {
    let tx = client.transaction().await?;
    let mut new = 0;
    for (tenant, event) in events {
        new += u64::from(emit_in(&tx, *tenant, event).await?);
    }
    tx.commit().await?;
    Ok(new)
}

async fn add_endpoint(client: &Client, e: &WebhookEndpoint) -> PgResult<()> {
    let values = [
        Text(&e.id),
        Int(e.tenant_id),
        Text(&e.url),
        Text(&e.secret),
        Text(&e.events),
        Int(e.created_at),
    ];
    execute(client, &q::INSERT_ENDPOINT, &values)
        .await
        .map_err(conflict_if_unique(Taken::Key(&e.id)))?;
    Ok(())
}

async fn attempted(
    client: &Client,
    event_id: &str,
    endpoint: &str,
    attempt: &Attempt,
    now: UnixMs,
) -> PgResult<()> {
    let (state, next_at, status, error, done) = attempt_columns(attempt, now);
    let values = [
        Text(event_id),
        Text(endpoint),
        Text(state),
        Int(next_at),
        OptInt(status),
        OptText(error),
        OptInt(done),
    ];
    execute(client, &q::ATTEMPTED, &values).await?;
    Ok(())
}

async fn prune(client: &mut Client, before: UnixMs) -> PgResult<u64> {
    let tx = client.transaction().await?;
    let n = execute(&tx, &q::PRUNE_DELIVERIES, &[Int(before)]).await?
        + execute(&tx, &q::PRUNE_EVENTS, &[Int(before)]).await?;
    tx.commit().await?;
    Ok(n)
}

async fn backlog(client: &Client) -> PgResult<Backlog> {
    let b = query_opt(client, &q::BACKLOG, &[], |c| {
        Ok(Backlog {
            pending: u64::try_from(c.int()?).unwrap_or(0),
            unfanned: u64::try_from(c.int()?).unwrap_or(0),
        })
    })
    .await?;
    Ok(b.unwrap_or_default())
}

#[async_trait]
impl WebhookStore for PgStore {
    async fn add_endpoint(&self, e: &WebhookEndpoint) -> StoreResult<()> {
        with_retry!(self, c => add_endpoint(c, e))
    }

    async fn endpoints(&self, tenant: Option<TenantId>) -> StoreResult<Vec<WebhookEndpoint>> {
        with_retry!(self, c => query(&*c, &q::ENDPOINTS, &[OptInt(tenant)], q::endpoint))
    }

    async fn remove_endpoint(&self, tenant: TenantId, id: &str, now: UnixMs) -> StoreResult<bool> {
        let n: u64 = with_retry!(self, c => execute(
            &*c, &q::REMOVE_ENDPOINT, &[Text(id), Int(tenant), Int(now)]
        ))?;
        Ok(n == 1)
    }

    async fn emit(&self, events: &[(TenantId, WebhookEvent)]) -> StoreResult<u64> {
        if events.is_empty() {
            return Ok(0);
        }
        with_retry!(self, c => emit(c, events))
    }

    async fn lead_sender(&self, replica: &str, lease_ms: i64) -> StoreResult<bool> {
        with_retry!(self, c => lead(c, replica, lease_ms))
    }

    async fn resign_sender(&self, replica: &str) -> StoreResult<()> {
        with_retry!(self, c => async {
            c.execute_typed(
                "UPDATE webhook_sender SET until = 0 WHERE holder = $1",
                &[(&replica, Type::TEXT)],
            )
            .await?;
            Ok(())
        })
    }

    async fn unfanned(&self, limit: u32) -> StoreResult<Vec<OutboxEvent>> {
        with_retry!(self, c => query(&*c, &q::UNFANNED, &[Int(i64::from(limit))], q::outbox_event))
    }

    async fn fan_out(
        &self,
        events: &[String],
        deliveries: &[(String, String)],
        now: UnixMs,
    ) -> StoreResult<()> {
        with_retry!(self, c => fan_out(c, events, deliveries, now))
    }

    async fn due(&self, now: UnixMs, limit: u32) -> StoreResult<Vec<DueDelivery>> {
        with_retry!(self, c => query(
            &*c, &q::DUE, &[Int(now), Int(i64::from(limit))], q::due_delivery
        ))
    }

    async fn attempted(
        &self,
        event_id: &str,
        endpoint: &str,
        attempt: &Attempt,
        now: UnixMs,
    ) -> StoreResult<()> {
        with_retry!(self, c => attempted(c, event_id, endpoint, attempt, now))
    }

    async fn backlog(&self) -> StoreResult<Backlog> {
        with_retry!(self, c => backlog(c))
    }

    async fn deliveries(&self, tenant: Option<TenantId>) -> StoreResult<Vec<DeliveryInfo>> {
        with_retry!(self, c => query(&*c, &q::DELIVERIES, &[OptInt(tenant)], q::delivery_info))
    }

    async fn prune_webhooks(&self, before: UnixMs) -> StoreResult<u64> {
        with_retry!(self, c => prune(c, before))
    }

    async fn expiring_keys(&self, now: UnixMs, until: UnixMs) -> StoreResult<Vec<ExpiringKey>> {
        with_retry!(self, c => query(
            &*c, &q::EXPIRING_KEYS, &[Int(now), Int(until)], q::expiring_key
        ))
    }
}
