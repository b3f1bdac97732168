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
    now_ms, Balance, LeaseAsk, LeaseGrant, StoreResult, TenantId, TopUp, TopUpOutcome, UnixMs,
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

pub(super) fn write_lease(
    tx: &Transaction<'_>,
    tenant: TenantId,
    replica: &str,
    amount: Pen,
    heartbeat: Option<UnixMs>,
) -> StoreResult<()> {
    let r = match heartbeat {
        Some(at) => tx
            .prepare_cached(
                "INSERT INTO leases (tenant_id, replica, amount, heartbeat_at)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (tenant_id, replica)
                 DO UPDATE SET amount = excluded.amount, heartbeat_at = excluded.heartbeat_at",
            )
            .and_then(|mut s| s.execute(params![tenant, replica, pen_to_text(amount), at])),
        None => tx
            .prepare_cached("UPDATE leases SET amount = ?3 WHERE tenant_id = ?1 AND replica = ?2")
            .and_then(|mut s| s.execute(params![tenant, replica, pen_to_text(amount)])),
    };
    r.map_err(sql_err)?;
    Ok(())
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
    let leases = read_leases(&tx, tenant)?;
    let leased: Pen = leases.iter().map(|l| l.1).sum();
    let own = leases.iter().find(|l| l.0 == replica).map(|l| l.1);
    let grant = lease_grant(ask.need, ask.want, balance - leased);
    let current = own.unwrap_or_default();
    if grant > Pen::ZERO || own.is_some() {
        write_lease(&tx, tenant, &replica, current + grant, Some(now))?;
    }
    tx.commit().map_err(sql_err)?;
    Ok(LeaseGrant {
        granted: grant,
        held: current + grant,
        elsewhere: leased - current,
    })
}

pub(super) fn release_lease(
    conn: &mut Connection,
    replica: String,
    tenant: TenantId,
    amount: Pen,
) -> StoreResult<()> {
    let tx = write_tx(conn)?;
    let own = read_leases(&tx, tenant)?
        .into_iter()
        .find(|l| l.0 == replica);
    if let Some((_, lease)) = own {
        write_lease(&tx, tenant, &replica, (lease - amount).max(Pen::ZERO), None)?;
    }
    tx.commit().map_err(sql_err)
}

pub(super) fn heartbeat(
    conn: &mut Connection,
    replica: String,
) -> StoreResult<Vec<(TenantId, Pen)>> {
    let tx = write_tx(conn)?;
    tx.prepare_cached("UPDATE leases SET heartbeat_at = ?2 WHERE replica = ?1")
        .and_then(|mut s| s.execute(params![replica, now_ms()]))
        .map_err(sql_err)?;
    let mut out = Vec::new();
    {
        let mut stmt = tx
            .prepare_cached("SELECT tenant_id, amount FROM leases WHERE replica = ?1")
            .map_err(sql_err)?;
        let rows = stmt
            .query_map(params![replica], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(sql_err)?;
        for row in rows {
            let (tenant, amount) = row.map_err(sql_err)?;
            out.push((tenant, pen_from_text(&amount, "leases.amount")?));
        }
    }
    tx.commit().map_err(sql_err)?;
    Ok(out)
}

pub(super) fn reclaim_stale_leases(conn: &mut Connection, max_age_ms: i64) -> StoreResult<u64> {
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
