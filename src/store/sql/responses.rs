//! The `responses` table (migration 4): stored responses of the Responses API, the statements
//! both backends' [`ResponseStore`](crate::store::ResponseStore) send (`sqlite/responses.rs`,
//! `postgres/responses.rs`), and their rows.
//!
//! One row per response: its id, tenant, key, model, `created_at`, the response object, the
//! conversation's input items and their `size` (what the per-tenant cap counts), indexed by
//! (tenant, created_at), for the cap and the retention (there is no index by age alone: each
//! stored response would pay for it, see the schema's migration 6). Every read and delete
//! names the tenant: another tenant's id reads as missing.
//!
//! The cleanup ([`prune_responses`](crate::store::ResponseStore::prune_responses)) deletes
//! by age, tenant by tenant through the (tenant, created_at) index, then, per tenant, the
//! oldest rows beyond the cap: a window sum over the tenant's rows newest first, so the newest
//! responses that fit are kept. Both run in one statement each; a cleanup that races a write
//! at worst leaves a row for the next pass.

use super::{Cols, Sql, SqlValue};
use crate::store::{StoreError, StoreResult, StoredResponse, TenantId};

/// The columns of a response, as [`response`] reads them and [`values`] binds them.
const COLUMNS: &str = "id, tenant_id, key_id, model, created_at, response, input_items, size";

/// One response ([`values`]); an id already stored is left as it is.
pub static INSERT: Sql = Sql::built(|_| {
    format!(
        "INSERT INTO responses ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (id) DO NOTHING"
    )
});

/// Response $1 of tenant $2 ([`response`]).
pub static GET: Sql =
    Sql::built(|_| format!("SELECT {COLUMNS} FROM responses WHERE id = $1 AND tenant_id = $2"));

/// Response $1 of tenant $2.
pub static DELETE: Sql = Sql::text("DELETE FROM responses WHERE id = $1 AND tenant_id = $2");

/// The rows created before $1.
pub static PRUNE_OLD: Sql = Sql::built(|_| format!("{TOO_OLD}$1)"));

/// Each tenant's oldest rows beyond $1 bytes.
pub static PRUNE_OVER_CAP: Sql = Sql::built(|_| format!("{OVER_CAP}$1)"));

/// A response's columns, for [`INSERT`]; `Invalid` if it is too large to count.
pub fn values(r: &StoredResponse) -> StoreResult<[SqlValue<'_>; 8]> {
    let size = i64::try_from(r.size())
        .map_err(|_| StoreError::Invalid(format!("response {} is too large to store", r.id)))?;
    Ok([
        SqlValue::Text(&r.id),
        SqlValue::Int(r.tenant_id),
        SqlValue::Text(&r.key_id),
        SqlValue::Text(&r.model),
        SqlValue::Int(r.created_at),
        SqlValue::Text(&r.response),
        SqlValue::Text(&r.input_items),
        SqlValue::Int(size),
    ])
}

/// Response `id` of `tenant`, for [`GET`] and [`DELETE`].
pub fn key(tenant: TenantId, id: &str) -> [SqlValue<'_>; 2] {
    [SqlValue::Text(id), SqlValue::Int(tenant)]
}

pub fn response(c: &mut Cols<'_>) -> StoreResult<StoredResponse> {
    Ok(StoredResponse {
        id: c.text()?,
        tenant_id: c.int()?,
        key_id: c.text()?,
        model: c.text()?,
        created_at: c.int()?,
        response: c.text()?,
        input_items: c.text()?,
    })
}

/// Deletes the rows created before the parameter, tenant by tenant: each tenant's oldest rows
/// are a range of `responses_by_tenant`. `CROSS JOIN` keeps SQLite's planner on that order
/// (tenants outside): left to itself, without statistics, it scans `responses`.
const TOO_OLD: &str = "DELETE FROM responses WHERE id IN (
    SELECT r.id FROM tenants t CROSS JOIN responses r
     WHERE r.tenant_id = t.id AND r.created_at < ";

/// Deletes each tenant's oldest rows beyond the cap (the newest that fit are kept).
const OVER_CAP: &str = "DELETE FROM responses WHERE id IN (
    SELECT id FROM (
        SELECT id, SUM(size) OVER (PARTITION BY tenant_id ORDER BY created_at DESC, id DESC
                                   ROWS UNBOUNDED PRECEDING) AS kept
          FROM responses) AS newest_first
     WHERE kept > ";

#[cfg(test)]
mod tests {
    use crate::store::schema::{SQLITE_BOOTSTRAP, SQLITE_MIGRATIONS};
    use crate::store::Backend;
    use rusqlite::Connection;

    #[test]
    fn the_retention_reads_each_tenants_rows_by_index_on_sqlite() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SQLITE_BOOTSTRAP).unwrap();
        for (_, sql) in SQLITE_MIGRATIONS {
            conn.execute_batch(sql).unwrap();
        }
        let sql = format!(
            "EXPLAIN QUERY PLAN {}",
            super::PRUNE_OLD.get(Backend::Sqlite)
        );
        let mut stmt = conn.prepare(&sql).unwrap();
        let plan: Vec<String> = stmt
            .query_map([0], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(
            plan.iter()
                .any(|l| l.contains("responses_by_tenant (tenant_id=? AND created_at<?)")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|l| l == "SCAN r"), "{plan:?}");
    }
}
