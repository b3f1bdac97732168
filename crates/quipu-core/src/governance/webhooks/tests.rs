use super::backoff::{Backoff, Retry};
use super::crossing::*;
use super::event::*;
use super::signature::*;
use crate::governance::caps::CapOwner;
use crate::governance::periods::CapPeriod;
use crate::money::Pen;
use std::time::Duration;

fn s(x: &str) -> Pen {
    Pen::parse(x, 12).unwrap()
}

fn cap_event() -> Event {
    Event::CapReached80(CapReached {
        owner: CapOwner::Key,
        key_id: Some("key_7f3a".into()),
        period: CapPeriod::Day,
        period_key: "day:2026-11-27".into(),
        cap: Soles(s("5")),
        spent: Soles(s("4.0000026")),
    })
}

#[test]
fn a_delivery_body_has_id_type_created_tenant_and_data() {
    let e = WebhookEvent::new("acme", 1_795_782_600_123, cap_event());
    let json: serde_json::Value = serde_json::from_slice(&e.to_json().unwrap()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "id": e.id,
            "created": 1_795_782_600,
            "tenant": "acme",
            "type": "cap.reached_80",
            "data": {
                "owner": "key",
                "key_id": "key_7f3a",
                "period": "day",
                "period_key": "day:2026-11-27",
                "cap": "5.00",
                "spent": "4.0000026"
            }
        })
    );
    assert!(e.id.starts_with("evt_") && e.id.len() == 36, "{}", e.id);
    // Reads back as it was written.
    let back: WebhookEvent = serde_json::from_slice(&e.to_json().unwrap()).unwrap();
    assert_eq!(back, e);
}

#[test]
fn every_event_type_serializes_under_its_name() {
    let events = [
        Event::BalanceLow(BalanceLow {
            threshold: Soles(s("10")),
            balance: Soles(s("9.50")),
            change_id: "req_1".into(),
        }),
        cap_event(),
        Event::CapReached100(CapReached {
            owner: CapOwner::Tenant,
            key_id: None,
            period: CapPeriod::Month,
            period_key: "month:2026-11".into(),
            cap: Soles(s("100")),
            spent: Soles(s("100")),
        }),
        Event::KeyExpiring7d(KeyExpiring {
            key_id: "key_1".into(),
            expires_at: 1_798_675_200,
        }),
        Event::KeyExpiring1d(KeyExpiring {
            key_id: "key_1".into(),
            expires_at: 1_798_675_200,
        }),
        Event::TopupReceived(TopupReceived {
            topup_id: "top_1".into(),
            amount: Soles(s("50")),
            balance: Soles(s("59.50")),
        }),
    ];
    for (e, name) in events.iter().zip(EVENT_TYPES) {
        assert_eq!(e.kind(), name);
        let json = serde_json::to_value(WebhookEvent::new("acme", 0, e.clone())).unwrap();
        assert_eq!(json["type"], name);
        let back: WebhookEvent = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(&back.event, e);
    }
    // A tenant's cap has no key_id at all, not a null.
    let json = serde_json::to_value(&events[2]).unwrap();
    assert!(json["data"].get("key_id").is_none(), "{json}");
}

#[test]
fn the_id_is_the_same_for_the_same_cause_and_only_then() {
    let a = WebhookEvent::new("acme", 1_000, cap_event());
    // Another replica, a moment later, same crossing: same id.
    let b = WebhookEvent::new("acme", 9_000, cap_event());
    assert_eq!(a.id, b.id);
    assert_ne!(a.id, WebhookEvent::new("other", 1_000, cap_event()).id);
    let Event::CapReached80(mut c) = cap_event() else {
        unreachable!()
    };
    assert_eq!(
        cap_event().cause(),
        "cap.reached_80/key/key_7f3a/day:2026-11-27/5.00"
    );
    // What was spent is not part of the cause; the period and the amount are.
    c.spent = Soles(s("4.5"));
    assert_eq!(Event::CapReached80(c.clone()).cause(), cap_event().cause());
    c.period_key = "day:2026-11-28".into();
    assert_ne!(Event::CapReached80(c.clone()).cause(), cap_event().cause());
    c.period_key = "day:2026-11-27".into();
    c.cap = Soles(s("6"));
    assert_ne!(Event::CapReached80(c.clone()).cause(), cap_event().cause());
    // 80 % and 100 % of the same period are two events.
    assert_ne!(
        Event::CapReached100(c.clone()).cause(),
        Event::CapReached80(c).cause()
    );
    assert_eq!(
        event_id("acme", "topup.received/top_1"),
        event_id("acme", "topup.received/top_1")
    );
}

#[test]
fn amounts_are_exact_strings_both_ways() {
    let v: Soles = serde_json::from_str("\"0.000000000001\"").unwrap();
    assert_eq!(v, Soles(Pen::from_picos(1)));
    let v: Soles = serde_json::from_str("\"-3.00\"").unwrap();
    assert_eq!(serde_json::to_string(&v).unwrap(), "\"-3.00\"");
    assert!(serde_json::from_str::<Soles>("1.5").is_err());
    assert!(serde_json::from_str::<Soles>("\"1e3\"").is_err());
}

#[test]
fn a_signature_verifies_and_anything_changed_does_not() {
    let body = br#"{"id":"evt_1","type":"topup.received"}"#;
    let secret = b"whsec_abc";
    let t = 1_795_782_600;
    let now = t * 1000 + 10_000;
    let header = sign(secret, t, body);
    assert!(header.starts_with("t=1795782600,v1="));
    assert_eq!(header.len(), "t=1795782600,v1=".len() + 64);
    let tol = DEFAULT_TOLERANCE;
    assert_eq!(verify(&header, body, secret, now, tol), Ok(()));
    // A different body, secret or timestamp.
    let mismatch = Err(SignatureError::Mismatch);
    assert_eq!(verify(&header, b"{}", secret, now, tol), mismatch);
    assert_eq!(verify(&header, body, b"whsec_abd", now, tol), mismatch);
    let other_t = header.replace("t=1795782600", "t=1795782601");
    assert_eq!(verify(&other_t, body, secret, now, tol), mismatch);
    // Upper-case hex is the same signature.
    let upper = format!("t={t},v1={}", header[16..].to_uppercase());
    assert_eq!(verify(&upper, body, secret, now, tol), Ok(()));
}

#[test]
fn the_hmac_is_the_documented_one() {
    // HMAC-SHA256 with key "whsec_test" over `1795782600.{"id":"evt_1"}`, computed
    // independently (Python's hmac module).
    let header = sign(b"whsec_test", 1_795_782_600, br#"{"id":"evt_1"}"#);
    assert_eq!(
        header,
        "t=1795782600,v1=c5d733618c7f8fcb61ba865ff7cc8a13464749cbdae8624e51f34b8b07910959"
    );
}

#[test]
fn stale_or_future_timestamps_are_refused() {
    let body = b"{}";
    let header = sign(b"k", 1_000_000, body);
    let tol = Duration::from_secs(300);
    assert_eq!(verify(&header, body, b"k", 1_000_300_000, tol), Ok(()));
    assert_eq!(
        verify(&header, body, b"k", 1_000_301_000, tol),
        Err(SignatureError::OutsideTolerance { age: 301 })
    );
    assert_eq!(
        verify(&header, body, b"k", 999_699_000, tol),
        Err(SignatureError::OutsideTolerance { age: -301 })
    );
}

#[test]
fn headers_with_several_signatures_or_garbage() {
    let body = b"{}";
    let good = sign(b"new", 1_000, body);
    let old = sign(b"old", 1_000, body);
    // Rotation: a header signed with both secrets verifies with either.
    let both = format!("{old},v1={}", &good["t=1000,v1=".len()..]);
    assert_eq!(
        verify(&both, body, b"new", 1_000_000, DEFAULT_TOLERANCE),
        Ok(())
    );
    assert_eq!(
        verify(&both, body, b"old", 1_000_000, DEFAULT_TOLERANCE),
        Ok(())
    );
    // Unknown schemes and spaces are ignored.
    let spaced = format!("v0=zz, {}", good.replace(',', " , "));
    assert_eq!(
        verify(&spaced, body, b"new", 1_000_000, DEFAULT_TOLERANCE),
        Ok(())
    );
    for (header, err) in [
        ("", SignatureError::NoTimestamp),
        ("v1=00", SignatureError::NoTimestamp),
        ("t=abc,v1=00", SignatureError::NoTimestamp),
        ("t=1000", SignatureError::NoSignature),
        ("t=1000,v1=xyz", SignatureError::NoSignature),
        ("t=1000,v1=", SignatureError::NoSignature),
    ] {
        assert_eq!(
            verify(header, body, b"new", 1_000_000, DEFAULT_TOLERANCE),
            Err(err),
            "{header}"
        );
    }
    let wrong = format!("t=1000,v1={}", "0".repeat(64));
    assert_eq!(
        verify(&wrong, body, b"new", 1_000_000, DEFAULT_TOLERANCE),
        Err(SignatureError::Mismatch)
    );
}

#[test]
fn the_default_schedule_and_its_give_up_point() {
    let b = Backoff::default();
    let minutes: Vec<u64> = b.schedule().map(|d| d.as_secs()).collect();
    assert_eq!(
        minutes,
        [
            30, 60, 120, 240, 480, 960, 1920, 3840, 7680, 15360, 21600, 21600, 21600, 21600, 21600,
            21600, 21600, 21600, 21600
        ]
    );
    assert_eq!(minutes.len() as u32, b.max_attempts - 1);
    assert_eq!(
        b.give_up_after(),
        Duration::from_secs(62 * 3600 + 31 * 60 + 30)
    );
    assert_eq!(b.delay(19, 0), Retry::After(Duration::from_secs(3 * 3600)));
    assert_eq!(b.delay(20, 0), Retry::GiveUp);
    assert_eq!(b.delay(0, 0), Retry::GiveUp);
}

#[test]
fn jitter_spreads_a_delay_between_half_and_all_of_it() {
    let b = Backoff::default();
    assert_eq!(b.delay(1, 0), Retry::After(Duration::from_secs(15)));
    assert_eq!(b.delay(1, u32::MAX), Retry::After(Duration::from_secs(30)));
    assert_eq!(
        b.delay(1, u32::MAX / 2),
        Retry::After(Duration::from_millis(22_499))
    );
    for attempt in 1..b.max_attempts {
        let nominal = b.nominal(attempt).unwrap();
        for jitter in [0, 1, 12_345, u32::MAX / 3, u32::MAX - 1, u32::MAX] {
            let Retry::After(d) = b.delay(attempt, jitter) else {
                panic!()
            };
            assert!(
                d * 2 >= nominal && d <= nominal,
                "{attempt} {jitter}: {d:?}"
            );
        }
    }
    // A short schedule for tests: 100 ms, 200 ms, give up after the third attempt.
    let quick = Backoff {
        first: Duration::from_millis(100),
        factor: 2,
        max_delay: Duration::from_secs(1),
        max_attempts: 3,
    };
    assert_eq!(
        quick.schedule().collect::<Vec<_>>(),
        [Duration::from_millis(100), Duration::from_millis(200)]
    );
    assert_eq!(quick.delay(3, 7), Retry::GiveUp);
    // A huge factor saturates instead of overflowing.
    let steep = Backoff {
        factor: u32::MAX,
        max_attempts: 50,
        ..Backoff::default()
    };
    assert_eq!(steep.nominal(49), Some(steep.max_delay));
}

#[test]
fn low_balance_fires_once_per_fall_and_rearms_above() {
    let t = s("10");
    // Balance over time: falls below, keeps falling, a top-up, falls again.
    let balances = [
        "12",
        "10.00",
        "9.99",
        "5",
        "4",
        "20",
        "10",
        "9.999999999999",
        "30",
    ];
    let fired: Vec<usize> = balances
        .windows(2)
        .enumerate()
        .filter(|(_, w)| balance_fell_below(s(w[0]), s(w[1]), t))
        .map(|(i, _)| i + 1)
        .collect();
    // Into 9.99 (from exactly 10.00) and into 9.999999999999 (after the top-up to 20).
    assert_eq!(fired, [2, 7]);
    // One change straight through, and a change that ends exactly at the threshold.
    assert!(balance_fell_below(s("50"), s("1"), t));
    assert!(!balance_fell_below(s("50"), s("10"), t));
}

#[test]
fn cap_levels_fire_once_each_per_crossing() {
    let amount = s("5");
    assert_eq!(
        cap_levels_crossed(amount, s("3.99"), s("4")),
        [CapLevel::Percent80]
    );
    assert!(cap_levels_crossed(amount, s("4"), s("4.5")).is_empty());
    assert_eq!(
        cap_levels_crossed(amount, s("4.5"), s("5")),
        [CapLevel::Percent100]
    );
    assert!(cap_levels_crossed(amount, s("5"), s("5")).is_empty());
    // One change through both levels fires both, lower first.
    assert_eq!(
        cap_levels_crossed(amount, s("1"), s("5")),
        [CapLevel::Percent80, CapLevel::Percent100]
    );
    // Exact: 80 % of S/ 0.05 is S/ 0.04, one pico less is below.
    let small = s("0.05");
    assert!(cap_levels_crossed(small, Pen::ZERO, s("0.039999999999")).is_empty());
    assert_eq!(
        cap_levels_crossed(small, Pen::ZERO, s("0.04")),
        [CapLevel::Percent80]
    );
    // Over a period of many small charges, each level fires exactly once.
    let mut spent = Pen::ZERO;
    let mut fired = Vec::new();
    while spent < small {
        let after = spent + Pen::from_picos(1_300_000_000);
        fired.extend(cap_levels_crossed(small, spent, after));
        spent = after;
    }
    assert_eq!(fired, [CapLevel::Percent80, CapLevel::Percent100]);
}

#[test]
fn expiry_notices_seven_days_then_one_day() {
    let day = 86_400_000;
    let exp = 100 * day;
    assert_eq!(expiry_notice(exp, exp - 8 * day), None);
    assert_eq!(expiry_notice(exp, exp - 7 * day - 1), None);
    assert_eq!(
        expiry_notice(exp, exp - 7 * day),
        Some(ExpiryNotice::SevenDays)
    );
    assert_eq!(
        expiry_notice(exp, exp - day - 1),
        Some(ExpiryNotice::SevenDays)
    );
    assert_eq!(expiry_notice(exp, exp - day), Some(ExpiryNotice::OneDay));
    assert_eq!(expiry_notice(exp, exp - 1), Some(ExpiryNotice::OneDay));
    assert_eq!(expiry_notice(exp, exp), None);
    assert_eq!(expiry_notice(i64::MAX, i64::MIN), None);
}

mod endpoints {
    use super::super::endpoint::*;

    #[test]
    fn urls_are_http_or_https_with_a_host() {
        let u = EndpointUrl::parse("https://hooks.example.com/quipu?x=1").unwrap();
        assert!(u.tls);
        assert_eq!((u.host.as_str(), u.port), ("hooks.example.com", 443));
        assert_eq!(u.target, "/quipu?x=1");
        assert_eq!(u.authority(), "hooks.example.com");
        let u = EndpointUrl::parse("http://127.0.0.1:8099").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.target.as_str()),
            ("127.0.0.1", 8099, "/")
        );
        assert_eq!(u.authority(), "127.0.0.1:8099");
        let u = EndpointUrl::parse("http://[::1]:9/h").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 9));
        assert_eq!(u.authority(), "[::1]:9");
        for bad in [
            "ftp://x/",
            "example.com/hook",
            "http://",
            "http://:80/",
            "http://x:0/",
            "http://x:99999/",
            "http://user:pw@x/",
            "http://x/a b",
            "http://x/#frag",
        ] {
            assert!(EndpointUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn filters_name_known_events_or_all() {
        assert_eq!(EventFilter::parse::<&str>(&[]).unwrap(), EventFilter::All);
        assert_eq!(EventFilter::parse(&["*"]).unwrap(), EventFilter::All);
        let f = EventFilter::parse(&["topup.received", "balance.low", "topup.received"]).unwrap();
        assert_eq!(f.to_text(), "topup.received,balance.low");
        assert_eq!(EventFilter::from_text(&f.to_text()).unwrap(), f);
        assert!(f.matches("balance.low") && !f.matches("cap.reached_80"));
        assert!(EventFilter::All.matches("cap.reached_80"));
        let e = EventFilter::parse(&["topup"]).unwrap_err();
        assert!(e.contains("topup.received"), "{e}");
    }

    #[test]
    fn a_delivery_is_a_post_with_its_id_type_and_signature() {
        let u = EndpointUrl::parse("http://127.0.0.1:8099/in").unwrap();
        let w = request(&u, "evt_1", "topup.received", "t=1,v1=ab", b"{}");
        let text = String::from_utf8(w).unwrap();
        assert!(
            text.starts_with("POST /in HTTP/1.1\r\nhost: 127.0.0.1:8099\r\n"),
            "{text}"
        );
        for line in [
            "content-length: 2\r\n",
            "Quipu-Event-Id: evt_1\r\n",
            "Quipu-Event-Type: topup.received\r\n",
            "Quipu-Signature: t=1,v1=ab\r\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(text.ends_with("\r\n\r\n{}"));
        assert!(delivered(200) && delivered(204) && !delivered(301) && !delivered(500));
    }
}
