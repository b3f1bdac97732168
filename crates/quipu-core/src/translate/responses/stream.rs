//! The streaming translator: upstream chat-completion chunks in, the Responses API's events
//! out. Incremental — each upstream payload is parsed once, borrowed, and turned into events
//! at once; every delta goes out with the chunk that carried it.
//!
//! Output: `event: <type>\ndata: {"type":"<type>","sequence_number":N,…}\n\n`, `N` counting
//! from 0 without a gap:
//!
//! 1. `response.created` then `response.in_progress`, on the first chunk, each with the
//!    response object (`status: in_progress`, no output, `usage: null`).
//! 2. Output items in order, one open at a time, `output_index` from 0. Per chunk the delta is
//!    read in the order reasoning → content → tool calls, as the messages format reads it.
//!    - reasoning: `response.output_item.added` (a `reasoning` item), `response.content_part.added`
//!      (a `reasoning_text` part), `response.reasoning_text.delta` per fragment; when the item
//!      closes, `response.reasoning_text.done`, `response.content_part.done`,
//!      `response.output_item.done` (the whole item).
//!    - text: the same with a `message` item, an `output_text` part and
//!      `response.output_text.delta` / `.done`.
//!    - a tool call: `response.output_item.added` (a `function_call` item with its `call_id`
//!      and the client's `name` and `namespace`) once its name is known, then
//!      `response.function_call_arguments.delta` per fragment, `.done` and
//!      `response.output_item.done` when it closes (`{}` as a last delta when the call had no
//!      arguments). Which fragment belongs to which call, interleaved parallel calls held back
//!      (bounded by [`MAX_HELD_ARGUMENTS`]) until the open call's arguments are complete, and
//!      the incremental check of the arguments ([`ObjectScanner`]): exactly as the messages
//!      stream does it (its module docs, 2–4; both drive [`tool_calls`]), except that
//!      whitespace around the arguments object is dropped, so `arguments` equals the
//!      non-streaming translation's.
//! 3. On `finish_reason`: held calls are started, the open item is closed, and the end is held
//!    until the usage-only chunk (OpenAI-style servers send usage after the finish), then
//!    `response.completed` — or `response.incomplete` (`length` → `max_output_tokens`, the
//!    last item `incomplete`; `content_filter`) — with the whole response object: every output
//!    item and the usage. `[DONE]` or the end of the stream without a usage chunk releases it
//!    with the usage known so far. The usage carries its `cost`, the ledger row's charge (the
//!    stream core's [`Billed`]); `response.failed` (below) carries the usage metered and its
//!    cost the same way. A call cut off inside its arguments by `length` is an
//!    `incomplete` item; with another finish reason its arguments are malformed (below).
//! 4. Failure — a mid-stream `{"error":…}`, an unreadable chunk, malformed tool arguments, a
//!    finish the upstream gives for a failed generation (`abort`, `error`, unknown), a stream
//!    that ends before any finish, or [`on_failure`] — writes an `error` event (`code`,
//!    `message`, `param`) then `response.failed` (the object with `status: failed`, its
//!    `error`, the items finished so far), and ends the stream. An error that comes with the
//!    finish is held like the end, so the usage chunk after it is still metered.
//!
//! What is kept: the open item's text or arguments (for its `.done` events) and the finished
//! items (for `response.completed`, which carries them all, and for storage) — the reply
//! itself, which the protocol sends again at the end; never anything to re-read per chunk.
//!
//! The held end, the error's place and metering are the stream core's
//! ([`crate::translate::stream_core`]); this module writes the events.
//!
//! [`on_failure`]: crate::translate::StreamTranslator::on_failure
//! [`ObjectScanner`]: crate::translate::json_scan::ObjectScanner
//! [`tool_calls`]: crate::translate::tool_calls

use super::object::{
    reasoning_tokens, write_call_item, write_item_id, write_message_item, write_object,
    write_reasoning_item, write_reasoning_part, write_text_part, ItemStatus, Status, Totals,
};
use super::response::status_of;
use super::ResponsesContext;
use crate::error::{write_json_str, ApiError, ClientFormat};
use crate::protocol::upstream::{ChatChunk, ChunkChoice};
use crate::translate::chunk_parts::{self, ChunkParts};
use crate::translate::common::finish::{incomplete_tool_arguments, stop_reason, StopReason};
use crate::translate::json_scan::Scan;
use crate::translate::stream_core::{Billed, Core, Stream, StreamFormat};
use crate::translate::tool_calls::{CallBlocks, ToolCalls, Whitespace};
use crate::translate::ResponseContext;
use crate::usage::Usage;

pub use crate::translate::tool_calls::MAX_HELD_ARGUMENTS;

/// The error for arguments of a call whose item was closed early.
const CLOSED_EARLY: &str = "the model server sent tool-call arguments after the call's item had to be closed (interleaved with other output); the call's arguments would be incomplete";

/// The item currently open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Reasoning,
    Message,
    /// A tool call, by its slot in `calls`.
    Call(usize),
}

/// The Responses API stream translator (see the module docs): [`ResponsesWriter`] run by the
/// stream core.
pub type ResponsesStream = Stream<ResponsesWriter>;

impl ResponsesStream {
    pub fn new(ctx: ResponsesContext) -> Self {
        Stream::with(ResponsesWriter {
            ctx,
            seq: 0,
            started: false,
            open: Open::None,
            open_index: 0,
            next_index: 0,
            text: String::new(),
            output: Vec::new(),
            calls: ToolCalls::new(Whitespace::Trim),
            reported_reasoning: None,
            reasoning_bytes: 0,
            output_bytes: 0,
            object: None,
        })
    }
}

/// What the Responses API writes of a stream: its numbered events, its items.
pub struct ResponsesWriter {
    ctx: ResponsesContext,
    seq: u64,
    started: bool,
    open: Open,
    /// `output_index` of the open item.
    open_index: u32,
    next_index: u32,
    /// The open item's text so far: reasoning, message text, or a call's arguments.
    text: String,
    /// Finished items, comma-separated.
    output: Vec<u8>,
    calls: ToolCalls,
    reported_reasoning: Option<u64>,
    reasoning_bytes: usize,
    output_bytes: usize,
    /// The final response object, when it is to be stored.
    object: Option<Vec<u8>>,
}

#[inline]
fn frame_close(out: &mut Vec<u8>) {
    out.extend_from_slice(b"}\n\n");
}

impl ResponsesWriter {
    /// `event: <name>\ndata: {"type":"<name>","sequence_number":N` — the caller writes the
    /// rest of the object, then [`frame_close`].
    fn event(&mut self, out: &mut Vec<u8>, name: &str) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\ndata: {\"type\":\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\",\"sequence_number\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.seq).as_bytes());
        self.seq += 1;
    }

    /// `,"item_id":"…","output_index":N` of the open item.
    fn item_ref(&self, out: &mut Vec<u8>, prefix: &str) {
        out.extend_from_slice(b",\"item_id\":");
        write_item_id(out, prefix, &self.ctx, self.open_index);
        out.extend_from_slice(b",\"output_index\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.open_index).as_bytes());
    }

    fn totals(&self, billed: Billed) -> Totals {
        let usage = billed.usage;
        Totals {
            usage,
            reasoning_tokens: reasoning_tokens(
                usage.completion_tokens,
                self.reported_reasoning,
                self.reasoning_bytes,
                self.output_bytes,
            ),
            cost: billed.cost,
        }
    }

    /// A lifecycle event carrying the response object; `billed` is the final usage and its
    /// cost (`None` while the response is in progress: `usage: null`).
    fn lifecycle(
        &mut self,
        out: &mut Vec<u8>,
        name: &str,
        status: Status,
        error: Option<&ApiError>,
        billed: Option<Billed>,
    ) {
        self.event(out, name);
        out.extend_from_slice(b",\"response\":");
        let at = out.len();
        let totals = billed.map(|b| self.totals(b));
        write_object(out, &self.ctx, status, error, &self.output, totals.as_ref());
        if self.ctx.keep_object && status != Status::InProgress {
            self.object = Some(out[at..].to_vec());
        }
        frame_close(out);
    }

    /// `response.created` and `response.in_progress`, once.
    fn ensure_started(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        self.lifecycle(out, "response.created", Status::InProgress, None, None);
        self.lifecycle(out, "response.in_progress", Status::InProgress, None, None);
    }

    /// `response.output_item.added` for a new item; the caller writes the item, then closes.
    fn add_item(&mut self, kind: Open, out: &mut Vec<u8>) {
        self.close_item(out, false);
        self.open = kind;
        self.open_index = self.next_index;
        self.next_index = self.next_index.saturating_add(1);
        self.text.clear();
        self.event(out, "response.output_item.added");
        out.extend_from_slice(b",\"output_index\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.open_index).as_bytes());
        out.extend_from_slice(b",\"item\":");
    }

    /// Appends the finished item to `output` and writes `response.output_item.done` with it.
    fn item_done(
        &mut self,
        out: &mut Vec<u8>,
        write: impl FnOnce(&ResponsesContext, &mut Vec<u8>),
    ) {
        if !self.output.is_empty() {
            self.output.push(b',');
        }
        let at = self.output.len();
        write(&self.ctx, &mut self.output);
        self.event(out, "response.output_item.done");
        out.extend_from_slice(b",\"output_index\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.open_index).as_bytes());
        out.extend_from_slice(b",\"item\":");
        out.extend_from_slice(&self.output[at..]);
        frame_close(out);
    }

    /// Closes the open item with its `.done` events. `last_of_incomplete`: the response is
    /// ending incomplete and this is its last item.
    fn close_item(&mut self, out: &mut Vec<u8>, last_of_incomplete: bool) {
        let index = self.open_index;
        let cut = |partial: bool| match last_of_incomplete || partial {
            true => ItemStatus::Incomplete,
            false => ItemStatus::Completed,
        };
        match self.open {
            Open::None => return,
            Open::Reasoning => {
                let text = std::mem::take(&mut self.text);
                self.event(out, "response.reasoning_text.done");
                self.item_ref(out, "rs");
                out.extend_from_slice(b",\"content_index\":0,\"text\":");
                write_json_str(out, &text);
                frame_close(out);
                self.event(out, "response.content_part.done");
                self.item_ref(out, "rs");
                out.extend_from_slice(b",\"content_index\":0,\"part\":");
                write_reasoning_part(out, Some(&text));
                frame_close(out);
                self.item_done(out, |ctx, o| {
                    write_reasoning_item(o, ctx, index, Some(&text), cut(false))
                });
                self.text = text;
            }
            Open::Message => {
                let text = std::mem::take(&mut self.text);
                self.event(out, "response.output_text.done");
                self.item_ref(out, "msg");
                out.extend_from_slice(b",\"content_index\":0,\"text\":");
                write_json_str(out, &text);
                out.extend_from_slice(b",\"logprobs\":[]");
                frame_close(out);
                self.event(out, "response.content_part.done");
                self.item_ref(out, "msg");
                out.extend_from_slice(b",\"content_index\":0,\"part\":");
                write_text_part(out, Some(&text));
                frame_close(out);
                self.item_done(out, |ctx, o| {
                    write_message_item(o, ctx, index, Some(&text), cut(false))
                });
                self.text = text;
            }
            Open::Call(slot) => {
                let Some(call) = self.calls.close(slot) else {
                    self.open = Open::None;
                    return;
                };
                let partial = call.status() == Scan::Partial;
                let (id, name) = (call.id().to_owned(), call.name().to_owned());
                let mut arguments = std::mem::take(&mut self.text);
                if arguments.is_empty() {
                    self.arguments_delta("{}", out);
                    arguments.push_str("{}");
                }
                self.event(out, "response.function_call_arguments.done");
                self.item_ref(out, "fc");
                out.extend_from_slice(b",\"arguments\":");
                write_json_str(out, &arguments);
                frame_close(out);
                let status = cut(partial);
                self.item_done(out, |ctx, o| {
                    write_call_item(o, ctx, index, Some(&id), &name, &arguments, status)
                });
                self.text = arguments;
            }
        }
        self.open = Open::None;
    }

    /// `response.function_call_arguments.delta` for the open call.
    fn arguments_delta(&mut self, fragment: &str, out: &mut Vec<u8>) {
        self.event(out, "response.function_call_arguments.delta");
        self.item_ref(out, "fc");
        out.extend_from_slice(b",\"delta\":");
        write_json_str(out, fragment);
        frame_close(out);
    }
}

impl CallBlocks for ResponsesWriter {
    const CLOSED_EARLY: &'static str = CLOSED_EARLY;

    fn calls(&mut self) -> &mut ToolCalls {
        &mut self.calls
    }

    fn open_call(&self) -> Option<usize> {
        match self.open {
            Open::Call(slot) => Some(slot),
            _ => None,
        }
    }

    /// Forwards a fragment of the open call's arguments.
    fn arguments(&mut self, fragment: &str, out: &mut Vec<u8>) {
        self.arguments_delta(fragment, out);
        self.text.push_str(fragment);
        self.output_bytes += fragment.len();
    }

    /// Adds call `slot`'s item and writes the arguments held for it.
    fn start_call(&mut self, slot: usize, out: &mut Vec<u8>) {
        self.add_item(Open::Call(slot), out);
        let index = self.open_index;
        let base = self.ctx.id_base();
        let Some(started) = self.calls.start(slot, || format!("call_{base}_{index}")) else {
            return;
        };
        write_call_item(
            out,
            &self.ctx,
            index,
            Some(started.id),
            started.name,
            "",
            ItemStatus::InProgress,
        );
        frame_close(out);
        let pending = started.pending;
        if !pending.is_empty() {
            self.arguments(&pending, out);
        }
    }
}

impl StreamFormat for ResponsesWriter {
    type Held = Status;
    const FORMAT: ClientFormat = ClientFormat::Responses;
    /// The Responses API has no keep-alive event: a silent stream just waits.
    const PINGS: bool = false;

    fn context(&self) -> &ResponseContext {
        &self.ctx.base
    }

    fn chunk(
        &mut self,
        core: &mut Core<Status>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        chunk_parts::walk(self, core, data, out)
    }

    /// `response.completed` or `response.incomplete`, with every item and the usage.
    fn complete(&mut self, status: Status, billed: Billed, out: &mut Vec<u8>) {
        let name = match status {
            Status::Incomplete(_) => "response.incomplete",
            Status::InProgress | Status::Completed | Status::Failed => "response.completed",
        };
        self.lifecycle(out, name, status, None, Some(billed));
    }

    /// An `error` event, then `response.failed` with the items finished so far and the usage
    /// metered, with its cost.
    fn write_error(&mut self, error: &ApiError, billed: Billed, out: &mut Vec<u8>) {
        self.ensure_started(out);
        self.event(out, "error");
        out.push(b',');
        error.write_responses_fields(out);
        frame_close(out);
        let failed = Status::Failed;
        self.lifecycle(out, "response.failed", failed, Some(error), Some(billed));
    }

    fn take_object(&mut self) -> Option<Vec<u8>> {
        self.object.take()
    }
}

impl ChunkParts for ResponsesWriter {
    fn start(&mut self, _usage: Option<&Usage>, out: &mut Vec<u8>) {
        self.ensure_started(out);
    }

    fn usage_reported(&mut self, chunk: &ChatChunk<'_>) {
        if let Some(r) = chunk.usage.as_ref().and_then(|u| u.reasoning_tokens()) {
            self.reported_reasoning = Some(r);
        }
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>) {
        if self.open != Open::Reasoning {
            self.add_item(Open::Reasoning, out);
            write_reasoning_item(
                out,
                &self.ctx,
                self.open_index,
                None,
                ItemStatus::InProgress,
            );
            frame_close(out);
            self.event(out, "response.content_part.added");
            self.item_ref(out, "rs");
            out.extend_from_slice(b",\"content_index\":0,\"part\":");
            write_reasoning_part(out, None);
            frame_close(out);
        }
        self.event(out, "response.reasoning_text.delta");
        self.item_ref(out, "rs");
        out.extend_from_slice(b",\"content_index\":0,\"delta\":");
        write_json_str(out, text);
        frame_close(out);
        self.text.push_str(text);
        self.reasoning_bytes += text.len();
        self.output_bytes += text.len();
    }

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if self.open != Open::Message {
            self.add_item(Open::Message, out);
            write_message_item(
                out,
                &self.ctx,
                self.open_index,
                None,
                ItemStatus::InProgress,
            );
            frame_close(out);
            self.event(out, "response.content_part.added");
            self.item_ref(out, "msg");
            out.extend_from_slice(b",\"content_index\":0,\"part\":");
            write_text_part(out, None);
            frame_close(out);
        }
        self.event(out, "response.output_text.delta");
        self.item_ref(out, "msg");
        out.extend_from_slice(b",\"content_index\":0,\"delta\":");
        write_json_str(out, text);
        out.extend_from_slice(b",\"logprobs\":[]");
        frame_close(out);
        self.text.push_str(text);
        self.output_bytes += text.len();
    }

    /// The finish chunk: close the items and hold the end (or the error the finish is).
    fn finish(
        &mut self,
        choice: &ChunkChoice<'_>,
        finish: &str,
        out: &mut Vec<u8>,
    ) -> Result<Status, ApiError> {
        let had_tools = !self.calls.is_empty();
        let stop = stop_reason(Some(finish), choice.matched_stop_string(), had_tools)?;
        if self.calls.any_partial() && stop != StopReason::MaxTokens {
            return Err(incomplete_tool_arguments(finish));
        }
        let status = status_of(stop);
        self.start_waiting(out);
        self.close_item(out, matches!(status, Status::Incomplete(_)));
        Ok(status)
    }
}
