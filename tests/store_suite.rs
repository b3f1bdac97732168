//! The store contract, run against every backend: each test below is generated once for
//! SQLite (a temporary file) and once for PostgreSQL (a fresh database on the server named by
//! `QUIPU_TEST_PG_URL`), by [`store_suite!`].
//!
//! The PostgreSQL tests FAIL when `QUIPU_TEST_PG_URL` is unset. Start a throwaway server with
//!
//! ```text
//! scripts/pg-test.sh run -- cargo test --release --test store_suite
//! ```
//!
//! or `eval "$(scripts/pg-test.sh start)"`, run the tests, then `scripts/pg-test.sh stop`.
#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test helpers outside #[test] functions: a failed unwrap is a failed test"
)]

use quipu::keys;
use quipu::money::Pen;
use quipu::store::columns::{Column, LEDGER_COLUMNS, LEDGER_OTHER_COLUMNS, REJECT_COLUMNS};
use quipu::store::{
    self, KeyLimits, LeaseStore, LedgerRow, LedgerStore, NewKey, Store, StoreError, TenantId,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Fixtures

static SEQ: AtomicU32 = AtomicU32::new(0);

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{name}_{}_{}_{nanos}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// One empty database for one test; [`Fixture::open`] opens as many handles on it as the test
/// wants (each a separate connection or pool, like separate processes or replicas).
struct Fixture {
    url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    Dir(PathBuf),
    PgDatabase { admin_url: String, name: String },
}

impl Fixture {
    fn sqlite(test: &str) -> Fixture {
        let dir = std::env::temp_dir().join(unique(&format!("quipu-store-{test}")));
        // A directory that does not exist yet: opening must create it.
        let file = dir.join("nested").join("quipu.db");
        Fixture {
            url: format!("sqlite://{}", file.display()),
            cleanup: Cleanup::Dir(dir),
        }
    }

    async fn postgres(test: &str) -> Fixture {
        let admin_url = std::env::var("QUIPU_TEST_PG_URL").unwrap_or_default();
        assert!(
            !admin_url.is_empty(),
            "QUIPU_TEST_PG_URL is not set, so the PostgreSQL store tests cannot run. Start a \
             throwaway server and run them with:\n\n    \
             scripts/pg-test.sh run -- cargo test --release --test store_suite\n\n\
             (or: eval \"$(scripts/pg-test.sh start)\"; cargo test --release --test store_suite; \
             scripts/pg-test.sh stop)"
        );
        let name = unique(&format!("quipu_{test}")).to_lowercase();
        let admin = admin_client(&admin_url).await;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap();
        Fixture {
            url: with_database(&admin_url, &name),
            cleanup: Cleanup::PgDatabase { admin_url, name },
        }
    }

    async fn open(&self) -> Arc<dyn Store> {
        match store::open(&self.url).await {
            Ok(s) => s,
            Err(e) => panic!("cannot open {}: {e}", self.url),
        }
    }

    /// Everything the store persisted about keys, as text, to check what it holds.
    async fn stored_key_material(&self) -> String {
        match &self.cleanup {
            Cleanup::Dir(dir) => {
                let mut all = Vec::new();
                for entry in walk(dir) {
                    all.extend(std::fs::read(entry).unwrap_or_default());
                }
                String::from_utf8_lossy(&all).into_owned()
            }
            Cleanup::PgDatabase { .. } => {
                let c = admin_client(&self.url).await;
                let row = c
                    .query_one(
                        "SELECT COALESCE(string_agg(row_to_json(k)::text, E'\\n'), '') FROM api_keys k",
                        &[],
                    )
                    .await
                    .unwrap();
                row.get(0)
            }
        }
    }

    /// The columns of `table` as the migrations made it: (name, type, nullable), by name.
    async fn table_columns(&self, table: &str) -> Vec<(String, String, bool)> {
        let mut cols: Vec<(String, String, bool)> = match &self.cleanup {
            Cleanup::Dir(_) => {
                let path = self.url.strip_prefix("sqlite://").unwrap();
                let c = rusqlite::Connection::open(path).unwrap();
                let mut stmt = c
                    .prepare(&format!(
                        "SELECT name, type, \"notnull\", pk FROM pragma_table_info('{table}')"
                    ))
                    .unwrap();
                let rows = stmt
                    .query_map([], |r| {
                        let (not_null, pk): (i64, i64) = (r.get(2)?, r.get(3)?);
                        // A STRICT table's primary key is never NULL, declared so or not.
                        Ok((r.get(0)?, r.get(1)?, not_null == 0 && pk == 0))
                    })
                    .unwrap();
                rows.collect::<Result<_, _>>().unwrap()
            }
            Cleanup::PgDatabase { .. } => {
                let c = admin_client(&self.url).await;
                c.query(
                    "SELECT column_name::text, data_type::text, is_nullable = 'YES'
                       FROM information_schema.columns
                      WHERE table_schema = current_schema() AND table_name = $1",
                    &[&table],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect()
            }
        };
        cols.sort();
        cols
    }

    /// `columns` as [`Fixture::table_columns`] shows them on this backend, by name.
    fn expected_columns<'a>(
        &self,
        columns: impl IntoIterator<Item = &'a Column>,
    ) -> Vec<(String, String, bool)> {
        let sqlite = matches!(self.cleanup, Cleanup::Dir(_));
        let mut cols: Vec<(String, String, bool)> = columns
            .into_iter()
            .map(|c| {
                let ty = if sqlite { c.sqlite_type } else { c.pg_type };
                (c.name.to_owned(), ty.to_owned(), c.nullable)
            })
            .collect();
        cols.sort();
        cols
    }

    async fn finish(self) {
        match self.cleanup {
            Cleanup::Dir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Cleanup::PgDatabase { admin_url, name } => {
                let admin = admin_client(&admin_url).await;
                let _ = admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await;
            }
        }
    }
}

fn walk(dir: &PathBuf) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

async fn admin_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to QUIPU_TEST_PG_URL ({url}): {e}"));
    tokio::spawn(conn);
    client
}

/// `postgres://u@h:p/db?x` with its database replaced.
fn with_database(url: &str, db: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (main, query) = match rest.split_once('?') {
        Some((m, q)) => (m, format!("?{q}")),
        None => (rest, String::new()),
    };
    let authority = main.split('/').next().unwrap();
    format!("{scheme}://{authority}/{db}{query}")
}

/// Generates each named test once per backend.
macro_rules! store_suite {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    let fx = super::Fixture::sqlite(stringify!($test));
                    super::$test(&fx).await;
                    fx.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $test() {
                    let fx = super::Fixture::postgres(stringify!($test)).await;
                    super::$test(&fx).await;
                    fx.finish().await;
                }
            )*
        }
    };
}

store_suite!(
    migrations_run_once_and_reopen,
    ledger_columns_match_the_migrated_table,
    tenants,
    keys_store_only_hashes_and_move_the_version,
    top_ups,
    record_is_atomic_and_idempotent,
    concurrent_replays_charge_once,
    concurrent_leases_never_exceed_the_balance,
    record_reduces_lease_and_balance,
    stale_leases_are_reclaimed,
    statement_totals_equal_the_ledger,
    balance_beyond_i64_round_trips,
    sums_of_large_entries_do_not_overflow,
    top_ups_with_an_idempotency_key_credit_once,
    invalid_rows_are_refused_as_invalid_and_set_aside,
    two_replicas_never_spend_more_than_the_balance,
    heartbeats_reconcile_local_leases_with_the_store,
    a_lease_unconfirmed_past_the_fence_admits_nothing,
    returning_an_idle_lease_never_races_an_admission,
    a_dry_tenant_costs_one_lease_call_not_one_per_refusal,
    a_store_down_at_shutdown_spills_and_the_import_charges_once,
    usage_equals_the_ledger_for_any_period_and_grouping,
    keys_requests_and_top_ups_are_paged_per_tenant,
    the_migration_sums_an_existing_ledger,
    usage_queries_use_indexes,
    stored_responses_belong_to_their_tenant_and_are_pruned,
    shared_rate_windows_never_grant_past_the_limit,
    a_low_balance_is_leased_in_shares,
    idle_leases_come_home_when_another_replica_is_short,
    replicas_short_at_once_pool_their_idle_leases,
    lease_rows_answer_with_one_consistent_reading,
    a_stale_lease_is_zeroed_and_kept_then_forgotten,
    a_heartbeat_between_a_write_and_its_answer_counts_the_charge_once,
    cap_leases_answer_like_balance_leases,
    three_replicas_never_spend_past_a_cap,
    a_cap_refusal_holds_nothing,
    a_top_up_writes_its_event_once,
    a_balance_falling_below_its_threshold_alerts_once_per_crossing,
    one_sender_at_a_time_and_deliveries_end_once,
    expiring_keys_are_found_and_noticed_once,
);

#[path = "store_suite/caps.rs"]
mod caps;
use caps::{
    a_cap_refusal_holds_nothing, cap_leases_answer_like_balance_leases,
    three_replicas_never_spend_past_a_cap,
};

#[path = "store_suite/webhooks.rs"]
mod webhooks;
use webhooks::{
    a_balance_falling_below_its_threshold_alerts_once_per_crossing, a_top_up_writes_its_event_once,
    expiring_keys_are_found_and_noticed_once, one_sender_at_a_time_and_deliveries_end_once,
};

#[path = "store_suite/leases.rs"]
mod leases;
use leases::{
    a_heartbeat_between_a_write_and_its_answer_counts_the_charge_once,
    a_stale_lease_is_zeroed_and_kept_then_forgotten, lease_rows_answer_with_one_consistent_reading,
};

#[path = "store_suite/usage.rs"]
mod usage;
use usage::{
    keys_requests_and_top_ups_are_paged_per_tenant, the_migration_sums_an_existing_ledger,
    usage_equals_the_ledger_for_any_period_and_grouping, usage_queries_use_indexes,
};

// ---------------------------------------------------------------------------------------------
// Helpers

fn soles(text: &str) -> Pen {
    Pen::parse(text, 12).unwrap()
}

async fn tenant_with(s: &dyn Store, name: &str, balance: &str) -> TenantId {
    let t = s.create_tenant(name).await.unwrap();
    if soles(balance) > Pen::ZERO {
        s.top_up(t.id, soles(balance), "test").await.unwrap();
    }
    t.id
}

fn row(id: &str, tenant: TenantId, at: i64, model: &str, charge: Pen) -> LedgerRow {
    LedgerRow {
        request_id: id.to_owned(),
        at,
        tenant_id: tenant,
        key_id: "key_000000000001".into(),
        model: model.to_owned(),
        format: "messages".into(),
        input_tokens: 1200,
        cached_tokens: 200,
        output_tokens: 345,
        charge,
        status: "ok".into(),
        http_status: 200,
        unbilled: Pen::ZERO,
        input_estimated: false,
        caps: Vec::new(),
    }
}

/// A deterministic spread of values (no external RNG crate needed).
fn lcg(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *seed >> 11
}

// ---------------------------------------------------------------------------------------------
// The suite

async fn migrations_run_once_and_reopen(fx: &Fixture) {
    // Two processes opening a new database at once: migrations apply once, both succeed.
    let (a, b) = tokio::join!(fx.open(), fx.open());
    let t = a.create_tenant("acme").await.unwrap();
    assert_eq!(b.tenant_by_name("acme").await.unwrap(), Some(t.clone()));
    let v = a.keys_version().await.unwrap();
    drop((a, b));
    // Reopening migrates nothing and keeps the data.
    let c = fx.open().await;
    assert_eq!(c.tenant_by_name("acme").await.unwrap(), Some(t));
    assert_eq!(c.keys_version().await.unwrap(), v);
}

/// The column lists both stores build their statements from (`store::columns`) are the
/// migrated tables' columns, with their types and nullability: a migration that adds a column
/// without its entry in the list (or the other way round) fails here.
async fn ledger_columns_match_the_migrated_table(fx: &Fixture) {
    drop(fx.open().await);
    assert_eq!(
        fx.table_columns("ledger").await,
        fx.expected_columns(LEDGER_COLUMNS.iter().chain(LEDGER_OTHER_COLUMNS)),
        "store::columns::LEDGER_COLUMNS (with LEDGER_OTHER_COLUMNS) against the ledger table"
    );
    assert_eq!(
        fx.table_columns("ledger_rejects").await,
        fx.expected_columns(REJECT_COLUMNS),
        "store::columns::REJECT_COLUMNS against the ledger_rejects table"
    );
}

async fn tenants(fx: &Fixture) {
    let s = fx.open().await;
    let v0 = s.keys_version().await.unwrap();
    let a = s.create_tenant("acme").await.unwrap();
    let b = s.create_tenant("beta").await.unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(a.name, "acme");
    assert!((a.created_at - store::now_ms()).abs() < 60_000);
    assert!(
        s.keys_version().await.unwrap() > v0,
        "creating a tenant moves the keys version"
    );

    match s.create_tenant("acme").await {
        Err(StoreError::Conflict(m)) => assert!(m.contains("acme"), "{m}"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(s.tenant_by_name("beta").await.unwrap(), Some(b.clone()));
    assert_eq!(s.tenant_by_name("nobody").await.unwrap(), None);

    let list = s.list_tenants().await.unwrap();
    let names: Vec<&str> = list.iter().map(|t| t.tenant.name.as_str()).collect();
    assert_eq!(names, ["acme", "beta"]);
    assert!(list
        .iter()
        .all(|t| t.balance == Pen::ZERO && t.leased == Pen::ZERO && t.active_keys == 0));

    let missing = 987_654;
    assert!(matches!(
        s.balance(missing).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.top_up(missing, soles("1"), "").await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.statement(missing, None, None).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.acquire_lease("r1", missing, soles("1")).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.list_keys(Some(missing)).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn keys_store_only_hashes_and_move_the_version(fx: &Fixture) {
    let s = fx.open().await;
    let acme = s.create_tenant("acme").await.unwrap();
    let beta = s.create_tenant("beta").await.unwrap();
    let v0 = s.keys_version().await.unwrap();

    let (secret, id, hash, prefix) = keys::generate_key();
    let limits = KeyLimits {
        requests_per_minute: Some(60),
        tokens_per_minute: Some(100_000),
    };
    let info = s
        .create_key(NewKey {
            id: id.clone(),
            tenant: acme.id,
            label: "laptop".into(),
            secret_hash: hash,
            secret_prefix: prefix.clone(),
            limits,
            rules: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(info.id, id);
    assert_eq!(info.tenant_name, "acme");
    assert_eq!(info.secret_prefix, prefix);
    assert_eq!(info.limits, limits);
    assert_eq!(info.revoked_at, None);
    let v1 = s.keys_version().await.unwrap();
    assert!(v1 > v0, "creating a key moves the keys version");

    // The store never saw the secret, only its hash and prefix.
    let stored = fx.stored_key_material().await;
    assert!(stored.contains(&prefix), "the prefix is stored");
    assert!(
        !stored.contains(&secret[keys::DISPLAY_PREFIX_CHARS..]),
        "the secret must not be stored"
    );

    let (v, active) = s.active_keys().await.unwrap();
    assert_eq!(v, v1);
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].secret_hash, keys::hash_secret(&secret));
    assert_eq!(active[0].key_id, id);
    assert_eq!(active[0].tenant_id, acme.id);
    assert_eq!(active[0].tenant_name, "acme");
    assert_eq!(active[0].limits, limits);

    // Same id, or same secret: conflict, and nothing changes.
    let (_, id2, hash2, prefix2) = keys::generate_key();
    for (kid, khash) in [(id.clone(), hash2), (id2.clone(), hash)] {
        let r = s
            .create_key(NewKey {
                id: kid,
                tenant: acme.id,
                label: String::new(),
                secret_hash: khash,
                secret_prefix: prefix2.clone(),
                limits: KeyLimits::default(),
                rules: Default::default(),
            })
            .await;
        assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    }
    assert_eq!(s.keys_version().await.unwrap(), v1);
    let r = s
        .create_key(NewKey {
            id: id2.clone(),
            tenant: 987_654,
            label: String::new(),
            secret_hash: hash2,
            secret_prefix: prefix2.clone(),
            limits: KeyLimits::default(),
            rules: Default::default(),
        })
        .await;
    assert!(matches!(r, Err(StoreError::NotFound(_))), "{r:?}");

    let other = s
        .create_key(NewKey {
            id: id2.clone(),
            tenant: beta.id,
            label: "ci".into(),
            secret_hash: hash2,
            secret_prefix: prefix2,
            limits: KeyLimits::default(),
            rules: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(other.limits, KeyLimits::default());
    assert_eq!(s.list_keys(None).await.unwrap().len(), 2);
    let only_beta = s.list_keys(Some(beta.id)).await.unwrap();
    assert_eq!(only_beta.len(), 1);
    assert_eq!(only_beta[0].id, id2);
    let summary = s.list_tenants().await.unwrap();
    assert!(summary.iter().all(|t| t.active_keys == 1));

    // Revoke: the version moves once; revoking again changes nothing.
    let v2 = s.keys_version().await.unwrap();
    assert!(s.revoke_key(&id).await.unwrap());
    let v3 = s.keys_version().await.unwrap();
    assert!(v3 > v2, "revoking moves the keys version");
    assert!(!s.revoke_key(&id).await.unwrap());
    assert_eq!(s.keys_version().await.unwrap(), v3);
    assert!(matches!(
        s.revoke_key("key_doesnotexist").await,
        Err(StoreError::NotFound(_))
    ));
    let (v, active) = s.active_keys().await.unwrap();
    assert_eq!(v, v3);
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].key_id, id2);
    let listed = s.list_keys(Some(acme.id)).await.unwrap();
    assert!(listed[0].revoked_at.is_some());

    // Another handle (another replica) sees the same version.
    let s2 = fx.open().await;
    assert_eq!(s2.keys_version().await.unwrap(), v3);
}

async fn top_ups(fx: &Fixture) {
    let s = fx.open().await;
    let t = s.create_tenant("acme").await.unwrap().id;
    let a = s.top_up(t, soles("10.00"), "first").await.unwrap();
    assert!(a.id.starts_with("topup_"));
    assert_eq!(a.amount, soles("10.00"));
    assert_eq!(a.note, "first");
    assert_eq!(a.tenant_id, t);
    let b = s
        .top_up(t, Pen::from_picos(1), "one pico-sol")
        .await
        .unwrap();
    assert_ne!(a.id, b.id);
    let bal = s.balance(t).await.unwrap();
    assert_eq!(bal.balance, soles("10.000000000001"));
    assert_eq!(bal.leased, Pen::ZERO);

    for bad in [Pen::ZERO, -soles("1")] {
        assert!(s.top_up(t, bad, "").await.is_err(), "{bad:?}");
    }
    assert_eq!(
        s.balance(t).await.unwrap().balance,
        soles("10.000000000001")
    );

    let st = s.statement(t, None, None).await.unwrap();
    assert_eq!(st.top_ups.len(), 2);
    // Entries of the same millisecond come in id order, so look the top-up up by id.
    let first = st.top_ups.iter().find(|u| u.id == a.id).unwrap();
    assert_eq!(first, &a);
    assert_eq!(st.total_top_ups, soles("10.000000000001"));
    assert_eq!(st.total_charges, Pen::ZERO);
    assert_eq!(st.balance, soles("10.000000000001"));
    assert!(st.per_model.is_empty());
    // Top-ups are journal entries but not request rows.
    assert!(s.ledger_rows(Some(t)).await.unwrap().is_empty());
}

async fn record_is_atomic_and_idempotent(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "100").await;
    let base = store::now_ms() - 10_000;
    let batch: Vec<LedgerRow> = (0..5)
        .map(|i| {
            row(
                &format!("req-{i}"),
                t,
                base + i,
                "colibri",
                Pen::from_picos(1_050_000 * (i as i128 + 1)),
            )
        })
        .collect();
    assert_eq!(s.record("r1", &batch).await.unwrap().new, 5);
    let after_first = s.balance(t).await.unwrap().balance;
    // Replaying the batch (the writer retrying after a timeout) inserts and charges nothing.
    assert_eq!(s.record("r1", &batch).await.unwrap().new, 0);
    assert_eq!(s.record("r2", &batch).await.unwrap().new, 0);
    assert_eq!(s.balance(t).await.unwrap().balance, after_first);

    // Old rows, new rows and a repeat inside one batch: only the new ones count, once.
    let mut mixed = batch[3..].to_vec();
    mixed.push(row("req-5", t, base + 5, "aguila", soles("0.5")));
    mixed.push(row("req-6", t, base + 6, "aguila", soles("0.25")));
    mixed.push(row("req-5", t, base + 7, "aguila", soles("99")));
    assert_eq!(s.record("r1", &mixed).await.unwrap().new, 2);

    let mut expected: Vec<LedgerRow> = batch.clone();
    expected.push(mixed[2].clone());
    expected.push(mixed[3].clone());
    let charged: Pen = expected.iter().map(|r| r.charge).sum();
    assert_eq!(s.balance(t).await.unwrap().balance, soles("100") - charged);
    assert_eq!(s.ledger_rows(Some(t)).await.unwrap(), expected);
    assert_eq!(s.ledger_rows(None).await.unwrap(), expected);
    assert_eq!(s.record("r1", &[]).await.unwrap().new, 0);

    // A batch is all or nothing: one bad row (unknown tenant, negative charge) and none of
    // the others is written.
    let other = tenant_with(&*s, "beta", "1").await;
    let before = s.balance(other).await.unwrap();
    for bad in [
        row("req-x2", 987_654, base, "colibri", soles("1")),
        row("req-x2", other, base, "colibri", -soles("1")),
    ] {
        let r = s
            .record(
                "r1",
                &[row("req-x1", other, base, "colibri", soles("0.1")), bad],
            )
            .await;
        assert!(r.is_err(), "{r:?}");
    }
    assert_eq!(s.balance(other).await.unwrap(), before);
    assert!(s.ledger_rows(Some(other)).await.unwrap().is_empty());
}

async fn concurrent_replays_charge_once(fx: &Fixture) {
    let handles = [fx.open().await, fx.open().await, fx.open().await];
    let t = tenant_with(&*handles[0], "acme", "1000").await;
    let base = store::now_ms() - 60_000;
    let rows: Vec<LedgerRow> = (0..60)
        .map(|i| {
            row(
                &format!("req-{i}"),
                t,
                base + i,
                "apu",
                Pen::from_picos(123_456_789 + i as i128),
            )
        })
        .collect();
    // Overlapping batches from three replicas at once.
    let mut tasks = Vec::new();
    for k in 0..12usize {
        let s = Arc::clone(&handles[k % 3]);
        let start = (k * 5) % 40;
        let chunk = rows[start..start + 20].to_vec();
        tasks.push(tokio::spawn(async move {
            s.record(&format!("r{}", k % 3), &chunk).await.unwrap().new
        }));
    }
    let mut inserted = 0;
    for task in tasks {
        inserted += task.await.unwrap();
    }
    let covered: std::collections::BTreeSet<usize> = (0..12usize)
        .flat_map(|k| ((k * 5) % 40)..((k * 5) % 40 + 20))
        .collect();
    assert_eq!(inserted, covered.len() as u64);
    let charged: Pen = covered.iter().map(|i| rows[*i].charge).sum();
    let s = &handles[0];
    assert_eq!(s.balance(t).await.unwrap().balance, soles("1000") - charged);
    assert_eq!(s.ledger_rows(Some(t)).await.unwrap().len(), covered.len());
}

async fn concurrent_leases_never_exceed_the_balance(fx: &Fixture) {
    // Three replicas, each with its own connection(s).
    let handles = [fx.open().await, fx.open().await, fx.open().await];
    let t = tenant_with(&*handles[0], "acme", "10.00").await;
    let want = soles("0.37");
    let mut tasks = Vec::new();
    for i in 0..50usize {
        let s = Arc::clone(&handles[i % 3]);
        tasks.push(tokio::spawn(async move {
            let replica = format!("replica-{}", i % 3);
            (
                replica.clone(),
                s.acquire_lease(&replica, t, want).await.unwrap(),
            )
        }));
    }
    let mut granted: BTreeMap<String, Pen> = BTreeMap::new();
    for task in tasks {
        let (replica, g) = task.await.unwrap();
        assert!(g >= Pen::ZERO && g <= want, "{g:?}");
        *granted.entry(replica).or_default() += g;
    }
    let total: Pen = granted.values().copied().sum();
    // 50 × 0.37 = 18.50 was asked for 10.00: exactly the balance is granted, never more.
    assert_eq!(total, soles("10.00"));
    let b = handles[1].balance(t).await.unwrap();
    assert_eq!(b.leased, total);
    assert_eq!(b.balance, soles("10.00"));
    assert_eq!(
        handles[2]
            .acquire_lease("replica-9", t, soles("1"))
            .await
            .unwrap(),
        Pen::ZERO
    );

    // Releases and acquisitions racing: Σ leases ≤ balance throughout and at the end.
    let mut tasks = Vec::new();
    for i in 0..60usize {
        let s = Arc::clone(&handles[i % 3]);
        tasks.push(tokio::spawn(async move {
            let replica = format!("replica-{}", i % 3);
            if i % 2 == 0 {
                s.release_lease(&replica, t, soles("0.21")).await.unwrap();
            } else {
                s.acquire_lease(&replica, t, soles("0.5")).await.unwrap();
            }
            let b = s.balance(t).await.unwrap();
            assert!(b.leased <= b.balance, "{b:?}");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let b = handles[0].balance(t).await.unwrap();
    assert!(b.leased <= b.balance, "{b:?}");
    let list = handles[0].list_tenants().await.unwrap();
    assert_eq!(list[0].leased, b.leased);
}

/// `Σ leases ≤ balance`, read in one call.
async fn assert_leases_covered(s: &dyn Store, t: TenantId, context: &str) -> store::Balance {
    let b = s.balance(t).await.unwrap();
    assert!(
        b.leased <= b.balance && b.balance >= Pen::ZERO,
        "{context}: leases {} exceed the balance {}",
        b.leased.to_decimal(),
        b.balance.to_decimal()
    );
    b
}

async fn record_reduces_lease_and_balance(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "10").await;
    let now = store::now_ms();
    // Two replicas hold the whole balance between them.
    assert_eq!(
        s.acquire_lease("r1", t, soles("4")).await.unwrap(),
        soles("4")
    );
    assert_eq!(
        s.acquire_lease("r2", t, soles("100")).await.unwrap(),
        soles("6")
    );
    assert_leases_covered(&*s, t, "after leasing").await;

    // A charge lowers the balance and the recording replica's lease alike, so the other
    // replica's lease stays covered.
    assert_eq!(
        s.record("r1", &[row("a", t, now, "colibri", soles("1.5"))])
            .await
            .unwrap()
            .new,
        1
    );
    let b = assert_leases_covered(&*s, t, "after r1's charge").await;
    assert_eq!((b.balance, b.leased), (soles("8.5"), soles("8.5")));
    s.record("r2", &[row("b", t, now, "colibri", soles("6"))])
        .await
        .unwrap();
    let b = assert_leases_covered(&*s, t, "after r2 spent its whole lease").await;
    assert_eq!((b.balance, b.leased), (soles("2.5"), soles("2.5")));
    // Nothing is left to lease while r1 holds the rest.
    assert_eq!(
        s.acquire_lease("r2", t, soles("1")).await.unwrap(),
        Pen::ZERO
    );

    // r1 gives part back; r2 takes it; both spend; the invariant holds at every step.
    s.release_lease("r1", t, soles("1")).await.unwrap();
    assert_leases_covered(&*s, t, "after a release").await;
    assert_eq!(
        s.acquire_lease("r2", t, soles("100")).await.unwrap(),
        soles("1")
    );
    s.record("r2", &[row("c", t, now, "colibri", soles("0.25"))])
        .await
        .unwrap();
    s.record("r1", &[row("d", t, now, "colibri", soles("1.5"))])
        .await
        .unwrap();
    let b = assert_leases_covered(&*s, t, "after both spent").await;
    assert_eq!((b.balance, b.leased), (soles("0.75"), soles("0.75")));
    // Replaying charges moves nothing.
    s.record(
        "r1",
        &[
            row("a", t, now, "colibri", soles("1.5")),
            row("d", t, now, "colibri", soles("1.5")),
        ],
    )
    .await
    .unwrap();
    assert_eq!(s.balance(t).await.unwrap(), b);

    // Releasing what one does not hold is harmless; releasing more than held empties it.
    s.release_lease("r9", t, soles("1")).await.unwrap();
    s.release_lease("r2", t, soles("100")).await.unwrap();
    let b = assert_leases_covered(&*s, t, "after r2 returned all").await;
    assert_eq!((b.balance, b.leased), (soles("0.75"), Pen::ZERO));
    // A heartbeat answers with the replica's leases as stored.
    let amounts = |v: Vec<(TenantId, store::LeaseReading)>| {
        v.into_iter()
            .map(|(t, r)| (t, r.amount))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        amounts(s.heartbeat("r1").await.unwrap()),
        vec![(t, Pen::ZERO)]
    );
    assert_eq!(
        amounts(s.heartbeat("r2").await.unwrap()),
        vec![(t, Pen::ZERO)]
    );
    assert!(s.heartbeat("r9").await.unwrap().is_empty());

    // A replica without a lease still records: the balance drops, no lease moves.
    assert_eq!(
        s.acquire_lease("r1", t, soles("0.5")).await.unwrap(),
        soles("0.5")
    );
    s.record("r3", &[row("e", t, now, "colibri", soles("0.25"))])
        .await
        .unwrap();
    let b = assert_leases_covered(&*s, t, "after an unleased charge").await;
    assert_eq!((b.balance, b.leased), (soles("0.5"), soles("0.5")));
    // A charge beyond the recording replica's lease empties it, not below zero. (Quipu never
    // records one: `Accounts` caps every charge at its reservation, which its lease covers.)
    s.record("r1", &[row("f", t, now, "colibri", soles("0.5"))])
        .await
        .unwrap();
    let b = assert_leases_covered(&*s, t, "at the end").await;
    assert_eq!((b.balance, b.leased), (Pen::ZERO, Pen::ZERO));
}

async fn stale_leases_are_reclaimed(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "10").await;
    let u = tenant_with(&*s, "beta", "10").await;
    s.acquire_lease("dead", t, soles("1")).await.unwrap();
    s.acquire_lease("alive", t, soles("2")).await.unwrap();
    s.acquire_lease("alive", u, soles("3")).await.unwrap();
    // Time passing is the point here and below: leases older than the threshold are stale.
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.heartbeat("alive").await.unwrap();
    assert_eq!(s.reclaim_stale_leases(350).await.unwrap(), 1);
    assert_eq!(s.balance(t).await.unwrap().leased, soles("2"));
    assert_eq!(s.balance(u).await.unwrap().leased, soles("3"));
    assert_eq!(s.reclaim_stale_leases(60_000).await.unwrap(), 0);
    // The reclaimed money can be leased again.
    assert_eq!(
        s.acquire_lease("new", t, soles("100")).await.unwrap(),
        soles("8")
    );

    s.drop_leases("alive").await.unwrap();
    assert_eq!(s.balance(t).await.unwrap().leased, soles("8"));
    assert_eq!(s.balance(u).await.unwrap().leased, Pen::ZERO);
    // Acquiring refreshes the heartbeat, whether it grants something or nothing.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        s.acquire_lease("new", t, soles("2")).await.unwrap(),
        soles("2")
    );
    assert_eq!(s.reclaim_stale_leases(350).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        s.acquire_lease("new", t, soles("1")).await.unwrap(),
        Pen::ZERO
    );
    assert_eq!(s.reclaim_stale_leases(350).await.unwrap(), 0);
    assert_eq!(s.balance(t).await.unwrap().leased, soles("10"));
}

async fn statement_totals_equal_the_ledger(fx: &Fixture) {
    let s = fx.open().await;
    let a = tenant_with(&*s, "acme", "5000").await;
    let b = tenant_with(&*s, "beta", "5000").await;
    let base = 1_700_000_000_000i64;
    let models = ["aguila", "apu", "colibri"];
    let mut seed = 42u64;
    let mut rows = Vec::new();
    for i in 0..400i64 {
        let tenant = if i % 7 == 0 { b } else { a };
        let mut r = row(
            &format!("req-{i:04}"),
            tenant,
            base + i * 1_000,
            models[(lcg(&mut seed) % 3) as usize],
            // Up to ~S/ 2 each, with every pico significant.
            Pen::from_picos(i128::from(lcg(&mut seed) % 2_000_000_000_000)),
        );
        r.input_tokens = lcg(&mut seed) % 200_000;
        r.cached_tokens = r.input_tokens / 3;
        r.output_tokens = lcg(&mut seed) % 32_000;
        rows.push(r);
    }
    for chunk in rows.chunks(64) {
        s.record("r1", chunk).await.unwrap();
    }

    let check = |from: Option<i64>, to: Option<i64>| {
        let mut per_model: BTreeMap<&str, (u64, u64, u64, u64, Pen)> = BTreeMap::new();
        for r in rows.iter().filter(|r| {
            r.tenant_id == a && from.is_none_or(|f| r.at >= f) && to.is_none_or(|t| r.at < t)
        }) {
            let e = per_model.entry(r.model.as_str()).or_default();
            e.0 += 1;
            e.1 += r.input_tokens;
            e.2 += r.cached_tokens;
            e.3 += r.output_tokens;
            e.4 += r.charge;
        }
        per_model
    };
    for (from, to) in [
        (None, None),
        // Bounds fall exactly on rows: `from` is included, `to` excluded.
        (Some(base + 100_000), Some(base + 200_000)),
        (Some(base + 350_000), None),
        (None, Some(base + 1)),
    ] {
        let st = s.statement(a, from, to).await.unwrap();
        let expected = check(from, to);
        let got: BTreeMap<&str, (u64, u64, u64, u64, Pen)> = st
            .per_model
            .iter()
            .map(|m| {
                (
                    m.model.as_str(),
                    (
                        m.requests,
                        m.input_tokens,
                        m.cached_tokens,
                        m.output_tokens,
                        m.charge,
                    ),
                )
            })
            .collect();
        assert_eq!(got, expected, "period {from:?}..{to:?}");
        let total: Pen = expected.values().map(|e| e.4).sum();
        assert_eq!(st.total_charges, total, "period {from:?}..{to:?}");
        assert_eq!((st.from, st.to), (from, to));
        assert_eq!(st.tenant.id, a);
    }
    let st = s.statement(a, None, None).await.unwrap();
    let from_ledger: Pen = s
        .ledger_rows(Some(a))
        .await
        .unwrap()
        .iter()
        .map(|r| r.charge)
        .sum();
    assert_eq!(st.total_charges, from_ledger);
    assert_eq!(st.total_top_ups, soles("5000"));
    assert_eq!(st.balance, soles("5000") - from_ledger);
    assert_eq!(s.balance(a).await.unwrap().balance, st.balance);
    // The top-up happened now, long after these rows: not in an old window.
    let old = s
        .statement(a, Some(base + 1_000), Some(base + 2_000))
        .await
        .unwrap();
    assert!(old.top_ups.is_empty());
    assert_eq!(old.total_top_ups, Pen::ZERO);
    assert_eq!(old.per_model.len(), 1);
}

async fn balance_beyond_i64_round_trips(fx: &Fixture) {
    let s = fx.open().await;
    let t = s.create_tenant("whale").await.unwrap().id;
    let max_entry = Pen::from_picos(i128::from(i64::MAX));
    // One entry may not exceed i64 pico-soles; the store refuses rather than truncates.
    assert!(s
        .top_up(t, max_entry + Pen::from_picos(1), "")
        .await
        .is_err());
    s.top_up(t, max_entry, "").await.unwrap();
    s.top_up(t, max_entry, "").await.unwrap();
    s.top_up(t, Pen::from_picos(7), "").await.unwrap();
    // 18,446,744.073709551621 soles: beyond i64 pico-soles, and above 10^7 soles.
    let expected = Pen::from_picos(2 * i128::from(i64::MAX) + 7);
    assert_eq!(expected.to_decimal(), "18446744.073709551621");
    assert_eq!(s.balance(t).await.unwrap().balance, expected);
    assert_eq!(s.list_tenants().await.unwrap()[0].balance, expected);
    let st = s.statement(t, None, None).await.unwrap();
    assert_eq!(st.total_top_ups, expected);
    assert_eq!(st.balance, expected);

    // Leases beyond i64 too.
    let big = soles("15000000.000000000003");
    assert_eq!(s.acquire_lease("r1", t, big).await.unwrap(), big);
    assert_eq!(s.balance(t).await.unwrap().leased, big);
    assert_eq!(
        s.acquire_lease("r2", t, expected).await.unwrap(),
        expected - big
    );
    s.record(
        "r1",
        &[row(
            "big",
            t,
            store::now_ms(),
            "apu",
            soles("0.000000000001"),
        )],
    )
    .await
    .unwrap();
    let b = s.balance(t).await.unwrap();
    assert_eq!(b.balance, expected - Pen::from_picos(1));
    assert_eq!(b.leased, expected - Pen::from_picos(1));
    assert_eq!(b.balance.to_decimal(), "18446744.07370955162");

    // And the value survives a reopen (it was stored, not cached).
    let again = fx.open().await;
    assert_eq!(again.balance(t).await.unwrap(), b);
}

async fn sums_of_large_entries_do_not_overflow(fx: &Fixture) {
    let s = fx.open().await;
    let t = s.create_tenant("whale").await.unwrap().id;
    let max_entry = Pen::from_picos(i128::from(i64::MAX));
    for _ in 0..40 {
        s.top_up(t, max_entry, "").await.unwrap();
    }
    let n = 40i128;
    let mut rows = Vec::new();
    for i in 0..n {
        let mut r = row(&format!("huge-{i}"), t, 1_000 + i as i64, "apu", max_entry);
        // 40 × 2^58 tokens overflow i64 (but not u64).
        r.input_tokens = 1 << 58;
        r.cached_tokens = 1 << 57;
        r.output_tokens = (1 << 58) - 1;
        rows.push(r);
    }
    assert_eq!(s.record("r1", &rows).await.unwrap().new, 40);
    let st = s.statement(t, None, None).await.unwrap();
    let total = Pen::from_picos(n * i128::from(i64::MAX));
    assert_eq!(st.total_top_ups, total);
    assert_eq!(st.total_charges, total);
    assert_eq!(st.per_model.len(), 1);
    let m = &st.per_model[0];
    assert_eq!(m.requests, 40);
    assert_eq!(m.charge, total);
    assert_eq!(m.input_tokens, 40 << 58);
    assert_eq!(m.cached_tokens, 40 << 57);
    assert_eq!(m.output_tokens, 40 * ((1u64 << 58) - 1));
    assert_eq!(st.balance, Pen::ZERO);
    assert_eq!(s.balance(t).await.unwrap().balance, Pen::ZERO);

    // Charges beyond the balance take it below zero, exactly.
    s.record("r1", &[row("one-more", t, 5_000, "apu", max_entry)])
        .await
        .unwrap();
    assert_eq!(s.balance(t).await.unwrap().balance, -max_entry);
    assert_eq!(
        s.acquire_lease("r1", t, soles("1")).await.unwrap(),
        Pen::ZERO
    );
}

async fn top_ups_with_an_idempotency_key_credit_once(fx: &Fixture) {
    let s = fx.open().await;
    let t = s.create_tenant("acme").await.unwrap().id;
    let u = s.create_tenant("beta").await.unwrap().id;
    let first = s
        .top_up_once(t, soles("25.00"), "bank transfer", Some("pay-123"))
        .await
        .unwrap();
    assert!(!first.replayed);
    assert_eq!(first.balance, soles("25.00"));
    // The retried call (a lost reply) credits nothing and answers with the first top-up.
    let again = s
        .top_up_once(t, soles("25.00"), "bank transfer", Some("pay-123"))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.top_up, first.top_up);
    assert_eq!(again.balance, soles("25.00"));
    // The same key for another amount or tenant is a conflict, not a credit.
    for (tenant, amount) in [(t, soles("30.00")), (u, soles("25.00"))] {
        let r = s.top_up_once(tenant, amount, "", Some("pay-123")).await;
        assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    }
    // Without a key every call credits; the balance comes back from the same transaction.
    let other = s.top_up_once(t, soles("10.00"), "", None).await.unwrap();
    assert_eq!(other.balance, soles("35.00"));
    assert!(matches!(
        s.top_up_once(t, soles("10.00"), "", Some("")).await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(s.balance(t).await.unwrap().balance, soles("35.00"));
    assert_eq!(s.balance(u).await.unwrap().balance, Pen::ZERO);
    let st = s.statement(t, None, None).await.unwrap();
    assert_eq!(st.top_ups.len(), 2);
    assert_eq!(st.total_top_ups, soles("35.00"));
}

async fn invalid_rows_are_refused_as_invalid_and_set_aside(fx: &Fixture) {
    let s = fx.open().await;
    let t = tenant_with(&*s, "acme", "10").await;
    let now = store::now_ms();
    let good = row("good", t, now, "colibri", soles("1"));
    let mut huge = row("huge", t, now, "colibri", soles("1"));
    huge.output_tokens = u64::MAX;
    let negative = row("negative", t, now, "colibri", -soles("1"));
    let orphan = row("orphan", 987_654, now, "colibri", soles("1"));
    // Invalid input is told apart from a failing database: retrying cannot help.
    for bad in [&huge, &negative] {
        let e = s
            .record("r1", &[good.clone(), bad.clone()])
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Invalid(_)), "{e:?}");
        assert!(!e.is_transient());
        assert!(store::validate_row(bad).is_err());
    }
    let e = s
        .record("r1", &[good.clone(), orphan.clone()])
        .await
        .unwrap_err();
    assert!(!e.is_transient(), "{e:?}");
    assert!(store::validate_row(&good).is_ok());
    assert!(s.ledger_rows(Some(t)).await.unwrap().is_empty());

    // The dead-letter table keeps the rows, once each, with every number intact.
    for bad in [&huge, &negative, &huge] {
        s.reject(bad, "does not fit").await.unwrap();
    }
    let rejected = s.rejected_rows().await.unwrap();
    let ids: std::collections::BTreeSet<&str> =
        rejected.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(ids, ["huge", "negative"].into_iter().collect());
    let h = rejected.iter().find(|r| r.request_id == "huge").unwrap();
    assert!(h.row_json.contains(&u64::MAX.to_string()), "{}", h.row_json);
    assert_eq!((h.tenant_id, h.reason.as_str()), (t, "does not fit"));

    // The good row, an unbilled amount and an estimated input round-trip.
    let mut flagged = good.clone();
    flagged.unbilled = Pen::from_picos(123_456_789);
    flagged.input_estimated = true;
    assert_eq!(s.record("r1", &[flagged.clone()]).await.unwrap().new, 1);
    assert_eq!(s.ledger_rows(Some(t)).await.unwrap(), vec![flagged]);
    assert_eq!(s.balance(t).await.unwrap().balance, soles("9"));
}

// ---------------------------------------------------------------------------------------------
// Stored responses (the Responses API's `store: true`)

fn stored(id: &str, tenant: TenantId, at: i64, bytes: usize) -> store::StoredResponse {
    store::StoredResponse {
        id: id.to_owned(),
        tenant_id: tenant,
        key_id: "key_000000000001".into(),
        model: "apu".into(),
        created_at: at,
        response: format!(
            "{{\"id\":\"{id}\",\"object\":\"response\",\"pad\":\"{}\"}}",
            "x".repeat(bytes)
        ),
        input_items: "[{\"type\":\"message\",\"role\":\"user\",\"content\":\"¡hola! \\u00e9\"}]"
            .into(),
    }
}

async fn stored_responses_belong_to_their_tenant_and_are_pruned(fx: &Fixture) {
    let s = fx.open().await;
    let a = tenant_with(s.as_ref(), "resp-a", "0").await;
    let b = tenant_with(s.as_ref(), "resp-b", "0").await;
    let now = store::now_ms();
    let first = stored("resp_1", a, now - 10_000, 10);
    assert_eq!(
        s.put_responses(&[Arc::new(first.clone())]).await.unwrap(),
        1
    );
    // Written again (a retried write): kept as it was, counted as not new.
    let mut again = first.clone();
    again.response = "{}".into();
    assert_eq!(s.put_responses(&[Arc::new(again)]).await.unwrap(), 0);
    assert_eq!(
        s.get_response(a, "resp_1").await.unwrap(),
        Some(first.clone()),
        "round trip, byte for byte"
    );
    // Another tenant's id reads as missing, and cannot be deleted.
    assert_eq!(s.get_response(b, "resp_1").await.unwrap(), None);
    assert!(!s.delete_response(b, "resp_1").await.unwrap());
    assert_eq!(s.get_response(a, "resp_nope").await.unwrap(), None);
    assert!(s.delete_response(a, "resp_1").await.unwrap());
    assert_eq!(s.get_response(a, "resp_1").await.unwrap(), None);
    assert!(!s.delete_response(a, "resp_1").await.unwrap());

    // Retention: older than `before` goes. The cap: each tenant keeps its newest that fit.
    let rows = [
        stored("resp_old", a, now - 100_000, 10),
        stored("resp_a1", a, now - 3_000, 1000),
        stored("resp_a2", a, now - 2_000, 1000),
        stored("resp_a3", a, now - 1_000, 1000),
        stored("resp_b1", b, now - 3_000, 1000),
    ]
    .map(Arc::new);
    assert_eq!(s.put_responses(&rows).await.unwrap(), 5);
    let cap = rows[2].size() + rows[3].size();
    assert_eq!(s.prune_responses(now - 50_000, cap).await.unwrap(), 2);
    for (id, t, kept) in [
        ("resp_old", a, false),
        ("resp_a1", a, false),
        ("resp_a2", a, true),
        ("resp_a3", a, true),
        ("resp_b1", b, true),
    ] {
        assert_eq!(s.get_response(t, id).await.unwrap().is_some(), kept, "{id}");
    }
    assert_eq!(s.prune_responses(now - 50_000, cap).await.unwrap(), 0);
}

// ---------------------------------------------------------------------------------------------
// Accounts (the replica's side of leases) over each backend

use quipu::billing::{Accounts, Refusal};
use quipu::store::{
    LeaseAsk, LeaseGrant, QuotaAsk, Recorded, RejectedRow, ReplicaSignal, TopUpOutcome,
};
use std::sync::atomic::{AtomicBool, AtomicU64};

/// Polls `done` until it holds; fails the test after 10 s (a wait for an event, never a
/// fixed sleep).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A store that can be made to fail, slowed down, and counts lease grants, lease returns
/// begun and ledger writes refused.
struct Rigged {
    inner: Arc<dyn Store>,
    down: AtomicBool,
    release_delay_ms: AtomicU64,
    grants: AtomicU64,
    releases: AtomicU64,
    refused_records: AtomicU64,
}

impl Rigged {
    fn new(inner: Arc<dyn Store>) -> Arc<Rigged> {
        Arc::new(Rigged {
            inner,
            down: AtomicBool::new(false),
            release_delay_ms: AtomicU64::new(0),
            grants: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            refused_records: AtomicU64::new(0),
        })
    }

    fn check(&self) -> store::StoreResult<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("rigged: down".into()));
        }
        Ok(())
    }
}

impl Store for Rigged {
    fn kind(&self) -> store::Backend {
        self.inner.kind()
    }
}

#[async_trait::async_trait]
impl store::TenantStore for Rigged {
    async fn create_tenant(&self, name: &str) -> store::StoreResult<store::Tenant> {
        self.inner.create_tenant(name).await
    }
    async fn tenant_rules(&self, tenant: TenantId) -> store::StoreResult<store::TenantRules> {
        self.inner.tenant_rules(tenant).await
    }
    async fn set_tenant_rules(
        &self,
        tenant: TenantId,
        rules: &store::TenantRules,
    ) -> store::StoreResult<()> {
        self.inner.set_tenant_rules(tenant, rules).await
    }
    async fn key(&self, key_id: &str) -> store::StoreResult<Option<store::KeyInfo>> {
        self.inner.key(key_id).await
    }
    async fn set_key(
        &self,
        key_id: &str,
        settings: &store::KeySettings,
    ) -> store::StoreResult<store::KeyInfo> {
        self.inner.set_key(key_id, settings).await
    }
    async fn rotate_key(
        &self,
        old_id: &str,
        new: NewKey,
        old_expires_at: i64,
    ) -> store::StoreResult<store::KeyInfo> {
        self.inner.rotate_key(old_id, new, old_expires_at).await
    }
    async fn tenant_by_name(&self, name: &str) -> store::StoreResult<Option<store::Tenant>> {
        self.inner.tenant_by_name(name).await
    }
    async fn list_tenants(&self) -> store::StoreResult<Vec<store::TenantSummary>> {
        self.inner.list_tenants().await
    }
    async fn create_key(&self, key: NewKey) -> store::StoreResult<store::KeyInfo> {
        self.inner.create_key(key).await
    }
    async fn revoke_key(&self, key_id: &str) -> store::StoreResult<bool> {
        self.inner.revoke_key(key_id).await
    }
    async fn list_keys(&self, tenant: Option<TenantId>) -> store::StoreResult<Vec<store::KeyInfo>> {
        self.inner.list_keys(tenant).await
    }
    async fn keys_version(&self) -> store::StoreResult<i64> {
        self.inner.keys_version().await
    }
    async fn active_keys(&self) -> store::StoreResult<(i64, Vec<store::ActiveKey>)> {
        self.inner.active_keys().await
    }
}

#[async_trait::async_trait]
impl store::LedgerStore for Rigged {
    async fn top_up_once(
        &self,
        tenant: TenantId,
        amount: Pen,
        note: &str,
        key: Option<&str>,
    ) -> store::StoreResult<TopUpOutcome> {
        self.inner.top_up_once(tenant, amount, note, key).await
    }
    async fn balance(&self, tenant: TenantId) -> store::StoreResult<store::Balance> {
        self.inner.balance(tenant).await
    }
    async fn record(&self, replica: &str, rows: &[LedgerRow]) -> store::StoreResult<Recorded> {
        if let Err(e) = self.check() {
            self.refused_records.fetch_add(1, Ordering::SeqCst);
            return Err(e);
        }
        self.inner.record(replica, rows).await
    }
    async fn reject(&self, row: &LedgerRow, reason: &str) -> store::StoreResult<()> {
        self.inner.reject(row, reason).await
    }
    async fn rejected_rows(&self) -> store::StoreResult<Vec<RejectedRow>> {
        self.inner.rejected_rows().await
    }
    async fn statement(
        &self,
        tenant: TenantId,
        from: Option<i64>,
        to: Option<i64>,
    ) -> store::StoreResult<store::Statement> {
        self.inner.statement(tenant, from, to).await
    }
    async fn ledger_rows(&self, tenant: Option<TenantId>) -> store::StoreResult<Vec<LedgerRow>> {
        self.inner.ledger_rows(tenant).await
    }
}

#[async_trait::async_trait]
impl store::LeaseStore for Rigged {
    async fn grant_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        ask: LeaseAsk,
    ) -> store::StoreResult<LeaseGrant> {
        self.grants.fetch_add(1, Ordering::SeqCst);
        self.check()?;
        self.inner.grant_lease(replica, tenant, ask).await
    }
    async fn release_lease(
        &self,
        replica: &str,
        tenant: TenantId,
        amount: Pen,
    ) -> store::StoreResult<Option<store::LeaseReading>> {
        self.check()?;
        self.releases.fetch_add(1, Ordering::SeqCst);
        // A slow store is the point: the return is under way for `delay`.
        let delay = self.release_delay_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        self.inner.release_lease(replica, tenant, amount).await
    }
    async fn heartbeat(
        &self,
        replica: &str,
    ) -> store::StoreResult<Vec<(TenantId, store::LeaseReading)>> {
        self.check()?;
        self.inner.heartbeat(replica).await
    }
    async fn grant_cap_lease(
        &self,
        replica: &str,
        pool: &store::CapPool,
        terms: store::CapTerms,
        ask: LeaseAsk,
    ) -> store::StoreResult<LeaseGrant> {
        self.check()?;
        self.inner.grant_cap_lease(replica, pool, terms, ask).await
    }
    async fn release_cap_lease(
        &self,
        replica: &str,
        pool: &store::CapPool,
        amount: Pen,
    ) -> store::StoreResult<Option<store::LeaseReading>> {
        self.check()?;
        self.inner.release_cap_lease(replica, pool, amount).await
    }
    async fn cap_heartbeat(
        &self,
        replica: &str,
    ) -> store::StoreResult<Vec<(store::CapPool, store::LeaseReading)>> {
        self.check()?;
        self.inner.cap_heartbeat(replica).await
    }
    async fn cap_spent(&self, pools: &[String]) -> store::StoreResult<Vec<(String, Pen, Pen)>> {
        self.inner.cap_spent(pools).await
    }
    async fn reclaim_stale_leases(&self, max_age_ms: i64) -> store::StoreResult<u64> {
        self.inner.reclaim_stale_leases(max_age_ms).await
    }
    async fn forget_silent_leases(&self, max_age_ms: i64) -> store::StoreResult<u64> {
        self.inner.forget_silent_leases(max_age_ms).await
    }
    async fn drop_leases(&self, replica: &str) -> store::StoreResult<()> {
        self.inner.drop_leases(replica).await
    }
    async fn take_quota(
        &self,
        asks: &[QuotaAsk],
    ) -> store::StoreResult<(Vec<store::QuotaGrant>, i64)> {
        self.check()?;
        self.inner.take_quota(asks).await
    }
    async fn expire_quota(&self, age_ms: i64) -> store::StoreResult<u64> {
        self.inner.expire_quota(age_ms).await
    }
}

#[async_trait::async_trait]
impl store::ResponseStore for Rigged {
    async fn put_responses(&self, rows: &[Arc<store::StoredResponse>]) -> store::StoreResult<u64> {
        self.inner.put_responses(rows).await
    }
    async fn get_response(
        &self,
        tenant: TenantId,
        id: &str,
    ) -> store::StoreResult<Option<store::StoredResponse>> {
        self.inner.get_response(tenant, id).await
    }
    async fn delete_response(&self, tenant: TenantId, id: &str) -> store::StoreResult<bool> {
        self.inner.delete_response(tenant, id).await
    }
    async fn prune_responses(&self, before: i64, max_bytes: u64) -> store::StoreResult<u64> {
        self.inner.prune_responses(before, max_bytes).await
    }
}

#[async_trait::async_trait]
impl store::ReplicaChannel for Rigged {
    async fn notify_replicas(&self, signal: &ReplicaSignal) -> store::StoreResult<bool> {
        self.inner.notify_replicas(signal).await
    }
    async fn listen_replicas(
        &self,
    ) -> store::StoreResult<Option<tokio::sync::mpsc::Receiver<ReplicaSignal>>> {
        self.inner.listen_replicas().await
    }
}

#[async_trait::async_trait]
impl store::UsageStore for Rigged {
    async fn usage(
        &self,
        q: &store::usage::UsageQuery,
    ) -> store::StoreResult<Vec<store::usage::UsageGroup>> {
        self.inner.usage(q).await
    }
    async fn account(
        &self,
        tenant: TenantId,
        key: Option<&str>,
        replica: &str,
    ) -> store::StoreResult<store::usage::AccountFacts> {
        self.inner.account(tenant, key, replica).await
    }
    async fn keys_page(
        &self,
        tenant: TenantId,
        after: Option<&store::usage::TimeCursor>,
        limit: usize,
    ) -> store::StoreResult<Vec<store::usage::KeyUsage>> {
        self.inner.keys_page(tenant, after, limit).await
    }
    async fn requests_page(
        &self,
        tenant: TenantId,
        before: Option<&store::usage::TimeCursor>,
        limit: usize,
    ) -> store::StoreResult<Vec<LedgerRow>> {
        self.inner.requests_page(tenant, before, limit).await
    }
    async fn top_ups_page(
        &self,
        tenant: TenantId,
        before: Option<&store::usage::TimeCursor>,
        limit: usize,
    ) -> store::StoreResult<Vec<store::TopUp>> {
        self.inner.top_ups_page(tenant, before, limit).await
    }
}

const FENCE: Duration = Duration::from_secs(15);

/// Records one settled charge of `accounts` as the ledger writer does.
async fn flush(s: &dyn Store, accounts: &Accounts, id: &str, t: TenantId, charge: Pen) {
    let r = row(id, t, store::now_ms(), "apu", charge);
    let sent = accounts.tick();
    let recorded = s.record(accounts.replica(), &[r]).await.unwrap();
    assert_eq!(recorded.new, 1);
    accounts.recorded(sent, &recorded);
}

async fn two_replicas_never_spend_more_than_the_balance(fx: &Fixture) {
    let (sa, sb) = (fx.open().await, fx.open().await);
    let t = tenant_with(&*sa, "acme", "10.00").await;
    // Small chunks so the replicas keep going back to the store for more.
    let a = Accounts::new(sa.clone(), "replica-a".into(), soles("0.70"), FENCE);
    let b = Accounts::new(sb.clone(), "replica-b".into(), soles("0.70"), FENCE);
    let cost = soles("0.30");
    let mut tasks = Vec::new();
    for i in 0..80usize {
        let (acc, s) = if i % 2 == 0 {
            (a.clone(), sa.clone())
        } else {
            (b.clone(), sb.clone())
        };
        tasks.push(tokio::spawn(async move {
            match acc.reserve(t, cost).await {
                Ok(r) => {
                    // Every request costs exactly its worst case.
                    assert_eq!(acc.settle(r, cost + soles("1")), cost, "capped");
                    flush(&*s, &acc, &format!("req-{i}"), t, cost).await;
                    let b = assert_leases_covered(&*s, t, "while spending").await;
                    assert!(b.balance >= Pen::ZERO);
                    true
                }
                Err(Refusal::Insufficient { .. }) => false,
                Err(e) => panic!("{e:?}"),
            }
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += u32::from(task.await.unwrap());
    }
    let bal = assert_leases_covered(&*sa, t, "at the end").await;
    let spent = Pen::from_picos(cost.picos() * i128::from(admitted));
    assert_eq!(bal.balance, soles("10.00") - spent);
    // What is left sits in the two leases, where each replica's own requests can use it:
    // one request at a time now spends until both replicas refuse, and then less than one
    // request's worth is left in each. (On SQLite a replica that found the store dry refuses
    // from memory for `DRY_MEMORY` — no channel tells it the other returned a lease — so the
    // loop starts after that.)
    tokio::time::sleep(quipu::billing::accounts::DRY_MEMORY).await;
    let mut i = 80;
    loop {
        let mut any = false;
        for (acc, s) in [(&a, &sa), (&b, &sb)] {
            if let Ok(r) = acc.reserve(t, cost).await {
                assert_eq!(acc.settle(r, cost), cost);
                flush(&**s, acc, &format!("req-{i}"), t, cost).await;
                i += 1;
                admitted += 1;
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    let bal = assert_leases_covered(&*sa, t, "at the end").await;
    let spent = Pen::from_picos(cost.picos() * i128::from(admitted));
    assert_eq!(bal.balance, soles("10.00") - spent);
    assert!(
        bal.balance < Pen::from_picos(cost.picos() * 2),
        "{} left after {admitted} admissions",
        bal.balance.to_decimal()
    );
    assert!(admitted >= 32, "{admitted}");
    // With every write answered, each replica's books are the store's, without a heartbeat.
    assert_eq!(a.view(t).lease + b.view(t).lease, bal.leased);
    a.heartbeat().await.unwrap();
    b.heartbeat().await.unwrap();
    assert_eq!(a.view(t).lease + b.view(t).lease, bal.leased);
    assert_eq!(bal.leased, bal.balance);
}

async fn heartbeats_reconcile_local_leases_with_the_store(fx: &Fixture) {
    let (sa, sb) = (fx.open().await, fx.open().await);
    let t = tenant_with(&*sa, "acme", "10.00").await;
    let a = Accounts::new(sa.clone(), "replica-a".into(), soles("4.00"), FENCE);
    let b = Accounts::new(sb.clone(), "replica-b".into(), soles("10.00"), FENCE);
    let r = a.reserve(t, soles("1.00")).await.unwrap();
    a.settle(r, soles("1.00"));
    flush(&*sa, &a, "one", t, soles("1.00")).await;
    // The chunk (4.00) is more than a quarter of the balance: a grant is a quarter, 2.50.
    assert_eq!(a.view(t).lease, soles("1.50"));
    a.heartbeat().await.unwrap();
    assert_eq!(
        a.view(t).lease,
        soles("1.50"),
        "a heartbeat keeps a true lease"
    );

    // Another replica reclaims a's lease (as if a had stopped heartbeating).
    assert_eq!(sb.reclaim_stale_leases(-60_000).await.unwrap(), 1);
    a.heartbeat().await.unwrap();
    assert_eq!(
        a.view(t).lease,
        Pen::ZERO,
        "a vanished lease is gone locally too"
    );
    // b leases everything; a can admit nothing more, and nobody holds more than exists.
    let r = b.reserve(t, soles("9.00")).await.unwrap();
    assert_eq!(
        a.reserve(t, soles("0.01")).await.unwrap_err(),
        Refusal::Insufficient {
            needed: soles("0.01"),
            available: Pen::ZERO
        }
    );
    b.settle(r, soles("9.00"));
    flush(&*sb, &b, "two", t, soles("9.00")).await;
    assert_leases_covered(&*sa, t, "after the reclaim").await;
    assert_eq!(sa.balance(t).await.unwrap().balance, Pen::ZERO);

    // A grant whose reply was lost (a timeout after the commit) is picked up, not leaked.
    sa.top_up(t, soles("5.00"), "").await.unwrap();
    assert_eq!(
        sa.acquire_lease("replica-a", t, soles("2.00"))
            .await
            .unwrap(),
        soles("2.00")
    );
    assert_eq!(a.view(t).lease, Pen::ZERO);
    a.heartbeat().await.unwrap();
    assert_eq!(a.view(t).lease, soles("2.00"));
    let r = a.reserve(t, soles("2.00")).await.unwrap();
    assert_eq!(sa.balance(t).await.unwrap().leased, soles("2.00"), "no I/O");
    a.settle(r, soles("0.50"));
    flush(&*sa, &a, "three", t, soles("0.50")).await;
    a.heartbeat().await.unwrap();
    assert_eq!(a.view(t).lease, soles("1.50"));
    assert_eq!(sa.balance(t).await.unwrap().leased, soles("1.50"));
}

async fn a_lease_unconfirmed_past_the_fence_admits_nothing(fx: &Fixture) {
    let s = Rigged::new(fx.open().await);
    let t = tenant_with(&*s, "acme", "20.00").await;
    let fence = Duration::from_millis(400);
    let a = Accounts::new(s.clone(), "replica-a".into(), soles("5.00"), fence);
    drop(a.reserve(t, soles("1.00")).await.unwrap());
    let grants = s.grants.load(Ordering::SeqCst);
    // The store goes away: within the fence the lease is still used, without I/O.
    s.down.store(true, Ordering::SeqCst);
    drop(a.reserve(t, soles("1.00")).await.unwrap());
    assert_eq!(s.grants.load(Ordering::SeqCst), grants);
    assert!(a.heartbeat().await.is_err());
    // Past the fence the lease may have been reclaimed: nothing is admitted against it (time
    // passing is the point).
    tokio::time::sleep(fence + Duration::from_millis(50)).await;
    let e = a.reserve(t, soles("1.00")).await.unwrap_err();
    assert!(matches!(e, Refusal::StoreUnavailable(_)), "{e:?}");
    // A successful heartbeat confirms it again.
    s.down.store(false, Ordering::SeqCst);
    a.heartbeat().await.unwrap();
    drop(a.reserve(t, soles("1.00")).await.unwrap());
    assert_eq!(a.view(t).lease, soles("5.00"));
    assert_eq!(a.view(t).reserved, Pen::ZERO);
}

async fn returning_an_idle_lease_never_races_an_admission(fx: &Fixture) {
    let s = Rigged::new(fx.open().await);
    let t = tenant_with(&*s, "acme", "20.00").await;
    let a = Accounts::new(s.clone(), "replica-a".into(), soles("5.00"), FENCE);
    drop(a.reserve(t, soles("1.00")).await.unwrap());
    assert_eq!(a.view(t).lease, soles("5.00"));
    // The return is slow; a request arrives while it is under way.
    s.release_delay_ms.store(300, Ordering::SeqCst);
    let returning = {
        let a = a.clone();
        tokio::spawn(async move { a.return_idle_leases(Duration::ZERO).await })
    };
    until("the return to reach the store", || {
        s.releases.load(Ordering::SeqCst) > 0
    })
    .await;
    let r = a.reserve(t, soles("1.00")).await.unwrap();
    returning.await.unwrap();
    // The request was admitted against a fresh lease, not the one given back.
    let v = a.view(t);
    assert_eq!(v.reserved, soles("1.00"));
    assert!(v.lease >= v.reserved, "{v:?}");
    assert_eq!(v.lease, s.balance(t).await.unwrap().leased);
    a.settle(r, Pen::ZERO);
}

async fn a_dry_tenant_costs_one_lease_call_not_one_per_refusal(fx: &Fixture) {
    let s = Rigged::new(fx.open().await);
    let t = tenant_with(&*s, "acme", "0.50").await;
    let a = Accounts::new(s.clone(), "replica-a".into(), soles("5.00"), FENCE);
    for _ in 0..20 {
        let e = a.reserve(t, soles("1.00")).await.unwrap_err();
        assert_eq!(
            e,
            Refusal::Insufficient {
                needed: soles("1.00"),
                available: soles("0.50")
            }
        );
    }
    assert_eq!(s.grants.load(Ordering::SeqCst), 1);
    // What fits the lease is still admitted; after a top-up (and the short memory), more.
    drop(a.reserve(t, soles("0.50")).await.unwrap());
    s.top_up(t, soles("10.00"), "").await.unwrap();
    tokio::time::sleep(quipu::billing::accounts::DRY_MEMORY).await;
    drop(a.reserve(t, soles("1.00")).await.unwrap());
    assert_eq!(s.grants.load(Ordering::SeqCst), 2);
    // A failing store is asked once, then refused fast for a moment.
    let u = tenant_with(&*s, "beta", "10.00").await;
    s.down.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        let e = a.reserve(u, soles("1.00")).await.unwrap_err();
        assert!(matches!(e, Refusal::StoreUnavailable(_)), "{e:?}");
    }
    assert_eq!(s.grants.load(Ordering::SeqCst), 3, "asked once while down");
}

async fn a_store_down_at_shutdown_spills_and_the_import_charges_once(fx: &Fixture) {
    use quipu::billing::{ledger, spill};
    let s = Rigged::new(fx.open().await);
    let t = tenant_with(&*s, "acme", "10.00").await;
    let u = tenant_with(&*s, "beta", "10.00").await;
    let dir = std::env::temp_dir().join(unique("quipu-spill"));
    let a = Accounts::new(s.clone(), "replica-a".into(), soles("5.00"), FENCE);
    drop(a.reserve(t, soles("1.00")).await.unwrap());
    // A quarter of the 10.00 balance: the chunk is more than a quarter of it.
    assert_eq!(s.balance(t).await.unwrap().leased, soles("2.50"));
    let timeout = Duration::from_millis(600);
    let (handle, writer) = ledger::channel(
        s.clone(),
        a.clone(),
        Duration::from_millis(5),
        2,
        1_000,
        ledger::ShutdownPolicy {
            flush_timeout: timeout,
            spill_dir: dir.clone(),
        },
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(writer.run(stop_rx));
    let now = store::now_ms();
    let stored = row("stored", t, now, "apu", soles("0.5"));
    handle.record(stored.clone());
    until("the first row to be stored", || handle.queued() == 0).await;

    // The store goes away; requests keep settling; then the shutdown.
    s.down.store(true, Ordering::SeqCst);
    let mut lost = Vec::new();
    for (i, picos) in [1, 999_999_999_999, 250_000_000_000, 7, 1_000_000]
        .iter()
        .enumerate()
    {
        let mut r = row(
            &format!("down-{i}"),
            t,
            now + i as i64,
            "colibri",
            Pen::from_picos(*picos),
        );
        r.input_estimated = i % 2 == 0;
        r.unbilled = Pen::from_picos(*picos / 3);
        r.status = if i == 3 { "client_disconnected" } else { "ok" }.into();
        handle.record(r.clone());
        lost.push(r);
    }
    until("the writer to fail on the store", || {
        s.refused_records.load(Ordering::SeqCst) > 0
    })
    .await;
    let stopped_at = std::time::Instant::now();
    stop_tx.send(true).unwrap();
    let Ok(joined) = tokio::time::timeout(Duration::from_secs(10), task).await else {
        panic!("the writer did not give up on the store within its shutdown timeout");
    };
    let unstored = joined.unwrap();
    let took = stopped_at.elapsed();
    assert_eq!(unstored, lost.len());
    assert!(
        took >= timeout - Duration::from_millis(50) && took < timeout + Duration::from_secs(2),
        "{took:?}"
    );
    let (files, incomplete) = spill::pending(&dir).unwrap();
    assert!(incomplete.is_empty());
    assert_eq!(files.len(), 1, "{files:?}");
    let spilled = spill::read(&files[0]).unwrap();
    assert!(spilled.iter().all(|x| x.replica == "replica-a"));
    let mut rows: Vec<LedgerRow> = spilled.into_iter().map(|x| x.row).collect();
    rows.sort_by(|x, y| x.request_id.cmp(&y.request_id));
    assert_eq!(rows, lost, "the spill file holds exactly the unstored rows");
    s.down.store(false, Ordering::SeqCst);
    assert_eq!(s.balance(t).await.unwrap().balance, soles("9.5"));

    // A second file, by a replica whose lease is gone (reclaimed or dropped at its restart),
    // with a row the store already has: only the balance moves, no other replica's lease.
    assert_eq!(
        s.acquire_lease("replica-gone", u, soles("3"))
            .await
            .unwrap(),
        soles("3")
    );
    s.drop_leases("replica-gone").await.unwrap();
    assert_eq!(
        s.acquire_lease("replica-b", u, soles("2")).await.unwrap(),
        soles("2")
    );
    let gone_rows = vec![
        row("gone-1", u, now, "apu", soles("1.25")),
        stored.clone(),
        row("gone-2", u, now, "apu", Pen::from_picos(3)),
    ];
    let gone = spill::write(&dir, "replica-gone", &gone_rows).unwrap();

    let spent: Pen = lost.iter().map(|r| r.charge).sum();
    let report = quipu::ops::import_ledger(&*s, &[files[0].clone(), gone.clone()])
        .await
        .unwrap();
    assert_eq!(report.totals.new, 7);
    assert_eq!(report.totals.duplicate, 1);
    assert_eq!(report.files[1].duplicate, vec!["stored".to_owned()]);
    assert_eq!(
        report.totals.charged,
        (spent + soles("1.25") + Pen::from_picos(3)).to_decimal()
    );
    let bt = s.balance(t).await.unwrap();
    assert_eq!(bt.balance, soles("9.5") - spent);
    // replica-a's lease still held the money those requests spent: it drops as it would have.
    assert_eq!(bt.leased, soles("2.0") - spent);
    let bu = s.balance(u).await.unwrap();
    assert_eq!(bu.balance, soles("10") - soles("1.25") - Pen::from_picos(3));
    assert_eq!(bu.leased, soles("2"), "replica-b's lease is untouched");
    let mut all = s.ledger_rows(Some(t)).await.unwrap();
    all.sort_by(|x, y| x.request_id.cmp(&y.request_id));
    let mut expected = lost.clone();
    expected.push(stored);
    assert_eq!(
        all, expected,
        "every field of every row as the gateway made it"
    );
    assert!(!files[0].exists() && spill::imported_name(&files[0]).exists());
    assert!(spill::pending(&dir).unwrap().0.is_empty());

    // Importing again adds nothing.
    let again = quipu::ops::import_ledger(
        &*s,
        &[spill::imported_name(&files[0]), spill::imported_name(&gone)],
    )
    .await
    .unwrap();
    assert_eq!((again.totals.new, again.totals.duplicate), (0, 8));
    assert_eq!(again.totals.charged, "0.00");
    assert_eq!(s.balance(t).await.unwrap(), bt);
    assert_eq!(s.balance(u).await.unwrap(), bu);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// Between replicas: shared rate windows, leases in shares, leases called home

fn quota(subject: &str, start: i64, add: i64, want: u64, limit: u64) -> QuotaAsk {
    QuotaAsk {
        subject: subject.into(),
        window_ms: 60_000,
        window_start: start,
        add,
        want,
        limit,
    }
}

async fn shared_rate_windows_never_grant_past_the_limit(fx: &Fixture) {
    let handles = [fx.open().await, fx.open().await, fx.open().await];
    let start = store::now_ms() / 60_000 * 60_000;
    // 12 "replicas" asking for slices of 7 at once, for a limit of 100, in two windows.
    let mut tasks = Vec::new();
    for i in 0..12usize {
        let s = Arc::clone(&handles[i % 3]);
        tasks.push(tokio::spawn(async move {
            let mut got = 0u64;
            loop {
                let asks = [
                    quota("key:k1:requests", start, 0, 7, 100),
                    quota("key:k1:requests", start + 60_000, 0, 3, 10),
                ];
                let (grants, now) = s.take_quota(&asks).await.unwrap();
                assert!((now - store::now_ms()).abs() < 60_000, "the store's clock");
                assert!(grants[0].granted <= 7 && grants[0].taken <= 100);
                got += grants[0].granted;
                if grants[0].granted == 0 {
                    return got;
                }
            }
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 100, "exactly the limit, between all of them");
    let s = &handles[0];
    let look = |subject: &'static str, start| async move {
        s.take_quota(&[quota(subject, start, 0, 0, 0)])
            .await
            .unwrap()
            .0[0]
    };
    assert_eq!(look("key:k1:requests", start).await.taken, 100);
    assert_eq!(look("key:k1:requests", start + 60_000).await.taken, 10);
    // Usage beyond the limit is counted (tokens of a last request); a return lowers the
    // count, never below zero; the count then grants again.
    let (g, _) = s
        .take_quota(&[quota("key:k1:tokens", start, 450, 10, 400)])
        .await
        .unwrap();
    assert_eq!((g[0].granted, g[0].taken), (0, 450));
    let (g, _) = s
        .take_quota(&[quota("key:k1:tokens", start, -100, 25, 400)])
        .await
        .unwrap();
    assert_eq!((g[0].granted, g[0].taken), (25, 375));
    let (g, _) = s
        .take_quota(&[quota("key:k1:tokens", start, -1_000, 0, 400)])
        .await
        .unwrap();
    assert_eq!((g[0].granted, g[0].taken), (0, 0));
    // One ask per window and call.
    let twice = [quota("t", start, 0, 1, 5), quota("t", start, 0, 1, 5)];
    assert!(matches!(
        s.take_quota(&twice).await,
        Err(StoreError::Invalid(_))
    ));
    assert_eq!(s.take_quota(&[]).await.unwrap().0, vec![]);
    // Windows long over are deleted; current ones stay.
    let old = start - 10 * 60_000;
    s.take_quota(&[quota("key:k1:requests", old, 0, 1, 5)])
        .await
        .unwrap();
    assert_eq!(s.expire_quota(120_000).await.unwrap(), 1);
    assert_eq!(look("key:k1:requests", start).await.taken, 100);
    assert_eq!(
        look("key:k1:requests", old).await.taken,
        0,
        "started afresh"
    );
}

async fn a_low_balance_is_leased_in_shares(fx: &Fixture) {
    let (sa, sb) = (fx.open().await, fx.open().await);
    let t = tenant_with(&*sa, "acme", "1.00").await;
    let ask = LeaseAsk {
        need: soles("0.05"),
        want: soles("5.00"),
    };
    // The issue's tenant: S/ 1.00 against a chunk of S/ 5.00. The first replica gets a
    // quarter, not everything.
    let a = sa.grant_lease("replica-a", t, ask).await.unwrap();
    assert_eq!(
        (a.granted, a.reading.amount, a.elsewhere),
        (soles("0.25"), soles("0.25"), Pen::ZERO)
    );
    let b = sb.grant_lease("replica-b", t, ask).await.unwrap();
    assert_eq!((b.granted, b.elsewhere), (soles("0.1875"), soles("0.25")));
    // Never less than the request needs, while there is that much.
    let big = LeaseAsk {
        need: soles("0.50"),
        want: soles("5.00"),
    };
    let c = sb.grant_lease("replica-c", t, big).await.unwrap();
    assert_eq!((c.granted, c.elsewhere), (soles("0.50"), soles("0.4375")));
    let d = sa.grant_lease("replica-d", t, big).await.unwrap();
    assert_eq!(d.granted, soles("0.0625"), "what is left");
    assert_leases_covered(&*sa, t, "after the shares").await;
}

async fn idle_leases_come_home_when_another_replica_is_short(fx: &Fixture) {
    let (sa, sb) = (fx.open().await, fx.open().await);
    let t = tenant_with(&*sa, "acme", "1.00").await;
    let a = Accounts::new(sa.clone(), "replica-a".into(), soles("5.00"), FENCE);
    let b = Accounts::new(sb.clone(), "replica-b".into(), soles("5.00"), FENCE);
    for (acc, s) in [(&a, &sa), (&b, &sb)] {
        if let Some(signals) = s.listen_replicas().await.unwrap() {
            tokio::spawn(acc.clone().follow_signals(signals));
        }
    }
    // a spends some and holds the rest; one request stays open on it.
    let open = a.reserve(t, soles("0.20")).await.unwrap();
    let r = a.reserve(t, soles("0.80")).await.unwrap();
    a.settle(r, soles("0.10"));
    flush(&*sa, &a, "spent", t, soles("0.10")).await;
    let held = sa.balance(t).await.unwrap().leased;
    assert_eq!(
        held,
        soles("0.90"),
        "a needed it all for 0.80: it holds everything left"
    );
    // b needs 0.50: nothing is unleased, 0.70 of a's lease is idle (0.20 is reserved).
    let got = b.reserve(t, soles("0.50")).await;
    if sb.kind() == store::Backend::Sqlite {
        // One process on SQLite: no channel to other replicas; idle leases come home after a
        // few idle seconds only.
        assert!(matches!(got, Err(Refusal::Insufficient { .. })), "{got:?}");
        a.settle(open, Pen::ZERO);
        return;
    }
    assert!(got.is_ok(), "a returned its idle lease at once: {got:?}");
    let r = got.unwrap();
    assert_eq!(
        a.view(t).lease,
        soles("0.20"),
        "a kept what its open request holds"
    );
    // More than is left anywhere is still refused: the money is spent or in flight.
    let e = b.reserve(t, soles("0.30")).await.unwrap_err();
    assert!(matches!(e, Refusal::Insufficient { .. }), "{e:?}");
    b.settle(r, soles("0.50"));
    flush(&*sb, &b, "b-spent", t, soles("0.50")).await;
    a.settle(open, soles("0.20"));
    flush(&*sa, &a, "a-open", t, soles("0.20")).await;
    let bal = assert_leases_covered(&*sa, t, "at the end").await;
    assert_eq!(bal.balance, soles("0.20"));
}

/// Three replicas each hold an idle third of a balance and are each asked, at once, for more
/// than their own share: each asks the others for theirs while they ask it. The money comes
/// home and requests are admitted while it lasts — none refused while it is there.
async fn replicas_short_at_once_pool_their_idle_leases(fx: &Fixture) {
    let stores = [fx.open().await, fx.open().await, fx.open().await];
    if stores[0].kind() == store::Backend::Sqlite {
        return; // One process: no channel to other replicas.
    }
    let t = tenant_with(&*stores[0], "acme", "1.00").await;
    let mut replicas = Vec::new();
    for (i, s) in stores.iter().enumerate() {
        let acc = Accounts::new(s.clone(), format!("replica-{i}"), soles("5.00"), FENCE);
        if let Some(signals) = s.listen_replicas().await.unwrap() {
            tokio::spawn(acc.clone().follow_signals(signals));
        }
        // Each takes a lease of 0.30 (a request's need) and keeps it idle.
        let r = acc.reserve(t, soles("0.30")).await.unwrap();
        acc.settle(r, Pen::ZERO);
        assert_eq!(acc.view(t).lease, soles("0.30"));
        replicas.push(acc);
    }
    // 0.45 each, at once: none fits its own lease; 0.10 is unleased.
    let asks = replicas.iter().map(|acc| acc.reserve(t, soles("0.45")));
    let got = futures::future::join_all(asks).await;
    let admitted = got.iter().filter(|r| r.is_ok()).count();
    assert!(
        admitted > 0,
        "S/ 1.00 held idle by three replicas, three requests of 0.45 at once: all refused {got:?}"
    );
    for (acc, r) in replicas.iter().zip(got) {
        if let Ok(r) = r {
            acc.settle(r, Pen::ZERO);
        }
    }
    assert_leases_covered(&*stores[0], t, "after the race").await;
}

#[async_trait::async_trait]
impl store::WebhookStore for Rigged {
    async fn add_endpoint(&self, e: &store::webhooks::WebhookEndpoint) -> store::StoreResult<()> {
        self.inner.add_endpoint(e).await
    }
    async fn endpoints(
        &self,
        tenant: Option<TenantId>,
    ) -> store::StoreResult<Vec<store::webhooks::WebhookEndpoint>> {
        self.inner.endpoints(tenant).await
    }
    async fn remove_endpoint(
        &self,
        tenant: TenantId,
        id: &str,
        now: i64,
    ) -> store::StoreResult<bool> {
        self.inner.remove_endpoint(tenant, id, now).await
    }
    async fn emit(
        &self,
        events: &[(TenantId, store::webhooks::WebhookEvent)],
    ) -> store::StoreResult<u64> {
        self.inner.emit(events).await
    }
    async fn lead_sender(&self, replica: &str, lease_ms: i64) -> store::StoreResult<bool> {
        self.inner.lead_sender(replica, lease_ms).await
    }
    async fn resign_sender(&self, replica: &str) -> store::StoreResult<()> {
        self.inner.resign_sender(replica).await
    }
    async fn unfanned(&self, limit: u32) -> store::StoreResult<Vec<store::webhooks::OutboxEvent>> {
        self.inner.unfanned(limit).await
    }
    async fn fan_out(
        &self,
        events: &[String],
        deliveries: &[(String, String)],
        now: i64,
    ) -> store::StoreResult<()> {
        self.inner.fan_out(events, deliveries, now).await
    }
    async fn due(
        &self,
        now: i64,
        limit: u32,
    ) -> store::StoreResult<Vec<store::webhooks::DueDelivery>> {
        self.inner.due(now, limit).await
    }
    async fn attempted(
        &self,
        event_id: &str,
        endpoint: &str,
        attempt: &store::webhooks::Attempt,
        now: i64,
    ) -> store::StoreResult<()> {
        self.inner.attempted(event_id, endpoint, attempt, now).await
    }
    async fn backlog(&self) -> store::StoreResult<store::webhooks::Backlog> {
        self.inner.backlog().await
    }
    async fn deliveries(
        &self,
        tenant: Option<TenantId>,
    ) -> store::StoreResult<Vec<store::webhooks::DeliveryInfo>> {
        self.inner.deliveries(tenant).await
    }
    async fn prune_webhooks(&self, before: i64) -> store::StoreResult<u64> {
        self.inner.prune_webhooks(before).await
    }
    async fn expiring_keys(
        &self,
        now: i64,
        until: i64,
    ) -> store::StoreResult<Vec<store::webhooks::ExpiringKey>> {
        self.inner.expiring_keys(now, until).await
    }
}
