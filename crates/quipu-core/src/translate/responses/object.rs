//! The response object and its output items, written as bytes. Shared by the non-streaming
//! ([`super::response`]) and the streaming ([`super::stream`]) translators, so that the same
//! answer gives the same object either way — the stream's `response.completed` carries exactly
//! what the non-streaming call returns.
//!
//! The object, in this key order: `id`, `object` (`"response"`), `created_at`, `status`
//! (`in_progress`, `completed`, `incomplete`, `failed`), `background` (`false`), `error`
//! (`{code, message}` when failed), `incomplete_details` (`{reason}` when incomplete), `model`
//! (the slug), `output`, `usage` (with its `cost`, the ledger row's charge; `null` while in
//! progress), then the request's echo ([`super::ResponsesContext::echo`]).
//!
//! Items:
//! - `{"id":"rs_…","type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":…}],
//!   ["encrypted_content":"quipu-reasoning-v1:…",] "status":…}`
//! - `{"id":"msg_…","type":"message","status":…,"role":"assistant","content":[{"type":
//!   "output_text","text":…,"annotations":[],"logprobs":[]}]}`
//! - `{"id":"fc_…","type":"function_call","status":…,"arguments":…,"call_id":…,"name":…
//!   [,"namespace":…]}`
//!
//! An item is `incomplete` when it is the last one of an incomplete response, or a call whose
//! arguments were cut off; else `completed` (`in_progress` while streamed).

use super::{ResponsesContext, REASONING_PREFIX};
use crate::error::{json_inner, write_json_str, ApiError, ErrorKind};
use crate::money::Pen;
use crate::usage::Usage;

/// Where a response ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    InProgress,
    Completed,
    /// Cut short: `max_output_tokens` (upstream `length`) or `content_filter`.
    Incomplete(IncompleteReason),
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncompleteReason {
    MaxOutputTokens,
    ContentFilter,
}

impl IncompleteReason {
    pub fn as_str(self) -> &'static str {
        match self {
            IncompleteReason::MaxOutputTokens => "max_output_tokens",
            IncompleteReason::ContentFilter => "content_filter",
        }
    }
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete(_) => "incomplete",
            Status::Failed => "failed",
        }
    }
}

/// An item's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemStatus {
    InProgress,
    Completed,
    Incomplete,
}

impl ItemStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ItemStatus::InProgress => "in_progress",
            ItemStatus::Completed => "completed",
            ItemStatus::Incomplete => "incomplete",
        }
    }
}

/// Token counts as the response reports them, and their cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub usage: Usage,
    /// The part of `usage.completion_tokens` that was reasoning.
    pub reasoning_tokens: u64,
    /// The charge of `usage` ([`crate::billing::Charging::cost`]): the ledger row's.
    pub cost: Pen,
}

/// Reasoning tokens: the upstream's count (`completion_tokens_details.reasoning_tokens`) when
/// it reports one, else the reasoning's share of the output's bytes; never above the output.
pub fn reasoning_tokens(
    completion: u64,
    reported: Option<u64>,
    reasoning_bytes: usize,
    output_bytes: usize,
) -> u64 {
    let n = match reported {
        Some(n) => n,
        None if output_bytes == 0 => 0,
        None => {
            let share = u128::from(completion) * reasoning_bytes as u128 / output_bytes as u128;
            u64::try_from(share).unwrap_or(u64::MAX)
        }
    };
    n.min(completion)
}

/// `{"input_tokens":…,"input_tokens_details":{"cached_tokens":…,"cache_write_tokens":0},
/// "output_tokens":…,"output_tokens_details":{"reasoning_tokens":…},"total_tokens":…,
/// "cost":…}` (`cost` in soles, a JSON number: [`Pen::json_number`]).
pub fn write_usage(out: &mut Vec<u8>, t: &Totals) {
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(b"{\"input_tokens\":");
    out.extend_from_slice(n.format(t.usage.prompt_tokens).as_bytes());
    out.extend_from_slice(b",\"input_tokens_details\":{\"cached_tokens\":");
    out.extend_from_slice(n.format(t.usage.cached()).as_bytes());
    out.extend_from_slice(b",\"cache_write_tokens\":0},\"output_tokens\":");
    out.extend_from_slice(n.format(t.usage.completion_tokens).as_bytes());
    out.extend_from_slice(b",\"output_tokens_details\":{\"reasoning_tokens\":");
    out.extend_from_slice(n.format(t.reasoning_tokens).as_bytes());
    out.extend_from_slice(b"},\"total_tokens\":");
    out.extend_from_slice(n.format(t.usage.total()).as_bytes());
    out.extend_from_slice(b",\"cost\":");
    t.cost.json_number().write_to(out);
    out.push(b'}');
}

/// The `error.code` of a failed response (the API's codes; everything the gateway cannot pin
/// on the request is a `server_error`).
pub fn failure_code(kind: &ErrorKind) -> &'static str {
    match kind {
        ErrorKind::RateLimited { .. } | ErrorKind::QueueFull { .. } => "rate_limit_exceeded",
        ErrorKind::ContextLengthExceeded => "context_length_exceeded",
        ErrorKind::InvalidRequest { .. } => "invalid_prompt",
        ErrorKind::Authentication
        | ErrorKind::ModelNotFound
        | ErrorKind::ResponseNotFound
        | ErrorKind::RouteNotFound
        | ErrorKind::MethodNotAllowed
        | ErrorKind::InsufficientBalance
        | ErrorKind::PermissionDenied
        | ErrorKind::Forbidden
        | ErrorKind::KeyNotFound
        | ErrorKind::BudgetExceeded { .. }
        | ErrorKind::RequestTooLarge
        | ErrorKind::HeadersTooLarge
        | ErrorKind::Overloaded { .. }
        | ErrorKind::UpstreamTimeout
        | ErrorKind::Upstream
        | ErrorKind::TokenizerUnavailable
        | ErrorKind::Internal => "server_error",
    }
}

/// The whole response object. `output` is the output items already written, comma-separated
/// (no brackets); `totals` is `None` while the usage is unknown (`usage: null`).
pub fn write_object(
    out: &mut Vec<u8>,
    ctx: &ResponsesContext,
    status: Status,
    error: Option<&ApiError>,
    output: &[u8],
    totals: Option<&Totals>,
) {
    out.extend_from_slice(b"{\"id\":\"resp_");
    out.extend_from_slice(json_inner(ctx.id_base()).as_bytes());
    out.extend_from_slice(b"\",\"object\":\"response\",\"created_at\":");
    out.extend_from_slice(itoa::Buffer::new().format(ctx.created_at).as_bytes());
    out.extend_from_slice(b",\"status\":\"");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b"\",\"background\":false,\"error\":");
    match error {
        Some(e) => {
            out.extend_from_slice(b"{\"code\":\"");
            out.extend_from_slice(failure_code(&e.kind).as_bytes());
            out.extend_from_slice(b"\",\"message\":");
            write_json_str(out, &e.message);
            out.push(b'}');
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"incomplete_details\":");
    match status {
        Status::Incomplete(reason) => {
            out.extend_from_slice(b"{\"reason\":\"");
            out.extend_from_slice(reason.as_str().as_bytes());
            out.extend_from_slice(b"\"}");
        }
        _ => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"model\":");
    write_json_str(out, &ctx.base.slug);
    out.extend_from_slice(b",\"output\":[");
    out.extend_from_slice(output);
    out.extend_from_slice(b"],\"usage\":");
    match totals {
        Some(t) => write_usage(out, t),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(&ctx.echo);
    out.push(b'}');
}

/// An item id: `<prefix>_<hex>_<index>`.
pub fn write_item_id(out: &mut Vec<u8>, prefix: &str, ctx: &ResponsesContext, index: u32) {
    out.push(b'"');
    out.extend_from_slice(prefix.as_bytes());
    out.push(b'_');
    out.extend_from_slice(json_inner(ctx.id_base()).as_bytes());
    out.push(b'_');
    out.extend_from_slice(itoa::Buffer::new().format(index).as_bytes());
    out.push(b'"');
}

/// A reasoning item; `text` `None` writes empty `content` (the item as it starts).
pub fn write_reasoning_item(
    out: &mut Vec<u8>,
    ctx: &ResponsesContext,
    index: u32,
    text: Option<&str>,
    status: ItemStatus,
) {
    out.extend_from_slice(b"{\"id\":");
    write_item_id(out, "rs", ctx, index);
    out.extend_from_slice(b",\"type\":\"reasoning\",\"summary\":[],\"content\":[");
    if let Some(t) = text {
        out.extend_from_slice(b"{\"type\":\"reasoning_text\",\"text\":");
        write_json_str(out, t);
        out.push(b'}');
        if ctx.encrypted_reasoning {
            out.extend_from_slice(b"],\"encrypted_content\":\"");
            out.extend_from_slice(REASONING_PREFIX.as_bytes());
            out.extend_from_slice(json_inner(t).as_bytes());
            out.extend_from_slice(b"\",\"status\":\"");
            out.extend_from_slice(status.as_str().as_bytes());
            out.extend_from_slice(b"\"}");
            return;
        }
    }
    out.extend_from_slice(b"],\"status\":\"");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b"\"}");
}

/// An `output_text` part (`text` `None`: empty, as it starts).
pub fn write_text_part(out: &mut Vec<u8>, text: Option<&str>) {
    out.extend_from_slice(b"{\"type\":\"output_text\",\"text\":");
    write_json_str(out, text.unwrap_or_default());
    out.extend_from_slice(b",\"annotations\":[],\"logprobs\":[]}");
}

/// A `reasoning_text` part.
pub fn write_reasoning_part(out: &mut Vec<u8>, text: Option<&str>) {
    out.extend_from_slice(b"{\"type\":\"reasoning_text\",\"text\":");
    write_json_str(out, text.unwrap_or_default());
    out.push(b'}');
}

/// An assistant message item; `text` `None` writes empty `content` (the item as it starts).
pub fn write_message_item(
    out: &mut Vec<u8>,
    ctx: &ResponsesContext,
    index: u32,
    text: Option<&str>,
    status: ItemStatus,
) {
    out.extend_from_slice(b"{\"id\":");
    write_item_id(out, "msg", ctx, index);
    out.extend_from_slice(b",\"type\":\"message\",\"status\":\"");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b"\",\"role\":\"assistant\",\"content\":[");
    if text.is_some() {
        write_text_part(out, text);
    }
    out.extend_from_slice(b"]}");
}

/// A function call item. `call_id` is the upstream's tool-call id, or a minted one (`None`).
pub fn write_call_item(
    out: &mut Vec<u8>,
    ctx: &ResponsesContext,
    index: u32,
    call_id: Option<&str>,
    upstream_name: &str,
    arguments: &str,
    status: ItemStatus,
) {
    out.extend_from_slice(b"{\"id\":");
    write_item_id(out, "fc", ctx, index);
    out.extend_from_slice(b",\"type\":\"function_call\",\"status\":\"");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b"\",\"arguments\":");
    write_json_str(out, arguments);
    out.extend_from_slice(b",\"call_id\":");
    match call_id {
        Some(id) => write_json_str(out, id),
        None => write_item_id(out, "call", ctx, index),
    }
    let (name, namespace) = ctx.client_tool(upstream_name);
    out.extend_from_slice(b",\"name\":");
    write_json_str(out, name);
    if let Some(ns) = namespace {
        out.extend_from_slice(b",\"namespace\":");
        write_json_str(out, ns);
    }
    out.push(b'}');
}
