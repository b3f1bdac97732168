//! What governs a key, as an operator (`quipu key create|update`, `/admin/keys`) or a managing
//! key (`/v1/keys`) writes it: a [`KeyChange`] of optional fields (absent keeps a field, JSON
//! `null` or a `--no-…` flag clears it), checked and applied to a key's settings by
//! [`KeyChange::apply`], and the views ([`RulesView`]) every listing shows.
//!
//! The policy itself (model lists, caps, periods) is the core's `governance`; this only reads
//! the operator's words into it and says what was wrong in them.

use super::text::rfc3339;
use super::{OpsError, OpsResult, MAX_LABEL};
use crate::governance::models::{Catalog, ModelList};
use crate::store::{Cap, KeyLimits, KeyRules, KeySettings, UnixMs};
use serde::{Deserialize, Deserializer, Serialize};

/// A key's settings to change; every field optional (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyChange {
    pub label: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub rpm: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    pub tpm: Option<Option<u64>>,
    /// Models the key may use: slugs, alias names or globs (`["colibri", "claude-*"]`).
    #[serde(default, deserialize_with = "present")]
    pub models: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "present")]
    pub budget: Option<Option<Budget>>,
    /// RFC 3339 (`2026-12-31T00:00:00Z`).
    #[serde(default, deserialize_with = "present")]
    pub expires_at: Option<Option<String>>,
    pub disabled: Option<bool>,
    pub manage: Option<bool>,
    /// `interactive` or `batch`.
    pub priority: Option<String>,
}

/// A spend cap as written: `{"amount": "5.00", "period": "day"}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub amount: String,
    /// `day`, `week`, `month` or `total`.
    pub period: String,
}

/// A field that is present (even as `null`) is `Some`, so `null` can clear it.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

impl KeyChange {
    /// `current` with this change applied, every field checked (`now` for the expiry, which
    /// must be in the future when it is set).
    pub fn apply(
        &self,
        mut current: KeySettings,
        catalog: &Catalog<'_>,
        now: UnixMs,
    ) -> OpsResult<KeySettings> {
        if let Some(label) = &self.label {
            check_label(label)?;
            current.label = label.clone();
        }
        if let Some(rpm) = self.rpm {
            current.limits.requests_per_minute = rpm;
        }
        if let Some(tpm) = self.tpm {
            current.limits.tokens_per_minute = tpm;
        }
        if let Some(models) = &self.models {
            current.rules.models = models
                .as_ref()
                .map(|m| model_list(m, catalog))
                .transpose()?;
        }
        if let Some(budget) = &self.budget {
            current.rules.cap = budget.as_ref().map(budget_cap).transpose()?;
        }
        if let Some(expires) = &self.expires_at {
            current.rules.expires_at = expires
                .as_deref()
                .map(|t| future_time(t, now))
                .transpose()?;
        }
        if let Some(d) = self.disabled {
            current.rules.disabled = d;
        }
        if let Some(m) = self.manage {
            current.rules.manage = m;
        }
        if let Some(p) = &self.priority {
            current.rules.batch = match p.as_str() {
                "batch" => true,
                "interactive" => false,
                other => {
                    return Err(OpsError::Invalid(format!(
                        "priority must be \"interactive\" or \"batch\", not \"{other}\""
                    )))
                }
            };
        }
        Ok(current)
    }
}

/// A new key's settings before any change: no label, the configured limits, no rules.
pub fn fresh() -> KeySettings {
    KeySettings {
        label: String::new(),
        limits: KeyLimits::default(),
        rules: KeyRules::default(),
    }
}

pub fn check_label(label: &str) -> OpsResult<()> {
    if label.chars().count() > MAX_LABEL || label.chars().any(char::is_control) {
        return Err(OpsError::Invalid(format!(
            "the label must be at most {MAX_LABEL} characters with no control characters"
        )));
    }
    Ok(())
}

/// A model list, checked against the configured models and aliases; stored as written.
fn model_list(entries: &[String], catalog: &Catalog<'_>) -> OpsResult<String> {
    let list = ModelList::new(entries).map_err(|e| OpsError::Invalid(e.to_string()))?;
    list.validate(catalog)
        .map_err(|e| OpsError::Invalid(e.to_string()))?;
    Ok(list.to_text())
}

fn budget_cap(b: &Budget) -> OpsResult<Cap> {
    Cap::parse(&b.amount, &b.period).map_err(|e| OpsError::Invalid(format!("budget: {e}")))
}

/// An RFC 3339 time after `now`.
fn future_time(text: &str, now: UnixMs) -> OpsResult<UnixMs> {
    let at = chrono::DateTime::parse_from_rfc3339(text).map_err(|e| {
        OpsError::Invalid(format!(
            "expires_at must be an RFC 3339 time like 2026-12-31T00:00:00Z, not \"{text}\": {e}"
        ))
    })?;
    let ms = at.timestamp_millis();
    if ms <= now {
        return Err(OpsError::Invalid(format!(
            "expires_at {text} is not in the future"
        )));
    }
    Ok(ms)
}

/// A key's rules as JSON shows them.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RulesView {
    /// `null`: every model.
    pub models: Option<Vec<String>>,
    pub budget: Option<BudgetView>,
    pub expires_at: Option<String>,
    pub disabled: bool,
    /// `["manage"]` when it may manage its tenant's keys.
    pub scopes: Vec<&'static str>,
    pub priority: &'static str,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BudgetView {
    /// Exact soles.
    pub amount: String,
    pub period: &'static str,
}

impl From<&KeyRules> for RulesView {
    fn from(r: &KeyRules) -> Self {
        RulesView {
            models: r.models.as_deref().map(|m| {
                m.split(',')
                    .map(|e| e.trim().to_owned())
                    .filter(|e| !e.is_empty())
                    .collect()
            }),
            budget: r.cap.map(|c| BudgetView {
                amount: c.amount.to_decimal(),
                period: c.period.as_str(),
            }),
            expires_at: r.expires_at.map(rfc3339),
            disabled: r.disabled,
            scopes: if r.manage { vec!["manage"] } else { Vec::new() },
            priority: if r.batch { "batch" } else { "interactive" },
        }
    }
}

/// One line of text for a key's rules (`colibri, aguila · S/ 5.00 a day · expires …`).
pub fn rules_text(r: &RulesView) -> String {
    let mut parts = Vec::new();
    if let Some(m) = &r.models {
        parts.push(m.join(", "));
    }
    if let Some(b) = &r.budget {
        parts.push(format!("S/ {} per {}", b.amount, b.period));
    }
    if let Some(e) = &r.expires_at {
        parts.push(format!("expires {e}"));
    }
    if r.disabled {
        parts.push("disabled".into());
    }
    if !r.scopes.is_empty() {
        parts.push(r.scopes.join(" "));
    }
    if r.priority == "batch" {
        parts.push("batch".into());
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" · ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog<'static> {
        Catalog::new(
            vec!["colibri", "aguila", "apu"],
            vec![("claude-opus-*", "apu"), ("claude-haiku-*", "colibri")],
        )
    }

    fn change(json: &str) -> KeyChange {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn absent_keeps_null_clears() {
        let base = KeyChange {
            models: Some(Some(vec!["colibri".into()])),
            budget: Some(Some(Budget {
                amount: "5.00".into(),
                period: "day".into(),
            })),
            ..KeyChange::default()
        }
        .apply(fresh(), &catalog(), 0)
        .unwrap();
        assert_eq!(base.rules.models.as_deref(), Some("colibri"));
        let kept = change(r#"{"label": "ci"}"#)
            .apply(base.clone(), &catalog(), 0)
            .unwrap();
        assert_eq!(kept.rules, base.rules);
        assert_eq!(kept.label, "ci");
        let cleared = change(r#"{"models": null, "budget": null}"#)
            .apply(base, &catalog(), 0)
            .unwrap();
        assert_eq!((cleared.rules.models, cleared.rules.cap), (None, None));
    }

    #[test]
    fn bad_input_is_named() {
        for (json, needle) in [
            (r#"{"models": ["gpt-4"]}"#, "gpt-4"),
            (r#"{"budget": {"amount": "-1", "period": "day"}}"#, "budget"),
            (
                r#"{"budget": {"amount": "5", "period": "fortnight"}}"#,
                "fortnight",
            ),
            (r#"{"expires_at": "tomorrow"}"#, "RFC 3339"),
            (
                r#"{"expires_at": "2020-01-01T00:00:00Z"}"#,
                "not in the future",
            ),
            (r#"{"priority": "urgent"}"#, "urgent"),
        ] {
            let e = change(json)
                .apply(fresh(), &catalog(), 1_700_000_000_000)
                .unwrap_err();
            assert!(e.message().contains(needle), "{json}: {e}");
        }
        assert!(serde_json::from_str::<KeyChange>(r#"{"secret": "x"}"#).is_err());
    }

    #[test]
    fn views_show_what_applies() {
        let s = change(
            r#"{"models": ["colibri", "claude-haiku-*"], "budget": {"amount": "0.05", "period": "day"},
                "manage": true, "priority": "batch"}"#,
        )
        .apply(fresh(), &catalog(), 0)
        .unwrap();
        let v = RulesView::from(&s.rules);
        assert_eq!(
            v.models,
            Some(vec!["colibri".to_owned(), "claude-haiku-*".to_owned()])
        );
        assert_eq!(v.budget.as_ref().unwrap().amount, "0.05");
        assert_eq!((v.scopes.clone(), v.priority), (vec!["manage"], "batch"));
        assert!(rules_text(&v).contains("S/ 0.05 per day"));
    }
}
