//! The streaming translator: upstream chat-completion chunks in, messages-format events out
//! (reference §4.6). Incremental — each upstream payload is parsed once, borrowed, and turned
//! into frames immediately; nothing earlier is kept except a few counters, the open block and
//! one small record per tool call.
//!
//! Output, always `event: <name>\ndata: <json>\n\n` with `data.type == name`:
//!
//! 1. `message_start` (usage placeholders, all four keys zero) before anything else — on the
//!    first chunk, or on the first idle tick if the upstream is slow to start.
//! 2. Content blocks with dense indexes from 0, exactly one open at a time. Per chunk the
//!    delta is read in the order reasoning → content → tool calls (one chunk may carry all of
//!    them, the finish chunk included). Empty strings open nothing (vLLM's first chunk has
//!    `content:""`). A tool call starts a block on a new `index`, or on a new non-empty `id`
//!    at a known index (lmdeploy#3412); a re-sent id/name at the same index (vllm#31438) does
//!    not. The block starts once the name is known (a minted `toolu_…` id stands in for a
//!    missing one); argument fragments that arrive before the name are held until it starts,
//!    every later fragment becomes one `input_json_delta`, unbuffered.
//! 3. On `finish_reason`: the open block is closed and `message_delta` is held until the
//!    usage-only chunk (`choices` empty, missing or null) arrives, because OpenAI-style
//!    servers send usage after the finish. Then `message_delta` (stop reason, matched stop
//!    sequence, full usage) and `message_stop`. `[DONE]` or end-of-stream without a usage
//!    chunk releases it with the usage known so far. Quipu never writes `[DONE]`.
//! 4. Failure — a mid-stream `{"error":…}`, `finish_reason` `abort`/`error`, an unreadable
//!    chunk, a stream that ends before any finish reason, or [`on_failure`] — writes one
//!    `event: error` frame and ends the stream; nothing else is closed or sent (the vendor
//!    does the same, and the SDKs raise on it).
//!
//! [`on_failure`]: StreamTranslator::on_failure

use super::response::{
    client_tool_name, json_inner, minted_tool_id, push_u64, stop_reason, upstream_error,
    write_usage, StopReason,
};
use crate::error::{write_json_str, ApiError, ClientFormat};
use crate::protocol::upstream::{ChatChunk, ToolCallDelta};
use crate::translate::{malformed_stream, ResponseContext, StreamEnd, StreamTranslator};
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

/// One upstream tool call.
#[derive(Debug)]
struct ToolCall {
    /// The upstream's `index` for it.
    index: u32,
    id: String,
    /// `id` was minted by Quipu: an id the upstream sends later is not a new call.
    minted: bool,
    name: String,
    started: bool,
    /// Argument fragments received before the block could start.
    pending: String,
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
    usage: Option<Usage>,
    /// Non-empty fragments received since the last chunk that carried usage: the fallback
    /// count of output tokens the upstream has not reported.
    fragments_since_usage: u64,
    end: StreamEnd,
    error: Option<ApiError>,
}

/// `event: <name>\ndata: {"type":"<name>"` — the caller writes the rest of the object.
#[inline]
fn frame_open(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: {\"type\":\"");
    out.extend_from_slice(name.as_bytes());
    out.push(b'"');
}

#[inline]
fn frame_close(out: &mut Vec<u8>) {
    out.extend_from_slice(b"}\n\n");
}

#[inline]
fn write_index(out: &mut Vec<u8>, index: u32) {
    out.extend_from_slice(b",\"index\":");
    push_u64(out, u64::from(index));
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
            usage: None,
            fragments_since_usage: 0,
            end: StreamEnd::Open,
            error: None,
        }
    }

    fn ensure_started(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        frame_open(out, "message_start");
        out.extend_from_slice(b",\"message\":{\"id\":\"msg_");
        out.extend_from_slice(json_inner(&self.ctx.request_id).as_bytes());
        out.extend_from_slice(b"\",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        write_json_str(out, &self.ctx.client_model);
        out.extend_from_slice(
            b",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":",
        );
        write_usage(out, &Usage::default());
        out.push(b'}');
        frame_close(out);
    }

    fn close_block(&mut self, out: &mut Vec<u8>) {
        if self.open == Open::None {
            return;
        }
        frame_open(out, "content_block_stop");
        write_index(out, self.open_index);
        frame_close(out);
        self.open = Open::None;
    }

    /// Closes the open block and writes the start of a new one up to `"content_block":`.
    fn open_block(&mut self, kind: Open, out: &mut Vec<u8>) {
        self.close_block(out);
        self.open = kind;
        self.open_index = self.next_index;
        self.next_index += 1;
        frame_open(out, "content_block_start");
        write_index(out, self.open_index);
        out.extend_from_slice(b",\"content_block\":");
    }

    fn delta_open(&self, out: &mut Vec<u8>, delta_type: &str, field: &str) {
        frame_open(out, "content_block_delta");
        write_index(out, self.open_index);
        out.extend_from_slice(b",\"delta\":{\"type\":\"");
        out.extend_from_slice(delta_type.as_bytes());
        out.extend_from_slice(b"\",\"");
        out.extend_from_slice(field.as_bytes());
        out.extend_from_slice(b"\":");
    }

    fn thinking(&mut self, text: &str, out: &mut Vec<u8>) {
        if self.open != Open::Thinking {
            self.open_block(Open::Thinking, out);
            out.extend_from_slice(b"{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}");
            frame_close(out);
        }
        self.delta_open(out, "thinking_delta", "thinking");
        write_json_str(out, text);
        out.push(b'}');
        frame_close(out);
    }

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if self.open != Open::Text {
            self.open_block(Open::Text, out);
            out.extend_from_slice(b"{\"type\":\"text\",\"text\":\"\"}");
            frame_close(out);
        }
        self.delta_open(out, "text_delta", "text");
        write_json_str(out, text);
        out.push(b'}');
        frame_close(out);
    }

    fn input_json(&self, fragment: &str, out: &mut Vec<u8>) {
        self.delta_open(out, "input_json_delta", "partial_json");
        write_json_str(out, fragment);
        out.push(b'}');
        frame_close(out);
    }

    fn start_tool(&mut self, slot: usize, out: &mut Vec<u8>) {
        self.open_block(Open::Tool(slot), out);
        let Some(t) = self.tools.get_mut(slot) else {
            return;
        };
        if t.id.is_empty() {
            t.id = minted_tool_id(&self.ctx.request_id, slot);
            t.minted = true;
        }
        t.started = true;
        out.extend_from_slice(b"{\"type\":\"tool_use\",\"id\":");
        write_json_str(out, &t.id);
        out.extend_from_slice(b",\"name\":");
        write_json_str(out, client_tool_name(&self.ctx.tool_name_map, &t.name));
        out.extend_from_slice(b",\"input\":{}}");
        frame_close(out);
        let pending = std::mem::take(&mut t.pending);
        if !pending.is_empty() {
            self.input_json(&pending, out);
        }
    }

    /// One entry of `delta.tool_calls`; returns how many fragments it carried (0 or 1).
    fn tool_delta(&mut self, tc: &ToolCallDelta<'_>, out: &mut Vec<u8>) -> u64 {
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
                    started: false,
                    pending: String::new(),
                });
                self.tools.len() - 1
            }
        };
        let Some(t) = self.tools.get_mut(slot) else {
            return 0;
        };
        if let (true, Some(id)) = (t.id.is_empty(), id) {
            id.clone_into(&mut t.id);
        }
        if let (true, Some(name)) = (t.name.is_empty(), name) {
            name.clone_into(&mut t.name);
        }
        if !t.started && !t.name.is_empty() {
            self.start_tool(slot, out);
        }
        let Some(args) = args else {
            return 0;
        };
        match self.tools.get_mut(slot) {
            Some(t) if !t.started => t.pending.push_str(args),
            // Fragments for a call whose block was already closed (a server interleaving
            // parallel calls) cannot be sent: blocks do not reopen.
            Some(_) if self.open == Open::Tool(slot) => self.input_json(args, out),
            _ => {}
        }
        1
    }

    /// Starts (and so flushes) tool calls still waiting for a name: the generation is over.
    fn flush_pending_tools(&mut self, out: &mut Vec<u8>) {
        for slot in 0..self.tools.len() {
            if !self.tools[slot].started {
                self.start_tool(slot, out);
            }
        }
    }

    fn translate(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), ApiError> {
        let chunk: ChatChunk<'_> = serde_json::from_slice(data)
            .map_err(|e| malformed_stream(&format!("invalid chunk JSON: {e}")))?;
        if chunk.error.is_some() || chunk.object.as_deref() == Some("error") {
            return Err(upstream_error(data, &self.ctx));
        }
        self.ensure_started(out);
        let choices = chunk.choices.as_deref().unwrap_or_default();
        let mut fragments = 0;
        let mut result = Ok(());
        // After the finish, only usage is read: the generation is over.
        let choice = match self.held {
            None => choices.iter().find(|c| c.index == 0),
            Some(_) => None,
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
                    fragments += self.tool_delta(tc, out);
                }
            }
            if let Some(finish) = choice.finish_reason.as_deref() {
                let had_tools = !self.tools.is_empty();
                match stop_reason(Some(finish), choice.matched_stop_string(), had_tools) {
                    Ok(stop) => {
                        self.flush_pending_tools(out);
                        self.close_block(out);
                        let stop_sequence = match stop {
                            StopReason::StopSequence => {
                                choice.matched_stop_string().map(str::to_owned)
                            }
                            _ => None,
                        };
                        self.held = Some(Held {
                            stop,
                            stop_sequence,
                        });
                    }
                    Err(e) => result = Err(e),
                }
            }
        }
        match chunk.usage() {
            Some(u) => {
                self.usage = Some(u);
                self.fragments_since_usage = 0;
            }
            None => self.fragments_since_usage += fragments,
        }
        result?;
        if choices.is_empty() && chunk.usage.is_some() && self.held.is_some() {
            self.complete(out);
        }
        Ok(())
    }

    /// `message_delta` with the held stop reason and the usage known, then `message_stop`.
    fn complete(&mut self, out: &mut Vec<u8>) {
        let Some(held) = self.held.take() else {
            return;
        };
        frame_open(out, "message_delta");
        out.extend_from_slice(b",\"delta\":{\"stop_reason\":\"");
        out.extend_from_slice(held.stop.as_str().as_bytes());
        out.extend_from_slice(b"\",\"stop_sequence\":");
        match &held.stop_sequence {
            Some(s) => write_json_str(out, s),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b"},\"usage\":");
        write_usage(out, &self.usage());
        frame_close(out);
        frame_open(out, "message_stop");
        frame_close(out);
        self.end = StreamEnd::Complete;
    }

    fn fail(&mut self, error: ApiError, out: &mut Vec<u8>) {
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
        if self.held.is_some() {
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
            self.fail(error.clone(), out);
        }
    }

    fn on_idle(&mut self, out: &mut Vec<u8>) {
        if self.end != StreamEnd::Open {
            return;
        }
        self.ensure_started(out);
        out.extend_from_slice(b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
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
