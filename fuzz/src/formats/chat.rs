//! The chat format: the relay's invariants (UTF-8; every frame one `data: ` line holding JSON,
//! with no repeated keys unless the upstream repeated some, or `[DONE]`; `[DONE]` ends every
//! stream and nothing follows it; every `model` is the slug and no error frame names the
//! upstream's model; usage only when asked; a cost only on a usage frame after the finish, the
//! last one the charge of the usage billed; a failed stream's last frame before `[DONE]` is
//! the error) and, for a clean generated answer in any order, what a client accumulates per
//! field and per tool-call index equals the non-streaming translation. The option bits choose
//! `include_usage` and the reasoning field.

use super::{base, check_cost, Fuzzed, UPSTREAM_MODEL};
use crate::{parse_strict, sse_data, Generated};
use quipu_core::config::ReasoningField;
use quipu_core::testing::Replay;
use quipu_core::translate::chat::{Chat, ChatContext};
use quipu_core::translate::{Format, StreamEnd};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;

impl Fuzzed for Chat {
    type Seen = Accumulated;

    fn context(flags: u8) -> ChatContext {
        let (client_wants_usage, reasoning) = options(flags);
        ChatContext {
            base: base("aguila"),
            client_wants_usage,
            reasoning,
        }
    }

    fn check_output(whole: &Replay, flags: u8, raw: Option<&[u8]>) -> Accumulated {
        let (wants_usage, _) = options(flags);
        // Repeated keys or lone surrogates in the upstream's JSON: relayed as they came.
        let faults: Vec<String> = sse_data(raw.unwrap_or_default())
            .iter()
            .filter_map(|d| {
                let s = String::from_utf8_lossy(d);
                serde_json::from_str::<&RawValue>(&s).ok()?;
                parse_strict(&s).err().map(|e| fault_kind(&e))
            })
            .collect();
        let acc = check_output_frames(&whole.out, whole.end, wants_usage, &faults);
        // An upstream fault (a repeated key) may hide the usage object from the relay's
        // reading: then it is relayed as it came.
        if let (Some(cost), true) = (&acc.last_cost, faults.is_empty()) {
            check_cost(cost, whole);
        }
        acc
    }

    fn compare(g: &Generated, whole: &Replay, acc: Accumulated, flags: u8) {
        let (wants_usage, _) = options(flags);
        let (end, usage) = (whole.end, whole.usage);
        let Some(body) = &g.completion else { return };
        // Clean, in order or not: an OpenAI client accumulates per field and per index.
        assert_eq!(end, StreamEnd::Complete, "a clean stream completes");
        assert!(
            !acc.unplaced_call,
            "a clean stream's tool-call delta without an index"
        );
        let (plain, plain_usage) =
            Chat::respond(body.to_string().as_bytes(), &Self::context(flags))
                .expect("a clean completion translates");
        let plain = parse_strict(std::str::from_utf8(&plain).expect("UTF-8"))
            .expect("the non-stream body is clean JSON");
        assert_eq!(plain["model"], "aguila");
        let m = &plain["choices"][0]["message"];
        let text_of = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        assert_eq!(acc.content, text_of(&m["content"]), "content differs");
        assert_eq!(acc.reasoning, text_of(&m["reasoning"]), "reasoning differs");
        assert_eq!(
            acc.reasoning_content,
            text_of(&m["reasoning_content"]),
            "reasoning_content differs"
        );
        let plain_calls: Vec<(String, String, String)> = m["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    text_of(&t["id"]),
                    text_of(&t["function"]["name"]),
                    text_of(&t["function"]["arguments"]),
                )
            })
            .collect();
        let streamed_calls: Vec<(String, String, String)> = acc.calls.values().cloned().collect();
        assert_eq!(streamed_calls, plain_calls, "tool calls differ");
        assert_eq!(
            acc.finish, plain["choices"][0]["finish_reason"],
            "finish_reason differs"
        );
        if g.usage_sent {
            assert_eq!(usage, plain_usage, "metered usage differs");
            if wants_usage {
                // A usage chunk before the finish (wild) is relayed without a cost: the cost
                // is the final usage's.
                let mut want = plain["usage"].clone();
                if acc.usage_before_finish {
                    if let Some(u) = want.as_object_mut() {
                        u.remove("cost");
                    }
                }
                assert_eq!(acc.usage.as_ref(), Some(&want), "usage frame differs");
            }
        }
    }
}

/// What an OpenAI client rebuilds from the deltas: one message, the finish reason, the usage.
#[derive(Default)]
pub struct Accumulated {
    content: String,
    reasoning: String,
    reasoning_content: String,
    /// (id, name, arguments) by index.
    calls: BTreeMap<u64, (String, String, String)>,
    /// A tool-call delta without an integer `index` (a client could not place it).
    unplaced_call: bool,
    finish: Value,
    usage: Option<Value>,
    /// The last usage frame came before any finish reason.
    usage_before_finish: bool,
    /// The last `usage.cost` written.
    last_cost: Option<Value>,
}

fn append(to: &mut String, v: &Value) {
    if let Some(s) = v.as_str() {
        to.push_str(s);
    }
}

/// A strict-parse complaint without its position (a relayed event moves when the model name
/// before it is rewritten): `duplicate key "created"`.
fn fault_kind(e: &str) -> String {
    e.split(" at line ").next().unwrap_or(e).to_owned()
}

/// Checks the invariants every output must meet, whatever the upstream sent, and accumulates
/// what a client would. `upstream_faults`: what the strict parse said of the upstream's own
/// events (a repeated key, a lone surrogate); an output frame may show the same fault, and
/// only that one, since the relay passes the upstream's JSON through as written.
fn check_output_frames(
    out: &[u8],
    end: StreamEnd,
    wants_usage: bool,
    upstream_faults: &[String],
) -> Accumulated {
    assert_ne!(end, StreamEnd::Open, "the stream was left open");
    let text = std::str::from_utf8(out).expect("output is UTF-8");
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "every stream ends with [DONE]"
    );
    let frames: Vec<&str> = text
        .strip_suffix("\n\n")
        .unwrap_or(text)
        .split("\n\n")
        .collect();
    let mut acc = Accumulated::default();
    let mut usage_frames = 0;
    let mut error_at = None;
    for (n, frame) in frames.iter().enumerate() {
        let data = frame
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("frame {n} is not a data line: {frame:?}"));
        assert!(
            !data.contains(['\n', '\r']),
            "a frame spans lines: {frame:?}"
        );
        if data == "[DONE]" {
            assert_eq!(n + 1, frames.len(), "frames after [DONE]");
            continue;
        }
        let v = match parse_strict(data) {
            Ok(v) => v,
            Err(e) if upstream_faults.contains(&fault_kind(&e)) => {
                match serde_json::from_str::<Value>(data) {
                    // The upstream's own fault, relayed: read on as a client would (last key wins).
                    Ok(v) => v,
                    // A lone surrogate no `Value` holds: at least it is one JSON value.
                    Err(_) => {
                        assert!(
                            serde_json::from_str::<&RawValue>(data).is_ok(),
                            "not JSON: {data}"
                        );
                        continue;
                    }
                }
            }
            Err(e) => panic!("frame data is not clean JSON ({e}): {data}"),
        };
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage_frames += 1;
            acc.usage = Some(u.clone());
            acc.usage_before_finish = acc.finish.is_null();
            if let Some(cost) = u.get("cost") {
                assert!(
                    !acc.finish.is_null() || !upstream_faults.is_empty(),
                    "a cost before the finish: {data}"
                );
                acc.last_cost = Some(cost.clone());
            }
        }
        if let Some(m) = v.get("model") {
            assert_eq!(m, "aguila", "a model other than the slug");
        }
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            assert!(
                e["message"].is_string() && e["type"].is_string(),
                "a malformed error frame: {data}"
            );
            assert!(
                !v.to_string().contains(UPSTREAM_MODEL),
                "an error names the upstream model: {data}"
            );
            error_at = Some(n);
        }
        for ch in v["choices"].as_array().into_iter().flatten() {
            let d = &ch["delta"];
            append(&mut acc.content, &d["content"]);
            append(&mut acc.reasoning, &d["reasoning"]);
            append(&mut acc.reasoning_content, &d["reasoning_content"]);
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                let Some(k) = tc["index"].as_u64() else {
                    acc.unplaced_call = true;
                    continue;
                };
                let call = acc.calls.entry(k).or_default();
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
    match end {
        StreamEnd::Failed => assert_eq!(
            error_at,
            Some(frames.len().saturating_sub(2)),
            "a failed stream ends with its error, then [DONE]"
        ),
        _ => assert_eq!(error_at, None, "an error frame in a stream that completed"),
    }
    acc
}

fn options(b: u8) -> (bool, ReasoningField) {
    let field = [
        ReasoningField::Both,
        ReasoningField::Reasoning,
        ReasoningField::ReasoningContent,
    ][usize::from(b >> 1) % 3];
    (b % 2 == 0, field)
}
