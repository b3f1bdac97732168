//! `quipu key create|revoke|list` and `/admin/keys`: a tenant's API keys. The secret is
//! generated here (see `crate::keys`), shown once in [`KeyCreated`] and never stored.

use super::key_rules::{self, rules_text, KeyChange, RulesView};
use super::tenants::tenant_id;
use super::text::{group_digits, human_time_text, rfc3339, Table};
use super::{OpsError, OpsResult, Render};
use crate::governance::models::Catalog;
use crate::keys;
use crate::store::{
    now_ms, KeyInfo, KeyLimits, KeySettings, NewKey, StoreError, TenantId, TenantStore,
};
use serde::Serialize;

/// Limits as JSON shows them: `null` = the configured default.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct LimitsView {
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
}

impl From<KeyLimits> for LimitsView {
    fn from(l: KeyLimits) -> Self {
        LimitsView {
            requests_per_minute: l.requests_per_minute,
            tokens_per_minute: l.tokens_per_minute,
        }
    }
}

fn limit_text(l: Option<u64>) -> String {
    l.map_or_else(|| "default".to_owned(), group_digits)
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyCreated {
    pub key_id: String,
    pub tenant: String,
    pub label: String,
    /// The secret. Shown once: only its SHA-256 is stored.
    pub secret: String,
    pub secret_prefix: String,
    pub created_at: String,
    pub limits: LimitsView,
    pub rules: RulesView,
    /// Rotation: the key it replaces, and when that one stops working.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaces: Option<Replaced>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Replaced {
    pub key_id: String,
    pub expires_at: String,
}

impl Render for KeyCreated {
    fn text(&self) -> String {
        let rotation = self.replaces.as_ref().map_or(String::new(), |r| {
            format!(
                "It replaces key {}, which keeps working until {}.\n",
                r.key_id, r.expires_at
            )
        });
        format!(
            "Created key {} for tenant {}{}.\n\n    {}\n\n{rotation}\
             This is the only time the secret is shown: store it now. Quipu keeps only its hash;\n\
             a lost secret cannot be recovered (revoke the key and create another).\n",
            self.key_id,
            self.tenant,
            if self.label.is_empty() {
                String::new()
            } else {
                format!(" (label \"{}\")", self.label)
            },
            self.secret
        )
    }
}

/// Creates a key of `tenant_name` with the settings `change` gives (checked against
/// `catalog`'s models); its secret is in the answer, once.
pub async fn create_key(
    store: &(impl TenantStore + ?Sized),
    catalog: &Catalog<'_>,
    tenant_name: &str,
    change: &KeyChange,
) -> OpsResult<KeyCreated> {
    let settings = change.apply(key_rules::fresh(), catalog, now_ms())?;
    let tenant = tenant_id(store, tenant_name).await?;
    insert_key(store, tenant, &settings).await
}

/// Inserts a new key of `tenant` with `settings` (checked already); its secret is in the
/// answer, once.
pub(super) async fn insert_key(
    store: &(impl TenantStore + ?Sized),
    tenant: TenantId,
    settings: &KeySettings,
) -> OpsResult<KeyCreated> {
    // A key id is 48 random bits; a clash is astronomically rare but costs only a redraw.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (key, secret) = new_key(tenant, settings);
        match store.create_key(key).await {
            Ok(info) => return Ok(created(info, secret, None)),
            Err(StoreError::Conflict(_)) if attempts < 3 => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// A fresh id and secret with `settings`; the secret is returned beside the row to insert.
fn new_key(tenant: TenantId, settings: &KeySettings) -> (NewKey, String) {
    let (secret, id, secret_hash, secret_prefix) = keys::generate_key();
    (
        NewKey {
            id,
            tenant,
            label: settings.label.clone(),
            secret_hash,
            secret_prefix,
            limits: settings.limits,
            rules: settings.rules.clone(),
        },
        secret,
    )
}

fn created(info: KeyInfo, secret: String, replaces: Option<Replaced>) -> KeyCreated {
    KeyCreated {
        rules: RulesView::from(&info.rules),
        key_id: info.id,
        tenant: info.tenant_name,
        label: info.label,
        secret,
        secret_prefix: info.secret_prefix,
        created_at: rfc3339(info.created_at),
        limits: info.limits.into(),
        replaces,
    }
}

fn no_such_key(key_id: &str) -> OpsError {
    OpsError::NotFound(format!(
        "no active key with id \"{key_id}\"; key ids look like key_0123456789ab, see quipu key list"
    ))
}

/// An active key (`NotFound` for an unknown or revoked one).
pub async fn active_key(store: &(impl TenantStore + ?Sized), key_id: &str) -> OpsResult<KeyInfo> {
    store
        .key(key_id)
        .await?
        .filter(|k| k.revoked_at.is_none())
        .ok_or_else(|| no_such_key(key_id))
}

/// Changes a key's settings (see [`KeyChange`]).
pub async fn update_key(
    store: &(impl TenantStore + ?Sized),
    catalog: &Catalog<'_>,
    key_id: &str,
    change: &KeyChange,
) -> OpsResult<KeyLine> {
    let current = active_key(store, key_id).await?;
    let settings = change.apply(settings_of(&current), catalog, now_ms())?;
    write_settings(store, key_id, &settings).await
}

/// Writes a key's settings (checked already).
pub(super) async fn write_settings(
    store: &(impl TenantStore + ?Sized),
    key_id: &str,
    settings: &KeySettings,
) -> OpsResult<KeyLine> {
    let info = store.set_key(key_id, settings).await.map_err(|e| match e {
        StoreError::NotFound(_) => no_such_key(key_id),
        other => other.into(),
    })?;
    Ok(key_line(info))
}

/// What a key is set to, as a change starts from.
pub fn settings_of(k: &KeyInfo) -> KeySettings {
    KeySettings {
        label: k.label.clone(),
        limits: k.limits,
        rules: k.rules.clone(),
    }
}

/// The longest grace a rotated key keeps working: 30 days.
pub const MAX_GRACE_MS: i64 = 30 * 86_400_000;

/// Rotates a key: a new secret with the same settings; the old one keeps working for `grace`
/// (at most [`MAX_GRACE_MS`]), then stops.
pub async fn rotate_key(
    store: &(impl TenantStore + ?Sized),
    key_id: &str,
    grace_ms: i64,
) -> OpsResult<KeyCreated> {
    if !(0..=MAX_GRACE_MS).contains(&grace_ms) {
        return Err(OpsError::Invalid(
            "the grace must be between 0 and 30 days".into(),
        ));
    }
    let old = active_key(store, key_id).await?;
    let ends = now_ms().saturating_add(grace_ms);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (key, secret) = new_key(old.tenant_id, &settings_of(&old));
        match store.rotate_key(key_id, key, ends).await {
            Ok(info) => {
                let until = old.rules.expires_at.map_or(ends, |e| e.min(ends));
                let replaced = Replaced {
                    key_id: key_id.to_owned(),
                    expires_at: rfc3339(until),
                };
                return Ok(created(info, secret, Some(replaced)));
            }
            Err(StoreError::Conflict(_)) if attempts < 3 => continue,
            Err(StoreError::NotFound(_)) => return Err(no_such_key(key_id)),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads a grace like `24h`, `90m`, `7d` or `3600s` into milliseconds.
pub fn parse_grace(text: &str) -> OpsResult<i64> {
    let bad = || {
        OpsError::Invalid(format!(
            "a grace is a whole number and a unit (s, m, h, d), like 24h; not \"{text}\""
        ))
    };
    let text = text.trim();
    let split = text.len().checked_sub(1).ok_or_else(bad)?;
    let (n, unit) = text.split_at(split);
    let n: i64 = n.parse().map_err(|_| bad())?;
    let unit_ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(unit_ms).ok_or_else(bad)
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyRevoked {
    pub key_id: String,
    /// `false` if the key had already been revoked (nothing changed).
    pub revoked_now: bool,
}

impl Render for KeyRevoked {
    fn text(&self) -> String {
        if self.revoked_now {
            format!(
                "Revoked key {}. Gateways refuse it within seconds.\n",
                self.key_id
            )
        } else {
            format!(
                "Key {} was already revoked; nothing changed.\n",
                self.key_id
            )
        }
    }
}

pub async fn revoke_key(
    store: &(impl TenantStore + ?Sized),
    key_id: &str,
) -> OpsResult<KeyRevoked> {
    let revoked_now = store.revoke_key(key_id).await.map_err(|e| match e {
        StoreError::NotFound(_) => OpsError::NotFound(format!(
            "no key with id \"{key_id}\"; key ids look like key_0123456789ab, see quipu key list"
        )),
        other => other.into(),
    })?;
    Ok(KeyRevoked {
        key_id: key_id.to_owned(),
        revoked_now,
    })
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyLine {
    pub key_id: String,
    pub tenant: String,
    pub label: String,
    pub secret_prefix: String,
    pub created_at: String,
    /// `null` while the key is active.
    pub revoked_at: Option<String>,
    pub limits: LimitsView,
    pub rules: RulesView,
    /// The key that replaced it (`quipu key rotate`).
    pub rotated_to: Option<String>,
}

impl Render for KeyLine {
    fn text(&self) -> String {
        format!(
            "Key {} of tenant {}{}: {}.\n",
            self.key_id,
            self.tenant,
            if self.label.is_empty() {
                String::new()
            } else {
                format!(" (\"{}\")", self.label)
            },
            rules_text(&self.rules)
        )
    }
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyList {
    pub keys: Vec<KeyLine>,
}

impl Render for KeyList {
    fn text(&self) -> String {
        if self.keys.is_empty() {
            return "No keys. Create one with: quipu key create --tenant NAME\n".into();
        }
        let mut t = Table::new(&[
            ("ID", false),
            ("TENANT", false),
            ("LABEL", false),
            ("PREFIX", false),
            ("CREATED", false),
            ("STATUS", false),
            ("RPM", true),
            ("TPM", true),
            ("RULES", false),
        ]);
        for k in &self.keys {
            t.row(vec![
                k.key_id.clone(),
                k.tenant.clone(),
                k.label.clone(),
                format!("{}…", k.secret_prefix),
                human_time_text(&k.created_at),
                match &k.revoked_at {
                    None => "active".into(),
                    Some(at) => format!("revoked {}", human_time_text(at)),
                },
                limit_text(k.limits.requests_per_minute),
                limit_text(k.limits.tokens_per_minute),
                rules_text(&k.rules),
            ]);
        }
        t.render()
    }
}

pub fn key_line(k: KeyInfo) -> KeyLine {
    KeyLine {
        rules: RulesView::from(&k.rules),
        rotated_to: k.rotated_to,
        key_id: k.id,
        tenant: k.tenant_name,
        label: k.label,
        secret_prefix: k.secret_prefix,
        created_at: rfc3339(k.created_at),
        revoked_at: k.revoked_at.map(rfc3339),
        limits: k.limits.into(),
    }
}

pub async fn list_keys(
    store: &(impl TenantStore + ?Sized),
    tenant_name: Option<&str>,
) -> OpsResult<KeyList> {
    let tenant = match tenant_name {
        Some(name) => Some(tenant_id(store, name).await?),
        None => None,
    };
    let keys = store
        .list_keys(tenant)
        .await?
        .into_iter()
        .map(key_line)
        .collect();
    Ok(KeyList { keys })
}

#[cfg(test)]
mod tests {
    use super::super::create_tenant;
    use super::super::test_util::mem;
    use super::*;

    fn catalog() -> Catalog<'static> {
        Catalog::new(
            vec!["colibri", "aguila", "apu"],
            vec![("claude-opus-*", "apu")],
        )
    }

    #[tokio::test]
    async fn update_and_rotate_keep_and_change_what_they_say() {
        let s = mem().await;
        create_tenant(&*s, "acme").await.unwrap();
        let change: KeyChange = serde_json::from_str(
            r#"{"label": "ci", "models": ["colibri"], "budget": {"amount": "5.00", "period": "day"}}"#,
        )
        .unwrap();
        let k = create_key(&*s, &catalog(), "acme", &change).await.unwrap();
        assert_eq!(k.rules.models, Some(vec!["colibri".to_owned()]));
        let patch: KeyChange =
            serde_json::from_str(r#"{"models": ["colibri", "aguila"], "disabled": true}"#).unwrap();
        let line = update_key(&*s, &catalog(), &k.key_id, &patch)
            .await
            .unwrap();
        assert_eq!(line.label, "ci");
        assert_eq!(line.rules.budget.as_ref().unwrap().amount, "5.00");
        assert!(line.rules.disabled);
        assert_eq!(line.rules.models.as_ref().unwrap().len(), 2);

        let rotated = rotate_key(&*s, &k.key_id, parse_grace("24h").unwrap())
            .await
            .unwrap();
        assert_ne!(rotated.secret, k.secret);
        assert_eq!(rotated.rules, line.rules, "the same settings");
        let old = s.key(&k.key_id).await.unwrap().unwrap();
        assert_eq!(old.rotated_to.as_deref(), Some(rotated.key_id.as_str()));
        let left = old.rules.expires_at.unwrap() - now_ms();
        assert!((86_300_000..=86_400_000).contains(&left), "{left}");
        assert!(rotate_key(&*s, "key_000000000000", 0).await.is_err());
        assert_eq!(parse_grace("90m").unwrap(), 5_400_000);
        assert!(parse_grace("1 fortnight").is_err());
        assert!(rotate_key(&*s, &rotated.key_id, MAX_GRACE_MS + 1)
            .await
            .is_err());
    }

    #[tokio::test]
    async fn create_list_and_revoke() {
        let s = mem().await;
        create_tenant(&*s, "acme").await.unwrap();
        let change = KeyChange {
            label: Some("laptop".into()),
            ..KeyChange::default()
        };
        let k = create_key(&*s, &catalog(), "acme", &change).await.unwrap();
        assert!(k.secret.starts_with("sk-qp-"));
        assert!(k.text().contains(&k.secret));
        assert!(k.text().contains("only time"));
        let (_, active) = s.active_keys().await.unwrap();
        assert_eq!(active[0].secret_hash, keys::hash_secret(&k.secret));

        let e = create_key(&*s, &catalog(), "nobody", &KeyChange::default())
            .await
            .unwrap_err();
        assert_eq!(e.http_status(), 404);
        assert!(e.message().contains("quipu tenant list"), "{e}");

        let listed = list_keys(&*s, Some("acme")).await.unwrap();
        assert_eq!(listed.keys.len(), 1);
        assert!(listed.text().contains("active"));
        assert!(!listed.text().contains(&k.secret));
        assert!(!serde_json::to_string(&listed).unwrap().contains(&k.secret));

        let r = revoke_key(&*s, &k.key_id).await.unwrap();
        assert!(r.revoked_now);
        assert!(!revoke_key(&*s, &k.key_id).await.unwrap().revoked_now);
        assert_eq!(
            revoke_key(&*s, "key_000000000000")
                .await
                .unwrap_err()
                .http_status(),
            404
        );
    }
}
