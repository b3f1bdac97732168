//! Stored responses on SQLite ([`ResponseStore`]): the statements and the table are described
//! in `store::responses`.

use super::{sql_err, SqliteStore};
use crate::store::responses::{size_of, COLUMNS, OVER_CAP, TOO_OLD};
use crate::store::{ResponseStore, StoreError, StoreResult, StoredResponse, TenantId, UnixMs};
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::sync::Arc;

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

fn sqlite_put(conn: &mut Connection, rows: &[Arc<StoredResponse>]) -> StoreResult<u64> {
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

fn sqlite_get(
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

fn sqlite_delete(conn: &mut Connection, tenant: TenantId, id: &str) -> StoreResult<bool> {
    let n = conn
        .execute(
            "DELETE FROM responses WHERE id = ?1 AND tenant_id = ?2",
            params![id, tenant],
        )
        .map_err(sql_err)?;
    Ok(n > 0)
}

fn sqlite_prune(conn: &mut Connection, before: UnixMs, max_bytes: u64) -> StoreResult<u64> {
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

#[async_trait]
impl ResponseStore for SqliteStore {
    async fn put_responses(&self, rows: &[Arc<StoredResponse>]) -> StoreResult<u64> {
        let rows = rows.to_vec();
        self.run(move |conn| sqlite_put(conn, &rows)).await
    }

    async fn get_response(
        &self,
        tenant: TenantId,
        id: &str,
    ) -> StoreResult<Option<StoredResponse>> {
        let id = id.to_owned();
        self.run(move |conn| sqlite_get(conn, tenant, &id)).await
    }

    async fn delete_response(&self, tenant: TenantId, id: &str) -> StoreResult<bool> {
        let id = id.to_owned();
        self.run(move |conn| sqlite_delete(conn, tenant, &id)).await
    }

    async fn prune_responses(&self, before: UnixMs, max_bytes_per_tenant: u64) -> StoreResult<u64> {
        self.run(move |conn| sqlite_prune(conn, before, max_bytes_per_tenant))
            .await
    }
}
