//! The ledger on PostgreSQL: recording a batch of request rows in one multi-row insert
//! (charging balances and the replica's lease in the same transaction, after locking the
//! tenants as `balances` describes), rows set aside as rejected, a tenant's statement and the
//! raw rows. Sums are `SUM(bigint)`, an exact NUMERIC read as text: no overflow, no float.

use super::{balances, tenants, usage, PgResult};
use crate::money::Pen;
use crate::store::columns::{names, pg_placeholders, unnest, LEDGER_COLUMNS, REJECT_COLUMNS};
use crate::store::rows::{
    check_row, period_bounds, rejected, tenant_missing, LedgerBatch, RawLedgerRow,
};
use crate::store::sql_money::{count_from_text, i64_to_u64, pen_from_text, pen_to_text};
use crate::store::usage::{rollup, RollupRow};
use crate::store::{
    LedgerRow, ModelTotals, Recorded, RejectedRow, Statement, StoreResult, TenantId, TopUp, UnixMs,
};
use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// Request rows as one array per column (see `columns`), for one multi-row insert.
pub(super) fn batch_of(rows: &[LedgerRow]) -> StoreResult<LedgerBatch> {
    let mut b = LedgerBatch::default();
    // A batch may repeat an id (a replay appended to new rows); the first occurrence wins,
    // as it would if they came in separate batches.
    let mut seen = HashSet::new();
    for row in rows {
        let raw = check_row(row)?;
        if seen.insert(row.request_id.as_str()) {
            b.push(raw);
        }
    }
    Ok(b)
}

/// A batch's rows, as `record` inserts them; answers each new row's tenant and delta.
static INSERT_LEDGER_ROWS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO ledger (kind, {cols})
         SELECT 'request', {cols} FROM {unnest}
         ON CONFLICT (entry_id) DO NOTHING
         RETURNING tenant_id, delta, at, key_id, model, input_tokens, cached_tokens,
                   output_tokens",
        cols = names(LEDGER_COLUMNS),
        unnest = unnest(LEDGER_COLUMNS, "u"),
    )
});

pub(super) async fn record_tx(
    client: &mut Client,
    replica: &str,
    b: &LedgerBatch,
) -> PgResult<Recorded> {
    let tx = client.transaction().await?;
    let mut tenants: Vec<i64> = b.tenant_id.clone();
    tenants.sort_unstable();
    tenants.dedup();
    let locked = tx
        .query_typed(
            "SELECT id FROM tenants WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE",
            &[(&tenants, Type::INT8_ARRAY)],
        )
        .await?;
    if locked.len() != tenants.len() {
        let found: HashSet<i64> = locked
            .iter()
            .map(|r| r.try_get::<_, i64>(0))
            .collect::<Result<_, _>>()?;
        let missing = tenants.iter().find(|t| !found.contains(t)).copied();
        return Err(tenant_missing(missing.unwrap_or_default()).into());
    }
    let inserted = tx.query_typed(&INSERT_LEDGER_ROWS, &b.pg_params()).await?;
    let mut charged: BTreeMap<i64, Pen> = BTreeMap::new();
    for r in &inserted {
        let tenant: i64 = r.try_get(0)?;
        let delta: i64 = r.try_get(1)?;
        *charged.entry(tenant).or_default() += -Pen::from_picos(i128::from(delta));
    }
    let mut new_rows = Vec::with_capacity(inserted.len());
    for r in &inserted {
        let delta: i64 = r.try_get(1)?;
        new_rows.push(RollupRow {
            tenant_id: r.try_get(0)?,
            at: r.try_get(2)?,
            key_id: r.try_get::<_, Option<String>>(3)?.unwrap_or_default(),
            model: r.try_get::<_, Option<String>>(4)?.unwrap_or_default(),
            input: r.try_get::<_, Option<i64>>(5)?.unwrap_or(0),
            cached: r.try_get::<_, Option<i64>>(6)?.unwrap_or(0),
            output: r.try_get::<_, Option<i64>>(7)?.unwrap_or(0),
            charge: -i128::from(delta),
        });
    }
    usage::add_rollup(&tx, &rollup(new_rows)).await?;
    charged.retain(|_, c| *c != Pen::ZERO);
    let mut leases = Vec::new();
    if !charged.is_empty() {
        let ids: Vec<i64> = charged.keys().copied().collect();
        let amounts: Vec<String> = charged.values().map(|c| pen_to_text(*c)).collect();
        tx.execute_typed(
            "UPDATE tenants AS t SET balance = t.balance - u.c::numeric
               FROM UNNEST($1::int8[], $2::text[]) AS u(id, c)
              WHERE t.id = u.id",
            &[(&ids, Type::INT8_ARRAY), (&amounts, Type::TEXT_ARRAY)],
        )
        .await?;
        let changed = tx
            .query_typed(
                "UPDATE leases AS l SET amount = GREATEST(l.amount - u.c::numeric, 0),
                                        spent = l.spent + u.c::numeric,
                                        version = l.version + 1
                   FROM UNNEST($1::int8[], $2::text[]) AS u(id, c)
                  WHERE l.tenant_id = u.id AND l.replica = $3
                  RETURNING l.tenant_id, l.amount::text, l.spent::text, l.version",
                &[
                    (&ids, Type::INT8_ARRAY),
                    (&amounts, Type::TEXT_ARRAY),
                    (&replica, Type::TEXT),
                ],
            )
            .await?;
        for r in &changed {
            leases.push((r.try_get::<_, i64>(0)?, balances::reading(r, 1)?));
        }
    }
    tx.commit().await?;
    Ok(Recorded {
        new: inserted.len() as u64,
        leases,
    })
}

pub(super) async fn reject_q(client: &mut Client, row: &LedgerRow, reason: &str) -> PgResult<()> {
    let rejected = rejected(row, reason);
    client
        .execute_typed(
            &format!(
                "INSERT INTO ledger_rejects ({}) VALUES ({}) ON CONFLICT (request_id) DO NOTHING",
                names(REJECT_COLUMNS),
                pg_placeholders(REJECT_COLUMNS)
            ),
            &rejected.pg_params(),
        )
        .await?;
    Ok(())
}

pub(super) async fn rejected_rows_q(client: &mut Client) -> PgResult<Vec<RejectedRow>> {
    let rows = client
        .query_typed(
            &format!(
                "SELECT {} FROM ledger_rejects ORDER BY rejected_at, request_id",
                names(REJECT_COLUMNS)
            ),
            &[],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(RejectedRow::from_pg(&r)?);
    }
    Ok(out)
}

pub(super) async fn statement_q(
    client: &mut Client,
    tenant: TenantId,
    from: Option<UnixMs>,
    to: Option<UnixMs>,
) -> PgResult<Statement> {
    let (lo, hi) = period_bounds(from, to);
    let tx = super::snapshot(client).await?;
    let (t, balance) = tenants::tenant_with_balance(&tx, tenant).await?;
    // SUM(bigint) is an exact NUMERIC: no overflow, no float.
    let models = tx
        .query_typed(
            "SELECT model, COUNT(*), SUM(input_tokens)::text, SUM(cached_tokens)::text,
                    SUM(output_tokens)::text, (-SUM(delta))::text
               FROM ledger
              WHERE tenant_id = $1 AND kind = 'request' AND at >= $2 AND at < $3
              GROUP BY model ORDER BY model",
            &[(&tenant, Type::INT8), (&lo, Type::INT8), (&hi, Type::INT8)],
        )
        .await?;
    let top_ups = tx
        .query_typed(
            "SELECT entry_id, at, delta, note FROM ledger
              WHERE tenant_id = $1 AND kind = 'topup' AND at >= $2 AND at < $3
              ORDER BY at, entry_id",
            &[(&tenant, Type::INT8), (&lo, Type::INT8), (&hi, Type::INT8)],
        )
        .await?;
    tx.commit().await?;
    let mut per_model = Vec::with_capacity(models.len());
    for r in models {
        per_model.push(ModelTotals {
            model: r.try_get::<_, Option<String>>(0)?.unwrap_or_default(),
            requests: i64_to_u64(r.try_get(1)?, "request count")?,
            input_tokens: count_from_text(&r.try_get::<_, String>(2)?, "input tokens")?,
            cached_tokens: count_from_text(&r.try_get::<_, String>(3)?, "cached tokens")?,
            output_tokens: count_from_text(&r.try_get::<_, String>(4)?, "output tokens")?,
            charge: pen_from_text(&r.try_get::<_, String>(5)?, "ledger charges")?,
        });
    }
    let mut ups = Vec::with_capacity(top_ups.len());
    for r in top_ups {
        ups.push(TopUp {
            id: r.try_get(0)?,
            tenant_id: tenant,
            at: r.try_get(1)?,
            amount: Pen::from_picos(i128::from(r.try_get::<_, i64>(2)?)),
            note: r.try_get::<_, Option<String>>(3)?.unwrap_or_default(),
        });
    }
    Ok(Statement {
        tenant: t,
        from,
        to,
        total_charges: per_model.iter().map(|m| m.charge).sum(),
        total_top_ups: ups.iter().map(|u| u.amount).sum(),
        balance,
        per_model,
        top_ups: ups,
    })
}

pub(super) async fn ledger_rows_q(
    client: &mut Client,
    tenant: Option<TenantId>,
) -> PgResult<Vec<LedgerRow>> {
    let rows = client
        .query_typed(
            &format!(
                "SELECT {} FROM ledger
                  WHERE kind = 'request' AND ($1::bigint IS NULL OR tenant_id = $1)
                  ORDER BY at, entry_id",
                names(LEDGER_COLUMNS)
            ),
            &[(&tenant, Type::INT8)],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(RawLedgerRow::from_pg(&r)?.into_row()?);
    }
    Ok(out)
}
