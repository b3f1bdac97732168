//! Tests of the Responses API translators, one file per topic: [`request`] (fields, input
//! items, tools, the stored conversation), [`codex`] (what the Codex CLI really sends),
//! [`response`] (non-streaming), [`stream`] (events, the recorded upstream streams, equality
//! with the non-streaming answer), [`stored`] (stored items and their listing). The helpers
//! below are shared; `fixture!` names a recorded upstream stream of `tests/fixtures/streams/`
//! (the harness that replays every one at every split, for every format, is
//! `tests/conformance.rs`).

use super::*;
use crate::error::{ApiError, ErrorKind};
use crate::testing::{replay, Replay};
use crate::translate::test_support::{completion, config, events, fixture, names, param, sse};
use crate::translate::{ResponseContext, StreamEnd, StreamTranslator};
use crate::usage::Usage;
use serde_json::{json, Value};

fn base(input: Value) -> Value {
    json!({"model": "aguila", "input": input})
}

fn translate(v: &Value) -> ResponsesTurn {
    responses_to_upstream_body(v.to_string().as_bytes(), config(), "abc")
        .unwrap_or_else(|e| panic!("{e}\nrequest: {v}"))
}

fn upstream(v: &Value) -> Value {
    serde_json::from_slice(&translate(v).upstream.body).unwrap()
}

fn msgs(v: &Value) -> Vec<Value> {
    upstream(v)["messages"].as_array().unwrap().clone()
}

fn reject(v: &Value) -> ApiError {
    match responses_to_upstream_body(v.to_string().as_bytes(), config(), "abc") {
        Ok(r) => panic!(
            "expected an error, got {}",
            String::from_utf8_lossy(&r.upstream.body)
        ),
        Err(e) => e,
    }
}

const UPSTREAM_MODEL: &str = "Qwen/Qwen3-VL-32B-Instruct";

/// The context a translated request gives its response translators.
fn ctx_of(turn: &ResponsesTurn) -> ResponsesContext {
    ResponsesContext {
        base: ResponseContext {
            request_id: "req_0123abcd".into(),
            client_model: turn.upstream.client_model.clone(),
            slug: "aguila".into(),
            upstream_model: UPSTREAM_MODEL.into(),
            tool_name_map: Vec::new(),
            charging: crate::testing::charging(),
        },
        created_at: 1_764_000_000,
        echo: turn.echo.clone(),
        tools: turn.tools.clone(),
        encrypted_reasoning: turn.encrypted_reasoning,
        keep_object: turn.store,
    }
}

/// A plain request's context (tools `get_weather` and the namespaced `ns.lookup`).
fn ctx() -> ResponsesContext {
    ctx_of(&translate(&json!({
        "model": "aguila", "input": "hola",
        "tools": [
            {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "ns", "description": "N", "tools": [
                {"type": "function", "name": "lookup", "parameters": {"type": "object"}}]}
        ]
    })))
}

fn nonstream_with(body: &Value, ctx: &ResponsesContext) -> Result<(Value, Usage), ApiError> {
    upstream_to_responses(body.to_string().as_bytes(), ctx)
        .map(|(b, u)| (serde_json::from_slice(&b).unwrap(), u))
}

fn nonstream(body: &Value) -> Result<(Value, Usage), ApiError> {
    nonstream_with(body, &ctx())
}

fn stream_with(input: &str, ctx: ResponsesContext) -> Replay {
    replay(&mut ResponsesStream::new(ctx), &[input.as_bytes()])
}

fn stream(input: &str) -> Replay {
    stream_with(input, ctx())
}

fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": UPSTREAM_MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn usage_chunk(prompt: u64, completion: u64, cached: u64) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": UPSTREAM_MODEL, "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}}})
}

// The topics come last: `fixture!` above must be defined before them.
mod codex;
mod request;
mod response;
mod stored;
mod stream;
