//! What each listed key has spent of its cap this period: the ledger's charges of the key
//! since the start of the cap's current period, periods counted in the tenant's time zone
//! (the core's `governance::periods`, as the caps themselves are).
//!
//! One usage query per kind of period among the keys (a day, a week, a month: at most three,
//! grouped by key), not one per key; a `total` cap is the key's usage since it was created,
//! which the listing carries already.

use super::account::Money;
use super::text::rfc3339;
use super::OpsResult;
use crate::governance::periods::PeriodSpan;
use crate::money::Pen;
use crate::store::usage::{GroupKey, Grouping, KeyUsage, UsageQuery};
use crate::store::{CapPeriod, Store, TenantId, UnixMs, Zone};
use serde::Serialize;
use std::collections::HashMap;

/// A key's cap as it stands: its amount, what was spent of it, what is left.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CapView {
    pub amount: Money,
    /// `day`, `week`, `month` or `total`.
    pub period: &'static str,
    /// Charged to the key since the period started (the ledger's rows).
    pub spent: Money,
    /// `amount − spent`, never below zero.
    pub remaining: Money,
    /// When the period ends and the cap starts over (`null` for `total`).
    pub resets_at: Option<String>,
}

/// The cap view of every key of `keys` that has a cap, by key id.
pub async fn cap_views(
    store: &dyn Store,
    tenant: TenantId,
    zone: Zone,
    keys: &[&KeyUsage],
    now: UnixMs,
) -> OpsResult<HashMap<String, CapView>> {
    let mut views = HashMap::new();
    for period in [
        CapPeriod::Day,
        CapPeriod::Week,
        CapPeriod::Month,
        CapPeriod::Total,
    ] {
        let capped: Vec<_> = keys
            .iter()
            .filter_map(|k| Some((*k, k.key.rules.cap.filter(|c| c.period == period)?)))
            .collect();
        if capped.is_empty() {
            continue;
        }
        let span = PeriodSpan::current(period, zone, now)
            .map_err(|e| super::OpsError::Invalid(e.to_string()))?;
        let spent: HashMap<String, Pen> = match span.start_ms {
            None => capped
                .iter()
                .map(|(k, _)| (k.key.id.clone(), k.totals.charge))
                .collect(),
            Some(from) => {
                let q = UsageQuery {
                    tenant,
                    from,
                    to: now + 1,
                    grouping: Grouping::Key,
                    after: None,
                    limit: usize::MAX,
                };
                store
                    .usage(&q)
                    .await?
                    .into_iter()
                    .filter_map(|g| match g.key {
                        GroupKey::Name(id) => Some((id, g.totals.charge)),
                        _ => None,
                    })
                    .collect()
            }
        };
        for (k, cap) in capped {
            let used = spent.get(&k.key.id).copied().unwrap_or(Pen::ZERO);
            views.insert(
                k.key.id.clone(),
                view(cap.amount, period, used, span.end_ms),
            );
        }
    }
    Ok(views)
}

fn view(amount: Pen, period: CapPeriod, spent: Pen, ends: Option<UnixMs>) -> CapView {
    CapView {
        amount: amount.into(),
        period: period.as_str(),
        spent: spent.into(),
        remaining: (amount - spent).max(Pen::ZERO).into(),
        resets_at: ends.map(rfc3339),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left_never_goes_below_zero() {
        let v = view(
            Pen::from_centimos(500),
            CapPeriod::Day,
            Pen::from_picos(347_000_000),
            Some(1_798_693_200_000),
        );
        assert_eq!(v.spent.exact, "0.000347");
        assert_eq!(v.remaining.exact, "4.999653");
        assert_eq!(v.resets_at.as_deref(), Some("2026-12-31T05:00:00Z"));
        let over = view(
            Pen::from_centimos(5),
            CapPeriod::Total,
            Pen::from_centimos(6),
            None,
        );
        assert_eq!(over.remaining.exact, "0.00");
    }
}
