//! Shared rate windows on SQLite (`rate_windows`): several processes on one host may share a
//! database file (the old and new process of a graceful upgrade, or replicas configured with
//! `limits.engine = "store"`). A batch of asks is one `BEGIN IMMEDIATE` transaction, so it is
//! atomic against every other process's. There is no channel between processes here: the
//! replica signals of PostgreSQL (`LISTEN`/`NOTIFY`) have no SQLite counterpart.

use super::{sql_err, write_tx};
use crate::store::{now_ms, QuotaAsk, QuotaGrant, StoreError, StoreResult, UnixMs};
use rusqlite::{params, Connection, OptionalExtension};

fn to_i64(v: u64, what: &str) -> StoreResult<i64> {
    i64::try_from(v)
        .map_err(|_| StoreError::Invalid(format!("{what} {v} does not fit a 64-bit count")))
}

pub(super) fn take_quota(
    conn: &mut Connection,
    asks: &[QuotaAsk],
) -> StoreResult<(Vec<QuotaGrant>, UnixMs)> {
    let tx = write_tx(conn)?;
    let mut grants = Vec::with_capacity(asks.len());
    for a in asks {
        let want = to_i64(a.want, "a rate-window ask of")?;
        let limit = to_i64(a.limit, "a rate limit of")?;
        let taken: i64 = tx
            .prepare_cached(
                "SELECT taken FROM rate_windows
                  WHERE subject = ?1 AND window_ms = ?2 AND window_start = ?3",
            )
            .and_then(|mut s| {
                s.query_row(params![a.subject, a.window_ms, a.window_start], |r| {
                    r.get(0)
                })
                .optional()
            })
            .map_err(sql_err)?
            .unwrap_or(0);
        let base = taken.saturating_add(a.add).max(0);
        let granted = want.min(limit.saturating_sub(base).max(0));
        let after = base.saturating_add(granted);
        tx.prepare_cached(
            "INSERT INTO rate_windows (subject, window_ms, window_start, taken, granted, ends_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (subject, window_ms, window_start)
             DO UPDATE SET taken = excluded.taken, granted = excluded.granted",
        )
        .and_then(|mut s| {
            s.execute(params![
                a.subject,
                a.window_ms,
                a.window_start,
                after,
                granted,
                a.window_start.saturating_add(a.window_ms)
            ])
        })
        .map_err(sql_err)?;
        grants.push(QuotaGrant {
            granted: u64::try_from(granted).unwrap_or(0),
            taken: u64::try_from(after).unwrap_or(0),
        });
    }
    tx.commit().map_err(sql_err)?;
    Ok((grants, now_ms()))
}

pub(super) fn expire_quota(conn: &mut Connection, age_ms: i64) -> StoreResult<u64> {
    let cutoff = now_ms().saturating_sub(age_ms);
    let n = conn
        .execute(
            "DELETE FROM rate_windows WHERE ends_at < ?1",
            params![cutoff],
        )
        .map_err(sql_err)?;
    Ok(n as u64)
}
