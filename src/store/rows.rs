//! Rows between Rust and SQL, shared by both backends: the checks a row or top-up must pass
//! before anything is written (so a bad value fails the call instead of being truncated), a
//! ledger row as its columns ([`RawLedgerRow`], whose column list is [`LEDGER_COLUMNS`]) and
//! back, the small conversions and messages both stores need alike (key limits, secret hashes,
//! a taken name), and a row as JSON (the dead-letter table's `row_json`, the lines of a ledger
//! spill file), read back exactly.

use super::columns::table_row;
use super::sql_money::{i64_to_u64, pen_to_i64, u64_to_i64};
use super::{
    now_ms, KeyLimits, LedgerRow, RejectedRow, StoreError, StoreResult, TenantId, TopUp,
    TopUpOutcome, UnixMs,
};
use crate::money::Pen;
use serde_json::Value;

table_row!(
    /// A request ledger row as its columns hold it (see `columns`): what both backends bind
    /// and read, before range checks. The columns a request row leaves `NULL` (they are for
    /// top-ups) are never `NULL` here once written by [`check_row`]; read back, `NULL` means
    /// empty or 0. These fields, in this order, are [`LEDGER_COLUMNS`].
    struct RawLedgerRow, LEDGER_COLUMNS, batch LedgerBatch {
        entry_id: String,
        tenant_id: i64,
        at: i64,
        /// Minus the charge, in pico-soles.
        delta: i64,
        key_id: Option<String>,
        model: Option<String>,
        format: Option<String>,
        input_tokens: Option<i64>,
        cached_tokens: Option<i64>,
        output_tokens: Option<i64>,
        status: Option<String>,
        http_status: Option<i32>,
        unbilled: i64,
        input_estimated: bool,
        /// The cap pools it reserved against, comma-separated (`''`: none).
        caps: String,
    }
);

/// Validates a request row before any write (the charge and tokens must fit their columns)
/// and gives its column values.
pub(crate) fn check_row(row: &LedgerRow) -> StoreResult<RawLedgerRow> {
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
    // A field added to `LedgerRow` fails to compile in `into_row` until `RawLedgerRow` has
    // its column, and then here until it is bound.
    let raw = || -> StoreResult<RawLedgerRow> {
        Ok(RawLedgerRow {
            entry_id: row.request_id.clone(),
            tenant_id: row.tenant_id,
            at: row.at,
            delta: -pen_to_i64(row.charge, &what)?,
            key_id: Some(row.key_id.clone()),
            model: Some(row.model.clone()),
            format: Some(row.format.clone()),
            input_tokens: Some(u64_to_i64(row.input_tokens, "input_tokens")?),
            cached_tokens: Some(u64_to_i64(row.cached_tokens, "cached_tokens")?),
            output_tokens: Some(u64_to_i64(row.output_tokens, "output_tokens")?),
            status: Some(row.status.clone()),
            http_status: Some(i32::from(row.http_status)),
            unbilled: pen_to_i64(row.unbilled, "the unbilled amount")?,
            input_estimated: row.input_estimated,
            caps: row.caps.join(","),
        })
    };
    raw().map_err(invalid)
}

/// The dead-letter row of a request row the store refused for good, and why.
pub(crate) fn rejected(row: &LedgerRow, reason: &str) -> RejectedRow {
    RejectedRow {
        request_id: row.request_id.clone(),
        tenant_id: row.tenant_id,
        row_json: row.to_json(),
        reason: reason.to_owned(),
        rejected_at: now_ms(),
    }
}

impl RawLedgerRow {
    /// The charge this row takes from its tenant's balance.
    pub(crate) fn charge(&self) -> Pen {
        -Pen::from_picos(i128::from(self.delta))
    }

    /// The ids of the cap pools it reserved against.
    pub(crate) fn cap_pools(&self) -> impl Iterator<Item = &str> {
        self.caps.split(',').filter(|p| !p.is_empty())
    }

    pub(crate) fn into_row(self) -> StoreResult<LedgerRow> {
        // Every field, so that a new one cannot be forgotten here.
        let RawLedgerRow {
            entry_id,
            tenant_id,
            at,
            delta,
            key_id,
            model,
            format,
            input_tokens,
            cached_tokens,
            output_tokens,
            status,
            http_status,
            unbilled,
            input_estimated,
            caps,
        } = self;
        let http_status = http_status.unwrap_or(0);
        Ok(LedgerRow {
            http_status: u16::try_from(http_status).map_err(|_| {
                StoreError::Backend(format!(
                    "ledger row {entry_id} has http_status {http_status}"
                ))
            })?,
            request_id: entry_id,
            at,
            tenant_id,
            key_id: key_id.unwrap_or_default(),
            model: model.unwrap_or_default(),
            format: format.unwrap_or_default(),
            input_tokens: i64_to_u64(input_tokens.unwrap_or(0), "input_tokens")?,
            cached_tokens: i64_to_u64(cached_tokens.unwrap_or(0), "cached_tokens")?,
            output_tokens: i64_to_u64(output_tokens.unwrap_or(0), "output_tokens")?,
            charge: -Pen::from_picos(i128::from(delta)),
            status: status.unwrap_or_default(),
            unbilled: Pen::from_picos(i128::from(unbilled)),
            input_estimated,
            caps: caps
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }
}

/// Validates an idempotency key of a top-up: 1 to 128 visible ASCII characters.
fn check_idempotency_key(key: &str) -> StoreResult<()> {
    if key.is_empty() || key.len() > 128 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(StoreError::Invalid(format!(
            "an idempotency key must be 1 to 128 visible ASCII characters, got {key:?}"
        )));
    }
    Ok(())
}

/// Validates a top-up amount: positive, and within one ledger entry.
fn check_top_up(amount: Pen) -> StoreResult<i64> {
    if amount <= Pen::ZERO {
        return Err(StoreError::Invalid(format!(
            "a top-up must be positive, got {}",
            amount.to_decimal()
        )));
    }
    pen_to_i64(amount, "a top-up")
}

/// Checks a top-up before any write; gives its ledger delta and entry id (random, or derived
/// from its idempotency key).
pub(crate) fn top_up_entry(
    amount: Pen,
    idempotency_key: Option<&str>,
) -> StoreResult<(i64, String)> {
    let delta = check_top_up(amount)?;
    let id = match idempotency_key {
        Some(k) => {
            check_idempotency_key(k)?;
            format!("topup_key:{k}")
        }
        None => crate::keys::random_id("topup_", 20),
    };
    Ok((delta, id))
}

/// A ledger entry already holding a top-up's id, as both stores read it.
pub(crate) struct EarlierTopUp {
    pub tenant_id: TenantId,
    pub delta: i64,
    pub at: UnixMs,
    pub note: Option<String>,
}

/// The answer to a top-up whose idempotency key was used before: the first top-up, replayed,
/// if it was for the same tenant and amount; a `Conflict` otherwise.
pub(crate) fn replayed_top_up(
    id: String,
    tenant: TenantId,
    amount: Pen,
    delta: i64,
    earlier: EarlierTopUp,
    balance: Pen,
) -> StoreResult<TopUpOutcome> {
    if earlier.tenant_id != tenant || earlier.delta != delta {
        return Err(StoreError::Conflict(format!(
            "the idempotency key of top-up {id} was already used for another tenant or amount"
        )));
    }
    Ok(TopUpOutcome {
        top_up: TopUp {
            id,
            tenant_id: tenant,
            amount,
            at: earlier.at,
            note: earlier.note.unwrap_or_default(),
        },
        balance,
        replayed: true,
    })
}

/// `(from, to)` of a statement as inclusive/exclusive SQL bounds.
pub(crate) fn period_bounds(from: Option<UnixMs>, to: Option<UnixMs>) -> (i64, i64) {
    (from.unwrap_or(i64::MIN), to.unwrap_or(i64::MAX))
}

/// A key's limits as its `rpm_limit` and `tpm_limit` columns (`NULL` = the default).
pub(crate) fn limits_to_sql(l: KeyLimits) -> StoreResult<(Option<i64>, Option<i64>)> {
    let rpm = l
        .requests_per_minute
        .map(|v| u64_to_i64(v, "requests_per_minute"))
        .transpose()?;
    let tpm = l
        .tokens_per_minute
        .map(|v| u64_to_i64(v, "tokens_per_minute"))
        .transpose()?;
    Ok((rpm, tpm))
}

/// [`limits_to_sql`] backwards.
pub(crate) fn limits_from_sql(rpm: Option<i64>, tpm: Option<i64>) -> StoreResult<KeyLimits> {
    Ok(KeyLimits {
        requests_per_minute: rpm.map(|v| i64_to_u64(v, "rpm_limit")).transpose()?,
        tokens_per_minute: tpm.map(|v| i64_to_u64(v, "tpm_limit")).transpose()?,
    })
}

/// A stored `secret_sha256`, which must be 32 bytes.
pub(crate) fn secret_hash(blob: &[u8]) -> StoreResult<[u8; 32]> {
    <[u8; 32]>::try_from(blob).map_err(|_| {
        StoreError::Backend(format!(
            "api_keys.secret_sha256 has {} bytes, expected 32",
            blob.len()
        ))
    })
}

pub(crate) fn tenant_missing(id: TenantId) -> StoreError {
    StoreError::NotFound(format!("tenant {id} does not exist"))
}

/// What a unique key refused, in the words both stores use for the `Conflict`.
pub(crate) enum Taken<'a> {
    TenantName(&'a str),
    /// A key id, or its secret's hash.
    Key(&'a str),
    /// A top-up's entry id (from its idempotency key).
    TopUp(&'a str),
}

impl Taken<'_> {
    fn conflict(&self) -> StoreError {
        StoreError::Conflict(match self {
            Taken::TenantName(name) => format!("a tenant named \"{name}\" already exists"),
            Taken::Key(id) => format!("a key with id {id} or with the same secret already exists"),
            Taken::TopUp(id) => {
                format!("the idempotency key of top-up {id} was already used for another tenant")
            }
        })
    }
}

/// A backend's error, which may be a unique-key violation.
pub(crate) trait DbError: Sized {
    /// What the backend's calls fail with: this error, or a store-level answer.
    type Failure: From<Self> + From<StoreError>;

    fn is_unique_violation(&self) -> bool;
}

/// For `map_err` on a write that may hit a unique key: that becomes `taken`'s `Conflict`, any
/// other error the backend's own.
pub(crate) fn conflict_if_unique<E: DbError>(
    taken: Taken<'_>,
) -> impl FnOnce(E) -> E::Failure + '_ {
    move |e| {
        if e.is_unique_violation() {
            taken.conflict().into()
        } else {
            e.into()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rows as JSON: the dead-letter table's `row_json` and the lines of a ledger spill file. The
// fields and their formats are [`LedgerRow`]'s serde attributes; these are the formats.

/// A token count as a decimal string (`"1200"`): no reader depends on how it holds JSON
/// numbers (often as doubles).
pub(super) mod count_text {
    use serde::de::{Error, Unexpected, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        struct Count;
        impl Visitor<'_> for Count {
            type Value = u64;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string of a token count like \"1200\"")
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<u64, E> {
                Some(v)
                    .filter(|s| !s.starts_with('-') && super::integer_text(s))
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
            }
        }
        d.deserialize_str(Count)
    }
}

/// Money as the decimal string of its integer number of pico-soles (`"1050000"`): exact
/// whatever its size, never a float.
pub(super) mod picos_text {
    use crate::money::Pen;
    use serde::de::{Error, Unexpected, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Pen, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&v.picos())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Pen, D::Error> {
        struct Picos;
        impl Visitor<'_> for Picos {
            type Value = Pen;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a string of an integer number of pico-soles (S/ 1 = 1000000000000) like \
                     \"1050000\"",
                )
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<Pen, E> {
                Some(v)
                    .filter(|s| super::integer_text(s))
                    .and_then(|s| s.parse::<i128>().ok())
                    .map(Pen::from_picos)
                    .ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
            }
        }
        d.deserialize_str(Picos)
    }
}

/// An optional `-` and decimal digits, nothing else (no `+`, no spaces, no point).
fn integer_text(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

impl LedgerRow {
    /// The row as a JSON object with every field (see [`LedgerRow`]'s serde attributes): money
    /// is the decimal string of the integer number of pico-soles (`charge_picos`,
    /// `unbilled_picos`) and token counts are decimal strings too, so no value depends on how
    /// a reader holds JSON numbers and a value that does not fit a column still round-trips.
    /// [`LedgerRow::from_json`] reads it back exactly.
    pub fn to_json(&self) -> String {
        #[expect(
            clippy::expect_used,
            reason = "strings, integers and a bool under fixed names always serialize"
        )]
        serde_json::to_string(self).expect("a ledger row serializes")
    }

    /// Reads back what [`LedgerRow::to_json`] wrote, as text.
    pub fn from_json(text: &str) -> Result<LedgerRow, String> {
        match serde_json::from_str::<Value>(text) {
            Ok(v @ Value::Object(_)) => LedgerRow::from_json_value(v),
            Ok(other) => Err(format!("a ledger row must be a JSON object, got {other}")),
            Err(e) => Err(format!("not JSON: {e}")),
        }
    }

    /// Reads back what [`LedgerRow::to_json`] wrote, parsed. Strict: every field must be there
    /// with its exact type and no other field may be (a typo or a damaged file must not turn
    /// into a default value, least of all a charge of zero); an error names the field.
    pub fn from_json_value(v: Value) -> Result<LedgerRow, String> {
        serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                e.into_inner().to_string()
            } else {
                format!("field \"{path}\": {}", e.into_inner())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_field() -> LedgerRow {
        LedgerRow {
            request_id: "req_01J9Z\u{e9}\"quoted\"\n".into(),
            at: 1_793_491_200_123,
            tenant_id: 42,
            key_id: "key_8f2c".into(),
            model: "apu".into(),
            format: "messages".into(),
            input_tokens: 1_234_567,
            cached_tokens: 89,
            output_tokens: 4_321,
            charge: Pen::from_picos(1_050_000),
            status: "client_disconnected".into(),
            http_status: 499,
            unbilled: Pen::from_picos(7),
            input_estimated: true,
            caps: Vec::new(),
        }
    }

    /// The fields of a row's JSON object, as older versions wrote them (in this order: the keys of
    /// a `serde_json::Map`, sorted).
    const ROW_FIELDS: [&str; 14] = [
        "at",
        "cached_tokens",
        "charge_picos",
        "format",
        "http_status",
        "input_estimated",
        "input_tokens",
        "key_id",
        "model",
        "output_tokens",
        "request_id",
        "status",
        "tenant_id",
        "unbilled_picos",
    ];

    fn object(row: &LedgerRow) -> serde_json::Map<String, Value> {
        match serde_json::from_str(&row.to_json()) {
            Ok(Value::Object(o)) => o,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_json_has_the_names_and_formats_older_versions_wrote_and_reads_their_rows() {
        let row = every_field();
        assert_eq!(
            row.to_json(),
            "{\"request_id\":\"req_01J9Z\u{e9}\\\"quoted\\\"\\n\",\"at\":1793491200123,\
             \"tenant_id\":42,\"key_id\":\"key_8f2c\",\"model\":\"apu\",\"format\":\"messages\",\
             \"input_tokens\":\"1234567\",\"cached_tokens\":\"89\",\"output_tokens\":\"4321\",\
             \"charge_picos\":\"1050000\",\"status\":\"client_disconnected\",\"http_status\":499,\
             \"unbilled_picos\":\"7\",\"input_estimated\":true}"
        );
        // A row as the hand-written encoder of earlier versions wrote it (keys sorted).
        let older = "{\"at\":1793491200123,\"cached_tokens\":\"89\",\"charge_picos\":\"1050000\",\
                     \"format\":\"messages\",\"http_status\":499,\"input_estimated\":true,\
                     \"input_tokens\":\"1234567\",\"key_id\":\"key_8f2c\",\"model\":\"apu\",\
                     \"output_tokens\":\"4321\",\"request_id\":\"req_01J9Z\u{e9}\\\"quoted\\\"\\n\",\
                     \"status\":\"client_disconnected\",\"tenant_id\":42,\"unbilled_picos\":\"7\"}";
        assert_eq!(LedgerRow::from_json(older), Ok(row.clone()));
        let keys: Vec<String> = object(&row).keys().cloned().collect();
        assert_eq!(keys, ROW_FIELDS);
    }

    fn round_trip(row: &LedgerRow) -> LedgerRow {
        let text = row.to_json();
        // Through text, as a spill file or the dead-letter table holds it.
        LedgerRow::from_json(&text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn every_field_round_trips() {
        let row = every_field();
        assert_eq!(round_trip(&row), row);
        // Each field is carried by its own key: changing any one changes the decoded row.
        let o = object(&row);
        assert_eq!(o.len(), ROW_FIELDS.len());
        assert_eq!(o["charge_picos"], "1050000");
        assert_eq!(o["unbilled_picos"], "7");
        assert_eq!(o["input_tokens"], "1234567");
        assert_eq!(o["at"], 1_793_491_200_123_i64);
        assert_eq!(o["http_status"], 499);
        assert_eq!(o["input_estimated"], true);
        let mut other = row.clone();
        other.input_estimated = false;
        other.http_status = 200;
        other.unbilled = Pen::ZERO;
        assert_eq!(round_trip(&other), other);
        assert_ne!(round_trip(&other), row);
    }

    #[test]
    fn extreme_values_round_trip_exactly() {
        let picos = [
            0,
            1,
            -1,
            999_999_999_999,
            1_000_000_000_001,
            i128::from(i64::MAX) + 1,
            // Beyond what a double holds exactly (2^53) and beyond i64.
            9_007_199_254_740_993,
            123_456_789_012_345_678_901_234_567_890,
            i128::MAX,
            i128::MIN,
        ];
        for p in picos {
            let mut row = every_field();
            row.charge = Pen::from_picos(p);
            row.unbilled = Pen::from_picos(p.wrapping_neg());
            assert_eq!(round_trip(&row), row, "{p}");
        }
        let mut row = every_field();
        row.at = i64::MIN;
        row.tenant_id = i64::MAX;
        row.input_tokens = u64::MAX;
        row.cached_tokens = 0;
        row.output_tokens = u64::MAX - 1;
        row.http_status = u16::MAX;
        row.request_id = String::new();
        row.status = "\u{1F999} \\ \t".into();
        assert_eq!(round_trip(&row), row);
        row.at = i64::MAX;
        row.tenant_id = i64::MIN;
        row.http_status = 0;
        assert_eq!(round_trip(&row), row);
    }

    #[test]
    fn damaged_rows_are_refused_naming_the_field() {
        let good = object(&every_field());
        let with = |key: &str, v: Value| {
            let mut o = good.clone();
            o.insert(key.into(), v);
            LedgerRow::from_json_value(Value::Object(o)).unwrap_err()
        };
        let without = |key: &str| {
            let mut o = good.clone();
            o.remove(key);
            LedgerRow::from_json_value(Value::Object(o)).unwrap_err()
        };
        // Money is never a JSON number, let alone a float.
        for bad in [
            serde_json::json!(1050000),
            serde_json::json!(1.05),
            serde_json::json!("1.05"),
            serde_json::json!("+5"),
            serde_json::json!(" 5"),
            serde_json::json!(""),
            serde_json::json!("-"),
            serde_json::json!("1e6"),
            serde_json::json!("170141183460469231731687303715884105728"), // i128::MAX + 1
        ] {
            let e = with("charge_picos", bad.clone());
            assert!(
                e.contains("charge_picos") && e.contains("pico-soles"),
                "{bad}: {e}"
            );
        }
        for bad in [
            serde_json::json!(5),
            serde_json::json!("-5"),
            serde_json::json!("18446744073709551616"),
        ] {
            let e = with("output_tokens", bad.clone());
            assert!(e.contains("output_tokens"), "{bad}: {e}");
        }
        assert!(with("http_status", serde_json::json!(70000)).contains("http_status"));
        assert!(with("at", serde_json::json!(1.5)).contains("\"at\""));
        assert!(with("input_estimated", serde_json::json!("yes")).contains("input_estimated"));
        assert!(with("model", serde_json::json!(null)).contains("model"));
        assert!(with("charge", serde_json::json!("1")).contains("unknown field `charge`"));
        for key in ROW_FIELDS {
            let e = without(key);
            assert!(e.contains(key) && e.contains("missing"), "{key}: {e}");
        }
        assert!(LedgerRow::from_json("[1]")
            .unwrap_err()
            .contains("JSON object"));
        assert!(LedgerRow::from_json("{\"request_id\":").is_err());
    }
}
