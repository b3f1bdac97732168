//! Lease rows as readings: every answer about a replica's lease is one consistent `(amount,
//! spent, version)`, and a replica's books line up with them whatever order the answers come
//! back in.

use super::{row, soles, tenant_with, Fixture, FENCE};
use quipu::billing::Accounts;
use quipu::money::Pen;
use quipu::store::{self, LeaseAsk, LeaseReading, TenantId};

fn reading(amount: &str, spent: &str, version: i64) -> LeaseReading {
    LeaseReading {
        amount: soles(amount),
        spent: soles(spent),
        version,
    }
}

pub(super) async fn lease_rows_answer_with_one_consistent_reading(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "20").await;
    let now = store::now_ms();
    let ask = LeaseAsk {
        need: soles("1"),
        want: soles("3"),
    };
    let g = s.grant_lease("r1", t, ask).await.unwrap();
    assert_eq!(g.reading, reading("3", "0", 1));
    // A charge moves from `amount` to `spent`, in the transaction that writes the row.
    let rec = s
        .record("r1", &[row("a", t, now, "apu", soles("0.40"))])
        .await
        .unwrap();
    assert_eq!(rec.new, 1);
    assert_eq!(rec.leases, vec![(t, reading("2.60", "0.40", 2))]);
    // A replay charges nothing and changes no row.
    let again = s
        .record("r1", &[row("a", t, now, "apu", soles("0.40"))])
        .await
        .unwrap();
    assert_eq!((again.new, again.leases.len()), (0, 0));
    // Another replica's charge is not this row's.
    let other = s
        .record("r2", &[row("b", t, now, "apu", soles("0.10"))])
        .await
        .unwrap();
    assert!(other.leases.is_empty());
    assert_eq!(
        s.release_lease("r1", t, soles("0.60")).await.unwrap(),
        Some(reading("2", "0.40", 3))
    );
    assert_eq!(s.release_lease("r9", t, soles("1")).await.unwrap(), None);
    // A grant of nothing still answers with the row, and creates one if there is none.
    let zero = LeaseAsk {
        need: Pen::ZERO,
        want: Pen::ZERO,
    };
    assert_eq!(
        s.grant_lease("r1", t, zero).await.unwrap().reading,
        reading("2", "0.40", 4)
    );
    assert_eq!(
        s.grant_lease("r3", t, zero).await.unwrap().reading,
        reading("0", "0", 1)
    );
    assert_eq!(
        s.heartbeat("r1").await.unwrap(),
        vec![(t, reading("2", "0.40", 4))]
    );
    // The account read has the asking replica's row with the balance it goes with.
    let facts = s.account(t, None, "r1").await.unwrap();
    assert_eq!(facts.balance, soles("19.50"));
    assert_eq!(facts.lease, Some(reading("2", "0.40", 4)));
    assert_eq!(s.account(t, None, "r9").await.unwrap().lease, None);
}

pub(super) async fn a_stale_lease_is_zeroed_and_kept_then_forgotten(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "10").await;
    s.acquire_lease("quiet", t, soles("2")).await.unwrap();
    s.record(
        "quiet",
        &[row("a", t, store::now_ms(), "apu", soles("0.5"))],
    )
    .await
    .unwrap();
    assert_eq!(s.reclaim_stale_leases(-60_000).await.unwrap(), 1);
    // The money is back with the tenant; what the row recorded stays, so a replica that was
    // only cut off lines its books up again.
    assert_eq!(s.balance(t).await.unwrap().leased, Pen::ZERO);
    assert_eq!(
        s.heartbeat("quiet").await.unwrap(),
        vec![(t, reading("0", "0.5", 3))]
    );
    assert_eq!(
        s.reclaim_stale_leases(-60_000).await.unwrap(),
        0,
        "zero already"
    );
    assert_eq!(
        s.forget_silent_leases(60_000).await.unwrap(),
        0,
        "heard from"
    );
    assert_eq!(s.forget_silent_leases(-60_000).await.unwrap(), 1);
    assert!(s.heartbeat("quiet").await.unwrap().is_empty());
}

/// The false refusal the old bookkeeping made: a heartbeat read a lease row after the ledger
/// writer's `record` had charged it, and the writer's own answer came after the heartbeat's.
/// The old books lowered the lease by the heartbeat's amount and again by the charge, so the
/// charge was counted twice: money in the store, refused locally (S/ 0.00 available). Readings
/// say which charges they hold, so the order of the answers no longer matters.
pub(super) async fn a_heartbeat_between_a_write_and_its_answer_counts_the_charge_once(
    fx: &Fixture,
) {
    let s = fx.open().await;
    let t: TenantId = tenant_with(&*s, "acme", "10.00").await;
    let a = Accounts::new(s.clone(), "replica-a".into(), soles("1.00"), FENCE);
    let r = a.reserve(t, soles("0.50")).await.unwrap();
    a.settle(r, soles("0.50"));
    assert_eq!(a.view(t).available, soles("0.50"));
    // The writer's write commits; its answer is still on the way.
    let sent = a.tick();
    let recorded = s
        .record(
            a.replica(),
            &[row("w", t, store::now_ms(), "apu", soles("0.50"))],
        )
        .await
        .unwrap();
    // The heartbeat reads the charged row and is answered first.
    a.heartbeat().await.unwrap();
    assert_eq!(a.view(t).available, soles("0.50"), "after the heartbeat");
    a.recorded(sent, &recorded);
    let v = a.view(t);
    assert_eq!((v.lease, v.unrecorded), (soles("0.50"), Pen::ZERO));
    assert_eq!(v.available, soles("0.50"), "after the write's answer");
    // So the money left is admitted, from the lease, and nothing is left over.
    let r = a.reserve(t, soles("0.50")).await.unwrap();
    a.settle(r, soles("0.50"));
    let b = s.balance(t).await.unwrap();
    assert_eq!((b.balance, b.leased), (soles("9.50"), soles("0.50")));
}
