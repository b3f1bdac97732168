//! Chat-format requests → the upstream request.
//!
//! Validates every field the spec lists (type, range, shape), applies the rules of DESIGN.md
//! (`max_tokens` default and clamp at 8192, `max_completion_tokens` alias, `temperature` 0.6,
//! `developer` role as `system`, unlisted fields dropped, usage always requested upstream) and
//! writes the upstream JSON directly. Client values that pass validation are copied as the
//! client wrote them (their raw JSON text), so nothing is re-encoded on the way.
//!
//! A prompt needs at least one user or assistant message (system messages alone are a 400, as
//! is a `content` that is an empty array of parts).
//!
//! Each message is rebuilt from its known fields (`role`, `content`, `name`, `tool_calls`,
//! `tool_call_id`, and reasoning history) so that per-message extras do not leak upstream.

use super::super::image_url::{check_image_url, ImageUrlRejection};
use super::super::{UpstreamRequest, DEFAULT_TEMPERATURE, MAX_OUTPUT_TOKENS};
use crate::config::{Config, Model};
use crate::error::{write_json_str, ApiError, ErrorKind};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

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
struct MessageIn<'a> {
    #[serde(borrow, default)]
    role: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_call_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct PartIn<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    image_url: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ImageUrlIn<'a> {
    #[serde(borrow)]
    url: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ToolCallIn<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow, rename = "type", default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: FunctionCallIn<'a>,
}

#[derive(Deserialize)]
struct FunctionCallIn<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    /// Only checked to be a string: arguments are the model's JSON, passed on as written.
    #[serde(borrow, rename = "arguments")]
    _arguments: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ToolIn<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    function: Option<FunctionDefIn<'a>>,
}

#[derive(Deserialize)]
struct FunctionDefIn<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    description: Option<&'a RawValue>,
    #[serde(borrow, default)]
    parameters: Option<&'a RawValue>,
    #[serde(borrow, default)]
    strict: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ReasoningIn<'a> {
    #[serde(borrow, default)]
    effort: Option<Cow<'a, str>>,
    #[serde(default)]
    enabled: Option<bool>,
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
    let model = config.resolve_model(&model_name).ok_or_else(|| {
        ApiError::new(
            ErrorKind::ModelNotFound,
            format!(
                "model `{model_name}` does not exist; valid models are {}",
                config.slug_list()
            ),
        )
    })?;

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
    out.extend_from_slice(b"{\"model\":");
    write_json_str(&mut out, &model.upstream_model);
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

    out.extend_from_slice(b",\"stream\":");
    out.extend_from_slice(if stream { b"true" } else { b"false" });
    if stream {
        out.extend_from_slice(b",\"stream_options\":{\"include_usage\":true");
        if model.continuous_usage {
            out.extend_from_slice(b",\"continuous_usage_stats\":true");
        }
        out.push(b'}');
    }
    out.push(b'}');

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

fn present(raw: Option<&RawValue>) -> Option<&RawValue> {
    raw.filter(|r| r.get() != "null")
}

/// `parent[index]`: a parameter path, formatted only when an error names it (the hot path
/// validates every message and part, and must not build strings for paths nobody reads).
struct Index<'a>(&'a dyn fmt::Display, usize);

impl fmt::Display for Index<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// `parent.field`, formatted lazily like [`Index`].
struct Dot<'a>(&'a dyn fmt::Display, &'a str);

impl fmt::Display for Dot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

fn str_field<'a>(raw: &'a RawValue, param: impl fmt::Display) -> Result<Cow<'a, str>, ApiError> {
    serde_json::from_str::<Cow<'a, str>>(raw.get())
        .map_err(|_| ApiError::invalid(param.to_string(), format!("`{param}` must be a string")))
}

fn bool_field(raw: &RawValue, param: &str) -> Result<Option<bool>, ApiError> {
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

fn number_in(raw: &RawValue, param: &str, min: f64, max: f64) -> Result<f64, ApiError> {
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

fn integer_field(raw: &RawValue, param: &str) -> Result<i64, ApiError> {
    let v: serde_json::Number = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::invalid(param, format!("`{param}` must be an integer")))?;
    v.as_i64()
        .ok_or_else(|| ApiError::invalid(param, format!("`{param}` must be an integer")))
}

/// `max_tokens`: an integer ≥ 1; anything larger than the maximum is clamped to it.
fn max_tokens_field(raw: &RawValue, param: &str) -> Result<u32, ApiError> {
    let v: serde_json::Number = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::invalid(param, format!("`{param}` must be an integer")))?;
    let n = match (v.as_u64(), v.as_i64(), v.as_f64()) {
        (Some(n), _, _) => n,
        (None, Some(_), _) => 0, // negative
        (None, None, Some(f)) if f.is_finite() && f.fract() == 0.0 && f >= 1.0 => u64::MAX,
        _ => {
            return Err(ApiError::invalid(
                param,
                format!("`{param}` must be an integer"),
            ))
        }
    };
    if n == 0 {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be at least 1"),
        ));
    }
    Ok(n.min(u64::from(MAX_OUTPUT_TOKENS)) as u32)
}

fn validate_stop(raw: &RawValue) -> Result<(), ApiError> {
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

fn validate_logit_bias(raw: &RawValue) -> Result<(), ApiError> {
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

fn validate_response_format(raw: &RawValue) -> Result<(), ApiError> {
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

fn is_function_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// Writes `,"tools":[…]` keeping only the function fields the upstream uses.
fn write_tools<'a>(
    raw: &'a RawValue,
    names: &mut HashSet<Cow<'a, str>>,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let tools: Vec<ToolIn> = serde_json::from_str(raw.get()).map_err(|e| {
        ApiError::invalid(
            "tools",
            format!(
                "`tools` must be an array of {{\"type\":\"function\",\"function\":{{…}}}}: {e}"
            ),
        )
    })?;
    out.extend_from_slice(b",\"tools\":[");
    for (i, tool) in tools.into_iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!("only function tools are supported, got \"{}\"", tool.kind),
            ));
        }
        let f = tool.function.ok_or_else(|| {
            ApiError::invalid(
                format!("tools[{i}].function"),
                "a function tool needs `function`",
            )
        })?;
        if !is_function_name(&f.name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                "function names must be 1-64 letters, digits, '_', '-' or '.'",
            ));
        }
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"type\":\"function\",\"function\":{\"name\":");
        write_json_str(out, &f.name);
        if let Some(d) = present(f.description) {
            str_field(d, format!("tools[{i}].function.description"))?;
            out.extend_from_slice(b",\"description\":");
            out.extend_from_slice(d.get().as_bytes());
        }
        if let Some(p) = present(f.parameters) {
            if !p.get().starts_with('{') {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.parameters"),
                    "`parameters` must be a JSON Schema object",
                ));
            }
            out.extend_from_slice(b",\"parameters\":");
            out.extend_from_slice(p.get().as_bytes());
        }
        if let Some(s) = present(f.strict) {
            bool_field(s, &format!("tools[{i}].function.strict"))?;
            out.extend_from_slice(b",\"strict\":");
            out.extend_from_slice(s.get().as_bytes());
        }
        out.extend_from_slice(b"}}");
        names.insert(f.name);
    }
    out.push(b']');
    Ok(())
}

fn validate_tool_choice(raw: &RawValue, tools: &HashSet<Cow<'_, str>>) -> Result<(), ApiError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Choice<'a> {
        Mode(#[serde(borrow)] Cow<'a, str>),
        Named {
            #[serde(borrow, rename = "type")]
            kind: Cow<'a, str>,
            #[serde(borrow)]
            function: NamedFn<'a>,
        },
    }
    #[derive(Deserialize)]
    struct NamedFn<'a> {
        #[serde(borrow)]
        name: Cow<'a, str>,
    }
    let bad = || {
        ApiError::invalid(
            "tool_choice",
            "`tool_choice` must be \"none\", \"auto\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":…}}",
        )
    };
    match serde_json::from_str::<Choice>(raw.get()).map_err(|_| bad())? {
        Choice::Mode(m) => match m.as_ref() {
            "none" | "auto" => Ok(()),
            "required" if tools.is_empty() => Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` \"required\" needs `tools`",
            )),
            "required" => Ok(()),
            _ => Err(bad()),
        },
        Choice::Named { kind, function } => {
            if kind != "function" {
                return Err(bad());
            }
            if !tools.contains(&function.name) {
                return Err(ApiError::invalid(
                    "tool_choice.function.name",
                    format!(
                        "`tool_choice` names `{}`, which is not in `tools`",
                        function.name
                    ),
                ));
            }
            Ok(())
        }
    }
}

fn write_reasoning(raw: &RawValue, model: &Model, out: &mut Vec<u8>) -> Result<(), ApiError> {
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
    let switch = match on {
        Some(true) => model.thinking_on.as_ref(),
        Some(false) => model.thinking_off.as_ref(),
        None => None,
    };
    if let Some(map) = switch {
        for (k, v) in map {
            out.push(b',');
            write_json_str(out, k);
            out.push(b':');
            serde_json::to_writer(&mut *out, v)
                .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
        }
    }
    if let Some(e @ ("low" | "medium" | "high")) = effort {
        out.extend_from_slice(b",\"reasoning_effort\":");
        write_json_str(out, e);
    }
    Ok(())
}

/// Validates `messages` and writes the upstream array.
fn write_messages(
    raw: &RawValue,
    model: &Model,
    config: &Config,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let messages: Vec<&RawValue> = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::invalid("messages", "`messages` must be an array of messages"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
    // Tool call ids announced by assistant messages and not yet answered.
    let mut open_calls: HashSet<String> = HashSet::new();
    // User and assistant messages: system messages alone are no conversation (chat templates
    // raise on them, e.g. Qwen3's "No user query found in messages").
    let mut turns = 0usize;
    out.push(b'[');
    for (i, m) in messages.into_iter().enumerate() {
        let at = Index(&"messages", i);
        let p = |f| Dot(&at, f);
        let msg: MessageIn = serde_json::from_str(m.get())
            .map_err(|_| ApiError::invalid(at.to_string(), "each message must be an object"))?;
        let role_raw = msg.role.ok_or_else(|| {
            ApiError::invalid(p("role").to_string(), "every message needs a `role`")
        })?;
        let role = str_field(role_raw, p("role"))?;
        let role: &str = match role.as_ref() {
            "system" | "developer" => "system",
            "user" => {
                turns += 1;
                "user"
            }
            "assistant" => {
                turns += 1;
                "assistant"
            }
            "tool" => "tool",
            other => {
                return Err(ApiError::invalid(
                    p("role").to_string(),
                    format!("unknown role \"{other}\"; roles are system, user, assistant and tool"),
                ))
            }
        };
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"role\":\"");
        out.extend_from_slice(role.as_bytes());
        out.push(b'"');

        let content = present(msg.content);
        let tool_calls = present(msg.tool_calls);
        match (role, content) {
            ("assistant", None) if tool_calls.is_none() => {
                return Err(ApiError::invalid(
                    p("content").to_string(),
                    "an assistant message needs `content` or `tool_calls`",
                ))
            }
            ("assistant", None) => out.extend_from_slice(b",\"content\":null"),
            (_, None) => {
                return Err(ApiError::invalid(
                    p("content").to_string(),
                    format!("a {role} message needs `content`"),
                ))
            }
            (_, Some(c)) => {
                out.extend_from_slice(b",\"content\":");
                validate_content(c, role, model, config, &p("content"))?;
                out.extend_from_slice(c.get().as_bytes());
            }
        }
        if let Some(n) = present(msg.name) {
            str_field(n, p("name"))?;
            out.extend_from_slice(b",\"name\":");
            out.extend_from_slice(n.get().as_bytes());
        }
        if role != "tool" {
            // A new turn: calls left unanswered are no longer answerable.
            if role != "assistant" || tool_calls.is_some() {
                open_calls.clear();
            }
        }
        if let Some(tc) = tool_calls {
            if role != "assistant" {
                return Err(ApiError::invalid(
                    p("tool_calls").to_string(),
                    "only assistant messages carry `tool_calls`",
                ));
            }
            let calls: Vec<ToolCallIn> = serde_json::from_str(tc.get()).map_err(|_| {
                ApiError::invalid(
                    p("tool_calls").to_string(),
                    "`tool_calls` must be an array of {\"id\",\"type\":\"function\",\"function\":{\"name\",\"arguments\"}}",
                )
            })?;
            for (j, c) in calls.iter().enumerate() {
                if c.kind.as_deref().is_some_and(|k| k != "function") {
                    return Err(ApiError::invalid(
                        p(&format!("tool_calls[{j}].type")).to_string(),
                        "tool calls must be of type \"function\"",
                    ));
                }
                if c.id.is_empty() || c.function.name.is_empty() {
                    return Err(ApiError::invalid(
                        p(&format!("tool_calls[{j}]")).to_string(),
                        "a tool call needs a non-empty `id` and `function.name`",
                    ));
                }
                open_calls.insert(c.id.to_string());
            }
            out.extend_from_slice(b",\"tool_calls\":");
            out.extend_from_slice(tc.get().as_bytes());
        }
        if role == "tool" {
            let id_raw = present(msg.tool_call_id).ok_or_else(|| {
                ApiError::invalid(
                    p("tool_call_id").to_string(),
                    "a tool message needs `tool_call_id`",
                )
            })?;
            let id = str_field(id_raw, p("tool_call_id"))?;
            if !open_calls.contains(id.as_ref()) {
                return Err(ApiError::invalid(
                    p("tool_call_id").to_string(),
                    format!(
                        "tool message answers \"{id}\", but no preceding assistant message has a tool call with that id"
                    ),
                ));
            }
            out.extend_from_slice(b",\"tool_call_id\":");
            out.extend_from_slice(id_raw.get().as_bytes());
        }
        if role == "assistant" {
            for (name, r) in [
                ("reasoning", msg.reasoning),
                ("reasoning_content", msg.reasoning_content),
            ] {
                if let Some(r) = present(r) {
                    str_field(r, p(name))?;
                    out.extend_from_slice(b",\"");
                    out.extend_from_slice(name.as_bytes());
                    out.extend_from_slice(b"\":");
                    out.extend_from_slice(r.get().as_bytes());
                }
            }
        }
        out.push(b'}');
    }
    if turns == 0 {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must contain at least one user or assistant message; system messages alone are not a conversation",
        ));
    }
    out.push(b']');
    Ok(())
}

fn validate_content(
    raw: &RawValue,
    role: &str,
    model: &Model,
    config: &Config,
    param: &dyn fmt::Display,
) -> Result<(), ApiError> {
    let text = raw.get();
    if text.starts_with('"') {
        return str_field(raw, param).map(|_| ());
    }
    let parts: Vec<PartIn> = serde_json::from_str(text).map_err(|_| {
        ApiError::invalid(
            param.to_string(),
            "`content` must be a string or an array of content parts ({\"type\":\"text\",…} or {\"type\":\"image_url\",…})",
        )
    })?;
    if parts.is_empty() {
        return Err(ApiError::invalid(
            param.to_string(),
            "`content` must not be an empty array; send at least one content part",
        ));
    }
    for (j, part) in parts.iter().enumerate() {
        let pp = Index(param, j);
        match part.kind.as_ref() {
            "text" => {
                let t = part.text.ok_or_else(|| {
                    ApiError::invalid(format!("{pp}.text"), "a text part needs `text`")
                })?;
                str_field(t, Dot(&pp, "text"))?;
            }
            "image_url" => {
                if role != "user" {
                    return Err(ApiError::invalid(
                        pp.to_string(),
                        format!("{role} messages may only contain text parts"),
                    ));
                }
                if !model.vision {
                    return Err(ApiError::invalid(
                        pp.to_string(),
                        format!("model `{}` does not accept images", model.slug),
                    ));
                }
                let img: ImageUrlIn = part
                    .image_url
                    .and_then(|r| serde_json::from_str(r.get()).ok())
                    .ok_or_else(|| {
                        ApiError::invalid(
                            format!("{pp}.image_url"),
                            "an image part needs `image_url: {\"url\": …}`",
                        )
                    })?;
                validate_image_url(&img.url, config, &format!("{pp}.image_url.url"))?;
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{pp}.type"),
                    format!("unsupported content part type \"{other}\"; use text or image_url"),
                ))
            }
        }
    }
    Ok(())
}

/// Accepts `data:image/<png|jpeg|gif|webp>;base64,<base64>` and, unless the operator rejects
/// URLs, http(s) URLs that [`check_image_url`] lets through (fetched by the upstream, never by
/// the gateway; internal hosts are refused).
pub fn validate_image_url(url: &str, config: &Config, param: &str) -> Result<(), ApiError> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (meta, data) = rest
            .split_once(',')
            .ok_or_else(|| ApiError::invalid(param, "a data URL needs a `,` before its data"))?;
        let media = meta.strip_suffix(";base64").ok_or_else(|| {
            ApiError::invalid(
                param,
                "image data URLs must be base64 (`data:image/png;base64,…`)",
            )
        })?;
        if !matches!(
            media,
            "image/png" | "image/jpeg" | "image/gif" | "image/webp"
        ) {
            return Err(ApiError::invalid(
                param,
                format!("unsupported image type \"{media}\"; use image/png, image/jpeg, image/gif or image/webp"),
            ));
        }
        if !is_base64(data.as_bytes()) {
            return Err(ApiError::invalid(
                param,
                "the image data is not valid base64",
            ));
        }
        return Ok(());
    }
    match check_image_url(url, config.security.image_urls) {
        Ok(()) => Ok(()),
        Err(ImageUrlRejection::NotAccepted) => Err(ApiError::invalid(
            param,
            "images must be sent inline as base64 data URLs",
        )),
        Err(e) => Err(ApiError::invalid(param, e.message())),
    }
}

/// Standard base64 with padding (as data URLs carry it): alphabet, length and padding checked.
pub fn is_base64(data: &[u8]) -> bool {
    if data.is_empty() || data.len() % 4 != 0 {
        return false;
    }
    let pad = data.iter().rev().take_while(|&&b| b == b'=').count();
    if pad > 2 {
        return false;
    }
    data[..data.len() - pad]
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ImageUrlPolicy, EMBEDDED_DEFAULT};
    use serde_json::{json, Value};

    fn config() -> Config {
        Config::parse(EMBEDDED_DEFAULT, "test").unwrap()
    }

    fn translate(v: Value) -> Result<(UpstreamRequest, Value), ApiError> {
        let c = config();
        let body = serde_json::to_vec(&v).unwrap();
        let r = chat_to_upstream(&body, &c)?;
        let up: Value = serde_json::from_slice(&r.body).unwrap();
        Ok((r, up))
    }

    fn err(v: Value) -> ApiError {
        translate(v).unwrap_err()
    }

    fn hello(model: &str) -> Value {
        json!({"model": model, "messages": [{"role": "user", "content": "hola"}]})
    }

    #[test]
    fn defaults_and_model_rewrite() {
        let (r, up) = translate(hello("colibri")).unwrap();
        assert_eq!(up["model"], "Qwen/Qwen3-4B");
        assert_eq!(up["max_tokens"], 8192);
        assert_eq!(up["temperature"], 0.6);
        assert_eq!(up["stream"], false);
        assert!(up.get("stream_options").is_none());
        assert_eq!(r.max_tokens, 8192);
        assert_eq!(r.client_model, "colibri");
        assert!(!r.stream);
        let messages = &r.body[r.prompt_range.clone()];
        assert_eq!(
            serde_json::from_slice::<Value>(messages).unwrap(),
            json!([{"role":"user","content":"hola"}])
        );
    }

    #[test]
    fn streams_always_ask_for_usage() {
        let mut v = hello("aguila");
        v["stream"] = json!(true);
        let (r, up) = translate(v.clone()).unwrap();
        assert_eq!(
            up["stream_options"],
            json!({"include_usage": true, "continuous_usage_stats": true})
        );
        assert!(!r.client_wants_usage);
        v["stream_options"] = json!({"include_usage": true});
        let (r, _) = translate(v).unwrap();
        assert!(r.client_wants_usage);
    }

    #[test]
    fn max_tokens_rules() {
        let mut v = hello("apu");
        v["max_tokens"] = json!(32000);
        assert_eq!(translate(v.clone()).unwrap().1["max_tokens"], 8192);
        v["max_tokens"] = json!(100);
        assert_eq!(translate(v.clone()).unwrap().1["max_tokens"], 100);
        v["max_completion_tokens"] = json!(50);
        assert_eq!(translate(v.clone()).unwrap().1["max_tokens"], 50);
        v["max_tokens"] = json!(-1);
        v["max_completion_tokens"] = Value::Null;
        assert_eq!(
            err(v.clone()).kind,
            ErrorKind::InvalidRequest {
                param: Some("max_tokens".into())
            }
        );
        v["max_tokens"] = json!(0);
        assert!(err(v.clone()).message.contains("at least 1"));
        v["max_tokens"] = json!(1.5);
        assert!(err(v.clone()).message.contains("integer"));
        v["max_tokens"] = json!("10");
        assert!(err(v.clone()).message.contains("integer"));
        v["max_tokens"] = json!(1e300);
        assert_eq!(translate(v).unwrap().1["max_tokens"], 8192);
    }

    #[test]
    fn listed_fields_forwarded_unlisted_dropped() {
        let v = json!({
            "model": "aguila",
            "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "temperature": 0.2, "top_p": 0.9, "stop": ["END"], "seed": 7,
            "frequency_penalty": 0.5, "presence_penalty": -0.5,
            "logit_bias": {"50256": -100}, "logprobs": true, "top_logprobs": 3,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}},
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}, "extra": 1}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": false, "user": "u-1",
            "n": 3, "metadata": {"a": 1}, "store": true, "service_tier": "auto"
        });
        let (_, up) = translate(v).unwrap();
        assert_eq!(up["messages"][0]["role"], "system");
        for k in [
            "temperature",
            "top_p",
            "stop",
            "seed",
            "frequency_penalty",
            "presence_penalty",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "response_format",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "user",
        ] {
            assert!(up.get(k).is_some(), "{k} missing");
        }
        for k in ["n", "metadata", "store", "service_tier"] {
            assert!(up.get(k).is_none(), "{k} leaked");
        }
        assert!(up["tools"][0].get("extra").is_none());
        assert_eq!(up["temperature"], 0.2);
    }

    #[test]
    fn validation_errors_name_the_field() {
        let cases = [
            (json!({"messages": []}), "model"),
            (json!({"model": "colibri"}), "messages"),
            (json!({"model": 5, "messages": []}), "model"),
            (json!({"model": "colibri", "messages": []}), "messages"),
            (json!({"model": "colibri", "messages": "hi"}), "messages"),
            (
                json!({"model": "colibri", "messages": [{"role": "robot", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "colibri", "messages": [{"content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "user"}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "user", "content": 5}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "temperature": 3}),
                "temperature",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
                "temperature",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
                "stream",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "stop": [1]}),
                "stop",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}),
                "top_logprobs",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}),
                "response_format.type",
            ),
            (
                json!({"model": "colibri", "messages": [{"role": "tool", "content": "x", "tool_call_id": "c1"}]}),
                "messages[0].tool_call_id",
            ),
        ];
        for (body, param) in cases {
            let e = err(body.clone());
            assert_eq!(
                e.kind,
                ErrorKind::InvalidRequest {
                    param: Some(param.into())
                },
                "{body} -> {e:?}"
            );
        }
    }

    #[test]
    fn a_prompt_needs_a_user_or_assistant_turn_and_parts() {
        for messages in [
            json!([{"role": "system", "content": "be brief"}]),
            json!([{"role": "developer", "content": ""}, {"role": "system", "content": [{"type": "text", "text": "x"}]}]),
        ] {
            let e = err(json!({"model": "colibri", "messages": messages}));
            assert_eq!(
                e.kind,
                ErrorKind::InvalidRequest {
                    param: Some("messages".into())
                },
                "{messages}"
            );
            assert!(e.message.contains("user or assistant"), "{}", e.message);
        }
        // An empty parts array is no content (the vendor rejects it too).
        let e = err(json!({"model": "colibri", "messages": [{"role": "user", "content": []}]}));
        assert_eq!(
            e.kind,
            ErrorKind::InvalidRequest {
                param: Some("messages[0].content".into())
            }
        );
        let (_, up) = translate(json!({"model": "colibri", "messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": ""}]}))
        .unwrap();
        assert_eq!(up["messages"][1], json!({"role": "user", "content": ""}));
    }

    #[test]
    fn unknown_model_lists_slugs() {
        let e = err(hello("gpt-9"));
        assert_eq!(e.kind, ErrorKind::ModelNotFound);
        assert_eq!(
            e.message,
            "model `gpt-9` does not exist; valid models are `colibri`, `aguila`, `apu`"
        );
    }

    #[test]
    fn images() {
        let img = |url: &str| {
            json!({"model": "colibri", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": url}}]}]})
        };
        let e = err(img("data:image/png;base64,iVBORw0KGgo="));
        assert!(e.message.contains("does not accept images"), "{e:?}");
        let mut v = img("data:image/png;base64,iVBORw0KGgo=");
        v["model"] = json!("aguila");
        assert!(translate(v.clone()).is_ok());
        v["messages"][0]["content"][1]["image_url"]["url"] =
            json!("data:image/png;base64,not base64!");
        assert!(err(v.clone()).message.contains("base64"));
        // Image URLs: public hosts only (the shared check in translate::image_url).
        for bad in [
            "http://169.254.169.254/latest",
            "http://2130706433/",
            "http://[::ffff:127.0.0.1]/",
            "https://metadata.google.internal/",
            "https://a@example.com/",
            "file:///etc/passwd",
        ] {
            v["messages"][0]["content"][1]["image_url"]["url"] = json!(bad);
            let e = err(v.clone());
            assert_eq!(
                e.kind,
                ErrorKind::InvalidRequest {
                    param: Some("messages[0].content[1].image_url.url".into())
                },
                "{bad}"
            );
        }
        v["messages"][0]["content"][1]["image_url"]["url"] = json!("https://example.com/cat.png");
        assert!(translate(v.clone()).is_ok());
        // forward_any passes internal hosts (the upstream restricts fetching); reject, none.
        let mut c = config();
        c.security.image_urls = ImageUrlPolicy::ForwardAny;
        v["messages"][0]["content"][1]["image_url"]["url"] = json!("http://10.0.0.5/a.png");
        assert!(chat_to_upstream(&serde_json::to_vec(&v).unwrap(), &c).is_ok());
        c.security.image_urls = ImageUrlPolicy::Reject;
        v["messages"][0]["content"][1]["image_url"]["url"] = json!("https://example.com/cat.png");
        let e = chat_to_upstream(&serde_json::to_vec(&v).unwrap(), &c).unwrap_err();
        assert!(e.message.contains("inline"), "{}", e.message);
    }

    #[test]
    fn tool_round_trip_history() {
        let v = json!({"model": "aguila", "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Lima\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
            {"role": "user", "content": "thanks"}
        ]});
        let (_, up) = translate(v).unwrap();
        assert_eq!(up["messages"][1]["tool_calls"][0]["id"], "call_1");
        assert_eq!(up["messages"][1]["content"], Value::Null);
        assert_eq!(up["messages"][2]["tool_call_id"], "call_1");
    }

    #[test]
    fn reasoning_switch() {
        let mut v = hello("colibri");
        v["reasoning"] = json!({"effort": "none"});
        let (_, up) = translate(v.clone()).unwrap();
        assert_eq!(up["chat_template_kwargs"]["enable_thinking"], false);
        v["reasoning"] = json!({"effort": "high"});
        let (_, up) = translate(v.clone()).unwrap();
        assert_eq!(up["chat_template_kwargs"]["enable_thinking"], true);
        assert_eq!(up["reasoning_effort"], "high");
        v["reasoning"] = json!({"effort": "extreme"});
        assert!(translate(v).is_err());
    }

    #[test]
    fn hostile_bodies_are_400() {
        let c = config();
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        for body in [
            &b""[..],
            b"{",
            b"[]",
            b"null",
            b"\xff\xfe",
            deep.as_bytes(),
            br#"{"model":"colibri","model":"apu","messages":[]}"#,
        ] {
            let e = chat_to_upstream(body, &c).unwrap_err();
            assert!(matches!(e.kind, ErrorKind::InvalidRequest { .. }), "{e:?}");
        }
    }

    #[test]
    fn base64_check() {
        assert!(is_base64(b"aGVsbG8="));
        assert!(is_base64(b"aGVsbG8h"));
        assert!(!is_base64(b"aGVsbG8"));
        assert!(!is_base64(b"aGVs bG8="));
        assert!(!is_base64(b"===="));
        assert!(!is_base64(b""));
    }
}
