//! API keys on PostgreSQL: creating, revoking and listing them, and what the gateway's key
//! table polls and loads (`keys_version`, `active_keys`). Every change to keys or tenants bumps
//! `keys_version` in the same transaction.
//!
//! **Cheap polls.** `keys_version` is one primary-key lookup with no parameters, sent as a
//! simple query on a pooled connection: one round trip.

use super::{PgErr, PgResult};
use crate::store::rows::{
    conflict_if_unique, limits_from_sql, limits_to_sql, secret_hash, tenant_missing, Taken,
};
use crate::store::{now_ms, ActiveKey, KeyInfo, NewKey, StoreError, TenantId};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage, Transaction};

pub(super) async fn bump_keys_version(tx: &Transaction<'_>) -> PgResult<()> {
    tx.execute_typed(
        "UPDATE meta SET value = value + 1 WHERE key = 'keys_version'",
        &[],
    )
    .await?;
    Ok(())
}

pub(super) async fn create_key_tx(client: &mut Client, key: &NewKey) -> PgResult<KeyInfo> {
    let now = now_ms();
    let (rpm, tpm) = limits_to_sql(key.limits)?;
    let tx = client.transaction().await?;
    let tenant_name: String = tx
        .query_typed_opt(
            "SELECT name FROM tenants WHERE id = $1",
            &[(&key.tenant, Type::INT8)],
        )
        .await?
        .ok_or_else(|| tenant_missing(key.tenant))?
        .try_get(0)?;
    let hash: &[u8] = &key.secret_hash;
    tx.execute_typed(
        "INSERT INTO api_keys (id, tenant_id, label, secret_sha256, secret_prefix, created_at,
                               revoked_at, rpm_limit, tpm_limit)
         VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8)",
        &[
            (&key.id, Type::TEXT),
            (&key.tenant, Type::INT8),
            (&key.label, Type::TEXT),
            (&hash, Type::BYTEA),
            (&key.secret_prefix, Type::TEXT),
            (&now, Type::INT8),
            (&rpm, Type::INT8),
            (&tpm, Type::INT8),
        ],
    )
    .await
    .map_err(conflict_if_unique(Taken::Key(&key.id)))?;
    bump_keys_version(&tx).await?;
    tx.commit().await?;
    Ok(KeyInfo {
        id: key.id.clone(),
        tenant_id: key.tenant,
        tenant_name,
        label: key.label.clone(),
        secret_prefix: key.secret_prefix.clone(),
        created_at: now,
        revoked_at: None,
        limits: key.limits,
    })
}

pub(super) async fn revoke_key_tx(client: &mut Client, key_id: &str) -> PgResult<bool> {
    let tx = client.transaction().await?;
    let row = tx
        .query_typed_opt(
            "SELECT revoked_at FROM api_keys WHERE id = $1 FOR UPDATE",
            &[(&key_id, Type::TEXT)],
        )
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("key {key_id} does not exist")))?;
    if row.try_get::<_, Option<i64>>(0)?.is_some() {
        return Ok(false);
    }
    let now = now_ms();
    tx.execute_typed(
        "UPDATE api_keys SET revoked_at = $2 WHERE id = $1",
        &[(&key_id, Type::TEXT), (&now, Type::INT8)],
    )
    .await?;
    bump_keys_version(&tx).await?;
    tx.commit().await?;
    Ok(true)
}

pub(super) async fn list_keys_q(
    client: &mut Client,
    tenant: Option<TenantId>,
) -> PgResult<Vec<KeyInfo>> {
    let tx = super::snapshot(client).await?;
    if let Some(t) = tenant {
        tx.query_typed_opt("SELECT 1 FROM tenants WHERE id = $1", &[(&t, Type::INT8)])
            .await?
            .ok_or_else(|| tenant_missing(t))?;
    }
    let rows = tx
        .query_typed(
            "SELECT k.id, k.tenant_id, t.name, k.label, k.secret_prefix, k.created_at,
                    k.revoked_at, k.rpm_limit, k.tpm_limit
               FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
              WHERE $1::bigint IS NULL OR k.tenant_id = $1
              ORDER BY k.created_at, k.id",
            &[(&tenant, Type::INT8)],
        )
        .await?;
    tx.commit().await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(KeyInfo {
            id: r.try_get(0)?,
            tenant_id: r.try_get(1)?,
            tenant_name: r.try_get(2)?,
            label: r.try_get(3)?,
            secret_prefix: r.try_get(4)?,
            created_at: r.try_get(5)?,
            revoked_at: r.try_get(6)?,
            limits: limits_from_sql(r.try_get(7)?, r.try_get(8)?)?,
        });
    }
    Ok(out)
}

pub(super) async fn keys_version_q(client: &mut Client) -> PgResult<i64> {
    for msg in client
        .simple_query("SELECT value FROM meta WHERE key = 'keys_version'")
        .await?
    {
        if let SimpleQueryMessage::Row(row) = msg {
            let text = row.try_get(0)?.unwrap_or_default();
            return text.parse::<i64>().map_err(|_| {
                PgErr::Store(StoreError::Backend(format!(
                    "meta.keys_version holds \"{text}\", not an integer"
                )))
            });
        }
    }
    Err(StoreError::Backend("meta.keys_version is missing".into()).into())
}

pub(super) async fn active_keys_q(client: &mut Client) -> PgResult<(i64, Vec<ActiveKey>)> {
    let tx = super::snapshot(client).await?;
    let version: i64 = tx
        .query_typed_one("SELECT value FROM meta WHERE key = 'keys_version'", &[])
        .await?
        .try_get(0)?;
    let rows = tx
        .query_typed(
            "SELECT k.secret_sha256, k.id, k.tenant_id, t.name, k.rpm_limit, k.tpm_limit
               FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
              WHERE k.revoked_at IS NULL
              ORDER BY k.id",
            &[],
        )
        .await?;
    tx.commit().await?;
    let mut keys = Vec::with_capacity(rows.len());
    for r in rows {
        keys.push(ActiveKey {
            secret_hash: secret_hash(r.try_get(0)?)?,
            key_id: r.try_get(1)?,
            tenant_id: r.try_get(2)?,
            tenant_name: r.try_get(3)?,
            limits: limits_from_sql(r.try_get(4)?, r.try_get(5)?)?,
        });
    }
    Ok((version, keys))
}
