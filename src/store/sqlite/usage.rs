//! The account API's reads on SQLite (`sql::usage`'s statements), and the roll-ups `record`
//! keeps for them (see `store::usage`): each sum in two integer columns (`x_hi`, `x_lo`),
//! carried on every addition, so no total overflows or passes through a float.

use super::ledger::ledger_rows_of;
use super::{query, query_opt, read_tx, sql_err, tenants, SqliteStore};
use crate::store::sql::usage::{self as q, Page};
use crate::store::sql::SqlValue::{Int, Text};
use crate::store::sql::{ledger, Cols, SUMS};
use crate::store::usage::{
    AccountFacts, KeyUsage, Rollup, TimeCursor, UsageGroup, UsageQuery, UsageStore,
};
use crate::store::{Backend, LedgerRow, StoreResult, TenantId, TopUp};
use async_trait::async_trait;
use rusqlite::{params, Connection, Transaction};
use std::sync::LazyLock;

/// `x_hi = x_hi + excluded.x_hi + carry, x_lo = (x_lo + excluded.x_lo) % 2^32` for each sum:
/// every right-hand side reads the row as it was before the update.
fn carried(sums: &[&str]) -> String {
    sums.iter()
        .map(|x| {
            format!(
                "{x}_hi = {x}_hi + excluded.{x}_hi + ({x}_lo + excluded.{x}_lo) / 4294967296, \
                 {x}_lo = ({x}_lo + excluded.{x}_lo) % 4294967296"
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

static UPSERT_HOUR: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO usage_hourly (tenant_id, hour, key_id, model, requests, input_hi, input_lo,
                                   cached_hi, cached_lo, output_hi, output_lo, charge_hi, charge_lo)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
         ON CONFLICT (tenant_id, hour, key_id, model)
         DO UPDATE SET requests = requests + excluded.requests, {}",
        carried(&SUMS)
    )
});

static UPSERT_KEY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO key_usage (tenant_id, key_id, requests, input_hi, input_lo, cached_hi,
                                cached_lo, output_hi, output_lo, charge_hi, charge_lo, last_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT (tenant_id, key_id)
         DO UPDATE SET requests = requests + excluded.requests, {},
                       last_at = MAX(last_at, excluded.last_at)",
        carried(&SUMS)
    )
});

/// Adds a batch's new rows to the roll-ups, inside `record`'s transaction.
pub(super) fn add_rollup(tx: &Transaction<'_>, r: &Rollup) -> StoreResult<()> {
    {
        let mut stmt = tx.prepare_cached(&UPSERT_HOUR).map_err(sql_err)?;
        for ((tenant, hour, key, model), sums) in &r.hours {
            let [i, c, o, m] = sums.split();
            stmt.execute(params![
                tenant,
                hour,
                key,
                model,
                sums.requests,
                i.0,
                i.1,
                c.0,
                c.1,
                o.0,
                o.1,
                m.0,
                m.1
            ])
            .map_err(sql_err)?;
        }
    }
    let mut stmt = tx.prepare_cached(&UPSERT_KEY).map_err(sql_err)?;
    for ((tenant, key), (sums, last)) in &r.keys {
        let [i, c, o, m] = sums.split();
        stmt.execute(params![
            tenant,
            key,
            sums.requests,
            i.0,
            i.1,
            c.0,
            c.1,
            o.0,
            o.1,
            m.0,
            m.1,
            last
        ])
        .map_err(sql_err)?;
    }
    Ok(())
}

fn usage(conn: &Connection, uq: &UsageQuery) -> StoreResult<Vec<UsageGroup>> {
    let (sql, values) = q::usage_statement(Backend::Sqlite, uq);
    let mut stmt = conn.prepare_cached(&sql).map_err(sql_err)?;
    let mut rows = stmt
        .query(rusqlite::params_from_iter(values))
        .map_err(sql_err)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(sql_err)? {
        out.push(q::usage_group(&mut Cols::new(row), uq.grouping)?);
    }
    Ok(out)
}

fn account(
    conn: &mut Connection,
    tenant: TenantId,
    key: Option<&str>,
    replica: &str,
) -> StoreResult<AccountFacts> {
    let tx = read_tx(conn)?;
    let head = tenants::tenant_with_balance(&tx, tenant)?;
    let lease = super::leases::read_own(&tx, tenant, replica)?;
    let totals = query_opt(&tx, &q::TENANT_TOTALS, &[Int(tenant)], q::totals)?;
    let key = match key {
        Some(id) => query_opt(&tx, &q::KEY_USAGE, &[Int(tenant), Text(id)], q::key_usage)?,
        None => None,
    };
    Ok(q::account(head, lease, totals, key))
}

#[async_trait]
impl UsageStore for SqliteStore {
    async fn usage(&self, uq: &UsageQuery) -> StoreResult<Vec<UsageGroup>> {
        let uq = uq.clone();
        self.run(move |conn| usage(conn, &uq)).await
    }

    async fn account(
        &self,
        tenant: TenantId,
        key: Option<&str>,
        replica: &str,
    ) -> StoreResult<AccountFacts> {
        let key = key.map(str::to_owned);
        let replica = replica.to_owned();
        self.run(move |conn| account(conn, tenant, key.as_deref(), &replica))
            .await
    }

    async fn keys_page(
        &self,
        tenant: TenantId,
        after: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<KeyUsage>> {
        let page = Page::new(tenant, after, i64::MIN, limit);
        self.run(move |conn| Ok(query(conn, &q::KEYS_PAGE, &page.values(), q::key_usage)?))
            .await
    }

    async fn requests_page(
        &self,
        tenant: TenantId,
        before: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<LedgerRow>> {
        let page = Page::new(tenant, before, i64::MAX, limit);
        self.run(move |conn| ledger_rows_of(conn, &q::REQUESTS_PAGE, &page.values()))
            .await
    }

    async fn top_ups_page(
        &self,
        tenant: TenantId,
        before: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<TopUp>> {
        let page = Page::new(tenant, before, i64::MAX, limit);
        let read = move |c: &mut Cols<'_>| ledger::top_up(c, tenant);
        self.run(move |conn| Ok(query(conn, &q::TOP_UPS_PAGE, &page.values(), read)?))
            .await
    }
}
