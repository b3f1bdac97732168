//! What the format folders' unit tests share: the embedded config, a field error's `param`,
//! upstream completions and SSE bodies, reading an `event: …` stream back, and the recorded
//! upstream streams of `tests/fixtures/streams/` (`fixture!`).

use crate::config::Config;
use crate::error::{ApiError, ErrorKind};
use serde_json::{json, Value};
use std::sync::OnceLock;

/// The embedded configuration (`conf/quipu.toml`'s defaults), parsed once.
pub(crate) fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| Config::parse(crate::config::EMBEDDED_DEFAULT, "embedded").unwrap())
}

/// The field a 400 names.
pub(crate) fn param(e: &ApiError) -> &str {
    match &e.kind {
        ErrorKind::InvalidRequest { param: Some(p) } => p,
        other => panic!("not a field error: {other:?} {}", e.message),
    }
}

/// An upstream completion answering `message`.
pub(crate) fn completion(message: Value, finish: &str, usage: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "Qwen/Qwen3-VL-32B-Instruct",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
        "usage": usage})
}

/// `data: …\n\n` for each chunk, then `data: [DONE]`.
pub(crate) fn sse(chunks: &[Value]) -> String {
    let mut s = String::new();
    for c in chunks {
        s.push_str(&format!("data: {c}\n\n"));
    }
    s.push_str("data: [DONE]\n\n");
    s
}

/// The frames of an `event: <name>\ndata: <json>` stream: (name, data).
pub(crate) fn events(bytes: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(bytes).unwrap();
    text.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (ev, data) = f.split_once('\n').unwrap();
            (
                ev.strip_prefix("event: ").unwrap().to_owned(),
                serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
            )
        })
        .collect()
}

/// The event names of such a stream.
pub(crate) fn names(bytes: &[u8]) -> Vec<String> {
    events(bytes).into_iter().map(|(n, _)| n).collect()
}

/// A recorded upstream stream, by name.
macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/streams/",
            $name,
            ".sse"
        ))
    };
}
pub(crate) use fixture;
