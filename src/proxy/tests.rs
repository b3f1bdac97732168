//! The settlement's safety net: a request task that dies after admission is still billed,
//! once.

use super::ctx::{Admitted, Books};
use super::settle::settle_request;
use super::RequestCtx;
use crate::auth::KeySnapshot;
use crate::billing::{ledger, Accounts};
use crate::config::{Config, EMBEDDED_DEFAULT};
use crate::error::ClientFormat;
use crate::money::Pen;
use crate::route::Route;
use crate::store::{sqlite::SqliteStore, ActiveKey, KeyLimits, Store};
use crate::usage::Usage;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn a_request_that_never_reaches_finish_is_billed_once_from_drop() {
    let config = Arc::new(Config::parse(EMBEDDED_DEFAULT, "test").unwrap());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(":memory:").await.unwrap());
    let t = store.create_tenant("acme").await.unwrap().id;
    store.top_up(t, Pen::from_centimos(1000), "").await.unwrap();
    let accounts = Accounts::new(
        store.clone(),
        "r".into(),
        Pen::from_centimos(500),
        Duration::from_secs(15),
    );
    let (handle, writer) = ledger::channel(
        store.clone(),
        accounts.clone(),
        Duration::from_millis(5),
        100,
        config.store.max_unstored_rows,
        ledger::ShutdownPolicy::of(&config.store),
    );
    let keys = KeySnapshot::new(config.models.len());
    keys.install(
        1,
        vec![ActiveKey {
            secret_hash: crate::keys::hash_secret("sk-qp-test"),
            key_id: "key_1".into(),
            tenant_id: t,
            tenant_name: "acme".into(),
            limits: KeyLimits::default(),
            rules: Default::default(),
            tenant_rules: Default::default(),
        }],
    );
    let caller = keys.lookup("sk-qp-test").unwrap();
    let usage = Usage {
        prompt_tokens: 1000,
        cached_tokens: 0,
        completion_tokens: 500,
    };
    let charge = config.models[0].prices.charge(&usage);
    let books = Books {
        config: config.clone(),
        accounts: accounts.clone(),
        ledger: handle.clone(),
    };
    let admitted = |reservation| {
        let mut ctx = RequestCtx::new(Route::Chat, ClientFormat::Chat);
        ctx.caller = Some(caller.clone());
        ctx.model = Some(0);
        ctx.usage = Some(usage);
        ctx.admitted = Some(Admitted {
            reservation,
            input_estimate: 1,
            caps: Vec::new(),
            books: books.clone(),
        });
        ctx
    };

    // The task panics: its context is dropped while unwinding, and settles.
    let ctx = admitted(accounts.reserve(t, Pen::from_centimos(100)).await.unwrap());
    let panicked = ctx.request_id.clone();
    let r = std::panic::catch_unwind(AssertUnwindSafe(move || {
        let _ctx = ctx;
        panic!("a bug in a request task");
    }));
    assert!(r.is_err());
    assert_eq!(handle.queued(), 1);
    let v = accounts.view(t);
    assert_eq!((v.reserved, v.unrecorded, v.open), (Pen::ZERO, charge, 0));

    // Settled normally, then dropped: billed once.
    let mut ctx = admitted(accounts.reserve(t, Pen::from_centimos(100)).await.unwrap());
    let settled = ctx.request_id.clone();
    settle_request(&mut ctx);
    drop(ctx);
    assert_eq!(handle.queued(), 2);

    let (_stop_tx, stop) = tokio::sync::watch::channel(true);
    writer.run(stop).await;
    let rows = store.ledger_rows(Some(t)).await.unwrap();
    let mut ids: Vec<&str> = rows.iter().map(|r| r.request_id.as_str()).collect();
    ids.sort_unstable();
    let mut want = vec![panicked.as_str(), settled.as_str()];
    want.sort_unstable();
    assert_eq!(ids, want);
    assert!(rows.iter().all(|r| r.charge == charge));
    let p = rows.iter().find(|r| r.request_id == panicked).unwrap();
    assert_eq!(p.status, "internal_error");
    assert_eq!(
        store.balance(t).await.unwrap().balance,
        Pen::from_centimos(1000) - charge - charge
    );
}
