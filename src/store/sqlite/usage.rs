//! The account API's reads on SQLite, and the roll-ups `record` keeps for them (see
//! `store::usage`). Sums come back as split halves (`x_hi`, `x_lo`), joined in i128 by
//! `recombine`, so no total overflows or passes through a float.

use super::{read_tx, sql_err, tenants, SqliteStore};
use crate::money::Pen;
use crate::store::columns::{names, LEDGER_COLUMNS};
use crate::store::rows::{limits_from_sql, RawLedgerRow};
use crate::store::sql_money::{i128_to_u64, i64_to_u64, recombine};
use crate::store::usage::{
    AccountFacts, GroupKey, Grouping, KeyUsage, Rollup, TimeCursor, UsageGroup, UsageQuery,
    UsageStore, UsageTotals,
};
use crate::store::{KeyInfo, KeyLimits, LedgerRow, StoreResult, TenantId, TopUp};
use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, OptionalExtension, Row, Transaction};
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

const SUMS: [&str; 4] = ["input", "cached", "output", "charge"];

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

/// `floor(x / 86400000)` whatever the sign (SQLite's `/` truncates).
fn floor_day(x: &str) -> String {
    format!("(({x}) - ((({x}) % 86400000) + 86400000) % 86400000) / 86400000")
}

/// The ledger's request rows as roll-up columns: one request, each sum split in halves.
const LEDGER_AS_ROLLUP: &str = "1, COALESCE(input_tokens, 0) / 4294967296, \
     COALESCE(input_tokens, 0) % 4294967296, COALESCE(cached_tokens, 0) / 4294967296, \
     COALESCE(cached_tokens, 0) % 4294967296, COALESCE(output_tokens, 0) / 4294967296, \
     COALESCE(output_tokens, 0) % 4294967296, (-delta) / 4294967296, (-delta) % 4294967296";

/// The usage statement of a grouping: the whole hours from `usage_hourly`, the partial hours
/// at each end from the ledger. Parameters: ?1 tenant, ?2–?3 the hours, ?4–?5 and ?6–?7 the
/// ends, ?8 the limit, ?9 the day offset or the name to continue after.
fn usage_sql(grouping: Grouping, after: bool) -> String {
    let (hour_group, ledger_group, name) = match grouping {
        Grouping::Day { .. } => (floor_day("hour + ?9"), floor_day("at + ?9"), None),
        Grouping::Model => ("model".into(), "COALESCE(model, '')".into(), Some("model")),
        Grouping::Key => (
            "key_id".into(),
            "COALESCE(key_id, '')".into(),
            Some("key_id"),
        ),
        Grouping::Total => ("0".into(), "0".into(), None),
    };
    let (hour_after, ledger_after) = match name {
        Some(col) if after => (
            format!(" AND {col} > ?9"),
            format!(" AND COALESCE({col}, '') > ?9"),
        ),
        _ => (String::new(), String::new()),
    };
    let ledger = |lo: &str, hi: &str| {
        format!(
            "SELECT {ledger_group}, {LEDGER_AS_ROLLUP} FROM ledger
              WHERE tenant_id = ?1 AND kind = 'request' AND at >= {lo} AND at < {hi}{ledger_after}"
        )
    };
    format!(
        "SELECT g, SUM(n), SUM(ih), SUM(il), SUM(ch), SUM(cl), SUM(oh), SUM(ol), SUM(mh), SUM(ml)
           FROM (SELECT {hour_group} AS g, requests AS n, input_hi AS ih, input_lo AS il,
                        cached_hi AS ch, cached_lo AS cl, output_hi AS oh, output_lo AS ol,
                        charge_hi AS mh, charge_lo AS ml
                   FROM usage_hourly
                  WHERE tenant_id = ?1 AND hour >= ?2 AND hour < ?3{hour_after}
                 UNION ALL {}
                 UNION ALL {})
          GROUP BY g ORDER BY g LIMIT ?8",
        ledger("?4", "?5"),
        ledger("?6", "?7"),
    )
}

/// The statement and parameters of a usage query (also for `EXPLAIN` in the store suite).
pub fn usage_statement(q: &UsageQuery) -> (String, Vec<Value>) {
    let ((h0, h1), (a0, a1), (b0, b1)) = q.split();
    let mut values: Vec<Value> = vec![
        Value::Integer(q.tenant),
        Value::Integer(h0),
        Value::Integer(h1),
        Value::Integer(a0),
        Value::Integer(a1),
        Value::Integer(b0),
        Value::Integer(b1),
        Value::Integer(i64::try_from(q.limit).unwrap_or(i64::MAX)),
    ];
    let after = match (q.grouping, &q.after) {
        (Grouping::Day { offset_ms }, _) => {
            values.push(Value::Integer(offset_ms));
            false
        }
        (Grouping::Model | Grouping::Key, Some(name)) => {
            values.push(Value::Text(name.clone()));
            true
        }
        (Grouping::Model | Grouping::Key | Grouping::Total, _) => false,
    };
    (usage_sql(q.grouping, after), values)
}

/// Eight split sums from column `first` on (requests before them), as totals.
fn totals_at(row: &Row<'_>, first: usize) -> rusqlite::Result<(i64, [i128; 4])> {
    let n: Option<i64> = row.get(first)?;
    let mut sums = [0i128; 4];
    for (i, slot) in sums.iter_mut().enumerate() {
        let hi: Option<i64> = row.get(first + 1 + 2 * i)?;
        let lo: Option<i64> = row.get(first + 2 + 2 * i)?;
        *slot = recombine(hi.unwrap_or(0), lo.unwrap_or(0));
    }
    Ok((n.unwrap_or(0), sums))
}

fn totals((n, [i, c, o, m]): (i64, [i128; 4])) -> StoreResult<UsageTotals> {
    Ok(UsageTotals {
        requests: i64_to_u64(n, "request count")?,
        input_tokens: i128_to_u64(i, "input tokens")?,
        cached_tokens: i128_to_u64(c, "cached tokens")?,
        output_tokens: i128_to_u64(o, "output tokens")?,
        charge: Pen::from_picos(m),
    })
}

/// The columns of a key with its roll-up, for [`key_usage`].
const KEY_COLUMNS: &str = "k.id, k.tenant_id, t.name, k.label, k.secret_prefix, k.created_at,
       k.revoked_at, k.rpm_limit, k.tpm_limit, u.requests, u.input_hi, u.input_lo,
       u.cached_hi, u.cached_lo, u.output_hi, u.output_lo, u.charge_hi, u.charge_lo, u.last_at
  FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
  LEFT JOIN key_usage u ON u.tenant_id = k.tenant_id AND u.key_id = k.id";

type KeyRow = (
    KeyInfo,
    Option<i64>,
    Option<i64>,
    (i64, [i128; 4]),
    Option<i64>,
);

fn key_row(r: &Row<'_>) -> rusqlite::Result<KeyRow> {
    Ok((
        KeyInfo {
            id: r.get(0)?,
            tenant_id: r.get(1)?,
            tenant_name: r.get(2)?,
            label: r.get(3)?,
            secret_prefix: r.get(4)?,
            created_at: r.get(5)?,
            revoked_at: r.get(6)?,
            limits: KeyLimits::default(),
        },
        r.get(7)?,
        r.get(8)?,
        totals_at(r, 9)?,
        r.get(18)?,
    ))
}

fn key_usage((mut key, rpm, tpm, sums, last_used): KeyRow) -> StoreResult<KeyUsage> {
    key.limits = limits_from_sql(rpm, tpm)?;
    Ok(KeyUsage {
        key,
        totals: totals(sums)?,
        last_used,
    })
}

#[async_trait]
impl UsageStore for SqliteStore {
    async fn usage(&self, q: &UsageQuery) -> StoreResult<Vec<UsageGroup>> {
        let (sql, values) = usage_statement(q);
        let grouping = q.grouping;
        self.run(move |conn| {
            let mut stmt = conn.prepare_cached(&sql).map_err(sql_err)?;
            let rows = stmt
                .query_map(params_from_iter(values), |r| {
                    Ok((r.get::<_, Value>(0)?, totals_at(r, 1)?))
                })
                .map_err(sql_err)?;
            let mut out = Vec::new();
            for row in rows {
                let (g, sums) = row.map_err(sql_err)?;
                let key = match (grouping, g) {
                    (Grouping::Day { .. }, Value::Integer(d)) => GroupKey::Day(d),
                    (Grouping::Model | Grouping::Key, Value::Text(t)) => GroupKey::Name(t),
                    (Grouping::Total, _) => GroupKey::Total,
                    (_, other) => {
                        return Err(crate::store::StoreError::Backend(format!(
                            "usage query grouped by {grouping:?} gave a group {other:?}"
                        )))
                    }
                };
                out.push(UsageGroup {
                    key,
                    totals: totals(sums)?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn account(
        &self,
        tenant: TenantId,
        key: Option<&str>,
        replica: &str,
    ) -> StoreResult<AccountFacts> {
        let key = key.map(str::to_owned);
        let replica = replica.to_owned();
        self.run(move |conn| {
            let tx = read_tx(conn)?;
            let (t, balance) = tenants::tenant_with_balance(&tx, tenant)?;
            let lease = super::leases::read_own(&tx, tenant, &replica)?;
            let all = tx
                .query_row(
                    "SELECT SUM(requests), SUM(input_hi), SUM(input_lo), SUM(cached_hi),
                            SUM(cached_lo), SUM(output_hi), SUM(output_lo), SUM(charge_hi),
                            SUM(charge_lo)
                       FROM key_usage WHERE tenant_id = ?1",
                    params![tenant],
                    |r| totals_at(r, 0),
                )
                .map_err(sql_err)?;
            let key = match key {
                Some(id) => tx
                    .query_row(
                        &format!("SELECT {KEY_COLUMNS} WHERE k.tenant_id = ?1 AND k.id = ?2"),
                        params![tenant, id],
                        key_row,
                    )
                    .optional()
                    .map_err(sql_err)?
                    .map(key_usage)
                    .transpose()?,
                None => None,
            };
            Ok(AccountFacts {
                tenant: t,
                balance,
                key,
                totals: totals(all)?,
                lease,
            })
        })
        .await
    }

    async fn keys_page(
        &self,
        tenant: TenantId,
        after: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<KeyUsage>> {
        let (at, id) = after.map_or((i64::MIN, String::new()), |c| (c.at, c.id.clone()));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {KEY_COLUMNS}
                      WHERE k.tenant_id = ?1 AND (k.created_at, k.id) > (?2, ?3)
                      ORDER BY k.created_at, k.id LIMIT ?4"
                ))
                .map_err(sql_err)?;
            let rows = stmt
                .query_map(params![tenant, at, id, limit], key_row)
                .map_err(sql_err)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(key_usage(row.map_err(sql_err)?)?);
            }
            Ok(out)
        })
        .await
    }

    async fn requests_page(
        &self,
        tenant: TenantId,
        before: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<LedgerRow>> {
        let (at, id) = before.map_or((i64::MAX, String::new()), |c| (c.at, c.id.clone()));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn| {
            let mut stmt = conn.prepare_cached(&requests_sql()).map_err(sql_err)?;
            let rows = stmt
                .query_map(params![tenant, at, id, limit], RawLedgerRow::from_sqlite)
                .map_err(sql_err)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row.map_err(sql_err)?.into_row()?);
            }
            Ok(out)
        })
        .await
    }

    async fn top_ups_page(
        &self,
        tenant: TenantId,
        before: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<TopUp>> {
        let (at, id) = before.map_or((i64::MAX, String::new()), |c| (c.at, c.id.clone()));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn| {
            let mut stmt = conn.prepare_cached(TOP_UPS_SQL).map_err(sql_err)?;
            let rows = stmt
                .query_map(params![tenant, at, id, limit], |r| {
                    Ok(TopUp {
                        id: r.get(0)?,
                        tenant_id: tenant,
                        at: r.get(1)?,
                        amount: Pen::from_picos(i128::from(r.get::<_, i64>(2)?)),
                        note: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
                    })
                })
                .map_err(sql_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(sql_err)
        })
        .await
    }
}

/// A tenant's request rows before (?2 at, ?3 id), newest first.
pub fn requests_sql() -> String {
    format!(
        "SELECT {} FROM ledger
          WHERE tenant_id = ?1 AND kind = 'request' AND (at, entry_id) < (?2, ?3)
          ORDER BY at DESC, entry_id DESC LIMIT ?4",
        names(LEDGER_COLUMNS)
    )
}

/// A tenant's top-ups before (?2 at, ?3 id), newest first.
pub const TOP_UPS_SQL: &str = "SELECT entry_id, at, delta, note FROM ledger
  WHERE tenant_id = ?1 AND kind = 'topup' AND (at, entry_id) < (?2, ?3)
  ORDER BY at DESC, entry_id DESC LIMIT ?4";
