use super::*;
use chrono::DateTime;

fn s(x: &str) -> Pen {
    Pen::parse(x, 12).unwrap()
}

fn utc(text: &str) -> i64 {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .timestamp_millis()
}

fn load(
    owner: CapOwner,
    amount: &str,
    period: CapPeriod,
    now: i64,
    spent: &str,
    reserved: &str,
) -> CapLoad {
    let cap = Cap::new(s(amount), period).unwrap();
    CapLoad {
        active: ActiveCap::current(owner, cap, Zone::LIMA, now).unwrap(),
        spent: s(spent),
        reserved: s(reserved),
    }
}

#[test]
fn caps_are_read_and_must_be_positive() {
    assert_eq!(
        Cap::parse("5.00", "day"),
        Ok(Cap {
            amount: Pen::from_centimos(500),
            period: CapPeriod::Day
        })
    );
    assert_eq!(Cap::parse("0", "week"), Err(CapError::NotPositive));
    assert!(matches!(
        Cap::parse("5.001", "day"),
        Err(CapError::Amount(_))
    ));
    assert!(matches!(Cap::parse("-5", "day"), Err(CapError::Amount(_))));
    let err = Cap::parse("5", "daily").unwrap_err();
    assert_eq!(
        err,
        CapError::Period(PeriodError::UnknownPeriod("daily".into()))
    );
    assert_eq!(
        err.to_string(),
        "a budget period is day, week, month or total, not \"daily\""
    );
    assert_eq!(
        Cap::parse("5.001", "day").unwrap_err().to_string(),
        "budget: \"5.001\" has more than 2 decimals"
    );
}

#[test]
fn a_worst_case_fits_exactly_up_to_the_amount() {
    let now = utc("2026-11-27T12:00:00Z");
    let l = load(CapOwner::Key, "5.00", CapPeriod::Day, now, "4.00", "0.50");
    assert_eq!(l.available(), s("0.50"));
    assert!(l.fits(s("0.50")));
    assert!(!l.fits(s("0.500000000001")));
    assert!(misfits(s("0.50"), &[l]).is_empty());
    // Over-reserved (the cap was lowered while requests ran): nothing available, not less.
    let over = load(CapOwner::Key, "5.00", CapPeriod::Day, now, "4.00", "2.00");
    assert_eq!(over.available(), Pen::ZERO);
    assert!(!over.fits(Pen::ZERO));
    // A request that costs nothing fits a cap that is exactly spent.
    let spent = load(CapOwner::Key, "5.00", CapPeriod::Day, now, "5.00", "0");
    assert!(spent.fits(Pen::ZERO));
}

#[test]
fn every_cap_that_applies_must_fit() {
    let now = utc("2026-11-27T12:00:00Z");
    let key = load(CapOwner::Key, "5.00", CapPeriod::Day, now, "1.00", "0");
    let tenant = load(
        CapOwner::Tenant,
        "100.00",
        CapPeriod::Month,
        now,
        "99.90",
        "0.05",
    );
    let loads = [key, tenant];
    assert!(misfits(s("0.05"), &loads).is_empty());
    let out = misfits(s("0.06"), &loads);
    assert_eq!(
        out,
        [Shortfall {
            active: tenant.active,
            available: s("0.05"),
            worst: s("0.06")
        }]
    );
    assert_eq!(misfits(s("4.50"), &loads).len(), 2);
}

#[test]
fn a_spent_daily_cap_says_when_it_resets() {
    let now = utc("2026-11-27T12:00:00Z");
    let key = load(CapOwner::Key, "5.00", CapPeriod::Day, now, "5.00", "0");
    let refusal = CapRefusal::check(s("0.01"), &[key], Zone::LIMA, now).unwrap_err();
    assert_eq!(
        refusal.to_string(),
        "this key's daily cap of S/ 5.00 is spent; it resets at 2026-11-28 00:00 America/Lima"
    );
    assert!(!refusal.is_total());
    // Until Lima's midnight, 05:00 UTC: 17 hours.
    assert_eq!(refusal.retry_after, Some(17 * 3600));
}

#[test]
fn a_cap_not_yet_spent_says_what_is_left_and_what_the_request_may_cost() {
    let now = utc("2026-11-27T12:00:00Z");
    let tenant = load(
        CapOwner::Tenant,
        "100.00",
        CapPeriod::Month,
        now,
        "99.999",
        "0",
    );
    let refusal = CapRefusal::check(s("0.0020026"), &[tenant], Zone::LIMA, now).unwrap_err();
    assert_eq!(
        refusal.to_string(),
        "your account's monthly cap of S/ 100.00 has S/ 0.001 left and this request may cost up to S/ 0.002003; it resets at 2026-12-01 00:00 America/Lima"
    );
}

#[test]
fn a_total_cap_is_402_and_several_caps_are_all_named() {
    let now = utc("2026-11-27T12:00:00Z");
    let total = load(CapOwner::Key, "20.00", CapPeriod::Total, now, "20.00", "0");
    let refusal = CapRefusal::check(s("0.01"), &[total], Zone::LIMA, now).unwrap_err();
    assert!(refusal.is_total());
    assert_eq!(refusal.retry_after, None);
    assert_eq!(
        refusal.to_string(),
        "this key's total cap of S/ 20.00 is spent"
    );

    // Two periodic caps: retry when the later one starts over.
    let key = load(CapOwner::Key, "5.00", CapPeriod::Week, now, "5.00", "0");
    let tenant = load(
        CapOwner::Tenant,
        "100.00",
        CapPeriod::Month,
        now,
        "100.00",
        "0",
    );
    let refusal = CapRefusal::check(s("0.01"), &[key, tenant], Zone::LIMA, now).unwrap_err();
    let month_end = tenant.active.span.end_ms.unwrap();
    assert_eq!(refusal.retry_after, Some(((month_end - now) / 1000) as u64));
    assert_eq!(
        refusal.to_string(),
        "this key's weekly cap of S/ 5.00 is spent; it resets at 2026-11-30 00:00 America/Lima; and your account's monthly cap of S/ 100.00 is spent; it resets at 2026-12-01 00:00 America/Lima"
    );
    // A total cap among them: no wait helps.
    let refusal = CapRefusal::check(s("0.01"), &[key, total], Zone::LIMA, now).unwrap_err();
    assert!(refusal.is_total());
}

/// Many requests admitted one after another against one cap, each reserving its worst case
/// and settling at most that: what is charged never passes the cap, and admission stops only
/// when the next worst case no longer fits.
#[test]
fn reservations_keep_a_cap_under_interleaved_requests() {
    let now = utc("2026-11-27T12:00:00Z");
    let mut l = load(CapOwner::Key, "0.05", CapPeriod::Day, now, "0", "0");
    let mut in_flight: Vec<(Pen, Pen)> = Vec::new();
    let mut seed: u64 = 7;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % n
    };
    for _ in 0..2_000 {
        if next(3) > 0 {
            let worst = Pen::from_picos(i128::from(next(4_000) + 1) * 1_000_000);
            if CapRefusal::check(worst, &[l], Zone::LIMA, now).is_ok() {
                l.reserved += worst;
                let actual = Pen::from_picos(worst.picos() * i128::from(next(101)) / 100);
                in_flight.push((worst, actual));
            }
        } else if !in_flight.is_empty() {
            let (worst, actual) = in_flight.swap_remove(next(in_flight.len() as u64) as usize);
            l.reserved -= worst;
            l.spent += actual;
        }
        assert!(l.spent + l.reserved <= l.active.cap.amount);
    }
    assert!(l.spent > Pen::ZERO);
}
