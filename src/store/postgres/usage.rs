//! The account API's reads on PostgreSQL (`sql::usage`'s statements), and the roll-ups `record`
//! keeps for them (see `store::usage`): each sum one `NUMERIC`, added by the database in one
//! statement per table whatever the batch.

use super::ledger::ledger_rows_of;
use super::{query, query_opt, snapshot, tenants, PgResult, PgStore};
use crate::store::sql::usage::{self as q, Page};
use crate::store::sql::SqlValue::{Int, Text};
use crate::store::sql::{ledger, pg_params, Cols};
use crate::store::usage::{
    AccountFacts, KeyUsage, Rollup, TimeCursor, UsageGroup, UsageQuery, UsageStore,
};
use crate::store::{Backend, LedgerRow, StoreResult, TenantId, TopUp};
use async_trait::async_trait;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

/// Adds a batch's new rows to the roll-ups, inside `record`'s transaction: one statement per
/// table, whatever the batch.
pub(super) async fn add_rollup(tx: &Transaction<'_>, r: &Rollup) -> PgResult<()> {
    if r.hours.is_empty() {
        return Ok(());
    }
    let mut t = Vec::new();
    let mut h = Vec::new();
    let mut k = Vec::new();
    let mut m = Vec::new();
    let mut n = Vec::new();
    let mut sums: [Vec<String>; 4] = Default::default();
    for ((tenant, hour, key, model), s) in &r.hours {
        t.push(*tenant);
        h.push(*hour);
        k.push(key.clone());
        m.push(model.clone());
        n.push(s.requests);
        for (col, v) in sums.iter_mut().zip([s.input, s.cached, s.output, s.charge]) {
            col.push(v.to_string());
        }
    }
    let [i, c, o, g] = &sums;
    tx.execute_typed(
        "INSERT INTO usage_hourly (tenant_id, hour, key_id, model, requests, input_tokens,
                                   cached_tokens, output_tokens, charge)
         SELECT t, h, k, m, n, i::numeric, c::numeric, o::numeric, g::numeric
           FROM UNNEST($1::int8[], $2::int8[], $3::text[], $4::text[], $5::int8[], $6::text[],
                       $7::text[], $8::text[], $9::text[]) AS u(t, h, k, m, n, i, c, o, g)
         ON CONFLICT (tenant_id, hour, key_id, model) DO UPDATE
         SET requests = usage_hourly.requests + EXCLUDED.requests,
             input_tokens = usage_hourly.input_tokens + EXCLUDED.input_tokens,
             cached_tokens = usage_hourly.cached_tokens + EXCLUDED.cached_tokens,
             output_tokens = usage_hourly.output_tokens + EXCLUDED.output_tokens,
             charge = usage_hourly.charge + EXCLUDED.charge",
        &[
            (&t, Type::INT8_ARRAY),
            (&h, Type::INT8_ARRAY),
            (&k, Type::TEXT_ARRAY),
            (&m, Type::TEXT_ARRAY),
            (&n, Type::INT8_ARRAY),
            (i, Type::TEXT_ARRAY),
            (c, Type::TEXT_ARRAY),
            (o, Type::TEXT_ARRAY),
            (g, Type::TEXT_ARRAY),
        ],
    )
    .await?;
    let mut t = Vec::new();
    let mut k = Vec::new();
    let mut n = Vec::new();
    let mut last = Vec::new();
    let mut sums: [Vec<String>; 4] = Default::default();
    for ((tenant, key), (s, at)) in &r.keys {
        t.push(*tenant);
        k.push(key.clone());
        n.push(s.requests);
        last.push(*at);
        for (col, v) in sums.iter_mut().zip([s.input, s.cached, s.output, s.charge]) {
            col.push(v.to_string());
        }
    }
    let [i, c, o, g] = &sums;
    tx.execute_typed(
        "INSERT INTO key_usage (tenant_id, key_id, requests, input_tokens, cached_tokens,
                                output_tokens, charge, last_at)
         SELECT t, k, n, i::numeric, c::numeric, o::numeric, g::numeric, l
           FROM UNNEST($1::int8[], $2::text[], $3::int8[], $4::text[], $5::text[], $6::text[],
                       $7::text[], $8::int8[]) AS u(t, k, n, i, c, o, g, l)
         ON CONFLICT (tenant_id, key_id) DO UPDATE
         SET requests = key_usage.requests + EXCLUDED.requests,
             input_tokens = key_usage.input_tokens + EXCLUDED.input_tokens,
             cached_tokens = key_usage.cached_tokens + EXCLUDED.cached_tokens,
             output_tokens = key_usage.output_tokens + EXCLUDED.output_tokens,
             charge = key_usage.charge + EXCLUDED.charge,
             last_at = GREATEST(key_usage.last_at, EXCLUDED.last_at)",
        &[
            (&t, Type::INT8_ARRAY),
            (&k, Type::TEXT_ARRAY),
            (&n, Type::INT8_ARRAY),
            (i, Type::TEXT_ARRAY),
            (c, Type::TEXT_ARRAY),
            (o, Type::TEXT_ARRAY),
            (g, Type::TEXT_ARRAY),
            (&last, Type::INT8_ARRAY),
        ],
    )
    .await?;
    Ok(())
}

async fn usage(client: &Client, uq: &UsageQuery) -> PgResult<Vec<UsageGroup>> {
    let (sql, values) = q::usage_statement(Backend::Postgres, uq);
    let rows = client.query_typed(&sql, &pg_params(&values)).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.push(q::usage_group(&mut Cols::new(r), uq.grouping)?);
    }
    Ok(out)
}

async fn account(
    client: &mut Client,
    tenant: TenantId,
    key: Option<&str>,
    replica: &str,
) -> PgResult<AccountFacts> {
    let tx = snapshot(client).await?;
    let head = tenants::tenant_with_balance(&tx, tenant).await?;
    let lease = super::leases::own(&tx, tenant, replica).await?;
    let totals = query_opt(&tx, &q::TENANT_TOTALS, &[Int(tenant)], q::totals).await?;
    let key = match key {
        Some(id) => query_opt(&tx, &q::KEY_USAGE, &[Int(tenant), Text(id)], q::key_usage).await?,
        None => None,
    };
    tx.commit().await?;
    Ok(q::account(head, lease, totals, key))
}

#[async_trait]
impl UsageStore for PgStore {
    async fn usage(&self, uq: &UsageQuery) -> StoreResult<Vec<UsageGroup>> {
        with_retry!(self, c => usage(c, uq))
    }

    async fn account(
        &self,
        tenant: TenantId,
        key: Option<&str>,
        replica: &str,
    ) -> StoreResult<AccountFacts> {
        with_retry!(self, c => account(c, tenant, key, replica))
    }

    async fn keys_page(
        &self,
        tenant: TenantId,
        after: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<KeyUsage>> {
        let page = Page::new(tenant, after, i64::MIN, limit);
        with_retry!(self, c => query(&*c, &q::KEYS_PAGE, &page.values(), q::key_usage))
    }

    async fn requests_page(
        &self,
        tenant: TenantId,
        before: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<LedgerRow>> {
        let page = Page::new(tenant, before, i64::MAX, limit);
        with_retry!(self, c => ledger_rows_of(&*c, &q::REQUESTS_PAGE, &page.values()))
    }

    async fn top_ups_page(
        &self,
        tenant: TenantId,
        before: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<TopUp>> {
        let page = Page::new(tenant, before, i64::MAX, limit);
        let read = |c: &mut Cols<'_>| ledger::top_up(c, tenant);
        with_retry!(self, c => query(&*c, &q::TOP_UPS_PAGE, &page.values(), read))
    }
}
