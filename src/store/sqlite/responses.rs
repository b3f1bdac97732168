//! Stored responses on SQLite ([`ResponseStore`]): `sql::responses`' statements, each call one
//! transaction (a batch of puts through one prepared insert).

use super::{execute, query_opt, sql_err, write_tx, SqliteStore};
use crate::store::sql::responses as q;
use crate::store::sql::SqlValue::Int;
use crate::store::{
    Backend, ResponseStore, StoreError, StoreResult, StoredResponse, TenantId, UnixMs,
};
use async_trait::async_trait;
use rusqlite::Connection;
use std::sync::Arc;

/// The rows in one transaction, through one prepared insert: a batch is the writer's queue,
/// and looking the statement up in the cache per row (hashing its text, taking it out and
/// putting it back) cost about a thousand instructions a stored response.
fn put(conn: &mut Connection, rows: &[Arc<StoredResponse>]) -> StoreResult<u64> {
    let tx = write_tx(conn)?;
    let mut new = 0u64;
    {
        let mut stmt = tx
            .prepare_cached(q::INSERT.get(Backend::Sqlite))
            .map_err(sql_err)?;
        for r in rows {
            let n = stmt
                .execute(rusqlite::params_from_iter(q::values(r)?))
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

fn prune(conn: &mut Connection, before: UnixMs, max_bytes: u64) -> StoreResult<u64> {
    let cap = i64::try_from(max_bytes).unwrap_or(i64::MAX);
    let tx = write_tx(conn)?;
    let old = execute(&tx, &q::PRUNE_OLD, &[Int(before)])?;
    let over = execute(&tx, &q::PRUNE_OVER_CAP, &[Int(cap)])?;
    tx.commit().map_err(sql_err)?;
    Ok((old + over) as u64)
}

#[async_trait]
impl ResponseStore for SqliteStore {
    async fn put_responses(&self, rows: &[Arc<StoredResponse>]) -> StoreResult<u64> {
        let rows = rows.to_vec();
        self.run(move |conn| put(conn, &rows)).await
    }

    async fn get_response(
        &self,
        tenant: TenantId,
        id: &str,
    ) -> StoreResult<Option<StoredResponse>> {
        let id = id.to_owned();
        self.run(move |conn| Ok(query_opt(conn, &q::GET, &q::key(tenant, &id), q::response)?))
            .await
    }

    async fn delete_response(&self, tenant: TenantId, id: &str) -> StoreResult<bool> {
        let id = id.to_owned();
        self.run(move |conn| Ok(execute(conn, &q::DELETE, &q::key(tenant, &id))? > 0))
            .await
    }

    async fn prune_responses(&self, before: UnixMs, max_bytes_per_tenant: u64) -> StoreResult<u64> {
        self.run(move |conn| prune(conn, before, max_bytes_per_tenant))
            .await
    }
}
