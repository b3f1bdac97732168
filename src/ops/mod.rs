//! Operator operations, shared by the CLI (`quipu tenant …`, `quipu key …`, `quipu topup`,
//! `quipu statement`, `quipu ledger import`) and the admin HTTP API, so both apply the same rules and say the same
//! things.
//!
//! Each operation validates its input, calls the [`Store`](crate::store::Store) and returns a result that is both
//! [`Serialize`] (the admin API's JSON, and `--json` in the CLI) and [`Render`] (the text a
//! person reads). Money in JSON is always an exact decimal string of soles (`"12.50"`,
//! `"0.00000105"`), never a number; text shows `S/ 1,234.56` and, where rounding to céntimos
//! would hide something, the exact decimal beside it. Times are RFC 3339 in UTC in JSON.
//!
//! Failures are [`OpsError`]s whose messages tell the operator what to do; this module owns
//! no I/O besides the store and the ledger spill files that `quipu ledger import` reads and
//! renames, and no policy that the config does not pass in (the minimum top-up).
//!
//! One file per command group, each with its results, their text and its tests:
//!
//! | file | operations |
//! |---|---|
//! | `tenants.rs` | [`create_tenant`], [`list_tenants`], [`validate_tenant_name`] |
//! | `keys.rs` | [`create_key`], [`update_key`], [`rotate_key`], [`revoke_key`], [`list_keys`] |
//! | `key_rules.rs` | [`KeyChange`]: a key's settings as written, checked and applied; their views |
//! | `self_service.rs` | the same writes by a tenant's managing key on `/v1/keys`, within its limits |
//! | `topup.rs` | [`top_up`], [`parse_top_up`] |
//! | `statement.rs` | [`statement`], [`parse_bound`] |
//! | `import.rs` | [`import_ledger`] (`quipu ledger import`) |
//! | `account.rs` | the tenant's own view, for `/v1/account`, `/v1/usage`, `/v1/keys`, `/v1/requests`, `/v1/topups` and their `/admin/tenants/{name}/…` twins |
//! | `text.rs` | the text helpers they share: money (`S/ 1,234.56`), times, aligned tables |
//!
//! This file holds what every group shares: [`OpsError`], [`Render`] and [`Output`]. Callers
//! use the re-exports here (`ops::create_tenant`), never the files.

pub mod account;
mod import;
mod key_rules;
mod key_spend;
mod keys;
pub mod self_service;
mod statement;
mod tenants;
mod text;
mod topup;

pub use import::{
    import_ledger, ImportRejected, ImportTotals, ImportedFile, LedgerImport, TenantCharged,
};
pub use key_rules::{check_label, Budget, BudgetView, KeyChange, RulesView};
pub use keys::{
    active_key, create_key, key_line, list_keys, parse_grace, revoke_key, rotate_key, settings_of,
    update_key, KeyCreated, KeyLine, KeyList, KeyRevoked, LimitsView, Replaced, MAX_GRACE_MS,
};
pub use statement::{parse_bound, statement, ModelLine, StatementReport, TopUpLine, Totals};
pub use tenants::{
    create_tenant, list_tenants, update_tenant, validate_tenant_name, TenantChange, TenantCreated,
    TenantLine, TenantList, TenantRulesView,
};
pub use topup::{parse_top_up, top_up, TopUpDone};

use crate::money::Pen;
use crate::store::StoreError;
use serde::Serialize;
use std::fmt;

/// The largest single top-up: S/ 1,000,000.00. Keeps every ledger entry far inside i64
/// pico-soles and catches a mistyped amount.
pub const MAX_TOP_UP: Pen = Pen::from_centimos(100_000_000);
/// Longest tenant name (names are also metric labels and CLI arguments).
pub const MAX_TENANT_NAME: usize = 64;
/// Longest key label.
pub const MAX_LABEL: usize = 200;

/// Why an operation was refused or failed. The message is for the operator and says what to
/// do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpsError {
    /// The input is not acceptable (bad name, amount, date).
    Invalid(String),
    /// The tenant or key does not exist.
    NotFound(String),
    /// The name or id is taken.
    Conflict(String),
    /// The caller may not do this (a key without the `manage` scope, or asking for more than
    /// its own limits or the operator's: `/v1/keys` self-service).
    Forbidden(String),
    /// The store failed or could not be reached.
    Store(String),
}

impl OpsError {
    /// The status the admin API answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            OpsError::Invalid(_) => 400,
            OpsError::NotFound(_) => 404,
            OpsError::Conflict(_) => 409,
            OpsError::Forbidden(_) => 403,
            OpsError::Store(_) => 503,
        }
    }

    /// The message alone.
    pub fn message(&self) -> &str {
        match self {
            OpsError::Invalid(m)
            | OpsError::NotFound(m)
            | OpsError::Conflict(m)
            | OpsError::Forbidden(m)
            | OpsError::Store(m) => m,
        }
    }
}

impl fmt::Display for OpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for OpsError {}

impl From<StoreError> for OpsError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(m) => OpsError::Conflict(m),
            StoreError::NotFound(m) => OpsError::NotFound(m),
            StoreError::Invalid(m) => OpsError::Invalid(m),
            StoreError::Backend(m) => OpsError::Store(format!(
                "store error: {m}; check that the database in store.url is reachable and retry"
            )),
        }
    }
}

pub type OpsResult<T> = Result<T, OpsError>;

/// A result's human rendering (its JSON rendering is its `Serialize`).
pub trait Render: Serialize {
    /// Text for a terminal, ending with a newline.
    fn text(&self) -> String;
}

/// A rendered result, as the CLI prints it (text, or JSON with `--json`) and the admin API
/// answers it (JSON).
#[derive(Debug, Clone)]
pub struct Output {
    pub text: String,
    pub json: serde_json::Value,
}

impl Output {
    pub fn of<T: Render>(result: &T) -> Output {
        Output {
            text: result.text(),
            json: serde_json::to_value(result).unwrap_or(serde_json::Value::Null),
        }
    }

    /// The JSON rendering as the text to print.
    pub fn into_json(self) -> Output {
        let text = serde_json::to_string_pretty(&self.json).unwrap_or_default();
        Output { text, ..self }
    }
}

/// What the tests of every group share: an in-memory store, a minimum top-up, a ledger row.
#[cfg(test)]
mod test_util {
    use crate::money::Pen;
    use crate::store::{self, LedgerRow, Store, TenantId};
    use std::sync::Arc;

    pub async fn mem() -> Arc<dyn Store> {
        store::open("sqlite://:memory:").await.unwrap()
    }

    /// The minimum top-up the tests configure: S/ 10.00.
    pub fn min() -> Pen {
        Pen::from_centimos(1000)
    }

    /// A request row of `tenant` on `model` charging `picos`, now.
    pub fn ledger_row(id: &str, tenant: TenantId, model: &str, picos: i128) -> LedgerRow {
        LedgerRow {
            request_id: id.into(),
            at: store::now_ms(),
            tenant_id: tenant,
            key_id: "key_x".into(),
            model: model.into(),
            format: "chat".into(),
            input_tokens: 3,
            cached_tokens: 0,
            output_tokens: 4,
            charge: Pen::from_picos(picos),
            status: "ok".into(),
            http_status: 200,
            unbilled: Pen::ZERO,
            input_estimated: false,
            caps: Vec::new(),
        }
    }
}
