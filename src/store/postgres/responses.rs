//! Stored responses on PostgreSQL ([`ResponseStore`]): `sql::responses`' statements; a batch
//! of responses is one transaction.

use super::{execute, query_opt, PgResult, PgStore};
use crate::store::sql::responses as q;
use crate::store::sql::SqlValue::Int;
use crate::store::{ResponseStore, StoreResult, StoredResponse, TenantId, UnixMs};
use async_trait::async_trait;
use std::sync::Arc;
use tokio_postgres::Client;

async fn put(client: &mut Client, rows: &[Arc<StoredResponse>]) -> PgResult<u64> {
    let tx = client.transaction().await?;
    let mut new = 0u64;
    for r in rows {
        new += execute(&tx, &q::INSERT, &q::values(r)?).await?;
    }
    tx.commit().await?;
    Ok(new)
}

async fn prune(client: &mut Client, before: UnixMs, max_bytes: u64) -> PgResult<u64> {
    let cap = i64::try_from(max_bytes).unwrap_or(i64::MAX);
    let tx = client.transaction().await?;
    let old = execute(&tx, &q::PRUNE_OLD, &[Int(before)]).await?;
    let over = execute(&tx, &q::PRUNE_OVER_CAP, &[Int(cap)]).await?;
    tx.commit().await?;
    Ok(old + over)
}

#[async_trait]
impl ResponseStore for PgStore {
    async fn put_responses(&self, rows: &[Arc<StoredResponse>]) -> StoreResult<u64> {
        with_retry!(self, c => put(c, rows))
    }

    async fn get_response(
        &self,
        tenant: TenantId,
        id: &str,
    ) -> StoreResult<Option<StoredResponse>> {
        with_retry!(self, c => query_opt(&*c, &q::GET, &q::key(tenant, id), q::response))
    }

    async fn delete_response(&self, tenant: TenantId, id: &str) -> StoreResult<bool> {
        with_retry!(self, c => async {
            Ok(execute(&*c, &q::DELETE, &q::key(tenant, id)).await? > 0)
        })
    }

    async fn prune_responses(&self, before: UnixMs, max_bytes_per_tenant: u64) -> StoreResult<u64> {
        with_retry!(self, c => prune(c, before, max_bytes_per_tenant))
    }
}
