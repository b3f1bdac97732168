//! A conformance checklist of the messages format, one named test per item that pure
//! translation code can check (`cNN_…`), then the request rules of docs/design.md and
//! robustness properties. Stream cases replay the recorded upstream streams of
//! `tests/fixtures/streams/` (the harness that replays each one split at every offset, in every
//! client format, is `tests/conformance.rs`).
//!
//! The items are numbered by topic: 1–17 requests (`system`, content blocks, tools, thinking,
//! headers, required fields, body size), 18–25 non-streaming responses, 26–33 stream framing
//! and order, 34–48 upstream stream edge cases, 49–56 errors, 57–60 Claude Code. The missing
//! numbers are the proxy's job, not the translator's: 15 (both auth headers, 401 without a
//! key), 17 (413 on body size), 55 (a client disconnect cancels the upstream request), 56
//! (`retry-after` on 429/529), 58 (`/v1/models` in both SDK shapes), 60 (Claude Code's
//! `/context` figure). Item 14's header and query parts (`anthropic-beta`, `?beta=true`) are
//! the proxy's too; its body-level counterpart — newer fields accepted, never a 400 — is c14.
//!
//! One file per topic: [`request_fields`], [`content_blocks`], [`tools`], [`thinking`]
//! (requests), [`response`] (non-streaming), [`stream_events`], [`errors`], [`claude_code`],
//! [`robustness`]. The helpers below are shared; `fixture!` names a recorded upstream stream.

use super::*;
use crate::config::{Config, ImageUrlPolicy};
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::sse::SseDecoder;
use crate::testing::{replay, Replay};
use crate::translate::common::tool_names::shorten_tool_name;
use crate::translate::test_support::{completion, config, events, fixture, names, param, sse};
use crate::translate::upstream_error::{map_upstream_error, UpstreamFailure};
use crate::translate::{
    feed_stream, finish_stream, malformed_stream, ResponseContext, StreamEnd, StreamTranslator,
    UpstreamRequest, MAX_OUTPUT_TOKENS,
};
use crate::usage::Usage;
use serde_json::{json, Value};

fn config_rejecting_urls() -> Config {
    let mut c = Config::parse(crate::config::EMBEDDED_DEFAULT, "embedded").unwrap();
    c.security.image_urls = ImageUrlPolicy::Reject;
    c
}

fn base(messages: Value) -> Value {
    json!({"model": "aguila", "max_tokens": 1024, "messages": messages})
}

fn translate(v: &Value) -> UpstreamRequest {
    messages_to_upstream(v.to_string().as_bytes(), config())
        .unwrap_or_else(|e| panic!("{e}\nrequest: {v}"))
}

fn upstream(v: &Value) -> Value {
    let r = translate(v);
    serde_json::from_slice(&r.body).unwrap()
}

fn msgs(v: &Value) -> Vec<Value> {
    upstream(v)["messages"].as_array().unwrap().clone()
}

fn reject(v: &Value) -> ApiError {
    match messages_to_upstream(v.to_string().as_bytes(), config()) {
        Ok(r) => panic!(
            "expected an error, got {}",
            String::from_utf8_lossy(&r.body)
        ),
        Err(e) => e,
    }
}

const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

fn image(media: &str) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": media, "data": PNG}})
}

fn ctx() -> ResponseContext {
    ResponseContext {
        request_id: "req_1".into(),
        client_model: "claude-sonnet-4-5".into(),
        slug: "aguila".into(),
        upstream_model: "Qwen/Qwen3-VL-32B-Instruct".into(),
        tool_name_map: Vec::new(),
        charging: crate::testing::charging(),
    }
}

fn nonstream(body: &Value) -> Result<(Value, Usage), ApiError> {
    upstream_to_message(body.to_string().as_bytes(), &ctx())
        .map(|(b, u)| (serde_json::from_slice(&b).unwrap(), u))
}

/// The upstream bytes, cut into these reads, through a fresh messages stream translator.
fn stream_chunks(chunks: &[&[u8]]) -> Replay {
    replay(&mut MessagesStream::new(ctx()), chunks)
}

fn stream(input: &str) -> Replay {
    stream_chunks(&[input.as_bytes()])
}

fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn usage_chunk(prompt: u64, completion: u64, cached: u64) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}}})
}

fn claude_code_request(header: &str, first_prompt: &str) -> Value {
    json!({
        "model": "claude-opus-5-5",
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nAttribution…"},
                {"type": "text", "text": first_prompt}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment\nYou have been invoked…", "cache_control": {"type": "ephemeral"}}],
             "output_config": {"effort": "medium"}}
        ],
        "system": [
            {"type": "text", "text": header},
            {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "\nYou are an agent working with the user…", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": [
            {"name": "Bash", "description": "Executes a bash command.", "input_schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                "properties": {"command": {"description": "The command to execute", "type": "string"}},
                "required": ["command"], "additionalProperties": false}},
            {"name": "DeferredToolPlaceholder", "description": "Reserved placeholder.",
             "input_schema": {"type": "object", "properties": {}}, "defer_loading": true}
        ],
        "metadata": {"user_id": "{\"device_id\":\"ab12\",\"account_uuid\":\"\",\"session_id\":\"bbda0e11\"}"},
        "max_tokens": 128000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "safeguards": [{"type": "dangerous_tool_use", "classifier_context": {"permission_mode": "auto"}}],
        "stream": true
    })
}

fn with_tool_use(result: Value) -> Value {
    base(json!([
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [result]}
    ]))
}

fn with_tools(tool_choice: Value) -> Value {
    let mut v = base(json!([{"role": "user", "content": "hi"}]));
    v["tools"] = json!([
        {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
        {"name": "get_time", "input_schema": {"type": "object"}}
    ]);
    v["tool_choice"] = tool_choice;
    v
}

// The topics come last: `fixture!` above must be defined before them.
mod claude_code;
mod content_blocks;
mod errors;
mod request_fields;
mod response;
mod robustness;
mod stream_events;
mod thinking;
mod tools;
