//! The prompt of a messages-format request — `system`, `messages` and `tools` — validated and
//! written as the upstream's `messages` and `tools` arrays. Shared by create-message
//! ([`super::request`]) and count-tokens ([`super::count_tokens`]), so both see the same
//! prompt and a count matches what a create call would be billed.
//!
//! Mapping:
//! - `system` (string, or text blocks joined with `"\n\n"`) → one `system` message first.
//!   Claude Code's per-request `x-anthropic-billing-header: …` text block is dropped: it
//!   changes with every conversation and would defeat the upstream's prefix cache.
//! - `role:"system"` entries inside `messages` → `system` messages in place. A prompt needs at
//!   least one user or assistant message: `system` entries alone are a 400 (an empty one
//!   writes nothing, so they could otherwise reach the upstream as `"messages":[]`).
//! - user blocks → first one `tool` message per `tool_result` (block order), then one `user`
//!   message with the images found inside tool results (the `tool` role takes text only),
//!   then one `user` message with the remaining text/image blocks in order. Tool results go
//!   first even when the client wrote text before them: chat templates expect `tool` messages
//!   right after the assistant's `tool_calls`, and user text between them is out of
//!   distribution for tool-calling models (vllm#46321 was closed for that reason).
//! - a final assistant message with text is a prefill ([`Prompt::prefill`]): the request
//!   writers ask the upstream to continue it (per-model switch `prefill`).
//! - assistant blocks → one `assistant` message: text joined into `content`, `thinking` into
//!   `reasoning` (signature dropped), `tool_use` into `tool_calls` in order,
//!   `redacted_thinking` dropped.
//! - consecutive same-role messages stay separate upstream messages.
//! - a `tool_result`'s content becomes the `tool` message's text: its text blocks joined with
//!   `"\n"`, each image as `[image]`, each `tool_reference` (Claude Code's ToolSearch) as
//!   `[tool_reference] <name>`, prefixed with `[tool error] ` when `is_error` is true. Its
//!   `tool_use_id` must name a `tool_use` of the latest assistant turn (consecutive assistant
//!   messages count as one turn, as the vendor merges them).
//! - `document` blocks with a plain-text source → text; other document sources are a 400.
//!
//! Text is copied as the client escaped it (see [`crate::translate::common::rawjson`]); nothing is
//! decoded and re-encoded except tool names and tool inputs (compacted into the `arguments`
//! string).
//!
//! Layout: this file walks the prompt (system, then each message by role) and holds the
//! shared readers; [`tools`] declares tools and shortens long names; [`user`] writes user
//! messages (tool results, images, documents); [`assistant`] writes assistant messages (text,
//! reasoning, tool calls).

mod assistant;
mod tools;
mod user;

pub use tools::ToolNames;

use crate::config::{Config, Model};
use crate::error::ApiError;
use crate::protocol::anthropic::{AnthropicBlock, AnthropicMessage, AnthropicTool};
use crate::translate::common::rawjson::{self, is_array, is_object, is_string};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::ops::Range;
use tools::{check_tools, write_tools};

/// What Claude Code's attribution block starts with.
const BILLING_HEADER: &str = "x-anthropic-billing-header:";

/// The prompt fields of a request.
pub struct PromptIn<'a> {
    pub system: Option<&'a RawValue>,
    pub messages: Items<'a, AnthropicMessage<'a>>,
    pub tools: Items<'a, AnthropicTool<'a>>,
}

/// A list field: already parsed (the fast path), or raw (to be parsed element by element so
/// an error can name its element), or absent.
pub enum Items<'a, T> {
    Absent,
    Parsed(Vec<T>),
    Raw(&'a RawValue),
}

impl<'a, T: Deserialize<'a>> Items<'a, T> {
    fn into_vec(self, param: &dyn Fn() -> String, what: &str) -> Result<Option<Vec<T>>, ApiError> {
        match self {
            Items::Absent => Ok(None),
            Items::Parsed(v) => Ok(Some(v)),
            Items::Raw(raw) => parse_objects(raw, param, what).map(Some),
        }
    }
}

/// What writing the prompt produced, besides the bytes.
pub struct Prompt<'a> {
    /// The `messages` array (`[` to `]`) in the output.
    pub messages_range: Range<usize>,
    /// Bytes of the `tools` array, 0 if none was written.
    pub tools_bytes: usize,
    /// Tool names: declared tools and the shortened-name map.
    pub names: ToolNames<'a>,
    /// The last message is an assistant message with text: a prefill the model should
    /// continue rather than answer.
    pub prefill: bool,
}

/// A 400 whose message starts with the offending field's path (clients of the messages format
/// only see the message, so it must name the field itself).
pub use crate::translate::common::request::invalid;

/// Parses a JSON array of objects into `T`s in one pass; errors name the first bad element
/// (found by re-reading the array element by element, only when the fast parse failed).
pub fn parse_objects<'a, T: Deserialize<'a>>(
    raw: &'a RawValue,
    param: &dyn Fn() -> String,
    what: &str,
) -> Result<Vec<T>, ApiError> {
    if !is_array(raw) {
        return Err(invalid(param(), format!("must be an array of {what}")));
    }
    let first_error = match serde_json::from_str::<Vec<T>>(raw.get()) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let items: Vec<&'a RawValue> = serde_json::from_str(raw.get())
        .map_err(|e| invalid(param(), format!("must be an array of {what}: {e}")))?;
    for (i, item) in items.into_iter().enumerate() {
        if !is_object(item) {
            return Err(invalid(
                format!("{}[{i}]", param()),
                format!("must be an object ({what})"),
            ));
        }
        if let Err(e) = serde_json::from_str::<T>(item.get()) {
            return Err(invalid(format!("{}[{i}]", param()), e.to_string()));
        }
    }
    Err(invalid(param(), first_error.to_string()))
}

/// Parses one JSON object into `T`.
pub fn parse_object<'a, T: Deserialize<'a>>(
    raw: &'a RawValue,
    param: &dyn Fn() -> String,
    what: &str,
) -> Result<T, ApiError> {
    if !is_object(raw) {
        return Err(invalid(param(), format!("must be {what}")));
    }
    serde_json::from_str(raw.get()).map_err(|e| invalid(param(), e.to_string()))
}

/// A required string field; returns the raw literal.
fn req_str<'a>(
    raw: Option<&'a RawValue>,
    param: &dyn Fn() -> String,
) -> Result<&'a RawValue, ApiError> {
    match raw {
        Some(r) if is_string(r) => Ok(r),
        Some(_) => Err(invalid(param(), "must be a string")),
        None => Err(invalid(param(), "is required")),
    }
}

/// A required non-empty string field, decoded.
fn req_name<'a>(
    raw: Option<&'a RawValue>,
    param: &dyn Fn() -> String,
) -> Result<Cow<'a, str>, ApiError> {
    let r = req_str(raw, param)?;
    let s = rawjson::decode(r).unwrap_or_default();
    if s.is_empty() {
        return Err(invalid(param(), "must not be empty"));
    }
    Ok(s)
}

/// The block types Quipu reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Image,
    Document,
    ToolUse,
    ToolResult,
    ToolReference,
    Thinking,
    RedactedThinking,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Text => "text",
            Kind::Image => "image",
            Kind::Document => "document",
            Kind::ToolUse => "tool_use",
            Kind::ToolResult => "tool_result",
            Kind::ToolReference => "tool_reference",
            Kind::Thinking => "thinking",
            Kind::RedactedThinking => "redacted_thinking",
        }
    }
}

fn block_kind(block: &AnthropicBlock<'_>, param: &dyn Fn() -> String) -> Result<Kind, ApiError> {
    let ty = req_str(block.kind, &|| format!("{}.type", param()))?;
    let name = rawjson::decode(ty).unwrap_or_default();
    Ok(match name.as_ref() {
        "text" => Kind::Text,
        "image" => Kind::Image,
        "document" => Kind::Document,
        "tool_use" => Kind::ToolUse,
        "tool_result" => Kind::ToolResult,
        "tool_reference" => Kind::ToolReference,
        "thinking" => Kind::Thinking,
        "redacted_thinking" => Kind::RedactedThinking,
        other => {
            return Err(invalid(
                format!("{}.type", param()),
                format!(
                    "unsupported content block type \"{other}\"; this gateway accepts text, image, document (text source), tool_use, tool_result, thinking and redacted_thinking"
                ),
            ))
        }
    })
}

/// State carried across messages while writing them.
struct Writer<'c, 'a> {
    model: &'c Model,
    config: &'c Config,
    client_model: &'c str,
    names: ToolNames<'a>,
    /// `tool_use` ids of the latest assistant turn (consecutive assistant messages count as one
    /// turn, as the vendor merges them): what a `tool_result` may answer.
    open_ids: Vec<Cow<'a, str>>,
    prev_assistant: bool,
    /// User and assistant messages written: a prompt of `system` entries alone is no
    /// conversation (and an empty `system` writes nothing at all).
    turns: usize,
    /// The last message was an assistant message with text (see [`Prompt::prefill`]).
    prefill: bool,
}

/// Validates the prompt and writes `"messages":[…]` and, if there are tools, `,"tools":[…]`.
pub fn write_prompt<'a>(
    input: PromptIn<'a>,
    model: &Model,
    config: &Config,
    client_model: &str,
    out: &mut Vec<u8>,
) -> Result<Prompt<'a>, ApiError> {
    let mut w = Writer {
        model,
        config,
        client_model,
        names: ToolNames::default(),
        open_ids: Vec::new(),
        prev_assistant: false,
        turns: 0,
        prefill: false,
    };
    let tools = input
        .tools
        .into_vec(&|| "tools".into(), "tools")?
        .unwrap_or_default();
    check_tools(&tools, &mut w.names)?;
    let messages = input
        .messages
        .into_vec(&|| "messages".into(), "messages")?
        .ok_or_else(|| invalid("messages", "is required"))?;
    if messages.is_empty() {
        return Err(invalid("messages", "must contain at least one message"));
    }

    out.extend_from_slice(b"\"messages\":");
    let start = out.len();
    out.push(b'[');
    if let Some(system) = input.system {
        write_system(system, &|| "system".into(), out)?;
    }
    let last = messages.len() - 1;
    for (i, m) in messages.iter().enumerate() {
        w.write_message(m, i, i == last, out)?;
    }
    if w.turns == 0 {
        return Err(invalid(
            "messages",
            "must contain at least one user or assistant message; `system` entries alone are not a conversation",
        ));
    }
    out.push(b']');
    let messages_range = start..out.len();

    let mut tools_bytes = 0;
    if !tools.is_empty() {
        out.extend_from_slice(b",\"tools\":");
        let t = out.len();
        write_tools(&tools, &w.names, out);
        tools_bytes = out.len() - t;
    }
    Ok(Prompt {
        messages_range,
        tools_bytes,
        names: w.names,
        prefill: w.prefill,
    })
}

/// Starts a new element of the array being written.
#[inline]
fn sep(out: &mut Vec<u8>) {
    if out.last() != Some(&b'[') {
        out.push(b',');
    }
}

/// Writes `{"role":"<role>","content":<content>}` as the next element: a message whose content
/// is a string literal, copied as the client wrote it.
fn write_string_message(out: &mut Vec<u8>, role: &str, content: &RawValue) {
    sep(out);
    out.extend_from_slice(b"{\"role\":\"");
    out.extend_from_slice(role.as_bytes());
    out.extend_from_slice(b"\",\"content\":");
    out.extend_from_slice(content.get().as_bytes());
    out.push(b'}');
}

/// A user or assistant message's `content`: a string is written at once as the whole message
/// (`None`); otherwise it must be an array of content blocks, returned parsed.
fn string_or_blocks<'a>(
    out: &mut Vec<u8>,
    role: &str,
    content: &'a RawValue,
    i: usize,
) -> Result<Option<Vec<AnthropicBlock<'a>>>, ApiError> {
    if is_string(content) {
        write_string_message(out, role, content);
        return Ok(None);
    }
    let cp = || format!("messages[{i}].content");
    if !is_array(content) {
        return Err(invalid(
            cp(),
            "must be a string or an array of content blocks",
        ));
    }
    parse_objects(content, &cp, "content blocks").map(Some)
}

/// Writes the escaped contents of the given string literals joined by `joiner` (already
/// escaped), skipping empty ones; `open` is written before the first. Returns whether anything
/// was written.
fn write_joined<'x>(
    out: &mut Vec<u8>,
    open: &[u8],
    joiner: &[u8],
    parts: impl Iterator<Item = &'x RawValue>,
) -> bool {
    let mut any = false;
    for p in parts {
        if rawjson::str_is_empty(p) {
            continue;
        }
        if any {
            out.extend_from_slice(joiner);
        } else {
            out.extend_from_slice(open);
            any = true;
        }
        out.extend_from_slice(rawjson::inner(p).as_bytes());
    }
    any
}

/// `system` (or a `role:"system"` message's content): a string or text blocks → one upstream
/// system message, unless it is empty.
fn write_system(
    raw: &RawValue,
    param: &dyn Fn() -> String,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    if is_string(raw) {
        if !rawjson::str_is_empty(raw) {
            write_string_message(out, "system", raw);
        }
        return Ok(());
    }
    if !is_array(raw) {
        return Err(invalid(
            param(),
            "must be a string or an array of text blocks",
        ));
    }
    let blocks: Vec<AnthropicBlock<'_>> = parse_objects(raw, param, "text blocks")?;
    let mut texts = Vec::with_capacity(blocks.len());
    for (j, b) in blocks.iter().enumerate() {
        let p = || format!("{}[{j}]", param());
        if block_kind(b, &p)? != Kind::Text {
            return Err(invalid(
                format!("{}.type", p()),
                "system blocks must be text blocks",
            ));
        }
        let text = req_str(b.text, &|| format!("{}.text", p()))?;
        if !rawjson::str_starts_with(text, BILLING_HEADER) {
            texts.push(text);
        }
    }
    let mark = out.len();
    let comma = out.last() != Some(&b'[');
    let open: &[u8] = if comma {
        b",{\"role\":\"system\",\"content\":\""
    } else {
        b"{\"role\":\"system\",\"content\":\""
    };
    if write_joined(out, open, b"\\n\\n", texts.into_iter()) {
        out.extend_from_slice(b"\"}");
    } else {
        out.truncate(mark);
    }
    Ok(())
}

impl<'a> Writer<'_, 'a> {
    fn write_message(
        &mut self,
        m: &AnthropicMessage<'a>,
        i: usize,
        is_last: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let p = |f: &str| format!("messages[{i}].{f}");
        let role = req_str(m.role, &|| p("role"))?;
        let content = m
            .content
            .ok_or_else(|| invalid(p("content"), "is required"))?;
        match rawjson::decode(role).as_deref() {
            Some("user") => {
                self.prev_assistant = false;
                self.turns += 1;
                self.write_user(content, i, out)
            }
            Some("assistant") => {
                if !self.prev_assistant {
                    self.open_ids.clear();
                }
                self.prev_assistant = true;
                self.turns += 1;
                self.write_assistant(content, i, is_last, out)
            }
            Some("system") => write_system(content, &|| p("content"), out),
            other => Err(invalid(
                p("role"),
                format!(
                    "unknown role \"{}\"; roles are user, assistant and system",
                    other.unwrap_or_default()
                ),
            )),
        }
    }
}
