//! The caps a request reserves against, as [`Accounts::reserve_with_caps`] takes them (a
//! reached one refuses with `CapRefusal::reached`): the I/O side of
//! `quipu_core::governance::caps`. A key's cap and its tenant's monthly cap each count in their
//! current period in the tenant's zone, read from [`period_clock_ms`].
//!
//! [`Accounts::reserve_with_caps`]: super::Accounts::reserve_with_caps

use super::accounts::CapClaim;
use crate::store::{CapPool, CapTerms, KeyRules, TenantId, TenantRules};
use quipu_core::billing::pool::CapOwner as PoolOwner;
use quipu_core::governance::caps::{ActiveCap, CapOwner};
use quipu_core::governance::periods::PeriodError;
use std::sync::LazyLock;

/// Seconds added to the clock cap periods are judged by, from `QUIPU_CLOCK_OFFSET_S` (read
/// once at start). A testing aid: a test that spent a daily cap starts the gateway a day
/// later to see it reset, without waiting for midnight in Lima. Unset in production.
static OFFSET_MS: LazyLock<i64> = LazyLock::new(|| {
    std::env::var("QUIPU_CLOCK_OFFSET_S")
        .ok()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map_or(0, |s| s.saturating_mul(1000))
});

/// Now, as cap periods count it (milliseconds since the epoch).
pub fn period_clock_ms() -> i64 {
    crate::store::now_ms().saturating_add(*OFFSET_MS)
}

/// The key of a request: whose caps apply to it.
#[derive(Clone, Copy, Debug)]
pub struct CapHolder<'a> {
    pub tenant: TenantId,
    pub key_id: &'a str,
    pub rules: &'a KeyRules,
    pub tenant_rules: &'a TenantRules,
}

/// The caps in force on a request of `holder` at `now_ms` (its key's, then its tenant's),
/// each with the pool it reserves against.
pub fn claims(
    holder: CapHolder<'_>,
    now_ms: i64,
) -> Result<Vec<(ActiveCap, CapClaim)>, PeriodError> {
    let zone = holder.tenant_rules.zone;
    let key = holder.rules.cap.map(|cap| (CapOwner::Key, cap));
    let tenant = holder
        .tenant_rules
        .monthly_cap
        .and_then(|amount| quipu_core::governance::caps::Cap::new(amount, monthly()).ok())
        .map(|cap| (CapOwner::Tenant, cap));
    let mut out = Vec::new();
    for (owner, cap) in key.into_iter().chain(tenant) {
        let active = ActiveCap::current(owner, cap, zone, now_ms)?;
        let pool = CapPool {
            tenant: holder.tenant,
            owner: match owner {
                CapOwner::Key => PoolOwner::Key(holder.key_id.to_owned()),
                CapOwner::Tenant => PoolOwner::Tenant,
            },
            period: active.span.key(),
        };
        let terms = CapTerms {
            limit: cap.amount,
            period_end: active.span.end_ms,
        };
        out.push((active, CapClaim { pool, terms }));
    }
    Ok(out)
}

fn monthly() -> quipu_core::governance::periods::CapPeriod {
    quipu_core::governance::periods::CapPeriod::Month
}
