//! Spend caps: an amount per period ([`Cap`]), the caps in force on a request with what has
//! been spent and reserved against them ([`CapLoad`]), and the rule of admission: **a
//! request's worst case must fit what is left of every cap that applies**
//! (`spent + reserved + worst ≤ amount`, exactly, in [`Pen`]). Which caps it does not fit is
//! [`misfits`]; the refusal that names them is [`CapRefusal`].
//!
//! A key's cap and its tenant's monthly cap both apply; each is counted in its own current
//! period ([`crate::governance::periods`]) in the tenant's zone. The caller reads `spent`
//! (settled charges in the period) and `reserved` (worst cases of requests in flight) where it
//! keeps the balance, inside the same reservation, so a cap holds under concurrency the way
//! the balance does.

use super::periods::{CapPeriod, PeriodError, PeriodSpan, Zone};
use crate::billing::display::soles_text;
use crate::money::{MoneyError, Pen, AMOUNT_DECIMALS};
use std::fmt;

/// At most `amount` spent per `period`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cap {
    pub amount: Pen,
    pub period: CapPeriod,
}

impl Cap {
    /// A cap of more than zero (a key that may spend nothing is disabled instead).
    pub fn new(amount: Pen, period: CapPeriod) -> Result<Cap, CapError> {
        if amount <= Pen::ZERO {
            return Err(CapError::NotPositive);
        }
        Ok(Cap { amount, period })
    }

    /// Reads `--budget 5.00 --budget-period day`: an amount with at most two decimals and a
    /// period name.
    pub fn parse(amount: &str, period: &str) -> Result<Cap, CapError> {
        let amount = Pen::parse(amount, AMOUNT_DECIMALS).map_err(CapError::Amount)?;
        let period = CapPeriod::parse(period).map_err(CapError::Period)?;
        Cap::new(amount, period)
    }
}

/// Why a cap was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CapError {
    Amount(MoneyError),
    NotPositive,
    Period(PeriodError),
}

impl fmt::Display for CapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapError::Amount(e) => write!(f, "budget: {e}"),
            CapError::NotPositive => f.write_str(
                "a budget is more than S/ 0.00; to stop a key from spending, disable it",
            ),
            CapError::Period(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CapError {}

/// Whose cap it is.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    serde::Serialize,
    serde::Deserialize,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum CapOwner {
    /// The key's own cap.
    Key,
    /// The tenant's monthly cap, shared by all its keys.
    Tenant,
}

impl CapOwner {
    /// `key`, `tenant`: for webhooks and storage.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    fn possessive(self) -> &'static str {
        match self {
            CapOwner::Key => "this key's",
            CapOwner::Tenant => "your account's",
        }
    }
}

/// A cap and the period of it that is current.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveCap {
    pub owner: CapOwner,
    pub cap: Cap,
    pub span: PeriodSpan,
}

impl ActiveCap {
    /// `cap`'s period around `now_ms` in `zone`.
    pub fn current(
        owner: CapOwner,
        cap: Cap,
        zone: Zone,
        now_ms: i64,
    ) -> Result<ActiveCap, PeriodError> {
        let span = PeriodSpan::current(cap.period, zone, now_ms)?;
        Ok(ActiveCap { owner, cap, span })
    }
}

/// An active cap with what its current period holds: settled charges and reservations of
/// requests in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapLoad {
    pub active: ActiveCap,
    pub spent: Pen,
    pub reserved: Pen,
}

impl CapLoad {
    /// What is left to reserve: the amount minus spent and reserved, never below zero.
    pub fn available(&self) -> Pen {
        (self.active.cap.amount - self.spent - self.reserved).max(Pen::ZERO)
    }

    /// Whether a request that may cost `worst` fits: `spent + reserved + worst ≤ amount`.
    pub fn fits(&self, worst: Pen) -> bool {
        self.spent + self.reserved + worst <= self.active.cap.amount
    }
}

/// A cap a request's worst case does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub active: ActiveCap,
    /// What was left ([`CapLoad::available`]).
    pub available: Pen,
    /// The request's worst case.
    pub worst: Pen,
}

impl Shortfall {
    /// `this key's daily cap of S/ 5.00 is spent; it resets at 2026-11-28 00:00 America/Lima`.
    fn describe(&self, zone: Zone, out: &mut String) {
        use fmt::Write;
        let ActiveCap { owner, cap, span } = self.active;
        let _ = write!(
            out,
            "{} {} cap of {} ",
            owner.possessive(),
            cap.period.adjective(),
            cap.amount.format_soles()
        );
        if self.available == Pen::ZERO {
            out.push_str("is spent");
        } else {
            let _ = write!(
                out,
                "has {} left and this request may cost up to {}",
                soles_text(self.available),
                soles_text(self.worst)
            );
        }
        if let Some(end) = span.end_ms {
            let _ = write!(out, "; it resets at {}", zone.describe(end));
        }
    }
}

/// The caps among `loads` that a request which may cost `worst` does not fit, in the order
/// given.
pub fn misfits(worst: Pen, loads: &[CapLoad]) -> Vec<Shortfall> {
    loads
        .iter()
        .filter(|l| !l.fits(worst))
        .map(|l| Shortfall {
            active: l.active,
            available: l.available(),
            worst,
        })
        .collect()
}

/// A request refused because it does not fit one or more caps: 402 when one of them is a
/// `total` cap (no wait helps), else 429 with `retry-after` until the last of their periods
/// ends. `Display` is the client's message, naming each cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapRefusal {
    /// Never empty.
    pub shortfalls: Vec<Shortfall>,
    /// Seconds until every cap refused has started over; `None` when one never does.
    pub retry_after: Option<u64>,
    zone: Zone,
}

impl CapRefusal {
    /// Admits a request that may cost `worst` against `loads` (the caps in force, counted
    /// at `now_ms`), or says which caps refuse it.
    pub fn check(worst: Pen, loads: &[CapLoad], zone: Zone, now_ms: i64) -> Result<(), CapRefusal> {
        let shortfalls = misfits(worst, loads);
        if shortfalls.is_empty() {
            return Ok(());
        }
        let retry_after = shortfalls
            .iter()
            .map(|s| s.active.span.retry_after_secs(now_ms))
            .try_fold(1, |most: u64, secs| Some(most.max(secs?)));
        Err(CapRefusal {
            shortfalls,
            retry_after,
            zone,
        })
    }

    /// The refusal by one cap whose book (the reservation against its pool) found only
    /// `available` left for a request that may cost `worst`: what the book decided, named and
    /// timed like [`CapRefusal::check`]'s.
    pub fn reached(
        active: ActiveCap,
        available: Pen,
        worst: Pen,
        zone: Zone,
        now_ms: i64,
    ) -> CapRefusal {
        CapRefusal {
            shortfalls: vec![Shortfall {
                active,
                available: available.max(Pen::ZERO),
                worst,
            }],
            retry_after: active.span.retry_after_secs(now_ms).map(|s| s.max(1)),
            zone,
        }
    }

    /// Whether a `total` cap is among those refused (402 rather than 429).
    pub fn is_total(&self) -> bool {
        self.retry_after.is_none()
    }
}

impl fmt::Display for CapRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::new();
        for (i, s) in self.shortfalls.iter().enumerate() {
            if i > 0 {
                text.push_str("; and ");
            }
            s.describe(self.zone, &mut text);
        }
        f.write_str(&text)
    }
}

#[cfg(test)]
#[path = "caps_tests.rs"]
mod tests;
