//! The `responses` table (migration 4): stored responses of the Responses API, what both
//! backends' [`ResponseStore`](super::ResponseStore) share (`sqlite/responses.rs`,
//! `postgres/responses.rs`).
//!
//! One row per response: its id, tenant, key, model, `created_at`, the response object, the
//! conversation's input items and their `size` (what the per-tenant cap counts), indexed by
//! (tenant, created_at), for the cap and the retention (there is no index by age alone: each
//! stored response would pay for it, see the schema's migration 6). Every read and delete
//! names the tenant: another tenant's id reads as missing.
//!
//! The cleanup ([`ResponseStore::prune_responses`](super::ResponseStore::prune_responses)) deletes by age, tenant by tenant through
//! the (tenant, created_at) index, then, per tenant, the oldest rows beyond the cap: a window
//! sum over the tenant's rows newest first, so the newest responses that fit are kept. Both
//! run in one statement each; a cleanup that races a write at worst leaves a row for the next
//! pass.

use super::{StoreError, StoreResult, StoredResponse};

pub(super) const COLUMNS: &str =
    "id, tenant_id, key_id, model, created_at, response, input_items, size";

pub(super) fn size_of(r: &StoredResponse) -> StoreResult<i64> {
    i64::try_from(r.size())
        .map_err(|_| StoreError::Invalid(format!("response {} is too large to store", r.id)))
}

/// Deletes the rows created before the parameter, tenant by tenant: each tenant's oldest rows
/// are a range of `responses_by_tenant`. `CROSS JOIN` keeps SQLite's planner on that order
/// (tenants outside): left to itself, without statistics, it scans `responses`.
pub(super) const TOO_OLD: &str = "DELETE FROM responses WHERE id IN (
    SELECT r.id FROM tenants t CROSS JOIN responses r
     WHERE r.tenant_id = t.id AND r.created_at < ";

/// Deletes each tenant's oldest rows beyond the cap (the newest that fit are kept).
pub(super) const OVER_CAP: &str = "DELETE FROM responses WHERE id IN (
    SELECT id FROM (
        SELECT id, SUM(size) OVER (PARTITION BY tenant_id ORDER BY created_at DESC, id DESC
                                   ROWS UNBOUNDED PRECEDING) AS kept
          FROM responses) AS newest_first
     WHERE kept > ";

#[cfg(test)]
mod tests {
    use super::super::schema::{SQLITE_BOOTSTRAP, SQLITE_MIGRATIONS};
    use rusqlite::Connection;

    #[test]
    fn the_retention_reads_each_tenants_rows_by_index_on_sqlite() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SQLITE_BOOTSTRAP).unwrap();
        for (_, sql) in SQLITE_MIGRATIONS {
            conn.execute_batch(sql).unwrap();
        }
        let sql = format!("EXPLAIN QUERY PLAN {}0)", super::TOO_OLD);
        let mut stmt = conn.prepare(&sql).unwrap();
        let plan: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(3))
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
