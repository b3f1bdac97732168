//! The Anthropic messages format, response direction: the `Message` and the stream events
//! Quipu writes, as typed `Serialize` values. Field order is the vendor's (serde writes fields in declaration order),
//! so the bytes match what the SDKs and the recorded fixtures expect.
//!
//! Why typed and not byte literals: a misplaced quote or comma in a literal is a stream every
//! SDK rejects, found only by a test that happens to produce that event; a struct cannot be
//! malformed, and renaming a field is a compile-time change in one place. The cost, measured
//! with `cargo bench -p quipu-core --bench stream` against the literals it replaced (same run,
//! normalised by the unchanged chat cases): about 0.1 µs more per upstream chunk (~0.8 µs in
//! all on this machine), far under the 2 µs budget, and no allocation more per event, because
//! `serde_json` writes straight into the output buffer.

use crate::money::Pen;
use crate::usage::Usage;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// A whole (non-streaming) response.
#[derive(Debug, Serialize)]
pub struct Message<'a> {
    pub id: MessageId<'a>,
    #[serde(rename = "type")]
    pub kind: MessageKind,
    pub role: Role,
    pub model: &'a str,
    pub content: Vec<Block<'a>>,
    pub stop_reason: StopReason,
    pub stop_sequence: Option<&'a str>,
    pub usage: UsageOut,
}

/// A content block of a whole [`Message`].
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block<'a> {
    /// The upstream's reasoning text; `signature` is always `""` (nothing to verify).
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    Text {
        text: &'a str,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: &'a str,
        /// The call's arguments, one JSON object, as the upstream wrote them.
        input: &'a RawValue,
    },
}

/// One `event: <name>\ndata: <json>\n\n` frame of a messages stream; `data.type` is the name.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent<'a> {
    MessageStart {
        message: MessageStart<'a>,
    },
    ContentBlockStart {
        index: u32,
        content_block: BlockStart<'a>,
    },
    ContentBlockDelta {
        index: u32,
        delta: BlockDelta<'a>,
    },
    ContentBlockStop {
        index: u32,
    },
    MessageDelta {
        delta: MessageDelta<'a>,
        usage: UsageOut,
    },
    MessageStop,
    Ping,
}

impl StreamEvent<'_> {
    /// The SSE `event:` name, equal to `data.type`.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
            StreamEvent::Ping => "ping",
        }
    }

    /// Appends the whole SSE frame to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(self.name().as_bytes());
        out.extend_from_slice(b"\ndata: ");
        // Writing into a `Vec` cannot fail, and every value here serializes (strings, integers,
        // fixed shapes): there is no error to handle.
        let _ = serde_json::to_writer(&mut *out, self);
        out.extend_from_slice(b"\n\n");
    }
}

/// `message_start.message`: the message as it begins, with no content yet.
#[derive(Debug, Serialize)]
pub struct MessageStart<'a> {
    pub id: MessageId<'a>,
    #[serde(rename = "type")]
    pub kind: MessageKind,
    pub role: Role,
    pub model: &'a str,
    pub content: [(); 0],
    pub stop_reason: Option<StopReason>,
    pub stop_sequence: Option<&'a str>,
    pub usage: UsageOut,
}

/// `msg_<request id>`, written without building the string.
#[derive(Debug, Clone, Copy)]
pub struct MessageId<'a>(pub &'a str);

impl Serialize for MessageId<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for MessageId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("msg_")?;
        f.write_str(self.0)
    }
}

/// `"type":"message"`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageKind {
    #[default]
    Message,
}

/// `"role":"assistant"`: the only role Quipu writes.
#[derive(Debug, Clone, Copy, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    #[default]
    Assistant,
}

/// `content_block_start.content_block`: a block as it opens, empty.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockStart<'a> {
    /// Always opens empty (`thinking` and `signature` are `""`).
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    /// Always opens empty (`text` is `""`).
    Text { text: &'a str },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: EmptyObject,
    },
}

/// `{}`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EmptyObject {}

/// `content_block_delta.delta`: one fragment of the open block.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta<'a> {
    ThinkingDelta { thinking: &'a str },
    TextDelta { text: &'a str },
    InputJsonDelta { partial_json: &'a str },
}

/// `message_delta.delta`: why the message stopped.
#[derive(Debug, Serialize)]
pub struct MessageDelta<'a> {
    pub stop_reason: StopReason,
    pub stop_sequence: Option<&'a str>,
}

/// Why generation stopped, in the messages format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
    Refusal,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopSequence => "stop_sequence",
            StopReason::ToolUse => "tool_use",
            StopReason::Refusal => "refusal",
        }
    }
}

/// The messages format's `usage`: input without the cached part, cache reads, output. Quipu
/// never creates cache entries the client pays for, so `cache_creation_input_tokens` is 0.
/// `cost` (soles, a JSON number: [`Pen::json_number`]) is the charge of the final usage — the
/// message's and `message_delta`'s ([`UsageOut::with_cost`]), not `message_start`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct UsageOut {
    pub input_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub output_tokens: u64,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "cost_number"
    )]
    pub cost: Option<Pen>,
}

impl UsageOut {
    /// The final usage and its cost.
    pub fn with_cost(u: &Usage, cost: Pen) -> Self {
        UsageOut {
            cost: Some(cost),
            ..UsageOut::from(u)
        }
    }
}

/// `cost` as a JSON number (only called when present).
fn cost_number<S: Serializer>(cost: &Option<Pen>, s: S) -> Result<S::Ok, S::Error> {
    cost.map(Pen::json_number).serialize(s)
}

impl From<&Usage> for UsageOut {
    fn from(u: &Usage) -> Self {
        UsageOut {
            input_tokens: u.uncached_input(),
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: u.cached(),
            output_tokens: u.completion_tokens,
            cost: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(e: &StreamEvent<'_>) -> String {
        let mut out = Vec::new();
        e.write(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn frames_are_the_vendors_bytes() {
        let usage = UsageOut {
            input_tokens: 3,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 2,
            output_tokens: 1,
            cost: None,
        };
        let start = StreamEvent::MessageStart {
            message: MessageStart {
                id: MessageId("r\"1"),
                kind: MessageKind::Message,
                role: Role::Assistant,
                model: "colibri",
                content: [],
                stop_reason: None,
                stop_sequence: None,
                usage,
            },
        };
        assert_eq!(
            frame(&start),
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_r\\\"1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"colibri\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":3,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2,\"output_tokens\":1}}}\n\n"
        );
        let tool = StreamEvent::ContentBlockStart {
            index: 2,
            content_block: BlockStart::ToolUse {
                id: "toolu_1",
                name: "get",
                input: EmptyObject {},
            },
        };
        assert_eq!(
            frame(&tool),
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get\",\"input\":{}}}\n\n"
        );
        let thinking = StreamEvent::ContentBlockStart {
            index: 0,
            content_block: BlockStart::Thinking {
                thinking: "",
                signature: "",
            },
        };
        assert!(frame(&thinking).contains(
            "\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}"
        ));
        let delta = StreamEvent::ContentBlockDelta {
            index: 0,
            delta: BlockDelta::TextDelta {
                text: "a\"b\n\u{1}",
            },
        };
        assert_eq!(
            frame(&delta),
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\\\"b\\n\\u0001\"}}\n\n"
        );
        let end = StreamEvent::MessageDelta {
            delta: MessageDelta {
                stop_reason: StopReason::StopSequence,
                stop_sequence: Some("FIN"),
            },
            usage,
        };
        assert!(frame(&end).starts_with(
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"FIN\"},\"usage\":{\"input_tokens\":3,"
        ));
        let priced = StreamEvent::MessageDelta {
            delta: MessageDelta {
                stop_reason: StopReason::EndTurn,
                stop_sequence: None,
            },
            usage: UsageOut {
                cost: Some(Pen::from_picos(2_600_000)),
                ..usage
            },
        };
        assert!(frame(&priced).ends_with(
            "\"cache_read_input_tokens\":2,\"output_tokens\":1,\"cost\":0.0000026}}\n\n"
        ));
        assert_eq!(
            frame(&StreamEvent::MessageStop),
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
        assert_eq!(
            frame(&StreamEvent::Ping),
            "event: ping\ndata: {\"type\":\"ping\"}\n\n"
        );
    }

    #[test]
    fn stop_reason_serializes_as_its_name() {
        for r in [
            StopReason::EndTurn,
            StopReason::MaxTokens,
            StopReason::StopSequence,
            StopReason::ToolUse,
            StopReason::Refusal,
        ] {
            assert_eq!(
                serde_json::to_string(&r).unwrap(),
                format!("\"{}\"", r.as_str())
            );
        }
    }
}
