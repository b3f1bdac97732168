//! Tenants and API keys: the statements both backends send, and their rows.

use super::{Cols, Sql, SqlValue};
use crate::money::Pen;
use crate::store::rows::{limits_from_sql, secret_hash};
use crate::store::sql_money::{i64_to_u64, pen_from_text, pen_to_text};
use crate::store::{
    ActiveKey, Cap, CapPeriod, KeyInfo, KeyRules, NewKey, StoreError, StoreResult, Tenant,
    TenantId, TenantRules, TenantSummary, UnixMs, Zone,
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
                           revoked_at, rpm_limit, tpm_limit, models, cap_amount, cap_period,
                           expires_at, disabled, manage, priority)
     VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
);

/// A key's rules as their columns hold them (see the migration's docs).
pub struct RuleColumns {
    models: Option<String>,
    cap_amount: Option<String>,
    cap_period: Option<&'static str>,
    expires_at: Option<i64>,
    disabled: i64,
    manage: i64,
    priority: &'static str,
}

impl RuleColumns {
    pub fn of(r: &KeyRules) -> RuleColumns {
        RuleColumns {
            models: r.models.clone(),
            cap_amount: r.cap.map(|c| pen_to_text(c.amount)),
            cap_period: r.cap.map(|c| c.period.as_str()),
            expires_at: r.expires_at,
            disabled: i64::from(r.disabled),
            manage: i64::from(r.manage),
            priority: if r.batch { "batch" } else { "interactive" },
        }
    }

    fn values(&self) -> [SqlValue<'_>; 7] {
        [
            SqlValue::OptText(self.models.as_deref()),
            SqlValue::OptText(self.cap_amount.as_deref()),
            SqlValue::OptText(self.cap_period),
            SqlValue::OptInt(self.expires_at),
            SqlValue::Int(self.disabled),
            SqlValue::Int(self.manage),
            SqlValue::Text(self.priority),
        ]
    }
}

/// The values of [`INSERT_KEY`]: `key`, created at `now`, with its limits' and rules' columns.
pub fn key_values<'k>(
    key: &'k NewKey,
    now: UnixMs,
    (rpm, tpm): (Option<i64>, Option<i64>),
    rules: &'k RuleColumns,
) -> Vec<SqlValue<'k>> {
    let mut v = vec![
        SqlValue::Text(&key.id),
        SqlValue::Int(key.tenant),
        SqlValue::Text(&key.label),
        SqlValue::Blob(&key.secret_hash),
        SqlValue::Text(&key.secret_prefix),
        SqlValue::Int(now),
        SqlValue::OptInt(rpm),
        SqlValue::OptInt(tpm),
    ];
    v.extend(rules.values());
    v
}

/// Sets a key's settings: ($1 id, $2 label, $3 rpm, $4 tpm, then the rules' columns).
pub static SET_KEY: Sql = Sql::text(
    "UPDATE api_keys SET label = $2, rpm_limit = $3, tpm_limit = $4, models = $5,
            cap_amount = $6, cap_period = $7, expires_at = $8, disabled = $9, manage = $10,
            priority = $11
      WHERE id = $1 AND revoked_at IS NULL",
);

/// The values of [`SET_KEY`].
pub fn set_key_values<'k>(
    id: &'k str,
    label: &'k str,
    (rpm, tpm): (Option<i64>, Option<i64>),
    rules: &'k RuleColumns,
) -> Vec<SqlValue<'k>> {
    let mut v = vec![
        SqlValue::Text(id),
        SqlValue::Text(label),
        SqlValue::OptInt(rpm),
        SqlValue::OptInt(tpm),
    ];
    v.extend(rules.values());
    v
}

/// A rotated key: ($1 id, $2 the key replacing it, $3 when it expires at the latest).
pub static ROTATE_KEY: Sql = Sql::text(
    "UPDATE api_keys SET rotated_to = $2,
            expires_at = CASE WHEN expires_at IS NULL OR expires_at > $3 THEN $3 ELSE expires_at END
      WHERE id = $1 AND revoked_at IS NULL",
);

/// The columns of a tenant's rules, from `tenants t`, as [`tenant_rules`] reads them.
pub const TENANT_RULE_COLUMNS: &str = "t.weight, t.monthly_cap, t.time_zone, t.low_balance";

pub static TENANT_RULES: Sql =
    Sql::built(|_| format!("SELECT {TENANT_RULE_COLUMNS} FROM tenants t WHERE t.id = $1"));

/// Sets a tenant's rules: ($1 id, $2 weight, $3 monthly cap, $4 zone, $5 low balance).
pub static SET_TENANT_RULES: Sql = Sql::text(
    "UPDATE tenants SET weight = $2, monthly_cap = $3, time_zone = $4, low_balance = $5
      WHERE id = $1",
);

/// A key's rules from its columns (in [`KEY_RULE_COLUMNS`] order).
fn key_rules(c: &mut Cols<'_>) -> StoreResult<KeyRules> {
    let models = c.opt_text()?;
    let amount = c.opt_text()?;
    let period = c.opt_text()?;
    let cap = match (amount, period) {
        (Some(a), Some(p)) => {
            let amount = pen_from_text(&a, "api_keys.cap_amount")?;
            let period = CapPeriod::parse(&p)
                .map_err(|e| StoreError::Backend(format!("api_keys.cap_period: {e}")))?;
            Some(Cap { amount, period })
        }
        _ => None,
    };
    Ok(KeyRules {
        models,
        cap,
        expires_at: c.opt_int()?,
        disabled: c.int()? != 0,
        manage: c.int()? != 0,
        batch: c.text()? == "batch",
    })
}

/// A tenant's rules from [`TENANT_RULE_COLUMNS`].
pub fn tenant_rules(c: &mut Cols<'_>) -> StoreResult<TenantRules> {
    let weight = c.int()?;
    let monthly_cap = c
        .opt_text()?
        .map(|t| pen_from_text(&t, "tenants.monthly_cap"))
        .transpose()?;
    let zone_name = c.text()?;
    let zone = Zone::parse(&zone_name)
        .map_err(|e| StoreError::Backend(format!("tenants.time_zone: {e}")))?;
    let low_balance = c
        .opt_text()?
        .map(|t| pen_from_text(&t, "tenants.low_balance"))
        .transpose()?;
    Ok(TenantRules {
        weight: u32::try_from(weight).unwrap_or(1).max(1),
        monthly_cap,
        zone,
        low_balance,
    })
}

/// The values of [`SET_TENANT_RULES`] for `rules`, as owned texts.
pub fn tenant_rule_texts(
    rules: &TenantRules,
) -> (i64, Option<String>, &'static str, Option<String>) {
    (
        i64::from(rules.weight),
        rules.monthly_cap.map(pen_to_text),
        rules.zone.name(),
        rules.low_balance.map(pen_to_text),
    )
}

/// A key's `revoked_at`, its row locked on PostgreSQL until the revocation commits.
pub static KEY_REVOKED_AT: Sql = Sql::built(|b| {
    format!(
        "SELECT revoked_at FROM api_keys WHERE id = $1{}",
        b.lock(" FOR UPDATE")
    )
});

pub static REVOKE_KEY: Sql = Sql::text("UPDATE api_keys SET revoked_at = $2 WHERE id = $1");

/// A key's rule columns, in the order [`key_rules`] reads them.
pub const KEY_RULE_COLUMNS: &str = "k.models, k.cap_amount, k.cap_period, k.expires_at, \
     k.disabled, k.manage, k.priority";

/// The columns of a key as [`key_info`] reads them, from `api_keys k JOIN tenants t`.
pub const KEY_INFO_COLUMNS: &str = "k.id, k.tenant_id, t.name, k.label, k.secret_prefix, \
     k.created_at, k.revoked_at, k.rpm_limit, k.tpm_limit, k.models, k.cap_amount, \
     k.cap_period, k.expires_at, k.disabled, k.manage, k.priority, k.rotated_to";

/// One key ([`key_info`]).
pub static KEY: Sql = Sql::built(|_| {
    format!(
        "SELECT {KEY_INFO_COLUMNS}
           FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
          WHERE k.id = $1"
    )
});

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
pub static ACTIVE_KEYS: Sql = Sql::built(|_| {
    format!(
        "SELECT k.secret_sha256, k.id, k.tenant_id, t.name, k.rpm_limit, k.tpm_limit,
                {KEY_RULE_COLUMNS}, {TENANT_RULE_COLUMNS}
           FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
          WHERE k.revoked_at IS NULL
          ORDER BY k.id"
    )
});

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
        rules: key_rules(c)?,
        rotated_to: c.opt_text()?,
    })
}

pub fn active_key(c: &mut Cols<'_>) -> StoreResult<ActiveKey> {
    Ok(ActiveKey {
        secret_hash: secret_hash(&c.blob()?)?,
        key_id: c.text()?,
        tenant_id: c.int()?,
        tenant_name: c.text()?,
        limits: limits_from_sql(c.opt_int()?, c.opt_int()?)?,
        rules: key_rules(c)?,
        tenant_rules: tenant_rules(c)?,
    })
}
