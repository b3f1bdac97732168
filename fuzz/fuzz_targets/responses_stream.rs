//! The Responses API stream translator, fed through the gateway's path (`SseDecoder` →
//! `feed_stream` per read → `finish_stream`) in the two modes of `messages_stream`: a generated
//! upstream chunk sequence (any first byte but `R`) or raw SSE bytes (`R`), split at
//! fuzzer-chosen offsets.
//!
//! On any input: output (and usage, how it ended, the error) independent of the splits; always
//! a valid numbered event sequence (`validate_event_sequence`: `response.created` and
//! `response.in_progress` first, dense output indexes, one open item, `.done` texts equal to
//! their deltas, one terminal event last whose output is the finished items); never left open;
//! no upstream model name; a finished stream accumulates. Structured, clean and in order: the
//! same answer as the non-streaming translation (output and status), or both fail with the
//! same error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::testing::{replay, Replay};
use quipu_core::translate::responses::{
    accumulate_response, upstream_to_responses, validate_event_sequence, ResponsesContext,
    ResponsesStream,
};
use quipu_core::translate::{ResponseContext, StreamEnd};
use quipu_fuzz::{pieces, raw_input, splits, upstream_stream, Cursor};
use serde_json::Value;

const UPSTREAM_MODEL: &str = "Qwen/Qwen3-Upstream";

fn ctx() -> ResponsesContext {
    ResponsesContext {
        base: ResponseContext {
            request_id: "req_f".into(),
            client_model: "aguila".into(),
            slug: "aguila".into(),
            upstream_model: UPSTREAM_MODEL.into(),
            tool_name_map: Vec::new(),
        },
        created_at: 1,
        echo: Vec::new(),
        tools: Vec::new(),
        encrypted_reasoning: false,
        keep_object: true,
    }
}

fn run(parts: &[&[u8]]) -> Replay {
    replay(&mut ResponsesStream::new(ctx()), parts)
}

fn run_and_check(sse: &[u8], points: &[usize]) -> (Replay, Value) {
    let whole = run(&[sse]);
    let split = run(&pieces(sse, points));
    assert_eq!(whole, split, "splits at {points:?} changed the output");
    let shown = || String::from_utf8_lossy(&whole.out).into_owned();
    let last = validate_event_sequence(&whole.out)
        .unwrap_or_else(|e| panic!("invalid event sequence: {e}\n{}", shown()));
    assert_ne!(whole.end, StreamEnd::Open, "the stream was left open");
    assert_eq!(
        whole.error.is_some(),
        whole.end == StreamEnd::Failed,
        "error() disagrees with end()"
    );
    assert_eq!(
        last["status"] == "failed",
        whole.end == StreamEnd::Failed,
        "the terminal event disagrees with end()\n{}",
        shown()
    );
    assert!(!shown().contains(UPSTREAM_MODEL), "the upstream model name leaked");
    if whole.end == StreamEnd::Complete {
        let acc = accumulate_response(&whole.out)
            .unwrap_or_else(|e| panic!("a complete stream does not accumulate: {e}\n{}", shown()));
        assert_eq!(acc["output"], last["output"], "accumulated output differs");
    }
    (whole, last)
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
    let (whole, last) = run_and_check(&g.sse, &points);
    let Some(body) = g.completion.as_ref().filter(|_| g.in_order) else {
        return;
    };
    let plain = upstream_to_responses(body.to_string().as_bytes(), &ctx());
    match (whole.end, plain) {
        (StreamEnd::Complete, Ok((json, _))) => {
            let plain: Value = serde_json::from_slice(&json).expect("JSON");
            for k in ["status", "incomplete_details", "output"] {
                assert_eq!(last[k], plain[k], "`{k}` differs between stream and non-stream");
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
