//! Which events a change fires: pure threshold crossings, so that each fires **exactly once
//! per crossing** when the caller evaluates every change of the value in order (the store
//! does, in the transaction that makes the change; the outbox row is written there too).
//!
//! - **Low balance**: fires when a change takes the balance from at or above the threshold to
//!   below it. Nothing fires while it stays below; once a change (a top-up) brings it back to
//!   the threshold or above, the next fall below fires again: the crossing re-arms itself, no
//!   flag to keep.
//! - **Caps at 80 % and 100 %**: fire when a change takes what a cap's period has spent from
//!   below the level to at or above it; one change may fire both. Each period starts at zero,
//!   so the levels re-arm with each period. Because admission keeps spending within a
//!   request's worst case of the cap, a period may end a little under 100 %: the caller may
//!   also fire `cap.reached_100` when the cap first refuses a request in a period; the event's
//!   id depends only on the cap, its period and its amount, so both ways give one event.
//! - **Key expiry**: [`expiry_notice`] says which notice is due at a time: 7 days before, or
//!   (in the last day) 1 day before. A scan that runs now and then fires it; the event's id
//!   (key and expiry) keeps it to one, and a key created with less than a day left gets only
//!   the 1-day notice.

use crate::money::Pen;

/// Whether a change of the balance from `before` to `after` crosses below `threshold`.
pub fn balance_fell_below(before: Pen, after: Pen, threshold: Pen) -> bool {
    before >= threshold && after < threshold
}

/// A level of a cap that fires an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapLevel {
    /// 80 % of the amount.
    Percent80,
    /// The whole amount.
    Percent100,
}

impl CapLevel {
    /// Whether `spent` is at or above this level of `amount` (exact: `5 × spent ≥ 4 × amount`
    /// for 80 %).
    pub fn reached(self, amount: Pen, spent: Pen) -> bool {
        let (num, den) = match self {
            CapLevel::Percent80 => (4, 5),
            CapLevel::Percent100 => (1, 1),
        };
        spent.picos().saturating_mul(den) >= amount.picos().saturating_mul(num)
    }
}

/// The levels of a cap of `amount` that a change of its period's spending from `before` to
/// `after` crosses upwards, lower first.
pub fn cap_levels_crossed(amount: Pen, before: Pen, after: Pen) -> Vec<CapLevel> {
    [CapLevel::Percent80, CapLevel::Percent100]
        .into_iter()
        .filter(|l| !l.reached(amount, before) && l.reached(amount, after))
        .collect()
}

/// A notice before a key expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpiryNotice {
    SevenDays,
    OneDay,
}

const DAY_MS: i64 = 86_400_000;

/// The notice due at `now_ms` for a key that expires at `expires_at_ms`: `OneDay` in its last
/// day, `SevenDays` in the six days before that, `None` earlier or once expired.
pub fn expiry_notice(expires_at_ms: i64, now_ms: i64) -> Option<ExpiryNotice> {
    let left = expires_at_ms.saturating_sub(now_ms);
    if left <= 0 {
        None
    } else if left <= DAY_MS {
        Some(ExpiryNotice::OneDay)
    } else if left <= 7 * DAY_MS {
        Some(ExpiryNotice::SevenDays)
    } else {
        None
    }
}
