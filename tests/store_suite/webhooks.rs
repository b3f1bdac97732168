//! The webhook outbox: events written with their cause, once per cause; one sender at a time
//! across replicas; deliveries retried, delivered or dead, and never due again once done.

use super::{row, soles, tenant_with, Fixture};
use quipu::keys;
use quipu::store::webhooks::{Attempt, WebhookEndpoint};
use quipu::store::{self, KeyRules, NewKey, Store, TenantRules};
use quipu_core::governance::webhooks::event::{Event, KeyExpiring, WebhookEvent};

async fn kinds(s: &dyn Store, tenant: i64) -> Vec<String> {
    let events = s.unfanned(1000).await.unwrap();
    events
        .into_iter()
        .filter(|e| e.tenant_id == tenant)
        .map(|e| e.kind)
        .collect()
}

pub(super) async fn a_top_up_writes_its_event_once(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "0").await;
    s.top_up_once(t, soles("10"), "first", Some("k1"))
        .await
        .unwrap();
    // The same top-up again (its idempotency key): nothing new, no second event.
    let again = s
        .top_up_once(t, soles("10"), "first", Some("k1"))
        .await
        .unwrap();
    assert!(again.replayed);
    s.top_up(t, soles("5"), "second").await.unwrap();
    assert_eq!(kinds(&*s, t).await, ["topup.received", "topup.received"]);
}

pub(super) async fn a_balance_falling_below_its_threshold_alerts_once_per_crossing(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "10").await;
    let rules = TenantRules {
        low_balance: Some(soles("5")),
        ..TenantRules::default()
    };
    s.set_tenant_rules(t, &rules).await.unwrap();
    let now = store::now_ms();
    // 10 → 6: above; → 4: crosses; → 3: still below, no second alert.
    s.record("r1", &[row("a", t, now, "apu", soles("4"))])
        .await
        .unwrap();
    assert_eq!(kinds(&*s, t).await, ["topup.received"]);
    s.record("r1", &[row("b", t, now, "apu", soles("2"))])
        .await
        .unwrap();
    s.record("r1", &[row("c", t, now, "apu", soles("1"))])
        .await
        .unwrap();
    // A replayed batch charges nothing and alerts nothing.
    s.record("r1", &[row("b", t, now, "apu", soles("2"))])
        .await
        .unwrap();
    assert_eq!(kinds(&*s, t).await, ["topup.received", "balance.low"]);
    // A top-up re-arms it; the next fall below alerts again.
    s.top_up(t, soles("10"), "more").await.unwrap();
    s.record("r1", &[row("d", t, now, "apu", soles("9"))])
        .await
        .unwrap();
    assert_eq!(
        kinds(&*s, t).await,
        [
            "topup.received",
            "balance.low",
            "topup.received",
            "balance.low"
        ]
    );
    // A tenant without a threshold is never alerted.
    let u = tenant_with(&*s, "beta", "1").await;
    s.record("r1", &[row("e", u, now, "apu", soles("0.9"))])
        .await
        .unwrap();
    assert_eq!(kinds(&*s, u).await, ["topup.received"]);
}

pub(super) async fn one_sender_at_a_time_and_deliveries_end_once(fx: &Fixture) {
    let (a, b) = (fx.open().await, fx.open().await);
    // Replicas racing for the lease: exactly one wins each round.
    let (ra, rb) = tokio::join!(a.lead_sender("gw-a", 60_000), b.lead_sender("gw-b", 60_000));
    assert!(ra.unwrap() ^ rb.unwrap(), "exactly one replica sends");
    let (leader, other, other_name) = if a.lead_sender("gw-a", 60_000).await.unwrap() {
        (&a, &b, "gw-b")
    } else {
        (&b, &a, "gw-a")
    };
    assert!(!other.lead_sender(other_name, 60_000).await.unwrap());
    let leader_name = if other_name == "gw-a" { "gw-b" } else { "gw-a" };
    leader.resign_sender(leader_name).await.unwrap();
    assert!(
        other.lead_sender(other_name, 60_000).await.unwrap(),
        "a resigned lease is free"
    );
    assert!(!leader.lead_sender(leader_name, 60_000).await.unwrap());

    let s = a;
    let t = tenant_with(&*s, "acme", "10").await;
    s.add_endpoint(&WebhookEndpoint {
        id: "wh_1".into(),
        tenant_id: t,
        url: "http://127.0.0.1:9/".into(),
        secret: "whsec_1".into(),
        events: "*".into(),
        created_at: 1,
    })
    .await
    .unwrap();
    assert_eq!(s.endpoints(Some(t)).await.unwrap().len(), 1);
    let events = s.unfanned(10).await.unwrap();
    assert_eq!(events.len(), 1);
    let id = events[0].event_id.clone();
    let now = store::now_ms();
    let deliveries = [
        (id.clone(), "wh_1".to_owned()),
        (id.clone(), "op_x".to_owned()),
    ];
    s.fan_out(std::slice::from_ref(&id), &deliveries, now)
        .await
        .unwrap();
    // Fanning out twice (a sender that died after its commit) changes nothing.
    s.fan_out(std::slice::from_ref(&id), &deliveries, now)
        .await
        .unwrap();
    assert!(s.unfanned(10).await.unwrap().is_empty());
    assert_eq!(s.backlog().await.unwrap().pending, 2);
    let due = s.due(now, 10).await.unwrap();
    assert_eq!(due.len(), 2);
    assert!(due[0].body.contains(&id), "{}", due[0].body);
    let retry = Attempt::Retry {
        next_at: now + 60_000,
        status: Some(500),
        error: "answered 500".into(),
    };
    s.attempted(&id, "wh_1", &retry, now).await.unwrap();
    s.attempted(&id, "op_x", &Attempt::Delivered { status: 200 }, now)
        .await
        .unwrap();
    assert!(s.due(now, 10).await.unwrap().is_empty(), "a retry waits");
    let later = s.due(now + 60_000, 10).await.unwrap();
    assert_eq!((later.len(), later[0].attempts), (1, 1));
    s.attempted(
        &id,
        "wh_1",
        &Attempt::Dead {
            status: None,
            error: "gone".into(),
        },
        now,
    )
    .await
    .unwrap();
    // A late second result for a finished delivery changes nothing.
    s.attempted(&id, "op_x", &retry, now).await.unwrap();
    assert!(s.due(i64::MAX, 10).await.unwrap().is_empty());
    let states: Vec<(String, String, u32)> = s
        .deliveries(Some(t))
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.endpoint, d.state, d.attempts))
        .collect();
    assert_eq!(
        states,
        [
            ("op_x".to_owned(), "delivered".to_owned(), 1),
            ("wh_1".to_owned(), "dead".to_owned(), 2)
        ]
    );
    assert_eq!(s.backlog().await.unwrap().pending, 0);
    // Retention: nothing finished before `now` yet; everything once it is old enough, and an
    // event still waiting to be fanned out stays.
    s.top_up(t, soles("1"), "later").await.unwrap();
    assert_eq!(s.prune_webhooks(now - 1).await.unwrap(), 0);
    assert_eq!(
        s.prune_webhooks(i64::MAX).await.unwrap(),
        3,
        "two deliveries and their event"
    );
    assert!(s.deliveries(Some(t)).await.unwrap().is_empty());
    assert_eq!(s.unfanned(10).await.unwrap().len(), 1);
    assert!(s.remove_endpoint(t, "wh_1", now).await.unwrap());
    assert!(!s.remove_endpoint(t, "wh_1", now).await.unwrap());
    assert!(s.endpoints(None).await.unwrap().is_empty());
}

pub(super) async fn expiring_keys_are_found_and_noticed_once(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "0").await;
    let now = store::now_ms();
    let day = 86_400_000;
    for (label, expires) in [
        ("soon", Some(now + 3 * day)),
        ("later", Some(now + 30 * day)),
        ("never", None),
    ] {
        let (_, id, hash, prefix) = keys::generate_key();
        s.create_key(NewKey {
            id,
            tenant: t,
            label: label.into(),
            secret_hash: hash,
            secret_prefix: prefix,
            limits: Default::default(),
            rules: KeyRules {
                expires_at: expires,
                ..KeyRules::default()
            },
        })
        .await
        .unwrap();
    }
    let found = s.expiring_keys(now, now + 7 * day).await.unwrap();
    assert_eq!(found.len(), 1);
    let k = &found[0];
    let notice = |k: &store::webhooks::ExpiringKey| {
        let e = Event::KeyExpiring7d(KeyExpiring {
            key_id: k.key_id.clone(),
            expires_at: k.expires_at / 1000,
        });
        (k.tenant_id, WebhookEvent::new(&k.tenant_name, now, e))
    };
    // Two replicas scanning: one event.
    let (one, two) = ([notice(k)], [notice(k)]);
    let (x, y) = tokio::join!(s.emit(&one), s.emit(&two));
    assert_eq!(x.unwrap() + y.unwrap(), 1);
    assert_eq!(kinds(&*s, t).await, ["key.expiring_7d"]);
}
