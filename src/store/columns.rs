//! The columns of the tables whose rows both backends write and read whole, listed once: the
//! ledger's request rows ([`LEDGER_COLUMNS`], bound from `rows::RawLedgerRow`) and the
//! dead-letter table ([`REJECT_COLUMNS`], bound from [`RejectedRow`]). Both stores build their
//! `INSERT` and `SELECT` statements and their row mapping from these lists, so the column
//! names, their order and their types are written nowhere else in Rust.
//!
//! **Adding a ledger column** takes three edits: a migration in `schema.rs` (both dialects),
//! the field in the [`table_row!`] list that defines `rows::RawLedgerRow`, and the
//! [`LedgerRow`](super::LedgerRow) field it carries. Forgetting either field fails to compile
//! (the conversions between the two structs build or destructure every field); a list
//! that disagrees with the migrated table in a name, a type or nullability fails the store
//! suite's `ledger_columns_match_the_migrated_table` on SQLite and on PostgreSQL.
//!
//! A column's types follow from its Rust type ([`SqlType`]): `String` is `TEXT`/`text`, `i64`
//! `INTEGER`/`bigint`, `i32` `INTEGER`/`integer`, `bool` `INTEGER` (0 or 1)/`boolean`, and
//! `Option<T>` is the nullable column of `T`.

use super::RejectedRow;
use tokio_postgres::types::Type;

/// One column of a table, as the migrations declare it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    /// The declared SQLite type, as `PRAGMA table_info` reports it (`TEXT`, `INTEGER`).
    pub sqlite_type: &'static str,
    /// The PostgreSQL type, as `information_schema.columns.data_type` reports it (`text`,
    /// `bigint`, `integer`, `boolean`); also the name a query casts an array to (`text[]`).
    pub pg_type: &'static str,
    /// `NULL` allowed.
    pub nullable: bool,
}

/// How a Rust value is stored by each backend; see the module docs.
pub trait SqlType {
    const SQLITE: &'static str;
    const PG: &'static str;
    /// The PostgreSQL parameter type of one value, and of an array of them.
    const PG_TYPE: Type;
    const PG_ARRAY: Type;
    const NULLABLE: bool = false;
}

/// `impl SqlType` for a non-null Rust type: its SQLite and PostgreSQL types, and the
/// PostgreSQL parameter types of one value and of an array.
macro_rules! sql_type {
    ($($rust:ty => $sqlite:literal, $pg:literal, $one:ident, $array:ident;)+) => {$(
        impl SqlType for $rust {
            const SQLITE: &'static str = $sqlite;
            const PG: &'static str = $pg;
            const PG_TYPE: Type = Type::$one;
            const PG_ARRAY: Type = Type::$array;
        }
    )+};
}

sql_type! {
    String => "TEXT", "text", TEXT, TEXT_ARRAY;
    i64 => "INTEGER", "bigint", INT8, INT8_ARRAY;
    i32 => "INTEGER", "integer", INT4, INT4_ARRAY;
    bool => "INTEGER", "boolean", BOOL, BOOL_ARRAY;
}

impl<T: SqlType> SqlType for Option<T> {
    const SQLITE: &'static str = T::SQLITE;
    const PG: &'static str = T::PG;
    const PG_TYPE: Type = T::PG_TYPE;
    const PG_ARRAY: Type = T::PG_ARRAY;
    const NULLABLE: bool = true;
}

/// Implements, for a struct whose fields are a table's columns, the column list and the row
/// mapping of both backends, from one list of `field: Type` in column order. The form
/// `table_row!(struct Row, COLUMNS, batch Batch { … })` also defines the struct (`pub(crate)`,
/// every field `pub`) from the same list, so its fields are written once.
///
/// - `const $COLUMNS: &[Column]`;
/// - `sqlite_params(&self)`, the values in column order for `?1, ?2, …`, and
///   `from_sqlite(&row)`, which reads each column by name;
/// - `pg_params(&self)` (values with their types) and `from_pg(&row)`;
/// - with `batch $Batch`, a struct of one `Vec` per column whose `pg_params` bind them as the
///   arrays of one `INSERT … SELECT … FROM UNNEST(…)` ([`unnest`]).
///
/// The struct literal in `from_sqlite`/`from_pg` names every field, so a field missing from
/// the list fails to compile.
macro_rules! table_row {
    ($row:ident, $columns:ident { $($field:ident: $ty:ty),+ $(,)? }) => {
        pub const $columns: &[$crate::store::columns::Column] = &[$(
            $crate::store::columns::Column {
                name: stringify!($field),
                sqlite_type: <$ty as $crate::store::columns::SqlType>::SQLITE,
                pg_type: <$ty as $crate::store::columns::SqlType>::PG,
                nullable: <$ty as $crate::store::columns::SqlType>::NULLABLE,
            }
        ),+];

        impl $row {
            /// The values in column order, for `?1, ?2, …`.
            pub(crate) fn sqlite_params(&self) -> Vec<&dyn rusqlite::ToSql> {
                vec![$(&self.$field as &dyn rusqlite::ToSql),+]
            }

            /// A row selected with every column of the list (read by name).
            pub(crate) fn from_sqlite(r: &rusqlite::Row<'_>) -> rusqlite::Result<$row> {
                Ok($row { $($field: r.get::<_, $ty>(stringify!($field))?),+ })
            }

            /// The values in column order with their types, for `$1, $2, …`.
            #[allow(dead_code, reason = "a table written in batches binds its batch instead")]
            pub(crate) fn pg_params(
                &self,
            ) -> Vec<(&(dyn tokio_postgres::types::ToSql + Sync), tokio_postgres::types::Type)>
            {
                vec![$((
                    &self.$field as &(dyn tokio_postgres::types::ToSql + Sync),
                    <$ty as $crate::store::columns::SqlType>::PG_TYPE,
                )),+]
            }

            /// A row selected with every column of the list (read by name).
            pub(crate) fn from_pg(
                r: &tokio_postgres::Row,
            ) -> Result<$row, tokio_postgres::Error> {
                Ok($row { $($field: r.try_get::<_, $ty>(stringify!($field))?),+ })
            }
        }
    };
    (
        $(#[$attr:meta])*
        struct $row:ident, $columns:ident, batch $batch:ident {
            $($(#[$field_attr:meta])* $field:ident: $ty:ty),+ $(,)?
        }
    ) => {
        $(#[$attr])*
        pub(crate) struct $row {
            $($(#[$field_attr])* pub $field: $ty,)+
        }

        $crate::store::columns::table_row!($row, $columns { $($field: $ty),+ });

        /// Rows as one array per column, for `INSERT … SELECT … FROM UNNEST(…)`.
        #[derive(Default)]
        pub(crate) struct $batch {
            $(pub(crate) $field: Vec<$ty>,)+
        }

        impl $batch {
            pub(crate) fn push(&mut self, row: $row) {
                $(self.$field.push(row.$field);)+
            }

            /// The arrays in column order with their types, for `$1, $2, …`.
            pub(crate) fn pg_params(
                &self,
            ) -> Vec<(&(dyn tokio_postgres::types::ToSql + Sync), tokio_postgres::types::Type)>
            {
                vec![$((
                    &self.$field as &(dyn tokio_postgres::types::ToSql + Sync),
                    <$ty as $crate::store::columns::SqlType>::PG_ARRAY,
                )),+]
            }
        }
    };
}
pub(crate) use table_row;

table_row!(
    RejectedRow,
    REJECT_COLUMNS {
        request_id: String,
        tenant_id: i64,
        row_json: String,
        reason: String,
        rejected_at: i64,
    }
);

/// The ledger's columns that a request row does not bind: `kind` (a constant per statement)
/// and `note` (top-ups only). With [`LEDGER_COLUMNS`], every column of the table.
pub const LEDGER_OTHER_COLUMNS: &[Column] = &[
    Column {
        name: "kind",
        sqlite_type: "TEXT",
        pg_type: "text",
        nullable: false,
    },
    Column {
        name: "note",
        sqlite_type: "TEXT",
        pg_type: "text",
        nullable: true,
    },
];

pub use super::rows::LEDGER_COLUMNS;

/// `a, b, c`.
pub(crate) fn names(columns: &[Column]) -> String {
    columns
        .iter()
        .map(|c| c.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `$1, $2, …` (see `sql::Sql` for SQLite's).
pub(crate) fn placeholders(columns: &[Column]) -> String {
    (1..=columns.len())
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `UNNEST($1::text[], $2::bigint[], …) AS alias(a, b, …)`: one row per array element, its
/// columns named as the table's.
pub(crate) fn unnest(columns: &[Column], alias: &str) -> String {
    let arrays = columns
        .iter()
        .enumerate()
        .map(|(i, c)| format!("${}::{}[]", i + 1, c.pg_type))
        .collect::<Vec<_>>()
        .join(", ");
    format!("UNNEST({arrays}) AS {alias}({})", names(columns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_built_from_the_list() {
        let cols = &LEDGER_COLUMNS[..2];
        assert_eq!(names(cols), "entry_id, tenant_id");
        assert_eq!(placeholders(cols), "$1, $2");
        assert_eq!(
            unnest(cols, "u"),
            "UNNEST($1::text[], $2::bigint[]) AS u(entry_id, tenant_id)"
        );
    }

    #[test]
    fn the_ledger_lists_name_each_column_once() {
        let mut all: Vec<&str> = LEDGER_COLUMNS
            .iter()
            .chain(LEDGER_OTHER_COLUMNS)
            .map(|c| c.name)
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "{all:?}");
        let reject: Vec<&str> = REJECT_COLUMNS.iter().map(|c| c.name).collect();
        assert_eq!(
            reject,
            [
                "request_id",
                "tenant_id",
                "row_json",
                "reason",
                "rejected_at"
            ]
        );
    }
}
