//! `quipu key create|revoke|list` and `/admin/keys`: a tenant's API keys. The secret is
//! generated here (see `crate::keys`), shown once in [`KeyCreated`] and never stored.

use super::tenants::tenant_id;
use super::text::{group_digits, human_time_text, rfc3339, Table};
use super::{OpsError, OpsResult, Render, MAX_LABEL};
use crate::keys;
use crate::store::{KeyInfo, KeyLimits, NewKey, StoreError, TenantStore};
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
}

impl Render for KeyCreated {
    fn text(&self) -> String {
        format!(
            "Created key {} for tenant {}{}.\n\n    {}\n\n\
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

pub async fn create_key(
    store: &(impl TenantStore + ?Sized),
    tenant_name: &str,
    label: &str,
    limits: KeyLimits,
) -> OpsResult<KeyCreated> {
    if label.chars().count() > MAX_LABEL || label.chars().any(char::is_control) {
        return Err(OpsError::Invalid(format!(
            "the label must be at most {MAX_LABEL} characters with no control characters"
        )));
    }
    let tenant = tenant_id(store, tenant_name).await?;
    // A key id is 48 random bits; a clash is astronomically rare but costs only a redraw.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (secret, id, secret_hash, secret_prefix) = keys::generate_key();
        let key = NewKey {
            id,
            tenant,
            label: label.to_owned(),
            secret_hash,
            secret_prefix,
            limits,
        };
        match store.create_key(key).await {
            Ok(info) => {
                return Ok(KeyCreated {
                    key_id: info.id,
                    tenant: info.tenant_name,
                    label: info.label,
                    secret,
                    secret_prefix: info.secret_prefix,
                    created_at: rfc3339(info.created_at),
                    limits: info.limits.into(),
                })
            }
            Err(StoreError::Conflict(_)) if attempts < 3 => continue,
            Err(e) => return Err(e.into()),
        }
    }
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
            ]);
        }
        t.render()
    }
}

fn key_line(k: KeyInfo) -> KeyLine {
    KeyLine {
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

    #[tokio::test]
    async fn create_list_and_revoke() {
        let s = mem().await;
        create_tenant(&*s, "acme").await.unwrap();
        let k = create_key(&*s, "acme", "laptop", KeyLimits::default())
            .await
            .unwrap();
        assert!(k.secret.starts_with("sk-qp-"));
        assert!(k.text().contains(&k.secret));
        assert!(k.text().contains("only time"));
        let (_, active) = s.active_keys().await.unwrap();
        assert_eq!(active[0].secret_hash, keys::hash_secret(&k.secret));

        let e = create_key(&*s, "nobody", "", KeyLimits::default())
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
