//! The account API's reads on PostgreSQL, and the roll-ups `record` keeps for them (see
//! `store::usage`). Sums are `NUMERIC`, read as text: exact, never a float.

use super::{tenants, PgResult, PgStore};
use crate::money::Pen;
use crate::store::columns::{names, LEDGER_COLUMNS};
use crate::store::rows::{limits_from_sql, RawLedgerRow};
use crate::store::sql_money::{count_from_text, i64_to_u64, pen_from_text};
use crate::store::usage::{
    AccountFacts, GroupKey, Grouping, KeyUsage, Rollup, TimeCursor, UsageGroup, UsageQuery,
    UsageStore, UsageTotals,
};
use crate::store::{KeyInfo, LedgerRow, StoreResult, TenantId, TopUp};
use async_trait::async_trait;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Transaction};

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

/// `floor(x / 86400000)` whatever the sign (`/` on integers truncates).
fn floor_day(x: &str) -> String {
    format!("(({x}) - ((({x}) % 86400000) + 86400000) % 86400000) / 86400000")
}

/// The usage statement of a grouping (see the SQLite twin): $1 tenant, $2–$3 the whole hours,
/// $4–$5 and $6–$7 the partial ends, $8 the limit, $9 the day offset or the name to continue
/// after. Names compare and sort bytewise (`COLLATE "C"`), as in SQLite.
fn usage_sql(grouping: Grouping, after: bool) -> String {
    let (hour_group, ledger_group, name) = match grouping {
        Grouping::Day { .. } => (floor_day("hour + $9"), floor_day("at + $9"), None),
        Grouping::Model => (
            "model COLLATE \"C\"".into(),
            "COALESCE(model, '') COLLATE \"C\"".into(),
            Some("model"),
        ),
        Grouping::Key => (
            "key_id COLLATE \"C\"".into(),
            "COALESCE(key_id, '') COLLATE \"C\"".into(),
            Some("key_id"),
        ),
        Grouping::Total => ("0".into(), "0".into(), None),
    };
    let (hour_after, ledger_after) = match name {
        Some(col) if after => (
            format!(" AND {col} COLLATE \"C\" > $9"),
            format!(" AND COALESCE({col}, '') COLLATE \"C\" > $9"),
        ),
        _ => (String::new(), String::new()),
    };
    let ledger = |lo: &str, hi: &str| {
        format!(
            "SELECT {ledger_group}, 1, COALESCE(input_tokens, 0)::numeric,
                    COALESCE(cached_tokens, 0)::numeric, COALESCE(output_tokens, 0)::numeric,
                    (-delta)::numeric
               FROM ledger
              WHERE tenant_id = $1 AND kind = 'request' AND at >= {lo} AND at < {hi}{ledger_after}"
        )
    };
    format!(
        "SELECT g, SUM(n)::bigint, SUM(i)::text, SUM(c)::text, SUM(o)::text, SUM(m)::text
           FROM (SELECT {hour_group} AS g, requests AS n, input_tokens AS i,
                        cached_tokens AS c, output_tokens AS o, charge AS m
                   FROM usage_hourly
                  WHERE tenant_id = $1 AND hour >= $2 AND hour < $3{hour_after}
                 UNION ALL {}
                 UNION ALL {}) u
          GROUP BY g ORDER BY g LIMIT $8",
        ledger("$4", "$5"),
        ledger("$6", "$7"),
    )
}

/// A value of a usage statement's parameter list.
pub enum Param {
    Int(i64),
    Text(String),
}

/// The statement and parameters of a usage query (also for `EXPLAIN` in the store suite).
pub fn usage_statement(q: &UsageQuery) -> (String, Vec<Param>) {
    let ((h0, h1), (a0, a1), (b0, b1)) = q.split();
    let mut values: Vec<Param> = [q.tenant, h0, h1, a0, a1, b0, b1]
        .into_iter()
        .map(Param::Int)
        .collect();
    values.push(Param::Int(i64::try_from(q.limit).unwrap_or(i64::MAX)));
    let after = match (q.grouping, &q.after) {
        (Grouping::Day { offset_ms }, _) => {
            values.push(Param::Int(offset_ms));
            false
        }
        (Grouping::Model | Grouping::Key, Some(name)) => {
            values.push(Param::Text(name.clone()));
            true
        }
        (Grouping::Model | Grouping::Key | Grouping::Total, _) => false,
    };
    (usage_sql(q.grouping, after), values)
}

/// `values` as `query_typed` takes them.
pub fn typed(values: &[Param]) -> Vec<(&(dyn ToSql + Sync), Type)> {
    values
        .iter()
        .map(|v| match v {
            Param::Int(i) => (i as &(dyn ToSql + Sync), Type::INT8),
            Param::Text(t) => (t as &(dyn ToSql + Sync), Type::TEXT),
        })
        .collect()
}

/// Totals from a requests count at `first` and four `NUMERIC` sums as text after it.
fn totals_at(r: &Row, first: usize) -> PgResult<UsageTotals> {
    let n: Option<i64> = r.try_get(first)?;
    let text = |i: usize| -> PgResult<String> {
        Ok(r.try_get::<_, Option<String>>(first + i)?
            .unwrap_or_else(|| "0".into()))
    };
    Ok(UsageTotals {
        requests: i64_to_u64(n.unwrap_or(0), "request count")?,
        input_tokens: count_from_text(&text(1)?, "input tokens")?,
        cached_tokens: count_from_text(&text(2)?, "cached tokens")?,
        output_tokens: count_from_text(&text(3)?, "output tokens")?,
        charge: pen_from_text(&text(4)?, "usage charges")?,
    })
}

const KEY_COLUMNS: &str = "k.id, k.tenant_id, t.name, k.label, k.secret_prefix, k.created_at,
       k.revoked_at, k.rpm_limit, k.tpm_limit, u.requests, u.input_tokens::text,
       u.cached_tokens::text, u.output_tokens::text, u.charge::text, u.last_at
  FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
  LEFT JOIN key_usage u ON u.tenant_id = k.tenant_id AND u.key_id = k.id";

fn key_usage(r: &Row) -> PgResult<KeyUsage> {
    Ok(KeyUsage {
        key: KeyInfo {
            id: r.try_get(0)?,
            tenant_id: r.try_get(1)?,
            tenant_name: r.try_get(2)?,
            label: r.try_get(3)?,
            secret_prefix: r.try_get(4)?,
            created_at: r.try_get(5)?,
            revoked_at: r.try_get(6)?,
            limits: limits_from_sql(r.try_get(7)?, r.try_get(8)?)?,
        },
        totals: totals_at(r, 9)?,
        last_used: r.try_get(14)?,
    })
}

async fn usage_q(client: &mut Client, q: &UsageQuery) -> PgResult<Vec<UsageGroup>> {
    let (sql, values) = usage_statement(q);
    let rows = client.query_typed(&sql, &typed(&values)).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let key = match q.grouping {
            Grouping::Day { .. } => GroupKey::Day(r.try_get(0)?),
            Grouping::Model | Grouping::Key => GroupKey::Name(r.try_get(0)?),
            Grouping::Total => GroupKey::Total,
        };
        out.push(UsageGroup {
            key,
            totals: totals_at(&r, 1)?,
        });
    }
    Ok(out)
}

async fn account_q(
    client: &mut Client,
    tenant: TenantId,
    key: Option<&str>,
    replica: &str,
) -> PgResult<AccountFacts> {
    let tx = super::snapshot(client).await?;
    let (t, balance) = tenants::tenant_with_balance(&tx, tenant).await?;
    let lease = tx
        .query_typed_opt(
            "SELECT amount::text, spent::text, version FROM leases
              WHERE tenant_id = $1 AND replica = $2",
            &[(&tenant, Type::INT8), (&replica, Type::TEXT)],
        )
        .await?
        .map(|r| super::leases::reading(&r, 0))
        .transpose()?;
    let all = tx
        .query_typed_one(
            "SELECT SUM(requests)::bigint, SUM(input_tokens)::text, SUM(cached_tokens)::text,
                    SUM(output_tokens)::text, SUM(charge)::text
               FROM key_usage WHERE tenant_id = $1",
            &[(&tenant, Type::INT8)],
        )
        .await?;
    let key_row = match key {
        Some(id) => {
            tx.query_typed_opt(
                &format!("SELECT {KEY_COLUMNS} WHERE k.tenant_id = $1 AND k.id = $2"),
                &[(&tenant, Type::INT8), (&id, Type::TEXT)],
            )
            .await?
        }
        None => None,
    };
    tx.commit().await?;
    Ok(AccountFacts {
        tenant: t,
        balance,
        key: key_row.as_ref().map(key_usage).transpose()?,
        totals: totals_at(&all, 0)?,
        lease,
    })
}

async fn keys_page_q(
    client: &mut Client,
    tenant: TenantId,
    after: Option<&TimeCursor>,
    limit: i64,
) -> PgResult<Vec<KeyUsage>> {
    let (at, id) = after.map_or((i64::MIN, String::new()), |c| (c.at, c.id.clone()));
    let rows = client
        .query_typed(
            &format!(
                "SELECT {KEY_COLUMNS}
                  WHERE k.tenant_id = $1 AND (k.created_at, k.id) > ($2, $3)
                  ORDER BY k.created_at, k.id LIMIT $4"
            ),
            &[
                (&tenant, Type::INT8),
                (&at, Type::INT8),
                (&id, Type::TEXT),
                (&limit, Type::INT8),
            ],
        )
        .await?;
    rows.iter().map(key_usage).collect()
}

/// A tenant's request rows before ($2 at, $3 id), newest first.
pub fn requests_sql() -> String {
    format!(
        "SELECT {} FROM ledger
          WHERE tenant_id = $1 AND kind = 'request' AND (at, entry_id) < ($2, $3)
          ORDER BY at DESC, entry_id DESC LIMIT $4",
        names(LEDGER_COLUMNS)
    )
}

/// A tenant's top-ups before ($2 at, $3 id), newest first.
pub const TOP_UPS_SQL: &str = "SELECT entry_id, at, delta, note FROM ledger
  WHERE tenant_id = $1 AND kind = 'topup' AND (at, entry_id) < ($2, $3)
  ORDER BY at DESC, entry_id DESC LIMIT $4";

async fn requests_q(
    client: &mut Client,
    tenant: TenantId,
    before: Option<&TimeCursor>,
    limit: i64,
) -> PgResult<Vec<LedgerRow>> {
    let (at, id) = before.map_or((i64::MAX, String::new()), |c| (c.at, c.id.clone()));
    let rows = client
        .query_typed(
            &requests_sql(),
            &[
                (&tenant, Type::INT8),
                (&at, Type::INT8),
                (&id, Type::TEXT),
                (&limit, Type::INT8),
            ],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(RawLedgerRow::from_pg(&r)?.into_row()?);
    }
    Ok(out)
}

async fn top_ups_q(
    client: &mut Client,
    tenant: TenantId,
    before: Option<&TimeCursor>,
    limit: i64,
) -> PgResult<Vec<TopUp>> {
    let (at, id) = before.map_or((i64::MAX, String::new()), |c| (c.at, c.id.clone()));
    let rows = client
        .query_typed(
            TOP_UPS_SQL,
            &[
                (&tenant, Type::INT8),
                (&at, Type::INT8),
                (&id, Type::TEXT),
                (&limit, Type::INT8),
            ],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(TopUp {
            id: r.try_get(0)?,
            tenant_id: tenant,
            at: r.try_get(1)?,
            amount: Pen::from_picos(i128::from(r.try_get::<_, i64>(2)?)),
            note: r.try_get::<_, Option<String>>(3)?.unwrap_or_default(),
        });
    }
    Ok(out)
}

fn limit_i64(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[async_trait]
impl UsageStore for PgStore {
    async fn usage(&self, q: &UsageQuery) -> StoreResult<Vec<UsageGroup>> {
        with_retry!(self, c => usage_q(c, q))
    }

    async fn account(
        &self,
        tenant: TenantId,
        key: Option<&str>,
        replica: &str,
    ) -> StoreResult<AccountFacts> {
        with_retry!(self, c => account_q(c, tenant, key, replica))
    }

    async fn keys_page(
        &self,
        tenant: TenantId,
        after: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<KeyUsage>> {
        with_retry!(self, c => keys_page_q(c, tenant, after, limit_i64(limit)))
    }

    async fn requests_page(
        &self,
        tenant: TenantId,
        before: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<LedgerRow>> {
        with_retry!(self, c => requests_q(c, tenant, before, limit_i64(limit)))
    }

    async fn top_ups_page(
        &self,
        tenant: TenantId,
        before: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<TopUp>> {
        with_retry!(self, c => top_ups_q(c, tenant, before, limit_i64(limit)))
    }
}
