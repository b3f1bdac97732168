//! The request's options other than the conversation and the tools: typed readers with errors
//! that name the field, `text.format` → `response_format`, `reasoning` → the model's reasoning
//! switch, `include`, `metadata`, and the echo of the parameters in the response object.

use super::invalid;
use crate::config::Model;
use crate::error::ApiError;
use crate::protocol::responses::{
    ResponsesFormat, ResponsesReasoning, ResponsesRequest, ResponsesText,
};
use crate::translate::common::rawjson::{self, is_object, is_string};
use crate::translate::common::request::bool_field;
use crate::translate::upstream_body;
use crate::translate::DEFAULT_TEMPERATURE;
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// What `include` may ask for (the API's list); only `reasoning.encrypted_content` changes
/// anything here.
const INCLUDABLE: &[&str] = &[
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "web_search_call.action.sources",
    "web_search_call.results",
];

/// `include`: an array of the API's values; returns whether reasoning is to be echoed in
/// `encrypted_content`.
pub(super) fn include(raw: Option<&RawValue>) -> Result<bool, ApiError> {
    let Some(raw) = raw else {
        return Ok(false);
    };
    let values: Vec<&RawValue> = serde_json::from_str(raw.get())
        .map_err(|_| invalid("include", "must be an array of strings"))?;
    let mut encrypted = false;
    for (i, v) in values.iter().enumerate() {
        let s = rawjson::decode(v)
            .ok_or_else(|| invalid(format!("include[{i}]"), "must be a string"))?;
        if !INCLUDABLE.contains(&s.as_ref()) {
            return Err(invalid(
                format!("include[{i}]"),
                format!(
                    "\"{s}\" is not an includable value; the API's are {}",
                    INCLUDABLE.join(", ")
                ),
            ));
        }
        encrypted |= s == "reasoning.encrypted_content";
    }
    Ok(encrypted)
}

/// `text.format` → `,"response_format":…`: `json_object` as is, `json_schema` nested the
/// chat-completions way; `text` writes nothing. `text.verbosity` is checked and echoed only.
pub(super) fn write_text(raw: Option<&RawValue>, out: &mut Vec<u8>) -> Result<(), ApiError> {
    let Some(raw) = raw else {
        return Ok(());
    };
    if !is_object(raw) {
        return Err(invalid(
            "text",
            "must be an object like {\"format\": {\"type\": \"text\"}}",
        ));
    }
    let t: ResponsesText<'_> =
        serde_json::from_str(raw.get()).map_err(|e| invalid("text", e.to_string()))?;
    if let Some(v) = t.verbosity {
        if !matches!(
            rawjson::decode(v).as_deref(),
            Some("low" | "medium" | "high")
        ) {
            return Err(invalid("text.verbosity", "must be low, medium or high"));
        }
    }
    let Some(f) = t.format else {
        return Ok(());
    };
    if !is_object(f) {
        return Err(invalid("text.format", "must be an object with a `type`"));
    }
    let f: ResponsesFormat<'_> =
        serde_json::from_str(f.get()).map_err(|e| invalid("text.format", e.to_string()))?;
    let kind = f
        .kind
        .and_then(rawjson::decode)
        .ok_or_else(|| invalid("text.format.type", "is required"))?;
    match kind.as_ref() {
        "text" => Ok(()),
        "json_object" => {
            out.extend_from_slice(b",\"response_format\":{\"type\":\"json_object\"}");
            Ok(())
        }
        "json_schema" => {
            let name = f.name.and_then(rawjson::decode).ok_or_else(|| {
                invalid("text.format.name", "is required (a name for the schema)")
            })?;
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(invalid(
                    "text.format.name",
                    "must be 1-64 letters, digits, '_' or '-'",
                ));
            }
            let schema = f
                .schema
                .filter(|s| is_object(s))
                .ok_or_else(|| invalid("text.format.schema", "must be a JSON Schema object"))?;
            if !rawjson::depth_ok(schema.get()) {
                return Err(invalid("text.format.schema", "is nested too deeply"));
            }
            out.extend_from_slice(
                b",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":",
            );
            out.extend_from_slice(f.name.map_or("\"\"", RawValue::get).as_bytes());
            if let Some(d) = f.description {
                if !is_string(d) {
                    return Err(invalid("text.format.description", "must be a string"));
                }
                out.extend_from_slice(b",\"description\":");
                out.extend_from_slice(d.get().as_bytes());
            }
            out.extend_from_slice(b",\"schema\":");
            out.extend_from_slice(schema.get().as_bytes());
            if let Some(s) = f.strict {
                bool_field(Some(s), "text.format.strict")?;
                out.extend_from_slice(b",\"strict\":");
                out.extend_from_slice(s.get().as_bytes());
            }
            out.extend_from_slice(b"}}");
            Ok(())
        }
        other => Err(invalid(
            "text.format.type",
            format!("must be text, json_object or json_schema, got \"{other}\""),
        )),
    }
}

/// `reasoning` → the model's reasoning switch and `reasoning_effort`, as the chat format maps
/// its `reasoning.effort`: `none` turns reasoning off, any other effort on; `summary` is
/// accepted and echoed.
pub(super) fn write_reasoning(
    raw: Option<&RawValue>,
    model: &Model,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let Some(raw) = raw else {
        return Ok(());
    };
    let r: ResponsesReasoning<'_> = match is_object(raw) {
        true => serde_json::from_str(raw.get()).map_err(|e| invalid("reasoning", e.to_string()))?,
        false => {
            return Err(invalid(
                "reasoning",
                "must be an object like {\"effort\": \"low\"}",
            ))
        }
    };
    for (param, v) in [
        ("reasoning.summary", r.summary),
        ("reasoning.generate_summary", r.generate_summary),
    ] {
        if let Some(v) = v {
            if !matches!(
                rawjson::decode(v).as_deref(),
                Some("auto" | "concise" | "detailed")
            ) {
                return Err(invalid(param, "must be auto, concise or detailed"));
            }
        }
    }
    let effort = match r.effort {
        None => None,
        Some(e) => Some(
            rawjson::decode(e).ok_or_else(|| invalid("reasoning.effort", "must be a string"))?,
        ),
    };
    if let Some(e) = effort.as_deref() {
        if !matches!(
            e,
            "none" | "minimal" | "low" | "medium" | "high" | "xhigh" | "max"
        ) {
            return Err(invalid(
                "reasoning.effort",
                format!("must be none, minimal, low, medium, high, xhigh or max, got \"{e}\""),
            ));
        }
    }
    let on = effort.as_deref().map(|e| e != "none");
    upstream_body::write_reasoning(out, model, on, effort.as_deref())
}

/// `,"key":value`: the client's value compacted, or `default` when absent.
fn echo_field(out: &mut Vec<u8>, key: &str, raw: Option<&RawValue>, default: &[u8]) {
    out.push(b',');
    echo_member(out, key, raw, default);
}

/// `"key":value` (no comma), as [`echo_field`].
fn echo_member(out: &mut Vec<u8>, key: &str, raw: Option<&RawValue>, default: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    match raw {
        Some(r) => rawjson::write_compact(out, r.get()),
        None => out.extend_from_slice(default),
    }
}

/// `metadata`: at most 16 pairs of strings, keys up to 64 characters, values up to 512.
fn check_metadata(raw: &RawValue) -> Result<(), ApiError> {
    let map: BTreeMap<String, &RawValue> = serde_json::from_str(raw.get())
        .map_err(|_| invalid("metadata", "must be an object of string values"))?;
    if map.len() > 16 {
        return Err(invalid("metadata", "may have at most 16 keys"));
    }
    for (k, v) in &map {
        if k.chars().count() > 64 {
            return Err(invalid(
                format!("metadata.{k}"),
                "keys may have at most 64 characters",
            ));
        }
        let value = rawjson::decode(v)
            .ok_or_else(|| invalid(format!("metadata.{k}"), "must be a string"))?;
        if value.chars().count() > 512 {
            return Err(invalid(
                format!("metadata.{k}"),
                "values may have at most 512 characters",
            ));
        }
    }
    Ok(())
}

/// The response object's echo of the request: each member after a `,`, in the API's order,
/// the client's values compacted (so they fit an SSE `data:` line) or the defaults.
pub(super) fn echo(
    req: &ResponsesRequest<'_>,
    max_tokens: u32,
    store: bool,
) -> Result<Vec<u8>, ApiError> {
    if let Some(m) = req.metadata {
        check_metadata(m)?;
    }
    if let Some(t) = req.truncation {
        if !matches!(rawjson::decode(t).as_deref(), Some("auto" | "disabled")) {
            return Err(invalid("truncation", "must be auto or disabled"));
        }
    }
    let mut out = Vec::with_capacity(256 + req.tools.map_or(0, |t| t.get().len()));
    echo_field(&mut out, "instructions", req.instructions, b"null");
    out.extend_from_slice(b",\"max_output_tokens\":");
    out.extend_from_slice(itoa::Buffer::new().format(max_tokens).as_bytes());
    out.extend_from_slice(b",\"max_tool_calls\":null");
    echo_field(&mut out, "metadata", req.metadata, b"{}");
    echo_field(
        &mut out,
        "parallel_tool_calls",
        req.parallel_tool_calls,
        b"true",
    );
    echo_field(
        &mut out,
        "previous_response_id",
        req.previous_response_id,
        b"null",
    );
    let (effort, summary) = match req
        .reasoning
        .map(|r| serde_json::from_str::<ResponsesReasoning<'_>>(r.get()))
    {
        Some(Ok(r)) => (r.effort, r.summary.or(r.generate_summary)),
        _ => (None, None),
    };
    out.extend_from_slice(b",\"reasoning\":{");
    echo_member(&mut out, "effort", effort, b"null");
    echo_field(&mut out, "summary", summary, b"null");
    out.push(b'}');
    out.extend_from_slice(b",\"service_tier\":\"default\",\"store\":");
    out.extend_from_slice(if store { b"true" } else { b"false" });
    out.extend_from_slice(b",\"temperature\":");
    match req.temperature {
        Some(t) => out.extend_from_slice(t.get().as_bytes()),
        None => out.extend_from_slice(DEFAULT_TEMPERATURE.to_string().as_bytes()),
    }
    let (format, verbosity) = match req
        .text
        .map(|t| serde_json::from_str::<ResponsesText<'_>>(t.get()))
    {
        Some(Ok(t)) => (t.format, t.verbosity),
        _ => (None, None),
    };
    out.extend_from_slice(b",\"text\":{");
    echo_member(&mut out, "format", format, b"{\"type\":\"text\"}");
    echo_field(&mut out, "verbosity", verbosity, b"\"medium\"");
    out.push(b'}');
    echo_field(&mut out, "tool_choice", req.tool_choice, b"\"auto\"");
    echo_field(&mut out, "tools", req.tools, b"[]");
    out.extend_from_slice(b",\"top_logprobs\":0");
    echo_field(&mut out, "top_p", req.top_p, b"1.0");
    echo_field(&mut out, "truncation", req.truncation, b"\"disabled\"");
    echo_field(&mut out, "user", req.user, b"null");
    Ok(out)
}
