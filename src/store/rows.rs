//! Ledger rows between Rust and SQL, shared by both backends: the checks a row or top-up must
//! pass before anything is written (so a bad value fails the call instead of being truncated),
//! and the conversion of a stored row back to a [`LedgerRow`].

use super::sql_money::{i64_to_u64, pen_to_i64, u64_to_i64};
use super::{LedgerRow, StoreError, StoreResult, UnixMs};
use crate::money::Pen;

/// A checked ledger row, ready to bind.
pub(crate) struct RowParams {
    pub delta: i64,
    pub input: i64,
    pub cached: i64,
    pub output: i64,
    pub unbilled: i64,
}

/// Validates a request row before any write: the charge and tokens must fit their columns.
pub(crate) fn check_row(row: &LedgerRow) -> StoreResult<RowParams> {
    if row.charge.is_negative() || row.unbilled.is_negative() {
        return Err(StoreError::Invalid(format!(
            "ledger row {} has a negative charge ({}) or unbilled amount ({})",
            row.request_id,
            row.charge.to_decimal(),
            row.unbilled.to_decimal()
        )));
    }
    let what = format!("the charge of ledger row {}", row.request_id);
    let invalid = |e: StoreError| match e {
        StoreError::Backend(m) => StoreError::Invalid(m),
        other => other,
    };
    let params = || -> StoreResult<RowParams> {
        Ok(RowParams {
            delta: -pen_to_i64(row.charge, &what)?,
            input: u64_to_i64(row.input_tokens, "input_tokens")?,
            cached: u64_to_i64(row.cached_tokens, "cached_tokens")?,
            output: u64_to_i64(row.output_tokens, "output_tokens")?,
            unbilled: pen_to_i64(row.unbilled, "the unbilled amount")?,
        })
    };
    params().map_err(invalid)
}

/// Validates an idempotency key of a top-up: 1 to 128 visible ASCII characters.
pub(crate) fn check_idempotency_key(key: &str) -> StoreResult<()> {
    if key.is_empty() || key.len() > 128 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(StoreError::Invalid(format!(
            "an idempotency key must be 1 to 128 visible ASCII characters, got {key:?}"
        )));
    }
    Ok(())
}

/// The ledger entry id of a top-up: random, or derived from its idempotency key.
pub(crate) fn top_up_entry_id(idempotency_key: Option<&str>) -> String {
    match idempotency_key {
        Some(k) => format!("topup_key:{k}"),
        None => crate::keys::random_id("topup_", 20),
    }
}

/// Validates a top-up amount: positive, and within one ledger entry.
pub(crate) fn check_top_up(amount: Pen) -> StoreResult<i64> {
    if amount <= Pen::ZERO {
        return Err(StoreError::Invalid(format!(
            "a top-up must be positive, got {}",
            amount.to_decimal()
        )));
    }
    pen_to_i64(amount, "a top-up")
}

/// `(from, to)` of a statement as inclusive/exclusive SQL bounds.
pub(crate) fn period_bounds(from: Option<UnixMs>, to: Option<UnixMs>) -> (i64, i64) {
    (from.unwrap_or(i64::MIN), to.unwrap_or(i64::MAX))
}

/// A request ledger row as both backends read it, before range checks.
pub(crate) struct RawLedgerRow {
    pub request_id: String,
    pub at: i64,
    pub tenant_id: i64,
    pub key_id: String,
    pub model: String,
    pub format: String,
    pub input_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
    pub delta: i64,
    pub status: String,
    pub http_status: i64,
    pub unbilled: i64,
    pub input_estimated: bool,
}

impl RawLedgerRow {
    pub(crate) fn into_row(self) -> StoreResult<LedgerRow> {
        Ok(LedgerRow {
            http_status: u16::try_from(self.http_status).map_err(|_| {
                StoreError::Backend(format!(
                    "ledger row {} has http_status {}",
                    self.request_id, self.http_status
                ))
            })?,
            request_id: self.request_id,
            at: self.at,
            tenant_id: self.tenant_id,
            key_id: self.key_id,
            model: self.model,
            format: self.format,
            input_tokens: i64_to_u64(self.input_tokens, "input_tokens")?,
            cached_tokens: i64_to_u64(self.cached_tokens, "cached_tokens")?,
            output_tokens: i64_to_u64(self.output_tokens, "output_tokens")?,
            charge: -Pen::from_picos(i128::from(self.delta)),
            status: self.status,
            unbilled: Pen::from_picos(i128::from(self.unbilled)),
            input_estimated: self.input_estimated,
        })
    }
}
