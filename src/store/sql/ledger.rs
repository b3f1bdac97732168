//! The ledger: the statements both backends send for top-ups, rejected rows, statements and
//! raw rows, and their rows. Recording request rows is per backend (see the module docs of
//! `sql`); its insert's text is here.

use super::{Backend, Cols, Sql};
use crate::money::Pen;
use crate::store::columns::{names, placeholders, LEDGER_COLUMNS, REJECT_COLUMNS};
use crate::store::rows::EarlierTopUp;
use crate::store::sql_money::{i128_to_u64, i64_to_u64};
use crate::store::{ModelTotals, Statement, StoreResult, Tenant, TenantId, TopUp, UnixMs};

/// The ledger entry holding a top-up's id, if any (`earlier_top_up`).
pub static EARLIER_TOP_UP: Sql =
    Sql::text("SELECT tenant_id, delta, at, note FROM ledger WHERE entry_id = $1");

/// ($1 id, $2 tenant, $3 at, $4 delta, $5 note).
pub static INSERT_TOP_UP: Sql = Sql::text(
    "INSERT INTO ledger (entry_id, kind, tenant_id, at, delta, note)
     VALUES ($1, 'topup', $2, $3, $4, $5)",
);

/// One request row, bound from `RawLedgerRow` in column order.
pub static INSERT_REQUEST_ROW: Sql = Sql::built(|_| {
    format!(
        "INSERT INTO ledger (kind, {}) VALUES ('request', {}) ON CONFLICT (entry_id) DO NOTHING",
        names(LEDGER_COLUMNS),
        placeholders(LEDGER_COLUMNS)
    )
});

/// The request rows of tenant $1, or of all tenants when it is `NULL`, oldest first.
pub static LEDGER_ROWS: Sql = Sql::built(|_| {
    format!(
        "SELECT {} FROM ledger
          WHERE kind = 'request' AND (CAST($1 AS BIGINT) IS NULL OR tenant_id = $1)
          ORDER BY at, entry_id",
        names(LEDGER_COLUMNS)
    )
});

/// One dead-letter row, bound from `RejectedRow` in column order.
pub static INSERT_REJECT: Sql = Sql::built(|_| {
    format!(
        "INSERT INTO ledger_rejects ({}) VALUES ({}) ON CONFLICT (request_id) DO NOTHING",
        names(REJECT_COLUMNS),
        placeholders(REJECT_COLUMNS)
    )
});

pub static REJECTED_ROWS: Sql = Sql::built(|_| {
    format!(
        "SELECT {} FROM ledger_rejects ORDER BY rejected_at, request_id",
        names(REJECT_COLUMNS)
    )
});

/// A statement's requests per model, tenant $1 in [$2, $3) ([`model_totals`]).
pub static STATEMENT_MODELS: Sql = Sql::built(|b: Backend| {
    let sums: Vec<String> = ["input_tokens", "cached_tokens", "output_tokens", "-delta"]
        .into_iter()
        .flat_map(|x| b.split(x))
        .map(|part| b.summed(&part))
        .collect();
    format!(
        "SELECT model, COUNT(*), {} FROM ledger
          WHERE tenant_id = $1 AND kind = 'request' AND at >= $2 AND at < $3
          GROUP BY model ORDER BY model",
        sums.join(", ")
    )
});

/// A statement's top-ups, tenant $1 in [$2, $3), oldest first ([`top_up`]).
pub static STATEMENT_TOP_UPS: Sql = Sql::text(
    "SELECT entry_id, at, delta, note FROM ledger
      WHERE tenant_id = $1 AND kind = 'topup' AND at >= $2 AND at < $3
      ORDER BY at, entry_id",
);

pub(crate) fn earlier_top_up(c: &mut Cols<'_>) -> StoreResult<EarlierTopUp> {
    Ok(EarlierTopUp {
        tenant_id: c.int()?,
        delta: c.int()?,
        at: c.int()?,
        note: c.opt_text()?,
    })
}

pub fn model_totals(c: &mut Cols<'_>) -> StoreResult<ModelTotals> {
    Ok(ModelTotals {
        model: c.opt_text()?.unwrap_or_default(),
        requests: i64_to_u64(c.int()?, "request count")?,
        input_tokens: i128_to_u64(c.sum("input tokens")?, "input tokens")?,
        cached_tokens: i128_to_u64(c.sum("cached tokens")?, "cached tokens")?,
        output_tokens: i128_to_u64(c.sum("output tokens")?, "output tokens")?,
        charge: Pen::from_picos(c.sum("ledger charges")?),
    })
}

/// A top-up of `tenant` as `entry_id, at, delta, note`.
pub fn top_up(c: &mut Cols<'_>, tenant: TenantId) -> StoreResult<TopUp> {
    Ok(TopUp {
        id: c.text()?,
        tenant_id: tenant,
        at: c.int()?,
        amount: Pen::from_picos(i128::from(c.int()?)),
        note: c.opt_text()?.unwrap_or_default(),
    })
}

/// A tenant's statement for `[from, to)` from what its queries read, in one snapshot.
pub fn statement(
    (tenant, balance): (Tenant, Pen),
    (from, to): (Option<UnixMs>, Option<UnixMs>),
    per_model: Vec<ModelTotals>,
    top_ups: Vec<TopUp>,
) -> Statement {
    Statement {
        total_charges: per_model.iter().map(|m| m.charge).sum(),
        total_top_ups: top_ups.iter().map(|t| t.amount).sum(),
        balance,
        tenant,
        from,
        to,
        per_model,
        top_ups,
    }
}
