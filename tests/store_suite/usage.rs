//! The account API's reads (`store::usage`), on every backend: the roll-ups equal the ledger
//! for any period and grouping, a tenant sees only its own, the queries use indexes, and a
//! database migrated from schema 2 gets roll-ups of the rows it already had.

use super::{admin_client, lcg, row, soles, tenant_with, Cleanup, Fixture};
use quipu::money::Pen;
use quipu::store::schema::{PG_BOOTSTRAP, PG_MIGRATIONS, SQLITE_BOOTSTRAP, SQLITE_MIGRATIONS};
use quipu::store::usage::{
    GroupKey, Grouping, TimeCursor, UsageGroup, UsageQuery, UsageTotals, DAY_MS, HOUR_MS,
};
use quipu::store::{LedgerRow, TenantId};
use std::collections::BTreeMap;

/// 2026-11-01T00:00:00Z.
const NOV_1: i64 = 1_793_491_200_000;

/// What the ledger says for `tenant` over `[from, to)`, grouped like `grouping`.
fn expected(
    rows: &[LedgerRow],
    tenant: TenantId,
    from: i64,
    to: i64,
    grouping: Grouping,
) -> Vec<UsageGroup> {
    let mut groups: BTreeMap<GroupKey, UsageTotals> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.tenant_id == tenant && r.at >= from && r.at < to)
    {
        let key = match grouping {
            Grouping::Day { offset_ms } => GroupKey::Day((r.at + offset_ms).div_euclid(DAY_MS)),
            Grouping::Model => GroupKey::Name(r.model.clone()),
            Grouping::Key => GroupKey::Name(r.key_id.clone()),
            Grouping::Total => GroupKey::Total,
        };
        let t = groups.entry(key).or_default();
        t.requests += 1;
        t.input_tokens += r.input_tokens;
        t.cached_tokens += r.cached_tokens;
        t.output_tokens += r.output_tokens;
        t.charge += r.charge;
    }
    groups
        .into_iter()
        .map(|(key, totals)| UsageGroup { key, totals })
        .collect()
}

/// Rows of two tenants over 40 days, three models and three keys, at odd milliseconds.
fn spread(a: TenantId, b: TenantId, n: i64) -> Vec<LedgerRow> {
    let models = ["aguila", "apu", "colibri"];
    let keys = ["key_aaaaaaaaaaaa", "key_bbbbbbbbbbbb", "key_cccccccccccc"];
    let mut seed = 7u64;
    (0..n)
        .map(|i| {
            let tenant = if i % 5 == 0 { b } else { a };
            let at = NOV_1 - 5 * DAY_MS + (lcg(&mut seed) % (40 * DAY_MS as u64)) as i64;
            let mut r = row(
                &format!("u-{i:05}"),
                tenant,
                at,
                models[(lcg(&mut seed) % 3) as usize],
                Pen::from_picos(i128::from(lcg(&mut seed) % 3_000_000_000_000)),
            );
            r.key_id = keys[(lcg(&mut seed) % 3) as usize].into();
            r.input_tokens = lcg(&mut seed) % 100_000;
            r.cached_tokens = r.input_tokens / 4;
            r.output_tokens = lcg(&mut seed) % 8_000;
            r
        })
        .collect()
}

pub async fn usage_equals_the_ledger_for_any_period_and_grouping(fx: &Fixture) {
    let s = fx.open().await;
    let a = tenant_with(&*s, "acme", "100000").await;
    let b = tenant_with(&*s, "beta", "100000").await;
    let rows = spread(a, b, 1500);
    for chunk in rows.chunks(97) {
        s.record("r1", chunk).await.unwrap();
    }
    // A replayed batch is not counted twice.
    assert_eq!(s.record("r1", &rows[..50]).await.unwrap().new, 0);

    let periods = [
        (NOV_1, NOV_1 + 30 * DAY_MS),
        // Partial hours at both ends, bounds on odd milliseconds.
        (NOV_1 + 17, NOV_1 + 9 * DAY_MS + 3 * HOUR_MS + 12_345),
        // Inside one hour; across one hour boundary with no whole hour.
        (NOV_1 + 5 * HOUR_MS + 1, NOV_1 + 5 * HOUR_MS + 1_800_000),
        (
            NOV_1 + 5 * HOUR_MS + 1_800_000,
            NOV_1 + 6 * HOUR_MS + 60_000,
        ),
        (NOV_1 - 10 * DAY_MS, NOV_1 + 60 * DAY_MS),
    ];
    let groupings = [
        Grouping::Day { offset_ms: 0 },
        Grouping::Day {
            offset_ms: -5 * HOUR_MS,
        },
        Grouping::Day {
            offset_ms: 14 * HOUR_MS,
        },
        Grouping::Model,
        Grouping::Key,
        Grouping::Total,
    ];
    for (from, to) in periods {
        for grouping in groupings {
            for tenant in [a, b] {
                let q = UsageQuery {
                    tenant,
                    from,
                    to,
                    grouping,
                    after: None,
                    limit: 1000,
                };
                let got = s.usage(&q).await.unwrap();
                let want = expected(&rows, tenant, from, to, grouping);
                assert_eq!(got, want, "tenant {tenant} {from}..{to} by {grouping:?}");
            }
        }
    }
    // Names page in byte order.
    let q = |after: Option<&str>| UsageQuery {
        tenant: a,
        from: NOV_1,
        to: NOV_1 + 30 * DAY_MS,
        grouping: Grouping::Model,
        after: after.map(str::to_owned),
        limit: 1,
    };
    let first = s.usage(&q(None)).await.unwrap();
    assert_eq!(first[0].key, GroupKey::Name("aguila".into()));
    let next = s.usage(&q(Some("aguila"))).await.unwrap();
    assert_eq!(next[0].key, GroupKey::Name("apu".into()));
    assert!(s.usage(&q(Some("colibri"))).await.unwrap().is_empty());

    // Keys and the account: all-time totals per key equal the ledger's.
    let account = s.account(a, Some("key_bbbbbbbbbbbb"), "r1").await.unwrap();
    let all = expected(&rows, a, i64::MIN, i64::MAX, Grouping::Total);
    assert_eq!(account.totals, all[0].totals);
    assert_eq!(account.key, None, "a key id the tenant has no key under");
    assert_eq!(
        account.balance,
        soles("100000") - all[0].totals.charge,
        "the balance is the ledger's"
    );
    let err = s.account(987_654, None, "r1").await.unwrap_err();
    assert!(
        matches!(err, quipu::store::StoreError::NotFound(_)),
        "{err:?}"
    );
}

pub async fn keys_requests_and_top_ups_are_paged_per_tenant(fx: &Fixture) {
    let s = fx.open().await;
    let a = tenant_with(&*s, "acme", "0").await;
    let b = tenant_with(&*s, "beta", "0").await;
    for amount in ["10", "20", "30"] {
        s.top_up(a, soles(amount), amount).await.unwrap();
        // Newest first means by time: top-ups in one millisecond are ordered by their (random)
        // ids instead, so each gets a millisecond of its own.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    s.top_up(b, soles("99"), "beta's").await.unwrap();
    let mut keys = Vec::new();
    for (i, tenant) in [a, a, b, a].into_iter().enumerate() {
        let (_, id, hash, prefix) = quipu::keys::generate_key();
        let info = s
            .create_key(quipu::store::NewKey {
                id,
                tenant,
                label: format!("k{i}"),
                secret_hash: hash,
                secret_prefix: prefix,
                limits: Default::default(),
                rules: Default::default(),
            })
            .await
            .unwrap();
        keys.push(info);
    }
    s.revoke_key(&keys[1].id).await.unwrap();
    // Rows at the same millisecond too: ties are broken by id.
    let mut rows = Vec::new();
    for i in 0..25i64 {
        let mut r = row(
            &format!("p-{i:02}"),
            if i % 6 == 5 { b } else { a },
            NOV_1 + (i / 2) * 1000,
            "apu",
            Pen::from_picos(i128::from(i) * 1_000_000),
        );
        r.key_id = keys[(i % 2) as usize].id.clone();
        rows.push(r);
    }
    s.record("r1", &rows).await.unwrap();

    // Requests, newest first, 4 a page, every row of the tenant once.
    let mut seen = Vec::new();
    let mut cursor: Option<TimeCursor> = None;
    loop {
        let page = s.requests_page(a, cursor.as_ref(), 4).await.unwrap();
        assert!(page.len() <= 4);
        if page.is_empty() {
            break;
        }
        let last = page.last().unwrap();
        cursor = Some(TimeCursor {
            at: last.at,
            id: last.request_id.clone(),
        });
        seen.extend(page);
    }
    let mut want: Vec<LedgerRow> = rows.iter().filter(|r| r.tenant_id == a).cloned().collect();
    want.sort_by(|x, y| (y.at, &y.request_id).cmp(&(x.at, &x.request_id)));
    assert_eq!(seen, want);

    let ups = s.top_ups_page(a, None, 2).await.unwrap();
    assert_eq!(ups.len(), 2);
    assert_eq!(ups[0].amount, soles("30"));
    let rest = s
        .top_ups_page(
            a,
            Some(&TimeCursor {
                at: ups[1].at,
                id: ups[1].id.clone(),
            }),
            10,
        )
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].amount, soles("10"));
    assert!(s
        .top_ups_page(b, None, 10)
        .await
        .unwrap()
        .iter()
        .all(|t| t.tenant_id == b && t.note == "beta's"));

    // Keys: the tenant's three (revoked included), oldest first, with their spend.
    let page = s.keys_page(a, None, 2).await.unwrap();
    assert_eq!(page.len(), 2);
    let more = s
        .keys_page(
            a,
            Some(&TimeCursor {
                at: page[1].key.created_at,
                id: page[1].key.id.clone(),
            }),
            10,
        )
        .await
        .unwrap();
    let ids: Vec<&str> = page
        .iter()
        .chain(&more)
        .map(|k| k.key.id.as_str())
        .collect();
    let mut want_keys: Vec<_> = keys.iter().filter(|k| k.tenant_id == a).collect();
    want_keys.sort_by(|x, y| (x.created_at, &x.id).cmp(&(y.created_at, &y.id)));
    let want_ids: Vec<&str> = want_keys.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(ids, want_ids);
    for k in page.iter().chain(&more) {
        let mine: Vec<&LedgerRow> = rows
            .iter()
            .filter(|r| r.tenant_id == a && r.key_id == k.key.id)
            .collect();
        assert_eq!(k.totals.requests, mine.len() as u64, "{}", k.key.id);
        assert_eq!(k.totals.charge, mine.iter().map(|r| r.charge).sum::<Pen>());
        assert_eq!(k.last_used, mine.iter().map(|r| r.at).max());
    }
    for k in page.iter().chain(&more) {
        assert_eq!(
            k.key.revoked_at.is_some(),
            k.key.id == keys[1].id,
            "{}",
            k.key.id
        );
    }
    // Tenant b's key is not tenant a's, even by id.
    let acct = s.account(a, Some(&keys[2].id), "r1").await.unwrap();
    assert_eq!(acct.key, None);
    let own = s.account(b, Some(&keys[2].id), "r1").await.unwrap();
    assert_eq!(own.key.unwrap().key.id, keys[2].id);
}

/// A database that already had a ledger at schema 2 gets its roll-ups from the migration.
pub async fn the_migration_sums_an_existing_ledger(fx: &Fixture) {
    let rows = {
        // Tenant ids are 1 and 2 in a new database.
        let mut r = spread(1, 2, 300);
        // A charge that splits across the 2^32 boundary, and big token counts.
        r[0].charge = Pen::from_picos(i128::from(i64::MAX));
        r[1].input_tokens = 1 << 58;
        r
    };
    let insert = |r: &LedgerRow| {
        format!(
            "INSERT INTO ledger (entry_id, kind, tenant_id, at, delta, key_id, model, format,
                                 input_tokens, cached_tokens, output_tokens, status, http_status)
             VALUES ('{}', 'request', {}, {}, {}, '{}', '{}', 'chat', {}, {}, {}, 'ok', 200);",
            r.request_id,
            r.tenant_id,
            r.at,
            -r.charge.picos(),
            r.key_id,
            r.model,
            r.input_tokens,
            r.cached_tokens,
            r.output_tokens
        )
    };
    let mut sql = String::new();
    for r in &rows {
        sql.push_str(&insert(r));
    }
    match &fx.cleanup {
        Cleanup::Dir(_) => {
            let path = fx.url.strip_prefix("sqlite://").unwrap();
            std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
            let c = rusqlite::Connection::open(path).unwrap();
            c.execute_batch(SQLITE_BOOTSTRAP).unwrap();
            for (_, m) in &SQLITE_MIGRATIONS[..2] {
                c.execute_batch(m).unwrap();
            }
            c.execute_batch(&format!(
                "INSERT INTO meta (key, value) VALUES ('schema_version', 2);
                 INSERT INTO tenants (id, name, created_at) VALUES (1, 'a', 0), (2, 'b', 0);
                 {sql}"
            ))
            .unwrap();
        }
        Cleanup::PgDatabase { .. } => {
            let c = admin_client(&fx.url).await;
            c.batch_execute(PG_BOOTSTRAP).await.unwrap();
            for (_, m) in &PG_MIGRATIONS[..2] {
                c.batch_execute(m).await.unwrap();
            }
            c.batch_execute(&format!(
                "INSERT INTO meta (key, value) VALUES ('schema_version', 2);
                 INSERT INTO tenants (id, name, created_at) VALUES (1, 'a', 0), (2, 'b', 0);
                 {sql}"
            ))
            .await
            .unwrap();
        }
    }
    let s = fx.open().await;
    for tenant in [1, 2] {
        for grouping in [
            Grouping::Day { offset_ms: 0 },
            Grouping::Key,
            Grouping::Total,
        ] {
            let q = UsageQuery {
                tenant,
                from: NOV_1 - 10 * DAY_MS,
                to: NOV_1 + 40 * DAY_MS,
                grouping,
                after: None,
                limit: 1000,
            };
            assert_eq!(
                s.usage(&q).await.unwrap(),
                expected(&rows, tenant, q.from, q.to, grouping),
                "tenant {tenant} by {grouping:?}"
            );
        }
        let all = expected(&rows, tenant, i64::MIN, i64::MAX, Grouping::Total);
        assert_eq!(
            s.account(tenant, None, "r1").await.unwrap().totals,
            all[0].totals
        );
    }
    // New rows add to what the migration summed.
    let mut more = row("after-1", 1, rows[2].at, &rows[2].model, Pen::from_picos(5));
    more.key_id = rows[2].key_id.clone();
    s.record("r1", &[more.clone()]).await.unwrap();
    let mut all_rows = rows.clone();
    all_rows.push(more);
    let q = UsageQuery {
        tenant: 1,
        from: NOV_1 - 10 * DAY_MS,
        to: NOV_1 + 40 * DAY_MS,
        grouping: Grouping::Key,
        after: None,
        limit: 1000,
    };
    assert_eq!(
        s.usage(&q).await.unwrap(),
        expected(&all_rows, 1, q.from, q.to, Grouping::Key)
    );
}

/// Every usage, history and key query reads through an index: no full scan of the ledger, the
/// roll-up or the keys. SQLite's `EXPLAIN QUERY PLAN`; PostgreSQL's `EXPLAIN` with sequential
/// scans priced out (`enable_seqscan = off`), so a table too small to bother with an index
/// still shows whether one can serve the query.
pub async fn usage_queries_use_indexes(fx: &Fixture) {
    let s = fx.open().await;
    let a = tenant_with(&*s, "acme", "10").await;
    let b = tenant_with(&*s, "beta", "10").await;
    for chunk in spread(a, b, 400).chunks(100) {
        s.record("r1", chunk).await.unwrap();
    }
    drop(s);
    let queries: Vec<UsageQuery> = [
        Grouping::Day { offset_ms: 0 },
        Grouping::Model,
        Grouping::Key,
        Grouping::Total,
    ]
    .into_iter()
    .map(|grouping| UsageQuery {
        tenant: a,
        from: NOV_1 + 17,
        to: NOV_1 + 30 * DAY_MS - 5,
        grouping,
        after: Some("aguila".into()),
        limit: 100,
    })
    .collect();
    match &fx.cleanup {
        Cleanup::Dir(_) => {
            use quipu::store::sql::usage as q;
            use quipu::store::Backend::Sqlite;
            let path = fx.url.strip_prefix("sqlite://").unwrap();
            let c = rusqlite::Connection::open(path).unwrap();
            let plan = |sql: &str, values: Vec<quipu::store::sql::SqlValue>| -> Vec<String> {
                let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
                stmt.query_map(rusqlite::params_from_iter(values), |r| {
                    r.get::<_, String>(3)
                })
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
            };
            let check = |what: &str, lines: Vec<String>| {
                for table in ["ledger", "usage_hourly", "api_keys", "key_usage"] {
                    for l in &lines {
                        assert!(
                            !(l.starts_with(&format!("SCAN {table}"))),
                            "{what}: a full scan of {table}: {lines:#?}"
                        );
                    }
                }
                assert!(
                    lines.iter().any(|l| l.contains("USING")),
                    "{what}: {lines:#?}"
                );
            };
            for uq in &queries {
                let (sql, values) = q::usage_statement(Sqlite, uq);
                let lines = plan(&sql, values);
                assert!(
                    lines
                        .iter()
                        .any(|l| l.contains("SEARCH usage_hourly USING PRIMARY KEY")),
                    "{:?}: {lines:#?}",
                    uq.grouping
                );
                assert!(
                    lines
                        .iter()
                        .any(|l| l.contains("SEARCH ledger USING INDEX ledger_by_tenant_kind_at")),
                    "{:?}: {lines:#?}",
                    uq.grouping
                );
                check(&format!("usage by {:?}", uq.grouping), lines);
            }
            let page = || {
                use quipu::store::sql::SqlValue::{Int, Text};
                vec![Int(a), Int(NOV_1), Text("x"), Int(20)]
            };
            let lines = plan(q::REQUESTS_PAGE.get(Sqlite), page());
            assert!(
                lines
                    .iter()
                    .all(|l| !l.contains("TEMP B-TREE FOR ORDER BY")),
                "requests need no sort: {lines:#?}"
            );
            check("requests", lines);
            check("top-ups", plan(q::TOP_UPS_PAGE.get(Sqlite), page()));
        }
        Cleanup::PgDatabase { .. } => {
            use quipu::store::sql::usage as q;
            use quipu::store::Backend::Postgres;
            let c = admin_client(&fx.url).await;
            c.batch_execute("ANALYZE; SET enable_seqscan = off")
                .await
                .unwrap();
            let explain = |lines: Vec<tokio_postgres::Row>| -> Vec<String> {
                lines.iter().map(|r| r.get::<_, String>(0)).collect()
            };
            let check = |what: &str, lines: &[String]| {
                assert!(
                    lines.iter().all(|l| !l.contains("Seq Scan")),
                    "{what}: a sequential scan: {lines:#?}"
                );
            };
            for uq in &queries {
                let (sql, values) = q::usage_statement(Postgres, uq);
                let lines = explain(
                    c.query_typed(
                        &format!("EXPLAIN {sql}"),
                        &quipu::store::sql::pg_params(&values),
                    )
                    .await
                    .unwrap(),
                );
                check(&format!("usage by {:?}", uq.grouping), &lines);
                assert!(
                    lines.iter().any(|l| l.contains("usage_hourly_pkey")),
                    "{:?}: {lines:#?}",
                    uq.grouping
                );
                assert!(
                    lines.iter().any(|l| l.contains("ledger_by_tenant_kind_at")),
                    "{:?}: {lines:#?}",
                    uq.grouping
                );
            }
            let params = |sql: &str| {
                let sql = format!("EXPLAIN {sql}");
                let c = &c;
                async move {
                    use tokio_postgres::types::Type;
                    let (id, lim) = ("x".to_owned(), 20i64);
                    explain(
                        c.query_typed(
                            &sql,
                            &[
                                (&a, Type::INT8),
                                (&NOV_1, Type::INT8),
                                (&id, Type::TEXT),
                                (&lim, Type::INT8),
                            ],
                        )
                        .await
                        .unwrap(),
                    )
                }
            };
            // On a few rows a bitmap scan and a sort cost less than walking the index
            // backwards; with sorting priced out the plan shows the index gives the order.
            c.batch_execute("SET enable_sort = off").await.unwrap();
            let lines = params(q::REQUESTS_PAGE.get(Postgres)).await;
            check("requests", &lines);
            assert!(
                lines.iter().all(|l| !l.contains("Sort")),
                "requests need no sort: {lines:#?}"
            );
            check("top-ups", &params(q::TOP_UPS_PAGE.get(Postgres)).await);
        }
    }
}
