//! The ledger on SQLite ([`LedgerStore`]): top-ups and balances, recording a batch of request
//! rows (charging balances and the replica's lease in the same transaction), rows set aside as
//! rejected, a tenant's statement and the raw rows. The statements are `sql::ledger`'s; what is
//! SQLite's own is `record` (one prepared insert per row, yielding to requests) and money moved
//! in Rust: balances and leases are TEXT decimal integers, read, changed in i128 and written
//! back inside the transaction (see `sql_money`).

use super::leases::{read_leases, read_own, write_own};
use super::tenants::{read_balance, tenant_with_balance, write_balance};
use super::{execute, query, query_opt, read_tx, sql_err, usage, webhooks, write_tx, SqliteStore};
use crate::money::Pen;
use crate::store::rows::{
    check_row, period_bounds, rejected, replayed_top_up, top_up_entry, RawLedgerRow,
};
use crate::store::sql::ledger as q;
use crate::store::sql::SqlValue::{Int, OptInt, Text};
use crate::store::sql::{Sql, SqlValue};
use crate::store::usage::{rollup, RollupRow};
use crate::store::{
    now_ms, Backend, Balance, LedgerRow, LedgerStore, Recorded, RejectedRow, Statement,
    StoreResult, TenantId, TopUp, TopUpOutcome, UnixMs,
};
use crate::threads::{ledger_yields, let_requests_run, ROWS_PER_YIELD};
use async_trait::async_trait;
use rusqlite::Connection;
use std::collections::BTreeMap;

fn top_up_once(
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
    if let Some(earlier) = query_opt(&tx, &q::EARLIER_TOP_UP, &[Text(&id)], q::earlier_top_up)? {
        return replayed_top_up(id, tenant, amount, delta, earlier, balance);
    }
    let values = [Text(&id), Int(tenant), Int(now), Int(delta), Text(&note)];
    execute(&tx, &q::INSERT_TOP_UP, &values)?;
    write_balance(&tx, tenant, balance + amount)?;
    let top_up = TopUp {
        id,
        tenant_id: tenant,
        amount,
        at: now,
        note,
    };
    webhooks::top_up_event(&tx, &top_up, balance + amount)?;
    tx.commit().map_err(sql_err)?;
    Ok(TopUpOutcome {
        top_up,
        balance: balance + amount,
        replayed: false,
    })
}

fn balance(conn: &mut Connection, tenant: TenantId) -> StoreResult<Balance> {
    let tx = read_tx(conn)?;
    let balance = read_balance(&tx, tenant)?;
    let leased = read_leases(&tx, tenant)?.into_iter().map(|l| l.1).sum();
    Ok(Balance { balance, leased })
}

fn record(
    conn: &mut Connection,
    replica: String,
    rows: Vec<RawLedgerRow>,
) -> StoreResult<Recorded> {
    let tx = write_tx(conn)?;
    // Per tenant: its balance before, what the new rows charge, and the first new row (the
    // change a low-balance alert names).
    let mut tenants: BTreeMap<TenantId, (Pen, Pen)> = BTreeMap::new();
    let mut first_new: BTreeMap<TenantId, &str> = BTreeMap::new();
    for row in &rows {
        if let std::collections::btree_map::Entry::Vacant(slot) = tenants.entry(row.tenant_id) {
            slot.insert((read_balance(&tx, row.tenant_id)?, Pen::ZERO));
        }
    }
    let mut inserted = 0u64;
    let mut new_rows = Vec::with_capacity(rows.len());
    // Per cap pool the new rows were reserved against: its tenant and what they charge it.
    let mut caps: BTreeMap<String, (TenantId, Pen)> = BTreeMap::new();
    {
        let mut stmt = tx
            .prepare_cached(q::INSERT_REQUEST_ROW.get(Backend::Sqlite))
            .map_err(sql_err)?;
        // A batch holds a write transaction for milliseconds of CPU on a thread that
        // may share a core with the workers: let requests through (see `threads`).
        let yields = ledger_yields();
        for (i, row) in rows.iter().enumerate() {
            if yields && i % ROWS_PER_YIELD == ROWS_PER_YIELD - 1 {
                let_requests_run();
            }
            let n = stmt
                .execute(row.sqlite_params().as_slice())
                .map_err(sql_err)?;
            if n == 1 {
                inserted += 1;
                new_rows.push(RollupRow::from(row));
                if let Some(t) = tenants.get_mut(&row.tenant_id) {
                    t.1 += row.charge();
                }
                for pool in row.cap_pools() {
                    let slot = caps
                        .entry(pool.to_owned())
                        .or_insert((row.tenant_id, Pen::ZERO));
                    slot.1 += row.charge();
                }
                first_new
                    .entry(row.tenant_id)
                    .or_insert(row.entry_id.as_str());
            }
        }
    }
    usage::add_rollup(&tx, &rollup(new_rows))?;
    let mut leases = Vec::new();
    for (tenant, (balance, charged)) in &tenants {
        if *charged == Pen::ZERO {
            continue;
        }
        write_balance(&tx, *tenant, *balance - *charged)?;
        if let Some(change) = first_new.get(tenant) {
            webhooks::balance_alerts(&tx, *tenant, (*balance, *balance - *charged), change)?;
        }
        if let Some(own) = read_own(&tx, *tenant, &replica)? {
            let amount = (own.amount - *charged).max(Pen::ZERO);
            let spent = own.spent + *charged;
            leases.push((
                *tenant,
                write_own(&tx, *tenant, &replica, amount, spent, None)?,
            ));
        }
    }
    let cap_leases = super::caps::charge_caps(&tx, &replica, &caps)?;
    tx.commit().map_err(sql_err)?;
    Ok(Recorded {
        new: inserted,
        leases,
        cap_leases,
    })
}

fn reject(conn: &mut Connection, rejected: RejectedRow) -> StoreResult<()> {
    conn.prepare_cached(q::INSERT_REJECT.get(Backend::Sqlite))
        .and_then(|mut s| s.execute(rejected.sqlite_params().as_slice()))
        .map_err(sql_err)?;
    Ok(())
}

fn rejected_rows(conn: &mut Connection) -> StoreResult<Vec<RejectedRow>> {
    let mut stmt = conn
        .prepare_cached(q::REJECTED_ROWS.get(Backend::Sqlite))
        .map_err(sql_err)?;
    let rows = stmt
        .query_map([], RejectedRow::from_sqlite)
        .map_err(sql_err)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(sql_err)
}

fn statement(
    conn: &mut Connection,
    tenant: TenantId,
    from: Option<UnixMs>,
    to: Option<UnixMs>,
) -> StoreResult<Statement> {
    let (lo, hi) = period_bounds(from, to);
    let tx = read_tx(conn)?;
    let head = tenant_with_balance(&tx, tenant)?;
    let period = [Int(tenant), Int(lo), Int(hi)];
    let per_model = query(&tx, &q::STATEMENT_MODELS, &period, q::model_totals)?;
    let top_ups = query(&tx, &q::STATEMENT_TOP_UPS, &period, |c| {
        q::top_up(c, tenant)
    })?;
    Ok(q::statement(head, (from, to), per_model, top_ups))
}

/// Request rows as a shared statement selects them (every column of `LEDGER_COLUMNS`).
pub(super) fn ledger_rows_of(
    conn: &Connection,
    sql: &Sql,
    values: &[SqlValue<'_>],
) -> StoreResult<Vec<LedgerRow>> {
    let mut stmt = conn
        .prepare_cached(sql.get(Backend::Sqlite))
        .map_err(sql_err)?;
    let rows = stmt
        .query_map(
            rusqlite::params_from_iter(values),
            RawLedgerRow::from_sqlite,
        )
        .map_err(sql_err)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row.map_err(sql_err)?.into_row()?);
    }
    Ok(out)
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn top_up_once(
        &self,
        tenant: TenantId,
        amount: Pen,
        note: &str,
        idempotency_key: Option<&str>,
    ) -> StoreResult<TopUpOutcome> {
        let (delta, id) = top_up_entry(amount, idempotency_key)?;
        let note = note.to_owned();
        self.run(move |conn| top_up_once(conn, tenant, amount, delta, id, note))
            .await
    }

    async fn balance(&self, tenant: TenantId) -> StoreResult<Balance> {
        self.run(move |conn| balance(conn, tenant)).await
    }

    async fn record(&self, replica: &str, rows: &[LedgerRow]) -> StoreResult<Recorded> {
        if rows.is_empty() {
            return Ok(Recorded::default());
        }
        // Sized once: collected through a `Result` the vector would grow by doubling, copying
        // the rows (a few hundred bytes each) over and over, on every batch.
        let mut checked = Vec::with_capacity(rows.len());
        for row in rows {
            checked.push(check_row(row)?);
        }
        let replica = replica.to_owned();
        self.run(move |conn| record(conn, replica, checked)).await
    }

    async fn reject(&self, row: &LedgerRow, reason: &str) -> StoreResult<()> {
        let rejected = rejected(row, reason);
        self.run(move |conn| reject(conn, rejected)).await
    }

    async fn rejected_rows(&self) -> StoreResult<Vec<RejectedRow>> {
        self.run(rejected_rows).await
    }

    async fn statement(
        &self,
        tenant: TenantId,
        from: Option<UnixMs>,
        to: Option<UnixMs>,
    ) -> StoreResult<Statement> {
        self.run(move |conn| statement(conn, tenant, from, to))
            .await
    }

    async fn ledger_rows(&self, tenant: Option<TenantId>) -> StoreResult<Vec<LedgerRow>> {
        self.run(move |conn| ledger_rows_of(conn, &q::LEDGER_ROWS, &[OptInt(tenant)]))
            .await
    }
}
