//! API keys on SQLite: creating, revoking and listing them, and what the gateway's key table
//! polls and loads (`keys_version`, `active_keys`). Every change to keys or tenants bumps
//! `keys_version` in the same transaction.

use super::tenants::read_balance;
use super::{read_tx, sql_err, write_tx};
use crate::store::rows::{
    conflict_if_unique, limits_from_sql, limits_to_sql, secret_hash, tenant_missing, Taken,
};
use crate::store::{
    now_ms, ActiveKey, KeyInfo, KeyLimits, NewKey, StoreError, StoreResult, TenantId,
};
use rusqlite::{params, Connection, OptionalExtension, Transaction};

pub(super) fn bump_keys_version(tx: &Transaction<'_>) -> StoreResult<()> {
    tx.execute(
        "UPDATE meta SET value = value + 1 WHERE key = 'keys_version'",
        [],
    )
    .map_err(sql_err)?;
    Ok(())
}

pub(super) fn create_key(conn: &mut Connection, key: NewKey) -> StoreResult<KeyInfo> {
    let now = now_ms();
    let (rpm, tpm) = limits_to_sql(key.limits)?;
    let tx = write_tx(conn)?;
    let tenant_name: String = tx
        .query_row(
            "SELECT name FROM tenants WHERE id = ?1",
            params![key.tenant],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql_err)?
        .ok_or_else(|| tenant_missing(key.tenant))?;
    tx.execute(
        "INSERT INTO api_keys (id, tenant_id, label, secret_sha256, secret_prefix,
                                       created_at, revoked_at, rpm_limit, tpm_limit)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, ?7, ?8)",
        params![
            key.id,
            key.tenant,
            key.label,
            &key.secret_hash[..],
            key.secret_prefix,
            now,
            rpm,
            tpm
        ],
    )
    .map_err(conflict_if_unique(Taken::Key(&key.id)))?;
    bump_keys_version(&tx)?;
    tx.commit().map_err(sql_err)?;
    Ok(KeyInfo {
        id: key.id,
        tenant_id: key.tenant,
        tenant_name,
        label: key.label,
        secret_prefix: key.secret_prefix,
        created_at: now,
        revoked_at: None,
        limits: key.limits,
    })
}

pub(super) fn revoke_key(conn: &mut Connection, key_id: String) -> StoreResult<bool> {
    let tx = write_tx(conn)?;
    let revoked: Option<Option<i64>> = tx
        .query_row(
            "SELECT revoked_at FROM api_keys WHERE id = ?1",
            params![key_id],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql_err)?;
    match revoked {
        None => Err(StoreError::NotFound(format!("key {key_id} does not exist"))),
        Some(Some(_)) => Ok(false),
        Some(None) => {
            tx.execute(
                "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1",
                params![key_id, now_ms()],
            )
            .map_err(sql_err)?;
            bump_keys_version(&tx)?;
            tx.commit().map_err(sql_err)?;
            Ok(true)
        }
    }
}

pub(super) fn list_keys(
    conn: &mut Connection,
    tenant: Option<TenantId>,
) -> StoreResult<Vec<KeyInfo>> {
    let tx = read_tx(conn)?;
    if let Some(t) = tenant {
        read_balance(&tx, t)?;
    }
    let mut stmt = tx
        .prepare(
            "SELECT k.id, k.tenant_id, t.name, k.label, k.secret_prefix, k.created_at,
                            k.revoked_at, k.rpm_limit, k.tpm_limit
                       FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
                      WHERE ?1 IS NULL OR k.tenant_id = ?1
                      ORDER BY k.created_at, k.id",
        )
        .map_err(sql_err)?;
    let rows = stmt
        .query_map(params![tenant], |r| {
            Ok((
                KeyInfo {
                    id: r.get(0)?,
                    tenant_id: r.get(1)?,
                    tenant_name: r.get(2)?,
                    label: r.get(3)?,
                    secret_prefix: r.get(4)?,
                    created_at: r.get(5)?,
                    revoked_at: r.get(6)?,
                    limits: KeyLimits::default(),
                },
                r.get::<_, Option<i64>>(7)?,
                r.get::<_, Option<i64>>(8)?,
            ))
        })
        .map_err(sql_err)?;
    let mut out = Vec::new();
    for row in rows {
        let (mut info, rpm, tpm) = row.map_err(sql_err)?;
        info.limits = limits_from_sql(rpm, tpm)?;
        out.push(info);
    }
    Ok(out)
}

pub(super) fn keys_version(conn: &mut Connection) -> StoreResult<i64> {
    conn.prepare_cached("SELECT value FROM meta WHERE key = 'keys_version'")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(sql_err)
}

pub(super) fn active_keys(conn: &mut Connection) -> StoreResult<(i64, Vec<ActiveKey>)> {
    let tx = read_tx(conn)?;
    let version: i64 = tx
        .query_row(
            "SELECT value FROM meta WHERE key = 'keys_version'",
            [],
            |r| r.get(0),
        )
        .map_err(sql_err)?;
    let mut stmt = tx
        .prepare(
            "SELECT k.secret_sha256, k.id, k.tenant_id, t.name, k.rpm_limit, k.tpm_limit
                       FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
                      WHERE k.revoked_at IS NULL
                      ORDER BY k.id",
        )
        .map_err(sql_err)?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<i64>>(4)?,
                r.get::<_, Option<i64>>(5)?,
            ))
        })
        .map_err(sql_err)?;
    let mut keys = Vec::new();
    for row in rows {
        let (hash, key_id, tenant_id, tenant_name, rpm, tpm) = row.map_err(sql_err)?;
        keys.push(ActiveKey {
            secret_hash: secret_hash(&hash)?,
            key_id,
            tenant_id,
            tenant_name,
            limits: limits_from_sql(rpm, tpm)?,
        });
    }
    Ok((version, keys))
}
