//! The prompt of a messages-format request — `system`, `messages` and `tools` — validated and
//! written as the upstream's `messages` and `tools` arrays. Shared by create-message
//! ([`super::request`]) and count-tokens ([`super::count_tokens`]), so both see the same
//! prompt and a count matches what a create call would be billed.
//!
//! Mapping (reference §4.2):
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
//! Text is copied as the client escaped it (see [`super::rawjson`]); nothing is decoded and
//! re-encoded except tool names and tool inputs (compacted into the `arguments` string).

use super::rawjson::{self, is_array, is_object, is_string};
use crate::config::{Config, ImageUrlPolicy, Model};
use crate::error::{write_json_str, ApiError};
use crate::protocol::anthropic::{
    AnthropicBlock, AnthropicMessage, AnthropicSource, AnthropicTool,
};
use crate::translate::image_url::{check_image_url, ImageUrlRejection};
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::ops::Range;

/// The longest function name the upstream protocol allows.
pub const MAX_TOOL_NAME: usize = 64;

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
pub fn invalid(param: String, what: impl AsRef<str>) -> ApiError {
    let message = format!("{param}: {}", what.as_ref());
    ApiError::invalid(param, message)
}

/// Client tool names and the names the upstream sees (shortened when over 64 bytes).
#[derive(Debug, Default)]
pub struct ToolNames<'a> {
    /// Declared tools in order: (client name, upstream name).
    pub declared: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    /// Every shortened name: (upstream name, client name), for `UpstreamRequest::tool_name_map`.
    pub shortened: Vec<(String, String)>,
}

impl<'a> ToolNames<'a> {
    /// The upstream name of `client`, recording it in `shortened` if it had to be cut.
    pub fn upstream(&mut self, client: &Cow<'a, str>) -> Cow<'a, str> {
        if client.len() <= MAX_TOOL_NAME {
            return client.clone();
        }
        let short = shorten_tool_name(client);
        if !self.shortened.iter().any(|(s, _)| *s == short) {
            self.shortened.push((short.clone(), client.to_string()));
        }
        Cow::Owned(short)
    }

    /// The upstream name of a declared tool.
    pub fn declared_upstream(&self, client: &str) -> Option<&str> {
        self.declared
            .iter()
            .find(|(c, _)| c == client)
            .map(|(_, u)| u.as_ref())
    }
}

/// A stable ≤ 64-byte name for a longer tool name: its first 55 bytes (cut on a character
/// boundary), `_`, and 8 hex digits of its SHA-256. The same name always gives the same result,
/// so a conversation's history and tools agree across requests (and the prefix cache holds).
pub fn shorten_tool_name(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut cut = MAX_TOOL_NAME - 9;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut s = String::with_capacity(MAX_TOOL_NAME);
    s.push_str(&name[..cut]);
    s.push('_');
    let mut hex = [0u8; 8];
    let first4 = [digest[0], digest[1], digest[2], digest[3]];
    crate::ascii::fill_hex(&mut hex, u64::from(u32::from_be_bytes(first4)));
    s.extend(hex.iter().map(|&b| char::from(b)));
    s
}

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
        .ok_or_else(|| invalid("messages".into(), "is required"))?;
    if messages.is_empty() {
        return Err(invalid(
            "messages".into(),
            "must contain at least one message",
        ));
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
            "messages".into(),
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
            sep(out);
            out.extend_from_slice(b"{\"role\":\"system\",\"content\":");
            out.extend_from_slice(raw.get().as_bytes());
            out.push(b'}');
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

/// Validates the declared tools and records their names.
fn check_tools<'a>(tools: &[AnthropicTool<'a>], names: &mut ToolNames<'a>) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let p = |f: &str| format!("tools[{i}].{f}");
        if let Some(kind) = t.kind {
            if !is_string(kind) {
                return Err(invalid(p("type"), "must be a string"));
            }
            if !rawjson::str_eq(kind, "custom") {
                let k = rawjson::decode(kind).unwrap_or_default();
                return Err(invalid(
                    p("type"),
                    format!(
                        "tool type \"{k}\" is a server tool, which this gateway does not run; declare custom tools with `name` and `input_schema`"
                    ),
                ));
            }
        }
        let name = req_name(t.name, &|| p("name"))?;
        if t.description.is_some_and(|d| !is_string(d)) {
            return Err(invalid(p("description"), "must be a string"));
        }
        match t.input_schema {
            None => return Err(invalid(p("input_schema"), "is required")),
            Some(s) if !is_object(s) => {
                return Err(invalid(p("input_schema"), "must be a JSON Schema object"))
            }
            Some(s) if !rawjson::depth_ok(s.get()) => {
                return Err(invalid(p("input_schema"), "is nested too deeply"))
            }
            Some(_) => {}
        }
        if names.declared.iter().any(|(c, _)| *c == name) {
            return Err(invalid(
                p("name"),
                format!("tool names must be unique; `{name}` is declared twice"),
            ));
        }
        let upstream = names.upstream(&name);
        names.declared.push((name, upstream));
    }
    Ok(())
}

/// `[{"type":"function","function":{"name","description","parameters"}}, …]`. Only these keys
/// are written: tool-level extras never leak into the function or its parameters.
fn write_tools(tools: &[AnthropicTool<'_>], names: &ToolNames<'_>, out: &mut Vec<u8>) {
    out.push(b'[');
    for (t, (_, upstream)) in tools.iter().zip(&names.declared) {
        sep(out);
        out.extend_from_slice(b"{\"type\":\"function\",\"function\":{\"name\":");
        write_json_str(out, upstream);
        if let Some(d) = t.description {
            out.extend_from_slice(b",\"description\":");
            out.extend_from_slice(d.get().as_bytes());
        }
        if let Some(s) = t.input_schema {
            out.extend_from_slice(b",\"parameters\":");
            out.extend_from_slice(s.get().as_bytes());
        }
        out.extend_from_slice(b"}}");
    }
    out.push(b']');
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

    fn check_vision(&self, param: &dyn Fn() -> String) -> Result<(), ApiError> {
        if self.model.vision {
            return Ok(());
        }
        let with: Vec<String> = self
            .config
            .models
            .iter()
            .filter(|m| m.vision)
            .map(|m| format!("`{}`", m.slug))
            .collect();
        Err(invalid(
            param(),
            format!(
                "model `{}` does not accept images; models with vision: {}",
                self.client_model,
                if with.is_empty() {
                    "none".to_owned()
                } else {
                    with.join(", ")
                }
            ),
        ))
    }

    /// An `image` block → an `image_url` part.
    fn write_image(
        &self,
        b: &AnthropicBlock<'_>,
        param: &dyn Fn() -> String,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        self.check_vision(param)?;
        let sp = || format!("{}.source", param());
        let raw = b.source.ok_or_else(|| invalid(sp(), "is required"))?;
        let src: AnthropicSource<'_> = parse_object(raw, &sp, "an image source object")?;
        let kind = req_str(src.kind, &|| format!("{}.type", sp()))?;
        if rawjson::str_eq(kind, "base64") {
            let mt = req_str(src.media_type, &|| format!("{}.media_type", sp()))?;
            let media = ["image/jpeg", "image/png", "image/gif", "image/webp"]
                .into_iter()
                .find(|m| rawjson::str_eq(mt, m))
                .ok_or_else(|| {
                    invalid(
                        format!("{}.media_type", sp()),
                        format!(
                            "unsupported image type {}; use image/jpeg, image/png, image/gif or image/webp",
                            mt.get()
                        ),
                    )
                })?;
            let data_raw = req_str(src.data, &|| format!("{}.data", sp()))?;
            let data = rawjson::decode(data_raw).unwrap_or_default();
            if !rawjson::is_base64(&data) {
                return Err(invalid(
                    format!("{}.data", sp()),
                    "is not valid base64 image data",
                ));
            }
            out.extend_from_slice(b"{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:");
            out.extend_from_slice(media.as_bytes());
            out.extend_from_slice(b";base64,");
            out.extend_from_slice(data.as_bytes());
            out.extend_from_slice(b"\"}}");
            Ok(())
        } else if rawjson::str_eq(kind, "url") {
            let policy = self.config.security.image_urls;
            if policy == ImageUrlPolicy::Reject {
                return Err(invalid(
                    format!("{}.type", sp()),
                    ImageUrlRejection::NotAccepted.message(),
                ));
            }
            let url_raw = req_str(src.url, &|| format!("{}.url", sp()))?;
            let url = rawjson::decode(url_raw).unwrap_or_default();
            if let Err(e) = check_image_url(&url, policy) {
                return Err(invalid(format!("{}.url", sp()), e.message()));
            }
            out.extend_from_slice(b"{\"type\":\"image_url\",\"image_url\":{\"url\":");
            write_json_str(out, &url);
            out.extend_from_slice(b"}}");
            Ok(())
        } else {
            Err(invalid(
                format!("{}.type", sp()),
                format!(
                    "unsupported image source type {}; use \"base64\" or \"url\"",
                    kind.get()
                ),
            ))
        }
    }

    /// A `document` block with a plain-text source → its text (other sources cannot reach a
    /// chat-completions upstream).
    fn document_text<'b>(
        &self,
        b: &AnthropicBlock<'b>,
        param: &dyn Fn() -> String,
    ) -> Result<&'b RawValue, ApiError> {
        let sp = || format!("{}.source", param());
        let raw = b.source.ok_or_else(|| invalid(sp(), "is required"))?;
        let src: AnthropicSource<'b> = parse_object(raw, &sp, "a document source object")?;
        let kind = req_str(src.kind, &|| format!("{}.type", sp()))?;
        if !rawjson::str_eq(kind, "text") {
            return Err(invalid(
                format!("{}.type", sp()),
                format!(
                    "document source {} is not supported; only plain-text documents (source type \"text\") are",
                    kind.get()
                ),
            ));
        }
        req_str(src.data, &|| format!("{}.data", sp()))
    }

    fn write_user(
        &mut self,
        content: &'a RawValue,
        i: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let cp = || format!("messages[{i}].content");
        if is_string(content) {
            sep(out);
            out.extend_from_slice(b"{\"role\":\"user\",\"content\":");
            out.extend_from_slice(content.get().as_bytes());
            out.push(b'}');
            return Ok(());
        }
        if !is_array(content) {
            return Err(invalid(
                cp(),
                "must be a string or an array of content blocks",
            ));
        }
        let blocks: Vec<AnthropicBlock<'a>> = parse_objects(content, &cp, "content blocks")?;
        if blocks.is_empty() {
            return Err(invalid(cp(), "must contain at least one content block"));
        }
        let mut kinds = Vec::with_capacity(blocks.len());
        for (j, b) in blocks.iter().enumerate() {
            let bp = || format!("messages[{i}].content[{j}]");
            let k = block_kind(b, &bp)?;
            match k {
                Kind::ToolUse | Kind::Thinking | Kind::RedactedThinking => {
                    return Err(invalid(
                        format!("{}.type", bp()),
                        format!("{} blocks belong in assistant messages", k.name()),
                    ))
                }
                Kind::ToolReference => {
                    return Err(invalid(
                        format!("{}.type", bp()),
                        "tool_reference blocks belong inside a tool_result",
                    ))
                }
                _ => kinds.push(k),
            }
        }

        // 1. One `tool` message per tool_result, in block order.
        let mut result_images: Vec<(usize, usize, AnthropicBlock<'a>)> = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            if kinds[j] == Kind::ToolResult {
                self.write_tool_result(b, i, j, &mut result_images, out)?;
            }
        }
        // 2. Images returned by tools, which the `tool` role cannot carry.
        if !result_images.is_empty() {
            sep(out);
            out.extend_from_slice(b"{\"role\":\"user\",\"content\":[");
            for (j, k, img) in &result_images {
                sep(out);
                self.write_image(
                    img,
                    &|| format!("messages[{i}].content[{j}].content[{k}]"),
                    out,
                )?;
            }
            out.extend_from_slice(b"]}");
        }
        // 3. The rest, in order.
        let rest = kinds.iter().filter(|k| **k != Kind::ToolResult).count();
        if rest == 0 {
            return Ok(());
        }
        sep(out);
        out.extend_from_slice(b"{\"role\":\"user\",\"content\":");
        if rest == 1 {
            if let Some(j) = kinds.iter().position(|k| *k == Kind::Text) {
                let text = req_str(blocks[j].text, &|| {
                    format!("messages[{i}].content[{j}].text")
                })?;
                out.extend_from_slice(text.get().as_bytes());
                out.push(b'}');
                return Ok(());
            }
        }
        out.push(b'[');
        for (j, b) in blocks.iter().enumerate() {
            let bp = || format!("messages[{i}].content[{j}]");
            let text = match kinds[j] {
                Kind::ToolResult => continue,
                Kind::Image => {
                    sep(out);
                    self.write_image(b, &bp, out)?;
                    continue;
                }
                Kind::Document => self.document_text(b, &bp)?,
                _ => req_str(b.text, &|| format!("{}.text", bp()))?,
            };
            sep(out);
            out.extend_from_slice(b"{\"type\":\"text\",\"text\":");
            out.extend_from_slice(text.get().as_bytes());
            out.push(b'}');
        }
        out.extend_from_slice(b"]}");
        Ok(())
    }

    /// `{"role":"tool","tool_call_id":…,"content":"…"}`: text parts joined with `"\n"`, each
    /// image as `[image]` (the image itself goes in the following user message), prefixed with
    /// `[tool error] ` when `is_error` is true.
    fn write_tool_result(
        &mut self,
        b: &AnthropicBlock<'a>,
        i: usize,
        j: usize,
        images: &mut Vec<(usize, usize, AnthropicBlock<'a>)>,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let bp = |f: &str| format!("messages[{i}].content[{j}].{f}");
        let id_raw = req_str(b.tool_use_id, &|| bp("tool_use_id"))?;
        let id = rawjson::decode(id_raw).unwrap_or_default();
        if !self.open_ids.contains(&id) {
            return Err(invalid(
                bp("tool_use_id"),
                format!(
                    "unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                ),
            ));
        }
        let is_error = match b.is_error {
            None => false,
            Some(r) => match r.get() {
                "true" => true,
                "false" => false,
                _ => return Err(invalid(bp("is_error"), "must be true or false")),
            },
        };
        sep(out);
        out.extend_from_slice(b"{\"role\":\"tool\",\"tool_call_id\":");
        out.extend_from_slice(id_raw.get().as_bytes());
        out.extend_from_slice(b",\"content\":\"");
        if is_error {
            out.extend_from_slice(b"[tool error] ");
        }
        match b.content {
            None => {}
            Some(c) if is_string(c) => out.extend_from_slice(rawjson::inner(c).as_bytes()),
            Some(c) if is_array(c) => {
                let cp = || bp("content");
                let parts: Vec<AnthropicBlock<'a>> = parse_objects(c, &cp, "content blocks")?;
                let mut first = true;
                for (k, part) in parts.into_iter().enumerate() {
                    let pp = || format!("{}[{k}]", cp());
                    let piece: &[u8] = match block_kind(&part, &pp)? {
                        Kind::Text => {
                            rawjson::inner(req_str(part.text, &|| format!("{}.text", pp()))?)
                                .as_bytes()
                        }
                        Kind::Document => rawjson::inner(self.document_text(&part, &pp)?).as_bytes(),
                        Kind::Image => {
                            self.check_vision(&pp)?;
                            images.push((j, k, part));
                            b"[image]"
                        }
                        Kind::ToolReference => {
                            let name = req_str(part.tool_name, &|| format!("{}.tool_name", pp()))?;
                            if !first {
                                out.extend_from_slice(b"\\n");
                            }
                            first = false;
                            out.extend_from_slice(b"[tool_reference] ");
                            out.extend_from_slice(rawjson::inner(name).as_bytes());
                            continue;
                        }
                        other => {
                            return Err(invalid(
                                format!("{}.type", pp()),
                                format!(
                                    "{} blocks cannot appear inside a tool_result; use text or image blocks",
                                    other.name()
                                ),
                            ))
                        }
                    };
                    if !first {
                        out.extend_from_slice(b"\\n");
                    }
                    first = false;
                    out.extend_from_slice(piece);
                }
            }
            Some(_) => {
                return Err(invalid(
                    bp("content"),
                    "must be a string or an array of content blocks",
                ))
            }
        }
        out.extend_from_slice(b"\"}");
        Ok(())
    }

    fn write_assistant(
        &mut self,
        content: &'a RawValue,
        i: usize,
        is_last: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let cp = || format!("messages[{i}].content");
        if is_string(content) {
            sep(out);
            out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":");
            out.extend_from_slice(content.get().as_bytes());
            out.push(b'}');
            self.prefill = is_last && !rawjson::str_is_empty(content);
            return Ok(());
        }
        if !is_array(content) {
            return Err(invalid(
                cp(),
                "must be a string or an array of content blocks",
            ));
        }
        let blocks: Vec<AnthropicBlock<'a>> = parse_objects(content, &cp, "content blocks")?;
        if blocks.is_empty() && !is_last {
            return Err(invalid(cp(), "must contain at least one content block"));
        }
        let mut kinds = Vec::with_capacity(blocks.len());
        let mut texts = Vec::new();
        let mut thoughts = Vec::new();
        let mut calls = 0usize;
        for (j, b) in blocks.iter().enumerate() {
            let bp = |f: &str| format!("messages[{i}].content[{j}].{f}");
            let k = block_kind(b, &|| format!("messages[{i}].content[{j}]"))?;
            match k {
                Kind::Text => texts.push(req_str(b.text, &|| bp("text"))?),
                Kind::Thinking => {
                    thoughts.push(req_str(b.thinking, &|| bp("thinking"))?);
                    if b.signature.is_some_and(|s| !is_string(s)) {
                        return Err(invalid(bp("signature"), "must be a string"));
                    }
                }
                Kind::RedactedThinking => {}
                Kind::ToolUse => {
                    let id = req_name(b.id, &|| bp("id"))?;
                    req_name(b.name, &|| bp("name"))?;
                    match b.input {
                        Some(inp) if is_object(inp) => {}
                        Some(_) => return Err(invalid(bp("input"), "must be an object")),
                        None => return Err(invalid(bp("input"), "is required")),
                    }
                    self.open_ids.push(id);
                    calls += 1;
                }
                other => {
                    return Err(invalid(
                        bp("type"),
                        format!(
                            "{} blocks cannot appear in assistant messages",
                            other.name()
                        ),
                    ))
                }
            }
            kinds.push(k);
        }
        sep(out);
        out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":");
        if !write_joined(out, b"\"", b"", texts.iter().copied()) {
            out.extend_from_slice(if calls > 0 { b"null" } else { b"\"\"" });
        } else {
            out.push(b'"');
            self.prefill = is_last;
        }
        if write_joined(out, b",\"reasoning\":\"", b"", thoughts.iter().copied()) {
            out.push(b'"');
        }
        if calls > 0 {
            out.extend_from_slice(b",\"tool_calls\":[");
            for (j, b) in blocks.iter().enumerate() {
                if kinds[j] != Kind::ToolUse {
                    continue;
                }
                let (Some(id), Some(name_raw), Some(input)) = (b.id, b.name, b.input) else {
                    continue;
                };
                sep(out);
                out.extend_from_slice(b"{\"id\":");
                out.extend_from_slice(id.get().as_bytes());
                out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                let name = rawjson::decode(name_raw).unwrap_or_default();
                let upstream = self.names.upstream(&name);
                write_json_str(out, &upstream);
                out.extend_from_slice(b",\"arguments\":\"");
                if !rawjson::write_compact_escaped(out, input.get()) {
                    return Err(invalid(
                        format!("messages[{i}].content[{j}].input"),
                        "is nested too deeply",
                    ));
                }
                out.extend_from_slice(b"\"}}");
            }
            out.push(b']');
        }
        out.push(b'}');
        Ok(())
    }
}
