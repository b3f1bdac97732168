//! Tenants and API keys on SQLite ([`TenantStore`]), with the tenant row's balance as the other
//! files read and write it. The statements are `sql::tenants`'; what is SQLite's own is the
//! transactions (see the backend's docs) and the balance written back as text, computed in
//! Rust. Every change to keys or tenants bumps `keys_version` in the same transaction (the
//! gateway's key table carries tenant names).

use super::{execute, query, query_opt, read_tx, sql_err, write_tx, SqliteStore};
use crate::money::Pen;
use crate::store::rows::{conflict_if_unique, limits_to_sql, tenant_missing, Taken};
use crate::store::sql::tenants::{self as q, KEYS_VERSION};
use crate::store::sql::SqlValue::{Int, OptInt, OptText, Text};
use crate::store::sql_money::pen_to_text;
use crate::store::{
    now_ms, ActiveKey, KeyInfo, KeySettings, NewKey, StoreError, StoreResult, Tenant, TenantId,
    TenantRules, TenantStore, TenantSummary, UnixMs,
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

/// Inserts `key` in `tx` (the caller bumps the keys version and commits).
fn insert_key(tx: &Transaction<'_>, key: &NewKey) -> StoreResult<KeyInfo> {
    let now = now_ms();
    let limits = limits_to_sql(key.limits)?;
    let rules = q::RuleColumns::of(&key.rules);
    let tenant_name = query_opt(tx, &q::TENANT_NAME, &[Int(key.tenant)], |c| c.text())?
        .ok_or_else(|| tenant_missing(key.tenant))?;
    execute(tx, &q::INSERT_KEY, &q::key_values(key, now, limits, &rules))
        .map_err(conflict_if_unique(Taken::Key(&key.id)))?;
    Ok(KeyInfo {
        id: key.id.clone(),
        tenant_id: key.tenant,
        tenant_name,
        label: key.label.clone(),
        secret_prefix: key.secret_prefix.clone(),
        created_at: now,
        revoked_at: None,
        limits: key.limits,
        rules: key.rules.clone(),
        rotated_to: None,
    })
}

fn create_key(conn: &mut Connection, key: NewKey) -> StoreResult<KeyInfo> {
    let tx = write_tx(conn)?;
    let info = insert_key(&tx, &key)?;
    execute(&tx, &q::BUMP_KEYS_VERSION, &[])?;
    tx.commit().map_err(sql_err)?;
    Ok(info)
}

fn one_key(conn: &Connection, key_id: &str) -> StoreResult<Option<KeyInfo>> {
    Ok(query_opt(conn, &q::KEY, &[Text(key_id)], q::key_info)?)
}

fn set_key(conn: &mut Connection, key_id: &str, settings: &KeySettings) -> StoreResult<KeyInfo> {
    let limits = limits_to_sql(settings.limits)?;
    let rules = q::RuleColumns::of(&settings.rules);
    let tx = write_tx(conn)?;
    let n = execute(
        &tx,
        &q::SET_KEY,
        &q::set_key_values(key_id, &settings.label, limits, &rules),
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!(
            "key {key_id} does not exist or is revoked"
        )));
    }
    execute(&tx, &q::BUMP_KEYS_VERSION, &[])?;
    let info = one_key(&tx, key_id)?
        .ok_or_else(|| StoreError::NotFound(format!("key {key_id} does not exist")))?;
    tx.commit().map_err(sql_err)?;
    Ok(info)
}

fn rotate_key(
    conn: &mut Connection,
    old_id: &str,
    new: NewKey,
    old_expires_at: UnixMs,
) -> StoreResult<KeyInfo> {
    let tx = write_tx(conn)?;
    let n = execute(
        &tx,
        &q::ROTATE_KEY,
        &[Text(old_id), Text(&new.id), Int(old_expires_at)],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound(format!(
            "key {old_id} does not exist or is revoked"
        )));
    }
    let info = insert_key(&tx, &new)?;
    execute(&tx, &q::BUMP_KEYS_VERSION, &[])?;
    tx.commit().map_err(sql_err)?;
    Ok(info)
}

fn tenant_rules(conn: &Connection, tenant: TenantId) -> StoreResult<TenantRules> {
    query_opt(conn, &q::TENANT_RULES, &[Int(tenant)], q::tenant_rules)?
        .ok_or_else(|| tenant_missing(tenant))
}

fn set_tenant_rules(
    conn: &mut Connection,
    tenant: TenantId,
    rules: &TenantRules,
) -> StoreResult<()> {
    let (weight, cap, zone, low) = q::tenant_rule_texts(rules);
    let tx = write_tx(conn)?;
    let n = execute(
        &tx,
        &q::SET_TENANT_RULES,
        &[
            Int(tenant),
            Int(weight),
            OptText(cap.as_deref()),
            Text(zone),
            OptText(low.as_deref()),
        ],
    )?;
    if n == 0 {
        return Err(tenant_missing(tenant));
    }
    execute(&tx, &q::BUMP_KEYS_VERSION, &[])?;
    tx.commit().map_err(sql_err)
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

    async fn tenant_rules(&self, tenant: TenantId) -> StoreResult<TenantRules> {
        self.run(move |conn| tenant_rules(conn, tenant)).await
    }

    async fn set_tenant_rules(&self, tenant: TenantId, rules: &TenantRules) -> StoreResult<()> {
        let rules = rules.clone();
        self.run(move |conn| set_tenant_rules(conn, tenant, &rules))
            .await
    }

    async fn key(&self, key_id: &str) -> StoreResult<Option<KeyInfo>> {
        let key_id = key_id.to_owned();
        self.run(move |conn| one_key(conn, &key_id)).await
    }

    async fn set_key(&self, key_id: &str, settings: &KeySettings) -> StoreResult<KeyInfo> {
        let (key_id, settings) = (key_id.to_owned(), settings.clone());
        self.run(move |conn| set_key(conn, &key_id, &settings))
            .await
    }

    async fn rotate_key(
        &self,
        old_id: &str,
        new: NewKey,
        old_expires_at: UnixMs,
    ) -> StoreResult<KeyInfo> {
        let old_id = old_id.to_owned();
        self.run(move |conn| rotate_key(conn, &old_id, new, old_expires_at))
            .await
    }
}
