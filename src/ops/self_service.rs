//! Tenant self-service on `/v1/keys`: a key with the `manage` scope creates, limits, rotates
//! and revokes the keys of its own tenant, with the same settings and checks as the operator
//! ([`KeyChange`], `ops::keys`), and three more rules:
//!
//! - only a key whose stored rules have `manage` may write ([`OpsError::Forbidden`]);
//! - a key of another tenant, an unknown or a revoked one is [`OpsError::NotFound`], the same
//!   answer for each, so nothing says another tenant's key exists;
//! - a key with the `manage` scope (the managing key itself included) is the operator's: a
//!   managing key may neither change, rotate nor revoke one, so a tenant cannot lock itself
//!   out of self-service;
//! - whatever a key is left with must be within the managing key's own limits and the
//!   tenant's monthly cap (the core's [`within`]): its models, cap and expiry, and never the
//!   `manage` scope. Checked on the key as it will be, so a key the operator made beyond them
//!   cannot be changed or rotated (only revoked) by a managing key.
//!
//! The managing key's limits and the tenant's cap are read from the store, not the gateway's
//! key snapshot: a limit the operator just tightened applies at once. Top-ups are never
//! self-service (`POST /v1/topups` has no route).

use super::key_rules::{self, KeyChange};
use super::keys::{
    insert_key, rotate_key, settings_of, write_settings, KeyCreated, KeyLine, KeyRevoked,
};
use super::{OpsError, OpsResult};
use crate::governance::models::{Catalog, ModelList};
use crate::governance::self_service::{within, KeyLimits};
use crate::money::Pen;
use crate::store::{now_ms, KeyInfo, KeySettings, StoreError, TenantId, TenantStore};

/// The key that asks, and its tenant (as authenticated).
#[derive(Debug, Clone, Copy)]
pub struct Manager<'a> {
    pub key_id: &'a str,
    pub tenant: TenantId,
}

/// What bounds the keys a managing key gives out.
struct Bounds {
    own: KeyLimits,
    tenant_cap: Option<Pen>,
}

fn no_such_key(key_id: &str) -> OpsError {
    OpsError::NotFound(format!(
        "no active key with id \"{key_id}\" in your account"
    ))
}

/// The managing key's limits, read fresh; `Forbidden` if it may not manage.
async fn bounds(
    store: &(impl TenantStore + ?Sized),
    catalog: &Catalog<'_>,
    manager: Manager<'_>,
) -> OpsResult<Bounds> {
    let key = store
        .key(manager.key_id)
        .await?
        .filter(|k| k.revoked_at.is_none() && k.tenant_id == manager.tenant);
    let Some(key) = key.filter(|k| k.rules.manage) else {
        return Err(OpsError::Forbidden(
            "this key may not manage keys: only a key with the manage scope may create, \
             change, rotate or revoke keys (the operator gives it)"
                .into(),
        ));
    };
    let tenant_cap = store.tenant_rules(manager.tenant).await?.monthly_cap;
    Ok(Bounds {
        own: limits_of(&settings_of(&key), catalog)?,
        tenant_cap,
    })
}

/// The self-service limits of `settings`, its model list compiled against `catalog`.
fn limits_of(settings: &KeySettings, catalog: &Catalog<'_>) -> OpsResult<KeyLimits> {
    let models = settings
        .rules
        .models
        .as_deref()
        .map(|text| {
            ModelList::parse(text)
                .map(|l| l.compile(catalog))
                .map_err(|e| OpsError::Invalid(e.to_string()))
        })
        .transpose()?;
    Ok(KeyLimits {
        models,
        cap: settings.rules.cap,
        expires_at: settings.rules.expires_at,
        manage: settings.rules.manage,
    })
}

/// Refuses `settings` unless within `bounds`, naming what is beyond.
fn check(settings: &KeySettings, bounds: &Bounds, catalog: &Catalog<'_>) -> OpsResult<()> {
    let asked = limits_of(settings, catalog)?;
    within(&bounds.own, bounds.tenant_cap, &asked).map_err(|v| OpsError::Forbidden(v.to_string()))
}

/// A key of the manager's tenant that a managing key may touch: active, not another tenant's
/// (`NotFound`), without the `manage` scope (`Forbidden`).
async fn target(
    store: &(impl TenantStore + ?Sized),
    manager: Manager<'_>,
    key_id: &str,
) -> OpsResult<KeyInfo> {
    let key = store
        .key(key_id)
        .await?
        .filter(|k| k.tenant_id == manager.tenant && k.revoked_at.is_none())
        .ok_or_else(|| no_such_key(key_id))?;
    if key.rules.manage {
        let whose = if key.id == manager.key_id {
            "this key has"
        } else {
            "that key has"
        };
        return Err(OpsError::Forbidden(format!(
            "{whose} the manage scope: only the operator can change, rotate or revoke it"
        )));
    }
    Ok(key)
}

/// `POST /v1/keys`: a new key of the manager's tenant.
pub async fn create(
    store: &(impl TenantStore + ?Sized),
    catalog: &Catalog<'_>,
    manager: Manager<'_>,
    change: &KeyChange,
) -> OpsResult<KeyCreated> {
    let bounds = bounds(store, catalog, manager).await?;
    let settings = change.apply(key_rules::fresh(), catalog, now_ms())?;
    check(&settings, &bounds, catalog)?;
    insert_key(store, manager.tenant, &settings).await
}

/// `PATCH /v1/keys/{id}`: changes a key of the manager's tenant.
pub async fn update(
    store: &(impl TenantStore + ?Sized),
    catalog: &Catalog<'_>,
    manager: Manager<'_>,
    key_id: &str,
    change: &KeyChange,
) -> OpsResult<KeyLine> {
    let bounds = bounds(store, catalog, manager).await?;
    let current = target(store, manager, key_id).await?;
    let settings = change.apply(settings_of(&current), catalog, now_ms())?;
    check(&settings, &bounds, catalog)?;
    write_settings(store, key_id, &settings)
        .await
        .map_err(|e| match e {
            OpsError::NotFound(_) => no_such_key(key_id),
            other => other,
        })
}

/// `POST /v1/keys/{id}/rotate`: a new secret with the same settings (which must be within).
pub async fn rotate(
    store: &(impl TenantStore + ?Sized),
    catalog: &Catalog<'_>,
    manager: Manager<'_>,
    key_id: &str,
    grace_ms: i64,
) -> OpsResult<KeyCreated> {
    let bounds = bounds(store, catalog, manager).await?;
    let current = target(store, manager, key_id).await?;
    check(&settings_of(&current), &bounds, catalog)?;
    rotate_key(store, key_id, grace_ms)
        .await
        .map_err(|e| match e {
            OpsError::NotFound(_) => no_such_key(key_id),
            other => other,
        })
}

/// `DELETE /v1/keys/{id}`: revokes a key of the manager's tenant.
pub async fn revoke(
    store: &(impl TenantStore + ?Sized),
    catalog: &Catalog<'_>,
    manager: Manager<'_>,
    key_id: &str,
) -> OpsResult<KeyRevoked> {
    bounds(store, catalog, manager).await?;
    target(store, manager, key_id).await?;
    let revoked_now = store.revoke_key(key_id).await.map_err(|e| match e {
        StoreError::NotFound(_) => no_such_key(key_id),
        other => other.into(),
    })?;
    Ok(KeyRevoked {
        key_id: key_id.to_owned(),
        revoked_now,
    })
}

#[cfg(test)]
#[path = "self_service_tests.rs"]
mod tests;
