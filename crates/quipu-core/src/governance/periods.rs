//! Spend-cap periods: which calendar day, ISO week or month an instant falls in, in a time
//! zone, as `[start, end)` in UTC milliseconds; how long until it ends (`retry-after`); and a
//! stable key naming it in storage (`day:2026-11-27`, `week:2026-W48`, `month:2026-11`,
//! `total`).
//!
//! Periods are calendar periods of the tenant's IANA time zone ([`Zone`], default
//! `America/Lima`), so a day is 23 or 25 hours long across a DST change, and a day whose
//! midnight does not exist (a zone that springs forward at 00:00) starts at its first instant.
//! Weeks start on Monday (ISO 8601) and are keyed by their ISO week-year, so the week of
//! Monday 2026-12-28 is `week:2026-W53` and that of 2024-12-30 is `week:2025-W01`. A `total`
//! cap has a single period with no bounds.
//!
//! Pure: the caller passes `now` in; instants from 1970 to the end of 9999 UTC are accepted.
//!
//! ```
//! use quipu_core::governance::periods::{CapPeriod, PeriodSpan, Zone};
//! let now = 1_795_782_600_000; // 2026-11-27T12:30:00Z, 07:30 in Lima
//! let span = PeriodSpan::current(CapPeriod::Day, Zone::LIMA, now).unwrap();
//! assert_eq!(span.key().to_string(), "day:2026-11-27");
//! assert_eq!(span.end_ms, Some(1_795_842_000_000)); // 2026-11-28T05:00:00Z, midnight in Lima
//! assert_eq!(span.retry_after_secs(now), Some(59_400));
//! ```

use chrono::{DateTime, Datelike, Days, LocalResult, NaiveDate, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;
use std::fmt;

/// The latest instant accepted: 9999-12-31T23:59:59.999Z.
pub const MAX_INSTANT_MS: i64 = 253_402_300_799_999;

/// How often a spend cap starts over.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::EnumIter,
    serde::Serialize,
    serde::Deserialize,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum CapPeriod {
    /// A calendar day in the zone.
    Day,
    /// Monday to Sunday in the zone (ISO weeks).
    Week,
    /// A calendar month in the zone.
    Month,
    /// Never: the cap bounds everything the key ever spends.
    Total,
}

impl CapPeriod {
    /// `day`, `week`, `month`, `total`: the name in the CLI, the APIs and storage.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Reads `day`, `week`, `month` or `total`.
    pub fn parse(text: &str) -> Result<CapPeriod, PeriodError> {
        use strum::IntoEnumIterator;
        CapPeriod::iter()
            .find(|p| p.as_str() == text)
            .ok_or_else(|| PeriodError::UnknownPeriod(text.to_owned()))
    }

    /// `daily`, `weekly`, `monthly`, `total`: for messages ("this key's daily cap").
    pub fn adjective(self) -> &'static str {
        match self {
            CapPeriod::Day => "daily",
            CapPeriod::Week => "weekly",
            CapPeriod::Month => "monthly",
            CapPeriod::Total => "total",
        }
    }
}

impl fmt::Display for CapPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An IANA time zone (`America/Lima`, `Europe/Madrid`), from the zone database built into the
/// binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Zone(Tz);

impl Zone {
    /// Peru's zone (UTC−5 all year, no DST): the default of tenants and cap periods.
    pub const LIMA: Zone = Zone(Tz::America__Lima);

    /// Reads a zone name, exactly as the database spells it (`Europe/Madrid`, `UTC`).
    pub fn parse(name: &str) -> Result<Zone, PeriodError> {
        name.parse::<Tz>()
            .map(Zone)
            .map_err(|_| PeriodError::UnknownZone(name.to_owned()))
    }

    /// The zone's IANA name.
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// `2026-11-28 00:00`: an instant as a wall-clock time in this zone, to the minute; `None`
    /// outside the accepted instants.
    pub fn local_minute(self, at_ms: i64) -> Option<String> {
        let utc = instant(at_ms).ok()?;
        Some(
            utc.with_timezone(&self.0)
                .format("%Y-%m-%d %H:%M")
                .to_string(),
        )
    }

    /// `2026-11-28 00:00 America/Lima`: [`Zone::local_minute`] followed by the zone's name,
    /// for messages; the UTC time in RFC 3339 form outside the accepted instants.
    pub fn describe(self, at_ms: i64) -> String {
        match self.local_minute(at_ms) {
            Some(local) => format!("{local} {}", self.name()),
            None => format!("{at_ms} ms after 1970-01-01T00:00:00Z"),
        }
    }

    /// The calendar date an instant falls on in this zone.
    fn date_of(self, at: DateTime<Utc>) -> NaiveDate {
        at.with_timezone(&self.0).date_naive()
    }

    /// The first instant of `date` in this zone: its midnight, or the earlier of two
    /// midnights when the clock was turned back over it, or the end of the gap when the clock
    /// skipped it.
    fn start_of(self, date: NaiveDate) -> i64 {
        let midnight = date.and_time(NaiveTime::MIN);
        match self.0.from_local_datetime(&midnight) {
            LocalResult::Single(t) => t.timestamp_millis(),
            LocalResult::Ambiguous(earlier, _) => earlier.timestamp_millis(),
            LocalResult::None => self.first_instant_on(date, midnight.and_utc().timestamp_millis()),
        }
    }

    /// The first millisecond whose local date is `date` or later, searched within a day and a
    /// few hours of `naive_ms` (the local midnight read as if it were UTC): every UTC offset
    /// is within that distance, and the local date only moves forward there.
    fn first_instant_on(self, date: NaiveDate, naive_ms: i64) -> i64 {
        const REACH_MS: i64 = 30 * 3_600_000;
        let (mut lo, mut hi) = (naive_ms - REACH_MS, naive_ms + REACH_MS);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let reached = instant(mid).is_ok_and(|t| self.date_of(t) >= date);
            if reached {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }
}

impl Default for Zone {
    fn default() -> Zone {
        Zone::LIMA
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a period, a zone or an instant was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeriodError {
    /// Not `day`, `week`, `month` or `total`.
    UnknownPeriod(String),
    /// Not a zone name in the database.
    UnknownZone(String),
    /// Not a period key as [`PeriodKey`] writes them.
    BadKey(String),
    /// Before 1970 or after 9999 (UTC).
    InstantOutOfRange(i64),
}

impl fmt::Display for PeriodError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeriodError::UnknownPeriod(p) => write!(
                f,
                "a budget period is day, week, month or total, not \"{p}\""
            ),
            PeriodError::UnknownZone(z) => write!(
                f,
                "\"{z}\" is not an IANA time zone name; write it like America/Lima or Europe/Madrid (case matters)"
            ),
            PeriodError::BadKey(k) => write!(
                f,
                "\"{k}\" is not a period key (day:YYYY-MM-DD, week:YYYY-Www, month:YYYY-MM or total)"
            ),
            PeriodError::InstantOutOfRange(ms) => write!(
                f,
                "{ms} ms since 1970-01-01T00:00:00Z is outside the instants a period can hold (1970 to 9999)"
            ),
        }
    }
}

impl std::error::Error for PeriodError {}

fn instant(at_ms: i64) -> Result<DateTime<Utc>, PeriodError> {
    if !(0..=MAX_INSTANT_MS).contains(&at_ms) {
        return Err(PeriodError::InstantOutOfRange(at_ms));
    }
    DateTime::from_timestamp_millis(at_ms).ok_or(PeriodError::InstantOutOfRange(at_ms))
}

/// The period an instant falls in: `[start_ms, end_ms)` in UTC milliseconds, both `None` for a
/// `total` cap (it never starts over).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeriodSpan {
    pub period: CapPeriod,
    pub start_ms: Option<i64>,
    pub end_ms: Option<i64>,
    key: PeriodKey,
}

impl PeriodSpan {
    /// The period of `period` that contains `now_ms`, in `zone`.
    pub fn current(period: CapPeriod, zone: Zone, now_ms: i64) -> Result<PeriodSpan, PeriodError> {
        let today = zone.date_of(instant(now_ms)?);
        let out_of_range = || PeriodError::InstantOutOfRange(now_ms);
        let (first, next, key) = match period {
            CapPeriod::Total => {
                return Ok(PeriodSpan {
                    period,
                    start_ms: None,
                    end_ms: None,
                    key: PeriodKey::Total,
                })
            }
            CapPeriod::Day => {
                let next = today.succ_opt().ok_or_else(out_of_range)?;
                (today, next, PeriodKey::Day(today))
            }
            CapPeriod::Week => {
                let back = Days::new(u64::from(today.weekday().num_days_from_monday()));
                let monday = today.checked_sub_days(back).ok_or_else(out_of_range)?;
                let next = monday.checked_add_days(Days::new(7));
                (
                    monday,
                    next.ok_or_else(out_of_range)?,
                    PeriodKey::Week(monday),
                )
            }
            CapPeriod::Month => {
                let first = today.with_day(1).ok_or_else(out_of_range)?;
                let (y, m) = match first.month() {
                    12 => (first.year() + 1, 1),
                    m => (first.year(), m + 1),
                };
                let next = NaiveDate::from_ymd_opt(y, m, 1).ok_or_else(out_of_range)?;
                (first, next, PeriodKey::Month(first))
            }
        };
        Ok(PeriodSpan {
            period,
            start_ms: Some(zone.start_of(first)),
            end_ms: Some(zone.start_of(next)),
            key,
        })
    }

    /// The key naming this period in storage.
    pub fn key(&self) -> PeriodKey {
        self.key
    }

    /// Whether `at_ms` falls in this period.
    pub fn contains(&self, at_ms: i64) -> bool {
        self.start_ms.is_none_or(|s| s <= at_ms) && self.end_ms.is_none_or(|e| at_ms < e)
    }

    /// Whole seconds from `now_ms` until the period ends, rounded up and at least 1 (the value
    /// of a `retry-after` header); `None` for a period that never ends.
    pub fn retry_after_secs(&self, now_ms: i64) -> Option<u64> {
        let left_ms = self.end_ms?.saturating_sub(now_ms).max(1);
        Some(u64::try_from(left_ms).unwrap_or(1).div_ceil(1000))
    }
}

/// The stable name of a period (see the module docs); `Display` writes it, [`PeriodKey::parse`]
/// reads it back. It holds the period's first local day.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeriodKey {
    Day(NaiveDate),
    /// The Monday that starts the week.
    Week(NaiveDate),
    /// The first day of the month.
    Month(NaiveDate),
    Total,
}

impl PeriodKey {
    /// Reads `day:2026-11-27`, `week:2026-W48`, `month:2026-11` or `total`.
    pub fn parse(text: &str) -> Result<PeriodKey, PeriodError> {
        let bad = || PeriodError::BadKey(text.to_owned());
        if text == "total" {
            return Ok(PeriodKey::Total);
        }
        let (kind, rest) = text.split_once(':').ok_or_else(bad)?;
        let number = |s: &str, len: usize| -> Result<u32, PeriodError> {
            if s.len() != len || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse().map_err(|_| bad())
        };
        let year_and = |sep: &str| -> Result<(i32, &str), PeriodError> {
            let (y, tail) = rest.split_once(sep).ok_or_else(bad)?;
            Ok((i32::try_from(number(y, 4)?).map_err(|_| bad())?, tail))
        };
        let date = match kind {
            "day" => {
                let (y, md) = year_and("-")?;
                let (m, d) = md.split_once('-').ok_or_else(bad)?;
                NaiveDate::from_ymd_opt(y, number(m, 2)?, number(d, 2)?).map(PeriodKey::Day)
            }
            "week" => {
                let (y, w) = year_and("-W")?;
                NaiveDate::from_isoywd_opt(y, number(w, 2)?, chrono::Weekday::Mon)
                    .map(PeriodKey::Week)
            }
            "month" => {
                let (y, m) = year_and("-")?;
                NaiveDate::from_ymd_opt(y, number(m, 2)?, 1).map(PeriodKey::Month)
            }
            _ => None,
        };
        date.ok_or_else(bad)
    }

    /// The cap period this key belongs to.
    pub fn period(self) -> CapPeriod {
        match self {
            PeriodKey::Day(_) => CapPeriod::Day,
            PeriodKey::Week(_) => CapPeriod::Week,
            PeriodKey::Month(_) => CapPeriod::Month,
            PeriodKey::Total => CapPeriod::Total,
        }
    }
}

impl fmt::Display for PeriodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeriodKey::Day(d) => write!(f, "day:{}", d.format("%Y-%m-%d")),
            PeriodKey::Week(d) => {
                let w = d.iso_week();
                write!(f, "week:{:04}-W{:02}", w.year(), w.week())
            }
            PeriodKey::Month(d) => write!(f, "month:{}", d.format("%Y-%m")),
            PeriodKey::Total => f.write_str("total"),
        }
    }
}

#[cfg(test)]
#[path = "periods_tests.rs"]
mod tests;
