//! How fast the account API's queries are at a million ledger rows, on SQLite or PostgreSQL.
//!
//! Fills a new store through `Store::record` (the gateway's own write path, so the roll-ups are
//! built as in production), then times each query the account routes make, many times over
//! random windows, and prints a Markdown table of p50 / p95 / p99 / max. The numbers in
//! `docs/benchmarks-usage.md` come from `benches/usage_queries.sh`, which runs this on both
//! stores:
//!
//! ```text
//! cargo run --release --example usage_queries -- --store sqlite:///tmp/usage.db --rows 1000000
//! cargo run --release --example usage_queries -- --store postgres://…/db --rows 1000000
//! ```
//!
//! The data: `--tenants` tenants over `--days` days; the first ("big") tenant has half of all
//! rows, on 8 keys and 3 models; every row has tokens and a charge of its own.

use quipu::keys::generate_key;
use quipu::money::Pen;
use quipu::store::usage::{Grouping, TimeCursor, UsageQuery, DAY_MS};
use quipu::store::{self, KeyLimits, LedgerRow, NewKey};
use std::io::Write;
use std::time::{Duration, Instant};

struct Args {
    store: String,
    rows: u64,
    iterations: usize,
    tenants: i64,
    days: i64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        store: String::new(),
        rows: 1_000_000,
        iterations: 1000,
        tenants: 50,
        days: 90,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = || value.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--store" => a.store = value.clone(),
            "--rows" => a.rows = num()?,
            "--iterations" => a.iterations = num()? as usize,
            "--tenants" => a.tenants = num()? as i64,
            "--days" => a.days = num()? as i64,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.store.is_empty() {
        return Err("--store URL is required (sqlite://PATH or postgres://…)".into());
    }
    Ok(a)
}

fn lcg(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *seed >> 11
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), String> {
    let a = args()?;
    let s = store::open(&a.store).await.map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    let say = |out: &mut std::io::StdoutLock<'_>, line: String| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };

    // Tenants, and the big tenant's keys.
    let mut tenants = Vec::new();
    for i in 0..a.tenants {
        let t = s
            .create_tenant(&format!("bench{i}"))
            .await
            .map_err(|e| e.to_string())?;
        s.top_up(t.id, Pen::from_centimos(100_000_000), "bench")
            .await
            .map_err(|e| e.to_string())?;
        tenants.push(t.id);
    }
    let big = tenants[0];
    let mut keys = Vec::new();
    for i in 0..8 {
        let (_, id, hash, prefix) = generate_key();
        let k = s
            .create_key(NewKey {
                id,
                tenant: big,
                label: format!("k{i}"),
                secret_hash: hash,
                secret_prefix: prefix,
                limits: KeyLimits::default(),
                rules: Default::default(),
            })
            .await
            .map_err(|e| e.to_string())?;
        keys.push(k.id);
    }

    // The rows, in time order as a gateway writes them, in batches of 2,000.
    let start = 1_790_000_000_000_i64 - 1_790_000_000_000 % DAY_MS;
    let span = a.days * DAY_MS;
    let models = ["colibri", "aguila", "apu"];
    let mut seed = 1u64;
    let filled = Instant::now();
    let mut batch = Vec::with_capacity(2000);
    for i in 0..a.rows {
        let tenant = if i % 2 == 0 {
            big
        } else {
            tenants[1 + (lcg(&mut seed) % (a.tenants as u64 - 1)) as usize]
        };
        let at = start + (i as i128 * span as i128 / a.rows as i128) as i64;
        let input = lcg(&mut seed) % 20_000;
        batch.push(LedgerRow {
            request_id: format!("req_{i:012x}"),
            at,
            tenant_id: tenant,
            key_id: if tenant == big {
                keys[(lcg(&mut seed) % 8) as usize].clone()
            } else {
                format!("key_t{tenant}")
            },
            model: models[(lcg(&mut seed) % 3) as usize].into(),
            format: "chat".into(),
            input_tokens: input,
            cached_tokens: input / 3,
            output_tokens: lcg(&mut seed) % 2_000,
            charge: Pen::from_picos(i128::from(lcg(&mut seed) % 20_000_000_000)),
            status: "ok".into(),
            http_status: 200,
            unbilled: Pen::ZERO,
            input_estimated: false,
            caps: Vec::new(),
        });
        if batch.len() == 2000 || i + 1 == a.rows {
            s.record("bench", &batch).await.map_err(|e| e.to_string())?;
            batch.clear();
        }
    }
    let fill = filled.elapsed();
    say(
        &mut out,
        format!(
            "Store: {}. {} ledger rows over {} days, {} tenants (the queried one has {}), written in {:.1} s ({:.0} rows/s through Store::record, roll-ups included).\n",
            s.kind(),
            a.rows,
            a.days,
            a.tenants,
            a.rows.div_ceil(2),
            fill.as_secs_f64(),
            a.rows as f64 / fill.as_secs_f64()
        ),
    );

    say(
        &mut out,
        "| query (tenant with half the rows) | runs | p50 ms | p95 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|"
            .into(),
    );
    let month = 30 * DAY_MS;
    let window = |seed: &mut u64, aligned: bool| {
        let room = (span - month).max(1) as u64;
        let mut from = start + (lcg(seed) % room) as i64;
        if aligned {
            from -= from.rem_euclid(DAY_MS);
        }
        (from, from + month)
    };
    type Case = (&'static str, Grouping, bool);
    let cases: [Case; 6] = [
        (
            "a month by day (UTC days)",
            Grouping::Day { offset_ms: 0 },
            true,
        ),
        (
            "a month by day, Lima days (UTC−5)",
            Grouping::Day {
                offset_ms: -5 * 3_600_000,
            },
            true,
        ),
        (
            "a month by day, bounds at odd milliseconds",
            Grouping::Day { offset_ms: 0 },
            false,
        ),
        ("a month by model", Grouping::Model, true),
        ("a month by key", Grouping::Key, true),
        ("a month's total", Grouping::Total, true),
    ];
    for (name, grouping, aligned) in cases {
        let mut times = Vec::with_capacity(a.iterations);
        for _ in 0..a.iterations {
            let (from, to) = window(&mut seed, aligned);
            let q = UsageQuery {
                tenant: big,
                from,
                to,
                grouping,
                after: None,
                limit: 1001,
            };
            let t = Instant::now();
            let groups = s.usage(&q).await.map_err(|e| e.to_string())?;
            times.push(t.elapsed());
            if groups.is_empty() {
                return Err(format!("{name}: no usage in {from}..{to}"));
            }
        }
        report(&mut out, name, times);
    }
    let year = UsageQuery {
        tenant: big,
        from: start,
        to: start + span,
        grouping: Grouping::Day { offset_ms: 0 },
        after: None,
        limit: 1001,
    };
    let mut times = Vec::new();
    for _ in 0..a.iterations.min(200) {
        let t = Instant::now();
        s.usage(&year).await.map_err(|e| e.to_string())?;
        times.push(t.elapsed());
    }
    report(&mut out, &format!("all {} days by day", a.days), times);

    let mut times = Vec::new();
    for _ in 0..a.iterations {
        let t = Instant::now();
        s.account(big, Some(&keys[0]), "bench")
            .await
            .map_err(|e| e.to_string())?;
        times.push(t.elapsed());
    }
    report(
        &mut out,
        "the account (balance, all-time totals, the key's)",
        times,
    );

    let mut times = Vec::new();
    for _ in 0..a.iterations {
        let t = Instant::now();
        s.keys_page(big, None, 101)
            .await
            .map_err(|e| e.to_string())?;
        times.push(t.elapsed());
    }
    report(&mut out, "its keys with their spend", times);

    let mut times = Vec::new();
    let mut deep = Vec::new();
    for _ in 0..a.iterations {
        let t = Instant::now();
        let page = s
            .requests_page(big, None, 21)
            .await
            .map_err(|e| e.to_string())?;
        times.push(t.elapsed());
        let (from, _) = window(&mut seed, false);
        let cursor = TimeCursor {
            at: from,
            id: String::new(),
        };
        let t = Instant::now();
        s.requests_page(big, Some(&cursor), 101)
            .await
            .map_err(|e| e.to_string())?;
        deep.push(t.elapsed());
        if page.is_empty() {
            return Err("no requests".into());
        }
    }
    report(&mut out, "its 20 latest requests", times);
    report(
        &mut out,
        "100 requests from a random point in time (a cursor)",
        deep,
    );
    Ok(())
}

fn report(out: &mut std::io::StdoutLock<'_>, name: &str, mut times: Vec<Duration>) {
    times.sort();
    let _ = writeln!(
        out,
        "| {name} | {} | {} | {} | {} | {} |",
        times.len(),
        ms(percentile(&times, 0.50)),
        ms(percentile(&times, 0.95)),
        ms(percentile(&times, 0.99)),
        ms(times.last().copied().unwrap_or_default())
    );
    let _ = out.flush();
}
