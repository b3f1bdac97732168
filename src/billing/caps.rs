//! The caps a request reserves against, as [`Accounts::reserve_with_caps`] takes them (a
//! reached one refuses with `CapRefusal::reached`): the I/O side of
//! `quipu_core::governance::caps`. A key's cap and its tenant's monthly cap each count in their
//! current period in the tenant's zone, read from [`period_clock_ms`].
//!
//! [`Accounts::reserve_with_caps`]: super::Accounts::reserve_with_caps

use super::accounts::CapClaim;
use crate::store::{CapPool, CapTerms, KeyRules, TenantId, TenantRules};
use arc_swap::ArcSwapOption;
use quipu_core::billing::pool::CapOwner as PoolOwner;
use quipu_core::governance::caps::{ActiveCap, CapOwner};
use quipu_core::governance::periods::PeriodError;
use std::sync::{Arc, LazyLock};

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

impl CapHolder<'_> {
    /// Whether a cap is set on the key or its tenant (in force or not): if not, a request
    /// has no caps to count and no period to place itself in.
    pub fn has_caps(&self) -> bool {
        self.rules.cap.is_some() || self.tenant_rules.monthly_cap.is_some()
    }
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

/// A key's caps for the periods current now, ready for admission: each active cap with its
/// pool, and the pools' ids as the ledger row names them.
#[derive(Debug)]
pub struct PreparedCaps {
    pub actives: Vec<ActiveCap>,
    /// The pools, in the order of `actives`, as `Accounts::reserve_with_caps` takes them.
    pub claims: Vec<CapClaim>,
    pub ids: Vec<String>,
    /// The span they hold for: from the latest period start to the earliest period end.
    from_ms: i64,
    until_ms: i64,
}

/// One key's [`PreparedCaps`], computed on its first request of a period and shared by its
/// requests until a period ends: a period's bounds in a time zone and the pools' ids cost a few
/// thousand instructions, a load of this a few. Lock-free (an `ArcSwap`); the key snapshot
/// builds a new one with every key (a changed cap or zone starts afresh).
#[derive(Debug, Default)]
pub struct CapCache(ArcSwapOption<PreparedCaps>);

impl CapCache {
    /// The caps in force on a request of `holder` at `now_ms` (`None`: none apply).
    pub fn get(
        &self,
        holder: CapHolder<'_>,
        now_ms: i64,
    ) -> Result<Option<Arc<PreparedCaps>>, PeriodError> {
        if !holder.has_caps() {
            return Ok(None);
        }
        if let Some(p) = self.0.load_full() {
            if (p.from_ms..p.until_ms).contains(&now_ms) {
                return Ok(Some(p));
            }
        }
        let caps = claims(holder, now_ms)?;
        let ids = caps.iter().map(|(_, c)| c.pool.to_string()).collect();
        let from_ms = caps
            .iter()
            .map(|(a, _)| a.span.start_ms.unwrap_or(i64::MIN))
            .max()
            .unwrap_or(i64::MIN);
        let until_ms = caps
            .iter()
            .filter_map(|(a, _)| a.span.end_ms)
            .min()
            .unwrap_or(i64::MAX);
        let (actives, claims) = caps.into_iter().unzip();
        let prepared = Arc::new(PreparedCaps {
            actives,
            claims,
            ids,
            from_ms,
            until_ms,
        });
        self.0.store(Some(prepared.clone()));
        Ok(Some(prepared))
    }
}
