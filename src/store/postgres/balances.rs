//! Money held on PostgreSQL: top-ups, balances, and the leases replicas hold against them
//! (grant, release, heartbeat, reclaim, drop).
//!
//! **Money under concurrency.** Transactions run at READ COMMITTED with explicit row locks:
//! every transaction that moves money (`record`, `top_up`, `acquire_lease`) first locks the
//! tenant rows it touches with `SELECT … FOR NO KEY UPDATE`, in ascending id order, so they
//! serialise per tenant across all replicas and cannot deadlock with one another. (`NO KEY
//! UPDATE` rather than `UPDATE`: it does not conflict with the `KEY SHARE` locks that foreign
//! keys take when ledger or lease rows are inserted.) Once the tenant row is locked, the balance
//! and the leases it reads are the latest committed ones and stay so until commit; a lease can
//! only shrink behind our back (reclaim, drop, release), which never breaks `Σ leases ≤
//! balance`. Should the server still report a deadlock or serialisation failure, the whole
//! transaction is retried (a few times, with a short pause): nothing was committed.

use super::PgResult;
use crate::money::Pen;
use crate::store::rows::{
    conflict_if_unique, replayed_top_up, tenant_missing, EarlierTopUp, Taken,
};
use crate::store::sql_money::{pen_from_text, pen_to_text};
use crate::store::{
    now_ms, Balance, LeaseAsk, LeaseGrant, LeaseReading, ReplicaSignal, TenantId, TopUp,
    TopUpOutcome,
};
use quipu_core::billing::lease::lease_grant;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

/// Locks the tenant row (see the module docs) and returns its balance, or `NotFound`.
pub(super) async fn lock_tenant(tx: &Transaction<'_>, tenant: TenantId) -> PgResult<Pen> {
    let row = tx
        .query_typed_opt(
            "SELECT balance::text FROM tenants WHERE id = $1 FOR NO KEY UPDATE",
            &[(&tenant, Type::INT8)],
        )
        .await?
        .ok_or_else(|| tenant_missing(tenant))?;
    Ok(pen_from_text(
        &row.try_get::<_, String>(0)?,
        "tenants.balance",
    )?)
}

pub(super) async fn top_up_tx(
    client: &mut Client,
    tenant: TenantId,
    amount: Pen,
    delta: i64,
    note: &str,
    id: &str,
) -> PgResult<TopUpOutcome> {
    let now = now_ms();
    let tx = client.transaction().await?;
    let balance = lock_tenant(&tx, tenant).await?;
    // An idempotent top-up's id is derived from its key; the tenant lock serialises two
    // retries of the same top-up of one tenant, and the primary key any others.
    let earlier = tx
        .query_typed_opt(
            "SELECT tenant_id, delta, at, note FROM ledger WHERE entry_id = $1",
            &[(&id, Type::TEXT)],
        )
        .await?;
    if let Some(r) = earlier {
        let earlier = EarlierTopUp {
            tenant_id: r.try_get(0)?,
            delta: r.try_get(1)?,
            at: r.try_get(2)?,
            note: r.try_get(3)?,
        };
        return Ok(replayed_top_up(
            id.to_owned(),
            tenant,
            amount,
            delta,
            earlier,
            balance,
        )?);
    }
    tx.execute_typed(
        "INSERT INTO ledger (entry_id, kind, tenant_id, at, delta, note)
         VALUES ($1, 'topup', $2, $3, $4, $5)",
        &[
            (&id, Type::TEXT),
            (&tenant, Type::INT8),
            (&now, Type::INT8),
            (&delta, Type::INT8),
            (&note, Type::TEXT),
        ],
    )
    .await
    .map_err(conflict_if_unique(Taken::TopUp(id)))?;
    let after = tx
        .query_typed_one(
            "UPDATE tenants SET balance = balance + $2::numeric WHERE id = $1
             RETURNING balance::text",
            &[(&tenant, Type::INT8), (&pen_to_text(amount), Type::TEXT)],
        )
        .await?;
    let balance = pen_from_text(&after.try_get::<_, String>(0)?, "tenants.balance")?;
    // Replicas that found the tenant's balance all leased refuse from memory for a moment:
    // tell them money arrived (delivered at commit, not before).
    let arrived = ReplicaSignal::LeasesReturned { tenant }.to_payload();
    tx.execute_typed(
        "SELECT pg_notify($1, $2)",
        &[
            (&super::replicas::CHANNEL, Type::TEXT),
            (&arrived, Type::TEXT),
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(TopUpOutcome {
        top_up: TopUp {
            id: id.to_owned(),
            tenant_id: tenant,
            amount,
            at: now,
            note: note.to_owned(),
        },
        balance,
        replayed: false,
    })
}

pub(super) async fn balance_q(client: &mut Client, tenant: TenantId) -> PgResult<Balance> {
    let row = client
        .query_typed_opt(
            "SELECT t.balance::text,
                    COALESCE((SELECT SUM(l.amount) FROM leases l WHERE l.tenant_id = t.id), 0)::text
               FROM tenants t WHERE t.id = $1",
            &[(&tenant, Type::INT8)],
        )
        .await?
        .ok_or_else(|| tenant_missing(tenant))?;
    Ok(Balance {
        balance: pen_from_text(&row.try_get::<_, String>(0)?, "tenants.balance")?,
        leased: pen_from_text(&row.try_get::<_, String>(1)?, "leases.amount")?,
    })
}

/// The lease columns every answer about a lease reads, in this order.
const READING: &str = "amount::text, spent::text, version";

/// A lease row as [`READING`] selects it, from column `at` on.
pub(super) fn reading(row: &tokio_postgres::Row, at: usize) -> PgResult<LeaseReading> {
    Ok(LeaseReading {
        amount: pen_from_text(&row.try_get::<_, String>(at)?, "leases.amount")?,
        spent: pen_from_text(&row.try_get::<_, String>(at + 1)?, "leases.spent")?,
        version: row.try_get(at + 2)?,
    })
}

pub(super) async fn acquire_lease_tx(
    client: &mut Client,
    replica: &str,
    tenant: TenantId,
    ask: LeaseAsk,
) -> PgResult<LeaseGrant> {
    let tx = client.transaction().await?;
    let balance = lock_tenant(&tx, tenant).await?;
    let leased = tx
        .query_typed_one(
            "SELECT COALESCE(SUM(amount), 0)::text,
                    COALESCE(SUM(amount) FILTER (WHERE replica = $2), 0)::text
               FROM leases WHERE tenant_id = $1",
            &[(&tenant, Type::INT8), (&replica, Type::TEXT)],
        )
        .await?;
    let own = pen_from_text(&leased.try_get::<_, String>(1)?, "leases.amount")?;
    let leased = pen_from_text(&leased.try_get::<_, String>(0)?, "leases.amount")?;
    let granted = lease_grant(ask.need, ask.want, balance - leased);
    // The row is created even for nothing granted: a replica's answers about its lease are
    // always about a row (see `quipu_core::billing::book`).
    let row = tx
        .query_typed_one(
            &format!(
                "INSERT INTO leases (tenant_id, replica, amount, heartbeat_at, version)
                 VALUES ($1, $2, $3::numeric, {now}, 1)
                 ON CONFLICT (tenant_id, replica) DO UPDATE
                 SET amount = leases.amount + EXCLUDED.amount,
                     heartbeat_at = EXCLUDED.heartbeat_at,
                     version = leases.version + 1
                 RETURNING {READING}",
                now = db_now_ms!(),
            ),
            &[
                (&tenant, Type::INT8),
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

pub(super) async fn release_lease_q(
    client: &mut Client,
    replica: &str,
    tenant: TenantId,
    amount: Pen,
) -> PgResult<Option<LeaseReading>> {
    // Shrinking a lease never breaks `Σ leases ≤ balance`, so no tenant lock is needed; the
    // row lock of the UPDATE serialises it with a concurrent `record` of the same replica.
    let row = client
        .query_typed_opt(
            &format!(
                "UPDATE leases SET amount = GREATEST(amount - $3::numeric, 0),
                                   version = version + 1
                  WHERE tenant_id = $1 AND replica = $2
                  RETURNING {READING}"
            ),
            &[
                (&tenant, Type::INT8),
                (&replica, Type::TEXT),
                (&pen_to_text(amount), Type::TEXT),
            ],
        )
        .await?;
    row.map(|r| reading(&r, 0)).transpose()
}

pub(super) async fn heartbeat_q(
    client: &mut Client,
    replica: &str,
) -> PgResult<Vec<(TenantId, LeaseReading)>> {
    let rows = client
        .query_typed(
            &format!(
                "UPDATE leases SET heartbeat_at = {now} WHERE replica = $1
                 RETURNING tenant_id, {READING}",
                now = db_now_ms!(),
            ),
            &[(&replica, Type::TEXT)],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push((r.try_get::<_, i64>(0)?, reading(&r, 1)?));
    }
    Ok(out)
}

pub(super) async fn reclaim_q(client: &mut Client, max_age_ms: i64) -> PgResult<u64> {
    Ok(client
        .execute_typed(
            concat!(
                "UPDATE leases SET amount = 0, version = version + 1
                  WHERE amount > 0 AND heartbeat_at < ",
                db_now_ms!(),
                " - $1"
            ),
            &[(&max_age_ms, Type::INT8)],
        )
        .await?)
}

pub(super) async fn forget_q(client: &mut Client, max_age_ms: i64) -> PgResult<u64> {
    Ok(client
        .execute_typed(
            concat!(
                "DELETE FROM leases WHERE heartbeat_at < ",
                db_now_ms!(),
                " - $1"
            ),
            &[(&max_age_ms, Type::INT8)],
        )
        .await?)
}

pub(super) async fn drop_leases_q(client: &mut Client, replica: &str) -> PgResult<()> {
    client
        .execute_typed(
            "DELETE FROM leases WHERE replica = $1",
            &[(&replica, Type::TEXT)],
        )
        .await?;
    Ok(())
}
