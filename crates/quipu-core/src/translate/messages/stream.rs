//! The streaming translator: upstream chat-completion chunks in, messages-format events out
//! (reference §4.6). Incremental — each upstream payload is parsed once, borrowed, and turned
//! into frames immediately; nothing earlier is kept except a few counters, the open block and
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
//!    with an error rather than truncating the call's input silently.
//! 5. On `finish_reason`: calls still held are started, the open block is closed and
//!    `message_delta` is held until the usage-only chunk (`choices` empty, missing or null)
//!    arrives, because OpenAI-style servers send usage after the finish. Then `message_delta`
//!    (stop reason, matched stop sequence, full usage) and `message_stop`. `[DONE]` or
//!    end-of-stream without a usage chunk releases it with the usage known so far. Quipu never
//!    writes `[DONE]`. A call whose arguments are still incomplete at the finish is an error
//!    instead: with `finish_reason` `length`, a 400-class `invalid_request_error` saying
//!    `max_tokens` was reached inside the call; otherwise the malformed-arguments error.
//! 6. Failure — a mid-stream `{"error":…}`, an unreadable chunk, malformed tool arguments, a
//!    stream that ends before any finish reason, or [`on_failure`] — writes one `event:
//!    error` frame and ends the stream; nothing else is closed or sent (the vendor does the
//!    same, and the SDKs raise on it). An error that comes *with* the finish (`finish_reason`
//!    `abort`/`error`/unknown, incomplete tool arguments) is held like `message_delta`: the
//!    usage chunk that follows is read first, so the tokens are metered, then the error is
//!    written.
//!
//! [`on_failure`]: StreamTranslator::on_failure

use super::response::{
    client_tool_name, incomplete_tool_arguments, malformed_tool_arguments, minted_tool_id,
    stop_reason, upstream_error, StopReason,
};
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::protocol::anthropic_out::{
    BlockDelta, BlockStart, EmptyObject, MessageDelta, MessageId, MessageKind, MessageStart, Role,
    StreamEvent, UsageOut,
};
use crate::protocol::upstream::{ChatChunk, ChunkChoice, ToolCallDelta};
use crate::translate::json_scan::{ObjectScanner, Scan};
use crate::translate::{
    json_failure, malformed_stream, scrub_error, ResponseContext, StreamEnd, StreamTranslator,
};
use crate::usage::Usage;

/// The block currently open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Thinking,
    Text,
    /// A tool call, by its position in `tools`.
    Tool(usize),
}

/// Most bytes of tool arguments held back for calls waiting for their block (see the module
/// docs). A response is at most 8192 tokens, so real interleaved calls stay far below it.
pub const MAX_HELD_ARGUMENTS: usize = 1024 * 1024;

/// Where a tool call's block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallState {
    /// Not started: no name yet, or another call's block is open.
    Waiting,
    Open,
    Closed,
}

/// One upstream tool call.
#[derive(Debug)]
struct ToolCall {
    /// The upstream's `index` for it.
    index: u32,
    id: String,
    /// `id` was minted by Quipu: an id the upstream sends later is not a new call.
    minted: bool,
    name: String,
    state: CallState,
    /// Argument fragments received before the block could start.
    pending: String,
    /// The arguments so far, checked incrementally.
    args: ObjectScanner,
}

/// What `message_delta` will say once usage is known.
#[derive(Debug)]
struct Held {
    stop: StopReason,
    stop_sequence: Option<String>,
}

/// The messages-format stream translator (see the module docs).
pub struct MessagesStream {
    ctx: ResponseContext,
    started: bool,
    open: Open,
    /// Index of the open block (valid while `open != None`).
    open_index: u32,
    next_index: u32,
    tools: Vec<ToolCall>,
    last_tool_index: u32,
    held: Option<Held>,
    /// An error that came with the finish, written once usage is known (module docs, 6).
    held_error: Option<ApiError>,
    /// Bytes in the `pending` buffers of all calls.
    held_bytes: usize,
    usage: Option<Usage>,
    /// Non-empty fragments received since the last chunk that carried usage: the fallback
    /// count of output tokens the upstream has not reported.
    fragments_since_usage: u64,
    end: StreamEnd,
    error: Option<ApiError>,
}

impl MessagesStream {
    pub fn new(ctx: ResponseContext) -> Self {
        MessagesStream {
            ctx,
            started: false,
            open: Open::None,
            open_index: 0,
            next_index: 0,
            tools: Vec::new(),
            last_tool_index: 0,
            held: None,
            held_error: None,
            held_bytes: 0,
            usage: None,
            fragments_since_usage: 0,
            end: StreamEnd::Open,
            error: None,
        }
    }

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
            if let Some(t) = self.tools.get_mut(slot) {
                t.state = CallState::Closed;
            }
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

    fn thinking(&mut self, text: &str, out: &mut Vec<u8>) {
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

    fn input_json(&self, fragment: &str, out: &mut Vec<u8>) {
        self.delta(
            BlockDelta::InputJsonDelta {
                partial_json: fragment,
            },
            out,
        );
    }

    fn start_tool(&mut self, slot: usize, out: &mut Vec<u8>) {
        let index = self.next_block(Open::Tool(slot), out);
        let Some(t) = self.tools.get_mut(slot) else {
            return;
        };
        if t.id.is_empty() {
            t.id = minted_tool_id(&self.ctx.request_id, slot);
            t.minted = true;
        }
        t.state = CallState::Open;
        StreamEvent::ContentBlockStart {
            index,
            content_block: BlockStart::ToolUse {
                id: &t.id,
                name: client_tool_name(&self.ctx.tool_name_map, &t.name),
                input: EmptyObject {},
            },
        }
        .write(out);
        let pending = std::mem::take(&mut t.pending);
        self.held_bytes = self.held_bytes.saturating_sub(pending.len());
        if !pending.is_empty() {
            self.input_json(&pending, out);
        }
    }

    /// Whether a waiting call may start now: it has a name, and no other call's block is
    /// open with arguments still to come.
    fn may_start(&self, slot: usize) -> bool {
        let named = self.tools.get(slot).is_some_and(|t| !t.name.is_empty());
        let free = match self.open {
            Open::Tool(s) if s != slot => self
                .tools
                .get(s)
                .is_none_or(|t| t.args.status() == Scan::Complete),
            _ => true,
        };
        named && free
    }

    /// Once the open call's arguments are complete, starts the calls held behind it, in order.
    fn advance(&mut self, out: &mut Vec<u8>) {
        while let Open::Tool(s) = self.open {
            if self
                .tools
                .get(s)
                .is_none_or(|t| t.args.status() != Scan::Complete)
            {
                return;
            }
            let next = self
                .tools
                .iter()
                .position(|t| t.state == CallState::Waiting && !t.name.is_empty());
            match next {
                Some(w) => self.start_tool(w, out),
                None => return,
            }
        }
    }

    /// One entry of `delta.tool_calls`.
    fn tool_delta(&mut self, tc: &ToolCallDelta<'_>, out: &mut Vec<u8>) -> Result<(), ApiError> {
        let index = tc.index.unwrap_or(self.last_tool_index);
        self.last_tool_index = index;
        let id = tc.id.as_deref().filter(|s| !s.is_empty());
        let (name, args) = match &tc.function {
            Some(f) => (
                f.name.as_deref().filter(|s| !s.is_empty()),
                f.arguments.as_deref().filter(|s| !s.is_empty()),
            ),
            None => (None, None),
        };
        let known = self.tools.iter().rposition(|t| t.index == index);
        let slot = match known {
            Some(s)
                if id.is_none_or(|id| {
                    let t = &self.tools[s];
                    t.id.is_empty() || t.minted || t.id == id
                }) =>
            {
                s
            }
            _ => {
                self.tools.push(ToolCall {
                    index,
                    id: String::new(),
                    minted: false,
                    name: String::new(),
                    state: CallState::Waiting,
                    pending: String::new(),
                    args: ObjectScanner::new(),
                });
                self.tools.len() - 1
            }
        };
        let Some(t) = self.tools.get_mut(slot) else {
            return Ok(());
        };
        if let (true, Some(id)) = (t.id.is_empty(), id) {
            id.clone_into(&mut t.id);
        }
        if let (true, Some(name)) = (t.name.is_empty(), name) {
            name.clone_into(&mut t.name);
        }
        let was_complete = t.args.status() == Scan::Complete;
        // Leading whitespace carries nothing, and a client's JSON accumulator may choke on it.
        let args = match args {
            Some(a) => match t.args.feed(a) {
                Scan::Invalid => return Err(malformed_tool_arguments()),
                Scan::Empty => None,
                _ => Some(a),
            },
            None => None,
        };
        match t.state {
            CallState::Waiting => {
                if let Some(a) = args {
                    if self.held_bytes + a.len() > MAX_HELD_ARGUMENTS {
                        return Err(ApiError::new(
                            ErrorKind::Upstream,
                            "the model server interleaved parallel tool calls beyond what the gateway can hold back",
                        ));
                    }
                    self.held_bytes += a.len();
                    t.pending.push_str(a);
                }
                if self.may_start(slot) {
                    self.start_tool(slot, out);
                }
            }
            CallState::Open => {
                if let Some(a) = args {
                    self.input_json(a, out);
                }
            }
            // Blocks do not reopen. Whitespace after a complete object changes nothing; any
            // other fragment would be lost, so the stream fails loudly instead.
            CallState::Closed => {
                if args.is_some_and(|a| !(was_complete && a.trim_ascii().is_empty())) {
                    return Err(ApiError::new(
                        ErrorKind::Upstream,
                        "the model server sent tool-call arguments after the call's block had to be closed (interleaved with other output); the call's input would be incomplete",
                    ));
                }
            }
        }
        self.advance(out);
        Ok(())
    }

    /// Starts (and so flushes) tool calls still waiting — for a name, or for the open call to
    /// complete: the generation is over.
    fn flush_pending_tools(&mut self, out: &mut Vec<u8>) {
        for slot in 0..self.tools.len() {
            if self.tools[slot].state == CallState::Waiting {
                self.start_tool(slot, out);
            }
        }
    }

    /// The finish chunk: hold `message_delta`, or the error the finish amounts to.
    fn finish(&mut self, choice: &ChunkChoice<'_>, finish: &str, out: &mut Vec<u8>) {
        let had_tools = !self.tools.is_empty();
        let matched = choice.matched_stop_string();
        let stop = match stop_reason(Some(finish), matched, had_tools) {
            Ok(stop) => stop,
            Err(e) => {
                self.held_error = Some(e);
                return;
            }
        };
        self.flush_pending_tools(out);
        self.close_block(out);
        if self.tools.iter().any(|t| t.args.status() == Scan::Partial) {
            self.held_error = Some(incomplete_tool_arguments(finish));
            return;
        }
        let stop_sequence = match stop {
            StopReason::StopSequence => matched.map(str::to_owned),
            _ => None,
        };
        self.held = Some(Held {
            stop,
            stop_sequence,
        });
    }

    fn translate(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), ApiError> {
        let chunk: ChatChunk<'_> = serde_json::from_slice(data)
            .map_err(|e| malformed_stream(&json_failure("a chunk", &e)))?;
        if chunk.error.is_some() || chunk.object.as_deref() == Some("error") {
            return Err(upstream_error(data, &self.ctx));
        }
        let chunk_usage = chunk.usage();
        self.ensure_started(out, chunk_usage.as_ref());
        let choices = chunk.choices.as_deref().unwrap_or_default();
        let mut fragments = 0u64;
        let mut result = Ok(());
        // After the finish, only usage is read: the generation is over.
        let over = self.held.is_some() || self.held_error.is_some();
        let choice = match over {
            false => choices.iter().find(|c| c.index == 0),
            true => None,
        };
        if let Some(choice) = choice {
            if let Some(d) = &choice.delta {
                if let Some(r) = d.reasoning_text() {
                    self.thinking(r, out);
                    fragments += 1;
                }
                if let Some(t) = d.content.as_deref().filter(|t| !t.is_empty()) {
                    self.text(t, out);
                    fragments += 1;
                }
                for tc in d.tool_calls.iter().flatten() {
                    let carries = tc
                        .function
                        .as_ref()
                        .and_then(|f| f.arguments.as_deref())
                        .is_some_and(|a| !a.is_empty());
                    fragments += u64::from(carries);
                    if let Err(e) = self.tool_delta(tc, out) {
                        result = Err(e);
                        break;
                    }
                }
            }
            if let (Ok(()), Some(finish)) = (&result, choice.finish_reason.as_deref()) {
                self.finish(choice, finish, out);
            }
        }
        match chunk_usage {
            Some(u) => {
                self.usage = Some(u);
                self.fragments_since_usage = 0;
            }
            None => {
                self.fragments_since_usage = self.fragments_since_usage.saturating_add(fragments)
            }
        }
        result?;
        if choices.is_empty() && chunk.usage.is_some() {
            if let Some(e) = self.held_error.take() {
                return Err(e);
            }
            if self.held.is_some() {
                self.complete(out);
            }
        }
        Ok(())
    }

    /// `message_delta` with the held stop reason and the usage known, then `message_stop`.
    fn complete(&mut self, out: &mut Vec<u8>) {
        let Some(held) = self.held.take() else {
            return;
        };
        StreamEvent::MessageDelta {
            delta: MessageDelta {
                stop_reason: held.stop,
                stop_sequence: held.stop_sequence.as_deref(),
            },
            usage: UsageOut::from(&self.usage()),
        }
        .write(out);
        StreamEvent::MessageStop.write(out);
        self.end = StreamEnd::Complete;
    }

    fn fail(&mut self, error: ApiError, out: &mut Vec<u8>) {
        let error = scrub_error(error, &self.ctx);
        error.write_sse(ClientFormat::Messages, &self.ctx.request_id, out);
        self.error = Some(error);
        self.end = StreamEnd::Failed;
    }
}

impl StreamTranslator for MessagesStream {
    fn on_event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.end != StreamEnd::Open {
            return;
        }
        if data.trim_ascii() == b"[DONE]" {
            self.on_end(out);
            return;
        }
        if let Err(e) = self.translate(data, out) {
            self.fail(e, out);
        }
    }

    fn on_end(&mut self, out: &mut Vec<u8>) {
        if self.end != StreamEnd::Open {
            return;
        }
        if let Some(e) = self.held_error.take() {
            self.fail(e, out);
        } else if self.held.is_some() {
            self.complete(out);
        } else {
            self.fail(
                malformed_stream("the stream ended before the model finished"),
                out,
            );
        }
    }

    fn on_failure(&mut self, error: &ApiError, out: &mut Vec<u8>) {
        if self.end == StreamEnd::Open {
            // An error held from the finish is what went wrong first.
            let e = self.held_error.take().unwrap_or_else(|| error.clone());
            self.fail(e, out);
        }
    }

    fn on_idle(&mut self, out: &mut Vec<u8>) {
        if self.end != StreamEnd::Open {
            return;
        }
        self.ensure_started(out, None);
        StreamEvent::Ping.write(out);
    }

    fn usage(&self) -> Usage {
        let reported = self.usage.unwrap_or_default();
        Usage {
            completion_tokens: reported
                .completion_tokens
                .saturating_add(self.fragments_since_usage),
            ..reported
        }
    }

    fn end(&self) -> StreamEnd {
        self.end
    }

    fn error(&self) -> Option<&ApiError> {
        self.error.as_ref()
    }
}
