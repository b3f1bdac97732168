//! Pages of a listing: at most `limit` items, and an opaque cursor that continues after the
//! last one.
//!
//! A cursor says where a page ended ([`Cursor`]: a day, a name, or a time and an id) and which
//! listing and query it belongs to (a [`Listing`] and a fingerprint of the query's other
//! parameters), so a cursor given to another listing or another period is refused instead of
//! answering something that looks right. It is base64url text; clients must not read it.

use crate::error::ApiError;
use std::fmt::Write;

/// Items per page when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 100;
/// The most items one page may hold.
pub const MAX_LIMIT: usize = 1000;

/// The listings that are paged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::EnumIter)]
#[strum(serialize_all = "snake_case")]
pub enum Listing {
    Usage,
    Keys,
    Requests,
    TopUps,
}

/// Where a page ended: the next page starts after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// Usage by day: the last day listed (days since 1970-01-01 in the period's offset).
    Day(i64),
    /// Usage by model or key: the last name listed.
    Name(String),
    /// Keys (oldest first), requests and top-ups (newest first): the last item's time and id.
    Time { at: i64, id: String },
}

/// `limit` and `cursor`, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageParams {
    pub limit: usize,
    pub after: Option<Cursor>,
    /// The listing and query fingerprint the next page's cursor must carry.
    pub listing: Listing,
    pub fingerprint: u64,
}

impl PageParams {
    /// Reads `limit` (1 to [`MAX_LIMIT`], [`DEFAULT_LIMIT`] if absent) and `cursor` (from a
    /// page of `listing` whose query had `fingerprint`).
    pub fn parse(
        q: &super::query::Query,
        listing: Listing,
        fingerprint: u64,
    ) -> Result<PageParams, ApiError> {
        let limit = match q.get("limit") {
            None => DEFAULT_LIMIT,
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "limit",
                        format!("limit must be a whole number from 1 to {MAX_LIMIT}, not \"{l}\""),
                    )
                })?,
        };
        let after = q
            .get("cursor")
            .map(|c| decode_cursor(listing, fingerprint, c))
            .transpose()?;
        Ok(PageParams {
            limit,
            after,
            listing,
            fingerprint,
        })
    }

    /// The cursor of the page that ended at `last`.
    pub fn next(&self, last: &Cursor) -> String {
        encode_cursor(self.listing, self.fingerprint, last)
    }
}

/// FNV-1a of the parts, `|`-separated: ties a cursor to its query.
pub fn fingerprint(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h = (h ^ u64::from(b'|')).wrapping_mul(0x0100_0000_01b3);
        }
        for b in p.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The error for a cursor that is not from this listing and query.
pub fn foreign_cursor() -> ApiError {
    ApiError::invalid(
        "cursor",
        "this cursor does not continue this query: pass the next_cursor of the previous page with the same parameters, or none to start over",
    )
}

/// The text of a cursor (see the module docs).
pub fn encode_cursor(listing: Listing, fingerprint: u64, at: &Cursor) -> String {
    let mut text = format!("1|{}|{fingerprint:016x}|", <&str>::from(listing));
    match at {
        Cursor::Day(d) => {
            let _ = write!(text, "d|{d}|");
        }
        Cursor::Name(n) => {
            let _ = write!(text, "n|0|{n}");
        }
        Cursor::Time { at, id } => {
            let _ = write!(text, "t|{at}|{id}");
        }
    }
    base64url(text.as_bytes())
}

fn decode_cursor(listing: Listing, fingerprint: u64, text: &str) -> Result<Cursor, ApiError> {
    let malformed = || {
        ApiError::invalid(
            "cursor",
            "this cursor is not one this API gave out; pass a next_cursor unchanged",
        )
    };
    let bytes = unbase64url(text).ok_or_else(malformed)?;
    let text = String::from_utf8(bytes).map_err(|_| malformed())?;
    // The last field is the rest: an id may hold `|`.
    let parts: Vec<&str> = text.splitn(6, '|').collect();
    let [version, list, fp, kind, num, rest] = parts.as_slice() else {
        return Err(malformed());
    };
    if *version != "1" {
        return Err(malformed());
    }
    if *list != <&str>::from(listing) || *fp != format!("{fingerprint:016x}") {
        return Err(foreign_cursor());
    }
    let num: i64 = num.parse().map_err(|_| malformed())?;
    match *kind {
        "d" => Ok(Cursor::Day(num)),
        "n" => Ok(Cursor::Name((*rest).to_owned())),
        "t" => Ok(Cursor::Time {
            at: num,
            id: (*rest).to_owned(),
        }),
        _ => Err(malformed()),
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64url without padding.
fn base64url(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(B64[(n >> (18 - 6 * i)) as usize & 63]));
        }
    }
    out
}

fn unbase64url(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in text.bytes() {
        let v = B64.iter().position(|&b| b == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // Leftover bits must be the zero padding of the last character.
    (bits < 6 && acc == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::super::query::Query;
    use super::*;

    #[test]
    fn base64url_round_trips() {
        for s in ["", "f", "fo", "foo", "foob", "fooba", "foobar", "ñ|id|x"] {
            assert_eq!(unbase64url(&base64url(s.as_bytes())).unwrap(), s.as_bytes());
        }
        assert_eq!(base64url(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64url(b"fo"), "Zm8");
        assert!(unbase64url("Zm9=").is_none());
        assert!(unbase64url("Zm9v!").is_none());
    }

    #[test]
    fn cursors_round_trip_and_stay_with_their_query() {
        for c in [
            Cursor::Day(20_393),
            Cursor::Name("key_0123456789ab".into()),
            Cursor::Time {
                at: 1_793_491_200_123,
                id: "topup_key:a|b".into(),
            },
        ] {
            let text = encode_cursor(Listing::Requests, 7, &c);
            assert!(text.bytes().all(|b| B64.contains(&b)), "{text}");
            assert_eq!(decode_cursor(Listing::Requests, 7, &text).unwrap(), c);
            assert_eq!(
                decode_cursor(Listing::Requests, 8, &text).unwrap_err(),
                foreign_cursor()
            );
            assert_eq!(
                decode_cursor(Listing::TopUps, 7, &text).unwrap_err(),
                foreign_cursor()
            );
        }
        let old_version = base64url(b"2|requests|0000000000000007|t|1|x");
        for junk in ["", "abc", "!!!", old_version.as_str()] {
            let e = decode_cursor(Listing::Requests, 7, junk).unwrap_err();
            assert!(
                e.message.contains("not one this API gave out"),
                "{junk}: {e:?}"
            );
        }
    }

    #[test]
    fn limits() {
        let p = |q: &str| PageParams::parse(&Query::parse(q), Listing::Keys, 0);
        assert_eq!(p("").unwrap().limit, DEFAULT_LIMIT);
        assert_eq!(p("limit=1").unwrap().limit, 1);
        assert_eq!(p("limit=1000").unwrap().limit, 1000);
        for bad in ["limit=0", "limit=1001", "limit=-1", "limit=ten"] {
            let e = p(bad).unwrap_err();
            assert!(e.message.contains("from 1 to 1000"), "{bad}: {e:?}");
        }
        let page = p("").unwrap();
        let next = page.next(&Cursor::Name("x".into()));
        assert_eq!(
            p(&format!("cursor={next}")).unwrap().after,
            Some(Cursor::Name("x".into()))
        );
    }
}
