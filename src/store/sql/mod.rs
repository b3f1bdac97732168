//! The SQL both backends send, written once: a small dialect layer and the statements on which
//! SQLite and PostgreSQL agree (see the store's module docs for why this and not a query builder
//! or `sqlx`).
//!
//! - **Statements** are written in PostgreSQL's placeholders (`$1`, `$2`, …) and standard SQL
//!   both accept (`CAST(x AS TEXT)`, `RETURNING`, row-value comparisons). An [`Sql`] renders
//!   its text once per backend, on first use, and keeps it: SQLite's copy has `?1`, `?2`, ….
//!   A statement whose text differs by dialect is built from the few fragments the [`Backend`]
//!   gives: the parts of a sum ([`Backend::split`], [`Backend::rollup`]), how they are summed
//!   or read exactly ([`Backend::summed`], [`Backend::read`]), bytewise order
//!   ([`Backend::bytewise`]) and row locks ([`Backend::lock`]).
//! - **Values** are bound as [`SqlValue`]s, which both drivers take.
//! - **Rows** are read through [`Cols`], a cursor over a row of either driver: each read takes
//!   the next column(s), so a sum that is two columns on SQLite and one on PostgreSQL reads
//!   alike ([`Cols::sum`]).
//!
//! The statements themselves live by concern: [`tenants`] (tenants and keys), [`ledger`]
//! (top-ups, rejects, statements, raw rows), [`usage`] (the account API's reads) and
//! [`responses`] (stored responses). What stays per backend is what differs by design: the
//! transactions (SQLite's `BEGIN IMMEDIATE` on one connection, PostgreSQL's pooled connections,
//! row locks and retries), the money-moving writes (`record`, top-ups' balance, leases: SQLite
//! computes running amounts in Rust on TEXT columns, PostgreSQL in `NUMERIC` under row locks,
//! in batches through `UNNEST`), the roll-up upserts (split columns with carries against
//! `NUMERIC`), the rate windows, and the clock (PostgreSQL's own for leases and windows).

pub mod ledger;
pub mod responses;
pub mod tenants;
pub mod usage;
pub mod webhooks;

use super::sql_money::{pen_from_text, recombine};
use super::{Backend, StoreError, StoreResult};
use crate::money::Pen;
use std::borrow::Cow;
use std::sync::OnceLock;

/// How a statement's text is had: as written, or built from the backend's fragments.
enum Source {
    Text(&'static str),
    Built(fn(Backend) -> String),
}

/// One statement for both backends, rendered for each once (see the module docs).
pub struct Sql {
    source: Source,
    sqlite: OnceLock<String>,
    postgres: OnceLock<String>,
}

impl Sql {
    /// A statement that reads the same in both dialects but for its placeholders.
    pub const fn text(text: &'static str) -> Sql {
        Sql {
            source: Source::Text(text),
            sqlite: OnceLock::new(),
            postgres: OnceLock::new(),
        }
    }

    /// A statement built from the backend's fragments (`$N` placeholders).
    pub const fn built(build: fn(Backend) -> String) -> Sql {
        Sql {
            source: Source::Built(build),
            sqlite: OnceLock::new(),
            postgres: OnceLock::new(),
        }
    }

    /// The statement's text for `backend`.
    pub fn get(&self, backend: Backend) -> &str {
        let slot = match backend {
            Backend::Sqlite => &self.sqlite,
            Backend::Postgres => &self.postgres,
        };
        slot.get_or_init(|| {
            let text = match self.source {
                Source::Text(t) => Cow::Borrowed(t),
                Source::Built(build) => Cow::Owned(build(backend)),
            };
            backend.placeholders(&text).into_owned()
        })
    }
}

impl Backend {
    /// `text` with its `$N` placeholders as this backend numbers them (`?N` for SQLite). A
    /// `$` before a digit is always a placeholder: no statement has one in a literal.
    pub fn placeholders(self, text: &str) -> Cow<'_, str> {
        match self {
            Backend::Postgres => Cow::Borrowed(text),
            Backend::Sqlite => {
                let mut out = String::with_capacity(text.len());
                let mut chars = text.chars().peekable();
                while let Some(c) = chars.next() {
                    let placeholder = c == '$' && chars.peek().is_some_and(char::is_ascii_digit);
                    out.push(if placeholder { '?' } else { c });
                }
                Cow::Owned(out)
            }
        }
    }

    /// `expr` (an integer) as the parts of a sum over it: SQLite sums the two halves
    /// `expr / 2^32` and `expr % 2^32` (each an exact i64 sum for up to 2^31 rows), PostgreSQL
    /// the `NUMERIC` (see `sql_money`). Each part is summed with [`Backend::summed`] and the
    /// parts read back with [`Cols::sum`].
    pub fn split(self, expr: &str) -> Vec<String> {
        match self {
            Backend::Sqlite => vec![
                format!("({expr}) / 4294967296"),
                format!("({expr}) % 4294967296"),
            ],
            Backend::Postgres => vec![format!("CAST({expr} AS NUMERIC)")],
        }
    }

    /// `SUM(part)` as the backend reads it back exactly: an integer on SQLite, the `NUMERIC`'s
    /// text on PostgreSQL.
    pub fn summed(self, part: &str) -> String {
        match self {
            Backend::Sqlite => format!("SUM({part})"),
            Backend::Postgres => format!("CAST(SUM({part}) AS TEXT)"),
        }
    }

    /// A roll-up table's sum column (`input`, `cached`, `output`, `charge`) as stored: SQLite
    /// keeps each sum in two integer columns (`x_hi`, `x_lo`), PostgreSQL in one `NUMERIC`
    /// (`x_tokens`, `charge`). Select them with [`Backend::read`] or [`Backend::summed`].
    pub fn rollup(self, sum: &str, alias: &str) -> Vec<String> {
        match self {
            Backend::Sqlite => vec![format!("{alias}{sum}_hi"), format!("{alias}{sum}_lo")],
            Backend::Postgres if sum == "charge" => vec![format!("{alias}charge")],
            Backend::Postgres => vec![format!("{alias}{sum}_tokens")],
        }
    }

    /// A part of a stored sum as [`Cols::sum`] reads it: the integer on SQLite, the
    /// `NUMERIC`'s text on PostgreSQL.
    pub fn read(self, part: &str) -> String {
        match self {
            Backend::Sqlite => part.to_owned(),
            Backend::Postgres => format!("CAST({part} AS TEXT)"),
        }
    }

    /// `expr` compared and sorted bytewise: SQLite's default; PostgreSQL's `COLLATE "C"`.
    pub fn bytewise(self, expr: &str) -> String {
        match self {
            Backend::Sqlite => expr.to_owned(),
            Backend::Postgres => format!("{expr} COLLATE \"C\""),
        }
    }

    /// A row lock for the rest of the transaction (`FOR UPDATE`, `FOR NO KEY UPDATE`) on
    /// PostgreSQL; nothing on SQLite, whose write transactions hold the whole database.
    pub fn lock(self, clause: &'static str) -> &'static str {
        match self {
            Backend::Sqlite => "",
            Backend::Postgres => clause,
        }
    }
}

/// The four sums of the roll-ups and of a usage row, in the order they are read.
pub const SUMS: [&str; 4] = ["input", "cached", "output", "charge"];

/// A value bound to a statement, as both drivers take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlValue<'a> {
    Int(i64),
    OptInt(Option<i64>),
    Text(&'a str),
    OptText(Option<&'a str>),
    Blob(&'a [u8]),
}

impl SqlValue<'_> {
    /// Its PostgreSQL parameter type.
    pub fn pg_type(&self) -> tokio_postgres::types::Type {
        use tokio_postgres::types::Type;
        match self {
            SqlValue::Int(_) | SqlValue::OptInt(_) => Type::INT8,
            SqlValue::Text(_) | SqlValue::OptText(_) => Type::TEXT,
            SqlValue::Blob(_) => Type::BYTEA,
        }
    }
}

/// `values` as `query_typed` takes them.
pub fn pg_params<'v>(
    values: &'v [SqlValue<'_>],
) -> Vec<(
    &'v (dyn tokio_postgres::types::ToSql + Sync),
    tokio_postgres::types::Type,
)> {
    values
        .iter()
        .map(|v| (v as &(dyn tokio_postgres::types::ToSql + Sync), v.pg_type()))
        .collect()
}

impl rusqlite::ToSql for SqlValue<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match *self {
            SqlValue::Int(v) | SqlValue::OptInt(Some(v)) => ValueRef::Integer(v),
            SqlValue::OptInt(None) => ValueRef::Null,
            SqlValue::Text(t) | SqlValue::OptText(Some(t)) => ValueRef::Text(t.as_bytes()),
            SqlValue::OptText(None) => ValueRef::Null,
            SqlValue::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

impl tokio_postgres::types::ToSql for SqlValue<'_> {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            SqlValue::Int(v) => v.to_sql(ty, out),
            SqlValue::OptInt(v) => v.to_sql(ty, out),
            SqlValue::Text(t) => t.to_sql(ty, out),
            SqlValue::OptText(t) => t.to_sql(ty, out),
            SqlValue::Blob(b) => b.to_sql(ty, out),
        }
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <i64 as tokio_postgres::types::ToSql>::accepts(ty)
            || <&str as tokio_postgres::types::ToSql>::accepts(ty)
            || <&[u8] as tokio_postgres::types::ToSql>::accepts(ty)
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A row of either driver, column by column (`None` for `NULL`).
pub trait SqlRow {
    /// Which backend's row: how a sum is laid out ([`Cols::sum`]).
    fn backend(&self) -> Backend;
    fn int(&self, i: usize) -> StoreResult<Option<i64>>;
    fn text(&self, i: usize) -> StoreResult<Option<String>>;
    fn blob(&self, i: usize) -> StoreResult<Option<Vec<u8>>>;
}

fn column_error(backend: Backend, i: usize, e: &dyn std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("{backend}: column {i}: {e}"))
}

impl SqlRow for rusqlite::Row<'_> {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }
    fn int(&self, i: usize) -> StoreResult<Option<i64>> {
        self.get(i).map_err(|e| column_error(self.backend(), i, &e))
    }
    fn text(&self, i: usize) -> StoreResult<Option<String>> {
        self.get(i).map_err(|e| column_error(self.backend(), i, &e))
    }
    fn blob(&self, i: usize) -> StoreResult<Option<Vec<u8>>> {
        self.get(i).map_err(|e| column_error(self.backend(), i, &e))
    }
}

impl SqlRow for tokio_postgres::Row {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }
    fn int(&self, i: usize) -> StoreResult<Option<i64>> {
        self.try_get(i)
            .map_err(|e| column_error(self.backend(), i, &e))
    }
    fn text(&self, i: usize) -> StoreResult<Option<String>> {
        self.try_get(i)
            .map_err(|e| column_error(self.backend(), i, &e))
    }
    fn blob(&self, i: usize) -> StoreResult<Option<Vec<u8>>> {
        self.try_get(i)
            .map_err(|e| column_error(self.backend(), i, &e))
    }
}

/// Reads a row's columns in order: each call takes the next column (two for a SQLite sum).
pub struct Cols<'r> {
    row: &'r dyn SqlRow,
    at: usize,
}

impl<'r> Cols<'r> {
    pub fn new(row: &'r dyn SqlRow) -> Self {
        Cols { row, at: 0 }
    }

    fn next(&mut self) -> usize {
        self.at += 1;
        self.at - 1
    }

    fn required<T>(&self, i: usize, v: Option<T>) -> StoreResult<T> {
        v.ok_or_else(|| column_error(self.row.backend(), i, &"unexpected NULL"))
    }

    pub fn opt_int(&mut self) -> StoreResult<Option<i64>> {
        self.row.int(self.next())
    }

    pub fn int(&mut self) -> StoreResult<i64> {
        let i = self.next();
        self.required(i, self.row.int(i)?)
    }

    pub fn opt_text(&mut self) -> StoreResult<Option<String>> {
        self.row.text(self.next())
    }

    pub fn text(&mut self) -> StoreResult<String> {
        let i = self.next();
        self.required(i, self.row.text(i)?)
    }

    pub fn blob(&mut self) -> StoreResult<Vec<u8>> {
        let i = self.next();
        self.required(i, self.row.blob(i)?)
    }

    /// Passes over a column.
    pub fn skip(&mut self) {
        self.next();
    }

    /// A running amount (a balance, a lease) as its decimal text (see `sql_money`).
    pub fn pen(&mut self, what: &str) -> StoreResult<Pen> {
        pen_from_text(&self.text()?, what)
    }

    /// A sum as [`Backend::summed`] or [`Backend::read`] select its parts:
    /// two integer halves on SQLite, a `NUMERIC`'s text on PostgreSQL; `NULL` (no rows) is 0.
    pub fn sum(&mut self, what: &str) -> StoreResult<i128> {
        match self.row.backend() {
            Backend::Sqlite => {
                let hi = self.opt_int()?.unwrap_or(0);
                let lo = self.opt_int()?.unwrap_or(0);
                Ok(recombine(hi, lo))
            }
            Backend::Postgres => match self.opt_text()? {
                Some(t) => Ok(pen_from_text(&t, what)?.picos()),
                None => Ok(0),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_is_rendered_once_per_backend() {
        static S: Sql = Sql::text("SELECT a FROM t WHERE b = $1 AND c IN ($2, $10) AND d = '$'");
        assert_eq!(
            S.get(Backend::Sqlite),
            "SELECT a FROM t WHERE b = ?1 AND c IN (?2, ?10) AND d = '$'"
        );
        assert_eq!(
            S.get(Backend::Postgres),
            "SELECT a FROM t WHERE b = $1 AND c IN ($2, $10) AND d = '$'"
        );
        assert!(std::ptr::eq(S.get(Backend::Sqlite), S.get(Backend::Sqlite)));
        static B: Sql = Sql::built(|b| format!("SELECT {} FROM t", b.split("x").join(", ")));
        assert_eq!(
            B.get(Backend::Sqlite),
            "SELECT (x) / 4294967296, (x) % 4294967296 FROM t"
        );
        assert_eq!(B.get(Backend::Postgres), "SELECT CAST(x AS NUMERIC) FROM t");
    }

    #[test]
    fn sums_read_back_exactly_on_sqlite() {
        let c = rusqlite::Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (9223372036854775807), \
             (9223372036854775807), (-5), (3)",
        )
        .unwrap();
        let parts = Backend::Sqlite.split("x");
        let sql = format!(
            "SELECT {}, {} FROM t",
            Backend::Sqlite.summed(&parts[0]),
            Backend::Sqlite.summed(&parts[1])
        );
        let got = c
            .query_row(&sql, [], |r| Ok(Cols::new(r).sum("x").unwrap()))
            .unwrap();
        assert_eq!(got, 2 * i128::from(i64::MAX) - 2);
        let empty = c
            .query_row(&format!("{sql} WHERE x > 10000000000000000000"), [], |r| {
                Ok(Cols::new(r).sum("x").unwrap())
            })
            .unwrap();
        assert_eq!(empty, 0);
    }
}
