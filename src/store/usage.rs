//! What the account API reads: usage over a period, grouped; the tenant's keys with what each
//! spent; its requests and top-ups, newest first; and its account in one snapshot.
//!
//! **Roll-ups.** Usage is not summed from the ledger at query time, which would cost a
//! month's rows per query: [`LedgerStore::record`](super::LedgerStore::record) adds each new
//! request row to `usage_hourly` (per tenant, UTC hour, key and model) and `key_usage` (per
//! tenant and key), in the same transaction as the row, so the sums can never disagree with
//! the ledger.
//! A period's whole hours are read from `usage_hourly` and its partial hours at either end from
//! the ledger itself (through the `(tenant_id, kind, at, entry_id)` index), in one statement:
//! any period is exact to the millisecond, and a month grouped by day reads at most
//! 720 × keys × models roll-up rows, whatever the traffic.
//!
//! [`rollup`] turns the rows a batch inserted into the additions both stores make; SQLite keeps
//! each sum in two integer columns (`x_hi * 2^32 + x_lo`, carried on every addition, so no
//! total a ledger can hold overflows them) and PostgreSQL in `NUMERIC`.
//!
//! This module owns the types and the trait; the statements both backends send are in
//! `sql::usage`, and each backend implements the trait, and keeps its roll-ups, in its own
//! `usage.rs` (`sqlite/usage.rs`, `postgres/usage.rs`).

use super::rows::RawLedgerRow;
use super::{KeyInfo, LedgerRow, StoreResult, Tenant, TenantId, TopUp, UnixMs};
use crate::money::Pen;
use async_trait::async_trait;
use std::collections::BTreeMap;

/// One hour, the roll-up's grain.
pub const HOUR_MS: i64 = 3_600_000;
/// One day.
pub const DAY_MS: i64 = 24 * HOUR_MS;

/// The start of the UTC hour `at` falls in.
pub fn hour_of(at: UnixMs) -> UnixMs {
    at.div_euclid(HOUR_MS) * HOUR_MS
}

/// Requests, tokens and charges of a set of request rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageTotals {
    pub requests: u64,
    /// All prompt tokens, cached ones included.
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub charge: Pen,
}

/// How [`UsageStore::usage`] groups rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// By day, days starting `offset_ms` east of UTC (a whole number of hours).
    Day {
        offset_ms: i64,
    },
    Model,
    Key,
    /// One group of everything.
    Total,
}

/// A group's name: a day (days since 1970-01-01 in the offset), a model or key, or nothing
/// (the total).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum GroupKey {
    Day(i64),
    Name(String),
    Total,
}

/// A usage query: `tenant`'s request rows with `from <= at < to`, grouped; for names, only the
/// groups after `after` (in byte order) and at most `limit` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageQuery {
    pub tenant: TenantId,
    pub from: UnixMs,
    pub to: UnixMs,
    pub grouping: Grouping,
    pub after: Option<String>,
    pub limit: usize,
}

impl UsageQuery {
    /// The whole UTC hours of the period (read from the roll-up) and the partial hours at its
    /// ends (read from the ledger): `(hours, head, tail)`, each `[lo, hi)`, possibly empty.
    pub fn split(&self) -> ((UnixMs, UnixMs), (UnixMs, UnixMs), (UnixMs, UnixMs)) {
        let first = hour_of(self.from + HOUR_MS - 1);
        let last = hour_of(self.to);
        if first < last {
            ((first, last), (self.from, first), (last, self.to))
        } else {
            ((0, 0), (self.from, self.to), (0, 0))
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageGroup {
    pub key: GroupKey,
    pub totals: UsageTotals,
}

/// A key with what it has spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyUsage {
    pub key: KeyInfo,
    pub totals: UsageTotals,
    /// Its last request's time.
    pub last_used: Option<UnixMs>,
}

/// A tenant's account, read in one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountFacts {
    pub tenant: Tenant,
    /// The balance as the ledger has it (charges not yet written are not in it).
    pub balance: Pen,
    /// The key asked about, if any and if it is the tenant's.
    pub key: Option<KeyUsage>,
    /// Everything the tenant's requests ever used.
    pub totals: UsageTotals,
    /// The asking replica's lease row on the tenant, read with the balance: which of its
    /// charges the balance holds already (`spent`).
    pub lease: Option<super::LeaseReading>,
}

/// Where a page of a time-ordered listing starts: strictly before (newest-first listings) or
/// after (oldest-first) this item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeCursor {
    pub at: UnixMs,
    pub id: String,
}

/// The account API's reads. Every [`Store`](super::Store) implements it.
#[async_trait]
pub trait UsageStore: Send + Sync {
    /// The groups of the query in order (days ascending, names in byte order), at most
    /// `limit`. Groups with nothing in them are not returned.
    async fn usage(&self, q: &UsageQuery) -> StoreResult<Vec<UsageGroup>>;

    /// The tenant, its balance and all-time totals, and `key` with its totals if it is one of
    /// the tenant's; `NotFound` if the tenant does not exist.
    async fn account(
        &self,
        tenant: TenantId,
        key: Option<&str>,
        replica: &str,
    ) -> StoreResult<AccountFacts>;

    /// The tenant's keys, revoked ones included, oldest first, after `after`; at most `limit`.
    async fn keys_page(
        &self,
        tenant: TenantId,
        after: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<KeyUsage>>;

    /// The tenant's request rows, newest first, before `before`; at most `limit`.
    async fn requests_page(
        &self,
        tenant: TenantId,
        before: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<LedgerRow>>;

    /// The tenant's top-ups, newest first, before `before`; at most `limit`.
    async fn top_ups_page(
        &self,
        tenant: TenantId,
        before: Option<&TimeCursor>,
        limit: usize,
    ) -> StoreResult<Vec<TopUp>>;
}

/// A sum of non-negative values, in i128 so no batch overflows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sums {
    pub requests: i64,
    pub input: i128,
    pub cached: i128,
    pub output: i128,
    pub charge: i128,
}

impl Sums {
    fn add(&mut self, row: &RollupRow) {
        self.requests += 1;
        self.input += i128::from(row.input);
        self.cached += i128::from(row.cached);
        self.output += i128::from(row.output);
        self.charge += row.charge;
    }

    /// The four sums, each as `(hi, lo)` with `lo` in `[0, 2^32)` (SQLite's columns).
    pub fn split(&self) -> [(i64, i64); 4] {
        [self.input, self.cached, self.output, self.charge].map(split)
    }
}

/// `v` as `(v / 2^32, v % 2^32)`; `v` is a non-negative batch sum, far below 2^95.
fn split(v: i128) -> (i64, i64) {
    let split = i128::from(super::sql_money::SPLIT);
    (
        i64::try_from(v.div_euclid(split)).unwrap_or(i64::MAX),
        i64::try_from(v.rem_euclid(split)).unwrap_or(0),
    )
}

/// What a batch of new request rows adds to the roll-ups: per (tenant, hour, key, model) and
/// per (tenant, key), with the key's latest time.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Rollup {
    pub hours: BTreeMap<(TenantId, UnixMs, String, String), Sums>,
    pub keys: BTreeMap<(TenantId, String), (Sums, UnixMs)>,
}

/// What the roll-ups need of a new request row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RollupRow {
    pub tenant_id: TenantId,
    pub at: UnixMs,
    pub key_id: String,
    pub model: String,
    pub input: i64,
    pub cached: i64,
    pub output: i64,
    /// Pico-soles, ≥ 0.
    pub charge: i128,
}

impl From<&RawLedgerRow> for RollupRow {
    fn from(row: &RawLedgerRow) -> RollupRow {
        RollupRow {
            tenant_id: row.tenant_id,
            at: row.at,
            key_id: row.key_id.clone().unwrap_or_default(),
            model: row.model.clone().unwrap_or_default(),
            input: row.input_tokens.unwrap_or(0),
            cached: row.cached_tokens.unwrap_or(0),
            output: row.output_tokens.unwrap_or(0),
            charge: row.charge().picos(),
        }
    }
}

/// Sums the rows a batch inserted (never the ones it skipped as already recorded).
pub(crate) fn rollup(rows: impl IntoIterator<Item = RollupRow>) -> Rollup {
    let mut r = Rollup::default();
    for row in rows {
        r.hours
            .entry((
                row.tenant_id,
                hour_of(row.at),
                row.key_id.clone(),
                row.model.clone(),
            ))
            .or_default()
            .add(&row);
        let k = r
            .keys
            .entry((row.tenant_id, row.key_id.clone()))
            .or_insert((Sums::default(), row.at));
        k.0.add(&row);
        k.1 = k.1.max(row.at);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::super::rows::check_row;
    use super::*;

    fn row(id: &str, at: i64, key: &str, model: &str, picos: i128) -> RawLedgerRow {
        check_row(&LedgerRow {
            request_id: id.into(),
            at,
            tenant_id: 7,
            key_id: key.into(),
            model: model.into(),
            format: "chat".into(),
            input_tokens: 10,
            cached_tokens: 4,
            output_tokens: 1,
            charge: Pen::from_picos(picos),
            status: "ok".into(),
            http_status: 200,
            unbilled: Pen::ZERO,
            input_estimated: false,
            caps: Vec::new(),
        })
        .unwrap()
    }

    #[test]
    fn a_batch_is_summed_per_hour_key_and_model() {
        let h = 1_793_491_200_000;
        let rows = [
            row("a", h + 1, "k1", "apu", 5),
            row("b", h + HOUR_MS - 1, "k1", "apu", 7),
            row("c", h + HOUR_MS, "k1", "apu", 1),
            row("d", h + 2, "k2", "apu", 1 << 40),
        ];
        let r = rollup(rows.iter().map(RollupRow::from));
        assert_eq!(r.hours.len(), 3);
        let first = r.hours[&(7, h, String::from("k1"), String::from("apu"))];
        assert_eq!((first.requests, first.input, first.charge), (2, 20, 12));
        let (k1, last) = r.keys[&(7, String::from("k1"))];
        assert_eq!(
            (k1.requests, k1.cached, k1.charge, last),
            (3, 12, 13, h + HOUR_MS)
        );
        let (k2, _) = r.keys[&(7, String::from("k2"))];
        assert_eq!(k2.split()[3], (1 << 8, 0));
        assert_eq!(split((5 << 32) + 9), (5, 9));
    }

    #[test]
    fn hours_and_partial_ends() {
        let h = 1_793_491_200_000;
        let q = |from, to| UsageQuery {
            tenant: 1,
            from,
            to,
            grouping: Grouping::Total,
            after: None,
            limit: 10,
        };
        assert_eq!(
            q(h, h + 3 * HOUR_MS).split(),
            (
                (h, h + 3 * HOUR_MS),
                (h, h),
                (h + 3 * HOUR_MS, h + 3 * HOUR_MS)
            )
        );
        assert_eq!(
            q(h + 5, h + 2 * HOUR_MS + 7).split(),
            (
                (h + HOUR_MS, h + 2 * HOUR_MS),
                (h + 5, h + HOUR_MS),
                (h + 2 * HOUR_MS, h + 2 * HOUR_MS + 7)
            )
        );
        // Within one hour, or across one boundary with no whole hour: all from the ledger.
        assert_eq!(q(h + 5, h + 9).split(), ((0, 0), (h + 5, h + 9), (0, 0)));
        assert_eq!(
            q(h + 5, h + HOUR_MS + 9).split(),
            ((0, 0), (h + 5, h + HOUR_MS + 9), (0, 0))
        );
        assert_eq!(hour_of(-1), -HOUR_MS);
    }
}
