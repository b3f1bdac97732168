//! Tenants on PostgreSQL: creating one, finding one by name, and the list with each tenant's
//! balance, leased amount and active keys. A new tenant bumps `keys_version` (see `keys`):
//! the gateway's key table carries tenant names.

use super::keys::bump_keys_version;
use super::PgResult;
use crate::money::Pen;
use crate::store::rows::{conflict_if_unique, tenant_missing, Taken};
use crate::store::sql_money::{i64_to_u64, pen_from_text};
use crate::store::{now_ms, Tenant, TenantId, TenantSummary};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

pub(super) async fn create_tenant_tx(client: &mut Client, name: &str) -> PgResult<Tenant> {
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

pub(super) async fn tenant_by_name_q(client: &mut Client, name: &str) -> PgResult<Option<Tenant>> {
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

pub(super) async fn list_tenants_q(client: &mut Client) -> PgResult<Vec<TenantSummary>> {
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
