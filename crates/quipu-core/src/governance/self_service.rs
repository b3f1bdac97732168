//! Tenant self-service: what a key with the `manage` scope may give the keys it creates or
//! limits — never more than it has itself, and never more than the operator allows the tenant.
//!
//! [`within`] holds the rule, for each limit:
//!
//! - **models**: a managing key with a model list gives out only a subset of its models (as
//!   sets of slugs: [`AllowedModels::beyond`]); without a list, any list or none.
//! - **caps**: every cap on the managing key, and the tenant's monthly cap, bounds the new
//!   key's cap: the most the new key could spend within one period of the bounding cap must
//!   not exceed it. A cap of the same period compares amounts; a finer one is multiplied by
//!   how many of its periods one bounding period can touch (a month touches up to 31 days and
//!   6 ISO weeks, a week 7 days and 2 months); a coarser one compares its amount (a day lies
//!   within one week and one month); a `total` cap bounds by its amount, and nothing but a
//!   `total` cap fits under a `total` cap. No cap at all is beyond any cap.
//! - **expiry**: no later than the managing key's; none is beyond one.
//! - **scope**: a manage key cannot grant `manage` (only the operator can).
//!
//! Pure: the caller compiles both model lists against the same catalog, and checks tenancy
//! (a key of another tenant) and top-ups (never allowed) itself.

use super::caps::{Cap, CapOwner};
use super::key_policy::KeyPolicy;
use super::models::AllowedModels;
use super::periods::CapPeriod;
use crate::money::Pen;
use chrono::{DateTime, SecondsFormat};
use std::fmt;

/// The limits one key carries, as far as self-service compares them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyLimits {
    /// `None`: every model.
    pub models: Option<AllowedModels>,
    pub cap: Option<Cap>,
    pub expires_at: Option<i64>,
    pub manage: bool,
}

impl KeyLimits {
    /// The limits of a key's policy.
    pub fn of(key: &KeyPolicy) -> KeyLimits {
        KeyLimits {
            models: key.models.clone(),
            cap: key.cap,
            expires_at: key.expires_at,
            manage: key.scopes.manage,
        }
    }
}

/// Why a manage key may not give a key these limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Asked for the `manage` scope.
    ManageScope,
    /// Asked for every model; the managing key has a list.
    ModelsUnlimited { allowed: Vec<String> },
    /// Asked for models the managing key may not use.
    ModelsBeyond {
        extra: Vec<String>,
        allowed: Vec<String>,
    },
    /// Asked for no cap where `limit` applies.
    CapMissing { limit: Cap, owner: CapOwner },
    /// Asked for a cap that could spend more than `limit` in one of its periods.
    CapBeyond {
        asked: Cap,
        limit: Cap,
        owner: CapOwner,
    },
    /// Asked for no expiry; the managing key expires.
    ExpiryMissing { limit: i64 },
    /// Asked for an expiry after the managing key's.
    ExpiresLater { asked: i64, limit: i64 },
}

/// Whether `asked` stays within the managing key's limits (`operator`, as the operator set
/// them) and the tenant's monthly cap (see the module docs). The first limit crossed is the
/// error, in the order scope, models, caps, expiry.
pub fn within(
    operator: &KeyLimits,
    tenant_monthly_cap: Option<Pen>,
    asked: &KeyLimits,
) -> Result<(), Violation> {
    if asked.manage {
        return Err(Violation::ManageScope);
    }
    if let Some(limit) = &operator.models {
        let allowed = limit.slugs().to_vec();
        let Some(models) = &asked.models else {
            return Err(Violation::ModelsUnlimited { allowed });
        };
        let extra = models.beyond(limit);
        if !extra.is_empty() {
            return Err(Violation::ModelsBeyond { extra, allowed });
        }
    }
    let tenant_cap = tenant_monthly_cap.map(|amount| Cap {
        amount,
        period: CapPeriod::Month,
    });
    let bounds = [
        (operator.cap, CapOwner::Key),
        (tenant_cap, CapOwner::Tenant),
    ];
    for (limit, owner) in bounds {
        let Some(limit) = limit else { continue };
        match asked.cap {
            None => return Err(Violation::CapMissing { limit, owner }),
            Some(cap) if !cap_within(cap, limit) => {
                return Err(Violation::CapBeyond {
                    asked: cap,
                    limit,
                    owner,
                })
            }
            Some(_) => {}
        }
    }
    match (operator.expires_at, asked.expires_at) {
        (Some(limit), None) => Err(Violation::ExpiryMissing { limit }),
        (Some(limit), Some(asked)) if asked > limit => {
            Err(Violation::ExpiresLater { asked, limit })
        }
        _ => Ok(()),
    }
}

/// Whether cap `asked` can never spend more than `limit` within one of `limit`'s periods (both
/// counted in the same zone).
pub fn cap_within(asked: Cap, limit: Cap) -> bool {
    let Some(n) = periods_touched(asked.period, limit.period) else {
        return false;
    };
    asked
        .amount
        .picos()
        .checked_mul(n)
        .is_some_and(|most| most <= limit.amount.picos())
}

/// How many periods of `inner` one period of `outer` can overlap at most; `None` when
/// unbounded (any periodic cap within a `total` one).
fn periods_touched(inner: CapPeriod, outer: CapPeriod) -> Option<i128> {
    use CapPeriod::{Day, Month, Total, Week};
    match (inner, outer) {
        (Total, _) => Some(1),
        (_, Total) => None,
        (Day, Day) | (Week, Week) | (Month, Month) => Some(1),
        // A day lies within one week and one month: a weekly or monthly cap spends at most
        // its amount in it.
        (Week, Day) | (Month, Day) => Some(1),
        (Day, Week) => Some(7),
        // A week can straddle two months.
        (Month, Week) => Some(2),
        (Day, Month) => Some(31),
        // A 31-day month starting on a Sunday touches six ISO weeks.
        (Week, Month) => Some(6),
    }
}

fn utc_text(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
        .unwrap_or_else(|| format!("{ms} ms"))
}

fn cap_text(cap: Cap) -> String {
    format!("{} {}", cap.amount.format_soles(), cap.period.adjective())
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let owner_text = |owner: &CapOwner| match owner {
            CapOwner::Key => "the managing key's cap",
            CapOwner::Tenant => "your account's monthly cap",
        };
        match self {
            Violation::ManageScope => {
                f.write_str("only the operator can give a key the manage scope")
            }
            Violation::ModelsUnlimited { allowed } => write!(
                f,
                "the managing key may use only {}; give the new key a model list within it",
                allowed.join(", ")
            ),
            Violation::ModelsBeyond { extra, allowed } => write!(
                f,
                "the managing key may use only {}; not {}",
                allowed.join(", "),
                extra.join(", ")
            ),
            Violation::CapMissing { limit, owner } => write!(
                f,
                "{} is {}; give the key a budget within it",
                owner_text(owner),
                cap_text(*limit)
            ),
            Violation::CapBeyond {
                asked,
                limit,
                owner,
            } => write!(
                f,
                "a budget of {} could spend more than {} ({})",
                cap_text(*asked),
                owner_text(owner),
                cap_text(*limit)
            ),
            Violation::ExpiryMissing { limit } => write!(
                f,
                "the managing key expires at {}; give the key an expiry no later",
                utc_text(*limit)
            ),
            Violation::ExpiresLater { asked, limit } => write!(
                f,
                "the key would expire at {}, after the managing key ({})",
                utc_text(*asked),
                utc_text(*limit)
            ),
        }
    }
}

impl std::error::Error for Violation {}

#[cfg(test)]
#[path = "self_service_tests.rs"]
mod tests;
