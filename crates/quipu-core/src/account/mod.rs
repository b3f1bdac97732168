//! The tenant's own view of its money — `GET /v1/account`, `/v1/usage`, `/v1/keys`,
//! `/v1/requests`, `/v1/topups` and their twins on the admin API — as far as it is pure: how
//! their query strings read ([`query`]), the periods they cover and the bounds those are held to
//! ([`period`]), and the pages a listing is cut into, continued by opaque cursors ([`page`]).
//!
//! Nothing here reads a store or a clock: the caller passes "now" in. The store queries are in
//! the binary's `store::usage`, the JSON the tenant reads in its `ops::account`.
//!
//! ```
//! use quipu_core::account::{page::Listing, query::Query, UsageParams, GroupBy};
//! let now = 1_796_083_200_000; // 2026-12-01T00:00:00Z
//! let q = Query::parse("from=2026-11-01&to=2026-11-30&group_by=model&limit=2");
//! let p = UsageParams::parse(&q, now).unwrap();
//! assert_eq!(p.group_by, GroupBy::Model);
//! assert_eq!(p.period.to - p.period.from, 30 * 86_400_000);
//! assert_eq!(p.page.limit, 2);
//! ```

pub mod page;
pub mod period;
pub mod query;

use crate::error::ApiError;
use page::{Cursor, Listing, PageParams};
use period::Period;
use query::Query;

/// How `GET /v1/usage` groups the tenant's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::EnumIter)]
#[strum(serialize_all = "snake_case")]
pub enum GroupBy {
    /// One entry per day of the period (in the period's UTC offset), empty days included.
    Day,
    /// One entry per model used in the period.
    Model,
    /// One entry per key used in the period.
    Key,
}

impl GroupBy {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    fn parse(text: &str) -> Result<GroupBy, ApiError> {
        use strum::IntoEnumIterator;
        GroupBy::iter().find(|g| g.as_str() == text).ok_or_else(|| {
            ApiError::invalid(
                "group_by",
                format!("group_by must be day, model or key, not \"{text}\""),
            )
        })
    }
}

/// The parameters of `GET /v1/usage`, read and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageParams {
    pub period: Period,
    pub group_by: GroupBy,
    pub page: PageParams,
}

impl UsageParams {
    /// The parameters the endpoint takes.
    pub const NAMES: &'static [&'static str] =
        &["from", "to", "utc_offset", "group_by", "limit", "cursor"];

    /// Reads `from`, `to`, `utc_offset` (see [`Period::parse`]), `group_by` (`day` by default),
    /// `limit` and `cursor` (see [`PageParams::parse`]). A cursor only continues the query it
    /// came from: the same period and grouping.
    pub fn parse(q: &Query, now_ms: i64) -> Result<UsageParams, ApiError> {
        q.only(Self::NAMES)?;
        let period = Period::parse(q.get("from"), q.get("to"), q.get("utc_offset"), now_ms)?;
        let group_by = match q.get("group_by") {
            Some(g) => GroupBy::parse(g)?,
            None => GroupBy::Day,
        };
        let fingerprint = page::fingerprint(&[
            &period.from.to_string(),
            &period.to.to_string(),
            &period.offset_ms.to_string(),
            group_by.as_str(),
        ]);
        let page = PageParams::parse(q, Listing::Usage, fingerprint)?;
        if let Some(c) = &page.after {
            let fits = match (group_by, c) {
                (GroupBy::Day, Cursor::Day(_)) => true,
                (GroupBy::Model | GroupBy::Key, Cursor::Name(_)) => true,
                (GroupBy::Day, Cursor::Name(_) | Cursor::Time { .. })
                | (GroupBy::Model | GroupBy::Key, Cursor::Day(_) | Cursor::Time { .. }) => false,
            };
            if !fits {
                return Err(page::foreign_cursor());
            }
        }
        Ok(UsageParams {
            period,
            group_by,
            page,
        })
    }
}

/// The parameters of the other listings (`/v1/keys`, `/v1/requests`, `/v1/topups`): a page.
pub fn list_params(q: &Query, listing: Listing) -> Result<PageParams, ApiError> {
    q.only(&["limit", "cursor"])?;
    PageParams::parse(q, listing, 0)
}

/// `GET /v1/account` takes `utc_offset` only (where "today" and "this month" begin): its
/// milliseconds east of UTC, 0 if absent.
pub fn account_params(q: &Query) -> Result<i64, ApiError> {
    q.only(&["utc_offset"])?;
    q.get("utc_offset").map_or(Ok(0), period::parse_offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_083_200_000 + 5_000; // 2026-12-01T00:00:05Z

    fn parse(q: &str) -> Result<UsageParams, ApiError> {
        UsageParams::parse(&Query::parse(q), NOW)
    }

    #[test]
    fn defaults_are_the_last_30_days_by_day() {
        let p = parse("").unwrap();
        assert_eq!(p.group_by, GroupBy::Day);
        // To the end of today (UTC), 30 whole days.
        assert_eq!(p.period.to, 1_796_083_200_000 + 86_400_000);
        assert_eq!(p.period.to - p.period.from, 30 * 86_400_000);
        assert_eq!(p.page.limit, page::DEFAULT_LIMIT);
        assert_eq!(p.page.after, None);
    }

    #[test]
    fn group_by_and_unknown_parameters() {
        assert_eq!(parse("group_by=key").unwrap().group_by, GroupBy::Key);
        let e = parse("group_by=week").unwrap_err();
        assert!(e.message.contains("day, model or key"), "{e:?}");
        assert_eq!(
            e.kind,
            crate::error::ErrorKind::InvalidRequest {
                param: Some("group_by".into())
            }
        );
        let e = parse("groupby=day").unwrap_err();
        assert!(e.message.contains("groupby"), "{e:?}");
        assert!(e.message.contains("group_by"), "{e:?}");
    }

    #[test]
    fn a_cursor_continues_only_its_own_query() {
        let p = parse("from=2026-11-01&to=2026-11-30&group_by=model").unwrap();
        let c = page::encode_cursor(
            Listing::Usage,
            page::fingerprint(&[
                &p.period.from.to_string(),
                &p.period.to.to_string(),
                "0",
                "model",
            ]),
            &Cursor::Name("colibri".into()),
        );
        let again = parse(&format!(
            "from=2026-11-01&to=2026-11-30&group_by=model&cursor={c}"
        ))
        .unwrap();
        assert_eq!(again.page.after, Some(Cursor::Name("colibri".into())));
        // Another period, another grouping, another listing: refused.
        for q in [
            format!("from=2026-11-02&to=2026-11-30&group_by=model&cursor={c}"),
            format!("from=2026-11-01&to=2026-11-30&group_by=key&cursor={c}"),
        ] {
            let e = parse(&q).unwrap_err();
            assert!(e.message.contains("cursor"), "{q}: {e:?}");
        }
        let e = list_params(&Query::parse(&format!("cursor={c}")), Listing::Requests).unwrap_err();
        assert!(e.message.contains("cursor"), "{e:?}");
    }

    #[test]
    fn other_listings_take_a_page_only() {
        let p = list_params(&Query::parse("limit=5"), Listing::Keys).unwrap();
        assert_eq!(p.limit, 5);
        assert!(list_params(&Query::parse("from=2026-01-01"), Listing::Keys).is_err());
        assert_eq!(account_params(&Query::parse("")).unwrap(), 0);
        assert_eq!(
            account_params(&Query::parse("utc_offset=-05:00")).unwrap(),
            -5 * period::HOUR_MS
        );
        assert!(account_params(&Query::parse("x=1")).is_err());
    }
}
