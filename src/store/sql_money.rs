//! Exact money and counters in SQL columns, shared by both backends.
//!
//! Two column shapes, never a float:
//!
//! * **Per-entry amounts** (a ledger row's `delta`) are `BIGINT`/`INTEGER` pico-soles. A
//!   request's charge or a top-up fits easily (i64 holds ±9,223,372.036854775807 soles; a
//!   single top-up is capped far below that by `ops`); [`pen_to_i64`] refuses anything that
//!   does not, rather than truncating.
//! * **Running amounts** (a tenant's materialised balance, a lease) may exceed i64 pico-soles
//!   (S/ 10 million is already 10¹⁹ picos), so they are exact decimal integers of pico-soles:
//!   PostgreSQL `NUMERIC(40,0)` bound and read as text, SQLite `TEXT` (never `NUMERIC`
//!   affinity, which would turn a large value into a float). [`pen_to_text`] and
//!   [`pen_from_text`] convert.
//!
//! Sums over many entries are done so they cannot overflow and never go through floats.
//! PostgreSQL's `SUM(bigint)` is an exact `NUMERIC`. SQLite's `SUM` raises on i64 overflow and
//! `TOTAL` is a float, so SQLite sums each value split in two, `v / 2³²` and `v % 2³²` (both
//! exact i64 sums for up to 2³¹ rows), and [`recombine`] joins them in i128. The statements
//! select either form from one text (`sql`: `Backend::split`, `Backend::summed`).

use super::{StoreError, StoreResult};
use crate::money::Pen;

/// The split point of SQLite sums (see the module docs). `v == (v / SPLIT) * SPLIT + v % SPLIT`
/// holds for every i64 under SQLite's truncating division.
pub const SPLIT: i64 = 1 << 32;

/// Joins the two halves of a split sum (see [`SPLIT`]).
pub fn recombine(high: i64, low: i64) -> i128 {
    i128::from(high) * i128::from(SPLIT) + i128::from(low)
}

/// A running amount as its exact decimal integer of pico-soles (`"-1500000"`).
pub fn pen_to_text(p: Pen) -> String {
    p.picos().to_string()
}

/// Reads a running amount written by [`pen_to_text`] (or PostgreSQL's `NUMERIC::text`).
pub fn pen_from_text(text: &str, what: &str) -> StoreResult<Pen> {
    let t = text.trim();
    // `NUMERIC(40,0)` never prints a fraction, but an unconstrained numeric result might print
    // `123.000`; accept only an all-zero fraction so nothing is ever rounded.
    let int_part = match t.split_once('.') {
        Some((i, f)) if f.bytes().all(|b| b == b'0') => i,
        Some(_) => {
            return Err(StoreError::Backend(format!(
                "{what} holds \"{text}\", which is not a whole number of pico-soles"
            )))
        }
        None => t,
    };
    int_part.parse::<i128>().map(Pen::from_picos).map_err(|_| {
        StoreError::Backend(format!(
            "{what} holds \"{text}\", which is not an integer amount of pico-soles"
        ))
    })
}

/// A per-entry amount as i64 pico-soles, or an error naming `what` if it does not fit.
pub fn pen_to_i64(p: Pen, what: &str) -> StoreResult<i64> {
    i64::try_from(p.picos()).map_err(|_| {
        StoreError::Backend(format!(
            "{what} of {} soles does not fit a ledger entry (at most {} soles)",
            p.to_decimal(),
            Pen::from_picos(i128::from(i64::MAX)).to_decimal()
        ))
    })
}

/// A token count or limit as a SQL `BIGINT`.
pub fn u64_to_i64(v: u64, what: &str) -> StoreResult<i64> {
    i64::try_from(v).map_err(|_| StoreError::Backend(format!("{what} = {v} is too large to store")))
}

/// A SQL `BIGINT` read back as a count; a negative value means the row was corrupted.
pub fn i64_to_u64(v: i64, what: &str) -> StoreResult<u64> {
    u64::try_from(v).map_err(|_| StoreError::Backend(format!("{what} is negative ({v})")))
}

/// A count summed in i128 (split sums, PostgreSQL `NUMERIC` sums) back to `u64`.
pub fn i128_to_u64(v: i128, what: &str) -> StoreResult<u64> {
    u64::try_from(v).map_err(|_| StoreError::Backend(format!("{what} = {v} is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip_beyond_i64() {
        for picos in [
            0i128,
            1,
            -1,
            i128::from(i64::MAX) + 1,
            -i128::from(i64::MAX) * 1000,
            10i128.pow(30),
        ] {
            let p = Pen::from_picos(picos);
            assert_eq!(pen_from_text(&pen_to_text(p), "x").unwrap(), p);
        }
        assert_eq!(pen_from_text("12.000", "x").unwrap().picos(), 12);
        assert!(pen_from_text("12.5", "x").is_err());
        assert!(pen_from_text("1e5", "x").is_err());
        assert!(pen_from_text("", "x").is_err());
    }

    #[test]
    fn split_recombines_every_sign() {
        for v in [
            0i64,
            1,
            -1,
            i64::MAX,
            i64::MIN + 1,
            SPLIT,
            -SPLIT - 7,
            123_456_789_012,
        ] {
            // SQLite integer division truncates toward zero, like Rust's.
            assert_eq!(recombine(v / SPLIT, v % SPLIT), i128::from(v), "{v}");
        }
    }

    #[test]
    fn per_entry_amounts_must_fit() {
        assert_eq!(pen_to_i64(Pen::from_picos(5), "charge").unwrap(), 5);
        let e = pen_to_i64(Pen::from_picos(i128::from(i64::MAX) + 1), "charge").unwrap_err();
        assert!(e.to_string().contains("charge of 9223372.036854775808"));
    }
}
