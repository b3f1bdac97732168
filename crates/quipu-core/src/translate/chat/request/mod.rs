//! Chat-format requests → the upstream request.
//!
//! Validates every chat-completions field Quipu accepts (type, range, shape), applies the rules
//! of docs/design.md (`max_tokens` default and clamp at 8192, `max_completion_tokens` alias,
//! `temperature` 0.6, `developer` role as `system`, unlisted fields dropped, usage always
//! requested upstream) and writes the upstream JSON directly. Client values that pass validation are copied as the
//! client wrote them (their raw JSON text), so nothing is re-encoded on the way.
//!
//! A prompt needs at least one user or assistant message (system messages alone are a 400, as
//! is a `content` that is an empty array of parts).
//!
//! Each message is rebuilt from its known fields (`role`, `content`, `name`, `tool_calls`,
//! `tool_call_id`, and reasoning history) so that per-message extras do not leak upstream.
//!
//! Layout: this file reads the top level and writes the body in order; [`fields`] reads typed
//! values out of raw JSON with errors that name the parameter; [`messages`] validates and
//! writes `messages` (content parts, images, tool-call history); [`tools`] writes `tools` and
//! checks `tool_choice`; [`options`] checks the remaining options and writes the reasoning
//! switch.

mod fields;
mod messages;
mod options;
mod tools;

use crate::config::Config;
use crate::error::{write_json_str, ApiError};
use crate::translate::common::request::find_model;
use crate::translate::upstream_body::{self, Endpoint};
use crate::translate::{UpstreamRequest, DEFAULT_TEMPERATURE, MAX_OUTPUT_TOKENS};
use fields::{bool_field, integer_field, max_tokens_field, number_in, str_field};
use messages::write_messages;
use options::{validate_logit_bias, validate_response_format, validate_stop, write_reasoning};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashSet;
use tools::{validate_tool_choice, write_tools};

/// The request's top level; every field raw so each gets a precise error.
#[derive(Deserialize)]
struct ChatRequestIn<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    temperature: Option<&'a RawValue>,
    #[serde(borrow, default)]
    top_p: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stop: Option<&'a RawValue>,
    #[serde(borrow, default)]
    seed: Option<&'a RawValue>,
    #[serde(borrow, default)]
    frequency_penalty: Option<&'a RawValue>,
    #[serde(borrow, default)]
    presence_penalty: Option<&'a RawValue>,
    #[serde(borrow, default)]
    logit_bias: Option<&'a RawValue>,
    #[serde(borrow, default)]
    logprobs: Option<&'a RawValue>,
    #[serde(borrow, default)]
    top_logprobs: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response_format: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow, default)]
    parallel_tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow, default)]
    user: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct StreamOptionsIn {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Validates a chat-format request and writes its upstream form.
pub fn chat_to_upstream(body: &[u8], config: &Config) -> Result<UpstreamRequest, ApiError> {
    let req: ChatRequestIn = parse_body(body)?;

    let model_name = match req.model {
        Some(raw) => str_field(raw, "model")?,
        None => return Err(ApiError::invalid("model", "`model` is required")),
    };
    let model = find_model(&model_name, config)?;

    let stream = match req.stream {
        Some(raw) => bool_field(raw, "stream")?.unwrap_or(false),
        None => false,
    };
    let client_wants_usage = match req.stream_options {
        Some(raw) if raw.get() != "null" => {
            let opts: StreamOptionsIn = serde_json::from_str(raw.get()).map_err(|_| {
                ApiError::invalid(
                    "stream_options",
                    "`stream_options` must be an object like {\"include_usage\": true}",
                )
            })?;
            stream && opts.include_usage.unwrap_or(false)
        }
        _ => false,
    };

    let max_tokens = match (req.max_completion_tokens, req.max_tokens) {
        (Some(raw), _) if raw.get() != "null" => max_tokens_field(raw, "max_completion_tokens")?,
        (_, Some(raw)) if raw.get() != "null" => max_tokens_field(raw, "max_tokens")?,
        _ => MAX_OUTPUT_TOKENS,
    };

    let mut out = Vec::with_capacity(body.len() + 256);
    upstream_body::open(&mut out, model);
    out.extend_from_slice(b",\"messages\":");
    let messages_start = out.len();
    let messages = req
        .messages
        .ok_or_else(|| ApiError::invalid("messages", "`messages` is required"))?;
    write_messages(messages, model, config, &mut out)?;
    let prompt_range = messages_start..out.len();
    let mut prompt_bytes = out.len() - messages_start;

    out.extend_from_slice(b",\"max_tokens\":");
    out.extend_from_slice(max_tokens.to_string().as_bytes());

    out.extend_from_slice(b",\"temperature\":");
    match req.temperature.filter(|r| r.get() != "null") {
        Some(raw) => {
            number_in(raw, "temperature", 0.0, 2.0)?;
            out.extend_from_slice(raw.get().as_bytes());
        }
        None => out.extend_from_slice(DEFAULT_TEMPERATURE.to_string().as_bytes()),
    }

    let copy = |name: &str, raw: &RawValue, out: &mut Vec<u8>| {
        out.push(b',');
        write_json_str(out, name);
        out.push(b':');
        out.extend_from_slice(raw.get().as_bytes());
    };

    if let Some(raw) = present(req.top_p) {
        number_in(raw, "top_p", f64::MIN_POSITIVE, 1.0)?;
        copy("top_p", raw, &mut out);
    }
    if let Some(raw) = present(req.stop) {
        validate_stop(raw)?;
        copy("stop", raw, &mut out);
    }
    if let Some(raw) = present(req.seed) {
        integer_field(raw, "seed")?;
        copy("seed", raw, &mut out);
    }
    if let Some(raw) = present(req.frequency_penalty) {
        number_in(raw, "frequency_penalty", -2.0, 2.0)?;
        copy("frequency_penalty", raw, &mut out);
    }
    if let Some(raw) = present(req.presence_penalty) {
        number_in(raw, "presence_penalty", -2.0, 2.0)?;
        copy("presence_penalty", raw, &mut out);
    }
    if let Some(raw) = present(req.logit_bias) {
        validate_logit_bias(raw)?;
        copy("logit_bias", raw, &mut out);
    }
    let logprobs = match present(req.logprobs) {
        Some(raw) => {
            let v = bool_field(raw, "logprobs")?.unwrap_or(false);
            copy("logprobs", raw, &mut out);
            v
        }
        None => false,
    };
    if let Some(raw) = present(req.top_logprobs) {
        let n = integer_field(raw, "top_logprobs")?;
        if !(0..=20).contains(&n) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` must be an integer between 0 and 20",
            ));
        }
        if !logprobs {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` requires `logprobs: true`",
            ));
        }
        copy("top_logprobs", raw, &mut out);
    }
    if let Some(raw) = present(req.response_format) {
        validate_response_format(raw)?;
        copy("response_format", raw, &mut out);
    }
    let mut tool_names = HashSet::new();
    if let Some(raw) = present(req.tools) {
        let start = out.len();
        write_tools(raw, &mut tool_names, &mut out)?;
        prompt_bytes += out.len() - start;
    }
    if let Some(raw) = present(req.tool_choice) {
        validate_tool_choice(raw, &tool_names)?;
        copy("tool_choice", raw, &mut out);
    }
    if let Some(raw) = present(req.parallel_tool_calls) {
        bool_field(raw, "parallel_tool_calls")?;
        copy("parallel_tool_calls", raw, &mut out);
    }
    if let Some(raw) = present(req.user) {
        str_field(raw, "user")?;
        copy("user", raw, &mut out);
    }
    if let Some(raw) = present(req.reasoning) {
        write_reasoning(raw, model, &mut out)?;
    }

    upstream_body::close(&mut out, model, Endpoint::ChatCompletions { stream }, false);

    Ok(UpstreamRequest {
        model: model.id,
        client_model: model_name.into_owned(),
        stream,
        client_wants_usage,
        max_tokens,
        body: out,
        prompt_bytes,
        prompt_range,
        tool_name_map: Vec::new(),
    })
}

/// Parses the body's top level, turning serde's errors into client messages.
fn parse_body<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid_body(
            "the request body is empty; send a JSON object",
        ));
    }
    // serde's derived structs also accept an array of fields by position; only objects are
    // requests.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::invalid_body(
            "the request body must be a JSON object",
        ));
    }
    serde_json::from_slice(body).map_err(|e| {
        let msg = if e.is_syntax() || e.is_eof() {
            format!("the request body is not valid JSON: {e}")
        } else if e.to_string().contains("recursion limit") {
            "the request body is nested too deeply".to_owned()
        } else {
            format!("the request body must be a JSON object: {e}")
        };
        ApiError::invalid_body(msg)
    })
}

pub(super) fn present(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| r.get() != "null")
}
