//! The messages-format stream translator fed generated upstream streams split at arbitrary
//! offsets: output independent of the splits; always a valid event sequence (reference §6.3);
//! and, for a clean finished stream, the message the SDKs accumulate equals the non-streaming
//! translation of the same answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::sse::SseDecoder;
use quipu_core::translate::messages::{accumulate_message, upstream_to_message, validate_event_sequence, MessagesStream};
use quipu_core::translate::{feed_stream, finish_stream, ResponseContext, StreamEnd, StreamTranslator};
use quipu_fuzz::{pieces, splits, upstream_stream, Cursor};

fn ctx() -> ResponseContext {
    ResponseContext {
        request_id: "req_f".into(),
        client_model: "claude-sonnet-4-5".into(),
        slug: "aguila".into(),
        upstream_model: "Qwen/Qwen3-Upstream".into(),
        tool_name_map: Vec::new(),
    }
}

fn run(parts: &[&[u8]]) -> (Vec<u8>, StreamEnd) {
    let mut t = MessagesStream::new(ctx());
    let mut d = SseDecoder::default();
    let mut out = Vec::new();
    for p in parts {
        feed_stream(&mut d, &mut t, p, &mut out);
    }
    finish_stream(&mut d, &mut t, &mut out);
    (out, t.end())
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let g = upstream_stream(&mut c);
    let points = splits(&mut c, g.sse.len());
    let (whole, end) = run(&[&g.sse]);
    let (split, _) = run(&pieces(&g.sse, &points));
    assert_eq!(whole, split, "splits at {points:?} changed the output");
    if let Err(e) = validate_event_sequence(&whole) {
        panic!("invalid event sequence: {e}\n{}", String::from_utf8_lossy(&whole));
    }
    if let (Some(body), StreamEnd::Complete) = (&g.completion, end) {
        let streamed = accumulate_message(&whole).expect("a complete stream accumulates");
        match upstream_to_message(body.to_string().as_bytes(), &ctx()) {
            Ok((json, _)) => {
                let plain: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
                for k in ["content", "stop_reason", "stop_sequence", "model", "usage"] {
                    assert_eq!(streamed[k], plain[k], "`{k}` differs between stream and non-stream");
                }
            }
            Err(e) => panic!("the stream completed but the same answer non-streamed failed: {e}"),
        }
    }
});
