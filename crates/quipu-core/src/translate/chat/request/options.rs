//! The request options other than `messages` and `tools`: `stop`, `logit_bias` and
//! `response_format` checked (then copied as written by the caller), and `reasoning` turned
//! into the model's reasoning switch and `reasoning_effort`.

use crate::config::Model;
use crate::error::ApiError;
use crate::translate::upstream_body;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

#[derive(Deserialize)]
struct ReasoningIn<'a> {
    #[serde(borrow, default)]
    effort: Option<Cow<'a, str>>,
    #[serde(default)]
    enabled: Option<bool>,
}

pub(super) fn validate_stop(raw: &RawValue) -> Result<(), ApiError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Stop<'a> {
        One(#[serde(borrow)] Cow<'a, str>),
        Many(#[serde(borrow)] Vec<Cow<'a, str>>),
    }
    let stop: Stop = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::invalid("stop", "`stop` must be a string or an array of strings"))?;
    let count = match &stop {
        Stop::One(s) => usize::from(!s.is_empty()),
        Stop::Many(v) => v.len(),
    };
    if count > 16 {
        return Err(ApiError::invalid(
            "stop",
            "`stop` accepts at most 16 sequences",
        ));
    }
    if let Stop::Many(v) = &stop {
        if v.iter().any(|s| s.is_empty()) {
            return Err(ApiError::invalid(
                "stop",
                "`stop` sequences must not be empty",
            ));
        }
    }
    Ok(())
}

pub(super) fn validate_logit_bias(raw: &RawValue) -> Result<(), ApiError> {
    let map: std::collections::BTreeMap<Cow<'_, str>, f64> = serde_json::from_str(raw.get())
        .map_err(|_| {
            ApiError::invalid(
                "logit_bias",
                "`logit_bias` must be an object mapping token ids to numbers",
            )
        })?;
    for (k, v) in &map {
        if k.parse::<u32>().is_err() {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` keys must be token ids, got \"{k}\""),
            ));
        }
        if !(-100.0..=100.0).contains(v) {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` values must be between -100 and 100, got {v}"),
            ));
        }
    }
    Ok(())
}

pub(super) fn validate_response_format(raw: &RawValue) -> Result<(), ApiError> {
    #[derive(Deserialize)]
    struct Rf<'a> {
        #[serde(borrow, rename = "type")]
        kind: Cow<'a, str>,
        #[serde(borrow, default)]
        json_schema: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Js<'a> {
        #[serde(borrow)]
        name: Cow<'a, str>,
        #[serde(borrow, default)]
        schema: Option<&'a RawValue>,
    }
    let rf: Rf = serde_json::from_str(raw.get()).map_err(|_| {
        ApiError::invalid(
            "response_format",
            "`response_format` must be an object with a `type`",
        )
    })?;
    match rf.kind.as_ref() {
        "text" | "json_object" => Ok(()),
        "json_schema" => {
            let js: Js = rf
                .json_schema
                .and_then(|r| serde_json::from_str(r.get()).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "response_format.json_schema",
                        "`json_schema` must be an object with a `name` and a `schema`",
                    )
                })?;
            if js.name.is_empty() || js.name.len() > 64 {
                return Err(ApiError::invalid(
                    "response_format.json_schema.name",
                    "the schema `name` must have 1 to 64 characters",
                ));
            }
            if let Some(s) = js.schema {
                if !s.get().starts_with('{') {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema",
                        "the `schema` must be a JSON Schema object",
                    ));
                }
            }
            Ok(())
        }
        other => Err(ApiError::invalid(
            "response_format.type",
            format!(
                "`response_format.type` must be text, json_object or json_schema, got \"{other}\""
            ),
        )),
    }
}

pub(super) fn write_reasoning(
    raw: &RawValue,
    model: &Model,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let r: ReasoningIn = serde_json::from_str(raw.get()).map_err(|_| {
        ApiError::invalid(
            "reasoning",
            "`reasoning` must be an object like {\"effort\":\"low\"} or {\"enabled\":false}",
        )
    })?;
    let effort = r.effort.as_deref();
    if let Some(e) = effort {
        if !matches!(e, "none" | "minimal" | "low" | "medium" | "high" | "xhigh") {
            return Err(ApiError::invalid(
                "reasoning.effort",
                format!("`reasoning.effort` must be none, minimal, low, medium, high or xhigh, got \"{e}\""),
            ));
        }
    }
    let on = match (r.enabled, effort) {
        (Some(false), _) | (_, Some("none")) => Some(false),
        (Some(true), _) | (_, Some(_)) => Some(true),
        (None, None) => None,
    };
    upstream_body::write_reasoning(out, model, on, effort)
}
