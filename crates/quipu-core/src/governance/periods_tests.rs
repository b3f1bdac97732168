use super::*;

const HOUR: i64 = 3_600_000;

/// Milliseconds of a UTC time written as RFC 3339.
fn utc(text: &str) -> i64 {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .timestamp_millis()
}

fn zone(name: &str) -> Zone {
    Zone::parse(name).unwrap()
}

fn span(period: CapPeriod, z: Zone, now: &str) -> PeriodSpan {
    PeriodSpan::current(period, z, utc(now)).unwrap()
}

fn bounds(s: &PeriodSpan) -> (i64, i64) {
    (s.start_ms.unwrap(), s.end_ms.unwrap())
}

#[test]
fn lima_days_weeks_and_months() {
    let lima = Zone::LIMA;
    let day = span(CapPeriod::Day, lima, "2026-11-27T12:30:00Z");
    assert_eq!(day.key().to_string(), "day:2026-11-27");
    assert_eq!(
        bounds(&day),
        (utc("2026-11-27T05:00:00Z"), utc("2026-11-28T05:00:00Z"))
    );
    // Lima is five hours behind UTC: 04:59 UTC on the 28th is still the 27th there.
    let late = span(CapPeriod::Day, lima, "2026-11-28T04:59:59.999Z");
    assert_eq!(late, day);
    let next = span(CapPeriod::Day, lima, "2026-11-28T05:00:00Z");
    assert_eq!(next.key().to_string(), "day:2026-11-28");
    assert_eq!(next.start_ms, day.end_ms);

    // 2026-11-27 is a Friday of ISO week 48; the week runs Monday 23 to Sunday 29.
    let week = span(CapPeriod::Week, lima, "2026-11-27T12:30:00Z");
    assert_eq!(week.key().to_string(), "week:2026-W48");
    assert_eq!(
        bounds(&week),
        (utc("2026-11-23T05:00:00Z"), utc("2026-11-30T05:00:00Z"))
    );

    let month = span(CapPeriod::Month, lima, "2026-11-27T12:30:00Z");
    assert_eq!(month.key().to_string(), "month:2026-11");
    assert_eq!(
        bounds(&month),
        (utc("2026-11-01T05:00:00Z"), utc("2026-12-01T05:00:00Z"))
    );
    // December rolls over into the next year.
    let december = span(CapPeriod::Month, lima, "2026-12-31T23:00:00Z");
    assert_eq!(december.key().to_string(), "month:2026-12");
    assert_eq!(december.end_ms, Some(utc("2027-01-01T05:00:00Z")));
    // New Year's Eve at 23:00 UTC is 18:00 in Lima, but 1 January in Madrid.
    let madrid = span(
        CapPeriod::Month,
        zone("Europe/Madrid"),
        "2026-12-31T23:00:00Z",
    );
    assert_eq!(madrid.key().to_string(), "month:2027-01");
}

#[test]
fn madrid_days_across_dst_changes_are_23_and_25_hours() {
    let madrid = zone("Europe/Madrid");
    // Spring forward on Sunday 2026-03-29 at 02:00 CET (UTC+1) to 03:00 CEST (UTC+2).
    let spring = span(CapPeriod::Day, madrid, "2026-03-29T12:00:00Z");
    assert_eq!(spring.key().to_string(), "day:2026-03-29");
    assert_eq!(
        bounds(&spring),
        (utc("2026-03-28T23:00:00Z"), utc("2026-03-29T22:00:00Z"))
    );
    assert_eq!(spring.end_ms.unwrap() - spring.start_ms.unwrap(), 23 * HOUR);
    // The minute before the change and the minute after are the same day.
    assert_eq!(span(CapPeriod::Day, madrid, "2026-03-29T00:59:00Z"), spring);
    assert_eq!(span(CapPeriod::Day, madrid, "2026-03-29T01:00:00Z"), spring);

    // Fall back on Sunday 2026-10-25 at 03:00 CEST to 02:00 CET.
    let autumn = span(CapPeriod::Day, madrid, "2026-10-25T01:30:00Z");
    assert_eq!(autumn.key().to_string(), "day:2026-10-25");
    assert_eq!(
        bounds(&autumn),
        (utc("2026-10-24T22:00:00Z"), utc("2026-10-25T23:00:00Z"))
    );
    assert_eq!(autumn.end_ms.unwrap() - autumn.start_ms.unwrap(), 25 * HOUR);
    // Both 02:30s of that night (00:30 and 01:30 UTC) are the 25th.
    assert_eq!(span(CapPeriod::Day, madrid, "2026-10-25T00:30:00Z"), autumn);

    // The week of the spring change is an hour short, the month of it too.
    let week = span(CapPeriod::Week, madrid, "2026-03-29T21:59:59.999Z");
    assert_eq!(week.key().to_string(), "week:2026-W13");
    assert_eq!(
        bounds(&week),
        (utc("2026-03-22T23:00:00Z"), utc("2026-03-29T22:00:00Z"))
    );
    let month = span(CapPeriod::Month, madrid, "2026-03-15T12:00:00Z");
    assert_eq!(
        bounds(&month),
        (utc("2026-02-28T23:00:00Z"), utc("2026-03-31T22:00:00Z"))
    );
}

#[test]
fn a_day_whose_midnight_is_skipped_or_repeated() {
    let havana = zone("America/Havana");
    // Cuba springs forward at midnight: 2026-03-08 00:00 CST never happens, the day starts
    // at 01:00 CDT (05:00 UTC), 23 hours before the next midnight.
    let gap = span(CapPeriod::Day, havana, "2026-03-08T12:00:00Z");
    assert_eq!(gap.key().to_string(), "day:2026-03-08");
    assert_eq!(
        bounds(&gap),
        (utc("2026-03-08T05:00:00Z"), utc("2026-03-09T04:00:00Z"))
    );
    let before = span(CapPeriod::Day, havana, "2026-03-08T04:59:59.999Z");
    assert_eq!(before.key().to_string(), "day:2026-03-07");
    assert_eq!(before.end_ms, gap.start_ms);
    // And falls back at 01:00 to 00:00: midnight of 2026-11-01 happens twice; the day starts
    // at the first (04:00 UTC) and is 25 hours long.
    let fold = span(CapPeriod::Day, havana, "2026-11-01T12:00:00Z");
    assert_eq!(
        bounds(&fold),
        (utc("2026-11-01T04:00:00Z"), utc("2026-11-02T05:00:00Z"))
    );
    // Chile springs forward at midnight too (2026-09-06, 04:00 UTC).
    let santiago = span(
        CapPeriod::Day,
        zone("America/Santiago"),
        "2026-09-06T12:00:00Z",
    );
    assert_eq!(santiago.start_ms, Some(utc("2026-09-06T04:00:00Z")));
}

#[test]
fn iso_weeks_are_keyed_by_their_week_year() {
    let lima = Zone::LIMA;
    let key = |now: &str| span(CapPeriod::Week, lima, now).key().to_string();
    // Monday 2024-12-30 starts week 1 of 2025.
    assert_eq!(key("2024-12-31T12:00:00Z"), "week:2025-W01");
    // 2026 has 53 weeks; Friday 2027-01-01 is in the 53rd.
    assert_eq!(key("2026-12-28T12:00:00Z"), "week:2026-W53");
    assert_eq!(key("2027-01-01T12:00:00Z"), "week:2026-W53");
    assert_eq!(key("2027-01-04T12:00:00Z"), "week:2027-W01");
    // A Sunday belongs to the week that began the Monday before.
    assert_eq!(key("2026-11-30T04:00:00Z"), "week:2026-W48");
}

#[test]
fn consecutive_periods_tile_time_in_every_zone() {
    for name in [
        "America/Lima",
        "Europe/Madrid",
        "America/Havana",
        "UTC",
        "Asia/Kolkata",
    ] {
        let z = zone(name);
        for period in [CapPeriod::Day, CapPeriod::Week, CapPeriod::Month] {
            let mut now = utc("2025-12-20T00:00:00Z");
            let mut prev: Option<PeriodSpan> = None;
            while now < utc("2027-01-10T00:00:00Z") {
                let s = PeriodSpan::current(period, z, now).unwrap();
                assert!(s.contains(now), "{name} {period} {now}");
                let (start, end) = bounds(&s);
                assert!(!s.contains(end) && s.contains(end - 1) && !s.contains(start - 1));
                // The first instant's local date is the key's date, at midnight unless the
                // clock skipped it.
                let local = DateTime::from_timestamp_millis(start)
                    .unwrap()
                    .with_timezone(&z.0);
                assert_eq!(PeriodSpan::current(period, z, start).unwrap(), s);
                let first_day = match s.key() {
                    PeriodKey::Day(d) | PeriodKey::Week(d) | PeriodKey::Month(d) => d,
                    PeriodKey::Total => unreachable!(),
                };
                assert_eq!(local.date_naive(), first_day, "{name} {period}");
                assert_eq!(PeriodKey::parse(&s.key().to_string()), Ok(s.key()));
                if let Some(p) = prev.filter(|p| *p != s) {
                    assert_eq!(p.end_ms, s.start_ms, "{name} {period}: a gap or overlap");
                }
                prev = Some(s);
                now += 5 * HOUR + 17 * 60_000;
            }
        }
    }
}

#[test]
fn total_has_no_bounds_and_no_retry() {
    let s = PeriodSpan::current(CapPeriod::Total, Zone::LIMA, 1).unwrap();
    assert_eq!((s.start_ms, s.end_ms), (None, None));
    assert_eq!(s.key(), PeriodKey::Total);
    assert_eq!(s.key().to_string(), "total");
    assert!(s.contains(0) && s.contains(MAX_INSTANT_MS));
    assert_eq!(s.retry_after_secs(1), None);
}

#[test]
fn retry_after_rounds_up_and_is_at_least_one_second() {
    let day = span(CapPeriod::Day, Zone::LIMA, "2026-11-27T12:30:00Z");
    let end = day.end_ms.unwrap();
    assert_eq!(day.retry_after_secs(end - 1), Some(1));
    assert_eq!(day.retry_after_secs(end - 1000), Some(1));
    assert_eq!(day.retry_after_secs(end - 1001), Some(2));
    assert_eq!(day.retry_after_secs(end - 86_400_000), Some(86_400));
    // A span kept past its end (the caller's clock moved on) still says retry in a second.
    assert_eq!(day.retry_after_secs(end + 5_000), Some(1));
}

#[test]
fn names_are_parsed_with_clear_errors() {
    assert_eq!(CapPeriod::parse("day"), Ok(CapPeriod::Day));
    assert_eq!(CapPeriod::parse("total"), Ok(CapPeriod::Total));
    let err = CapPeriod::parse("daily").unwrap_err();
    assert_eq!(
        err.to_string(),
        "a budget period is day, week, month or total, not \"daily\""
    );
    assert_eq!(
        Zone::parse("Europe/Madrid").unwrap().name(),
        "Europe/Madrid"
    );
    assert_eq!(Zone::default(), Zone::LIMA);
    assert_eq!(Zone::LIMA.to_string(), "America/Lima");
    let err = Zone::parse("Lima").unwrap_err();
    assert!(
        err.to_string()
            .contains("\"Lima\" is not an IANA time zone"),
        "{err}"
    );
    assert!(Zone::parse("").is_err());
}

#[test]
fn instants_outside_1970_to_9999_are_refused() {
    for bad in [-1, MAX_INSTANT_MS + 1, i64::MIN, i64::MAX] {
        assert_eq!(
            PeriodSpan::current(CapPeriod::Day, Zone::LIMA, bad),
            Err(PeriodError::InstantOutOfRange(bad))
        );
    }
    // The last accepted instant still has a next day and month.
    let last = PeriodSpan::current(CapPeriod::Month, zone("Pacific/Kiritimati"), MAX_INSTANT_MS);
    assert!(last.is_ok());
    assert_eq!(Zone::LIMA.local_minute(-1), None);
}

#[test]
fn period_keys_round_trip_and_reject_the_rest() {
    for text in [
        "day:2026-11-27",
        "week:2026-W48",
        "month:2026-11",
        "total",
        "week:2026-W53",
    ] {
        assert_eq!(PeriodKey::parse(text).unwrap().to_string(), text);
    }
    assert_eq!(
        PeriodKey::parse("week:2026-W48").unwrap().period(),
        CapPeriod::Week
    );
    for bad in [
        "",
        "day",
        "day:2026-11-31",
        "day:2026-1-27",
        "week:2025-W53",
        "week:2026-48",
        "month:2026-13",
        "month:26-11",
        "year:2026",
        "day:+2026-11-27",
        "Total",
    ] {
        assert_eq!(
            PeriodKey::parse(bad),
            Err(PeriodError::BadKey(bad.to_owned())),
            "{bad}"
        );
    }
}

#[test]
fn local_times_for_messages() {
    let end = utc("2026-11-28T05:00:00Z");
    assert_eq!(Zone::LIMA.describe(end), "2026-11-28 00:00 America/Lima");
    assert_eq!(
        zone("Europe/Madrid").describe(end),
        "2026-11-28 06:00 Europe/Madrid"
    );
}
