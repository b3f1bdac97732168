//! The chat-format stream translator fed generated upstream streams split at arbitrary offsets:
//! the output does not depend on the splits, every frame is `data: <JSON>` or `data: [DONE]`,
//! the upstream's model name never shows, usage reaches the client only when asked.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::config::ReasoningField;
use quipu_core::sse::SseDecoder;
use quipu_core::translate::chat::ChatStream;
use quipu_core::translate::{feed_stream, finish_stream, ResponseContext, StreamTranslator};
use quipu_fuzz::{pieces, splits, upstream_stream, Cursor};

fn run(parts: &[&[u8]], wants_usage: bool) -> (Vec<u8>, quipu_core::usage::Usage) {
    let ctx = ResponseContext {
        request_id: "req_f".into(),
        client_model: "aguila".into(),
        slug: "aguila".into(),
        upstream_model: "Qwen/Qwen3-Upstream".into(),
        tool_name_map: Vec::new(),
    };
    let mut t = ChatStream::new(ctx, wants_usage, ReasoningField::Both);
    let mut d = SseDecoder::default();
    let mut out = Vec::new();
    for p in parts {
        feed_stream(&mut d, &mut t, p, &mut out);
    }
    finish_stream(&mut d, &mut t, &mut out);
    (out, t.usage())
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let wants_usage = c.byte() % 2 == 0;
    let g = upstream_stream(&mut c);
    let points = splits(&mut c, g.sse.len());
    let (whole, usage) = run(&[&g.sse], wants_usage);
    let (split, usage2) = run(&pieces(&g.sse, &points), wants_usage);
    assert_eq!(whole, split, "splits at {points:?} changed the output");
    assert_eq!(usage, usage2);
    let text = std::str::from_utf8(&whole).expect("output is UTF-8");
    assert!(!text.contains("Qwen3-Upstream"), "the upstream model name leaked");
    assert!(text.ends_with("data: [DONE]\n\n"), "every stream ends with [DONE]");
    let mut usage_frames = 0;
    for frame in text.strip_suffix("\n\n").unwrap_or(text).split("\n\n") {
        let data = frame.strip_prefix("data: ").expect("frames are data lines");
        if data == "[DONE]" {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(data).expect("frame data is JSON");
        if v.get("usage").is_some_and(|u| !u.is_null()) {
            usage_frames += 1;
        }
    }
    if !wants_usage {
        assert_eq!(usage_frames, 0, "usage shown to a client that did not ask");
    }
});
