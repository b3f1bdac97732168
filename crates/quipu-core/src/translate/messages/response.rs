//! A non-streaming upstream completion → a messages-format `Message`.
//!
//! Content blocks come in the order the vendor uses: `thinking` (from `reasoning` or
//! `reasoning_content`, with an empty `signature`), `text` (only if non-empty), then one
//! `tool_use` per tool call (`input` = the arguments, which must be one JSON object, or empty
//! for `{}`). `stop_reason` follows [`stop_reason`] (the finish table every walking format
//! shares). Also home of what the messages stream uses too: the `tool_use` input check, the
//! client's tool names and minted tool ids. The objects written are the typed ones of
//! [`crate::protocol::anthropic_out`].
//!
//! Tool arguments are judged by the same [`ObjectScanner`] the stream translator runs on each
//! fragment, in the same order, so a response fails or succeeds the same way streamed or not:
//! malformed arguments are a 502 `api_error` (checked first: the stream sees them before the
//! finish); then the finish reason; then arguments still incomplete at the finish — a 400
//! saying `max_tokens` was reached inside the call if the finish is `length`, else the
//! malformed-arguments error. No call is silently given `{}` for arguments it did have.

use crate::error::{ApiError, ClientFormat};
use crate::protocol::anthropic_out::{Block, Message, MessageId, MessageKind, Role, UsageOut};
use crate::protocol::upstream::CompletionToolCall;
use crate::translate::common::finish::{
    answer, incomplete_tool_arguments, malformed_response, malformed_tool_arguments,
    read_completion, stop_reason, StopReason,
};
use crate::translate::json_scan::{ObjectScanner, Scan, JSON_WS};
use crate::translate::{json_failure, scrub_error, ResponseContext};
use crate::usage::Usage;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The client's name for an upstream tool name (shortened names are restored).
pub fn client_tool_name<'x>(map: &'x [(String, String)], upstream: &'x str) -> &'x str {
    map.iter()
        .find(|(u, _)| u == upstream)
        .map_or(upstream, |(_, c)| c.as_str())
}

/// A `tool_use` input: the arguments (a JSON object, whitespace around it trimmed), or `{}`
/// when there are none. `scan` is [`ObjectScanner::check`] of them; an object the scanner
/// passed but `serde_json` will not hold (nested deeper than its limit) is malformed too.
pub fn tool_input(arguments: &str, scan: Scan) -> Result<&RawValue, ApiError> {
    let raw = match scan {
        Scan::Complete => arguments.trim_matches(JSON_WS),
        _ => "{}",
    };
    serde_json::from_str(raw).map_err(|_| malformed_tool_arguments())
}

/// Translates a non-streaming upstream response; returns the client body and the usage to
/// bill. An error object, an unreadable body or an incomplete generation is an [`ApiError`].
pub fn upstream_to_message(
    upstream_body: &[u8],
    ctx: &ResponseContext,
) -> Result<(Vec<u8>, Usage), ApiError> {
    completion_to_message(upstream_body, ctx).map_err(|e| scrub_error(e, ctx))
}

fn completion_to_message(
    upstream_body: &[u8],
    ctx: &ResponseContext,
) -> Result<(Vec<u8>, Usage), ApiError> {
    let c = read_completion(upstream_body, ctx, ClientFormat::Messages)?;
    let choice = answer(&c)?;
    let msg = &choice.message;
    let calls = msg.tool_calls.as_deref().unwrap_or_default();
    let scans: Vec<Scan> = calls
        .iter()
        .map(|c| ObjectScanner::check(tool_arguments(c)))
        .collect();
    if scans.contains(&Scan::Invalid) {
        return Err(malformed_tool_arguments());
    }
    let matched = choice.matched_stop_string();
    let finish = choice.finish_reason.as_deref();
    let stop = stop_reason(finish, matched, !calls.is_empty())?;
    if scans.contains(&Scan::Partial) {
        return Err(incomplete_tool_arguments(finish.unwrap_or_default()));
    }
    let reasoning = msg.reasoning_text();
    let text = msg.content.as_deref().filter(|t| !t.is_empty());

    let usage = c.usage().unwrap_or_else(|| {
        // No usage reported: estimate output at 4 bytes a token rather than bill nothing.
        let bytes = reasoning.map_or(0, str::len)
            + text.map_or(0, str::len)
            + calls
                .iter()
                .map(|t| t.function.arguments.as_deref().map_or(0, str::len))
                .sum::<usize>();
        Usage {
            completion_tokens: (bytes as u64).div_ceil(4),
            ..Usage::default()
        }
    });

    let mut content = Vec::with_capacity(2 + calls.len());
    if let Some(thinking) = reasoning {
        content.push(Block::Thinking {
            thinking,
            signature: "",
        });
    }
    if let Some(text) = text {
        content.push(Block::Text { text });
    }
    for (k, (call, scan)) in calls.iter().zip(&scans).enumerate() {
        let id = match call.id.as_deref().filter(|id| !id.is_empty()) {
            Some(id) => Cow::Borrowed(id),
            None => Cow::Owned(minted_tool_id(&ctx.request_id, k)),
        };
        let name = call.function.name.as_deref().unwrap_or_default();
        content.push(Block::ToolUse {
            id,
            name: client_tool_name(&ctx.tool_name_map, name),
            input: tool_input(tool_arguments(call), *scan)?,
        });
    }
    let message = Message {
        id: MessageId(&ctx.request_id),
        kind: MessageKind::Message,
        role: Role::Assistant,
        model: &ctx.client_model,
        content,
        stop_reason: stop,
        stop_sequence: match stop {
            StopReason::StopSequence => matched,
            _ => None,
        },
        usage: UsageOut::with_cost(&usage, ctx.charging.cost(usage)),
    };
    let out = serde_json::to_vec(&message)
        .map_err(|e| malformed_response(&json_failure("the message", &e)))?;
    Ok((out, usage))
}

fn tool_arguments<'s>(call: &'s CompletionToolCall<'_>) -> &'s str {
    call.function.arguments.as_deref().unwrap_or_default()
}

/// A tool-use id for a call the upstream sent without one.
pub fn minted_tool_id(request_id: &str, k: usize) -> String {
    format!("toolu_{request_id}_{k}")
}
