//! A key's admission checks, pure: is the key usable (not disabled, not expired), may it use
//! the model asked for, and does the request's worst case fit every spend cap that applies
//! (the key's own, the tenant's monthly). Each refusal is typed ([`Refusal`]) with the HTTP
//! answer it stands for ([`RefusalKind`]) and a message for the client.
//!
//! | refusal | status | meaning |
//! |---|---|---|
//! | disabled, expired | 401 | `authentication_error` |
//! | model not allowed | 403 | `permission_error` / `model_not_allowed` |
//! | a periodic cap does not fit | 429 | `retry-after` until the period ends (`budget_exceeded`) |
//! | a `total` cap does not fit | 402 | no wait helps |
//!
//! The order is: usable, then model, then caps. The caller computes the caps in force
//! ([`active_caps`]), reads what each period holds where it keeps the balance, and passes the
//! loads to [`admit`] inside the reservation.

use super::caps::{ActiveCap, Cap, CapLoad, CapOwner, CapRefusal};
use super::models::{AllowedModels, ModelNotAllowed};
use super::periods::{CapPeriod, PeriodError, Zone};
use crate::money::Pen;
use crate::schedule::Priority;
use std::fmt;
use std::num::NonZeroU32;

/// What a key may do beyond its tenant's rights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scopes {
    /// List, create, limit, rotate and revoke the tenant's keys (`/v1/keys`).
    pub manage: bool,
}

/// A key's limits. The default is today's flat key: any model, no cap, no expiry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPolicy {
    /// `None`: every model.
    pub models: Option<AllowedModels>,
    pub cap: Option<Cap>,
    /// The instant (UTC ms) from which the key no longer works.
    pub expires_at: Option<i64>,
    pub disabled: bool,
    pub scopes: Scopes,
    pub priority: Priority,
}

impl Default for KeyPolicy {
    fn default() -> KeyPolicy {
        KeyPolicy {
            models: None,
            cap: None,
            expires_at: None,
            disabled: false,
            scopes: Scopes::default(),
            priority: Priority::Interactive,
        }
    }
}

/// A tenant's limits: its monthly cap, its share weight in the scheduler, and the zone its
/// days and months are counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantPolicy {
    pub monthly_cap: Option<Pen>,
    pub weight: NonZeroU32,
    pub zone: Zone,
}

impl Default for TenantPolicy {
    fn default() -> TenantPolicy {
        TenantPolicy {
            monthly_cap: None,
            weight: NonZeroU32::MIN,
            zone: Zone::LIMA,
        }
    }
}

impl TenantPolicy {
    /// The monthly cap as a [`Cap`].
    pub fn cap(&self) -> Option<Cap> {
        self.monthly_cap.map(|amount| Cap {
            amount,
            period: CapPeriod::Month,
        })
    }
}

/// What a request asks for: the model name it sent, the slug that resolved to, and the most
/// it may cost (the reservation).
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub requested: &'a str,
    pub slug: &'a str,
    pub worst: Pen,
}

/// The caps that apply to a request of this key at `now_ms` (the key's, then the
/// tenant's), each with its current period in the tenant's zone; empty when neither has one.
pub fn active_caps(
    key: &KeyPolicy,
    tenant: &TenantPolicy,
    now_ms: i64,
) -> Result<Vec<ActiveCap>, PeriodError> {
    let mut out = Vec::new();
    if let Some(cap) = key.cap {
        out.push(ActiveCap::current(CapOwner::Key, cap, tenant.zone, now_ms)?);
    }
    if let Some(cap) = tenant.cap() {
        out.push(ActiveCap::current(
            CapOwner::Tenant,
            cap,
            tenant.zone,
            now_ms,
        )?);
    }
    Ok(out)
}

/// Whether the key works at all at `now_ms`: not disabled, not expired (a key works while
/// `now < expires_at`).
pub fn check_usable(key: &KeyPolicy, zone: Zone, now_ms: i64) -> Result<(), Refusal> {
    if key.disabled {
        return Err(Refusal::Disabled);
    }
    match key.expires_at {
        Some(at_ms) if at_ms <= now_ms => Err(Refusal::Expired { at_ms, zone }),
        _ => Ok(()),
    }
}

/// Whether the key may use the model asked for.
pub fn check_model(key: &KeyPolicy, requested: &str, slug: &str) -> Result<(), Refusal> {
    match &key.models {
        Some(allowed) => allowed
            .check(requested, slug)
            .map_err(Refusal::ModelNotAllowed),
        None => Ok(()),
    }
}

/// Every check, in order: usable, model, then the request's worst case against `loads` (the
/// caps of [`active_caps`] with what their periods hold).
pub fn admit(
    key: &KeyPolicy,
    tenant: &TenantPolicy,
    request: &Request<'_>,
    now_ms: i64,
    loads: &[CapLoad],
) -> Result<(), Refusal> {
    check_usable(key, tenant.zone, now_ms)?;
    check_model(key, request.requested, request.slug)?;
    CapRefusal::check(request.worst, loads, tenant.zone, now_ms).map_err(Refusal::Cap)
}

/// Why a request was not admitted. `Display` is the client's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    Disabled,
    Expired { at_ms: i64, zone: Zone },
    ModelNotAllowed(ModelNotAllowed),
    Cap(CapRefusal),
}

/// The HTTP answer a [`Refusal`] stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalKind {
    /// 401 `authentication_error`.
    Authentication,
    /// 403 `permission_error` / `model_not_allowed`.
    ModelNotAllowed,
    /// 429 with `retry-after` (seconds until every cap refused has started over).
    CapPeriodic { retry_after: u64 },
    /// 402: a `total` cap, no wait helps.
    CapTotal,
}

impl RefusalKind {
    pub fn status(self) -> u16 {
        match self {
            RefusalKind::Authentication => 401,
            RefusalKind::ModelNotAllowed => 403,
            RefusalKind::CapPeriodic { .. } => 429,
            RefusalKind::CapTotal => 402,
        }
    }
}

impl Refusal {
    pub fn kind(&self) -> RefusalKind {
        match self {
            Refusal::Disabled | Refusal::Expired { .. } => RefusalKind::Authentication,
            Refusal::ModelNotAllowed(_) => RefusalKind::ModelNotAllowed,
            Refusal::Cap(c) => match c.retry_after {
                Some(retry_after) => RefusalKind::CapPeriodic { retry_after },
                None => RefusalKind::CapTotal,
            },
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Disabled => f.write_str("this key is disabled"),
            Refusal::Expired { at_ms, zone } => {
                write!(f, "this key expired at {}", zone.describe(*at_ms))
            }
            Refusal::ModelNotAllowed(m) => m.fmt(f),
            Refusal::Cap(c) => c.fmt(f),
        }
    }
}

#[cfg(test)]
#[path = "key_policy_tests.rs"]
mod tests;
