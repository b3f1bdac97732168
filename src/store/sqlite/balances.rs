//! Money held on SQLite: top-ups, balances, and the leases replicas hold against them (grant,
//! release, heartbeat, reclaim, drop), with the helpers `record` also charges through.
//!
//! Money follows `sql_money`: ledger deltas are INTEGER pico-soles; balances and leases are
//! TEXT decimal integers, read, changed in Rust (i128) and written back inside the transaction;
//! sums use split halves so they can neither overflow nor become floats.

use super::{read_tx, sql_err, write_tx};
use crate::money::Pen;
use crate::store::rows::{replayed_top_up, tenant_missing, EarlierTopUp};
use crate::store::sql_money::{pen_from_text, pen_to_text};
use crate::store::{
    now_ms, Balance, LeaseAsk, LeaseGrant, LeaseReading, StoreResult, TenantId, TopUp,
    TopUpOutcome, UnixMs,
};
use quipu_core::billing::lease::lease_grant;
use rusqlite::{params, Connection, OptionalExtension, Transaction};

/// The tenant's balance, or `NotFound`.
pub(super) fn read_balance(tx: &Transaction<'_>, tenant: TenantId) -> StoreResult<Pen> {
    let text: Option<String> = tx
        .prepare_cached("SELECT balance FROM tenants WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![tenant], |r| r.get(0)).optional())
        .map_err(sql_err)?;
    match text {
        Some(t) => pen_from_text(&t, "tenants.balance"),
        None => Err(tenant_missing(tenant)),
    }
}

pub(super) fn write_balance(
    tx: &Transaction<'_>,
    tenant: TenantId,
    balance: Pen,
) -> StoreResult<()> {
    tx.prepare_cached("UPDATE tenants SET balance = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![tenant, pen_to_text(balance)]))
        .map_err(sql_err)?;
    Ok(())
}

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

pub(super) fn top_up_once(
    conn: &mut Connection,
    tenant: TenantId,
    amount: Pen,
    delta: i64,
    id: String,
    note: String,
) -> StoreResult<TopUpOutcome> {
    let now = now_ms();
    let tx = write_tx(conn)?;
    let balance = read_balance(&tx, tenant)?;
    let earlier = tx
        .query_row(
            "SELECT tenant_id, delta, at, note FROM ledger WHERE entry_id = ?1",
            params![id],
            |r| {
                Ok(EarlierTopUp {
                    tenant_id: r.get(0)?,
                    delta: r.get(1)?,
                    at: r.get(2)?,
                    note: r.get(3)?,
                })
            },
        )
        .optional()
        .map_err(sql_err)?;
    if let Some(earlier) = earlier {
        return replayed_top_up(id, tenant, amount, delta, earlier, balance);
    }
    tx.execute(
        "INSERT INTO ledger (entry_id, kind, tenant_id, at, delta, note)
                 VALUES (?1, 'topup', ?2, ?3, ?4, ?5)",
        params![id, tenant, now, delta, note],
    )
    .map_err(sql_err)?;
    write_balance(&tx, tenant, balance + amount)?;
    tx.commit().map_err(sql_err)?;
    Ok(TopUpOutcome {
        top_up: TopUp {
            id,
            tenant_id: tenant,
            amount,
            at: now,
            note,
        },
        balance: balance + amount,
        replayed: false,
    })
}

pub(super) fn balance(conn: &mut Connection, tenant: TenantId) -> StoreResult<Balance> {
    let tx = read_tx(conn)?;
    let balance = read_balance(&tx, tenant)?;
    let leased = read_leases(&tx, tenant)?.into_iter().map(|l| l.1).sum();
    Ok(Balance { balance, leased })
}

pub(super) fn grant_lease(
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

pub(super) fn release_lease(
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

pub(super) fn heartbeat(
    conn: &mut Connection,
    replica: String,
) -> StoreResult<Vec<(TenantId, LeaseReading)>> {
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

pub(super) fn reclaim_stale_leases(conn: &mut Connection, max_age_ms: i64) -> StoreResult<u64> {
    let cutoff = now_ms().saturating_sub(max_age_ms);
    let n = conn
        .execute(
            "UPDATE leases SET amount = '0', version = version + 1
              WHERE heartbeat_at < ?1 AND amount <> '0'",
            params![cutoff],
        )
        .map_err(sql_err)?;
    Ok(n as u64)
}

pub(super) fn forget_silent_leases(conn: &mut Connection, max_age_ms: i64) -> StoreResult<u64> {
    let cutoff = now_ms().saturating_sub(max_age_ms);
    let n = conn
        .execute(
            "DELETE FROM leases WHERE heartbeat_at < ?1",
            params![cutoff],
        )
        .map_err(sql_err)?;
    Ok(n as u64)
}

pub(super) fn drop_leases(conn: &mut Connection, replica: String) -> StoreResult<()> {
    conn.execute("DELETE FROM leases WHERE replica = ?1", params![replica])
        .map_err(sql_err)?;
    Ok(())
}
