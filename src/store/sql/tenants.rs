//! Tenants and API keys: the statements both backends send, and their rows.

use super::{Cols, Sql, SqlValue};
use crate::money::Pen;
use crate::store::rows::{limits_from_sql, secret_hash};
use crate::store::sql_money::i64_to_u64;
use crate::store::{
    ActiveKey, KeyInfo, NewKey, StoreResult, Tenant, TenantId, TenantSummary, UnixMs,
};
use std::collections::HashMap;

/// A new tenant, at a zero balance: ($1 name, $2 created_at) → its id.
pub static CREATE_TENANT: Sql =
    Sql::text("INSERT INTO tenants (name, created_at, balance) VALUES ($1, $2, '0') RETURNING id");

pub static TENANT_BY_NAME: Sql =
    Sql::text("SELECT id, name, created_at FROM tenants WHERE name = $1");

/// A tenant ([`tenant`]) and its balance ([`Cols::pen`]).
pub static TENANT_WITH_BALANCE: Sql =
    Sql::text("SELECT id, name, created_at, CAST(balance AS TEXT) FROM tenants WHERE id = $1");

/// A tenant's balance, its row locked for the rest of a PostgreSQL transaction (every
/// transaction that moves money takes this lock first: see `postgres/ledger.rs`).
pub static LOCK_BALANCE: Sql = Sql::built(|b| {
    format!(
        "SELECT CAST(balance AS TEXT) FROM tenants WHERE id = $1{}",
        b.lock(" FOR NO KEY UPDATE")
    )
});

pub static TENANT_EXISTS: Sql = Sql::text("SELECT 1 FROM tenants WHERE id = $1");

/// Every tenant with its balance and active keys, by name ([`summary`]).
pub static LIST_TENANTS: Sql = Sql::text(
    "SELECT t.id, t.name, t.created_at, CAST(t.balance AS TEXT),
            (SELECT COUNT(*) FROM api_keys k WHERE k.tenant_id = t.id AND k.revoked_at IS NULL)
       FROM tenants t ORDER BY t.name",
);

/// Every lease's amount, for [`LIST_TENANTS`]'s leased sums (exact in Rust on both backends).
pub static LEASED: Sql = Sql::text("SELECT tenant_id, CAST(amount AS TEXT) FROM leases");

pub fn tenant(c: &mut Cols<'_>) -> StoreResult<Tenant> {
    Ok(Tenant {
        id: c.int()?,
        name: c.text()?,
        created_at: c.int()?,
    })
}

/// A row of [`LIST_TENANTS`], its leased amount from `leased` (see [`leased`]).
pub fn summary(c: &mut Cols<'_>, leased: &HashMap<TenantId, Pen>) -> StoreResult<TenantSummary> {
    let tenant = tenant(c)?;
    Ok(TenantSummary {
        balance: c.pen("tenants.balance")?,
        leased: leased.get(&tenant.id).copied().unwrap_or_default(),
        active_keys: i64_to_u64(c.int()?, "active key count")?,
        tenant,
    })
}

/// Rows of [`LEASED`], summed per tenant.
pub fn leased(rows: Vec<(TenantId, Pen)>) -> HashMap<TenantId, Pen> {
    let mut out: HashMap<TenantId, Pen> = HashMap::new();
    for (tenant, amount) in rows {
        *out.entry(tenant).or_default() += amount;
    }
    out
}

pub fn lease_amount(c: &mut Cols<'_>) -> StoreResult<(TenantId, Pen)> {
    Ok((c.int()?, c.pen("leases.amount")?))
}

/// Raised in the same transaction as every change to keys or tenants.
pub static BUMP_KEYS_VERSION: Sql =
    Sql::text("UPDATE meta SET value = value + 1 WHERE key = 'keys_version'");

/// Sent as it is (no parameters), so PostgreSQL can take it as a simple query.
pub const KEYS_VERSION: &str = "SELECT value FROM meta WHERE key = 'keys_version'";

pub static TENANT_NAME: Sql = Sql::text("SELECT name FROM tenants WHERE id = $1");

/// A new key ([`key_values`]).
pub static INSERT_KEY: Sql = Sql::text(
    "INSERT INTO api_keys (id, tenant_id, label, secret_sha256, secret_prefix, created_at,
                           revoked_at, rpm_limit, tpm_limit)
     VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8)",
);

/// The values of [`INSERT_KEY`]: `key`, created at `now`, with its limits' columns.
pub fn key_values(
    key: &NewKey,
    now: UnixMs,
    (rpm, tpm): (Option<i64>, Option<i64>),
) -> [SqlValue<'_>; 8] {
    [
        SqlValue::Text(&key.id),
        SqlValue::Int(key.tenant),
        SqlValue::Text(&key.label),
        SqlValue::Blob(&key.secret_hash),
        SqlValue::Text(&key.secret_prefix),
        SqlValue::Int(now),
        SqlValue::OptInt(rpm),
        SqlValue::OptInt(tpm),
    ]
}

/// A key's `revoked_at`, its row locked on PostgreSQL until the revocation commits.
pub static KEY_REVOKED_AT: Sql = Sql::built(|b| {
    format!(
        "SELECT revoked_at FROM api_keys WHERE id = $1{}",
        b.lock(" FOR UPDATE")
    )
});

pub static REVOKE_KEY: Sql = Sql::text("UPDATE api_keys SET revoked_at = $2 WHERE id = $1");

/// The columns of a key as [`key_info`] reads them, from `api_keys k JOIN tenants t`.
pub const KEY_INFO_COLUMNS: &str = "k.id, k.tenant_id, t.name, k.label, k.secret_prefix, \
     k.created_at, k.revoked_at, k.rpm_limit, k.tpm_limit";

/// The keys of tenant $1, or of all tenants when it is `NULL`, oldest first.
pub static LIST_KEYS: Sql = Sql::built(|_| {
    format!(
        "SELECT {KEY_INFO_COLUMNS}
           FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
          WHERE CAST($1 AS BIGINT) IS NULL OR k.tenant_id = $1
          ORDER BY k.created_at, k.id"
    )
});

/// Every unrevoked key ([`active_key`]).
pub static ACTIVE_KEYS: Sql = Sql::text(
    "SELECT k.secret_sha256, k.id, k.tenant_id, t.name, k.rpm_limit, k.tpm_limit
       FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
      WHERE k.revoked_at IS NULL
      ORDER BY k.id",
);

pub fn key_info(c: &mut Cols<'_>) -> StoreResult<KeyInfo> {
    Ok(KeyInfo {
        id: c.text()?,
        tenant_id: c.int()?,
        tenant_name: c.text()?,
        label: c.text()?,
        secret_prefix: c.text()?,
        created_at: c.int()?,
        revoked_at: c.opt_int()?,
        limits: limits_from_sql(c.opt_int()?, c.opt_int()?)?,
    })
}

pub fn active_key(c: &mut Cols<'_>) -> StoreResult<ActiveKey> {
    Ok(ActiveKey {
        secret_hash: secret_hash(&c.blob()?)?,
        key_id: c.text()?,
        tenant_id: c.int()?,
        tenant_name: c.text()?,
        limits: limits_from_sql(c.opt_int()?, c.opt_int()?)?,
    })
}
