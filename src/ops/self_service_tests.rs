use super::super::test_util::mem;
use super::super::{create_key, create_tenant, update_tenant, TenantChange};
use super::*;

fn catalog() -> Catalog<'static> {
    Catalog::new(vec!["colibri", "aguila", "apu"], Vec::new())
}

fn change(json: &str) -> KeyChange {
    serde_json::from_str(json).unwrap()
}

/// Tenants `acme` (a managing key limited to colibri and aguila, S/ 5.00 a day, and a plain
/// key) and `other` (one key); returns the ids: (acme tenant, manager, plain, other's key).
async fn setup(s: &dyn crate::store::Store) -> (TenantId, String, String, String) {
    let t = create_tenant(s, "acme").await.unwrap().id;
    create_tenant(s, "other").await.unwrap();
    let manager = change(
        r#"{"manage": true, "models": ["colibri", "aguila"],
            "budget": {"amount": "5.00", "period": "day"}}"#,
    );
    let m = create_key(s, &catalog(), "acme", &manager).await.unwrap();
    let plain = create_key(s, &catalog(), "acme", &KeyChange::default())
        .await
        .unwrap();
    let theirs = create_key(s, &catalog(), "other", &KeyChange::default())
        .await
        .unwrap();
    (t, m.key_id, plain.key_id, theirs.key_id)
}

#[tokio::test]
async fn a_managing_key_gives_what_it_has_and_no_more() {
    let s = mem().await;
    let (t, m, _, _) = setup(&*s).await;
    let me = Manager {
        key_id: &m,
        tenant: t,
    };
    let ok = change(
        r#"{"label": "ci", "models": ["colibri"], "budget": {"amount": "1.00", "period": "day"}}"#,
    );
    let k = create(&*s, &catalog(), me, &ok).await.unwrap();
    assert_eq!(k.rules.models, Some(vec!["colibri".to_owned()]));
    assert!(k.rules.scopes.is_empty());

    for (json, needle) in [
        (
            r#"{"models": ["apu"], "budget": {"amount": "1.00", "period": "day"}}"#,
            "not apu",
        ),
        (
            r#"{"budget": {"amount": "1.00", "period": "day"}}"#,
            "may use only colibri, aguila",
        ),
        (
            r#"{"models": ["colibri"], "budget": {"amount": "5.01", "period": "day"}}"#,
            "the managing key's cap",
        ),
        (r#"{"models": ["colibri"]}"#, "give the key a budget"),
        (
            r#"{"models": ["colibri"], "budget": {"amount": "1.00", "period": "day"}, "manage": true}"#,
            "manage scope",
        ),
    ] {
        let e = create(&*s, &catalog(), me, &change(json))
            .await
            .unwrap_err();
        assert_eq!(e.http_status(), 403, "{json}: {e}");
        assert!(e.message().contains(needle), "{json}: {e}");
    }

    // Raising the cap past the managing key's is refused; lowering it is not.
    let raise = change(r#"{"budget": {"amount": "6.00", "period": "day"}}"#);
    let e = update(&*s, &catalog(), me, &k.key_id, &raise)
        .await
        .unwrap_err();
    assert_eq!(e.http_status(), 403);
    let lower = change(r#"{"budget": {"amount": "0.50", "period": "day"}, "label": "ci2"}"#);
    let line = update(&*s, &catalog(), me, &k.key_id, &lower)
        .await
        .unwrap();
    assert_eq!(line.rules.budget.unwrap().amount, "0.50");
    assert_eq!(line.label, "ci2");

    // The tenant's monthly cap bounds too: S/ 20.00 a month leaves no room for S/ 1.00 a
    // day (31 days could spend S/ 31.00).
    let cap = TenantChange {
        monthly_cap: Some(Some("20.00".into())),
        ..TenantChange::default()
    };
    update_tenant(&*s, "acme", &cap).await.unwrap();
    let e = create(&*s, &catalog(), me, &ok).await.unwrap_err();
    assert!(e.message().contains("monthly cap"), "{e}");
    let small = change(r#"{"models": ["colibri"], "budget": {"amount": "0.50", "period": "day"}}"#);
    create(&*s, &catalog(), me, &small).await.unwrap();

    let rotated = rotate(&*s, &catalog(), me, &k.key_id, 0).await.unwrap();
    assert_ne!(rotated.key_id, k.key_id);
    let gone = revoke(&*s, &catalog(), me, &rotated.key_id).await.unwrap();
    assert!(gone.revoked_now);
    let e = revoke(&*s, &catalog(), me, &rotated.key_id)
        .await
        .unwrap_err();
    assert_eq!(e.http_status(), 404, "a revoked key is not there any more");
}

#[tokio::test]
async fn other_tenants_keys_manage_keys_and_plain_keys_are_refused() {
    let s = mem().await;
    let (t, m, plain, theirs) = setup(&*s).await;
    let me = Manager {
        key_id: &m,
        tenant: t,
    };
    let label = change(r#"{"label": "x"}"#);
    for id in [theirs.as_str(), "key_000000000000"] {
        let e = update(&*s, &catalog(), me, id, &label).await.unwrap_err();
        assert_eq!(e.http_status(), 404, "{id}");
        assert_eq!(
            e.message(),
            format!("no active key with id \"{id}\" in your account")
        );
        assert_eq!(
            revoke(&*s, &catalog(), me, id)
                .await
                .unwrap_err()
                .http_status(),
            404
        );
        assert_eq!(
            rotate(&*s, &catalog(), me, id, 0)
                .await
                .unwrap_err()
                .http_status(),
            404
        );
    }
    assert!(s.key(&theirs).await.unwrap().unwrap().revoked_at.is_none());

    // Not even itself: a key with the manage scope is the operator's.
    let e = revoke(&*s, &catalog(), me, &m).await.unwrap_err();
    assert_eq!(e.http_status(), 403);
    assert!(e.message().contains("only the operator"), "{e}");

    // The plain key (no list, no cap) is beyond the manager's limits: it may be revoked, but
    // not kept as it is under a new secret.
    let e = rotate(&*s, &catalog(), me, &plain, 0).await.unwrap_err();
    assert_eq!(e.http_status(), 403);

    // A key without the manage scope writes nothing.
    let not_manager = Manager {
        key_id: &plain,
        tenant: t,
    };
    let e = create(&*s, &catalog(), not_manager, &KeyChange::default())
        .await
        .unwrap_err();
    assert_eq!(e.http_status(), 403);
    assert!(e.message().contains("manage scope"), "{e}");
    assert!(
        revoke(&*s, &catalog(), me, &plain)
            .await
            .unwrap()
            .revoked_now
    );
}
