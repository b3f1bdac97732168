//! The ledger on PostgreSQL ([`LedgerStore`]): top-ups and balances, recording a batch of
//! request rows in one multi-row insert (charging balances and the replica's lease in the same
//! transaction), rows set aside as rejected, a tenant's statement and the raw rows. The shared
//! statements are `sql::ledger`'s; what is PostgreSQL's own is `record` (one `UNNEST` insert,
//! balances and leases changed in `NUMERIC` by the database), the top-up's balance and signal,
//! and the locking below.
//!
//! **Money under concurrency.** Transactions run at READ COMMITTED with explicit row locks:
//! every transaction that moves money (`record`, `top_up`, `acquire_lease`) first locks the
//! tenant rows it touches with `SELECT … FOR NO KEY UPDATE`, in ascending id order, so they
//! serialise per tenant across all replicas and cannot deadlock with one another. (`NO KEY
//! UPDATE` rather than `UPDATE`: it does not conflict with the `KEY SHARE` locks that foreign
//! keys take when ledger or lease rows are inserted.) Once the tenant row is locked, the balance
//! and the leases it reads are the latest committed ones and stay so until commit; a lease can
//! only shrink behind our back (reclaim, drop, release), which never breaks `Σ leases ≤
//! balance`. Should the server still report a deadlock or serialisation failure, the whole
//! transaction is retried (a few times, with a short pause): nothing was committed.

use super::tenants::tenant_with_balance;
use super::{execute, leases, query, query_opt, snapshot, usage, webhooks, PgResult, PgStore};
use crate::money::Pen;
use crate::store::columns::{names, unnest, LEDGER_COLUMNS};
use crate::store::rows::{
    check_row, conflict_if_unique, period_bounds, rejected, replayed_top_up, tenant_missing,
    top_up_entry, LedgerBatch, RawLedgerRow, Taken,
};
use crate::store::sql::SqlValue::{Int, OptInt, Text};
use crate::store::sql::{ledger as q, tenants as tq};
use crate::store::sql::{pg_params, Sql, SqlValue};
use crate::store::sql_money::{pen_from_text, pen_to_text};
use crate::store::usage::{rollup, RollupRow};
use crate::store::{
    now_ms, Backend, Balance, LedgerRow, LedgerStore, Recorded, RejectedRow, ReplicaSignal,
    Statement, StoreResult, TenantId, TopUp, TopUpOutcome, UnixMs,
};
use async_trait::async_trait;
use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient, Transaction};

/// Locks the tenant row (see the module docs) and returns its balance, or `NotFound`.
pub(super) async fn lock_tenant(tx: &Transaction<'_>, tenant: TenantId) -> PgResult<Pen> {
    Ok(query_opt(tx, &tq::LOCK_BALANCE, &[Int(tenant)], |c| {
        c.pen("tenants.balance")
    })
    .await?
    .ok_or_else(|| tenant_missing(tenant))?)
}

async fn top_up_tx(
    client: &mut Client,
    tenant: TenantId,
    amount: Pen,
    delta: i64,
    note: &str,
    id: &str,
) -> PgResult<TopUpOutcome> {
    let now = now_ms();
    let tx = client.transaction().await?;
    let balance = lock_tenant(&tx, tenant).await?;
    // An idempotent top-up's id is derived from its key; the tenant lock serialises two
    // retries of the same top-up of one tenant, and the primary key any others.
    let earlier = query_opt(&tx, &q::EARLIER_TOP_UP, &[Text(id)], q::earlier_top_up).await?;
    if let Some(earlier) = earlier {
        return Ok(replayed_top_up(
            id.to_owned(),
            tenant,
            amount,
            delta,
            earlier,
            balance,
        )?);
    }
    let values = [Text(id), Int(tenant), Int(now), Int(delta), Text(note)];
    execute(&tx, &q::INSERT_TOP_UP, &values)
        .await
        .map_err(conflict_if_unique(Taken::TopUp(id)))?;
    let after = tx
        .query_typed_one(
            "UPDATE tenants SET balance = balance + $2::numeric WHERE id = $1
             RETURNING balance::text",
            &[(&tenant, Type::INT8), (&pen_to_text(amount), Type::TEXT)],
        )
        .await?;
    let balance = pen_from_text(&after.try_get::<_, String>(0)?, "tenants.balance")?;
    let top_up = TopUp {
        id: id.to_owned(),
        tenant_id: tenant,
        amount,
        at: now,
        note: note.to_owned(),
    };
    webhooks::top_up_event(&tx, &top_up, balance).await?;
    // Replicas that found the tenant's balance all leased refuse from memory for a moment:
    // tell them money arrived (delivered at commit, not before).
    let arrived = ReplicaSignal::LeasesReturned {
        pool: crate::store::Pool::Balance(tenant),
    }
    .to_payload();
    tx.execute_typed(
        "SELECT pg_notify($1, $2)",
        &[
            (&super::replicas::CHANNEL, Type::TEXT),
            (&arrived, Type::TEXT),
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(TopUpOutcome {
        top_up,
        balance,
        replayed: false,
    })
}

async fn balance_q(client: &mut Client, tenant: TenantId) -> PgResult<Balance> {
    let row = client
        .query_typed_opt(
            "SELECT t.balance::text,
                    COALESCE((SELECT SUM(l.amount) FROM leases l WHERE l.tenant_id = t.id), 0)::text
               FROM tenants t WHERE t.id = $1",
            &[(&tenant, Type::INT8)],
        )
        .await?
        .ok_or_else(|| tenant_missing(tenant))?;
    Ok(Balance {
        balance: pen_from_text(&row.try_get::<_, String>(0)?, "tenants.balance")?,
        leased: pen_from_text(&row.try_get::<_, String>(1)?, "leases.amount")?,
    })
}

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
                   output_tokens, caps, entry_id",
        cols = names(LEDGER_COLUMNS),
        unnest = unnest(LEDGER_COLUMNS, "u"),
    )
});

async fn record_tx(client: &mut Client, replica: &str, b: &LedgerBatch) -> PgResult<Recorded> {
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
    // Per cap pool the new rows were reserved against: its tenant and what they charge it.
    let mut caps: BTreeMap<String, (i64, Pen)> = BTreeMap::new();
    // A new row of each tenant: the change a low-balance alert names.
    let mut first_new: BTreeMap<i64, String> = BTreeMap::new();
    for r in &inserted {
        let tenant: i64 = r.try_get(0)?;
        let charge = -Pen::from_picos(i128::from(r.try_get::<_, i64>(1)?));
        *charged.entry(tenant).or_default() += charge;
        for pool in r
            .try_get::<_, &str>(8)?
            .split(',')
            .filter(|p| !p.is_empty())
        {
            caps.entry(pool.to_owned()).or_insert((tenant, Pen::ZERO)).1 += charge;
        }
        if let std::collections::btree_map::Entry::Vacant(slot) = first_new.entry(tenant) {
            slot.insert(r.try_get(9)?);
        }
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
        let after = tx
            .query_typed(
                "UPDATE tenants AS t SET balance = t.balance - u.c::numeric
                   FROM UNNEST($1::int8[], $2::text[]) AS u(id, c)
                  WHERE t.id = u.id
                  RETURNING t.id, t.balance::text, t.low_balance, t.name",
                &[(&ids, Type::INT8_ARRAY), (&amounts, Type::TEXT_ARRAY)],
            )
            .await?;
        webhooks::balance_alerts(&tx, &after, &charged, &first_new).await?;
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
            leases.push((r.try_get::<_, i64>(0)?, leases::reading(r, 1)?));
        }
    }
    let cap_leases = super::caps::charge_caps(&tx, replica, &caps).await?;
    tx.commit().await?;
    Ok(Recorded {
        new: inserted.len() as u64,
        leases,
        cap_leases,
    })
}

async fn reject_q(client: &Client, row: &LedgerRow, reason: &str) -> PgResult<()> {
    let rejected = rejected(row, reason);
    client
        .execute_typed(
            q::INSERT_REJECT.get(Backend::Postgres),
            &rejected.pg_params(),
        )
        .await?;
    Ok(())
}

async fn rejected_rows_q(client: &Client) -> PgResult<Vec<RejectedRow>> {
    let rows = client
        .query_typed(q::REJECTED_ROWS.get(Backend::Postgres), &[])
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(RejectedRow::from_pg(&r)?);
    }
    Ok(out)
}

async fn statement_q(
    client: &mut Client,
    tenant: TenantId,
    from: Option<UnixMs>,
    to: Option<UnixMs>,
) -> PgResult<Statement> {
    let (lo, hi) = period_bounds(from, to);
    let tx = snapshot(client).await?;
    let head = tenant_with_balance(&tx, tenant).await?;
    let period = [Int(tenant), Int(lo), Int(hi)];
    let per_model = query(&tx, &q::STATEMENT_MODELS, &period, q::model_totals).await?;
    let top_ups = query(&tx, &q::STATEMENT_TOP_UPS, &period, |c| {
        q::top_up(c, tenant)
    })
    .await?;
    tx.commit().await?;
    Ok(q::statement(head, (from, to), per_model, top_ups))
}

/// Request rows as a shared statement selects them (every column of `LEDGER_COLUMNS`).
pub(super) async fn ledger_rows_of(
    client: &impl GenericClient,
    sql: &Sql,
    values: &[SqlValue<'_>],
) -> PgResult<Vec<LedgerRow>> {
    let rows = client
        .query_typed(sql.get(Backend::Postgres), &pg_params(values))
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(RawLedgerRow::from_pg(&r)?.into_row()?);
    }
    Ok(out)
}

#[async_trait]
impl LedgerStore for PgStore {
    async fn top_up_once(
        &self,
        tenant: TenantId,
        amount: Pen,
        note: &str,
        idempotency_key: Option<&str>,
    ) -> StoreResult<TopUpOutcome> {
        let (delta, id) = top_up_entry(amount, idempotency_key)?;
        with_retry!(self, c => top_up_tx(c, tenant, amount, delta, note, &id))
    }

    async fn balance(&self, tenant: TenantId) -> StoreResult<Balance> {
        with_retry!(self, c => balance_q(c, tenant))
    }

    async fn record(&self, replica: &str, rows: &[LedgerRow]) -> StoreResult<Recorded> {
        if rows.is_empty() {
            return Ok(Recorded::default());
        }
        let batch = batch_of(rows)?;
        with_retry!(self, c => record_tx(c, replica, &batch))
    }

    async fn reject(&self, row: &LedgerRow, reason: &str) -> StoreResult<()> {
        with_retry!(self, c => reject_q(c, row, reason))
    }

    async fn rejected_rows(&self) -> StoreResult<Vec<RejectedRow>> {
        with_retry!(self, c => rejected_rows_q(c))
    }

    async fn statement(
        &self,
        tenant: TenantId,
        from: Option<UnixMs>,
        to: Option<UnixMs>,
    ) -> StoreResult<Statement> {
        with_retry!(self, c => statement_q(c, tenant, from, to))
    }

    async fn ledger_rows(&self, tenant: Option<TenantId>) -> StoreResult<Vec<LedgerRow>> {
        with_retry!(self, c => ledger_rows_of(&*c, &q::LEDGER_ROWS, &[OptInt(tenant)]))
    }
}
