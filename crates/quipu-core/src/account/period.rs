//! The period a usage query covers: `[from, to)` in milliseconds since the Unix epoch, and the
//! UTC offset its days are counted in.
//!
//! `from` and `to` are a date (`2026-11-01`, a whole day in the period's offset: as `from` its
//! first instant, as `to` the end of it, so `from=2026-11-01&to=2026-11-30` is all of
//! November) or an RFC 3339 time (exact, any offset; `to` exclusive). Without them a period is
//! the last [`DEFAULT_DAYS`] whole days, today included. A period is at most [`MAX_DAYS`] long
//! and starts after 1970-01-01.
//!
//! `utc_offset` (`-05:00`, `+01:00`, `Z`; whole hours from −12 to +14) says where days begin:
//! usage is kept by the hour, so a day in any whole-hour offset is exact. Without it days are
//! UTC days.

use crate::error::ApiError;
use chrono::{DateTime, NaiveDate, Utc};

pub const HOUR_MS: i64 = 3_600_000;
pub const DAY_MS: i64 = 24 * HOUR_MS;
/// The longest period a query may cover, in days.
pub const MAX_DAYS: i64 = 366;
/// The period of a query that names none: this many days up to the end of today.
pub const DEFAULT_DAYS: i64 = 30;

/// A checked period (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Period {
    pub from: i64,
    pub to: i64,
    /// Where days begin: milliseconds east of UTC, a whole number of hours.
    pub offset_ms: i64,
}

impl Period {
    /// Reads a period from its parameters (see the module docs); `now_ms` is the caller's clock.
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        utc_offset: Option<&str>,
        now_ms: i64,
    ) -> Result<Period, ApiError> {
        let offset_ms = match utc_offset {
            Some(o) => parse_offset(o)?,
            None => 0,
        };
        let bound = |text: &str, is_end: bool, param: &str| {
            parse_bound_in(text, is_end, offset_ms).map_err(|m| ApiError::invalid(param, m))
        };
        let to = match to {
            Some(t) => bound(t, true, "to")?,
            None => day_start(day_of(now_ms, offset_ms) + 1, offset_ms),
        };
        let from = match from {
            Some(f) => bound(f, false, "from")?,
            None => to.saturating_sub(DEFAULT_DAYS * DAY_MS),
        };
        if from >= to {
            return Err(ApiError::invalid(
                "from",
                "the period is empty: `from` must come before `to`",
            ));
        }
        if to - from > MAX_DAYS * DAY_MS {
            return Err(ApiError::invalid(
                "to",
                format!("a period is at most {MAX_DAYS} days; ask for a shorter one, or one page of periods at a time"),
            ));
        }
        if from < DAY_MS {
            return Err(ApiError::invalid(
                "from",
                "a period starts after 1970-01-01",
            ));
        }
        Ok(Period {
            from,
            to,
            offset_ms,
        })
    }

    /// The first and last day (numbers, see [`day_of`]) the period touches.
    pub fn days(&self) -> (i64, i64) {
        (
            day_of(self.from, self.offset_ms),
            day_of(self.to - 1, self.offset_ms),
        )
    }
}

/// The day (days since 1970-01-01 in the offset) that instant `ms` falls on.
pub fn day_of(ms: i64, offset_ms: i64) -> i64 {
    (ms + offset_ms).div_euclid(DAY_MS)
}

/// The first instant of day `day` in the offset.
pub fn day_start(day: i64, offset_ms: i64) -> i64 {
    day.saturating_mul(DAY_MS) - offset_ms
}

/// `2026-11-01` for a day number.
pub fn day_text(day: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(day.saturating_mul(DAY_MS))
        .map(|t| t.date_naive().format("%Y-%m-%d").to_string())
        .unwrap_or_else(|| day.to_string())
}

/// The first day of the month that day `day` is in.
pub fn month_start(day: i64) -> i64 {
    use chrono::Datelike;
    DateTime::<Utc>::from_timestamp_millis(day.saturating_mul(DAY_MS))
        .and_then(|t| t.date_naive().with_day(1))
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(day, |t| t.and_utc().timestamp_millis().div_euclid(DAY_MS))
}

/// `+05:00` / `-05:00` for an offset in milliseconds (whole hours).
pub fn offset_text(offset_ms: i64) -> String {
    let h = offset_ms / HOUR_MS;
    format!("{}{:02}:00", if h < 0 { '-' } else { '+' }, h.abs())
}

/// `±HH:MM` or `Z`, whole hours from −12 to +14, as milliseconds east of UTC.
pub fn parse_offset(text: &str) -> Result<i64, ApiError> {
    let bad = || {
        ApiError::invalid(
            "utc_offset",
            format!("utc_offset must be a whole-hour offset like -05:00 or +01:00 (or Z), from -12:00 to +14:00, not \"{text}\""),
        )
    };
    // Not `trim`: a leading space is an unescaped `+`.
    let t = text.trim_end();
    if t == "Z" || t == "z" {
        return Ok(0);
    }
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'+') => (1, &t[1..]),
        Some(b'-') => (-1, &t[1..]),
        // A `+` that a client did not escape arrives as a space.
        Some(b' ') => (1, &t[1..]),
        _ => return Err(bad()),
    };
    let (h, m) = rest.split_once(':').ok_or_else(bad)?;
    let digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(h) || !digits(m) || m != "00" {
        return Err(bad());
    }
    let hours: i64 = h.parse().map_err(|_| bad())?;
    let hours = sign * hours;
    if !(-12..=14).contains(&hours) {
        return Err(bad());
    }
    Ok(hours * HOUR_MS)
}

/// Parses a bound: `YYYY-MM-DD` (a day in UTC) or an RFC 3339 time (exact, any offset). As a
/// start a day means its first instant; as an end it means the **end** of that day.
pub fn parse_bound(text: &str, is_end: bool) -> Result<i64, String> {
    parse_bound_in(text, is_end, 0)
}

/// [`parse_bound`] with days counted in `offset_ms`.
pub fn parse_bound_in(text: &str, is_end: bool, offset_ms: i64) -> Result<i64, String> {
    let t = text.trim();
    if let Ok(day) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        let day = if is_end { day.succ_opt() } else { Some(day) };
        if let Some(start) = day.and_then(|d| d.and_hms_opt(0, 0, 0)) {
            return Ok(start.and_utc().timestamp_millis() - offset_ms);
        }
    }
    if let Ok(at) = DateTime::parse_from_rfc3339(t) {
        return Ok(at.timestamp_millis());
    }
    Err(format!(
        "\"{text}\" is not a date; write YYYY-MM-DD (a day in UTC) or an RFC 3339 time such as 2026-11-01T00:00:00-05:00"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOV_1: i64 = 1_793_491_200_000; // 2026-11-01T00:00:00Z
    const DEC_1: i64 = 1_796_083_200_000;

    fn period(from: Option<&str>, to: Option<&str>, off: Option<&str>) -> Result<Period, ApiError> {
        Period::parse(from, to, off, DEC_1 + 3_600_000)
    }

    #[test]
    fn bounds() {
        assert_eq!(parse_bound("2026-11-01", false).unwrap(), NOV_1);
        assert_eq!(parse_bound("2026-11-30", true).unwrap(), DEC_1);
        assert_eq!(
            parse_bound("2026-11-01T00:00:00-05:00", false).unwrap(),
            NOV_1 + 5 * HOUR_MS
        );
        let e = parse_bound("2026-13-01", false).unwrap_err();
        assert!(e.contains("YYYY-MM-DD"), "{e}");
    }

    #[test]
    fn dates_are_whole_days_in_the_offset() {
        let p = period(Some("2026-11-01"), Some("2026-11-30"), None).unwrap();
        assert_eq!((p.from, p.to, p.offset_ms), (NOV_1, DEC_1, 0));
        assert_eq!(p.days(), (day_of(NOV_1, 0), day_of(NOV_1, 0) + 29));
        let lima = period(Some("2026-11-01"), Some("2026-11-30"), Some("-05:00")).unwrap();
        assert_eq!(
            (lima.from, lima.to),
            (NOV_1 + 5 * HOUR_MS, DEC_1 + 5 * HOUR_MS)
        );
        assert_eq!(lima.days(), p.days());
        // RFC 3339 bounds are exact whatever the offset.
        let exact = period(
            Some("2026-11-01T10:30:00Z"),
            Some("2026-11-02T00:00:00.250Z"),
            Some("+14:00"),
        )
        .unwrap();
        assert_eq!(exact.from, NOV_1 + 10 * HOUR_MS + 30 * 60_000);
        assert_eq!(exact.to, NOV_1 + DAY_MS + 250);
        assert_eq!(day_text(day_of(NOV_1, 0)), "2026-11-01");
        assert_eq!(
            day_text(day_of(NOV_1 + 4 * HOUR_MS, -5 * HOUR_MS)),
            "2026-10-31"
        );
        let nov_17 = day_of(NOV_1, 0) + 16;
        assert_eq!(month_start(nov_17), day_of(NOV_1, 0));
        assert_eq!(month_start(day_of(NOV_1, 0)), day_of(NOV_1, 0));
        assert_eq!(offset_text(-5 * HOUR_MS), "-05:00");
        assert_eq!(offset_text(0), "+00:00");
        assert_eq!(offset_text(14 * HOUR_MS), "+14:00");
    }

    #[test]
    fn the_default_is_the_last_30_days_to_the_end_of_today() {
        let p = period(None, None, None).unwrap();
        assert_eq!(p.to, DEC_1 + DAY_MS);
        assert_eq!(p.from, DEC_1 - 29 * DAY_MS);
        // In Lima, "now" (01:00 UTC) is still the 30th of November.
        let lima = period(None, None, Some("-05:00")).unwrap();
        assert_eq!(lima.to, DEC_1 + 5 * HOUR_MS);
        // `to` alone: the 30 days before it.
        let p = period(None, Some("2026-11-30"), None).unwrap();
        assert_eq!((p.from, p.to), (DEC_1 - 30 * DAY_MS, DEC_1));
    }

    #[test]
    fn periods_are_bounded() {
        let e = period(Some("2026-11-02"), Some("2026-11-01"), None).unwrap_err();
        assert!(e.message.contains("empty"), "{e:?}");
        assert!(
            period(Some("2025-11-01"), Some("2026-11-01"), None).is_ok(),
            "366 days"
        );
        let e = period(Some("2025-11-01"), Some("2026-11-02"), None).unwrap_err();
        assert!(e.message.contains("at most 366 days"), "{e:?}");
        assert!(period(Some("1969-12-01"), Some("1970-01-05"), None).is_err());
        let e = period(Some("yesterday"), None, None).unwrap_err();
        assert_eq!(
            e.kind,
            crate::error::ErrorKind::InvalidRequest {
                param: Some("from".into())
            }
        );
    }

    #[test]
    fn offsets() {
        for (text, hours) in [
            ("Z", 0),
            ("+00:00", 0),
            ("-05:00", -5),
            (" 14:00", 14),
            ("-12:00", -12),
        ] {
            assert_eq!(parse_offset(text).unwrap(), hours * HOUR_MS, "{text}");
        }
        for bad in ["+05:30", "-13:00", "+15:00", "5", "+5:00", "EST", ""] {
            assert!(parse_offset(bad).is_err(), "{bad}");
        }
    }
}
