//! The ledger on SQLite ([`LedgerStore`]): top-ups and balances, recording a batch of request
//! rows (charging balances and the replica's lease in the same transaction), rows set aside as
//! rejected, a tenant's statement and the raw rows. Deltas are INTEGER pico-soles; balances
//! TEXT decimal integers, read, changed in Rust (i128) and written back inside the transaction;
//! the statement's sums use split halves (see `sql_money`), so they can neither overflow nor
//! become floats.

use super::leases::{read_leases, read_own, write_own};
use super::tenants::{read_balance, write_balance};
use super::{read_tx, sql_err, tenants, usage, write_tx, SqliteStore};
use crate::money::Pen;
use crate::store::columns::{names, sqlite_placeholders, LEDGER_COLUMNS, REJECT_COLUMNS};
use crate::store::rows::{
    check_row, period_bounds, rejected, replayed_top_up, top_up_entry, EarlierTopUp, RawLedgerRow,
};
use crate::store::sql_money::{i128_to_u64, i64_to_u64, recombine, sqlite_split_sum};
use crate::store::usage::{rollup, RollupRow};
use crate::store::{
    now_ms, Balance, LedgerRow, LedgerStore, ModelTotals, Recorded, RejectedRow, Statement,
    StoreResult, TenantId, TopUp, TopUpOutcome, UnixMs,
};
use crate::threads::{ledger_yields, let_requests_run, ROWS_PER_YIELD};
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::BTreeMap;
use std::sync::LazyLock;

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

fn balance(conn: &mut Connection, tenant: TenantId) -> StoreResult<Balance> {
    let tx = read_tx(conn)?;
    let balance = read_balance(&tx, tenant)?;
    let leased = read_leases(&tx, tenant)?.into_iter().map(|l| l.1).sum();
    Ok(Balance { balance, leased })
}

/// A request row, as `record` inserts it (see `columns`).
static INSERT_LEDGER_ROW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO ledger (kind, {}) VALUES ('request', {}) ON CONFLICT (entry_id) DO NOTHING",
        names(LEDGER_COLUMNS),
        sqlite_placeholders(LEDGER_COLUMNS)
    )
});

fn record(
    conn: &mut Connection,
    replica: String,
    rows: Vec<RawLedgerRow>,
) -> StoreResult<Recorded> {
    let tx = write_tx(conn)?;
    // Per tenant: its balance before, and what the new rows charge.
    let mut tenants: BTreeMap<TenantId, (Pen, Pen)> = BTreeMap::new();
    for row in &rows {
        if let std::collections::btree_map::Entry::Vacant(slot) = tenants.entry(row.tenant_id) {
            slot.insert((read_balance(&tx, row.tenant_id)?, Pen::ZERO));
        }
    }
    let mut inserted = 0u64;
    let mut new_rows = Vec::with_capacity(rows.len());
    {
        let mut stmt = tx.prepare_cached(&INSERT_LEDGER_ROW).map_err(sql_err)?;
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
        if let Some(own) = read_own(&tx, *tenant, &replica)? {
            let amount = (own.amount - *charged).max(Pen::ZERO);
            let spent = own.spent + *charged;
            leases.push((
                *tenant,
                write_own(&tx, *tenant, &replica, amount, spent, None)?,
            ));
        }
    }
    tx.commit().map_err(sql_err)?;
    Ok(Recorded {
        new: inserted,
        leases,
    })
}

fn reject(conn: &mut Connection, rejected: RejectedRow) -> StoreResult<()> {
    conn.execute(
        &format!(
            "INSERT INTO ledger_rejects ({}) VALUES ({})
                     ON CONFLICT (request_id) DO NOTHING",
            names(REJECT_COLUMNS),
            sqlite_placeholders(REJECT_COLUMNS)
        ),
        rejected.sqlite_params().as_slice(),
    )
    .map_err(sql_err)?;
    Ok(())
}

fn rejected_rows(conn: &mut Connection) -> StoreResult<Vec<RejectedRow>> {
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {} FROM ledger_rejects ORDER BY rejected_at, request_id",
            names(REJECT_COLUMNS)
        ))
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
    let (t, balance) = tenants::tenant_with_balance(&tx, tenant)?;
    let mut per_model = Vec::new();
    {
        let mut stmt = tx
            .prepare(concat!(
                "SELECT model, COUNT(*), ",
                sqlite_split_sum!("input_tokens"),
                ", ",
                sqlite_split_sum!("cached_tokens"),
                ", ",
                sqlite_split_sum!("output_tokens"),
                ", ",
                sqlite_split_sum!("-delta"),
                " FROM ledger
                          WHERE tenant_id = ?1 AND kind = 'request' AND at >= ?2 AND at < ?3
                          GROUP BY model ORDER BY model"
            ))
            .map_err(sql_err)?;
        let rows = stmt
            .query_map(params![tenant, lo, hi], |r| {
                let mut v = [0i64; 9];
                for (i, slot) in v.iter_mut().enumerate() {
                    *slot = r.get(i + 1)?;
                }
                Ok((r.get::<_, Option<String>>(0)?.unwrap_or_default(), v))
            })
            .map_err(sql_err)?;
        for row in rows {
            let (model, v) = row.map_err(sql_err)?;
            let count = |hi: i64, lo: i64, what: &str| i128_to_u64(recombine(hi, lo), what);
            per_model.push(ModelTotals {
                model,
                requests: i64_to_u64(v[0], "request count")?,
                input_tokens: count(v[1], v[2], "input tokens")?,
                cached_tokens: count(v[3], v[4], "cached tokens")?,
                output_tokens: count(v[5], v[6], "output tokens")?,
                charge: Pen::from_picos(recombine(v[7], v[8])),
            });
        }
    }
    let mut top_ups = Vec::new();
    {
        let mut stmt = tx
            .prepare(
                "SELECT entry_id, at, delta, note FROM ledger
                          WHERE tenant_id = ?1 AND kind = 'topup' AND at >= ?2 AND at < ?3
                          ORDER BY at, entry_id",
            )
            .map_err(sql_err)?;
        let rows = stmt
            .query_map(params![tenant, lo, hi], |r| {
                Ok(TopUp {
                    id: r.get(0)?,
                    tenant_id: tenant,
                    at: r.get(1)?,
                    amount: Pen::from_picos(i128::from(r.get::<_, i64>(2)?)),
                    note: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
                })
            })
            .map_err(sql_err)?;
        for row in rows {
            top_ups.push(row.map_err(sql_err)?);
        }
    }
    Ok(Statement {
        total_charges: per_model.iter().map(|m| m.charge).sum(),
        total_top_ups: top_ups.iter().map(|t| t.amount).sum(),
        balance,
        tenant: t,
        from,
        to,
        per_model,
        top_ups,
    })
}

fn ledger_rows(conn: &mut Connection, tenant: Option<TenantId>) -> StoreResult<Vec<LedgerRow>> {
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {} FROM ledger
                      WHERE kind = 'request' AND (?1 IS NULL OR tenant_id = ?1)
                      ORDER BY at, entry_id",
            names(LEDGER_COLUMNS)
        ))
        .map_err(sql_err)?;
    let rows = stmt
        .query_map(params![tenant], RawLedgerRow::from_sqlite)
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
        let rows = rows
            .iter()
            .map(check_row)
            .collect::<StoreResult<Vec<_>>>()?;
        let replica = replica.to_owned();
        self.run(move |conn| record(conn, replica, rows)).await
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
        self.run(move |conn| ledger_rows(conn, tenant)).await
    }
}
