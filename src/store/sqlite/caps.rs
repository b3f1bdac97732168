//! Cap pools and their leases on SQLite: what `leases` does for a tenant's balance, done for
//! one cap in one period (see `quipu_core::billing::pool`). A pool's row holds its limit and
//! what was spent in it; replicas lease parts of `limit − spent − Σ leases`, and `record`
//! charges a request row against the pools it names (its `caps`) in the same transaction as
//! the balance (see [`charge_caps`]).
//!
//! Amounts are TEXT decimal integers of pico-soles, changed in Rust inside the transaction, as
//! the balance's are (see `sql_money`). A charge that takes a pool past 80 % or 100 % of its
//! cap writes the webhook event in the same transaction (`store::webhooks`).

use super::{sql_err, write_tx, SqliteStore};
use crate::money::Pen;
use crate::store::sql_money::{pen_from_text, pen_to_text};
use crate::store::webhooks::{cap_events, WebhookEvent};
use crate::store::{now_ms, CapPool, CapTerms, LeaseAsk, LeaseGrant, LeaseReading, StoreResult};
use quipu_core::billing::lease::lease_grant;
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use std::collections::BTreeMap;

fn reading(amount: &str, spent: &str, version: i64) -> StoreResult<LeaseReading> {
    Ok(LeaseReading {
        amount: pen_from_text(amount, "cap_leases.amount")?,
        spent: pen_from_text(spent, "cap_leases.spent")?,
        version,
    })
}

fn own(tx: &Transaction<'_>, pool: &str, replica: &str) -> StoreResult<Option<LeaseReading>> {
    let row: Option<(String, String, i64)> = tx
        .prepare_cached(
            "SELECT amount, spent, version FROM cap_leases WHERE pool = ?1 AND replica = ?2",
        )
        .and_then(|mut s| {
            s.query_row(params![pool, replica], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
        })
        .map_err(sql_err)?;
    row.map(|(a, s, v)| reading(&a, &s, v)).transpose()
}

fn write_own(
    tx: &Transaction<'_>,
    pool: &str,
    replica: &str,
    amount: Pen,
    spent: Pen,
    heartbeat: Option<i64>,
) -> StoreResult<LeaseReading> {
    let version: i64 = tx
        .prepare_cached(
            "INSERT INTO cap_leases (pool, replica, amount, spent, version, heartbeat_at)
             VALUES (?1, ?2, ?3, ?4, 1, COALESCE(?5, 0))
             ON CONFLICT (pool, replica) DO UPDATE
             SET amount = excluded.amount, spent = excluded.spent,
                 version = cap_leases.version + 1,
                 heartbeat_at = COALESCE(?5, cap_leases.heartbeat_at)
             RETURNING version",
        )
        .and_then(|mut s| {
            s.query_row(
                params![
                    pool,
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

/// The pool's limit and spent, its row created (nothing spent) or its limit updated first.
fn pool_row(tx: &Transaction<'_>, pool: &CapPool, terms: CapTerms) -> StoreResult<(Pen, Pen)> {
    let (limit, spent): (String, String) = tx
        .prepare_cached(
            "INSERT INTO cap_pools (pool, tenant_id, cap_limit, spent, period_end)
             VALUES (?1, ?2, ?3, '0', ?4)
             ON CONFLICT (pool) DO UPDATE SET cap_limit = excluded.cap_limit
             RETURNING cap_limit, spent",
        )
        .and_then(|mut s| {
            s.query_row(
                params![
                    pool.to_string(),
                    pool.tenant,
                    pen_to_text(terms.limit),
                    terms.period_end
                ],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .map_err(sql_err)?;
    Ok((
        pen_from_text(&limit, "cap_pools.cap_limit")?,
        pen_from_text(&spent, "cap_pools.spent")?,
    ))
}

fn leased(tx: &Transaction<'_>, pool: &str) -> StoreResult<Pen> {
    let mut stmt = tx
        .prepare_cached("SELECT amount FROM cap_leases WHERE pool = ?1")
        .map_err(sql_err)?;
    let rows = stmt
        .query_map(params![pool], |r| r.get::<_, String>(0))
        .map_err(sql_err)?;
    let mut sum = Pen::ZERO;
    for amount in rows {
        sum += pen_from_text(&amount.map_err(sql_err)?, "cap_leases.amount")?;
    }
    Ok(sum)
}

fn grant(
    conn: &mut Connection,
    replica: String,
    pool: CapPool,
    terms: CapTerms,
    ask: LeaseAsk,
) -> StoreResult<LeaseGrant> {
    let tx = write_tx(conn)?;
    let (limit, spent) = pool_row(&tx, &pool, terms)?;
    let id = pool.to_string();
    let leased = leased(&tx, &id)?;
    let own = own(&tx, &id, &replica)?;
    let current = own.map_or(Pen::ZERO, |r| r.amount);
    let granted = lease_grant(ask.need, ask.want, limit - spent - leased);
    let reading = write_own(
        &tx,
        &id,
        &replica,
        current + granted,
        own.map_or(Pen::ZERO, |r| r.spent),
        Some(now_ms()),
    )?;
    tx.commit().map_err(sql_err)?;
    Ok(LeaseGrant {
        reading,
        granted,
        elsewhere: leased - current,
    })
}

fn release(
    conn: &mut Connection,
    replica: String,
    pool: CapPool,
    amount: Pen,
) -> StoreResult<Option<LeaseReading>> {
    let tx = write_tx(conn)?;
    let id = pool.to_string();
    let Some(own) = own(&tx, &id, &replica)? else {
        return Ok(None);
    };
    let left = (own.amount - amount).max(Pen::ZERO);
    let reading = write_own(&tx, &id, &replica, left, own.spent, None)?;
    tx.commit().map_err(sql_err)?;
    Ok(Some(reading))
}

fn heartbeat(conn: &mut Connection, replica: String) -> StoreResult<Vec<(CapPool, LeaseReading)>> {
    let tx = write_tx(conn)?;
    let mut out = Vec::new();
    {
        let mut stmt = tx
            .prepare_cached(
                "UPDATE cap_leases SET heartbeat_at = ?2 WHERE replica = ?1
                 RETURNING pool, amount, spent, version,
                           (SELECT tenant_id FROM cap_pools p WHERE p.pool = cap_leases.pool)",
            )
            .map_err(sql_err)?;
        let rows = stmt
            .query_map(params![replica, now_ms()], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })
            .map_err(sql_err)?;
        for row in rows {
            let (id, amount, spent, version, tenant) = row.map_err(sql_err)?;
            if let Some(pool) = CapPool::parse(&id, tenant) {
                out.push((pool, reading(&amount, &spent, version)?));
            }
        }
    }
    tx.commit().map_err(sql_err)?;
    Ok(out)
}

/// Charges the new rows of a `record` against their cap pools: each pool's `spent`, and the
/// recording replica's lease on it, as the balance and its lease are charged. `charged`: pool
/// → (its tenant, what the rows charge it). Returns the replica's lease rows after the charge.
pub(super) fn charge_caps(
    tx: &Transaction<'_>,
    replica: &str,
    charged: &BTreeMap<String, (i64, Pen)>,
) -> StoreResult<Vec<(CapPool, LeaseReading)>> {
    let mut leases = Vec::new();
    for (id, (tenant, charge)) in charged {
        if *charge == Pen::ZERO {
            continue;
        }
        let row: Option<(String, String)> = tx
            .prepare_cached("SELECT cap_limit, spent FROM cap_pools WHERE pool = ?1")
            .and_then(|mut s| {
                s.query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(sql_err)?;
        let Some((limit, before)) = row else {
            // Only rows reserved against a pool name it, and reserving creates the pool.
            log::warn!("a ledger row names cap pool {id}, which the store does not have");
            continue;
        };
        let limit = pen_from_text(&limit, "cap_pools.cap_limit")?;
        let before = pen_from_text(&before, "cap_pools.spent")?;
        let spent = before + *charge;
        tx.prepare_cached("UPDATE cap_pools SET spent = ?2 WHERE pool = ?1")
            .and_then(|mut s| s.execute(params![id, pen_to_text(spent)]))
            .map_err(sql_err)?;
        if let Some(pool) = CapPool::parse(id, *tenant) {
            cap_alerts(tx, &pool, limit, (before, spent))?;
        }
        if let Some(own) = own(tx, id, replica)? {
            let amount = (own.amount - *charge).max(Pen::ZERO);
            let reading = write_own(tx, id, replica, amount, own.spent + *charge, None)?;
            if let Some(pool) = CapPool::parse(id, *tenant) {
                leases.push((pool, reading));
            }
        }
    }
    Ok(leases)
}

/// `cap.reached_80` / `cap.reached_100` for a pool whose spent `record` just moved.
fn cap_alerts(
    tx: &Transaction<'_>,
    pool: &CapPool,
    limit: Pen,
    (before, after): (Pen, Pen),
) -> StoreResult<()> {
    let events = cap_events(pool, limit, before, after);
    if events.is_empty() {
        return Ok(());
    }
    let name: String = tx
        .prepare_cached("SELECT name FROM tenants WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![pool.tenant], |r| r.get(0)))
        .map_err(sql_err)?;
    for event in events {
        let event = WebhookEvent::new(&name, now_ms(), event);
        super::webhooks::emit_in(tx, pool.tenant, &event)?;
    }
    Ok(())
}

/// Zeroes the cap leases whose heartbeat is older than `cutoff`; how many.
pub(super) fn reclaim(conn: &Connection, cutoff: i64) -> StoreResult<u64> {
    let n = conn
        .execute(
            "UPDATE cap_leases SET amount = '0', version = version + 1
              WHERE heartbeat_at < ?1 AND amount <> '0'",
            params![cutoff],
        )
        .map_err(sql_err)?;
    Ok(n as u64)
}

/// Deletes the cap leases whose heartbeat is older than `cutoff`; how many.
pub(super) fn forget(conn: &Connection, cutoff: i64) -> StoreResult<u64> {
    let n = conn
        .execute(
            "DELETE FROM cap_leases WHERE heartbeat_at < ?1",
            params![cutoff],
        )
        .map_err(sql_err)?;
    Ok(n as u64)
}

/// Deletes every cap lease of `replica`.
pub(super) fn drop_all(conn: &Connection, replica: &str) -> StoreResult<()> {
    conn.execute(
        "DELETE FROM cap_leases WHERE replica = ?1",
        params![replica],
    )
    .map_err(sql_err)?;
    Ok(())
}

fn spent_of(conn: &mut Connection, pools: Vec<String>) -> StoreResult<Vec<(String, Pen, Pen)>> {
    let mut out = Vec::with_capacity(pools.len());
    let mut stmt = conn
        .prepare_cached("SELECT cap_limit, spent FROM cap_pools WHERE pool = ?1")
        .map_err(sql_err)?;
    for id in pools {
        let row: Option<(String, String)> = stmt
            .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .map_err(sql_err)?;
        if let Some((limit, spent)) = row {
            out.push((
                id,
                pen_from_text(&limit, "cap_pools.cap_limit")?,
                pen_from_text(&spent, "cap_pools.spent")?,
            ));
        }
    }
    Ok(out)
}

impl SqliteStore {
    pub(super) async fn grant_cap(
        &self,
        replica: &str,
        pool: &CapPool,
        terms: CapTerms,
        ask: LeaseAsk,
    ) -> StoreResult<LeaseGrant> {
        let (replica, pool) = (replica.to_owned(), pool.clone());
        self.run(move |conn| grant(conn, replica, pool, terms, ask))
            .await
    }

    pub(super) async fn release_cap(
        &self,
        replica: &str,
        pool: &CapPool,
        amount: Pen,
    ) -> StoreResult<Option<LeaseReading>> {
        let (replica, pool) = (replica.to_owned(), pool.clone());
        let amount = amount.max(Pen::ZERO);
        self.run(move |conn| release(conn, replica, pool, amount))
            .await
    }

    pub(super) async fn heartbeat_caps(
        &self,
        replica: &str,
    ) -> StoreResult<Vec<(CapPool, LeaseReading)>> {
        let replica = replica.to_owned();
        self.run(move |conn| heartbeat(conn, replica)).await
    }

    pub(super) async fn caps_spent(
        &self,
        pools: &[String],
    ) -> StoreResult<Vec<(String, Pen, Pen)>> {
        let pools = pools.to_vec();
        self.run(move |conn| spent_of(conn, pools)).await
    }
}
