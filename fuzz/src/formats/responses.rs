//! The Responses API: requests keep what they echo and store (the echo is JSON members; the
//! stored conversation, exactly when `store`, has every item with an id, a type and a status
//! and reads back as items). Streams: always a valid numbered event sequence
//! (`response.created` and `response.in_progress` first, dense output indexes, one open item,
//! `.done` texts equal to their deltas, one terminal event last whose output is the finished
//! items, `failed` exactly when the stream failed, its `usage.cost` the charge of the usage
//! billed); no upstream model name; a finished stream
//! accumulates. Generated, clean and in order: the same answer as the non-streaming
//! translation (output and status), or both fail with the same error.

use super::{base, check_cost, in_order_answer, Fuzzed, UPSTREAM_MODEL};
use crate::Generated;
use quipu_core::testing::Replay;
use quipu_core::translate::responses::request::parse_items;
use quipu_core::translate::responses::{
    accumulate_response, validate_event_sequence, Responses, ResponsesContext, ResponsesTurn,
};
use quipu_core::translate::StreamEnd;
use serde_json::value::RawValue;
use serde_json::Value;

impl Fuzzed for Responses {
    /// The terminal event's response object.
    type Seen = Value;

    fn context(_flags: u8) -> ResponsesContext {
        ResponsesContext {
            base: base("aguila"),
            created_at: 1,
            echo: Vec::new(),
            tools: Vec::new(),
            encrypted_reasoning: false,
            keep_object: true,
        }
    }

    fn check_request(t: &ResponsesTurn) {
        // The echo is JSON members; the conversation to store is a JSON array.
        let echo = format!("{{\"x\":0{}}}", String::from_utf8_lossy(&t.echo));
        let _: Value = serde_json::from_str(&echo).expect("the echo is JSON members");
        assert_eq!(t.conversation.is_some(), t.store);
        if let Some(conv) = &t.conversation {
            // What is stored: every item kept, each new object with an id, a type and a
            // status, and it reads back as a conversation.
            let items: Value =
                serde_json::from_str(&conv.items).expect("the stored conversation is JSON");
            let items = items
                .as_array()
                .expect("the stored conversation is an array");
            assert!(items.len() > conv.new_from);
            for item in items.iter().skip(conv.new_from).filter(|i| i.is_object()) {
                assert!(
                    item["id"].as_str().is_some_and(|id| !id.is_empty()),
                    "{item}"
                );
                assert!(
                    item["type"].is_string() && item["status"].is_string(),
                    "{item}"
                );
            }
            let raw: &RawValue = serde_json::from_str(&conv.items).expect("raw JSON");
            parse_items(raw, "x").expect("the stored conversation reads back as items");
        }
    }

    fn check_output(whole: &Replay, _flags: u8, _raw: Option<&[u8]>) -> Value {
        let shown = || String::from_utf8_lossy(&whole.out).into_owned();
        let last = validate_event_sequence(&whole.out)
            .unwrap_or_else(|e| panic!("invalid event sequence: {e}\n{}", shown()));
        assert_eq!(
            last["status"] == "failed",
            whole.end == StreamEnd::Failed,
            "the terminal event disagrees with end()\n{}",
            shown()
        );
        assert!(
            !shown().contains(UPSTREAM_MODEL),
            "the upstream model name leaked"
        );
        check_cost(&last["usage"]["cost"], whole);
        if whole.end == StreamEnd::Complete {
            let acc = accumulate_response(&whole.out).unwrap_or_else(|e| {
                panic!("a complete stream does not accumulate: {e}\n{}", shown())
            });
            assert_eq!(acc["output"], last["output"], "accumulated output differs");
        }
        last
    }

    fn compare(g: &Generated, whole: &Replay, last: Value, flags: u8) {
        let Some((plain, _)) = in_order_answer::<Self>(g, whole, flags) else {
            return;
        };
        for k in ["status", "incomplete_details", "output"] {
            assert_eq!(
                last[k], plain[k],
                "`{k}` differs between stream and non-stream"
            );
        }
    }
}
