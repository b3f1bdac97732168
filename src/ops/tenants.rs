//! `quipu tenant create|list|update` and `/admin/tenants`: tenant names, creation, the
//! listing with balances, what governs a tenant (weight, monthly cap, time zone, low-balance
//! alert), and the name → id lookup every other group starts from.

use super::text::{human_time_text, rfc3339, soles_text, Table};
use super::{OpsError, OpsResult, Render, MAX_TENANT_NAME};
use crate::money::{Pen, AMOUNT_DECIMALS};
use crate::store::{StoreError, TenantId, TenantRules, TenantStore, Zone};
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

/// What governs a tenant, to change (absent keeps a field; `null` clears a cap).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantChange {
    /// Its share of a saturated model, 1 to 1000.
    pub weight: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    pub monthly_cap: Option<Option<String>>,
    /// An IANA time zone (`America/Lima`).
    pub time_zone: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub low_balance: Option<Option<String>>,
}

fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    <Option<T> as serde::Deserialize>::deserialize(d).map(Some)
}

/// A tenant's rules as JSON shows them.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TenantRulesView {
    pub tenant: String,
    pub weight: u32,
    /// Exact soles; `null`: no monthly cap.
    pub monthly_cap: Option<String>,
    pub time_zone: &'static str,
    /// Exact soles; `null`: no low-balance alert.
    pub low_balance: Option<String>,
}

impl TenantRulesView {
    pub fn of(tenant: &str, r: &TenantRules) -> TenantRulesView {
        TenantRulesView {
            tenant: tenant.to_owned(),
            weight: r.weight,
            monthly_cap: r.monthly_cap.map(Pen::to_decimal),
            time_zone: r.zone.name(),
            low_balance: r.low_balance.map(Pen::to_decimal),
        }
    }
}

impl Render for TenantRulesView {
    fn text(&self) -> String {
        format!(
            "Tenant {}: weight {}, monthly cap {}, time zone {}, low-balance alert {}.\n",
            self.tenant,
            self.weight,
            self.monthly_cap
                .as_deref()
                .map_or("none".to_owned(), |c| format!("S/ {c}")),
            self.time_zone,
            self.low_balance
                .as_deref()
                .map_or("off".to_owned(), |c| format!("below S/ {c}")),
        )
    }
}

fn amount(field: &str, text: &str) -> OpsResult<Pen> {
    let p = Pen::parse(text, AMOUNT_DECIMALS).map_err(|e| {
        OpsError::Invalid(format!(
            "{field} must be an amount in soles like 100.00: {e}"
        ))
    })?;
    if p <= Pen::ZERO {
        return Err(OpsError::Invalid(format!("{field} must be more than 0")));
    }
    Ok(p)
}

/// Changes what governs the tenant named `name`.
pub async fn update_tenant(
    store: &(impl TenantStore + ?Sized),
    name: &str,
    change: &TenantChange,
) -> OpsResult<TenantRulesView> {
    let tenant = tenant_id(store, name).await?;
    let mut rules = store.tenant_rules(tenant).await?;
    if let Some(w) = change.weight {
        if !(1..=1000).contains(&w) {
            return Err(OpsError::Invalid(format!(
                "weight must be from 1 to 1000, not {w}"
            )));
        }
        rules.weight = w;
    }
    if let Some(cap) = &change.monthly_cap {
        rules.monthly_cap = cap
            .as_deref()
            .map(|c| amount("monthly_cap", c))
            .transpose()?;
    }
    if let Some(zone) = &change.time_zone {
        rules.zone = Zone::parse(zone).map_err(|e| OpsError::Invalid(e.to_string()))?;
    }
    if let Some(low) = &change.low_balance {
        rules.low_balance = low
            .as_deref()
            .map(|c| amount("low_balance", c))
            .transpose()?;
    }
    store.set_tenant_rules(tenant, &rules).await?;
    Ok(TenantRulesView::of(name, &rules))
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
