//! Tenants and keys on SQLite ([`TenantStore`]): creating a tenant, finding one by name, and
//! the list with each tenant's balance, leased amount and active keys; the tenant row's
//! balance as the other files read and write it; API keys are in `keys`. A new tenant bumps
//! `keys_version` (see `keys`): the gateway's key table carries tenant names.

use super::keys::{self, bump_keys_version};
use super::{read_tx, sql_err, write_tx, SqliteStore};
use crate::money::Pen;
use crate::store::rows::{conflict_if_unique, tenant_missing, Taken};
use crate::store::sql_money::{i64_to_u64, pen_from_text, pen_to_text};
use crate::store::{
    now_ms, ActiveKey, KeyInfo, NewKey, StoreResult, Tenant, TenantId, TenantStore, TenantSummary,
};
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use std::collections::HashMap;

/// The tenant's balance, or `NotFound`.
pub(super) fn read_balance(tx: &Transaction<'_>, tenant: TenantId) -> StoreResult<Pen> {
    let text: Option<String> = tx
        .prepare_cached("SELECT balance FROM tenants WHERE id = ?1")
        .and_then(|mut s| s.query_row(params![tenant], |r| r.get(0)).optional())
        .map_err(sql_err)?;
    match text {
        Some(t) => pen_from_text(&t, "tenants.balance"),
        None => Err(tenant_missing(tenant)),
    }
}

pub(super) fn write_balance(
    tx: &Transaction<'_>,
    tenant: TenantId,
    balance: Pen,
) -> StoreResult<()> {
    tx.prepare_cached("UPDATE tenants SET balance = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![tenant, pen_to_text(balance)]))
        .map_err(sql_err)?;
    Ok(())
}

fn create_tenant(conn: &mut Connection, name: String) -> StoreResult<Tenant> {
    let now = now_ms();
    let tx = write_tx(conn)?;
    tx.execute(
        "INSERT INTO tenants (name, created_at, balance) VALUES (?1, ?2, '0')",
        params![name, now],
    )
    .map_err(conflict_if_unique(Taken::TenantName(&name)))?;
    let id = tx.last_insert_rowid();
    bump_keys_version(&tx)?;
    tx.commit().map_err(sql_err)?;
    Ok(Tenant {
        id,
        name,
        created_at: now,
    })
}

fn tenant_by_name(conn: &mut Connection, name: String) -> StoreResult<Option<Tenant>> {
    conn.query_row(
        "SELECT id, name, created_at FROM tenants WHERE name = ?1",
        params![name],
        |r| {
            Ok(Tenant {
                id: r.get(0)?,
                name: r.get(1)?,
                created_at: r.get(2)?,
            })
        },
    )
    .optional()
    .map_err(sql_err)
}

fn list_tenants(conn: &mut Connection) -> StoreResult<Vec<TenantSummary>> {
    let tx = read_tx(conn)?;
    let mut leased: HashMap<TenantId, Pen> = HashMap::new();
    {
        let mut stmt = tx
            .prepare("SELECT tenant_id, amount FROM leases")
            .map_err(sql_err)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
            .map_err(sql_err)?;
        for row in rows {
            let (tenant, amount) = row.map_err(sql_err)?;
            *leased.entry(tenant).or_default() += pen_from_text(&amount, "leases.amount")?;
        }
    }
    let mut stmt = tx
        .prepare(
            "SELECT t.id, t.name, t.created_at, t.balance,
                            (SELECT COUNT(*) FROM api_keys k
                              WHERE k.tenant_id = t.id AND k.revoked_at IS NULL)
                       FROM tenants t ORDER BY t.name",
        )
        .map_err(sql_err)?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                Tenant {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    created_at: r.get(2)?,
                },
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })
        .map_err(sql_err)?;
    let mut out = Vec::new();
    for row in rows {
        let (tenant, balance, keys) = row.map_err(sql_err)?;
        out.push(TenantSummary {
            balance: pen_from_text(&balance, "tenants.balance")?,
            leased: leased.get(&tenant.id).copied().unwrap_or_default(),
            active_keys: i64_to_u64(keys, "active key count")?,
            tenant,
        });
    }
    Ok(out)
}

/// A tenant and its balance, read in `tx` (the snapshot a statement or an account view reads
/// everything else in).
pub(super) fn tenant_with_balance(
    tx: &Transaction<'_>,
    tenant: TenantId,
) -> StoreResult<(Tenant, Pen)> {
    let (t, balance): (Tenant, String) = tx
        .query_row(
            "SELECT id, name, created_at, balance FROM tenants WHERE id = ?1",
            params![tenant],
            |r| {
                Ok((
                    Tenant {
                        id: r.get(0)?,
                        name: r.get(1)?,
                        created_at: r.get(2)?,
                    },
                    r.get(3)?,
                ))
            },
        )
        .optional()
        .map_err(sql_err)?
        .ok_or_else(|| tenant_missing(tenant))?;
    Ok((t, pen_from_text(&balance, "tenants.balance")?))
}

#[async_trait]
impl TenantStore for SqliteStore {
    async fn create_tenant(&self, name: &str) -> StoreResult<Tenant> {
        let name = name.to_owned();
        self.run(move |conn| create_tenant(conn, name)).await
    }

    async fn tenant_by_name(&self, name: &str) -> StoreResult<Option<Tenant>> {
        let name = name.to_owned();
        self.run(move |conn| tenant_by_name(conn, name)).await
    }

    async fn list_tenants(&self) -> StoreResult<Vec<TenantSummary>> {
        self.run(list_tenants).await
    }

    async fn create_key(&self, key: NewKey) -> StoreResult<KeyInfo> {
        self.run(move |conn| keys::create_key(conn, key)).await
    }

    async fn revoke_key(&self, key_id: &str) -> StoreResult<bool> {
        let key_id = key_id.to_owned();
        self.run(move |conn| keys::revoke_key(conn, key_id)).await
    }

    async fn list_keys(&self, tenant: Option<TenantId>) -> StoreResult<Vec<KeyInfo>> {
        self.run(move |conn| keys::list_keys(conn, tenant)).await
    }

    async fn keys_version(&self) -> StoreResult<i64> {
        self.run(keys::keys_version).await
    }

    async fn active_keys(&self) -> StoreResult<(i64, Vec<ActiveKey>)> {
        self.run(keys::active_keys).await
    }
}
