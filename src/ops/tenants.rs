//! `quipu tenant create|list` and `POST|GET /admin/tenants`: tenant names, creation, the
//! listing with balances, and the name → id lookup every other group starts from.

use super::text::{human_time_text, rfc3339, soles_text, Table};
use super::{OpsError, OpsResult, Render, MAX_TENANT_NAME};
use crate::store::{StoreError, TenantId, TenantStore};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TenantCreated {
    pub id: TenantId,
    pub name: String,
    pub created_at: String,
}

impl Render for TenantCreated {
    fn text(&self) -> String {
        format!(
            "Created tenant {} (id {}). Next: quipu key create --tenant {} and quipu topup --tenant {} --amount …\n",
            self.name, self.id, self.name, self.name
        )
    }
}

/// Checks a tenant name: 1–64 characters of `a-z`, `0-9`, `-`, `_`, `.`, starting with a
/// letter or digit.
pub fn validate_tenant_name(name: &str) -> OpsResult<()> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c);
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.is_empty() || name.len() > MAX_TENANT_NAME || !first_ok || !name.chars().all(ok_char) {
        return Err(OpsError::Invalid(format!(
            "\"{name}\" is not a valid tenant name: use 1 to {MAX_TENANT_NAME} lowercase letters, \
             digits, '-', '_' or '.', starting with a letter or digit (e.g. acme-peru)"
        )));
    }
    Ok(())
}

pub async fn create_tenant(
    store: &(impl TenantStore + ?Sized),
    name: &str,
) -> OpsResult<TenantCreated> {
    validate_tenant_name(name)?;
    let t = store.create_tenant(name).await.map_err(|e| match e {
        StoreError::Conflict(_) => OpsError::Conflict(format!(
            "a tenant named \"{name}\" already exists; pick another name or use the existing one"
        )),
        other => other.into(),
    })?;
    Ok(TenantCreated {
        id: t.id,
        name: t.name,
        created_at: rfc3339(t.created_at),
    })
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TenantLine {
    pub id: TenantId,
    pub name: String,
    pub created_at: String,
    /// Exact soles.
    pub balance: String,
    /// Part of the balance leased to running replicas (exact soles).
    pub leased: String,
    pub active_keys: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TenantList {
    pub tenants: Vec<TenantLine>,
}

impl Render for TenantList {
    fn text(&self) -> String {
        if self.tenants.is_empty() {
            return "No tenants yet. Create one with: quipu tenant create NAME\n".into();
        }
        let mut t = Table::new(&[
            ("NAME", false),
            ("ID", true),
            ("BALANCE", true),
            ("LEASED", true),
            ("KEYS", true),
            ("CREATED", false),
        ]);
        for l in &self.tenants {
            t.row(vec![
                l.name.clone(),
                l.id.to_string(),
                soles_text(&l.balance),
                soles_text(&l.leased),
                l.active_keys.to_string(),
                human_time_text(&l.created_at),
            ]);
        }
        t.render()
    }
}

pub async fn list_tenants(store: &(impl TenantStore + ?Sized)) -> OpsResult<TenantList> {
    let tenants = store
        .list_tenants()
        .await?
        .into_iter()
        .map(|s| TenantLine {
            id: s.tenant.id,
            name: s.tenant.name,
            created_at: rfc3339(s.tenant.created_at),
            balance: s.balance.to_decimal(),
            leased: s.leased.to_decimal(),
            active_keys: s.active_keys,
        })
        .collect();
    Ok(TenantList { tenants })
}

/// The id of the tenant named `name`, or the error that tells the operator how to find it.
pub(super) async fn tenant_id(
    store: &(impl TenantStore + ?Sized),
    name: &str,
) -> OpsResult<TenantId> {
    match store.tenant_by_name(name).await? {
        Some(t) => Ok(t.id),
        None => Err(OpsError::NotFound(format!(
            "no tenant named \"{name}\"; see the names with quipu tenant list, or create it with quipu tenant create {name}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{mem, min};
    use super::super::top_up;
    use super::*;

    #[test]
    fn tenant_names() {
        for ok in ["acme", "acme-peru", "a", "t1.prod_x"] {
            validate_tenant_name(ok).unwrap();
        }
        for bad in ["", "Acme", "-acme", "a b", "ñandú", &"x".repeat(65)] {
            let e = validate_tenant_name(bad).unwrap_err();
            assert!(e.message().contains("lowercase letters"), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn create_refuses_a_taken_name_and_the_list_shows_balances() {
        let s = mem().await;
        let t = create_tenant(&*s, "acme").await.unwrap();
        assert_eq!(t.name, "acme");
        let e = create_tenant(&*s, "acme").await.unwrap_err();
        assert_eq!(e.http_status(), 409);
        assert!(e.message().contains("already exists"));

        top_up(&*s, "acme", "1234.56", "", min(), None)
            .await
            .unwrap();
        let list = list_tenants(&*s).await.unwrap();
        assert_eq!(list.tenants[0].balance, "1234.56");
        assert_eq!(list.tenants[0].active_keys, 0);
        assert!(list.text().contains("S/ 1,234.56"));
    }
}
