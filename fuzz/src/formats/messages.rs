//! The messages format: always a valid event sequence (`message_start` first, dense indexes,
//! one open block, `message_delta` then `message_stop` last — or a well-formed `error` event
//! last, exactly when the stream failed, its message `error()`'s); the client's model name in
//! `message_start`; `message_delta.usage.cost` the charge of the usage billed, and no cost in
//! `message_start`; no error naming the upstream's model; a complete stream accumulates into a
//! message (every tool input parses). Generated, clean and in order: the message the SDKs
//! accumulate equals the non-streaming translation (usage included when the usage chunk was
//! sent), or both fail with the same error.

use super::{base, check_cost, in_order_answer, Fuzzed, UPSTREAM_MODEL};
use crate::Generated;
use quipu_core::testing::Replay;
use quipu_core::translate::messages::{accumulate_message, validate_event_sequence, Messages};
use quipu_core::translate::{ResponseContext, StreamEnd};
use serde_json::Value;

impl Fuzzed for Messages {
    type Seen = ();

    fn context(_flags: u8) -> ResponseContext {
        base("claude-sonnet-4-5")
    }

    fn check_output(whole: &Replay, _flags: u8, _raw: Option<&[u8]>) {
        let shown = || String::from_utf8_lossy(&whole.out).into_owned();
        if let Err(e) = validate_event_sequence(&whole.out) {
            panic!("invalid event sequence: {e}\n{}", shown());
        }
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
                Some("message_start") => {
                    assert_eq!(
                        f["message"]["model"], "claude-sonnet-4-5",
                        "message_start names another model"
                    );
                    assert!(
                        f["message"]["usage"].get("cost").is_none(),
                        "message_start's usage is not final: no cost"
                    );
                }
                Some("message_delta") => check_cost(&f["usage"]["cost"], whole),
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
    }

    fn compare(g: &Generated, whole: &Replay, _seen: (), flags: u8) {
        let Some((plain, usage)) = in_order_answer::<Self>(g, whole, flags) else {
            return;
        };
        let streamed = accumulate_message(&whole.out).expect("a complete stream accumulates");
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
}
