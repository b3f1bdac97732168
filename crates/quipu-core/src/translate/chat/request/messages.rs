//! `messages`: each message checked and rebuilt from its known fields (role, content, name,
//! tool calls, tool call id, reasoning history), content parts and images validated, and tool
//! results matched to the assistant tool calls they answer.

use super::fields::{str_field, Dot, Index};
use super::present;
use crate::config::{Config, Model};
use crate::error::ApiError;
use crate::translate::common::images::validate_image_url;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

#[derive(Deserialize)]
struct MessageIn<'a> {
    #[serde(borrow, default)]
    role: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_call_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct PartIn<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    image_url: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ImageUrlIn<'a> {
    #[serde(borrow)]
    url: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ToolCallIn<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow, rename = "type", default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: FunctionCallIn<'a>,
}

#[derive(Deserialize)]
struct FunctionCallIn<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    /// Only checked to be a string: arguments are the model's JSON, passed on as written.
    #[serde(borrow, rename = "arguments")]
    _arguments: Cow<'a, str>,
}

/// Validates `messages` and writes the upstream array.
pub(super) fn write_messages(
    raw: &RawValue,
    model: &Model,
    config: &Config,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let messages: Vec<&RawValue> = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::invalid("messages", "`messages` must be an array of messages"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
    // Tool call ids announced by assistant messages and not yet answered.
    let mut open_calls: HashSet<String> = HashSet::new();
    // User and assistant messages: system messages alone are no conversation (chat templates
    // raise on them, e.g. Qwen3's "No user query found in messages").
    let mut turns = 0usize;
    out.push(b'[');
    for (i, m) in messages.into_iter().enumerate() {
        let at = Index(&"messages", i);
        let p = |f| Dot(&at, f);
        let msg: MessageIn = serde_json::from_str(m.get())
            .map_err(|_| ApiError::invalid(at.to_string(), "each message must be an object"))?;
        let role_raw = msg.role.ok_or_else(|| {
            ApiError::invalid(p("role").to_string(), "every message needs a `role`")
        })?;
        let role = str_field(role_raw, p("role"))?;
        let role: &str = match role.as_ref() {
            "system" | "developer" => "system",
            "user" => {
                turns += 1;
                "user"
            }
            "assistant" => {
                turns += 1;
                "assistant"
            }
            "tool" => "tool",
            other => {
                return Err(ApiError::invalid(
                    p("role").to_string(),
                    format!("unknown role \"{other}\"; roles are system, user, assistant and tool"),
                ))
            }
        };
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"role\":\"");
        out.extend_from_slice(role.as_bytes());
        out.push(b'"');

        let content = present(msg.content);
        let tool_calls = present(msg.tool_calls);
        match (role, content) {
            ("assistant", None) if tool_calls.is_none() => {
                return Err(ApiError::invalid(
                    p("content").to_string(),
                    "an assistant message needs `content` or `tool_calls`",
                ))
            }
            ("assistant", None) => out.extend_from_slice(b",\"content\":null"),
            (_, None) => {
                return Err(ApiError::invalid(
                    p("content").to_string(),
                    format!("a {role} message needs `content`"),
                ))
            }
            (_, Some(c)) => {
                out.extend_from_slice(b",\"content\":");
                validate_content(c, role, model, config, &p("content"))?;
                out.extend_from_slice(c.get().as_bytes());
            }
        }
        if let Some(n) = present(msg.name) {
            str_field(n, p("name"))?;
            out.extend_from_slice(b",\"name\":");
            out.extend_from_slice(n.get().as_bytes());
        }
        if role != "tool" {
            // A new turn: calls left unanswered are no longer answerable.
            if role != "assistant" || tool_calls.is_some() {
                open_calls.clear();
            }
        }
        if let Some(tc) = tool_calls {
            if role != "assistant" {
                return Err(ApiError::invalid(
                    p("tool_calls").to_string(),
                    "only assistant messages carry `tool_calls`",
                ));
            }
            let calls: Vec<ToolCallIn> = serde_json::from_str(tc.get()).map_err(|_| {
                ApiError::invalid(
                    p("tool_calls").to_string(),
                    "`tool_calls` must be an array of {\"id\",\"type\":\"function\",\"function\":{\"name\",\"arguments\"}}",
                )
            })?;
            for (j, c) in calls.iter().enumerate() {
                if c.kind.as_deref().is_some_and(|k| k != "function") {
                    return Err(ApiError::invalid(
                        p(&format!("tool_calls[{j}].type")).to_string(),
                        "tool calls must be of type \"function\"",
                    ));
                }
                if c.id.is_empty() || c.function.name.is_empty() {
                    return Err(ApiError::invalid(
                        p(&format!("tool_calls[{j}]")).to_string(),
                        "a tool call needs a non-empty `id` and `function.name`",
                    ));
                }
                open_calls.insert(c.id.to_string());
            }
            out.extend_from_slice(b",\"tool_calls\":");
            out.extend_from_slice(tc.get().as_bytes());
        }
        if role == "tool" {
            let id_raw = present(msg.tool_call_id).ok_or_else(|| {
                ApiError::invalid(
                    p("tool_call_id").to_string(),
                    "a tool message needs `tool_call_id`",
                )
            })?;
            let id = str_field(id_raw, p("tool_call_id"))?;
            if !open_calls.contains(id.as_ref()) {
                return Err(ApiError::invalid(
                    p("tool_call_id").to_string(),
                    format!(
                        "tool message answers \"{id}\", but no preceding assistant message has a tool call with that id"
                    ),
                ));
            }
            out.extend_from_slice(b",\"tool_call_id\":");
            out.extend_from_slice(id_raw.get().as_bytes());
        }
        if role == "assistant" {
            for (name, r) in [
                ("reasoning", msg.reasoning),
                ("reasoning_content", msg.reasoning_content),
            ] {
                if let Some(r) = present(r) {
                    str_field(r, p(name))?;
                    out.extend_from_slice(b",\"");
                    out.extend_from_slice(name.as_bytes());
                    out.extend_from_slice(b"\":");
                    out.extend_from_slice(r.get().as_bytes());
                }
            }
        }
        out.push(b'}');
    }
    if turns == 0 {
        return Err(ApiError::invalid(
            "messages",
            "`messages` must contain at least one user or assistant message; system messages alone are not a conversation",
        ));
    }
    out.push(b']');
    Ok(())
}

fn validate_content(
    raw: &RawValue,
    role: &str,
    model: &Model,
    config: &Config,
    param: &dyn fmt::Display,
) -> Result<(), ApiError> {
    let text = raw.get();
    if text.starts_with('"') {
        return str_field(raw, param).map(|_| ());
    }
    let parts: Vec<PartIn> = serde_json::from_str(text).map_err(|_| {
        ApiError::invalid(
            param.to_string(),
            "`content` must be a string or an array of content parts ({\"type\":\"text\",…} or {\"type\":\"image_url\",…})",
        )
    })?;
    if parts.is_empty() {
        return Err(ApiError::invalid(
            param.to_string(),
            "`content` must not be an empty array; send at least one content part",
        ));
    }
    for (j, part) in parts.iter().enumerate() {
        let pp = Index(param, j);
        match part.kind.as_ref() {
            "text" => {
                let t = part.text.ok_or_else(|| {
                    ApiError::invalid(format!("{pp}.text"), "a text part needs `text`")
                })?;
                str_field(t, Dot(&pp, "text"))?;
            }
            "image_url" => {
                if role != "user" {
                    return Err(ApiError::invalid(
                        pp.to_string(),
                        format!("{role} messages may only contain text parts"),
                    ));
                }
                if !model.vision {
                    return Err(ApiError::invalid(
                        pp.to_string(),
                        format!("model `{}` does not accept images", model.slug),
                    ));
                }
                let img: ImageUrlIn = part
                    .image_url
                    .and_then(|r| serde_json::from_str(r.get()).ok())
                    .ok_or_else(|| {
                        ApiError::invalid(
                            format!("{pp}.image_url"),
                            "an image part needs `image_url: {\"url\": …}`",
                        )
                    })?;
                validate_image_url(&img.url, config, &format!("{pp}.image_url.url"))?;
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{pp}.type"),
                    format!("unsupported content part type \"{other}\"; use text or image_url"),
                ))
            }
        }
    }
    Ok(())
}
