//! Leases and shared rate windows on PostgreSQL ([`LeaseStore`]).
//!
//! **Leases.** Granting one locks the tenant row first, as every transaction that moves money
//! does (see `ledger`); shrinking one (release, reclaim, drop) never breaks `Σ leases ≤
//! balance`, so it needs no tenant lock. Heartbeats use the database's clock (see the
//! backend's docs).
//!
//! **Rate windows.** A batch of asks is two statements, sent together (pipelined, one round
//! trip): an `INSERT … ON CONFLICT DO NOTHING` that makes sure every window's row exists, then
//! one `UPDATE … FROM UNNEST(…)` that applies every ask. Each row is changed under its row lock
//! with the values the `SET` reads from it, so concurrent replicas' asks on one window
//! serialise and none is lost; the amount granted is written to the row's `granted` column by
//! the same `SET` and returned (PostgreSQL before 18 cannot return a row's old values). The
//! statements need no transaction: the insert only makes sure the row exists.

use super::ledger::lock_tenant;
use super::{PgErr, PgResult, PgStore};
use crate::money::Pen;
use crate::store::sql_money::{pen_from_text, pen_to_text};
use crate::store::{
    check_quota_asks, CapPool, CapTerms, LeaseAsk, LeaseGrant, LeaseReading, LeaseStore, QuotaAsk,
    QuotaGrant, StoreError, StoreResult, TenantId, UnixMs,
};
use async_trait::async_trait;
use quipu_core::billing::lease::lease_grant;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

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

/// `replica`'s lease row on the tenant, if it has one (read in `tx`'s snapshot).
pub(super) async fn own(
    tx: &Transaction<'_>,
    tenant: TenantId,
    replica: &str,
) -> PgResult<Option<LeaseReading>> {
    tx.query_typed_opt(
        &format!("SELECT {READING} FROM leases WHERE tenant_id = $1 AND replica = $2"),
        &[(&tenant, Type::INT8), (&replica, Type::TEXT)],
    )
    .await?
    .map(|r| reading(&r, 0))
    .transpose()
}

async fn acquire_lease_tx(
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

async fn release_lease_q(
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

async fn heartbeat_q(
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

async fn reclaim_q(client: &mut Client, max_age_ms: i64) -> PgResult<u64> {
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

async fn forget_q(client: &mut Client, max_age_ms: i64) -> PgResult<u64> {
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

async fn drop_leases_q(client: &mut Client, replica: &str) -> PgResult<()> {
    client
        .execute_typed(
            "DELETE FROM leases WHERE replica = $1",
            &[(&replica, Type::TEXT)],
        )
        .await?;
    Ok(())
}

/// The store's clock, milliseconds since the epoch.
async fn store_now(client: &mut Client) -> PgResult<UnixMs> {
    let row = client
        .query_typed_one(concat!("SELECT ", db_now_ms!()), &[])
        .await?;
    Ok(row.try_get(0)?)
}

fn to_i64(v: u64, what: &str) -> Result<i64, PgErr> {
    i64::try_from(v).map_err(|_| {
        PgErr::Store(StoreError::Invalid(format!(
            "{what} {v} does not fit a 64-bit count"
        )))
    })
}

async fn take_quota(client: &mut Client, asks: &[QuotaAsk]) -> PgResult<(Vec<QuotaGrant>, UnixMs)> {
    let subjects: Vec<&str> = asks.iter().map(|a| a.subject.as_str()).collect();
    let windows: Vec<i64> = asks.iter().map(|a| a.window_ms).collect();
    let starts: Vec<i64> = asks.iter().map(|a| a.window_start).collect();
    let adds: Vec<i64> = asks.iter().map(|a| a.add).collect();
    let mut wants = Vec::with_capacity(asks.len());
    let mut limits = Vec::with_capacity(asks.len());
    for a in asks {
        wants.push(to_i64(a.want, "a rate-window ask of")?);
        limits.push(to_i64(a.limit, "a rate limit of")?);
    }
    let idx: Vec<i64> = (0..asks.len() as i64).collect();
    let ensure_params = [
        (
            &subjects as &(dyn tokio_postgres::types::ToSql + Sync),
            Type::TEXT_ARRAY,
        ),
        (&windows, Type::INT8_ARRAY),
        (&starts, Type::INT8_ARRAY),
    ];
    let apply_params = [
        (
            &subjects as &(dyn tokio_postgres::types::ToSql + Sync),
            Type::TEXT_ARRAY,
        ),
        (&windows, Type::INT8_ARRAY),
        (&starts, Type::INT8_ARRAY),
        (&adds, Type::INT8_ARRAY),
        (&wants, Type::INT8_ARRAY),
        (&limits, Type::INT8_ARRAY),
        (&idx, Type::INT8_ARRAY),
    ];
    let ensure = client.execute_typed(
        "INSERT INTO rate_windows (subject, window_ms, window_start, taken, ends_at)
         SELECT s, w, ws, 0, ws + w FROM UNNEST($1::text[], $2::int8[], $3::int8[]) AS u(s, w, ws)
         ON CONFLICT (subject, window_ms, window_start) DO NOTHING",
        &ensure_params,
    );
    // `base`: the count after the unconditional `add`, never below zero; then the grant.
    let apply = client.query_typed(
        concat!(
            "UPDATE rate_windows AS r
                SET taken = GREATEST(r.taken + u.a, 0)
                            + LEAST(u.want, GREATEST(u.lim - GREATEST(r.taken + u.a, 0), 0)),
                    granted = LEAST(u.want, GREATEST(u.lim - GREATEST(r.taken + u.a, 0), 0))
               FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::int8[],
                           $6::int8[], $7::int8[]) AS u(s, w, ws, a, want, lim, i)
              WHERE r.subject = u.s AND r.window_ms = u.w AND r.window_start = u.ws
          RETURNING u.i, r.granted, r.taken, ",
            db_now_ms!()
        ),
        &apply_params,
    );
    // Both are sent before either answer is read: one round trip. The insert is queued first
    // on the connection, so the update sees its rows.
    let (ensured, rows) = futures::future::join(ensure, apply).await;
    ensured?;
    let rows = rows?;
    let mut grants = vec![
        QuotaGrant {
            granted: 0,
            taken: 0
        };
        asks.len()
    ];
    let mut now: UnixMs = 0;
    let mut seen = 0usize;
    for r in rows {
        let i: i64 = r.try_get(0)?;
        let granted: i64 = r.try_get(1)?;
        let taken: i64 = r.try_get(2)?;
        now = r.try_get(3)?;
        if let Some(g) = usize::try_from(i).ok().and_then(|i| grants.get_mut(i)) {
            *g = QuotaGrant {
                granted: u64::try_from(granted).unwrap_or(0),
                taken: u64::try_from(taken).unwrap_or(0),
            };
            seen += 1;
        }
    }
    if seen != asks.len() {
        // A window expired between the two statements (only ones long over are): say so
        // rather than report a grant of nothing.
        return Err(PgErr::Store(StoreError::Backend(format!(
            "{} of {} rate windows vanished while being updated",
            asks.len() - seen,
            asks.len()
        ))));
    }
    Ok((grants, now))
}

async fn expire_quota(client: &mut Client, age_ms: i64) -> PgResult<u64> {
    Ok(client
        .execute_typed(
            concat!(
                "DELETE FROM rate_windows WHERE ends_at < ",
                db_now_ms!(),
                " - $1"
            ),
            &[(&age_ms, Type::INT8)],
        )
        .await?)
}

#[async_trait]
impl LeaseStore for PgStore {
    async fn grant_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        ask: LeaseAsk,
    ) -> StoreResult<LeaseGrant> {
        with_retry!(self, c => acquire_lease_tx(c, replica, tenant, ask))
    }

    async fn release_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        amount: Pen,
    ) -> StoreResult<Option<LeaseReading>> {
        let amount = amount.max(Pen::ZERO);
        with_retry!(self, c => release_lease_q(c, replica, tenant, amount))
    }

    async fn heartbeat(&self, replica: &str) -> StoreResult<Vec<(TenantId, LeaseReading)>> {
        with_retry!(self, c => heartbeat_q(c, replica))
    }

    async fn grant_cap_lease(
        &self,
        replica: &str,
        pool: &CapPool,
        terms: CapTerms,
        ask: LeaseAsk,
    ) -> StoreResult<LeaseGrant> {
        self.grant_cap(replica, pool, terms, ask).await
    }

    async fn release_cap_lease(
        &self,
        replica: &str,
        pool: &CapPool,
        amount: Pen,
    ) -> StoreResult<Option<LeaseReading>> {
        self.release_cap(replica, pool, amount).await
    }

    async fn cap_heartbeat(&self, replica: &str) -> StoreResult<Vec<(CapPool, LeaseReading)>> {
        self.heartbeat_caps(replica).await
    }

    async fn cap_spent(&self, pools: &[String]) -> StoreResult<Vec<(String, Pen, Pen)>> {
        self.caps_spent(pools).await
    }

    async fn reclaim_stale_leases(&self, max_age_ms: i64) -> StoreResult<u64> {
        let caps = with_retry!(self, c => super::caps::reclaim_q(c, max_age_ms))?;
        Ok(with_retry!(self, c => reclaim_q(c, max_age_ms))? + caps)
    }

    async fn forget_silent_leases(&self, max_age_ms: i64) -> StoreResult<u64> {
        let caps = with_retry!(self, c => super::caps::forget_q(c, max_age_ms))?;
        Ok(with_retry!(self, c => forget_q(c, max_age_ms))? + caps)
    }

    async fn drop_leases(&self, replica: &str) -> StoreResult<()> {
        with_retry!(self, c => super::caps::drop_q(c, replica))?;
        with_retry!(self, c => drop_leases_q(c, replica))
    }

    async fn take_quota(&self, asks: &[QuotaAsk]) -> StoreResult<(Vec<QuotaGrant>, UnixMs)> {
        check_quota_asks(asks)?;
        if asks.is_empty() {
            return with_retry!(self, c => store_now(c)).map(|now| (Vec::new(), now));
        }
        with_retry!(self, c => take_quota(c, asks))
    }

    async fn expire_quota(&self, age_ms: i64) -> StoreResult<u64> {
        with_retry!(self, c => expire_quota(c, age_ms))
    }
}
