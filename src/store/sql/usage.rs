//! The account API's reads (see `store::usage`): the statements both backends send, and their
//! rows. The roll-ups they read are kept per backend (`sqlite/usage.rs`, `postgres/usage.rs`):
//! SQLite in split integer columns, PostgreSQL in `NUMERIC`.

use super::{Backend, Cols, Sql, SqlValue, SUMS};
use crate::money::Pen;
use crate::store::columns::{names, LEDGER_COLUMNS};
use crate::store::sql_money::{i128_to_u64, i64_to_u64};
use crate::store::usage::{
    AccountFacts, GroupKey, Grouping, KeyUsage, TimeCursor, UsageGroup, UsageQuery, UsageTotals,
};
use crate::store::{LeaseReading, StoreResult, Tenant, TenantId};

/// `floor(x / 86400000)` whatever the sign (`/` on integers truncates, in both).
fn floor_day(x: &str) -> String {
    format!("(({x}) - ((({x}) % 86400000) + 86400000) % 86400000) / 86400000")
}

/// The usage statement of a grouping: the whole hours from `usage_hourly`, the partial hours
/// at each end from the ledger. Parameters: $1 tenant, $2–$3 the hours, $4–$5 and $6–$7 the
/// ends, $8 the limit, $9 the day offset or the name to continue after. Names compare and sort
/// bytewise.
fn usage_sql(b: Backend, grouping: Grouping, after: bool) -> String {
    let (hour_group, ledger_group, name) = match grouping {
        Grouping::Day { .. } => (floor_day("hour + $9"), floor_day("at + $9"), None),
        Grouping::Model => (
            b.bytewise("model"),
            b.bytewise("COALESCE(model, '')"),
            Some("model"),
        ),
        Grouping::Key => (
            b.bytewise("key_id"),
            b.bytewise("COALESCE(key_id, '')"),
            Some("key_id"),
        ),
        Grouping::Total => ("0".into(), "0".into(), None),
    };
    let (hour_after, ledger_after) = match name {
        Some(col) if after => (
            format!(" AND {} > $9", b.bytewise(col)),
            format!(" AND {} > $9", b.bytewise(&format!("COALESCE({col}, '')"))),
        ),
        _ => (String::new(), String::new()),
    };
    // Each sum's parts, named p0, p1, … in both selects of the union.
    let hourly: Vec<String> = SUMS.iter().flat_map(|s| b.rollup(s, "")).collect();
    let from_ledger: Vec<String> = [
        "COALESCE(input_tokens, 0)",
        "COALESCE(cached_tokens, 0)",
        "COALESCE(output_tokens, 0)",
        "-delta",
    ]
    .into_iter()
    .flat_map(|x| b.split(x))
    .collect();
    let named = |parts: &[String]| -> String {
        parts
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{p} AS p{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let summed = (0..hourly.len())
        .map(|i| b.summed(&format!("p{i}")))
        .collect::<Vec<_>>()
        .join(", ");
    let ledger = |lo: &str, hi: &str| {
        format!(
            "SELECT {ledger_group}, 1, {} FROM ledger
              WHERE tenant_id = $1 AND kind = 'request' AND at >= {lo} AND at < {hi}{ledger_after}",
            named(&from_ledger)
        )
    };
    format!(
        "SELECT g, CAST(SUM(n) AS BIGINT), {summed}
           FROM (SELECT {hour_group} AS g, requests AS n, {}
                   FROM usage_hourly
                  WHERE tenant_id = $1 AND hour >= $2 AND hour < $3{hour_after}
                 UNION ALL {}
                 UNION ALL {}) u
          GROUP BY g ORDER BY g LIMIT $8",
        named(&hourly),
        ledger("$4", "$5"),
        ledger("$6", "$7"),
    )
}

/// The statement and parameters of a usage query, for `backend` (also for `EXPLAIN` in the
/// store suite). Rows are read with [`usage_group`].
pub fn usage_statement(backend: Backend, q: &UsageQuery) -> (String, Vec<SqlValue<'_>>) {
    let ((h0, h1), (a0, a1), (b0, b1)) = q.split();
    let mut values: Vec<SqlValue<'_>> = [q.tenant, h0, h1, a0, a1, b0, b1]
        .into_iter()
        .map(SqlValue::Int)
        .collect();
    values.push(SqlValue::Int(i64::try_from(q.limit).unwrap_or(i64::MAX)));
    let after = match (q.grouping, &q.after) {
        (Grouping::Day { offset_ms }, _) => {
            values.push(SqlValue::Int(offset_ms));
            false
        }
        (Grouping::Model | Grouping::Key, Some(name)) => {
            values.push(SqlValue::Text(name));
            true
        }
        (Grouping::Model | Grouping::Key | Grouping::Total, _) => false,
    };
    let sql = usage_sql(backend, q.grouping, after);
    (backend.placeholders(&sql).into_owned(), values)
}

/// A row of a usage statement.
pub fn usage_group(c: &mut Cols<'_>, grouping: Grouping) -> StoreResult<UsageGroup> {
    let key = match grouping {
        Grouping::Day { .. } => GroupKey::Day(c.int()?),
        Grouping::Model | Grouping::Key => GroupKey::Name(c.text()?),
        Grouping::Total => {
            c.skip();
            GroupKey::Total
        }
    };
    Ok(UsageGroup {
        key,
        totals: totals(c)?,
    })
}

/// A request count and the four sums after it (`NULL`: none).
pub fn totals(c: &mut Cols<'_>) -> StoreResult<UsageTotals> {
    Ok(UsageTotals {
        requests: i64_to_u64(c.opt_int()?.unwrap_or(0), "request count")?,
        input_tokens: i128_to_u64(c.sum("input tokens")?, "input tokens")?,
        cached_tokens: i128_to_u64(c.sum("cached tokens")?, "cached tokens")?,
        output_tokens: i128_to_u64(c.sum("output tokens")?, "output tokens")?,
        charge: Pen::from_picos(c.sum("usage charges")?),
    })
}

/// Everything tenant $1's keys ever used ([`totals`]).
pub static TENANT_TOTALS: Sql = Sql::built(|b| {
    let sums: Vec<String> = SUMS
        .iter()
        .flat_map(|s| b.rollup(s, ""))
        .map(|part| b.summed(&part))
        .collect();
    format!(
        "SELECT CAST(SUM(requests) AS BIGINT), {} FROM key_usage WHERE tenant_id = $1",
        sums.join(", ")
    )
});

/// A tenant's account from what its queries read, in one snapshot.
pub fn account(
    (tenant, balance): (Tenant, Pen),
    lease: Option<LeaseReading>,
    totals: Option<UsageTotals>,
    key: Option<KeyUsage>,
) -> AccountFacts {
    AccountFacts {
        tenant,
        balance,
        key,
        totals: totals.unwrap_or_default(),
        lease,
    }
}

/// A key with its roll-up ([`key_usage`]), from `api_keys k`, `tenants t`, `key_usage u`.
fn key_usage_select(b: Backend) -> String {
    let sums: Vec<String> = SUMS
        .iter()
        .flat_map(|s| b.rollup(s, "u."))
        .map(|part| b.read(&part))
        .collect();
    format!(
        "SELECT {}, u.requests, {}, u.last_at
           FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
           LEFT JOIN key_usage u ON u.tenant_id = k.tenant_id AND u.key_id = k.id",
        super::tenants::KEY_INFO_COLUMNS,
        sums.join(", ")
    )
}

/// Key $2 of tenant $1.
pub static KEY_USAGE: Sql = Sql::built(|b| {
    format!(
        "{} WHERE k.tenant_id = $1 AND k.id = $2",
        key_usage_select(b)
    )
});

/// Tenant $1's keys after ($2 created_at, $3 id), oldest first, at most $4.
pub static KEYS_PAGE: Sql = Sql::built(|b| {
    format!(
        "{} WHERE k.tenant_id = $1 AND (k.created_at, k.id) > ($2, $3)
            ORDER BY k.created_at, k.id LIMIT $4",
        key_usage_select(b)
    )
});

pub fn key_usage(c: &mut Cols<'_>) -> StoreResult<KeyUsage> {
    Ok(KeyUsage {
        key: super::tenants::key_info(c)?,
        totals: totals(c)?,
        last_used: c.opt_int()?,
    })
}

/// Tenant $1's request rows before ($2 at, $3 id), newest first, at most $4.
pub static REQUESTS_PAGE: Sql = Sql::built(|_| {
    format!(
        "SELECT {} FROM ledger
          WHERE tenant_id = $1 AND kind = 'request' AND (at, entry_id) < ($2, $3)
          ORDER BY at DESC, entry_id DESC LIMIT $4",
        names(LEDGER_COLUMNS)
    )
});

/// Tenant $1's top-ups before ($2 at, $3 id), newest first, at most $4 (`sql::ledger::top_up`).
pub static TOP_UPS_PAGE: Sql = Sql::text(
    "SELECT entry_id, at, delta, note FROM ledger
      WHERE tenant_id = $1 AND kind = 'topup' AND (at, entry_id) < ($2, $3)
      ORDER BY at DESC, entry_id DESC LIMIT $4",
);

/// A page of a time-ordered listing: tenant $1, after or before ($2 at, $3 id), at most $4.
pub struct Page {
    tenant: TenantId,
    at: i64,
    id: String,
    limit: i64,
}

impl Page {
    /// Starts at `cursor`, or for the first page at `start` (`i64::MIN` oldest first,
    /// `i64::MAX` newest first).
    pub fn new(tenant: TenantId, cursor: Option<&TimeCursor>, start: i64, limit: usize) -> Page {
        let (at, id) = cursor.map_or((start, String::new()), |c| (c.at, c.id.clone()));
        Page {
            tenant,
            at,
            id,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
        }
    }

    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    pub fn values(&self) -> [SqlValue<'_>; 4] {
        [
            SqlValue::Int(self.tenant),
            SqlValue::Int(self.at),
            SqlValue::Text(&self.id),
            SqlValue::Int(self.limit),
        ]
    }
}
