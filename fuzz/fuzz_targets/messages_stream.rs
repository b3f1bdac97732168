//! The messages-format stream translator, fed through the gateway's path (`SseDecoder` →
//! `feed_stream` per read → `finish_stream`) in two modes chosen by the first byte:
//!
//! - structured (any first byte but `R`): a generated upstream chunk sequence
//!   ([`upstream_stream`]), realistic or wild, split at fuzzer-chosen offsets;
//! - raw (`R`): the rest of the input *is* the upstream's SSE byte stream, split at
//!   fuzzer-chosen offsets ([`raw_input`]).
//!
//! On any input: output (and usage, how it ended, the error) independent of the splits; always
//! a valid event sequence (`message_start` first, dense indexes, one open
//! block, `message_delta` then `message_stop` last — or a well-formed `error` event last,
//! exactly when the stream failed); never left open; the client's model name in
//! `message_start`; no error naming the upstream's model; a complete stream accumulates into a
//! message (every tool input parses). Structured, clean and in order: the same answer as the
//! non-streaming translation — the message the SDKs accumulate equals it (usage included when
//! the usage chunk was sent), or both fail with the same error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::testing::{replay, Replay};
use quipu_core::translate::messages::{
    accumulate_message, upstream_to_message, validate_event_sequence, MessagesStream,
};
use quipu_core::translate::{ResponseContext, StreamEnd};
use quipu_fuzz::{pieces, raw_input, splits, upstream_stream, Cursor};
use serde_json::Value;

const UPSTREAM_MODEL: &str = "Qwen/Qwen3-Upstream";

fn ctx() -> ResponseContext {
    ResponseContext {
        request_id: "req_f".into(),
        client_model: "claude-sonnet-4-5".into(),
        slug: "aguila".into(),
        upstream_model: UPSTREAM_MODEL.into(),
        tool_name_map: Vec::new(),
    }
}

fn run(parts: &[&[u8]]) -> Replay {
    replay(&mut MessagesStream::new(ctx()), parts)
}

/// Runs `sse` whole and cut at `points`, checks what holds for every input, returns the run.
fn run_and_check(sse: &[u8], points: &[usize]) -> Replay {
    let whole = run(&[sse]);
    let split = run(&pieces(sse, points));
    assert_eq!(whole, split, "splits at {points:?} changed the output");
    let shown = || String::from_utf8_lossy(&whole.out).into_owned();
    if let Err(e) = validate_event_sequence(&whole.out) {
        panic!("invalid event sequence: {e}\n{}", shown());
    }
    assert_ne!(whole.end, StreamEnd::Open, "the stream was left open");
    assert_eq!(
        whole.error.is_some(),
        whole.end == StreamEnd::Failed,
        "error() disagrees with end()"
    );
    // The validator accepted the framing: `event: X\ndata: {…}\n\n` frames.
    let text = std::str::from_utf8(&whole.out).expect("validated: UTF-8");
    let frames: Vec<Value> = text
        .strip_suffix("\n\n")
        .unwrap_or_default()
        .split("\n\n")
        .map(|f| {
            serde_json::from_str(f.split_once("\ndata: ").map_or("", |(_, d)| d))
                .expect("validated: JSON")
        })
        .collect();
    let last = frames.last().map(|f| f["type"].clone());
    match whole.end {
        StreamEnd::Failed => assert_eq!(
            last,
            Some(Value::from("error")),
            "a failed stream ends with an error event\n{}",
            shown()
        ),
        _ => assert_eq!(
            last,
            Some(Value::from("message_stop")),
            "a complete stream ends with message_stop\n{}",
            shown()
        ),
    }
    for f in &frames {
        match f["type"].as_str() {
            Some("message_start") => assert_eq!(
                f["message"]["model"], "claude-sonnet-4-5",
                "message_start names another model"
            ),
            Some("error") => {
                assert!(
                    !f.to_string().contains(UPSTREAM_MODEL),
                    "an error names the upstream model: {f}"
                );
                let message = f["error"]["message"].as_str();
                assert_eq!(
                    message,
                    whole.error.as_ref().map(|e| e.message.as_str()),
                    "the error event is not error()"
                );
            }
            _ => {}
        }
    }
    if whole.end == StreamEnd::Complete {
        if let Err(e) = accumulate_message(&whole.out) {
            panic!("a complete stream does not accumulate: {e}\n{}", shown());
        }
    }
    whole
}

fuzz_target!(|data: &[u8]| {
    if let Some(raw) = raw_input(data) {
        run_and_check(raw.sse, &raw.points);
        return;
    }
    let mut c = Cursor::new(data);
    c.byte(); // the mode byte
    let g = upstream_stream(&mut c);
    let points = splits(&mut c, g.sse.len());
    let whole = run_and_check(&g.sse, &points);
    assert!(
        !String::from_utf8_lossy(&whole.out).contains("Qwen3-Upstream"),
        "the upstream model name leaked"
    );
    // Out of order, the stream cannot equal the message (blocks do not reopen): only the
    // invariants above hold.
    let Some(body) = g.completion.as_ref().filter(|_| g.in_order) else {
        return;
    };
    let plain = upstream_to_message(body.to_string().as_bytes(), &ctx());
    match (whole.end, plain) {
        (StreamEnd::Complete, Ok((json, usage))) => {
            let streamed = accumulate_message(&whole.out).expect("a complete stream accumulates");
            let plain: Value = serde_json::from_slice(&json).expect("JSON");
            for k in [
                "id",
                "type",
                "role",
                "content",
                "stop_reason",
                "stop_sequence",
                "model",
            ] {
                assert_eq!(
                    streamed[k], plain[k],
                    "`{k}` differs between stream and non-stream"
                );
            }
            if g.usage_sent {
                assert_eq!(streamed["usage"], plain["usage"], "usage differs");
                assert_eq!(whole.usage, usage, "metered usage differs");
            }
        }
        (StreamEnd::Failed, Err(e)) => {
            assert_eq!(
                whole.error.as_ref(),
                Some(&e),
                "stream and non-stream fail differently"
            );
        }
        (end, plain) => panic!(
            "stream ended {end:?} ({:?}) but non-stream gave {:?}\n{}",
            whole.error,
            plain.map(|(b, _)| String::from_utf8_lossy(&b).into_owned()),
            String::from_utf8_lossy(&whole.out)
        ),
    }
});
