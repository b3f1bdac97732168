//! What the create requests of the formats read alike: the body's top level (UTF-8, one JSON
//! object, serde's complaint turned into a client message), `model` (a slug or an alias of
//! one), booleans, bounded numbers and token counts (`max_tokens`, `max_output_tokens`), and
//! the sampling members every upstream body carries ([`write_sampling`]).
//!
//! Errors here start with the offending field's path ([`invalid`]): the messages format's
//! and the Responses API's clients show only the message. The chat format words its own
//! errors (`` `stream` must be true or false ``) and takes only the rules: [`find_model`] and
//! [`token_count`].

use crate::config::{Config, Model};
use crate::error::{ApiError, ErrorKind};
use crate::translate::common::rawjson;
use crate::translate::{DEFAULT_TEMPERATURE, MAX_OUTPUT_TOKENS};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// A 400 whose message starts with the offending field's path.
pub fn invalid(param: impl Into<String>, what: impl AsRef<str>) -> ApiError {
    let param = param.into();
    let message = format!("{param}: {}", what.as_ref());
    ApiError::invalid(param, message)
}

/// The body as text, once it is UTF-8 and its first character opens a JSON object (serde's
/// derived structs would also take an array of fields by position).
pub fn object_text(body: &[u8]) -> Result<&str, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::invalid_body(format!("the request body is not valid UTF-8: {e}")))?;
    match text.bytes().find(|b| !b.is_ascii_whitespace()) {
        None => Err(ApiError::invalid_body(
            "the request body is empty; send a JSON object",
        )),
        Some(b'{') => Ok(text),
        Some(_) => Err(ApiError::invalid_body(
            "the request body must be a JSON object",
        )),
    }
}

/// Why serde could not read the body as a `what` request (`messages`, `Responses`).
pub fn body_error(e: &serde_json::Error, what: &str) -> ApiError {
    let msg = if e.to_string().contains("recursion limit") {
        "the request body is nested too deeply".to_owned()
    } else if e.is_syntax() || e.is_eof() {
        format!("the request body is not valid JSON: {e}")
    } else {
        format!("the request body is not a valid {what} request: {e}")
    };
    ApiError::invalid_body(msg)
}

/// `model`: required; a slug or an alias of one. Returns the name as sent, and the model.
pub fn resolve_model<'a, 'c>(
    raw: Option<&'a RawValue>,
    config: &'c Config,
) -> Result<(Cow<'a, str>, &'c Model), ApiError> {
    let raw = raw.ok_or_else(|| invalid("model", "is required"))?;
    let name = rawjson::decode(raw).ok_or_else(|| invalid("model", "must be a string"))?;
    let model = find_model(&name, config)?;
    Ok((name, model))
}

/// The model `name` resolves to, or the 404 every format answers: the valid names listed.
pub fn find_model<'c>(name: &str, config: &'c Config) -> Result<&'c Model, ApiError> {
    config.resolve_model(name).ok_or_else(|| {
        ApiError::new(
            ErrorKind::ModelNotFound,
            format!(
                "model `{name}` does not exist; valid models are {}",
                config.slug_list()
            ),
        )
    })
}

/// `true`, `false`, or absent.
pub fn bool_field(raw: Option<&RawValue>, param: &str) -> Result<Option<bool>, ApiError> {
    match raw.map(RawValue::get) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(_) => Err(invalid(param, "must be true or false")),
    }
}

/// A finite number in `[min, max]` (`(min, max]` unless `min_inclusive`).
pub fn number_in(
    raw: &RawValue,
    param: &str,
    min: f64,
    max: f64,
    min_inclusive: bool,
) -> Result<f64, ApiError> {
    let range = if min_inclusive {
        format!("between {min} and {max}")
    } else {
        format!("above {min} and at most {max}")
    };
    let bad = || invalid(param, format!("must be a number {range}"));
    let v: serde_json::Number = serde_json::from_str(raw.get()).map_err(|_| bad())?;
    let f = v.as_f64().filter(|f| f.is_finite()).ok_or_else(bad)?;
    let above_min = if min_inclusive { f >= min } else { f > min };
    if !above_min || f > max {
        return Err(bad());
    }
    Ok(f)
}

/// Writes `,"max_tokens":N,"temperature":T` and, when sent, `,"top_p":P`: `temperature` in
/// `[0, max_temperature]` (the default when absent), `top_p` in `(0, 1]`, each copied as the
/// client wrote it.
pub fn write_sampling(
    out: &mut Vec<u8>,
    max_tokens: u32,
    temperature: Option<&RawValue>,
    max_temperature: f64,
    top_p: Option<&RawValue>,
) -> Result<(), ApiError> {
    out.extend_from_slice(b",\"max_tokens\":");
    out.extend_from_slice(itoa::Buffer::new().format(max_tokens).as_bytes());
    out.extend_from_slice(b",\"temperature\":");
    match temperature {
        Some(raw) => {
            number_in(raw, "temperature", 0.0, max_temperature, true)?;
            out.extend_from_slice(raw.get().as_bytes());
        }
        None => out.extend_from_slice(DEFAULT_TEMPERATURE.to_string().as_bytes()),
    }
    if let Some(raw) = top_p {
        number_in(raw, "top_p", 0.0, 1.0, false)?;
        out.extend_from_slice(b",\"top_p\":");
        out.extend_from_slice(raw.get().as_bytes());
    }
    Ok(())
}

/// Which spellings of a count too large for `u64` (serde reads it as a float) are taken, and
/// clamped: the chat format takes any whole number (`1e30`, `100000000000000000000.0`), the
/// others an integer written as one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// Digits only.
    Integer,
    /// Any number without a fractional part.
    WholeNumber,
}

/// Why a token count was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadCount {
    /// Not a number, or not an integer.
    NotInteger,
    /// Zero or negative.
    BelowOne,
}

/// A token count (`max_tokens` and its kin): an integer ≥ 1; larger than
/// [`MAX_OUTPUT_TOKENS`] is clamped to it.
pub fn token_count(raw: &RawValue, spelling: Spelling) -> Result<u32, BadCount> {
    let v: serde_json::Number =
        serde_json::from_str(raw.get()).map_err(|_| BadCount::NotInteger)?;
    let whole = |f: f64| match spelling {
        Spelling::Integer => !raw.get().contains(['.', 'e', 'E']),
        Spelling::WholeNumber => f.is_finite() && f.fract() == 0.0,
    };
    let n = match (v.as_u64(), v.as_i64(), v.as_f64()) {
        (Some(n), _, _) => n,
        // Negative.
        (None, Some(_), _) => 0,
        // An integer too large for u64.
        (None, None, Some(f)) if f >= 1.0 && whole(f) => u64::MAX,
        _ => return Err(BadCount::NotInteger),
    };
    if n == 0 {
        return Err(BadCount::BelowOne);
    }
    Ok(u32::try_from(n.min(u64::from(MAX_OUTPUT_TOKENS))).unwrap_or(MAX_OUTPUT_TOKENS))
}

/// [`token_count`] of an integer-only field, refused as "must be an integer of at least 1".
pub fn max_tokens_field(raw: &RawValue, param: &str) -> Result<u32, ApiError> {
    token_count(raw, Spelling::Integer)
        .map_err(|_| invalid(param, "must be an integer of at least 1"))
}
