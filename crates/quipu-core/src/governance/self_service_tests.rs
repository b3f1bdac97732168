use super::*;
use crate::governance::models::{Catalog, ModelList};

fn models(list: &str) -> Option<AllowedModels> {
    let catalog = Catalog::new(
        vec!["colibri", "aguila", "apu"],
        vec![("claude-opus-*", "apu"), ("claude-haiku-*", "colibri")],
    );
    Some(ModelList::parse(list).unwrap().compile(&catalog))
}

fn cap(amount: &str, period: &str) -> Option<Cap> {
    Some(Cap::parse(amount, period).unwrap())
}

fn limited() -> KeyLimits {
    KeyLimits {
        models: models("colibri, aguila"),
        cap: cap("5.00", "day"),
        expires_at: Some(1_798_675_200_000), // 2026-12-31T00:00:00Z
        manage: true,
    }
}

#[test]
fn the_same_limits_or_tighter_are_within() {
    let op = limited();
    let same = KeyLimits {
        manage: false,
        ..limited()
    };
    assert_eq!(within(&op, None, &same), Ok(()));
    let tighter = KeyLimits {
        models: models("claude-haiku-*"),
        cap: cap("1.00", "day"),
        expires_at: Some(1_790_000_000_000),
        manage: false,
    };
    assert_eq!(
        within(&op, Some(Pen::from_centimos(10_000)), &tighter),
        Ok(())
    );
    // A managing key without limits gives out any.
    assert_eq!(
        within(&KeyLimits::default(), None, &KeyLimits::default()),
        Ok(())
    );
}

#[test]
fn a_manage_key_cannot_grant_manage() {
    let asked = KeyLimits {
        manage: true,
        ..KeyLimits::default()
    };
    let v = within(&KeyLimits::default(), None, &asked).unwrap_err();
    assert_eq!(v, Violation::ManageScope);
    assert_eq!(
        v.to_string(),
        "only the operator can give a key the manage scope"
    );
}

#[test]
fn models_must_be_a_subset() {
    let op = limited();
    let asked = |m: &str| KeyLimits {
        models: models(m),
        ..limited()
    };
    let asked_all = KeyLimits {
        manage: false,
        models: None,
        ..limited()
    };
    assert_eq!(
        within(&op, None, &asked_all),
        Err(Violation::ModelsUnlimited {
            allowed: vec!["colibri".into(), "aguila".into()]
        })
    );
    let mut apu = asked("colibri, claude-opus-*");
    apu.manage = false;
    let v = within(&op, None, &apu).unwrap_err();
    assert_eq!(
        v,
        Violation::ModelsBeyond {
            extra: vec!["apu".into()],
            allowed: vec!["colibri".into(), "aguila".into()]
        }
    );
    assert_eq!(
        v.to_string(),
        "the managing key may use only colibri, aguila; not apu"
    );
}

#[test]
fn a_cap_may_not_exceed_the_managing_keys_or_the_tenants() {
    let op = limited();
    let asked = |c: Option<Cap>| KeyLimits {
        cap: c,
        manage: false,
        ..limited()
    };
    let day5 = cap("5.00", "day").unwrap();
    assert_eq!(
        within(&op, None, &asked(None)),
        Err(Violation::CapMissing {
            limit: day5,
            owner: CapOwner::Key
        })
    );
    let v = within(&op, None, &asked(cap("5.01", "day"))).unwrap_err();
    assert_eq!(
        v.to_string(),
        "a budget of S/ 5.01 daily could spend more than the managing key's cap (S/ 5.00 daily)"
    );
    // A weekly S/ 5.00 spends at most S/ 5.00 on any day.
    assert_eq!(within(&op, None, &asked(cap("5.00", "week"))), Ok(()));
    // The tenant's monthly cap bounds too: a day of S/ 5 is up to S/ 155 in a month.
    let v = within(
        &op,
        Some(Pen::from_centimos(10_000)),
        &asked(cap("5.00", "day")),
    );
    assert_eq!(
        v,
        Err(Violation::CapBeyond {
            asked: day5,
            limit: cap("100", "month").unwrap(),
            owner: CapOwner::Tenant
        })
    );
    assert_eq!(
        within(
            &op,
            Some(Pen::from_centimos(15_500)),
            &asked(cap("5.00", "day"))
        ),
        Ok(())
    );
    // A managing key without a cap, under a tenant cap: the key must still be capped.
    let open = KeyLimits {
        cap: None,
        ..limited()
    };
    assert_eq!(
        within(&open, Some(Pen::from_centimos(10_000)), &asked(None)),
        Err(Violation::CapMissing {
            limit: cap("100", "month").unwrap(),
            owner: CapOwner::Tenant
        })
    );
    assert_eq!(within(&open, None, &asked(None)), Ok(()));
}

#[test]
fn caps_of_different_periods_compare_by_the_most_they_can_spend() {
    let c = |a: &str, p: &str| cap(a, p).unwrap();
    // Same period: the amounts.
    assert!(cap_within(c("5", "week"), c("5", "week")));
    assert!(!cap_within(c("5.01", "week"), c("5", "week")));
    // Finer under coarser: a month holds up to 31 days and touches up to 6 ISO weeks,
    // a week 7 days; a week can straddle two months.
    assert!(cap_within(c("3", "day"), c("93", "month")));
    assert!(!cap_within(c("3", "day"), c("92.99", "month")));
    assert!(cap_within(c("1", "day"), c("7", "week")));
    assert!(!cap_within(c("1", "day"), c("6.99", "week")));
    assert!(cap_within(c("10", "week"), c("60", "month")));
    assert!(!cap_within(c("10", "week"), c("59.99", "month")));
    assert!(cap_within(c("10", "month"), c("20", "week")));
    assert!(!cap_within(c("10", "month"), c("19.99", "week")));
    // Coarser under finer: its amount bounds any one day.
    assert!(cap_within(c("5", "month"), c("5", "day")));
    assert!(!cap_within(c("6", "month"), c("5", "day")));
    // Total: bounded by its amount; nothing periodic fits under a total cap.
    assert!(cap_within(c("5", "total"), c("5", "day")));
    assert!(cap_within(c("5", "total"), c("5", "total")));
    assert!(!cap_within(c("6", "total"), c("5", "total")));
    assert!(!cap_within(c("0.01", "day"), c("1000", "total")));
    // Products do not overflow: the largest amounts compare as unbounded, not wrapped.
    let huge = Cap::new(Pen::from_picos(i128::MAX / 2), CapPeriod::Day).unwrap();
    assert!(!cap_within(huge, c("5", "month")));
}

#[test]
fn expiry_no_later_than_the_managing_keys() {
    let op = limited();
    let limit = op.expires_at.unwrap();
    let asked = |e: Option<i64>| KeyLimits {
        expires_at: e,
        manage: false,
        ..limited()
    };
    assert_eq!(within(&op, None, &asked(Some(limit))), Ok(()));
    assert_eq!(
        within(&op, None, &asked(None)),
        Err(Violation::ExpiryMissing { limit })
    );
    let v = within(&op, None, &asked(Some(limit + 1000))).unwrap_err();
    assert_eq!(
        v.to_string(),
        "the key would expire at 2026-12-31T00:00:01Z, after the managing key (2026-12-31T00:00:00Z)"
    );
}

#[test]
fn limits_of_a_policy() {
    let key = KeyPolicy {
        cap: cap("5", "week"),
        expires_at: Some(7),
        scopes: crate::governance::key_policy::Scopes { manage: true },
        ..KeyPolicy::default()
    };
    let l = KeyLimits::of(&key);
    assert_eq!(
        (l.cap, l.expires_at, l.manage, l.models),
        (key.cap, Some(7), true, None)
    );
}
