//! The conversation — `instructions`, the stored items of `previous_response_id`, the input —
//! → the upstream `messages` array.
//!
//! - `instructions` and the `developer`/`system` messages before any other item become one
//!   upstream `system` message, their texts joined by a blank line (the parts of one message by
//!   a newline): chat templates that accept a system message only first accept this, and the
//!   Codex CLI sends its prompt as two leading `developer` messages. Later `developer`/`system`
//!   messages stay `system` messages in place.
//! - `user` messages: a string stays one; text parts (`input_text`) are joined by newlines into
//!   one string; with an image (`input_image`, a URL or a `data:` URL checked as the chat
//!   format checks it, for a model with vision) the parts stay a list (`text`, `image_url`).
//!   `input_file` parts and images by `file_id` are a 400 (there is no Files API here).
//! - Assistant-side items in a row — `reasoning`, `assistant` messages (`output_text` and
//!   `refusal` parts, or a string), `function_call`s — become one upstream `assistant` message:
//!   texts joined in `content` (`null` when there are only calls), reasoning in `reasoning`,
//!   calls in `tool_calls` (`id` = the call's `call_id`, its name the upstream's: a
//!   namespaced function is `namespace__name`, see [`super::tools`]).
//! - `reasoning` items are restored from their `reasoning_text` content, else from an
//!   `encrypted_content` the gateway wrote ([`REASONING_PREFIX`]); otherwise (a summary only,
//!   another provider's encrypted content) dropped — never an error.
//! - `function_call_output` → a `tool` message answering its `call_id`, which must be the
//!   `call_id` of a `function_call` earlier in the conversation; a list output becomes text
//!   (text parts joined by newlines, `[image]` / `[file]` for the others).
//! - Any other item type (hosted-tool calls, `item_reference`, …) is a 400 naming it.
//!
//! Text is copied as the client escaped it (see [`rawjson`]); nothing is decoded and
//! re-encoded but names and image URLs.

use super::super::REASONING_PREFIX;
use super::invalid;
use super::tools::upstream_name;
use crate::config::{Config, Model};
use crate::error::{write_json_str, ApiError};
use crate::protocol::responses::{ResponsesItem, ResponsesPart};
use crate::translate::common::images::{check_vision, validate_image_url};
use crate::translate::common::rawjson::{self, is_array, is_string};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashSet;
use std::ops::Range;

/// What writing the conversation needs from the request.
pub(in crate::translate::responses) struct Writing<'c> {
    pub model: &'c Model,
    pub config: &'c Config,
    /// The model name as the client sent it (for messages).
    pub client_model: &'c str,
}

/// A list of items, or the string form of `input`.
enum Items<'s, 'a> {
    List(&'s [ResponsesItem<'a>]),
    Text(&'a RawValue),
}

/// Where items come from: errors in the request's own input name `input[i]`; stored items
/// (which were checked when they were the input) name `previous_response_id`.
pub(in crate::translate::responses) struct Source<'s, 'a> {
    items: Items<'s, 'a>,
    stored: bool,
}

impl<'s, 'a> Source<'s, 'a> {
    pub fn stored(items: &'s [ResponsesItem<'a>]) -> Self {
        Source {
            items: Items::List(items),
            stored: true,
        }
    }

    pub fn input(items: &'s [ResponsesItem<'a>]) -> Self {
        Source {
            items: Items::List(items),
            stored: false,
        }
    }

    pub fn text(raw: &'a RawValue) -> Self {
        Source {
            items: Items::Text(raw),
            stored: false,
        }
    }
}

/// The item types the gateway reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Message,
    FunctionCall,
    FunctionCallOutput,
    Reasoning,
}

/// A piece of text (a string literal's escaped contents) and what separates it from the piece
/// before it.
type Piece<'a> = (&'static [u8], &'a str);

/// Escaped separators.
const NEWLINE: &[u8] = b"\\n";
const BLANK_LINE: &[u8] = b"\\n\\n";

/// An upstream tool call.
struct Call<'a> {
    id: &'a RawValue,
    name: Cow<'a, str>,
    arguments: Option<&'a RawValue>,
}

/// The assistant message being gathered from consecutive assistant-side items.
#[derive(Default)]
struct Assistant<'a> {
    texts: Vec<Piece<'a>>,
    reasoning: Vec<Piece<'a>>,
    calls: Vec<Call<'a>>,
}

impl Assistant<'_> {
    fn is_empty(&self) -> bool {
        self.texts.is_empty() && self.reasoning.is_empty() && self.calls.is_empty()
    }
}

struct Conv<'a> {
    /// Only `system`/`developer` text so far: it is gathered into `system`.
    leading: bool,
    system: Vec<Piece<'a>>,
    assistant: Assistant<'a>,
    /// `call_id`s of the function calls so far: what an output may answer.
    calls: HashSet<Cow<'a, str>>,
    /// User and assistant messages written.
    turns: usize,
}

/// Writes the pieces, the first without its separator; returns whether any was written.
fn write_pieces(out: &mut Vec<u8>, pieces: &[Piece<'_>]) -> bool {
    let mut any = false;
    for &(sep, text) in pieces {
        if text.is_empty() {
            continue;
        }
        if any {
            out.extend_from_slice(sep);
        }
        out.extend_from_slice(text.as_bytes());
        any = true;
    }
    any
}

#[inline]
fn sep(out: &mut Vec<u8>) {
    if out.last() != Some(&b'[') {
        out.push(b',');
    }
}

/// A required non-empty string field, as its raw literal.
fn req_str<'a>(
    raw: Option<&'a RawValue>,
    param: &dyn Fn() -> String,
) -> Result<&'a RawValue, ApiError> {
    match raw {
        Some(r) if is_string(r) && !rawjson::str_is_empty(r) => Ok(r),
        Some(r) if is_string(r) => Err(invalid(param(), "must not be empty")),
        Some(_) => Err(invalid(param(), "must be a string")),
        None => Err(invalid(param(), "is required")),
    }
}

/// A list of content parts.
fn parts<'a>(
    raw: &'a RawValue,
    param: &dyn Fn() -> String,
) -> Result<Vec<ResponsesPart<'a>>, ApiError> {
    if let Ok(v) = serde_json::from_str::<Vec<ResponsesPart<'a>>>(raw.get()) {
        return Ok(v);
    }
    let items: Vec<&RawValue> = serde_json::from_str(raw.get())
        .map_err(|_| invalid(param(), "must be a string or an array of content parts"))?;
    for (j, item) in items.iter().enumerate() {
        if let Err(e) = serde_json::from_str::<ResponsesPart<'_>>(item.get()) {
            return Err(invalid(format!("{}[{j}]", param()), e.to_string()));
        }
    }
    Err(invalid(param(), "must be an array of content parts"))
}

fn part_type<'a>(
    p: &ResponsesPart<'a>,
    param: &dyn Fn() -> String,
) -> Result<Cow<'a, str>, ApiError> {
    let raw = p
        .kind
        .ok_or_else(|| invalid(format!("{}.type", param()), "is required"))?;
    rawjson::decode(raw).ok_or_else(|| invalid(format!("{}.type", param()), "must be a string"))
}

/// A text part's `text` (or a refusal's `refusal`), as escaped contents.
fn part_text<'a>(
    raw: Option<&'a RawValue>,
    param: &dyn Fn() -> String,
) -> Result<&'a str, ApiError> {
    match raw {
        Some(r) if is_string(r) => Ok(rawjson::inner(r)),
        Some(_) => Err(invalid(param(), "must be a string")),
        None => Err(invalid(param(), "is required")),
    }
}

/// Validates the conversation and writes `[…]` (the upstream `messages`); returns its range.
pub(in crate::translate::responses) fn write_conversation<'a>(
    instructions: Option<&'a RawValue>,
    sources: &[Source<'_, 'a>],
    w: &Writing<'_>,
    out: &mut Vec<u8>,
) -> Result<Range<usize>, ApiError> {
    let start = out.len();
    out.push(b'[');
    let mut c = Conv {
        leading: true,
        system: Vec::new(),
        assistant: Assistant::default(),
        calls: HashSet::new(),
        turns: 0,
    };
    if let Some(i) = instructions {
        c.system.push((BLANK_LINE, rawjson::inner(i)));
    }
    for source in sources {
        match source.items {
            Items::Text(raw) => {
                c.end_leading(out);
                c.flush_assistant(out);
                write_user_text(out, raw);
                c.turns += 1;
            }
            Items::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    let param = || match source.stored {
                        true => format!("previous_response_id (stored item {i})"),
                        false => format!("input[{i}]"),
                    };
                    c.item(item, &param, w, out)?;
                }
            }
        }
    }
    c.flush_assistant(out);
    c.end_leading(out);
    if c.turns == 0 {
        return Err(invalid(
            "input",
            "must contain at least one user or assistant message; instructions and developer messages alone are not a conversation",
        ));
    }
    out.push(b']');
    Ok(start..out.len())
}

fn write_user_text(out: &mut Vec<u8>, raw: &RawValue) {
    sep(out);
    out.extend_from_slice(b"{\"role\":\"user\",\"content\":");
    out.extend_from_slice(raw.get().as_bytes());
    out.push(b'}');
}

impl<'a> Conv<'a> {
    /// Writes the gathered leading system text (once, before the first other message).
    fn end_leading(&mut self, out: &mut Vec<u8>) {
        if !self.leading {
            return;
        }
        self.leading = false;
        write_system(out, &self.system);
        self.system.clear();
    }

    fn flush_assistant(&mut self, out: &mut Vec<u8>) {
        if self.assistant.is_empty() {
            return;
        }
        let a = std::mem::take(&mut self.assistant);
        sep(out);
        out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":");
        let mark = out.len();
        out.push(b'"');
        if write_pieces(out, &a.texts) {
            out.push(b'"');
        } else {
            out.truncate(mark);
            out.extend_from_slice(if a.calls.is_empty() { b"\"\"" } else { b"null" });
        }
        let mark = out.len();
        out.extend_from_slice(b",\"reasoning\":\"");
        if write_pieces(out, &a.reasoning) {
            out.push(b'"');
        } else {
            out.truncate(mark);
        }
        if !a.calls.is_empty() {
            out.extend_from_slice(b",\"tool_calls\":[");
            for call in &a.calls {
                sep(out);
                out.extend_from_slice(b"{\"id\":");
                out.extend_from_slice(call.id.get().as_bytes());
                out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                write_json_str(out, &call.name);
                out.extend_from_slice(b",\"arguments\":");
                match call.arguments {
                    Some(a) if !rawjson::str_is_empty(a) => {
                        out.extend_from_slice(a.get().as_bytes())
                    }
                    _ => out.extend_from_slice(b"\"{}\""),
                }
                out.extend_from_slice(b"}}");
            }
            out.push(b']');
        }
        out.push(b'}');
        self.turns += 1;
    }

    fn item(
        &mut self,
        item: &ResponsesItem<'a>,
        param: &dyn Fn() -> String,
        w: &Writing<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        match item_kind(item, param)? {
            Kind::Message => self.message(item, param, w, out),
            Kind::FunctionCall => {
                let id = req_str(item.call_id, &|| format!("{}.call_id", param()))?;
                let name = req_str(item.name, &|| format!("{}.name", param()))?;
                let name = rawjson::decode(name).unwrap_or_default();
                let namespace = match item.namespace {
                    Some(ns) => Some(rawjson::decode(ns).ok_or_else(|| {
                        invalid(format!("{}.namespace", param()), "must be a string")
                    })?),
                    None => None,
                };
                if let Some(a) = item.arguments {
                    if !is_string(a) {
                        return Err(invalid(
                            format!("{}.arguments", param()),
                            "must be a string (the arguments' JSON text)",
                        ));
                    }
                }
                self.end_leading(out);
                self.calls.insert(rawjson::decode(id).unwrap_or_default());
                let upstream = Cow::Owned(upstream_name(namespace.as_deref(), &name).into_owned());
                self.assistant.calls.push(Call {
                    id,
                    name: upstream,
                    arguments: item.arguments,
                });
                Ok(())
            }
            Kind::FunctionCallOutput => {
                let id = req_str(item.call_id, &|| format!("{}.call_id", param()))?;
                let key = rawjson::decode(id).unwrap_or_default();
                if !self.calls.contains(&key) {
                    return Err(invalid(
                        format!("{}.call_id", param()),
                        format!("no function_call with call_id `{key}` comes before this output"),
                    ));
                }
                let output = item
                    .output
                    .ok_or_else(|| invalid(format!("{}.output", param()), "is required"))?;
                self.end_leading(out);
                self.flush_assistant(out);
                sep(out);
                out.extend_from_slice(b"{\"role\":\"tool\",\"tool_call_id\":");
                out.extend_from_slice(id.get().as_bytes());
                out.extend_from_slice(b",\"content\":");
                if is_string(output) {
                    out.extend_from_slice(output.get().as_bytes());
                } else if is_array(output) {
                    let op = || format!("{}.output", param());
                    let list = parts(output, &op)?;
                    let mut pieces: Vec<Piece<'a>> = Vec::with_capacity(list.len());
                    for (j, p) in list.iter().enumerate() {
                        let pp = || format!("{}[{j}]", op());
                        let piece = match part_type(p, &pp)?.as_ref() {
                            "input_text" | "output_text" | "text" => {
                                part_text(p.text, &|| format!("{}.text", pp()))?
                            }
                            "input_image" => "[image]",
                            "input_file" => "[file]",
                            other => {
                                return Err(invalid(
                                    format!("{}.type", pp()),
                                    format!("unsupported output part type \"{other}\"; use input_text, input_image or input_file"),
                                ))
                            }
                        };
                        pieces.push((NEWLINE, piece));
                    }
                    out.push(b'"');
                    write_pieces(out, &pieces);
                    out.push(b'"');
                } else {
                    return Err(invalid(
                        format!("{}.output", param()),
                        "must be a string or an array of content parts",
                    ));
                }
                out.push(b'}');
                Ok(())
            }
            Kind::Reasoning => {
                self.end_leading(out);
                let before = self.assistant.reasoning.len();
                if let Some(content) = item.content.filter(|c| is_array(c)) {
                    let cp = || format!("{}.content", param());
                    for (j, p) in parts(content, &cp)?.iter().enumerate() {
                        let pp = || format!("{}[{j}]", cp());
                        if part_type(p, &pp)? == "reasoning_text" {
                            let t = part_text(p.text, &|| format!("{}.text", pp()))?;
                            self.assistant.reasoning.push((BLANK_LINE, t));
                        }
                    }
                }
                if self.assistant.reasoning.len() == before {
                    // No content: the gateway's own encrypted_content carries the text.
                    if let Some(t) = item
                        .encrypted_content
                        .filter(|e| is_string(e))
                        .and_then(|e| rawjson::inner(e).strip_prefix(REASONING_PREFIX))
                    {
                        self.assistant.reasoning.push((BLANK_LINE, t));
                    }
                }
                Ok(())
            }
        }
    }

    fn message(
        &mut self,
        item: &ResponsesItem<'a>,
        param: &dyn Fn() -> String,
        w: &Writing<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let rp = || format!("{}.role", param());
        let role_raw = item.role.ok_or_else(|| invalid(rp(), "is required"))?;
        let role = rawjson::decode(role_raw).ok_or_else(|| invalid(rp(), "must be a string"))?;
        let content = item
            .content
            .ok_or_else(|| invalid(format!("{}.content", param()), "is required"))?;
        let cp = || format!("{}.content", param());
        match role.as_ref() {
            "system" | "developer" => {
                let texts = system_texts(content, &cp)?;
                if self.leading {
                    let mut first = true;
                    for t in texts {
                        let s = if first { BLANK_LINE } else { NEWLINE };
                        first = false;
                        self.system.push((s, t));
                    }
                } else {
                    self.flush_assistant(out);
                    let pieces: Vec<Piece<'a>> = texts.into_iter().map(|t| (NEWLINE, t)).collect();
                    write_system(out, &pieces);
                }
                Ok(())
            }
            "user" => {
                self.end_leading(out);
                self.flush_assistant(out);
                self.user(content, &cp, w, out)?;
                self.turns += 1;
                Ok(())
            }
            "assistant" => {
                self.end_leading(out);
                let mut first = true;
                let mut push = |t: &'a str, texts: &mut Vec<Piece<'a>>| {
                    let s = if first { BLANK_LINE } else { b"" as &[u8] };
                    first = false;
                    texts.push((s, t));
                };
                if is_string(content) {
                    push(rawjson::inner(content), &mut self.assistant.texts);
                    return Ok(());
                }
                if !is_array(content) {
                    return Err(invalid(
                        cp(),
                        "must be a string or an array of content parts",
                    ));
                }
                for (j, p) in parts(content, &cp)?.iter().enumerate() {
                    let pp = || format!("{}[{j}]", cp());
                    let t = match part_type(p, &pp)?.as_ref() {
                        "output_text" | "input_text" | "text" => {
                            part_text(p.text, &|| format!("{}.text", pp()))?
                        }
                        "refusal" => part_text(p.refusal, &|| format!("{}.refusal", pp()))?,
                        other => {
                            return Err(invalid(
                                format!("{}.type", pp()),
                                format!("assistant messages hold output_text and refusal parts, not \"{other}\""),
                            ))
                        }
                    };
                    push(t, &mut self.assistant.texts);
                }
                Ok(())
            }
            other => Err(invalid(
                rp(),
                format!(
                    "unknown role \"{other}\"; roles are user, assistant, system and developer"
                ),
            )),
        }
    }

    fn user(
        &mut self,
        content: &'a RawValue,
        cp: &dyn Fn() -> String,
        w: &Writing<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        if is_string(content) {
            write_user_text(out, content);
            return Ok(());
        }
        if !is_array(content) {
            return Err(invalid(
                cp(),
                "must be a string or an array of content parts",
            ));
        }
        let list = parts(content, cp)?;
        if list.is_empty() {
            return Err(invalid(cp(), "must contain at least one content part"));
        }
        // Text parts, or (with an image) every part, in order.
        let mut texts: Vec<Piece<'a>> = Vec::with_capacity(list.len());
        let mut images: Vec<(usize, &'a RawValue)> = Vec::new();
        for (j, p) in list.iter().enumerate() {
            let pp = || format!("{}[{j}]", cp());
            match part_type(p, &pp)?.as_ref() {
                "input_text" | "text" => texts.push((NEWLINE, part_text(p.text, &|| format!("{}.text", pp()))?)),
                "input_image" => {
                    if p.file_id.is_some() && p.image_url.is_none() {
                        return Err(invalid(
                            format!("{}.file_id", pp()),
                            "images by file_id are not supported by this gateway (it has no Files API); send image_url (a URL or a data: URL)",
                        ));
                    }
                    check_vision(w.model, w.config, w.client_model, &pp)?;
                    let ip = || format!("{}.image_url", pp());
                    let url_raw = req_str(p.image_url, &ip)?;
                    let url = rawjson::decode(url_raw).unwrap_or_default();
                    validate_image_url(&url, w.config, &ip())?;
                    images.push((texts.len(), url_raw));
                }
                "input_file" => {
                    return Err(invalid(
                        format!("{}.type", pp()),
                        "input_file parts are not supported by this gateway; send the file's text as input_text",
                    ))
                }
                other => {
                    return Err(invalid(
                        format!("{}.type", pp()),
                        format!("unsupported content part type \"{other}\" in a user message; use input_text or input_image"),
                    ))
                }
            }
        }
        sep(out);
        out.extend_from_slice(b"{\"role\":\"user\",\"content\":");
        if images.is_empty() {
            out.push(b'"');
            write_pieces(out, &texts);
            out.push(b'"');
        } else {
            // Parts in their order: each image after the texts that came before it.
            out.push(b'[');
            let mut next_text = 0;
            let mut text_part = |upto: usize, out: &mut Vec<u8>| {
                while next_text < upto {
                    let (_, t) = texts[next_text];
                    next_text += 1;
                    sep(out);
                    out.extend_from_slice(b"{\"type\":\"text\",\"text\":\"");
                    out.extend_from_slice(t.as_bytes());
                    out.extend_from_slice(b"\"}");
                }
            };
            for &(at, url) in &images {
                text_part(at, out);
                sep(out);
                out.extend_from_slice(b"{\"type\":\"image_url\",\"image_url\":{\"url\":");
                out.extend_from_slice(url.get().as_bytes());
                out.extend_from_slice(b"}}");
            }
            text_part(texts.len(), out);
            out.push(b']');
        }
        out.push(b'}');
        Ok(())
    }
}

/// A `system`/`developer` message's texts (a string, or `input_text` parts).
fn system_texts<'a>(
    content: &'a RawValue,
    cp: &dyn Fn() -> String,
) -> Result<Vec<&'a str>, ApiError> {
    if is_string(content) {
        return Ok(vec![rawjson::inner(content)]);
    }
    if !is_array(content) {
        return Err(invalid(
            cp(),
            "must be a string or an array of input_text parts",
        ));
    }
    let mut texts = Vec::new();
    for (j, p) in parts(content, cp)?.iter().enumerate() {
        let pp = || format!("{}[{j}]", cp());
        match part_type(p, &pp)?.as_ref() {
            "input_text" | "text" => texts.push(part_text(p.text, &|| format!("{}.text", pp()))?),
            other => {
                return Err(invalid(
                    format!("{}.type", pp()),
                    format!("system and developer messages hold input_text parts, not \"{other}\""),
                ))
            }
        }
    }
    Ok(texts)
}

/// `{"role":"system","content":"…"}`, unless the text is empty.
fn write_system(out: &mut Vec<u8>, pieces: &[Piece<'_>]) {
    let mark = out.len();
    sep(out);
    out.extend_from_slice(b"{\"role\":\"system\",\"content\":\"");
    if write_pieces(out, pieces) {
        out.extend_from_slice(b"\"}");
    } else {
        out.truncate(mark);
    }
}

fn item_kind(item: &ResponsesItem<'_>, param: &dyn Fn() -> String) -> Result<Kind, ApiError> {
    let Some(raw) = item.kind else {
        return match item.role {
            Some(_) => Ok(Kind::Message),
            None => Err(invalid(
                format!("{}.type", param()),
                "is required (or a `role`, for a message)",
            )),
        };
    };
    let tp = || format!("{}.type", param());
    let name = rawjson::decode(raw).ok_or_else(|| invalid(tp(), "must be a string"))?;
    Ok(match name.as_ref() {
        "message" => Kind::Message,
        "function_call" => Kind::FunctionCall,
        "function_call_output" => Kind::FunctionCallOutput,
        "reasoning" => Kind::Reasoning,
        "item_reference" => {
            return Err(invalid(
                tp(),
                "item_reference is not supported by this gateway; send the item itself, or continue a stored response with previous_response_id",
            ))
        }
        other => {
            return Err(invalid(
                tp(),
                format!(
                    "\"{other}\" items are not supported by this gateway (it runs no hosted tools); send message, function_call, function_call_output and reasoning items"
                ),
            ))
        }
    })
}
