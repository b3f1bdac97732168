//! Messages-format create requests → the upstream request body.
//!
//! Validates the top-level fields, applies docs/design.md's request rules (`max_tokens` optional,
//! default and clamp 8192; `temperature` default 0.6, range 0–1; usage always requested on
//! streams), writes the prompt through [`super::prompt`] and the rest directly as bytes.
//!
//! Accepted and dropped, never a 400: `thinking` of type `adaptive` (or any type other than
//! `enabled`/`disabled`), `effort`, `output_config`, `context_management`, `cache_control`,
//! `safeguards`, `service_tier`, `container`, `inference_geo`, tool extras such as
//! `defer_loading`, and any unknown top-level field — a self-hosted upstream cannot honour
//! them, and clients such as Claude Code send them on every request.
//!
//! Upstream body, in this key order: `model` (the upstream's name), `messages`, `tools`,
//! `max_tokens`, `temperature`, `top_p`, `top_k`, `stop`, `tool_choice`,
//! `parallel_tool_calls`, `user`, the model's `thinking_on`/`thinking_off` keys,
//! `continue_final_message` and `add_generation_prompt` (only for a prefill — a final assistant
//! message with text — on a model whose `prefill` switch is on: vLLM's defaults would start a
//! new turn after it), `stream`, `stream_options`. Equal requests give equal bytes.

use super::prompt::{parse_object, write_prompt, Items, PromptIn, ToolNames};
use crate::config::{Config, Model};
use crate::error::{write_json_str, ApiError};
use crate::protocol::anthropic::{
    AnthropicMessage, AnthropicMetadata, AnthropicRequest, AnthropicRequestTyped,
    AnthropicThinking, AnthropicTool, AnthropicToolChoice,
};
use crate::translate::common::rawjson::{self, is_array, is_string};
use crate::translate::common::request::{
    body_error, bool_field, invalid, max_tokens_field, object_text, resolve_model, write_sampling,
};
use crate::translate::upstream_body::{self, Endpoint};
use crate::translate::{UpstreamRequest, MAX_OUTPUT_TOKENS};
use serde_json::value::RawValue;

/// Validates a messages-format request and writes its upstream form.
pub fn messages_to_upstream(body: &[u8], config: &Config) -> Result<UpstreamRequest, ApiError> {
    let req = parse_request(body)?;
    let (model_name, model) = resolve_model(req.model, config)?;

    let stream = bool_field(req.stream, "stream")?.unwrap_or(false);
    let max_tokens = match req.max_tokens {
        Some(raw) => max_tokens_field(raw, "max_tokens")?,
        None => MAX_OUTPUT_TOKENS,
    };

    let mut out = Vec::with_capacity(body.len() + 256);
    upstream_body::open(&mut out, model);
    out.push(b',');
    let prompt = write_prompt(
        PromptIn {
            system: req.system,
            messages: req.messages,
            tools: req.tools,
        },
        model,
        config,
        &model_name,
        &mut out,
    )?;

    write_sampling(&mut out, max_tokens, req.temperature, 1.0, req.top_p)?;
    if let Some(raw) = req.top_k {
        let ok = serde_json::from_str::<u64>(raw.get()).is_ok();
        if !ok {
            return Err(invalid("top_k", "must be an integer of at least 0"));
        }
        out.extend_from_slice(b",\"top_k\":");
        out.extend_from_slice(raw.get().as_bytes());
    }
    if let Some(raw) = req.stop_sequences {
        write_stop(raw, &mut out)?;
    }
    if let Some(raw) = req.tool_choice {
        write_tool_choice(raw, &prompt.names, &mut out)?;
    }
    if let Some(raw) = req.metadata {
        let meta: AnthropicMetadata<'_> = parse_object(
            raw,
            &|| "metadata".into(),
            "an object like {\"user_id\": \"…\"}",
        )?;
        if let Some(user) = meta.user_id {
            if !is_string(user) {
                return Err(invalid("metadata.user_id", "must be a string"));
            }
            out.extend_from_slice(b",\"user\":");
            out.extend_from_slice(user.get().as_bytes());
        }
    }
    if let Some(raw) = req.thinking {
        write_thinking(raw, model, &mut out)?;
    }
    upstream_body::close(
        &mut out,
        model,
        Endpoint::ChatCompletions { stream },
        prompt.prefill,
    );

    Ok(UpstreamRequest {
        model: model.id,
        client_model: model_name.into_owned(),
        stream,
        client_wants_usage: false,
        max_tokens,
        prompt_bytes: prompt.messages_range.len() + prompt.tools_bytes,
        prompt_range: prompt.messages_range,
        tool_name_map: prompt.names.shortened,
        body: out,
    })
}

/// A request's top level: `messages` and `tools` already parsed (fast path) or still raw.
pub(super) struct Request<'a> {
    pub model: Option<&'a RawValue>,
    pub messages: Items<'a, AnthropicMessage<'a>>,
    pub system: Option<&'a RawValue>,
    pub max_tokens: Option<&'a RawValue>,
    pub temperature: Option<&'a RawValue>,
    pub top_p: Option<&'a RawValue>,
    pub top_k: Option<&'a RawValue>,
    pub stop_sequences: Option<&'a RawValue>,
    pub stream: Option<&'a RawValue>,
    pub metadata: Option<&'a RawValue>,
    pub tools: Items<'a, AnthropicTool<'a>>,
    pub tool_choice: Option<&'a RawValue>,
    pub thinking: Option<&'a RawValue>,
}

fn items<'a, T>(parsed: Option<Vec<T>>) -> Items<'a, T> {
    parsed.map_or(Items::Absent, Items::Parsed)
}

fn raw_items<'a, T>(raw: Option<&'a RawValue>) -> Items<'a, T> {
    raw.map_or(Items::Absent, Items::Raw)
}

/// Parses the top level, which must be a JSON object.
///
/// One pass reads the body with `messages` and `tools` parsed as it goes. If that fails, the
/// body is read again with every field raw, so that validation can name the exact field.
pub(super) fn parse_request(body: &[u8]) -> Result<Request<'_>, ApiError> {
    let text = object_text(body)?;
    if let Ok(r) = serde_json::from_str::<AnthropicRequestTyped<'_>>(text) {
        return Ok(Request {
            model: r.model,
            messages: items(r.messages),
            system: r.system,
            max_tokens: r.max_tokens,
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            stop_sequences: r.stop_sequences,
            stream: r.stream,
            metadata: r.metadata,
            tools: items(r.tools),
            tool_choice: r.tool_choice,
            thinking: r.thinking,
        });
    }
    let r: AnthropicRequest<'_> =
        serde_json::from_str(text).map_err(|e| body_error(&e, "messages"))?;
    Ok(Request {
        model: r.model,
        messages: raw_items(r.messages),
        system: r.system,
        max_tokens: r.max_tokens,
        temperature: r.temperature,
        top_p: r.top_p,
        top_k: r.top_k,
        stop_sequences: r.stop_sequences,
        stream: r.stream,
        metadata: r.metadata,
        tools: raw_items(r.tools),
        tool_choice: r.tool_choice,
        thinking: r.thinking,
    })
}

/// `stop_sequences` → `stop` (omitted when empty).
fn write_stop(raw: &RawValue, out: &mut Vec<u8>) -> Result<(), ApiError> {
    let bad = || invalid("stop_sequences", "must be an array of strings");
    if !is_array(raw) {
        return Err(bad());
    }
    let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(|_| bad())?;
    for (i, s) in items.iter().enumerate() {
        if !is_string(s) {
            return Err(bad());
        }
        if rawjson::str_is_empty(s) {
            return Err(invalid(format!("stop_sequences[{i}]"), "must not be empty"));
        }
    }
    if !items.is_empty() {
        out.extend_from_slice(b",\"stop\":");
        out.extend_from_slice(raw.get().as_bytes());
    }
    Ok(())
}

/// `tool_choice`: auto → `"auto"`, any → `"required"`, tool → the named function, none →
/// `"none"`; `disable_parallel_tool_use: true` → `parallel_tool_calls: false`. Without tools,
/// `auto`/`none` are omitted (the upstream rejects a choice without tools) and `any`/`tool`
/// are a 400.
fn write_tool_choice(
    raw: &RawValue,
    names: &ToolNames<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let tc: AnthropicToolChoice<'_> = parse_object(
        raw,
        &|| "tool_choice".into(),
        "an object like {\"type\": \"auto\"}",
    )?;
    let kind = tc
        .kind
        .filter(|k| is_string(k))
        .ok_or_else(|| invalid("tool_choice.type", "must be a string"))?;
    let disable_parallel = match tc.disable_parallel_tool_use.map(RawValue::get) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            return Err(invalid(
                "tool_choice.disable_parallel_tool_use",
                "must be true or false",
            ))
        }
    };
    let has_tools = !names.declared.is_empty();
    let kind_s = rawjson::decode(kind).unwrap_or_default();
    match kind_s.as_ref() {
        "auto" | "none" if !has_tools => return Ok(()),
        "auto" => out.extend_from_slice(b",\"tool_choice\":\"auto\""),
        "none" => out.extend_from_slice(b",\"tool_choice\":\"none\""),
        "any" | "tool" if !has_tools => {
            return Err(invalid(
                "tool_choice.type",
                format!("\"{kind_s}\" requires `tools`"),
            ))
        }
        "any" => out.extend_from_slice(b",\"tool_choice\":\"required\""),
        "tool" => {
            let name_raw = tc
                .name
                .filter(|n| is_string(n))
                .ok_or_else(|| invalid("tool_choice.name", "must be a tool name"))?;
            let name = rawjson::decode(name_raw).unwrap_or_default();
            let upstream = names.declared_upstream(&name).ok_or_else(|| {
                invalid(
                    "tool_choice.name",
                    format!("names `{name}`, which is not in `tools`"),
                )
            })?;
            out.extend_from_slice(
                b",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":",
            );
            write_json_str(out, upstream);
            out.extend_from_slice(b"}}");
        }
        other => {
            return Err(invalid(
                "tool_choice.type",
                format!("must be auto, any, tool or none, got \"{other}\""),
            ))
        }
    }
    if disable_parallel {
        out.extend_from_slice(b",\"parallel_tool_calls\":false");
    }
    Ok(())
}

/// `thinking`: `enabled` merges the model's `thinking_on` keys into the body, `disabled` its
/// `thinking_off` keys; other types (`adaptive`, future ones) change nothing.
pub(super) fn write_thinking(
    raw: &RawValue,
    model: &Model,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let t: AnthropicThinking<'_> = parse_object(
        raw,
        &|| "thinking".into(),
        "an object like {\"type\": \"enabled\", \"budget_tokens\": 2048}",
    )?;
    let kind = t
        .kind
        .filter(|k| is_string(k))
        .ok_or_else(|| invalid("thinking.type", "must be a string"))?;
    if let Some(b) = t.budget_tokens {
        if serde_json::from_str::<u64>(b.get()).is_err() {
            return Err(invalid(
                "thinking.budget_tokens",
                "must be a non-negative integer",
            ));
        }
    }
    let switch = if rawjson::str_eq(kind, "enabled") {
        model.thinking_on.as_ref()
    } else if rawjson::str_eq(kind, "disabled") {
        model.thinking_off.as_ref()
    } else {
        None
    };
    upstream_body::write_switch(out, switch)
}
