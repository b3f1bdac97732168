//! Spend caps as pools: a cap shared by replicas is never exceeded and is spent to within one
//! request, its leases answer like a balance's, and a refusal by a cap holds nothing.

use super::{row, soles, tenant_with, Fixture, FENCE};
use quipu::billing::{Accounts, CapClaim, Refusal};
use quipu::money::Pen;
use quipu::store::{self, CapPool, CapTerms, LeaseAsk, Store, TenantId};
use std::sync::Arc;

fn day_pool(t: TenantId, key: &str) -> CapPool {
    CapPool::parse(&format!("key:{key}:day:2026-11-27"), t).unwrap()
}

fn claim(pool: &CapPool, limit: &str) -> CapClaim {
    CapClaim {
        pool: pool.clone(),
        terms: CapTerms {
            limit: soles(limit),
            period_end: Some(1_764_306_000_000),
        },
    }
}

/// Writes a settled request's row, naming the caps it reserved against, as the ledger writer
/// does, and hands the answer to the replica's books.
async fn flush_capped(
    s: &dyn Store,
    a: &Accounts,
    id: &str,
    t: TenantId,
    caps: &[CapPool],
    c: Pen,
) {
    let mut r = row(id, t, store::now_ms(), "apu", c);
    r.caps = caps.iter().map(|p| p.to_string()).collect();
    let sent = a.tick();
    let recorded = s.record(a.replica(), &[r]).await.unwrap();
    assert_eq!(recorded.new, 1);
    a.recorded(sent, &recorded);
}

pub(super) async fn cap_leases_answer_like_balance_leases(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "20").await;
    let pool = day_pool(t, "key_aa");
    let terms = claim(&pool, "1.00").terms;
    let ask = LeaseAsk::exactly(soles("0.60"));
    let g = s.grant_cap_lease("r1", &pool, terms, ask).await.unwrap();
    assert_eq!(
        (g.granted, g.reading.amount),
        (soles("0.60"), soles("0.60"))
    );
    // Another replica gets what is left of the cap, not of the balance.
    let g2 = s.grant_cap_lease("r2", &pool, terms, ask).await.unwrap();
    assert_eq!((g2.granted, g2.elsewhere), (soles("0.40"), soles("0.60")));
    let none = s.grant_cap_lease("r3", &pool, terms, ask).await.unwrap();
    assert_eq!(none.granted, Pen::ZERO);
    // A row naming the pool charges the pool's spent and the recording replica's lease.
    let mut r = row("a", t, store::now_ms(), "apu", soles("0.25"));
    r.caps = vec![pool.to_string()];
    let rec = s.record("r1", &[r]).await.unwrap();
    assert_eq!(rec.cap_leases.len(), 1);
    assert_eq!(rec.cap_leases[0].0, pool);
    assert_eq!(
        (rec.cap_leases[0].1.amount, rec.cap_leases[0].1.spent),
        (soles("0.35"), soles("0.25"))
    );
    assert_eq!(
        s.cap_spent(&[pool.to_string()]).await.unwrap(),
        vec![(pool.to_string(), soles("1.00"), soles("0.25"))]
    );
    // Released money goes back to the cap; heartbeats read the rows back with their pool.
    let back = s
        .release_cap_lease("r2", &pool, soles("0.40"))
        .await
        .unwrap();
    assert_eq!(back.map(|r| r.amount), Some(Pen::ZERO));
    let beats = s.cap_heartbeat("r1").await.unwrap();
    assert_eq!(beats.len(), 1);
    assert_eq!(
        (beats[0].0.clone(), beats[0].1.amount),
        (pool.clone(), soles("0.35"))
    );
    // The limit written with a grant applies to the rest of the period: lowered below what
    // is spent and leased, nothing more is granted.
    let lower = CapTerms {
        limit: soles("0.50"),
        ..terms
    };
    let g = s.grant_cap_lease("r2", &pool, lower, ask).await.unwrap();
    assert_eq!(g.granted, Pen::ZERO);
    // Reclaim and drop cover cap leases too.
    s.drop_leases("r1").await.unwrap();
    assert!(s.cap_heartbeat("r1").await.unwrap().is_empty());
}

/// The acceptance's cap: S/ 0.05 a day, shared by three replicas each admitting many requests
/// at once; the period's charges never pass it, and it is spent to within one request.
pub(super) async fn three_replicas_never_spend_past_a_cap(fx: &Fixture) {
    let stores = [fx.open().await, fx.open().await, fx.open().await];
    let t = tenant_with(&*stores[0], "acme", "100.00").await;
    let pool = day_pool(t, "key_bb");
    let replicas: Vec<Arc<Accounts>> = (0..3)
        .map(|i| {
            Accounts::new(
                stores[i].clone(),
                format!("replica-{i}"),
                soles("0.02"),
                FENCE,
            )
        })
        .collect();
    let worst = soles("0.0013");
    let mut tasks = Vec::new();
    for i in 0..200usize {
        let (a, s) = (replicas[i % 3].clone(), stores[i % 3].clone());
        let cap = claim(&pool, "0.05");
        tasks.push(tokio::spawn(async move {
            match a
                .reserve_with_caps(t, worst, std::slice::from_ref(&cap))
                .await
            {
                Ok(r) => {
                    assert_eq!(r.caps_held(), 1);
                    let charged = a.settle(r, worst);
                    flush_capped(&*s, &a, &format!("req-{i}"), t, &[cap.pool], charged).await;
                    true
                }
                Err(Refusal::CapReached {
                    index: 0,
                    available,
                }) => {
                    assert!(available < worst, "refused with {available:?} left");
                    false
                }
                Err(e) => panic!("{e:?}"),
            }
        }));
    }
    let mut admitted = 0i128;
    for task in tasks {
        admitted += i128::from(task.await.unwrap());
    }
    let spent = s_spent(&*stores[0], &pool).await;
    assert_eq!(spent, Pen::from_picos(worst.picos() * admitted));
    assert!(spent <= soles("0.05"), "spent {}", spent.to_decimal());
    // What is left is in the replicas' leases, where their own requests can use it: one
    // request at a time spends it until every replica refuses. Less than one request's worth
    // may be left in each then (on SQLite no channel calls it home; on PostgreSQL a recall may
    // move a fragment from one replica to another); idle leases go home, and then one replica
    // spends the cap to within one request.
    tokio::time::sleep(quipu::billing::accounts::DRY_MEMORY).await;
    let mut i = 200;
    let mut spend = |a: Arc<Accounts>, s: Arc<dyn Store>| {
        i += 1;
        let (pool, id) = (pool.clone(), format!("req-{i}"));
        async move {
            let Ok(r) = a.reserve_with_caps(t, worst, &[claim(&pool, "0.05")]).await else {
                return false;
            };
            let charged = a.settle(r, worst);
            flush_capped(&*s, &a, &id, t, &[pool], charged).await;
            true
        }
    };
    loop {
        let mut any = false;
        for (a, s) in replicas.iter().zip(&stores) {
            any |= spend(a.clone(), s.clone()).await;
        }
        if !any {
            break;
        }
    }
    let spent = s_spent(&*stores[0], &pool).await;
    assert!(spent <= soles("0.05"), "spent {}", spent.to_decimal());
    assert!(
        soles("0.05") - spent < Pen::from_picos(worst.picos() * 3),
        "only {} spent of the cap",
        spent.to_decimal()
    );
    for a in &replicas {
        a.return_idle_leases(std::time::Duration::ZERO).await;
    }
    tokio::time::sleep(quipu::billing::accounts::DRY_MEMORY).await;
    while spend(replicas[0].clone(), stores[0].clone()).await {}
    let spent = s_spent(&*stores[0], &pool).await;
    assert!(spent <= soles("0.05"), "spent {}", spent.to_decimal());
    assert!(
        soles("0.05") - spent < worst,
        "only {} spent of the cap once idle leases came home",
        spent.to_decimal()
    );
    // The balance paid exactly what the cap let through.
    let b = stores[0].balance(t).await.unwrap();
    assert_eq!(b.balance, soles("100.00") - spent);
}

/// A request refused by its cap holds nothing anywhere: not the cap's, not the balance's.
pub(super) async fn a_cap_refusal_holds_nothing(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "10.00").await;
    let a = Accounts::new(s.clone(), "replica-a".into(), soles("1.00"), FENCE);
    let key = day_pool(t, "key_cc");
    let tenant = CapPool::parse(&format!("tenant:{t}:month:2026-11"), t).unwrap();
    // The key's cap has room, the tenant's does not: the key's hold is given back.
    let claims = vec![claim(&key, "1.00"), claim(&tenant, "0.10")];
    match a.reserve_with_caps(t, soles("0.20"), &claims).await {
        Err(Refusal::CapReached {
            index: 1,
            available,
        }) => assert_eq!(available, soles("0.10")),
        other => panic!("{other:?}"),
    }
    for pool in [
        store::Pool::Cap(key.clone()),
        store::Pool::Cap(tenant.clone()),
        store::Pool::Balance(t),
    ] {
        let v = a.pool_view(&pool);
        assert_eq!((v.open, v.reserved), (0, Pen::ZERO), "{pool}");
    }
    // Within both, it is admitted against all three, and its charge settles on all three.
    let claims = vec![claim(&key, "1.00"), claim(&tenant, "0.10")];
    let r = a
        .reserve_with_caps(t, soles("0.05"), &claims)
        .await
        .unwrap();
    assert_eq!(a.settle(r, soles("0.04")), soles("0.04"));
    flush_capped(
        &*s,
        &a,
        "ok",
        t,
        &[key.clone(), tenant.clone()],
        soles("0.04"),
    )
    .await;
    assert_eq!(s_spent(&*s, &key).await, soles("0.04"));
    assert_eq!(s_spent(&*s, &tenant).await, soles("0.04"));
}

async fn s_spent(s: &dyn Store, pool: &CapPool) -> Pen {
    s.cap_spent(&[pool.to_string()])
        .await
        .unwrap()
        .first()
        .map_or(Pen::ZERO, |r| r.2)
}
