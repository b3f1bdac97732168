//! The messages-format stream translator fed generated upstream streams split at arbitrary
//! offsets: output (and usage, and how it ended) independent of the splits; always a valid
//! event sequence (reference §6.3); and, whenever the stream's content is clean, the same
//! answer as the non-streaming translation: the message the SDKs accumulate equals it
//! (usage included when the usage chunk was sent), or both fail with the same error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::error::ApiError;
use quipu_core::sse::SseDecoder;
use quipu_core::translate::messages::{accumulate_message, upstream_to_message, validate_event_sequence, MessagesStream};
use quipu_core::translate::{feed_stream, finish_stream, ResponseContext, StreamEnd, StreamTranslator};
use quipu_core::usage::Usage;
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

#[derive(Debug, PartialEq)]
struct Run {
    out: Vec<u8>,
    end: StreamEnd,
    usage: Usage,
    error: Option<ApiError>,
}

fn run(parts: &[&[u8]]) -> Run {
    let mut t = MessagesStream::new(ctx());
    let mut d = SseDecoder::default();
    let mut out = Vec::new();
    for p in parts {
        feed_stream(&mut d, &mut t, p, &mut out);
    }
    finish_stream(&mut d, &mut t, &mut out);
    Run { out, end: t.end(), usage: t.usage(), error: t.error().cloned() }
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let g = upstream_stream(&mut c);
    let points = splits(&mut c, g.sse.len());
    let whole = run(&[&g.sse]);
    let split = run(&pieces(&g.sse, &points));
    assert_eq!(whole, split, "splits at {points:?} changed the output");
    if let Err(e) = validate_event_sequence(&whole.out) {
        panic!("invalid event sequence: {e}\n{}", String::from_utf8_lossy(&whole.out));
    }
    assert_ne!(whole.end, StreamEnd::Open, "the stream was left open");
    assert!(!String::from_utf8_lossy(&whole.out).contains("Qwen3-Upstream"), "the upstream model name leaked");
    let Some(body) = &g.completion else { return };
    let plain = upstream_to_message(body.to_string().as_bytes(), &ctx());
    match (whole.end, plain) {
        (StreamEnd::Complete, Ok((json, usage))) => {
            let streamed = accumulate_message(&whole.out).expect("a complete stream accumulates");
            let plain: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
            for k in ["id", "type", "role", "content", "stop_reason", "stop_sequence", "model"] {
                assert_eq!(streamed[k], plain[k], "`{k}` differs between stream and non-stream");
            }
            if g.usage_sent {
                assert_eq!(streamed["usage"], plain["usage"], "usage differs");
                assert_eq!(whole.usage, usage, "metered usage differs");
            }
        }
        (StreamEnd::Failed, Err(e)) => {
            assert_eq!(whole.error.as_ref(), Some(&e), "stream and non-stream fail differently");
        }
        (end, plain) => panic!(
            "stream ended {end:?} ({:?}) but non-stream gave {:?}\n{}",
            whole.error,
            plain.map(|(b, _)| String::from_utf8_lossy(&b).into_owned()),
            String::from_utf8_lossy(&whole.out)
        ),
    }
});
