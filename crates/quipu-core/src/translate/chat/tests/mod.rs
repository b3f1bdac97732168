//! The chat format's tests, by topic: [`request_fields`] (the top level of a request),
//! [`request_messages`] (its `messages`), [`response`] (non-streaming answers), [`stream`]
//! (streams). The helpers below are shared. The recorded upstream streams of
//! `tests/fixtures/streams/` are replayed through the chat translator, split at every offset,
//! by `tests/conformance.rs` (formats `chat` and `chat-usage`).

use super::request::chat_to_upstream;
use super::response::{upstream_to_chat, ChatStream};
use crate::config::{Config, ImageUrlPolicy, ReasoningField, EMBEDDED_DEFAULT};
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::money::Pen;
use crate::testing::replay;
use crate::translate::{ResponseContext, StreamEnd, StreamTranslator, UpstreamRequest};
use crate::usage::Usage;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

mod request_fields;
mod request_messages;
mod response;
mod stream;

fn config() -> Config {
    Config::parse(EMBEDDED_DEFAULT, "test").unwrap()
}

/// Translates `v` with the shipped configuration; the upstream body parsed back.
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

// Responses and streams.

fn ctx() -> ResponseContext {
    ResponseContext {
        request_id: "req_1".into(),
        client_model: "aguila".into(),
        slug: "aguila".into(),
        upstream_model: "Qwen/Qwen3-32B".into(),
        tool_name_map: Vec::new(),
        charging: crate::testing::charging(),
    }
}

const STREAM: &str = concat!(
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"Qwen/Qwen3-32B\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":0,\"total_tokens\":12}}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"Qwen/Qwen3-32B\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"think\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1,\"total_tokens\":13}}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"Qwen/Qwen3-32B\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hola ñandú 🦙\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"total_tokens\":14}}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"Qwen/Qwen3-32B\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\",\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"Qwen/Qwen3-32B\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
    "data: [DONE]\n\n",
);

fn run(
    chunks: &[&[u8]],
    wants_usage: bool,
    field: ReasoningField,
) -> (Vec<Value>, bool, ChatStream) {
    let mut t = ChatStream::new(ctx(), wants_usage, field);
    let text = String::from_utf8(replay(&mut t, chunks).out).unwrap();
    let mut frames = Vec::new();
    let mut done = false;
    for f in text.split("\n\n").filter(|f| !f.is_empty()) {
        let data = f.strip_prefix("data: ").unwrap();
        if data == "[DONE]" {
            done = true;
        } else {
            frames.push(serde_json::from_str(data).unwrap());
        }
    }
    (frames, done, t)
}
