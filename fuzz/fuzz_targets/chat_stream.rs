//! The chat-format stream translator fed generated upstream streams split at arbitrary offsets:
//! the output does not depend on the splits; every frame is `data: <JSON>` (no repeated keys)
//! or `data: [DONE]`; the upstream's model name never shows; usage reaches the client only
//! when asked; and, when the stream's content is clean, what a client accumulates from the
//! stream equals the non-streaming translation of the same answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::config::ReasoningField;
use quipu_core::sse::SseDecoder;
use quipu_core::translate::chat::{upstream_to_chat, ChatStream};
use quipu_core::translate::{feed_stream, finish_stream, ResponseContext, StreamEnd, StreamTranslator};
use quipu_core::usage::Usage;
use quipu_fuzz::{parse_strict, pieces, splits, upstream_stream, Cursor};
use serde_json::Value;

fn ctx() -> ResponseContext {
    ResponseContext {
        request_id: "req_f".into(),
        client_model: "aguila".into(),
        slug: "aguila".into(),
        upstream_model: "Qwen/Qwen3-Upstream".into(),
        tool_name_map: Vec::new(),
    }
}

fn run(parts: &[&[u8]], wants_usage: bool, field: ReasoningField) -> (Vec<u8>, Usage, StreamEnd) {
    let mut t = ChatStream::new(ctx(), wants_usage, field);
    let mut d = SseDecoder::default();
    let mut out = Vec::new();
    for p in parts {
        feed_stream(&mut d, &mut t, p, &mut out);
    }
    finish_stream(&mut d, &mut t, &mut out);
    (out, t.usage(), t.end())
}

/// What an OpenAI client rebuilds from the deltas: one message, the finish reason, the usage.
#[derive(Default)]
struct Accumulated {
    content: String,
    reasoning: String,
    reasoning_content: String,
    /// (id, name, arguments) by index.
    calls: Vec<(String, String, String)>,
    finish: Value,
    usage: Option<Value>,
}

fn append(to: &mut String, v: &Value) {
    if let Some(s) = v.as_str() {
        to.push_str(s);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let wants_usage = c.byte() % 2 == 0;
    let field = [ReasoningField::Both, ReasoningField::Reasoning, ReasoningField::ReasoningContent][c.below(3)];
    let g = upstream_stream(&mut c);
    let points = splits(&mut c, g.sse.len());
    let (whole, usage, end) = run(&[&g.sse], wants_usage, field);
    let (split, usage2, end2) = run(&pieces(&g.sse, &points), wants_usage, field);
    assert_eq!(whole, split, "splits at {points:?} changed the output");
    assert_eq!((usage, end), (usage2, end2));
    let text = std::str::from_utf8(&whole).expect("output is UTF-8");
    assert!(!text.contains("Qwen3-Upstream"), "the upstream model name leaked");
    assert!(text.ends_with("data: [DONE]\n\n"), "every stream ends with [DONE]");
    let mut acc = Accumulated::default();
    let mut usage_frames = 0;
    for frame in text.strip_suffix("\n\n").unwrap_or(text).split("\n\n") {
        let data = frame.strip_prefix("data: ").expect("frames are data lines");
        assert!(!data.contains(['\n', '\r']), "a frame spans lines: {frame:?}");
        if data == "[DONE]" {
            continue;
        }
        let v = parse_strict(data).unwrap_or_else(|e| panic!("frame data is not clean JSON ({e}): {data}"));
        if v.get("usage").is_some_and(|u| !u.is_null()) {
            usage_frames += 1;
            acc.usage = v.get("usage").cloned();
        }
        if let Some(m) = v.get("model") {
            assert_eq!(m, "aguila");
        }
        for ch in v["choices"].as_array().into_iter().flatten() {
            let d = &ch["delta"];
            append(&mut acc.content, &d["content"]);
            append(&mut acc.reasoning, &d["reasoning"]);
            append(&mut acc.reasoning_content, &d["reasoning_content"]);
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                let k = tc["index"].as_u64().expect("tool call index") as usize;
                if acc.calls.len() <= k {
                    acc.calls.resize(k + 1, Default::default());
                }
                let call = &mut acc.calls[k];
                append(&mut call.0, &tc["id"]);
                append(&mut call.1, &tc["function"]["name"]);
                append(&mut call.2, &tc["function"]["arguments"]);
            }
            if !ch["finish_reason"].is_null() {
                acc.finish = ch["finish_reason"].clone();
            }
        }
    }
    if !wants_usage {
        assert_eq!(usage_frames, 0, "usage shown to a client that did not ask");
    }
    let Some(body) = &g.completion else { return };
    assert_eq!(end, StreamEnd::Complete, "a clean stream completes");
    let (plain, plain_usage) = upstream_to_chat(body.to_string().as_bytes(), &ctx(), field).expect("a clean completion translates");
    let plain = parse_strict(std::str::from_utf8(&plain).expect("UTF-8")).expect("the non-stream body is clean JSON");
    assert_eq!(plain["model"], "aguila");
    let m = &plain["choices"][0]["message"];
    let text_of = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    assert_eq!(acc.content, text_of(&m["content"]), "content differs");
    assert_eq!(acc.reasoning, text_of(&m["reasoning"]), "reasoning differs");
    assert_eq!(acc.reasoning_content, text_of(&m["reasoning_content"]), "reasoning_content differs");
    let plain_calls: Vec<(String, String, String)> = m["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| (text_of(&t["id"]), text_of(&t["function"]["name"]), text_of(&t["function"]["arguments"])))
        .collect();
    assert_eq!(acc.calls, plain_calls, "tool calls differ");
    assert_eq!(acc.finish, plain["choices"][0]["finish_reason"], "finish_reason differs");
    if g.usage_sent {
        assert_eq!(usage, plain_usage, "metered usage differs");
        if wants_usage {
            assert_eq!(acc.usage.as_ref(), Some(&plain["usage"]), "usage frame differs");
        }
    }
});
