//! The streaming translator: upstream chat-completion chunks in, messages-format events out.
//! Incremental — each upstream payload is parsed once, borrowed, and turned into frames
//! immediately; nothing earlier is kept except a few counters, the open block and
//! one small record per tool call (plus, only while parallel calls interleave, the fragments
//! of the calls waiting for their block, bounded).
//!
//! Output, always `event: <name>\ndata: <json>\n\n` with `data.type == name`, written from
//! the typed [`StreamEvent`]s of [`crate::protocol::anthropic_out`]:
//!
//! 1. `message_start` before anything else — on the first chunk, with the usage that chunk
//!    reports (vLLM's continuous usage stats: the prompt's tokens), or on the first idle tick
//!    if the upstream is slow to start, with all four usage keys zero.
//! 2. Content blocks with dense indexes from 0, exactly one open at a time. Per chunk the
//!    delta is read in the order reasoning → content → tool calls (one chunk may carry all of
//!    them, the finish chunk included). Empty strings open nothing (vLLM's first chunk has
//!    `content:""`). A tool call starts a block on a new `index`, or on a new non-empty `id`
//!    at a known index (lmdeploy#3412); a re-sent id/name at the same index (vllm#31438) does
//!    not. The block starts once the name is known (a minted `toolu_…` id stands in for a
//!    missing one); argument fragments that arrive before the name are held until it starts,
//!    every later fragment becomes one `input_json_delta`, unbuffered.
//! 3. Tool arguments are checked as they pass, with an incremental JSON scanner
//!    ([`ObjectScanner`], O(fragment), nothing re-read): they must form one JSON object, or
//!    be empty (input `{}`). A fragment that makes them malformed is not forwarded; the stream
//!    ends with an `event: error` (`api_error`, "the model server returned malformed tool
//!    arguments") — the non-streaming translation answers the same error as a 502, so both
//!    paths agree instead of one falling back to `{}` while the other hands the SDK's JSON
//!    accumulator text it cannot parse.
//! 4. Parallel calls: one block is open at a time, so a call whose fragments interleave with
//!    the open call's is held (its fragments buffered, at most [`MAX_HELD_ARGUMENTS`] bytes in
//!    all) until the open call's arguments are complete, then started and flushed. A fragment
//!    that arrives for a call whose block had to be closed early (by text or reasoning in
//!    between, or at the finish) cannot be sent — blocks do not reopen — and ends the stream
//!    with an error rather than truncating the call's input silently. (Points 2–4: the
//!    rules of [`tool_calls`](crate::translate::tool_calls), shared with the Responses
//!    stream; here whitespace in the arguments passes as sent.)
//! 5. On `finish_reason`: calls still held are started, the open block is closed and
//!    `message_delta` is held until the usage-only chunk (`choices` empty, missing or null)
//!    arrives, because OpenAI-style servers send usage after the finish. Then `message_delta`
//!    (stop reason, matched stop sequence, full usage) and `message_stop`. `[DONE]` or
//!    end-of-stream without a usage chunk releases it with the usage known so far.
//!    `message_delta.usage.cost` is that usage's charge, the ledger row's (the stream core's
//!    [`Billed`]); `message_start`'s usage has no cost. Quipu never writes `[DONE]`. A call
//!    whose arguments are still incomplete at the finish is an error instead: with `finish_reason` `length`, a 400-class `invalid_request_error` saying
//!    `max_tokens` was reached inside the call; otherwise the malformed-arguments error.
//! 6. Failure — a mid-stream `{"error":…}`, an unreadable chunk, malformed tool arguments, a
//!    stream that ends before any finish reason, or [`on_failure`] — writes one `event:
//!    error` frame and ends the stream; nothing else is closed or sent (the vendor does the
//!    same, and the SDKs raise on it). An error that comes *with* the finish (`finish_reason`
//!    `abort`/`error`/unknown, incomplete tool arguments) is held like `message_delta`: the
//!    usage chunk that follows is read first, so the tokens are metered, then the error is
//!    written.
//!
//! Points 5 and 6 (the held finish, the end, the error, metering) are the stream core's
//! ([`crate::translate::stream_core`]); this module writes the events.
//!
//! [`on_failure`]: crate::translate::StreamTranslator::on_failure
//! [`ObjectScanner`]: crate::translate::json_scan::ObjectScanner

use super::response::{client_tool_name, minted_tool_id};
use crate::error::{ApiError, ClientFormat};
use crate::protocol::anthropic_out::{
    BlockDelta, BlockStart, EmptyObject, MessageDelta, MessageId, MessageKind, MessageStart, Role,
    StreamEvent, UsageOut,
};
use crate::protocol::upstream::ChunkChoice;
use crate::translate::chunk_parts::{self, ChunkParts};
use crate::translate::common::finish::{incomplete_tool_arguments, stop_reason, StopReason};
use crate::translate::stream_core::{Billed, Core, Stream, StreamFormat};
use crate::translate::tool_calls::{CallBlocks, ToolCalls, Whitespace};
use crate::translate::ResponseContext;
use crate::usage::Usage;

/// The block currently open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Thinking,
    Text,
    /// A tool call, by its slot in `calls`.
    Tool(usize),
}

pub use crate::translate::tool_calls::MAX_HELD_ARGUMENTS;

/// The error for arguments of a call whose block was closed early (module docs, 4).
const CLOSED_EARLY: &str = "the model server sent tool-call arguments after the call's block had to be closed (interleaved with other output); the call's input would be incomplete";

/// What `message_delta` will say once usage is known.
#[derive(Debug)]
pub struct Held {
    stop: StopReason,
    stop_sequence: Option<String>,
}

/// The messages-format stream translator (see the module docs): [`MessagesWriter`] run by
/// the stream core.
pub type MessagesStream = Stream<MessagesWriter>;

impl MessagesStream {
    pub fn new(ctx: ResponseContext) -> Self {
        Stream::with(MessagesWriter {
            ctx,
            started: false,
            open: Open::None,
            open_index: 0,
            next_index: 0,
            calls: ToolCalls::new(Whitespace::SkipBlankLead),
        })
    }
}

/// What the messages format writes of a stream: its events, its blocks.
pub struct MessagesWriter {
    ctx: ResponseContext,
    started: bool,
    open: Open,
    /// Index of the open block (valid while `open != None`).
    open_index: u32,
    next_index: u32,
    calls: ToolCalls,
}

impl MessagesWriter {
    /// Writes `message_start` once, with the usage the upstream has reported so far (vLLM's
    /// continuous usage stats put the prompt's count on the first chunk), else zeros.
    fn ensure_started(&mut self, out: &mut Vec<u8>, usage: Option<&Usage>) {
        if self.started {
            return;
        }
        self.started = true;
        let zero = Usage::default();
        StreamEvent::MessageStart {
            message: MessageStart {
                id: MessageId(&self.ctx.request_id),
                kind: MessageKind::Message,
                role: Role::Assistant,
                model: &self.ctx.client_model,
                content: [],
                stop_reason: None,
                stop_sequence: None,
                usage: UsageOut::from(usage.unwrap_or(&zero)),
            },
        }
        .write(out);
    }

    fn close_block(&mut self, out: &mut Vec<u8>) {
        if self.open == Open::None {
            return;
        }
        if let Open::Tool(slot) = self.open {
            self.calls.close(slot);
        }
        StreamEvent::ContentBlockStop {
            index: self.open_index,
        }
        .write(out);
        self.open = Open::None;
    }

    /// Closes the open block and makes `kind` the open one; returns its index.
    fn next_block(&mut self, kind: Open, out: &mut Vec<u8>) -> u32 {
        self.close_block(out);
        self.open = kind;
        self.open_index = self.next_index;
        self.next_index = self.next_index.saturating_add(1);
        self.open_index
    }

    /// [`Self::next_block`], and its `content_block_start`.
    fn open_block(&mut self, kind: Open, block: BlockStart<'_>, out: &mut Vec<u8>) {
        let index = self.next_block(kind, out);
        StreamEvent::ContentBlockStart {
            index,
            content_block: block,
        }
        .write(out);
    }

    /// A `content_block_delta` for the open block.
    fn delta(&self, delta: BlockDelta<'_>, out: &mut Vec<u8>) {
        StreamEvent::ContentBlockDelta {
            index: self.open_index,
            delta,
        }
        .write(out);
    }
}

impl CallBlocks for MessagesWriter {
    const CLOSED_EARLY: &'static str = CLOSED_EARLY;

    fn calls(&mut self) -> &mut ToolCalls {
        &mut self.calls
    }

    fn open_call(&self) -> Option<usize> {
        match self.open {
            Open::Tool(slot) => Some(slot),
            _ => None,
        }
    }

    /// An `input_json_delta` of the open block.
    fn arguments(&mut self, fragment: &str, out: &mut Vec<u8>) {
        self.delta(
            BlockDelta::InputJsonDelta {
                partial_json: fragment,
            },
            out,
        );
    }

    /// Opens call `slot`'s block and writes the arguments held for it.
    fn start_call(&mut self, slot: usize, out: &mut Vec<u8>) {
        let index = self.next_block(Open::Tool(slot), out);
        let request_id = &self.ctx.request_id;
        let Some(started) = self.calls.start(slot, || minted_tool_id(request_id, slot)) else {
            return;
        };
        StreamEvent::ContentBlockStart {
            index,
            content_block: BlockStart::ToolUse {
                id: started.id,
                name: client_tool_name(&self.ctx.tool_name_map, started.name),
                input: EmptyObject {},
            },
        }
        .write(out);
        let pending = started.pending;
        if !pending.is_empty() {
            self.arguments(&pending, out);
        }
    }
}

impl StreamFormat for MessagesWriter {
    type Held = Held;
    const FORMAT: ClientFormat = ClientFormat::Messages;
    const PINGS: bool = true;

    fn context(&self) -> &ResponseContext {
        &self.ctx
    }

    fn chunk(
        &mut self,
        core: &mut Core<Held>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        chunk_parts::walk(self, core, data, out)
    }

    /// `message_delta` with the held stop reason and the usage known, then `message_stop`.
    fn complete(&mut self, held: Held, billed: Billed, out: &mut Vec<u8>) {
        StreamEvent::MessageDelta {
            delta: MessageDelta {
                stop_reason: held.stop,
                stop_sequence: held.stop_sequence.as_deref(),
            },
            usage: UsageOut::with_cost(&billed.usage, billed.cost),
        }
        .write(out);
        StreamEvent::MessageStop.write(out);
    }

    /// `message_start` if the upstream has sent nothing yet, then a `ping`.
    fn idle(&mut self, out: &mut Vec<u8>) {
        self.start(None, out);
        StreamEvent::Ping.write(out);
    }
}

impl ChunkParts for MessagesWriter {
    fn start(&mut self, usage: Option<&Usage>, out: &mut Vec<u8>) {
        self.ensure_started(out, usage);
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>) {
        if self.open != Open::Thinking {
            let empty = BlockStart::Thinking {
                thinking: "",
                signature: "",
            };
            self.open_block(Open::Thinking, empty, out);
        }
        self.delta(BlockDelta::ThinkingDelta { thinking: text }, out);
    }

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if self.open != Open::Text {
            self.open_block(Open::Text, BlockStart::Text { text: "" }, out);
        }
        self.delta(BlockDelta::TextDelta { text }, out);
    }

    /// The finish chunk: hold `message_delta`, or the error the finish amounts to.
    fn finish(
        &mut self,
        choice: &ChunkChoice<'_>,
        finish: &str,
        out: &mut Vec<u8>,
    ) -> Result<Held, ApiError> {
        let had_tools = !self.calls.is_empty();
        let matched = choice.matched_stop_string();
        let stop = stop_reason(Some(finish), matched, had_tools)?;
        self.start_waiting(out);
        self.close_block(out);
        if self.calls.any_partial() {
            return Err(incomplete_tool_arguments(finish));
        }
        let stop_sequence = match stop {
            StopReason::StopSequence => matched.map(str::to_owned),
            _ => None,
        };
        Ok(Held {
            stop,
            stop_sequence,
        })
    }
}
