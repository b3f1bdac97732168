//! Tenants and API keys on PostgreSQL ([`TenantStore`]). The statements are `sql::tenants`';
//! what is PostgreSQL's own is the transactions (read-only snapshots for lists, row locks for
//! writes, see `ledger`) and the keys-version poll. Every change to keys or tenants bumps
//! `keys_version` in the same transaction (the gateway's key table carries tenant names).
//!
//! **Cheap polls.** `keys_version` is one primary-key lookup with no parameters, sent as a
//! simple query on a pooled connection: one round trip.

use super::{execute, query, query_opt, snapshot, PgErr, PgResult, PgStore};
use crate::money::Pen;
use crate::store::rows::{conflict_if_unique, limits_to_sql, tenant_missing, Taken};
use crate::store::sql::tenants::{self as q, KEYS_VERSION};
use crate::store::sql::SqlValue::{Int, OptInt, OptText, Text};
use crate::store::{
    now_ms, ActiveKey, KeyInfo, KeySettings, NewKey, StoreError, StoreResult, Tenant, TenantId,
    TenantRules, TenantStore, TenantSummary, UnixMs,
};
use async_trait::async_trait;
use tokio_postgres::{Client, GenericClient, SimpleQueryMessage};

/// A tenant and its balance, read in `tx` (the snapshot a statement or an account view reads
/// everything else in).
pub(super) async fn tenant_with_balance(
    tx: &impl GenericClient,
    tenant: TenantId,
) -> PgResult<(Tenant, Pen)> {
    Ok(query_opt(tx, &q::TENANT_WITH_BALANCE, &[Int(tenant)], |c| {
        Ok((q::tenant(c)?, c.pen("tenants.balance")?))
    })
    .await?
    .ok_or_else(|| tenant_missing(tenant))?)
}

async fn create_tenant(client: &mut Client, name: &str) -> PgResult<Tenant> {
    let now = now_ms();
    let tx = client.transaction().await?;
    let id = query_opt(&tx, &q::CREATE_TENANT, &[Text(name), Int(now)], |c| c.int())
        .await
        .map_err(conflict_if_unique(Taken::TenantName(name)))?
        .ok_or_else(|| StoreError::Backend("the new tenant's id was not returned".into()))?;
    execute(&tx, &q::BUMP_KEYS_VERSION, &[]).await?;
    tx.commit().await?;
    Ok(Tenant {
        id,
        name: name.to_owned(),
        created_at: now,
    })
}

async fn list_tenants(client: &mut Client) -> PgResult<Vec<TenantSummary>> {
    let tx = snapshot(client).await?;
    let leased = q::leased(query(&tx, &q::LEASED, &[], q::lease_amount).await?);
    let out = query(&tx, &q::LIST_TENANTS, &[], |c| q::summary(c, &leased)).await?;
    tx.commit().await?;
    Ok(out)
}

/// Inserts `key` in `tx` (the caller bumps the keys version and commits).
async fn insert_key(tx: &impl GenericClient, key: &NewKey) -> PgResult<KeyInfo> {
    let now = now_ms();
    let limits = limits_to_sql(key.limits)?;
    let rules = q::RuleColumns::of(&key.rules);
    let tenant_name = query_opt(tx, &q::TENANT_NAME, &[Int(key.tenant)], |c| c.text())
        .await?
        .ok_or_else(|| tenant_missing(key.tenant))?;
    execute(tx, &q::INSERT_KEY, &q::key_values(key, now, limits, &rules))
        .await
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

async fn create_key(client: &mut Client, key: &NewKey) -> PgResult<KeyInfo> {
    let tx = client.transaction().await?;
    let info = insert_key(&tx, key).await?;
    execute(&tx, &q::BUMP_KEYS_VERSION, &[]).await?;
    tx.commit().await?;
    Ok(info)
}

async fn set_key(client: &mut Client, key_id: &str, settings: &KeySettings) -> PgResult<KeyInfo> {
    let limits = limits_to_sql(settings.limits)?;
    let rules = q::RuleColumns::of(&settings.rules);
    let tx = client.transaction().await?;
    let values = q::set_key_values(key_id, &settings.label, limits, &rules);
    if execute(&tx, &q::SET_KEY, &values).await? == 0 {
        return Err(
            StoreError::NotFound(format!("key {key_id} does not exist or is revoked")).into(),
        );
    }
    execute(&tx, &q::BUMP_KEYS_VERSION, &[]).await?;
    let info = query_opt(&tx, &q::KEY, &[Text(key_id)], q::key_info)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("key {key_id} does not exist")))?;
    tx.commit().await?;
    Ok(info)
}

async fn rotate_key(
    client: &mut Client,
    old_id: &str,
    new: &NewKey,
    old_expires_at: UnixMs,
) -> PgResult<KeyInfo> {
    let tx = client.transaction().await?;
    let rotated = execute(
        &tx,
        &q::ROTATE_KEY,
        &[Text(old_id), Text(&new.id), Int(old_expires_at)],
    )
    .await?;
    if rotated == 0 {
        return Err(
            StoreError::NotFound(format!("key {old_id} does not exist or is revoked")).into(),
        );
    }
    let info = insert_key(&tx, new).await?;
    execute(&tx, &q::BUMP_KEYS_VERSION, &[]).await?;
    tx.commit().await?;
    Ok(info)
}

async fn set_tenant_rules(
    client: &mut Client,
    tenant: TenantId,
    rules: &TenantRules,
) -> PgResult<()> {
    let (weight, cap, zone, low) = q::tenant_rule_texts(rules);
    let tx = client.transaction().await?;
    let values = [
        Int(tenant),
        Int(weight),
        OptText(cap.as_deref()),
        Text(zone),
        OptText(low.as_deref()),
    ];
    if execute(&tx, &q::SET_TENANT_RULES, &values).await? == 0 {
        return Err(tenant_missing(tenant).into());
    }
    execute(&tx, &q::BUMP_KEYS_VERSION, &[]).await?;
    tx.commit().await?;
    Ok(())
}

async fn revoke_key(client: &mut Client, key_id: &str) -> PgResult<bool> {
    let tx = client.transaction().await?;
    let revoked = query_opt(&tx, &q::KEY_REVOKED_AT, &[Text(key_id)], |c| c.opt_int())
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("key {key_id} does not exist")))?;
    if revoked.is_some() {
        return Ok(false);
    }
    execute(&tx, &q::REVOKE_KEY, &[Text(key_id), Int(now_ms())]).await?;
    execute(&tx, &q::BUMP_KEYS_VERSION, &[]).await?;
    tx.commit().await?;
    Ok(true)
}

async fn list_keys(client: &mut Client, tenant: Option<TenantId>) -> PgResult<Vec<KeyInfo>> {
    let tx = snapshot(client).await?;
    if let Some(t) = tenant {
        query_opt(&tx, &q::TENANT_EXISTS, &[Int(t)], |_| Ok(()))
            .await?
            .ok_or_else(|| tenant_missing(t))?;
    }
    let out = query(&tx, &q::LIST_KEYS, &[OptInt(tenant)], q::key_info).await?;
    tx.commit().await?;
    Ok(out)
}

async fn keys_version(client: &impl GenericClient) -> PgResult<i64> {
    for msg in client.simple_query(KEYS_VERSION).await? {
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

async fn active_keys(client: &mut Client) -> PgResult<(i64, Vec<ActiveKey>)> {
    let tx = snapshot(client).await?;
    let version = keys_version(&tx).await?;
    let keys = query(&tx, &q::ACTIVE_KEYS, &[], q::active_key).await?;
    tx.commit().await?;
    Ok((version, keys))
}

#[async_trait]
impl TenantStore for PgStore {
    async fn tenant_rules(&self, tenant: TenantId) -> StoreResult<TenantRules> {
        with_retry!(self, c => async {
            query_opt(&*c, &q::TENANT_RULES, &[Int(tenant)], q::tenant_rules)
                .await?
                .ok_or_else(|| tenant_missing(tenant).into())
        })
    }

    async fn set_tenant_rules(&self, tenant: TenantId, rules: &TenantRules) -> StoreResult<()> {
        with_retry!(self, c => set_tenant_rules(c, tenant, rules))
    }

    async fn key(&self, key_id: &str) -> StoreResult<Option<KeyInfo>> {
        with_retry!(self, c => query_opt(&*c, &q::KEY, &[Text(key_id)], q::key_info))
    }

    async fn set_key(&self, key_id: &str, settings: &KeySettings) -> StoreResult<KeyInfo> {
        with_retry!(self, c => set_key(c, key_id, settings))
    }

    async fn rotate_key(
        &self,
        old_id: &str,
        new: NewKey,
        old_expires_at: UnixMs,
    ) -> StoreResult<KeyInfo> {
        with_retry!(self, c => rotate_key(c, old_id, &new, old_expires_at))
    }

    async fn create_tenant(&self, name: &str) -> StoreResult<Tenant> {
        with_retry!(self, c => create_tenant(c, name))
    }

    async fn tenant_by_name(&self, name: &str) -> StoreResult<Option<Tenant>> {
        with_retry!(self, c => query_opt(&*c, &q::TENANT_BY_NAME, &[Text(name)], q::tenant))
    }

    async fn list_tenants(&self) -> StoreResult<Vec<TenantSummary>> {
        with_retry!(self, c => list_tenants(c))
    }

    async fn create_key(&self, key: NewKey) -> StoreResult<KeyInfo> {
        with_retry!(self, c => create_key(c, &key))
    }

    async fn revoke_key(&self, key_id: &str) -> StoreResult<bool> {
        with_retry!(self, c => revoke_key(c, key_id))
    }

    async fn list_keys(&self, tenant: Option<TenantId>) -> StoreResult<Vec<KeyInfo>> {
        with_retry!(self, c => list_keys(c, tenant))
    }

    async fn keys_version(&self) -> StoreResult<i64> {
        with_retry!(self, c => keys_version(&*c))
    }

    async fn active_keys(&self) -> StoreResult<(i64, Vec<ActiveKey>)> {
        with_retry!(self, c => active_keys(c))
    }
}
