//! Stored responses on PostgreSQL ([`ResponseStore`]): the statements and the table are
//! described in `store::responses`.

use super::{PgResult, PgStore};
use crate::store::responses::{size_of, COLUMNS, OVER_CAP, TOO_OLD};
use crate::store::{ResponseStore, StoreResult, StoredResponse, TenantId, UnixMs};
use async_trait::async_trait;
use std::sync::Arc;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

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

async fn pg_put(client: &mut Client, rows: &[Arc<StoredResponse>]) -> PgResult<u64> {
    let tx = client.transaction().await?;
    let mut new = 0u64;
    for r in rows {
        let size = size_of(r)?;
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

async fn pg_get(
    client: &mut Client,
    tenant: TenantId,
    id: &str,
) -> PgResult<Option<StoredResponse>> {
    Ok(client
        .query_typed_opt(
            &format!("SELECT {COLUMNS} FROM responses WHERE id = $1 AND tenant_id = $2"),
            &[(&id, Type::TEXT), (&tenant, Type::INT8)],
        )
        .await?
        .map(|r| pg_row(&r))
        .transpose()?)
}

async fn pg_delete(client: &mut Client, tenant: TenantId, id: &str) -> PgResult<bool> {
    let n = client
        .execute_typed(
            "DELETE FROM responses WHERE id = $1 AND tenant_id = $2",
            &[(&id, Type::TEXT), (&tenant, Type::INT8)],
        )
        .await?;
    Ok(n > 0)
}

async fn pg_prune(client: &mut Client, before: UnixMs, max_bytes: u64) -> PgResult<u64> {
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

#[async_trait]
impl ResponseStore for PgStore {
    async fn put_responses(&self, rows: &[Arc<StoredResponse>]) -> StoreResult<u64> {
        with_retry!(self, c => pg_put(c, rows))
    }

    async fn get_response(
        &self,
        tenant: TenantId,
        id: &str,
    ) -> StoreResult<Option<StoredResponse>> {
        with_retry!(self, c => pg_get(c, tenant, id))
    }

    async fn delete_response(&self, tenant: TenantId, id: &str) -> StoreResult<bool> {
        with_retry!(self, c => pg_delete(c, tenant, id))
    }

    async fn prune_responses(&self, before: UnixMs, max_bytes_per_tenant: u64) -> StoreResult<u64> {
        with_retry!(self, c => pg_prune(c, before, max_bytes_per_tenant))
    }
}
