//! Cap pools and their leases on PostgreSQL: what `leases` does for a tenant's balance, done
//! for one cap in one period (see `quipu_core::billing::pool`). Granting locks the pool's row
//! (`FOR UPDATE`, after making sure it exists), so grants on one pool serialise and `Σ leases ≤
//! limit − spent` holds; `record` charges the pools of its new rows in its own transaction,
//! locking their rows in pool order after the tenants' ([`charge_caps`]). Shrinking a lease
//! needs no pool lock, as for balances. A charge that takes a pool past 80 % or 100 % of its
//! cap writes the webhook event in the same transaction (`store::webhooks`).

use super::leases::reading;
use super::{PgResult, PgStore};
use crate::money::Pen;
use crate::store::sql_money::{pen_from_text, pen_to_text};
use crate::store::webhooks::{cap_events, WebhookEvent};
use crate::store::{CapPool, CapTerms, LeaseAsk, LeaseGrant, LeaseReading, StoreResult};
use quipu_core::billing::lease::lease_grant;
use std::collections::BTreeMap;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

/// The lease columns every answer about a cap lease reads, in this order.
const READING: &str = "amount::text, spent::text, version";

async fn grant_tx(
    client: &mut Client,
    replica: &str,
    pool: &CapPool,
    terms: CapTerms,
    ask: LeaseAsk,
) -> PgResult<LeaseGrant> {
    let id = pool.to_string();
    let tx = client.transaction().await?;
    tx.execute_typed(
        "INSERT INTO cap_pools (pool, tenant_id, cap_limit, spent, period_end)
         VALUES ($1, $2, $3::numeric, 0, $4)
         ON CONFLICT (pool) DO UPDATE SET cap_limit = EXCLUDED.cap_limit",
        &[
            (&id, Type::TEXT),
            (&pool.tenant, Type::INT8),
            (&pen_to_text(terms.limit), Type::TEXT),
            (&terms.period_end, Type::INT8),
        ],
    )
    .await?;
    let row = tx
        .query_typed_one(
            "SELECT p.cap_limit::text, p.spent::text,
                    (SELECT COALESCE(SUM(amount), 0)::text FROM cap_leases WHERE pool = p.pool),
                    (SELECT COALESCE(SUM(amount), 0)::text FROM cap_leases
                      WHERE pool = p.pool AND replica = $2)
               FROM cap_pools p WHERE p.pool = $1 FOR UPDATE",
            &[(&id, Type::TEXT), (&replica, Type::TEXT)],
        )
        .await?;
    let pen = |i: usize, what: &str| -> PgResult<Pen> {
        Ok(pen_from_text(&row.try_get::<_, String>(i)?, what)?)
    };
    let (limit, spent) = (pen(0, "cap_pools.cap_limit")?, pen(1, "cap_pools.spent")?);
    let (leased, own) = (pen(2, "cap_leases.amount")?, pen(3, "cap_leases.amount")?);
    let granted = lease_grant(ask.need, ask.want, limit - spent - leased);
    let row = tx
        .query_typed_one(
            &format!(
                "INSERT INTO cap_leases (pool, replica, amount, heartbeat_at, version)
                 VALUES ($1, $2, $3::numeric, {now}, 1)
                 ON CONFLICT (pool, replica) DO UPDATE
                 SET amount = cap_leases.amount + EXCLUDED.amount,
                     heartbeat_at = EXCLUDED.heartbeat_at,
                     version = cap_leases.version + 1
                 RETURNING {READING}",
                now = db_now_ms!(),
            ),
            &[
                (&id, Type::TEXT),
                (&replica, Type::TEXT),
                (&pen_to_text(granted), Type::TEXT),
            ],
        )
        .await?;
    let reading = reading(&row, 0)?;
    tx.commit().await?;
    Ok(LeaseGrant {
        reading,
        granted,
        elsewhere: leased - own,
    })
}

async fn release_q(
    client: &mut Client,
    replica: &str,
    pool: &CapPool,
    amount: Pen,
) -> PgResult<Option<LeaseReading>> {
    let row = client
        .query_typed_opt(
            &format!(
                "UPDATE cap_leases SET amount = GREATEST(amount - $3::numeric, 0),
                                       version = version + 1
                  WHERE pool = $1 AND replica = $2
                  RETURNING {READING}"
            ),
            &[
                (&pool.to_string(), Type::TEXT),
                (&replica, Type::TEXT),
                (&pen_to_text(amount), Type::TEXT),
            ],
        )
        .await?;
    row.map(|r| reading(&r, 0)).transpose()
}

async fn heartbeat_q(client: &mut Client, replica: &str) -> PgResult<Vec<(CapPool, LeaseReading)>> {
    let rows = client
        .query_typed(
            &format!(
                "UPDATE cap_leases AS l SET heartbeat_at = {now}
                   FROM cap_pools p
                  WHERE l.replica = $1 AND p.pool = l.pool
                 RETURNING l.pool, p.tenant_id, l.amount::text, l.spent::text, l.version",
                now = db_now_ms!(),
            ),
            &[(&replica, Type::TEXT)],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let id: String = r.try_get(0)?;
        if let Some(pool) = CapPool::parse(&id, r.try_get(1)?) {
            out.push((pool, reading(&r, 2)?));
        }
    }
    Ok(out)
}

/// Charges the new rows of a `record` against their cap pools (`charged`: pool → its tenant
/// and what the rows charge it): each pool's `spent` and the recording replica's lease on it,
/// as the balance and its lease. Returns the replica's lease rows after the charge.
pub(super) async fn charge_caps(
    tx: &Transaction<'_>,
    replica: &str,
    charged: &BTreeMap<String, (i64, Pen)>,
) -> PgResult<Vec<(CapPool, LeaseReading)>> {
    let charged: Vec<(&String, &(i64, Pen))> = charged
        .iter()
        .filter(|(_, (_, c))| *c != Pen::ZERO)
        .collect();
    if charged.is_empty() {
        return Ok(Vec::new());
    }
    // In pool order, so two replicas' records never wait on each other in a circle.
    let ids: Vec<&str> = charged.iter().map(|(id, _)| id.as_str()).collect();
    let tenants: Vec<i64> = charged.iter().map(|(_, (t, _))| *t).collect();
    let amounts: Vec<String> = charged.iter().map(|(_, (_, c))| pen_to_text(*c)).collect();
    tx.execute_typed(
        "SELECT 1 FROM cap_pools WHERE pool = ANY($1) ORDER BY pool FOR NO KEY UPDATE",
        &[(&ids, Type::TEXT_ARRAY)],
    )
    .await?;
    let moved = tx
        .query_typed(
            "UPDATE cap_pools AS p SET spent = p.spent + u.c::numeric
               FROM UNNEST($1::text[], $2::text[]) AS u(id, c)
              WHERE p.pool = u.id
              RETURNING p.pool, p.tenant_id, p.cap_limit::text, p.spent::text, u.c",
            &[(&ids, Type::TEXT_ARRAY), (&amounts, Type::TEXT_ARRAY)],
        )
        .await?;
    cap_alerts(tx, &moved).await?;
    let rows = tx
        .query_typed(
            "UPDATE cap_leases AS l SET amount = GREATEST(l.amount - u.c::numeric, 0),
                                        spent = l.spent + u.c::numeric,
                                        version = l.version + 1
               FROM UNNEST($1::text[], $2::text[], $3::int8[]) AS u(id, c, t)
              WHERE l.pool = u.id AND l.replica = $4
              RETURNING l.pool, u.t, l.amount::text, l.spent::text, l.version",
            &[
                (&ids, Type::TEXT_ARRAY),
                (&amounts, Type::TEXT_ARRAY),
                (&tenants, Type::INT8_ARRAY),
                (&replica, Type::TEXT),
            ],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let id: String = r.try_get(0)?;
        if let Some(pool) = CapPool::parse(&id, r.try_get(1)?) {
            out.push((pool, reading(r, 2)?));
        }
    }
    Ok(out)
}

/// `cap.reached_80` / `cap.reached_100` for the pools whose spent `record` just moved: `moved`
/// are the rows of its update (`pool, tenant_id, cap_limit, spent after, charge`).
async fn cap_alerts(tx: &Transaction<'_>, moved: &[tokio_postgres::Row]) -> PgResult<()> {
    for r in moved {
        let id: String = r.try_get(0)?;
        let tenant: i64 = r.try_get(1)?;
        let Some(pool) = CapPool::parse(&id, tenant) else {
            continue;
        };
        let limit = pen_from_text(&r.try_get::<_, String>(2)?, "cap_pools.cap_limit")?;
        let after = pen_from_text(&r.try_get::<_, String>(3)?, "cap_pools.spent")?;
        let charge = pen_from_text(&r.try_get::<_, String>(4)?, "a cap charge")?;
        let events = cap_events(&pool, limit, after - charge, after);
        if events.is_empty() {
            continue;
        }
        let name: String = tx
            .query_typed_one(
                "SELECT name FROM tenants WHERE id = $1",
                &[(&tenant, Type::INT8)],
            )
            .await?
            .try_get(0)?;
        for event in events {
            let event = WebhookEvent::new(&name, crate::store::now_ms(), event);
            super::webhooks::emit_in(tx, tenant, &event).await?;
        }
    }
    Ok(())
}

/// Zeroes the cap leases whose heartbeat is older than `max_age_ms`; how many.
pub(super) async fn reclaim_q(client: &mut Client, max_age_ms: i64) -> PgResult<u64> {
    Ok(client
        .execute_typed(
            concat!(
                "UPDATE cap_leases SET amount = 0, version = version + 1
                  WHERE amount > 0 AND heartbeat_at < ",
                db_now_ms!(),
                " - $1"
            ),
            &[(&max_age_ms, Type::INT8)],
        )
        .await?)
}

/// Deletes the cap leases whose heartbeat is older than `max_age_ms`; how many.
pub(super) async fn forget_q(client: &mut Client, max_age_ms: i64) -> PgResult<u64> {
    Ok(client
        .execute_typed(
            concat!(
                "DELETE FROM cap_leases WHERE heartbeat_at < ",
                db_now_ms!(),
                " - $1"
            ),
            &[(&max_age_ms, Type::INT8)],
        )
        .await?)
}

/// Deletes every cap lease of `replica`.
pub(super) async fn drop_q(client: &mut Client, replica: &str) -> PgResult<()> {
    client
        .execute_typed(
            "DELETE FROM cap_leases WHERE replica = $1",
            &[(&replica, Type::TEXT)],
        )
        .await?;
    Ok(())
}

async fn spent_q(client: &mut Client, pools: &[String]) -> PgResult<Vec<(String, Pen, Pen)>> {
    let rows = client
        .query_typed(
            "SELECT pool, cap_limit::text, spent::text FROM cap_pools WHERE pool = ANY($1)",
            &[(&pools, Type::TEXT_ARRAY)],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push((
            r.try_get(0)?,
            pen_from_text(&r.try_get::<_, String>(1)?, "cap_pools.cap_limit")?,
            pen_from_text(&r.try_get::<_, String>(2)?, "cap_pools.spent")?,
        ));
    }
    Ok(out)
}

impl PgStore {
    pub(super) async fn grant_cap(
        &self,
        replica: &str,
        pool: &CapPool,
        terms: CapTerms,
        ask: LeaseAsk,
    ) -> StoreResult<LeaseGrant> {
        with_retry!(self, c => grant_tx(c, replica, pool, terms, ask))
    }

    pub(super) async fn release_cap(
        &self,
        replica: &str,
        pool: &CapPool,
        amount: Pen,
    ) -> StoreResult<Option<LeaseReading>> {
        let amount = amount.max(Pen::ZERO);
        with_retry!(self, c => release_q(c, replica, pool, amount))
    }

    pub(super) async fn heartbeat_caps(
        &self,
        replica: &str,
    ) -> StoreResult<Vec<(CapPool, LeaseReading)>> {
        with_retry!(self, c => heartbeat_q(c, replica))
    }

    pub(super) async fn caps_spent(
        &self,
        pools: &[String],
    ) -> StoreResult<Vec<(String, Pen, Pen)>> {
        with_retry!(self, c => spent_q(c, pools))
    }
}
