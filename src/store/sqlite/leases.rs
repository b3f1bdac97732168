//! Leases and shared rate windows on SQLite: the leases replicas hold against balances (grant,
//! release, heartbeat, reclaim, drop), with the helpers `record` also charges through, and the
//! rate windows several processes on one host may share (the old and new process of a graceful
//! upgrade, or replicas configured with `limits.engine = "store"`).
//!
//! Leases are TEXT decimal integers of pico-soles (see `sql_money`), read, changed in Rust
//! (i128) and written back inside the transaction. A batch of rate-window asks is one `BEGIN
//! IMMEDIATE` transaction, so it is atomic against every other process's.
//!
//! There is no channel between processes here: the replica signals of PostgreSQL
//! (`LISTEN`/`NOTIFY`) have no SQLite counterpart, so [`ReplicaChannel`] keeps its defaults.

use super::tenants::read_balance;
use super::{sql_err, write_tx, SqliteStore};
use crate::money::Pen;
use crate::store::sql_money::{pen_from_text, pen_to_text};
use crate::store::{
    check_quota_asks, now_ms, CapPool, CapTerms, LeaseAsk, LeaseGrant, LeaseReading, LeaseStore,
    QuotaAsk, QuotaGrant, ReplicaChannel, StoreError, StoreResult, TenantId, UnixMs,
};
use async_trait::async_trait;
use quipu_core::billing::lease::lease_grant;
use rusqlite::{params, Connection, OptionalExtension, Transaction};

/// Every lease on the tenant: replica → amount.
pub(super) fn read_leases(
    tx: &Transaction<'_>,
    tenant: TenantId,
) -> StoreResult<Vec<(String, Pen)>> {
    let mut stmt = tx
        .prepare_cached("SELECT replica, amount FROM leases WHERE tenant_id = ?1")
        .map_err(sql_err)?;
    let rows = stmt
        .query_map(params![tenant], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(sql_err)?;
    let mut out = Vec::new();
    for row in rows {
        let (replica, amount) = row.map_err(sql_err)?;
        out.push((replica, pen_from_text(&amount, "leases.amount")?));
    }
    Ok(out)
}

/// `replica`'s lease row on the tenant, if it has one.
pub(super) fn read_own(
    tx: &Transaction<'_>,
    tenant: TenantId,
    replica: &str,
) -> StoreResult<Option<LeaseReading>> {
    let row: Option<(String, String, i64)> = tx
        .prepare_cached(
            "SELECT amount, spent, version FROM leases WHERE tenant_id = ?1 AND replica = ?2",
        )
        .and_then(|mut s| {
            s.query_row(params![tenant, replica], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
        })
        .map_err(sql_err)?;
    row.map(|(amount, spent, version)| reading(&amount, &spent, version))
        .transpose()
}

pub(super) fn reading(amount: &str, spent: &str, version: i64) -> StoreResult<LeaseReading> {
    Ok(LeaseReading {
        amount: pen_from_text(amount, "leases.amount")?,
        spent: pen_from_text(spent, "leases.spent")?,
        version,
    })
}

/// Writes `replica`'s lease row on the tenant (created if missing) with the next version;
/// refreshes its heartbeat when `heartbeat` is given. Returns the row as written.
pub(super) fn write_own(
    tx: &Transaction<'_>,
    tenant: TenantId,
    replica: &str,
    amount: Pen,
    spent: Pen,
    heartbeat: Option<UnixMs>,
) -> StoreResult<LeaseReading> {
    let version: i64 = tx
        .prepare_cached(
            "INSERT INTO leases (tenant_id, replica, amount, spent, version, heartbeat_at)
             VALUES (?1, ?2, ?3, ?4, 1, COALESCE(?5, 0))
             ON CONFLICT (tenant_id, replica) DO UPDATE
             SET amount = excluded.amount, spent = excluded.spent, version = leases.version + 1,
                 heartbeat_at = COALESCE(?5, leases.heartbeat_at)
             RETURNING version",
        )
        .and_then(|mut s| {
            s.query_row(
                params![
                    tenant,
                    replica,
                    pen_to_text(amount),
                    pen_to_text(spent),
                    heartbeat
                ],
                |r| r.get(0),
            )
        })
        .map_err(sql_err)?;
    Ok(LeaseReading {
        amount,
        spent,
        version,
    })
}

fn grant_lease(
    conn: &mut Connection,
    replica: String,
    tenant: TenantId,
    ask: LeaseAsk,
) -> StoreResult<LeaseGrant> {
    let now = now_ms();
    let tx = write_tx(conn)?;
    let balance = read_balance(&tx, tenant)?;
    let leased: Pen = read_leases(&tx, tenant)?.into_iter().map(|l| l.1).sum();
    let own = read_own(&tx, tenant, &replica)?;
    let current = own.map_or(Pen::ZERO, |r| r.amount);
    let granted = lease_grant(ask.need, ask.want, balance - leased);
    let spent = own.map_or(Pen::ZERO, |r| r.spent);
    let reading = write_own(&tx, tenant, &replica, current + granted, spent, Some(now))?;
    tx.commit().map_err(sql_err)?;
    Ok(LeaseGrant {
        reading,
        granted,
        elsewhere: leased - current,
    })
}

fn release_lease(
    conn: &mut Connection,
    replica: String,
    tenant: TenantId,
    amount: Pen,
) -> StoreResult<Option<LeaseReading>> {
    let tx = write_tx(conn)?;
    let Some(own) = read_own(&tx, tenant, &replica)? else {
        return Ok(None);
    };
    let left = (own.amount - amount).max(Pen::ZERO);
    let reading = write_own(&tx, tenant, &replica, left, own.spent, None)?;
    tx.commit().map_err(sql_err)?;
    Ok(Some(reading))
}

fn heartbeat(conn: &mut Connection, replica: String) -> StoreResult<Vec<(TenantId, LeaseReading)>> {
    let tx = write_tx(conn)?;
    let mut out = Vec::new();
    {
        let mut stmt = tx
            .prepare_cached(
                "UPDATE leases SET heartbeat_at = ?2 WHERE replica = ?1
                 RETURNING tenant_id, amount, spent, version",
            )
            .map_err(sql_err)?;
        let rows = stmt
            .query_map(params![replica, now_ms()], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })
            .map_err(sql_err)?;
        for row in rows {
            let (tenant, amount, spent, version) = row.map_err(sql_err)?;
            out.push((tenant, reading(&amount, &spent, version)?));
        }
    }
    tx.commit().map_err(sql_err)?;
    Ok(out)
}

fn reclaim_stale_leases(conn: &mut Connection, max_age_ms: i64) -> StoreResult<u64> {
    let cutoff = now_ms().saturating_sub(max_age_ms);
    let caps = super::caps::reclaim(conn, cutoff)?;
    let n = conn
        .execute(
            "UPDATE leases SET amount = '0', version = version + 1
              WHERE heartbeat_at < ?1 AND amount <> '0'",
            params![cutoff],
        )
        .map_err(sql_err)?;
    Ok(n as u64 + caps)
}

fn forget_silent_leases(conn: &mut Connection, max_age_ms: i64) -> StoreResult<u64> {
    let cutoff = now_ms().saturating_sub(max_age_ms);
    let caps = super::caps::forget(conn, cutoff)?;
    let n = conn
        .execute(
            "DELETE FROM leases WHERE heartbeat_at < ?1",
            params![cutoff],
        )
        .map_err(sql_err)?;
    Ok(n as u64 + caps)
}

fn drop_leases(conn: &mut Connection, replica: String) -> StoreResult<()> {
    super::caps::drop_all(conn, &replica)?;
    conn.execute("DELETE FROM leases WHERE replica = ?1", params![replica])
        .map_err(sql_err)?;
    Ok(())
}

fn to_i64(v: u64, what: &str) -> StoreResult<i64> {
    i64::try_from(v)
        .map_err(|_| StoreError::Invalid(format!("{what} {v} does not fit a 64-bit count")))
}

fn take_quota(conn: &mut Connection, asks: &[QuotaAsk]) -> StoreResult<(Vec<QuotaGrant>, UnixMs)> {
    let tx = write_tx(conn)?;
    let mut grants = Vec::with_capacity(asks.len());
    for a in asks {
        let want = to_i64(a.want, "a rate-window ask of")?;
        let limit = to_i64(a.limit, "a rate limit of")?;
        let taken: i64 = tx
            .prepare_cached(
                "SELECT taken FROM rate_windows
                  WHERE subject = ?1 AND window_ms = ?2 AND window_start = ?3",
            )
            .and_then(|mut s| {
                s.query_row(params![a.subject, a.window_ms, a.window_start], |r| {
                    r.get(0)
                })
                .optional()
            })
            .map_err(sql_err)?
            .unwrap_or(0);
        let base = taken.saturating_add(a.add).max(0);
        let granted = want.min(limit.saturating_sub(base).max(0));
        let after = base.saturating_add(granted);
        tx.prepare_cached(
            "INSERT INTO rate_windows (subject, window_ms, window_start, taken, granted, ends_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (subject, window_ms, window_start)
             DO UPDATE SET taken = excluded.taken, granted = excluded.granted",
        )
        .and_then(|mut s| {
            s.execute(params![
                a.subject,
                a.window_ms,
                a.window_start,
                after,
                granted,
                a.window_start.saturating_add(a.window_ms)
            ])
        })
        .map_err(sql_err)?;
        grants.push(QuotaGrant {
            granted: u64::try_from(granted).unwrap_or(0),
            taken: u64::try_from(after).unwrap_or(0),
        });
    }
    tx.commit().map_err(sql_err)?;
    Ok((grants, now_ms()))
}

fn expire_quota(conn: &mut Connection, age_ms: i64) -> StoreResult<u64> {
    let cutoff = now_ms().saturating_sub(age_ms);
    let n = conn
        .execute(
            "DELETE FROM rate_windows WHERE ends_at < ?1",
            params![cutoff],
        )
        .map_err(sql_err)?;
    Ok(n as u64)
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn grant_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        ask: LeaseAsk,
    ) -> StoreResult<LeaseGrant> {
        let replica = replica.to_owned();
        self.run(move |conn| grant_lease(conn, replica, tenant, ask))
            .await
    }

    async fn release_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        amount: Pen,
    ) -> StoreResult<Option<LeaseReading>> {
        let amount = amount.max(Pen::ZERO);
        let replica = replica.to_owned();
        self.run(move |conn| release_lease(conn, replica, tenant, amount))
            .await
    }

    async fn heartbeat(&self, replica: &str) -> StoreResult<Vec<(TenantId, LeaseReading)>> {
        let replica = replica.to_owned();
        self.run(move |conn| heartbeat(conn, replica)).await
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
        self.run(move |conn| reclaim_stale_leases(conn, max_age_ms))
            .await
    }

    async fn forget_silent_leases(&self, max_age_ms: i64) -> StoreResult<u64> {
        self.run(move |conn| forget_silent_leases(conn, max_age_ms))
            .await
    }

    async fn drop_leases(&self, replica: &str) -> StoreResult<()> {
        let replica = replica.to_owned();
        self.run(move |conn| drop_leases(conn, replica)).await
    }

    async fn take_quota(&self, asks: &[QuotaAsk]) -> StoreResult<(Vec<QuotaGrant>, UnixMs)> {
        check_quota_asks(asks)?;
        let asks = asks.to_vec();
        self.run(move |conn| take_quota(conn, &asks)).await
    }

    async fn expire_quota(&self, age_ms: i64) -> StoreResult<u64> {
        self.run(move |conn| expire_quota(conn, age_ms)).await
    }
}

/// One process: no channel to other replicas (see the module docs).
impl ReplicaChannel for SqliteStore {}
