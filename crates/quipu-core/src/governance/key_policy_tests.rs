use super::*;
use crate::governance::models::{Catalog, ModelList};
use chrono::DateTime;

fn s(x: &str) -> Pen {
    Pen::parse(x, 12).unwrap()
}

fn utc(text: &str) -> i64 {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .timestamp_millis()
}

fn models(list: &str) -> AllowedModels {
    let catalog = Catalog::new(
        vec!["colibri", "aguila", "apu"],
        vec![("claude-opus-*", "apu")],
    );
    ModelList::parse(list).unwrap().compile(&catalog)
}

fn request<'a>(slug: &'a str, worst: &str) -> Request<'a> {
    Request {
        requested: slug,
        slug,
        worst: s(worst),
    }
}

/// The loads of `active_caps`, with what each period holds.
fn loads(key: &KeyPolicy, tenant: &TenantPolicy, now: i64, held: &[(&str, &str)]) -> Vec<CapLoad> {
    let caps = active_caps(key, tenant, now).unwrap();
    assert_eq!(caps.len(), held.len());
    caps.into_iter()
        .zip(held)
        .map(|(active, (spent, reserved))| CapLoad {
            active,
            spent: s(spent),
            reserved: s(reserved),
        })
        .collect()
}

#[test]
fn a_flat_key_is_admitted_with_nothing_to_count() {
    let key = KeyPolicy::default();
    let tenant = TenantPolicy::default();
    let now = utc("2026-11-27T12:00:00Z");
    assert!(active_caps(&key, &tenant, now).unwrap().is_empty());
    assert_eq!(
        admit(&key, &tenant, &request("apu", "1000.00"), now, &[]),
        Ok(())
    );
}

#[test]
fn disabled_and_expired_keys_are_401() {
    let tenant = TenantPolicy::default();
    let now = utc("2026-12-31T05:00:00Z");
    let disabled = KeyPolicy {
        disabled: true,
        ..KeyPolicy::default()
    };
    let r = admit(&disabled, &tenant, &request("apu", "0"), now, &[]).unwrap_err();
    assert_eq!(r, Refusal::Disabled);
    assert_eq!(r.kind(), RefusalKind::Authentication);
    assert_eq!(r.kind().status(), 401);
    assert_eq!(r.to_string(), "this key is disabled");

    // Works until the instant it expires, not at it.
    let expiring = KeyPolicy {
        expires_at: Some(now),
        ..KeyPolicy::default()
    };
    assert!(check_usable(&expiring, tenant.zone, now - 1).is_ok());
    let r = admit(&expiring, &tenant, &request("apu", "0"), now, &[]).unwrap_err();
    assert_eq!(r.kind(), RefusalKind::Authentication);
    assert_eq!(
        r.to_string(),
        "this key expired at 2026-12-31 00:00 America/Lima"
    );
    // Usability comes before the model and the caps.
    let both = KeyPolicy {
        models: Some(models("colibri")),
        ..expiring
    };
    assert!(matches!(
        admit(&both, &tenant, &request("apu", "0"), now, &[]),
        Err(Refusal::Expired { .. })
    ));
}

#[test]
fn a_model_outside_the_list_is_403_naming_what_the_key_may_use() {
    let key = KeyPolicy {
        models: Some(models("colibri, aguila")),
        ..KeyPolicy::default()
    };
    let tenant = TenantPolicy::default();
    let now = utc("2026-11-27T12:00:00Z");
    assert!(admit(&key, &tenant, &request("colibri", "0.01"), now, &[]).is_ok());
    let asked = Request {
        requested: "claude-opus-4-1",
        slug: "apu",
        worst: s("0.01"),
    };
    let r = admit(&key, &tenant, &asked, now, &[]).unwrap_err();
    assert_eq!(r.kind(), RefusalKind::ModelNotAllowed);
    assert_eq!(r.kind().status(), 403);
    assert_eq!(
        r.to_string(),
        "this key may use colibri, aguila; not claude-opus-4-1 (apu)"
    );
}

#[test]
fn caps_in_force_are_the_keys_then_the_tenants_in_the_tenants_zone() {
    let key = KeyPolicy {
        cap: Some(Cap::parse("5.00", "day").unwrap()),
        ..KeyPolicy::default()
    };
    let tenant = TenantPolicy {
        monthly_cap: Some(s("100")),
        zone: Zone::parse("Europe/Madrid").unwrap(),
        ..TenantPolicy::default()
    };
    // 23:30 UTC on 30 November is already 1 December in Madrid.
    let now = utc("2026-11-30T23:30:00Z");
    let caps = active_caps(&key, &tenant, now).unwrap();
    assert_eq!(caps.len(), 2);
    assert_eq!(caps[0].owner, CapOwner::Key);
    assert_eq!(caps[0].span.key().to_string(), "day:2026-12-01");
    assert_eq!(caps[1].owner, CapOwner::Tenant);
    assert_eq!(caps[1].cap.period, CapPeriod::Month);
    assert_eq!(caps[1].span.key().to_string(), "month:2026-12");
    assert!(active_caps(&key, &tenant, -1).is_err());
}

#[test]
fn a_spent_cap_is_429_until_the_period_ends_and_a_total_cap_402() {
    let now = utc("2026-11-27T12:00:00Z");
    let tenant = TenantPolicy {
        monthly_cap: Some(s("100")),
        ..TenantPolicy::default()
    };
    let key = KeyPolicy {
        cap: Some(Cap::parse("5.00", "day").unwrap()),
        ..KeyPolicy::default()
    };
    let fits = loads(&key, &tenant, now, &[("4.00", "0.50"), ("10", "0")]);
    assert!(admit(&key, &tenant, &request("apu", "0.50"), now, &fits).is_ok());
    let r = admit(&key, &tenant, &request("apu", "0.51"), now, &fits).unwrap_err();
    assert_eq!(
        r.kind(),
        RefusalKind::CapPeriodic {
            retry_after: 17 * 3600
        }
    );
    assert_eq!(r.kind().status(), 429);
    assert_eq!(
        r.to_string(),
        "this key's daily cap of S/ 5.00 has S/ 0.50 left and this request may cost up to S/ 0.51; it resets at 2026-11-28 00:00 America/Lima"
    );

    let total = KeyPolicy {
        cap: Some(Cap::parse("20", "total").unwrap()),
        ..KeyPolicy::default()
    };
    let spent = loads(&total, &tenant, now, &[("20", "0"), ("20", "0")]);
    let r = admit(&total, &tenant, &request("apu", "0.01"), now, &spent).unwrap_err();
    assert_eq!(r.kind(), RefusalKind::CapTotal);
    assert_eq!(r.kind().status(), 402);
    assert_eq!(r.to_string(), "this key's total cap of S/ 20.00 is spent");

    // The tenant's month spent refuses every key, with its own reset time.
    let month_spent = loads(&key, &tenant, now, &[("0", "0"), ("99.99", "0.01")]);
    let r = admit(&key, &tenant, &request("apu", "0.01"), now, &month_spent).unwrap_err();
    assert_eq!(
        r.to_string(),
        "your account's monthly cap of S/ 100.00 is spent; it resets at 2026-12-01 00:00 America/Lima"
    );
}
