//! The `responses` table (migration 4): stored responses of the Responses API, for both
//! backends. The [`super::Store`] methods of `sqlite.rs` and `postgres.rs` call these.
//!
//! One row per response: its id, tenant, key, model, `created_at`, the response object, the
//! conversation's input items and their `size` (what the per-tenant cap counts), indexed by
//! (tenant, created_at), for the cap and the retention (there is no index by age alone: each
//! stored response would pay for it, see the schema's migration 6). Every read and delete
//! names the tenant: another tenant's id reads as missing.
//!
//! The cleanup ([`super::Store::prune_responses`]) deletes by age, tenant by tenant through
//! the (tenant, created_at) index, then, per tenant, the oldest rows beyond the cap: a window
//! sum over the tenant's rows newest first, so the newest responses that fit are kept. Both
//! run in one statement each; a cleanup that races a write at worst leaves a row for the next
//! pass.

use super::{StoreError, StoreResult, StoredResponse, TenantId, UnixMs};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::sync::Arc;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

const COLUMNS: &str = "id, tenant_id, key_id, model, created_at, response, input_items, size";

fn sql_err(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(format!("sqlite: {e}"))
}

fn size_of(r: &StoredResponse) -> StoreResult<i64> {
    i64::try_from(r.size())
        .map_err(|_| StoreError::Invalid(format!("response {} is too large to store", r.id)))
}

fn sqlite_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredResponse> {
    Ok(StoredResponse {
        id: r.get(0)?,
        tenant_id: r.get(1)?,
        key_id: r.get(2)?,
        model: r.get(3)?,
        created_at: r.get(4)?,
        response: r.get(5)?,
        input_items: r.get(6)?,
    })
}

pub(super) fn sqlite_put(conn: &mut Connection, rows: &[Arc<StoredResponse>]) -> StoreResult<u64> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql_err)?;
    let mut new = 0u64;
    {
        let mut stmt = tx
            .prepare_cached(&format!(
                "INSERT INTO responses ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT (id) DO NOTHING"
            ))
            .map_err(sql_err)?;
        for r in rows {
            let n = stmt
                .execute(params![
                    r.id,
                    r.tenant_id,
                    r.key_id,
                    r.model,
                    r.created_at,
                    r.response,
                    r.input_items,
                    size_of(r)?
                ])
                .map_err(|e| match e.sqlite_error_code() {
                    Some(rusqlite::ErrorCode::ConstraintViolation) => {
                        StoreError::Invalid(format!("response {}: {e}", r.id))
                    }
                    _ => sql_err(e),
                })?;
            new += n as u64;
        }
    }
    tx.commit().map_err(sql_err)?;
    Ok(new)
}

pub(super) fn sqlite_get(
    conn: &mut Connection,
    tenant: TenantId,
    id: &str,
) -> StoreResult<Option<StoredResponse>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM responses WHERE id = ?1 AND tenant_id = ?2"
    ))
    .and_then(|mut s| s.query_row(params![id, tenant], sqlite_row).optional())
    .map_err(sql_err)
}

pub(super) fn sqlite_delete(
    conn: &mut Connection,
    tenant: TenantId,
    id: &str,
) -> StoreResult<bool> {
    let n = conn
        .execute(
            "DELETE FROM responses WHERE id = ?1 AND tenant_id = ?2",
            params![id, tenant],
        )
        .map_err(sql_err)?;
    Ok(n > 0)
}

/// Deletes the rows created before the parameter, tenant by tenant: each tenant's oldest rows
/// are a range of `responses_by_tenant`. `CROSS JOIN` keeps SQLite's planner on that order
/// (tenants outside): left to itself, without statistics, it scans `responses`.
const TOO_OLD: &str = "DELETE FROM responses WHERE id IN (
    SELECT r.id FROM tenants t CROSS JOIN responses r
     WHERE r.tenant_id = t.id AND r.created_at < ";

/// Deletes each tenant's oldest rows beyond the cap (the newest that fit are kept).
const OVER_CAP: &str = "DELETE FROM responses WHERE id IN (
    SELECT id FROM (
        SELECT id, SUM(size) OVER (PARTITION BY tenant_id ORDER BY created_at DESC, id DESC
                                   ROWS UNBOUNDED PRECEDING) AS kept
          FROM responses) AS newest_first
     WHERE kept > ";

pub(super) fn sqlite_prune(
    conn: &mut Connection,
    before: UnixMs,
    max_bytes: u64,
) -> StoreResult<u64> {
    let cap = i64::try_from(max_bytes).unwrap_or(i64::MAX);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql_err)?;
    let old = tx
        .execute(&format!("{TOO_OLD}?1)"), params![before])
        .map_err(sql_err)?;
    let over = tx
        .execute(&format!("{OVER_CAP}?1)"), params![cap])
        .map_err(sql_err)?;
    tx.commit().map_err(sql_err)?;
    Ok((old + over) as u64)
}

fn pg_row(r: &tokio_postgres::Row) -> Result<StoredResponse, tokio_postgres::Error> {
    Ok(StoredResponse {
        id: r.try_get(0)?,
        tenant_id: r.try_get(1)?,
        key_id: r.try_get(2)?,
        model: r.try_get(3)?,
        created_at: r.try_get(4)?,
        response: r.try_get(5)?,
        input_items: r.try_get(6)?,
    })
}

/// What a PostgreSQL call can fail with: the database, or a row that can never be written.
pub(super) enum PgFailure {
    Db(tokio_postgres::Error),
    Store(StoreError),
}

impl From<tokio_postgres::Error> for PgFailure {
    fn from(e: tokio_postgres::Error) -> Self {
        PgFailure::Db(e)
    }
}

pub(super) async fn pg_put(
    client: &mut Client,
    rows: &[Arc<StoredResponse>],
) -> Result<u64, PgFailure> {
    let tx = client.transaction().await?;
    let mut new = 0u64;
    for r in rows {
        let size = size_of(r).map_err(PgFailure::Store)?;
        new += tx
            .execute_typed(
                &format!(
                    "INSERT INTO responses ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                     ON CONFLICT (id) DO NOTHING"
                ),
                &[
                    (&r.id, Type::TEXT),
                    (&r.tenant_id, Type::INT8),
                    (&r.key_id, Type::TEXT),
                    (&r.model, Type::TEXT),
                    (&r.created_at, Type::INT8),
                    (&r.response, Type::TEXT),
                    (&r.input_items, Type::TEXT),
                    (&size, Type::INT8),
                ],
            )
            .await?;
    }
    tx.commit().await?;
    Ok(new)
}

pub(super) async fn pg_get(
    client: &mut Client,
    tenant: TenantId,
    id: &str,
) -> Result<Option<StoredResponse>, tokio_postgres::Error> {
    client
        .query_typed_opt(
            &format!("SELECT {COLUMNS} FROM responses WHERE id = $1 AND tenant_id = $2"),
            &[(&id, Type::TEXT), (&tenant, Type::INT8)],
        )
        .await?
        .map(|r| pg_row(&r))
        .transpose()
}

pub(super) async fn pg_delete(
    client: &mut Client,
    tenant: TenantId,
    id: &str,
) -> Result<bool, tokio_postgres::Error> {
    let n = client
        .execute_typed(
            "DELETE FROM responses WHERE id = $1 AND tenant_id = $2",
            &[(&id, Type::TEXT), (&tenant, Type::INT8)],
        )
        .await?;
    Ok(n > 0)
}

pub(super) async fn pg_prune(
    client: &mut Client,
    before: UnixMs,
    max_bytes: u64,
) -> Result<u64, tokio_postgres::Error> {
    let cap = i64::try_from(max_bytes).unwrap_or(i64::MAX);
    let tx = client.transaction().await?;
    let old = tx
        .execute_typed(&format!("{TOO_OLD}$1)"), &[(&before, Type::INT8)])
        .await?;
    let over = tx
        .execute_typed(&format!("{OVER_CAP}$1)"), &[(&cap, Type::INT8)])
        .await?;
    tx.commit().await?;
    Ok(old + over)
}

#[cfg(test)]
mod tests {
    use super::super::schema::{SQLITE_BOOTSTRAP, SQLITE_MIGRATIONS};
    use rusqlite::Connection;

    #[test]
    fn the_retention_reads_each_tenants_rows_by_index_on_sqlite() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SQLITE_BOOTSTRAP).unwrap();
        for (_, sql) in SQLITE_MIGRATIONS {
            conn.execute_batch(sql).unwrap();
        }
        let sql = format!("EXPLAIN QUERY PLAN {}0)", super::TOO_OLD);
        let mut stmt = conn.prepare(&sql).unwrap();
        let plan: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            plan.iter()
                .any(|l| l.contains("responses_by_tenant (tenant_id=? AND created_at<?)")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|l| l == "SCAN r"), "{plan:?}");
    }
}
