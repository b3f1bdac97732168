//! A tenant's own view of its money, as `GET /v1/account`, `/v1/usage`, `/v1/keys`,
//! `/v1/requests` and `/v1/topups` answer it to the tenant's keys and `/admin/tenants/{name}/…`
//! to the operator: one implementation, the same JSON.
//!
//! Money is an object with the exact decimal of soles and the amount as people read it
//! (`{"exact": "12.345678901234", "display": "S/ 12.35"}`); times are RFC 3339 in UTC; lists
//! come in pages (`data`, `has_more`, `next_cursor`). The queries' parameters are read by the
//! core (`quipu_core::account`), the sums by the store (`store::usage`).

use super::key_spend::{cap_views, CapView};
use super::tenants::tenant_id;
use super::text::rfc3339;
use super::{OpsError, OpsResult, RulesView};
use crate::account::page::{Cursor, PageParams};
use crate::account::period::{day_of, day_start, day_text, month_start, offset_text};
use crate::account::{GroupBy, UsageParams};
use crate::billing::policy::book::{account_view, Held};
use crate::config::Limits;
use crate::money::Pen;
use crate::store::usage::{
    GroupKey, Grouping, KeyUsage, TimeCursor, UsageGroup, UsageQuery, UsageTotals,
};
use crate::store::{KeyLimits, LedgerRow, Store, TenantId, TopUp, UnixMs};
use serde::Serialize;
use std::collections::HashMap;

/// An amount: exact, and as people read it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Money {
    /// Exact soles (`"0.00000105"`).
    pub exact: String,
    /// `S/ 1,234.56` (rounded to céntimos).
    pub display: String,
}

impl From<Pen> for Money {
    fn from(p: Pen) -> Money {
        Money {
            exact: p.to_decimal(),
            display: p.format_soles(),
        }
    }
}

/// Requests, tokens and what they cost.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub requests: u64,
    /// All prompt tokens, cached ones included.
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub charge: Money,
}

impl From<UsageTotals> for Usage {
    fn from(t: UsageTotals) -> Usage {
        Usage {
            requests: t.requests,
            input_tokens: t.input_tokens,
            cached_tokens: t.cached_tokens,
            output_tokens: t.output_tokens,
            charge: t.charge.into(),
        }
    }
}

/// Limits per minute as they apply: `null` is no limit.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct RateLimits {
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
}

fn limit(v: u64) -> Option<u64> {
    (v > 0).then_some(v)
}

/// A key's limits as they apply: its own, else the configured defaults.
pub fn key_limits(own: KeyLimits, defaults: &Limits) -> RateLimits {
    RateLimits {
        requests_per_minute: limit(
            own.requests_per_minute
                .unwrap_or(defaults.key_requests_per_minute),
        ),
        tokens_per_minute: limit(
            own.tokens_per_minute
                .unwrap_or(defaults.key_tokens_per_minute),
        ),
    }
}

/// The limits every key of a tenant shares.
pub fn tenant_limits(defaults: &Limits) -> RateLimits {
    RateLimits {
        requests_per_minute: limit(defaults.tenant_requests_per_minute),
        tokens_per_minute: limit(defaults.tenant_tokens_per_minute),
    }
}

/// A key as its tenant sees it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyView {
    pub id: String,
    pub label: String,
    /// The secret's first characters (`sk-qp-AbC1`), to recognise it.
    pub prefix: String,
    pub created_at: String,
    pub revoked: bool,
    pub revoked_at: Option<String>,
    /// Its last request, `null` if none.
    pub last_used_at: Option<String>,
    /// Everything its requests used, and cost.
    pub usage: Usage,
    pub limits: RateLimits,
    /// Its models, cap, expiry, switch and scope.
    pub rules: RulesView,
    /// Its cap with what it spent this period and what is left (`null`: no cap).
    pub cap: Option<CapView>,
}

fn key_view(k: KeyUsage, defaults: &Limits, caps: &mut HashMap<String, CapView>) -> KeyView {
    KeyView {
        rules: RulesView::from(&k.key.rules),
        cap: caps.remove(&k.key.id),
        id: k.key.id,
        label: k.key.label,
        prefix: k.key.secret_prefix,
        created_at: rfc3339(k.key.created_at),
        revoked: k.key.revoked_at.is_some(),
        revoked_at: k.key.revoked_at.map(rfc3339),
        last_used_at: k.last_used.map(rfc3339),
        usage: k.totals.into(),
        limits: key_limits(k.key.limits, defaults),
    }
}

/// What this gateway replica holds of the tenant's money (`billing::Accounts`). Each replica
/// knows its own: with several, each answers with what it holds. The store reads this
/// replica's lease row in the transaction that reads the balance, and `held` is read after it,
/// so the view knows exactly which of the replica's charges the balance holds already (see
/// [`quipu_core::billing::book::account_view`]): `available` never counts one twice.
pub struct Local<'a> {
    pub replica: &'a str,
    pub held: &'a (dyn Fn() -> Held + Send + Sync),
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TenantView {
    pub id: TenantId,
    pub name: String,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Spend {
    /// Today so far (days in `utc_offset`).
    pub today: Money,
    /// This calendar month so far.
    pub this_month: Money,
    /// Since the tenant was created.
    pub total: Money,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LimitsView {
    /// Shared by all the tenant's keys.
    pub tenant: RateLimits,
    /// The calling key's own (`null` when the operator asks).
    pub key: Option<RateLimits>,
}

/// `GET /v1/account`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AccountView {
    pub object: &'static str,
    pub tenant: TenantView,
    pub currency: &'static str,
    /// The balance in the ledger.
    pub balance: Money,
    /// Charged by this replica for requests that ended, not in the ledger yet.
    pub pending: Money,
    /// Held by this replica's requests in flight (each reserves its worst case).
    pub reserved: Money,
    pub requests_in_flight: u64,
    /// What a new request may use: balance − pending − reserved.
    pub available: Money,
    pub spend: Spend,
    /// Everything the tenant's requests used.
    pub usage: Usage,
    pub limits: LimitsView,
    /// The calling key (`null` when the operator asks).
    pub key: Option<KeyView>,
    pub utc_offset: String,
    /// The tenant's time zone (IANA, `America/Lima` unless the operator set another): its
    /// caps' days, weeks and months, and the one to show times in.
    pub time_zone: &'static str,
    pub as_of: String,
}

/// The account of `tenant` as `key` sees it (`None`: as the operator sees it), with this
/// replica's money in flight, `now` and days in `offset_ms`.
pub async fn account(
    store: &dyn Store,
    tenant: TenantId,
    key: Option<&str>,
    local: Local<'_>,
    defaults: &Limits,
    offset_ms: i64,
    now: UnixMs,
) -> OpsResult<AccountView> {
    let facts = store.account(tenant, key, local.replica).await?;
    let held = (local.held)();
    let money = account_view(facts.balance, facts.lease, &held);
    let today = day_of(now, offset_ms);
    let spent_since = |day: i64| async move {
        let q = UsageQuery {
            tenant,
            from: day_start(day, offset_ms),
            to: now + 1,
            grouping: Grouping::Total,
            after: None,
            limit: 1,
        };
        let groups = store.usage(&q).await?;
        Ok::<Pen, OpsError>(groups.first().map_or(Pen::ZERO, |g| g.totals.charge))
    };
    let month = spent_since(month_start(today)).await?;
    let day = spent_since(today).await?;
    let zone = store.tenant_rules(tenant).await?.zone;
    let key_view = match facts.key {
        Some(k) => {
            let mut caps = cap_views(store, tenant, zone, &[&k], now).await?;
            Some(key_view(k, defaults, &mut caps))
        }
        None => None,
    };
    Ok(AccountView {
        object: "account",
        tenant: TenantView {
            id: facts.tenant.id,
            name: facts.tenant.name,
            created_at: rfc3339(facts.tenant.created_at),
        },
        currency: "PEN",
        balance: facts.balance.into(),
        pending: money.pending.into(),
        reserved: money.reserved.into(),
        requests_in_flight: held.open,
        available: money.available.into(),
        spend: Spend {
            today: day.into(),
            this_month: month.into(),
            total: facts.totals.charge.into(),
        },
        usage: facts.totals.into(),
        limits: LimitsView {
            tenant: tenant_limits(defaults),
            key: key_view.as_ref().map(|k| k.limits),
        },
        key: key_view,
        utc_offset: offset_text(offset_ms),
        time_zone: zone.name(),
        as_of: rfc3339(now),
    })
}

/// One group of a usage report: its name, and its usage.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct UsageLine {
    /// `group_by=day`: the day (`2026-11-01`, in `utc_offset`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day: Option<String>,
    /// `group_by=day`: the day's first instant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(flatten)]
    pub usage: Usage,
}

/// `GET /v1/usage`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct UsageReport {
    pub object: &'static str,
    pub group_by: &'static str,
    pub from: String,
    pub to: String,
    pub utc_offset: String,
    pub currency: &'static str,
    pub data: Vec<UsageLine>,
    /// The whole period (every page).
    pub totals: Usage,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

fn line(group_by: GroupBy, key: &GroupKey, usage: Usage, offset_ms: i64) -> UsageLine {
    let mut l = UsageLine {
        day: None,
        start: None,
        model: None,
        key: None,
        usage,
    };
    match (group_by, key) {
        (GroupBy::Day, GroupKey::Day(d)) => {
            l.day = Some(day_text(*d));
            l.start = Some(rfc3339(day_start(*d, offset_ms)));
        }
        (GroupBy::Model, GroupKey::Name(n)) => l.model = Some(n.clone()),
        (GroupBy::Key, GroupKey::Name(n)) => l.key = Some(n.clone()),
        (GroupBy::Day | GroupBy::Model | GroupBy::Key, _) => {}
    }
    l
}

/// Usage of `tenant` over the period of `p`, grouped, one page.
pub async fn usage(store: &dyn Store, tenant: TenantId, p: &UsageParams) -> OpsResult<UsageReport> {
    let period = p.period;
    let off = period.offset_ms;
    let total_q = UsageQuery {
        tenant,
        from: period.from,
        to: period.to,
        grouping: Grouping::Total,
        after: None,
        limit: 1,
    };
    let totals = store
        .usage(&total_q)
        .await?
        .into_iter()
        .next()
        .map_or_else(UsageTotals::default, |g| g.totals);
    let (data, has_more, last) = match p.group_by {
        GroupBy::Day => {
            // Every day of the page, empty ones included.
            let (first, last) = period.days();
            let start = match &p.page.after {
                Some(Cursor::Day(d)) => d + 1,
                _ => first,
            };
            let limit = i64::try_from(p.page.limit).unwrap_or(i64::MAX);
            let end = last.min(start.saturating_add(limit - 1));
            let mut data = Vec::new();
            if start <= end {
                let q = UsageQuery {
                    tenant,
                    from: period.from.max(day_start(start, off)),
                    to: period.to.min(day_start(end + 1, off)),
                    grouping: Grouping::Day { offset_ms: off },
                    after: None,
                    limit: usize::try_from(end - start + 1).unwrap_or(usize::MAX),
                };
                let mut found = store.usage(&q).await?.into_iter().peekable();
                for d in start..=end {
                    let here = found.next_if(|g| g.key == GroupKey::Day(d));
                    let totals = here.map_or_else(UsageTotals::default, |g| g.totals);
                    data.push(line(p.group_by, &GroupKey::Day(d), totals.into(), off));
                }
            }
            (data, end < last, Cursor::Day(end))
        }
        GroupBy::Model | GroupBy::Key => {
            let after = match &p.page.after {
                Some(Cursor::Name(n)) => Some(n.clone()),
                _ => None,
            };
            let q = UsageQuery {
                tenant,
                from: period.from,
                to: period.to,
                grouping: match p.group_by {
                    GroupBy::Model => Grouping::Model,
                    GroupBy::Key | GroupBy::Day => Grouping::Key,
                },
                after,
                limit: p.page.limit + 1,
            };
            let mut groups: Vec<UsageGroup> = store.usage(&q).await?;
            let more = groups.len() > p.page.limit;
            groups.truncate(p.page.limit);
            let last = match groups.last().map(|g| &g.key) {
                Some(GroupKey::Name(n)) => Cursor::Name(n.clone()),
                _ => Cursor::Name(String::new()),
            };
            let data = groups
                .into_iter()
                .map(|g| line(p.group_by, &g.key, g.totals.into(), off))
                .collect();
            (data, more, last)
        }
    };
    Ok(UsageReport {
        object: "usage",
        group_by: p.group_by.as_str(),
        from: rfc3339(period.from),
        to: rfc3339(period.to),
        utc_offset: offset_text(off),
        currency: "PEN",
        data,
        totals: totals.into(),
        has_more,
        next_cursor: has_more.then(|| p.page.next(&last)),
    })
}

/// A page of a listing.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Page<T> {
    pub object: &'static str,
    pub data: Vec<T>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// Cuts the `limit + 1` items a store returned into a page.
fn page<T, U>(
    mut items: Vec<T>,
    p: &PageParams,
    cursor: impl Fn(&T) -> Cursor,
    view: impl FnMut(T) -> U,
) -> Page<U> {
    let has_more = items.len() > p.limit;
    items.truncate(p.limit);
    let next_cursor = if has_more {
        items.last().map(|last| p.next(&cursor(last)))
    } else {
        None
    };
    Page {
        object: "list",
        data: items.into_iter().map(view).collect(),
        has_more,
        next_cursor,
    }
}

fn time_cursor(p: &PageParams) -> Option<TimeCursor> {
    match &p.after {
        Some(Cursor::Time { at, id }) => Some(TimeCursor {
            at: *at,
            id: id.clone(),
        }),
        _ => None,
    }
}

/// `GET /v1/keys`: the tenant's keys, oldest first, each cap with what it spent by `now`.
pub async fn keys(
    store: &dyn Store,
    tenant: TenantId,
    p: &PageParams,
    defaults: &Limits,
    now: UnixMs,
) -> OpsResult<Page<KeyView>> {
    let items = store
        .keys_page(tenant, time_cursor(p).as_ref(), p.limit + 1)
        .await?;
    let zone = store.tenant_rules(tenant).await?.zone;
    let listed: Vec<&KeyUsage> = items.iter().take(p.limit).collect();
    let mut caps = cap_views(store, tenant, zone, &listed, now).await?;
    Ok(page(
        items,
        p,
        |k| Cursor::Time {
            at: k.key.created_at,
            id: k.key.id.clone(),
        },
        |k| key_view(k, defaults, &mut caps),
    ))
}

/// One request as its tenant sees it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RequestView {
    pub id: String,
    pub at: String,
    pub key: String,
    pub model: String,
    /// `chat` or `messages`.
    pub format: String,
    /// How it ended: `ok`, `client_disconnected`, `upstream_error`, …
    pub status: String,
    pub http_status: u16,
    /// All prompt tokens, cached ones included.
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    /// The input count is an estimate (the model server reported none).
    pub input_estimated: bool,
    pub charge: Money,
}

/// `GET /v1/requests`: the tenant's requests, newest first.
pub async fn requests(
    store: &dyn Store,
    tenant: TenantId,
    p: &PageParams,
) -> OpsResult<Page<RequestView>> {
    let items = store
        .requests_page(tenant, time_cursor(p).as_ref(), p.limit + 1)
        .await?;
    Ok(page(
        items,
        p,
        |r: &LedgerRow| Cursor::Time {
            at: r.at,
            id: r.request_id.clone(),
        },
        |r| RequestView {
            id: r.request_id,
            at: rfc3339(r.at),
            key: r.key_id,
            model: r.model,
            format: r.format,
            status: r.status,
            http_status: r.http_status,
            input_tokens: r.input_tokens,
            cached_tokens: r.cached_tokens,
            output_tokens: r.output_tokens,
            input_estimated: r.input_estimated,
            charge: r.charge.into(),
        },
    ))
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TopUpView {
    pub id: String,
    pub at: String,
    pub amount: Money,
    pub note: String,
}

/// `GET /v1/topups`: the tenant's top-ups, newest first.
pub async fn top_ups(
    store: &dyn Store,
    tenant: TenantId,
    p: &PageParams,
) -> OpsResult<Page<TopUpView>> {
    let items = store
        .top_ups_page(tenant, time_cursor(p).as_ref(), p.limit + 1)
        .await?;
    Ok(page(
        items,
        p,
        |t: &TopUp| Cursor::Time {
            at: t.at,
            id: t.id.clone(),
        },
        |t| TopUpView {
            id: t.id,
            at: rfc3339(t.at),
            amount: t.amount.into(),
            note: t.note,
        },
    ))
}

/// The id of the tenant named `name` (the admin API names tenants).
pub async fn tenant_named(store: &dyn Store, name: &str) -> OpsResult<TenantId> {
    tenant_id(store, name).await
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{ledger_row, mem, min};
    use super::super::{create_key, create_tenant, top_up};
    use super::*;
    use crate::account::page::Listing;
    use crate::account::query::Query;
    use crate::store::LedgerRow;

    const NOV_1: i64 = 1_793_491_200_000;
    const HOUR: i64 = 3_600_000;

    fn at(id: &str, tenant: TenantId, at: i64, model: &str, picos: i128) -> LedgerRow {
        LedgerRow {
            at,
            ..ledger_row(id, tenant, model, picos)
        }
    }

    #[tokio::test]
    async fn usage_by_day_model_and_key_equals_the_rows() {
        let s = mem().await;
        let t = create_tenant(&*s, "acme").await.unwrap().id;
        let other = create_tenant(&*s, "other").await.unwrap().id;
        let mut rows = vec![
            at("a", t, NOV_1 + 5, "apu", 1_000),
            at("b", t, NOV_1 + 2 * HOUR + 7, "colibri", 20),
            at("c", t, NOV_1 + 26 * HOUR, "apu", 300),
            at("d", t, NOV_1 + 30 * 24 * HOUR - 1, "apu", 4),
            at("x", other, NOV_1 + 5, "apu", 999_999),
        ];
        rows[1].key_id = "key_b".into();
        s.record("r1", &rows).await.unwrap();
        let now = NOV_1 + 40 * 24 * HOUR;
        let params = |q: &str| UsageParams::parse(&Query::parse(q), now).unwrap();

        let r = usage(&*s, t, &params("from=2026-11-01&to=2026-11-30"))
            .await
            .unwrap();
        assert_eq!(r.data.len(), 30, "every day, empty ones too");
        assert_eq!(r.data[0].day.as_deref(), Some("2026-11-01"));
        assert_eq!(r.data[0].usage.requests, 2);
        assert_eq!(r.data[0].usage.charge.exact, "0.00000000102");
        assert_eq!(r.data[1].usage.requests, 1);
        assert_eq!(r.data[2].usage.requests, 0);
        assert_eq!(r.data[29].usage.charge.exact, "0.000000000004");
        assert_eq!(r.totals.requests, 4);
        assert_eq!(r.totals.charge.exact, "0.000000001324");
        assert!(!r.has_more);

        // Pages of days: 7 a page, the cursor continues where the last ended.
        let first = usage(&*s, t, &params("from=2026-11-01&to=2026-11-30&limit=7"))
            .await
            .unwrap();
        assert_eq!(first.data.len(), 7);
        assert!(first.has_more);
        let cursor = first.next_cursor.clone().unwrap();
        let second = usage(
            &*s,
            t,
            &params(&format!(
                "from=2026-11-01&to=2026-11-30&limit=7&cursor={cursor}"
            )),
        )
        .await
        .unwrap();
        assert_eq!(second.data[0].day.as_deref(), Some("2026-11-08"));

        // In Lima (UTC−5) the first request, at 00:00 UTC, is on October 31.
        let lima = usage(
            &*s,
            t,
            &params("from=2026-10-31&to=2026-11-01&utc_offset=-05:00"),
        )
        .await
        .unwrap();
        assert_eq!(
            lima.data[0].usage.requests, 2,
            "00:00 and 02:00 UTC are Oct 31 in Lima"
        );
        assert_eq!(
            lima.data[1].usage.requests, 1,
            "26:00 UTC is Nov 1, 21:00 in Lima"
        );

        let by_model = usage(
            &*s,
            t,
            &params("from=2026-11-01&to=2026-11-30&group_by=model&limit=1"),
        )
        .await
        .unwrap();
        assert_eq!(by_model.data[0].model.as_deref(), Some("apu"));
        assert_eq!(by_model.data[0].usage.requests, 3);
        assert!(by_model.has_more);
        let c = by_model.next_cursor.unwrap();
        let rest = usage(
            &*s,
            t,
            &params(&format!(
                "from=2026-11-01&to=2026-11-30&group_by=model&limit=1&cursor={c}"
            )),
        )
        .await
        .unwrap();
        assert_eq!(rest.data[0].model.as_deref(), Some("colibri"));
        assert!(!rest.has_more);

        let by_key = usage(
            &*s,
            t,
            &params("from=2026-11-01&to=2026-11-30&group_by=key"),
        )
        .await
        .unwrap();
        let keys: Vec<_> = by_key.data.iter().map(|l| l.key.clone().unwrap()).collect();
        assert_eq!(keys, ["key_b", "key_x"]);

        // A partial hour at each end comes from the ledger: exact to the millisecond.
        let exact = usage(
            &*s,
            t,
            &params("from=2026-11-01T00:00:00.005Z&to=2026-11-01T02:00:00.007Z&group_by=model"),
        )
        .await
        .unwrap();
        assert_eq!(exact.totals.requests, 1, "a at .005 in, b at .007 out");
    }

    #[tokio::test]
    async fn account_keys_requests_and_top_ups() {
        let s = mem().await;
        let t = create_tenant(&*s, "acme").await.unwrap().id;
        top_up(&*s, "acme", "50.00", "first", min(), None)
            .await
            .unwrap();
        // Newest first is by time, then by (random) id: the second top-up gets its own
        // millisecond so that "newest" is well defined.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        top_up(&*s, "acme", "20.00", "second", min(), None)
            .await
            .unwrap();
        let catalog = crate::governance::models::Catalog::new(vec!["apu"], Vec::new());
        let change = crate::ops::KeyChange {
            label: Some("ci".into()),
            rpm: Some(Some(60)),
            ..Default::default()
        };
        let k = create_key(&*s, &catalog, "acme", &change).await.unwrap();
        let mut r1 = ledger_row("r1", t, "apu", 2_000_000_000_000);
        r1.key_id = k.key_id.clone();
        let mut r2 = ledger_row("r2", t, "apu", 500_000_000_000);
        r2.key_id = k.key_id.clone();
        r2.at = r1.at + 1;
        let now = r2.at + 1;
        s.record("r", &[r1, r2]).await.unwrap();
        let defaults = Limits {
            key_requests_per_minute: 0,
            key_tokens_per_minute: 100_000,
            tenant_requests_per_minute: 600,
            tenant_tokens_per_minute: 0,
            ..Limits::default()
        };
        // Billed here S/ 0.50 that no row of this replica holds yet, S/ 1.00 in flight.
        let held = || Held {
            settled: Pen::from_centimos(50),
            reserved: Pen::from_centimos(100),
            open: 1,
            ..Held::default()
        };
        let local = Local {
            replica: "r",
            held: &held,
        };
        let a = account(&*s, t, Some(&k.key_id), local, &defaults, 0, now)
            .await
            .unwrap();
        assert_eq!(a.pending.exact, "0.50");
        assert_eq!(a.requests_in_flight, 1);
        assert_eq!(a.balance.exact, "67.50");
        assert_eq!(a.balance.display, "S/ 67.50");
        assert_eq!(a.available.exact, "66.00");
        assert_eq!(a.spend.total.exact, "2.50");
        assert_eq!(a.spend.today.exact, "2.50");
        assert_eq!(a.usage.requests, 2);
        let key = a.key.unwrap();
        assert_eq!(key.limits.requests_per_minute, Some(60));
        assert_eq!(key.limits.tokens_per_minute, Some(100_000));
        assert_eq!(a.limits.tenant.requests_per_minute, Some(600));
        assert_eq!(a.limits.tenant.tokens_per_minute, None);
        assert_eq!(key.usage.charge.exact, "2.50");
        assert!(key.last_used_at.is_some());

        let page1 = PageParams::parse(&Query::parse("limit=1"), Listing::Requests, 0).unwrap();
        let reqs = requests(&*s, t, &page1).await.unwrap();
        assert_eq!(reqs.data[0].id, "r2", "newest first");
        assert!(reqs.has_more);
        let next = reqs.next_cursor.unwrap();
        let page2 = PageParams::parse(
            &Query::parse(&format!("limit=1&cursor={next}")),
            Listing::Requests,
            0,
        )
        .unwrap();
        let reqs = requests(&*s, t, &page2).await.unwrap();
        assert_eq!(reqs.data[0].id, "r1");
        assert!(!reqs.has_more);

        let ups = top_ups(
            &*s,
            t,
            &PageParams::parse(&Query::parse(""), Listing::TopUps, 0).unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(ups.data.len(), 2);
        assert_eq!(ups.data[0].note, "second");
        let ks = keys(
            &*s,
            t,
            &PageParams::parse(&Query::parse(""), Listing::Keys, 0).unwrap(),
            &defaults,
            now,
        )
        .await
        .unwrap();
        assert_eq!(ks.data.len(), 1);
        assert_eq!(ks.data[0].usage.requests, 2);
        let json = serde_json::to_value(&ks).unwrap();
        assert_eq!(json["data"][0]["usage"]["charge"]["display"], "S/ 2.50");
    }
}
