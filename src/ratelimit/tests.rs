//! The limiter's tests: the local engine's exact counts, and the shared engine with several
//! "replicas" (limiters) on one store, which must hold the limit between them.

use super::*;
use crate::store::sqlite::SqliteStore;
use std::time::Duration;

fn rpm(n: u64) -> KeyLimits {
    KeyLimits {
        requests_per_minute: Some(n),
        tokens_per_minute: None,
    }
}

fn tpm(n: u64) -> KeyLimits {
    KeyLimits {
        requests_per_minute: None,
        tokens_per_minute: Some(n),
    }
}

/// Mid-window, so no test straddles a window's end.
const MID_WINDOW_MS: i64 = 1_800_000_000_000 + 30_000;

#[tokio::test]
async fn thousands_of_keys_get_exactly_their_limit() {
    // Every key at its limit: a shared sketch would refuse some of them early.
    let keys: Vec<Windows> = (0..20_000).map(|_| Windows::default()).collect();
    let rl = RateLimiter::frozen_at(Limits::default(), MID_WINDOW_MS);
    for (i, w) in keys.iter().enumerate() {
        for _ in 0..3 {
            assert_eq!(
                rl.admit(&rpm(3), w).await,
                Ok(()),
                "key {i} refused under its limit"
            );
        }
    }
    for w in keys.iter().step_by(997) {
        let e = rl.admit(&rpm(3), w).await.unwrap_err();
        assert_eq!((e.scope, e.limit), (Scope::Key, Limit::Requests));
        assert_eq!(e.retry_after, 30, "the window ends 30 s later");
    }
}

#[tokio::test]
async fn tenant_and_token_limits() {
    let rl = RateLimiter::frozen_at(
        Limits {
            tenant_requests_per_minute: 2,
            tenant_tokens_per_minute: 100,
            key_tokens_per_minute: 50,
            ..Limits::default()
        },
        MID_WINDOW_MS,
    );
    let none = KeyLimits::default();
    let p = Windows::default();
    let q = Windows::default();
    assert!(rl.admit(&none, &p).await.is_ok() && rl.admit(&none, &p).await.is_ok());
    let e = rl.admit(&none, &p).await.unwrap_err();
    assert_eq!((e.scope, e.limit), (Scope::Tenant, Limit::Requests));
    assert!(
        rl.admit(&none, &q).await.is_ok(),
        "another tenant is unaffected"
    );
    rl.consumed(&none, &q, 50);
    let e = rl.admit(&none, &q).await.unwrap_err();
    assert_eq!((e.scope, e.limit), (Scope::Key, Limit::Tokens));
    // Two keys of one tenant share its window.
    let shared = Windows {
        key: Arc::default(),
        tenant: p.tenant.clone(),
    };
    let e = rl.admit(&none, &shared).await.unwrap_err();
    assert_eq!(e.scope, Scope::Tenant);
}

#[test]
fn windows_follow_the_wall_clock() {
    let limits = Limits {
        window: Duration::from_secs(10),
        ..Limits::default()
    };
    let c = WindowClock {
        frozen_ms: Some(1_000_003_500),
        ..WindowClock::new(&limits)
    };
    let now = c.now();
    assert_eq!(
        (now.window, now.start_ms, now.left_ms),
        (100_000, 1_000_000_000, 6_500)
    );
    assert_eq!(now.retry_after(), 7);
    // A store whose clock is 4 s ahead moves this replica's windows with it.
    c.observe(1_000_007_600, 1_000_003_500, 200);
    assert_eq!(c.now().left_ms, 2_500);
    c.observe(1_000_007_602, 1_000_003_500, 200);
    assert_eq!(c.now().left_ms, 2_500, "a few ms of jitter move nothing");
}

/// `n` replicas' limiters on one store (an in-memory SQLite database standing in for the
/// shared PostgreSQL: the same contract, see tests/store_suite.rs), with their sync tasks.
async fn replicas(n: usize, limits: Limits) -> Vec<RateLimiter> {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(":memory:").await.unwrap());
    replicas_on(&store, n, limits)
}

/// `n` replicas' limiters on `store`, with their sync tasks.
fn replicas_on(store: &Arc<dyn Store>, n: usize, limits: Limits) -> Vec<RateLimiter> {
    (0..n)
        .map(|_| {
            let (rl, task) = RateLimiter::for_store(
                Limits {
                    engine: LimitEngine::Store,
                    ..limits
                },
                store.clone(),
            );
            tokio::spawn(task.unwrap());
            rl
        })
        .collect()
}

/// The same key as each replica's snapshot holds it: counters of its own per replica.
fn key_on(n: usize, id: &str) -> Vec<Windows> {
    (0..n)
        .map(|_| Windows {
            key: Arc::new(RateCounters::new(Subject::Key(id.into()))),
            tenant: Arc::new(RateCounters::new(Subject::Tenant(1))),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_admit_the_limit_between_them_not_three_times_it() {
    let rls = replicas(3, Limits::default()).await;
    let key = key_on(3, "key_shared");
    // Round robin, as a balancer sends them: 300 requests for a limit of 60.
    let mut admitted = 0;
    let mut per_replica = [0; 3];
    let window = rls[0].clock.now().window;
    for i in 0..300 {
        let r = i % 3;
        if rls[r].admit(&rpm(60), &key[r]).await.is_ok() {
            admitted += 1;
            per_replica[r] += 1;
        }
    }
    if rls[0].clock.now().window != window {
        return; // straddled a window's end: the count is of two windows, nothing to check
    }
    assert_eq!(admitted, 60, "per replica: {per_replica:?}");
    assert!(per_replica.iter().all(|&n| n > 0), "{per_replica:?}");
    // A refused request is told when the window ends.
    let e = rls[1].admit(&rpm(60), &key[1]).await.unwrap_err();
    assert_eq!((e.scope, e.limit), (Scope::Key, Limit::Requests));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_held_by_an_idle_replica_comes_back() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(":memory:").await.unwrap());
    let rls = replicas_on(&store, 2, Limits::default());
    let key = key_on(2, "key_idle");
    let now = rls[0].clock.now();
    let window = now.window;
    // Replica 0 takes a slice and stops; replica 1 then gets the whole rest of the limit, once
    // replica 0 has given back what it did not use (idle for `sync::IDLE`): the store's count
    // of the window is then its one request.
    assert!(rls[0].admit(&rpm(32), &key[0]).await.is_ok());
    let count = crate::store::QuotaAsk {
        subject: key[0].key.subject.window_name(shared::Dim::Requests),
        window_ms: i64::try_from(rls[0].clock.window_ms()).unwrap(),
        window_start: now.start_ms,
        add: 0,
        want: 0,
        limit: 32,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (grants, _) = store
            .take_quota(std::slice::from_ref(&count))
            .await
            .unwrap();
        if grants[0].taken == 1 {
            break;
        }
        if rls[0].clock.now().window != window {
            return; // the window ended first: nothing to check
        }
        assert!(
            std::time::Instant::now() < deadline,
            "replica 0 never gave its slice back: {grants:?}"
        );
        tokio::time::sleep(sync::TICK).await;
    }
    let mut admitted = 0;
    for _ in 0..40 {
        if rls[1].admit(&rpm(32), &key[1]).await.is_ok() {
            admitted += 1;
        }
    }
    if rls[0].clock.now().window != window {
        return;
    }
    assert_eq!(admitted, 31, "what replica 0 did not use came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_counted_across_replicas() {
    let rls = replicas(2, Limits::default()).await;
    let key = key_on(2, "key_tokens");
    let window = rls[0].clock.now().window;
    let mut tokens = 0;
    for i in 0..200 {
        let r = i % 2;
        if rls[r].admit(&tpm(400), &key[r]).await.is_ok() {
            rls[r].consumed(&tpm(400), &key[r], 10);
            tokens += 10;
        }
    }
    if rls[0].clock.now().window != window {
        return;
    }
    // Each replica may pass the limit by the last request it admitted against its slice.
    assert!(
        (400..=420).contains(&tokens),
        "{tokens} tokens for a limit of 400"
    );
    let e = rls[0].admit(&tpm(400), &key[0]).await.unwrap_err();
    assert_eq!((e.scope, e.limit), (Scope::Key, Limit::Tokens));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_limits_are_shared_too_and_an_undone_key_count_is_given_back() {
    let limits = Limits {
        tenant_requests_per_minute: 10,
        ..Limits::default()
    };
    let rls = replicas(2, limits).await;
    let window = rls[0].clock.now().window;
    // Two keys of one tenant, on two replicas.
    let a = key_on(2, "key_a");
    let b = key_on(2, "key_b");
    let mut admitted = 0;
    for i in 0..40 {
        let (r, w) = if i % 2 == 0 { (0, &a[0]) } else { (1, &b[1]) };
        if rls[r].admit(&rpm(100), w).await.is_ok() {
            admitted += 1;
        }
    }
    if rls[0].clock.now().window != window {
        return;
    }
    assert_eq!(admitted, 10);
}

#[test]
fn auto_shares_on_postgres_only() {
    assert_eq!(RateLimiter::new(Limits::default()).engine(), "local");
}
