//! Tenants and keys on PostgreSQL ([`TenantStore`]): creating a tenant, finding one by name,
//! and the list with each tenant's balance, leased amount and active keys; API keys are in
//! `keys`. A new tenant bumps `keys_version` (see `keys`): the gateway's key table carries
//! tenant names.

use super::keys::{self, bump_keys_version};
use super::{PgResult, PgStore};
use crate::money::Pen;
use crate::store::rows::{conflict_if_unique, tenant_missing, Taken};
use crate::store::sql_money::{i64_to_u64, pen_from_text};
use crate::store::{
    now_ms, ActiveKey, KeyInfo, NewKey, StoreResult, Tenant, TenantId, TenantStore, TenantSummary,
};
use async_trait::async_trait;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

async fn create_tenant_tx(client: &mut Client, name: &str) -> PgResult<Tenant> {
    let now = now_ms();
    let tx = client.transaction().await?;
    let row = tx
        .query_typed_one(
            "INSERT INTO tenants (name, created_at) VALUES ($1, $2) RETURNING id",
            &[(&name, Type::TEXT), (&now, Type::INT8)],
        )
        .await
        .map_err(conflict_if_unique(Taken::TenantName(name)))?;
    let id: i64 = row.try_get(0)?;
    bump_keys_version(&tx).await?;
    tx.commit().await?;
    Ok(Tenant {
        id,
        name: name.to_owned(),
        created_at: now,
    })
}

async fn tenant_by_name_q(client: &mut Client, name: &str) -> PgResult<Option<Tenant>> {
    let row = client
        .query_typed_opt(
            "SELECT id, name, created_at FROM tenants WHERE name = $1",
            &[(&name, Type::TEXT)],
        )
        .await?;
    Ok(match row {
        Some(r) => Some(Tenant {
            id: r.try_get(0)?,
            name: r.try_get(1)?,
            created_at: r.try_get(2)?,
        }),
        None => None,
    })
}

async fn list_tenants_q(client: &mut Client) -> PgResult<Vec<TenantSummary>> {
    let tx = super::snapshot(client).await?;
    let rows = tx
        .query_typed(
            "SELECT t.id, t.name, t.created_at, t.balance::text,
                    COALESCE((SELECT SUM(l.amount) FROM leases l WHERE l.tenant_id = t.id), 0)::text,
                    (SELECT COUNT(*) FROM api_keys k
                      WHERE k.tenant_id = t.id AND k.revoked_at IS NULL)
               FROM tenants t ORDER BY t.name",
            &[],
        )
        .await?;
    tx.commit().await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(TenantSummary {
            tenant: Tenant {
                id: r.try_get(0)?,
                name: r.try_get(1)?,
                created_at: r.try_get(2)?,
            },
            balance: pen_from_text(&r.try_get::<_, String>(3)?, "tenants.balance")?,
            leased: pen_from_text(&r.try_get::<_, String>(4)?, "leases.amount")?,
            active_keys: i64_to_u64(r.try_get(5)?, "active key count")?,
        });
    }
    Ok(out)
}

/// A tenant and its balance, read in `tx`.
pub(super) async fn tenant_with_balance(
    tx: &Transaction<'_>,
    tenant: TenantId,
) -> PgResult<(Tenant, Pen)> {
    let t = tx
        .query_typed_opt(
            "SELECT id, name, created_at, balance::text FROM tenants WHERE id = $1",
            &[(&tenant, Type::INT8)],
        )
        .await?
        .ok_or_else(|| tenant_missing(tenant))?;
    Ok((
        Tenant {
            id: t.try_get(0)?,
            name: t.try_get(1)?,
            created_at: t.try_get(2)?,
        },
        pen_from_text(&t.try_get::<_, String>(3)?, "tenants.balance")?,
    ))
}

#[async_trait]
impl TenantStore for PgStore {
    async fn create_tenant(&self, name: &str) -> StoreResult<Tenant> {
        with_retry!(self, c => create_tenant_tx(c, name))
    }

    async fn tenant_by_name(&self, name: &str) -> StoreResult<Option<Tenant>> {
        with_retry!(self, c => tenant_by_name_q(c, name))
    }

    async fn list_tenants(&self) -> StoreResult<Vec<TenantSummary>> {
        with_retry!(self, c => list_tenants_q(c))
    }

    async fn create_key(&self, key: NewKey) -> StoreResult<KeyInfo> {
        with_retry!(self, c => keys::create_key_tx(c, &key))
    }

    async fn revoke_key(&self, key_id: &str) -> StoreResult<bool> {
        with_retry!(self, c => keys::revoke_key_tx(c, key_id))
    }

    async fn list_keys(&self, tenant: Option<TenantId>) -> StoreResult<Vec<KeyInfo>> {
        with_retry!(self, c => keys::list_keys_q(c, tenant))
    }

    async fn keys_version(&self) -> StoreResult<i64> {
        with_retry!(self, c => keys::keys_version_q(c))
    }

    async fn active_keys(&self) -> StoreResult<(i64, Vec<ActiveKey>)> {
        with_retry!(self, c => keys::active_keys_q(c))
    }
}
