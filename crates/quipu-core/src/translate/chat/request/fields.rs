//! Typed readers over raw JSON values: each checks one value's type or range and, when it is
//! wrong, returns a 400 that names the parameter (`messages[2].content[0].text`), built only
//! then ([`Index`] and [`Dot`] format lazily).

use crate::error::ApiError;
use crate::translate::common::request::{token_count, BadCount, Spelling};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// `parent[index]`: a parameter path, formatted only when an error names it (the hot path
/// validates every message and part, and must not build strings for paths nobody reads).
pub(super) struct Index<'a>(pub(super) &'a dyn fmt::Display, pub(super) usize);

impl fmt::Display for Index<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// `parent.field`, formatted lazily like [`Index`].
pub(super) struct Dot<'a>(pub(super) &'a dyn fmt::Display, pub(super) &'a str);

impl fmt::Display for Dot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

pub(super) fn str_field<'a>(
    raw: &'a RawValue,
    param: impl fmt::Display,
) -> Result<Cow<'a, str>, ApiError> {
    serde_json::from_str::<Cow<'a, str>>(raw.get())
        .map_err(|_| ApiError::invalid(param.to_string(), format!("`{param}` must be a string")))
}

pub(super) fn bool_field(raw: &RawValue, param: &str) -> Result<Option<bool>, ApiError> {
    serde_json::from_str::<Option<bool>>(raw.get())
        .map_err(|_| ApiError::invalid(param, format!("`{param}` must be true or false")))
}

fn number_field(raw: &RawValue, param: &str) -> Result<f64, ApiError> {
    let v: serde_json::Number = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::invalid(param, format!("`{param}` must be a number")))?;
    v.as_f64()
        .filter(|f| f.is_finite())
        .ok_or_else(|| ApiError::invalid(param, format!("`{param}` must be a finite number")))
}

pub(super) fn number_in(raw: &RawValue, param: &str, min: f64, max: f64) -> Result<f64, ApiError> {
    let v = number_field(raw, param)?;
    if v < min || v > max {
        let lo = if min == f64::MIN_POSITIVE {
            "above 0".to_owned()
        } else {
            format!("at least {min}")
        };
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be {lo} and at most {max}, got {v}"),
        ));
    }
    Ok(v)
}

pub(super) fn integer_field(raw: &RawValue, param: &str) -> Result<i64, ApiError> {
    let v: serde_json::Number = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::invalid(param, format!("`{param}` must be an integer")))?;
    v.as_i64()
        .ok_or_else(|| ApiError::invalid(param, format!("`{param}` must be an integer")))
}

/// `max_tokens` (or `max_completion_tokens`): an integer ≥ 1, any whole number taken (see
/// [`Spelling`]); anything larger than the maximum is clamped to it.
pub(super) fn max_tokens_field(raw: &RawValue, param: &str) -> Result<u32, ApiError> {
    token_count(raw, Spelling::WholeNumber).map_err(|bad| match bad {
        BadCount::NotInteger => ApiError::invalid(param, format!("`{param}` must be an integer")),
        BadCount::BelowOne => ApiError::invalid(param, format!("`{param}` must be at least 1")),
    })
}
