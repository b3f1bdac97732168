//! Tenants and API keys on SQLite ([`TenantStore`]), with the tenant row's balance as the other
//! files read and write it. The statements are `sql::tenants`'; what is SQLite's own is the
//! transactions (see the backend's docs) and the balance written back as text, computed in
//! Rust. Every change to keys or tenants bumps `keys_version` in the same transaction (the
//! gateway's key table carries tenant names).

use super::{execute, query, query_opt, read_tx, sql_err, write_tx, SqliteStore};
use crate::money::Pen;
use crate::store::rows::{conflict_if_unique, limits_to_sql, tenant_missing, Taken};
use crate::store::sql::tenants::{self as q, KEYS_VERSION};
use crate::store::sql::SqlValue::{Int, OptInt, Text};
use crate::store::sql_money::pen_to_text;
use crate::store::{
    now_ms, ActiveKey, KeyInfo, NewKey, StoreError, StoreResult, Tenant, TenantId, TenantStore,
    TenantSummary,
};
use async_trait::async_trait;
use rusqlite::{params, Connection, Transaction};

/// The tenant's balance, or `NotFound`.
pub(super) fn read_balance(tx: &Transaction<'_>, tenant: TenantId) -> StoreResult<Pen> {
    query_opt(tx, &q::LOCK_BALANCE, &[Int(tenant)], |c| {
        c.pen("tenants.balance")
    })?
    .ok_or_else(|| tenant_missing(tenant))
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

/// A tenant and its balance, read in `tx` (the snapshot a statement or an account view reads
/// everything else in).
pub(super) fn tenant_with_balance(
    tx: &Transaction<'_>,
    tenant: TenantId,
) -> StoreResult<(Tenant, Pen)> {
    query_opt(tx, &q::TENANT_WITH_BALANCE, &[Int(tenant)], |c| {
        Ok((q::tenant(c)?, c.pen("tenants.balance")?))
    })?
    .ok_or_else(|| tenant_missing(tenant))
}

fn create_tenant(conn: &mut Connection, name: &str) -> StoreResult<Tenant> {
    let now = now_ms();
    let tx = write_tx(conn)?;
    let id = query_opt(&tx, &q::CREATE_TENANT, &[Text(name), Int(now)], |c| c.int())
        .map_err(conflict_if_unique(Taken::TenantName(name)))?
        .ok_or_else(|| StoreError::Backend("the new tenant's id was not returned".into()))?;
    execute(&tx, &q::BUMP_KEYS_VERSION, &[])?;
    tx.commit().map_err(sql_err)?;
    Ok(Tenant {
        id,
        name: name.to_owned(),
        created_at: now,
    })
}

fn list_tenants(conn: &mut Connection) -> StoreResult<Vec<TenantSummary>> {
    let tx = read_tx(conn)?;
    let leased = q::leased(query(&tx, &q::LEASED, &[], q::lease_amount)?);
    Ok(query(&tx, &q::LIST_TENANTS, &[], |c| {
        q::summary(c, &leased)
    })?)
}

fn create_key(conn: &mut Connection, key: NewKey) -> StoreResult<KeyInfo> {
    let now = now_ms();
    let limits = limits_to_sql(key.limits)?;
    let tx = write_tx(conn)?;
    let tenant_name = query_opt(&tx, &q::TENANT_NAME, &[Int(key.tenant)], |c| c.text())?
        .ok_or_else(|| tenant_missing(key.tenant))?;
    execute(&tx, &q::INSERT_KEY, &q::key_values(&key, now, limits))
        .map_err(conflict_if_unique(Taken::Key(&key.id)))?;
    execute(&tx, &q::BUMP_KEYS_VERSION, &[])?;
    tx.commit().map_err(sql_err)?;
    Ok(KeyInfo {
        id: key.id,
        tenant_id: key.tenant,
        tenant_name,
        label: key.label,
        secret_prefix: key.secret_prefix,
        created_at: now,
        revoked_at: None,
        limits: key.limits,
    })
}

fn revoke_key(conn: &mut Connection, key_id: &str) -> StoreResult<bool> {
    let tx = write_tx(conn)?;
    let revoked = query_opt(&tx, &q::KEY_REVOKED_AT, &[Text(key_id)], |c| c.opt_int())?
        .ok_or_else(|| StoreError::NotFound(format!("key {key_id} does not exist")))?;
    if revoked.is_some() {
        return Ok(false);
    }
    execute(&tx, &q::REVOKE_KEY, &[Text(key_id), Int(now_ms())])?;
    execute(&tx, &q::BUMP_KEYS_VERSION, &[])?;
    tx.commit().map_err(sql_err)?;
    Ok(true)
}

fn list_keys(conn: &mut Connection, tenant: Option<TenantId>) -> StoreResult<Vec<KeyInfo>> {
    let tx = read_tx(conn)?;
    if let Some(t) = tenant {
        query_opt(&tx, &q::TENANT_EXISTS, &[Int(t)], |_| Ok(()))?
            .ok_or_else(|| tenant_missing(t))?;
    }
    Ok(query(&tx, &q::LIST_KEYS, &[OptInt(tenant)], q::key_info)?)
}

fn keys_version(conn: &Connection) -> StoreResult<i64> {
    conn.prepare_cached(KEYS_VERSION)
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(sql_err)
}

fn active_keys(conn: &mut Connection) -> StoreResult<(i64, Vec<ActiveKey>)> {
    let tx = read_tx(conn)?;
    let version = keys_version(&tx)?;
    Ok((version, query(&tx, &q::ACTIVE_KEYS, &[], q::active_key)?))
}

#[async_trait]
impl TenantStore for SqliteStore {
    async fn create_tenant(&self, name: &str) -> StoreResult<Tenant> {
        let name = name.to_owned();
        self.run(move |conn| create_tenant(conn, &name)).await
    }

    async fn tenant_by_name(&self, name: &str) -> StoreResult<Option<Tenant>> {
        let name = name.to_owned();
        self.run(move |conn| {
            Ok(query_opt(
                conn,
                &q::TENANT_BY_NAME,
                &[Text(&name)],
                q::tenant,
            )?)
        })
        .await
    }

    async fn list_tenants(&self) -> StoreResult<Vec<TenantSummary>> {
        self.run(list_tenants).await
    }

    async fn create_key(&self, key: NewKey) -> StoreResult<KeyInfo> {
        self.run(move |conn| create_key(conn, key)).await
    }

    async fn revoke_key(&self, key_id: &str) -> StoreResult<bool> {
        let key_id = key_id.to_owned();
        self.run(move |conn| revoke_key(conn, &key_id)).await
    }

    async fn list_keys(&self, tenant: Option<TenantId>) -> StoreResult<Vec<KeyInfo>> {
        self.run(move |conn| list_keys(conn, tenant)).await
    }

    async fn keys_version(&self) -> StoreResult<i64> {
        self.run(|conn| keys_version(conn)).await
    }

    async fn active_keys(&self) -> StoreResult<(i64, Vec<ActiveKey>)> {
        self.run(active_keys).await
    }
}
