//! A non-streaming upstream completion → a messages-format `Message`.
//!
//! Content blocks come in the order the vendor uses: `thinking` (from `reasoning` or
//! `reasoning_content`, with an empty `signature`), `text` (only if non-empty), then one
//! `tool_use` per tool call (`input` = the arguments, which must be one JSON object, or empty
//! for `{}`). `stop_reason` follows [`stop_reason`], shared with the stream translator. Also
//! home of the helpers both translators use: the stop-reason table, upstream error objects,
//! and the `tool_use` input check. The objects written are the typed ones of
//! [`crate::protocol::anthropic_out`].
//!
//! Tool arguments are judged by the same [`ObjectScanner`] the stream translator runs on each
//! fragment, in the same order, so a response fails or succeeds the same way streamed or not:
//! malformed arguments are a 502 `api_error` (checked first: the stream sees them before the
//! finish); then the finish reason; then arguments still incomplete at the finish — a 400
//! saying `max_tokens` was reached inside the call if the finish is `length`, else the
//! malformed-arguments error. No call is silently given `{}` for arguments it did have.

use super::rawjson::is_object;
use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::protocol::anthropic_out::{Block, Message, MessageId, MessageKind, Role, UsageOut};
use crate::protocol::upstream::{ChatCompletion, CompletionToolCall};
use crate::translate::json_scan::{ObjectScanner, Scan, JSON_WS};
use crate::translate::upstream_error::{map_upstream_error, UpstreamFailure};
use crate::translate::{json_failure, scrub_error, ResponseContext};
use crate::usage::Usage;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

pub use crate::protocol::anthropic_out::StopReason;

/// The upstream `finish_reason` (plus the matched stop string, if the upstream reported one,
/// and whether tool calls were emitted) as a messages-format stop reason.
///
/// | upstream | messages |
/// |---|---|
/// | any, with tool calls emitted (except `length`) | `tool_use` — vLLM finishes a forced named tool choice with `stop` |
/// | `stop` + matched stop string (vLLM `stop_reason`, SGLang `matched_stop`) | `stop_sequence` |
/// | `stop`, `repetition` (vLLM repetition detection: a natural end) | `end_turn` |
/// | `length` | `max_tokens` |
/// | `tool_calls`, `function_call` | `tool_use` |
/// | `content_filter` | `refusal` |
/// | `abort`, `error`, missing, anything else | an error: the generation did not complete |
pub fn stop_reason(
    finish: Option<&str>,
    matched_stop: Option<&str>,
    had_tool_calls: bool,
) -> Result<StopReason, ApiError> {
    let reason = match finish {
        Some("length") => StopReason::MaxTokens,
        Some("stop" | "tool_calls" | "function_call" | "repetition") if had_tool_calls => {
            StopReason::ToolUse
        }
        Some("stop") if matched_stop.is_some() => StopReason::StopSequence,
        Some("stop" | "repetition") => StopReason::EndTurn,
        Some("tool_calls" | "function_call") => StopReason::ToolUse,
        Some("content_filter") => StopReason::Refusal,
        Some("abort") => {
            return Err(ApiError::new(
                ErrorKind::Upstream,
                "the model server aborted the generation",
            ))
        }
        Some("error") => {
            return Err(ApiError::new(
                ErrorKind::Upstream,
                "the model server failed during generation",
            ))
        }
        Some(other) => {
            return Err(ApiError::new(
                ErrorKind::Upstream,
                // Quoted only when it looks like a reason, never arbitrary upstream text.
                match other.len() <= 32
                    && other
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_')
                {
                    true => format!("the model server stopped for an unknown reason ({other})"),
                    false => "the model server stopped for an unrecognised reason".to_owned(),
                },
            ));
        }
        None => {
            return Err(ApiError::new(
                ErrorKind::Upstream,
                "the model server did not say why generation stopped",
            ))
        }
    };
    Ok(reason)
}

/// An upstream error object (nested `{"error":{…}}` or flat `{"object":"error",…}`), received
/// in a 200 body or mid-stream, as the client's error. The status is the object's `code` when
/// it is an HTTP status, else 500.
pub fn upstream_error(body: &[u8], ctx: &ResponseContext) -> ApiError {
    upstream_error_in(body, ctx, ClientFormat::Messages)
}

/// [`upstream_error`] in another client format (its context-overflow wording).
pub fn upstream_error_in(body: &[u8], ctx: &ResponseContext, format: ClientFormat) -> ApiError {
    #[derive(Deserialize, Default)]
    struct Env<'a> {
        #[serde(borrow, default)]
        error: Option<&'a RawValue>,
        #[serde(borrow, default)]
        code: Option<&'a RawValue>,
    }
    #[derive(Deserialize, Default)]
    struct Inner<'a> {
        #[serde(borrow, default)]
        code: Option<&'a RawValue>,
    }
    let env: Env<'_> = serde_json::from_slice(body).unwrap_or_default();
    let code = env
        .error
        .filter(|e| is_object(e))
        .and_then(|e| serde_json::from_str::<Inner<'_>>(e.get()).ok())
        .and_then(|i| i.code)
        .or(env.code);
    let status = code
        .map(|c| c.get().trim_matches('"'))
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|c| (400..600).contains(c))
        .unwrap_or(500);
    map_upstream_error(
        &UpstreamFailure {
            status,
            body,
            retry_after: None,
            upstream_model: &ctx.upstream_model,
            slug: &ctx.slug,
        },
        format,
    )
}

/// A response the gateway cannot read.
pub fn malformed_response(detail: &str) -> ApiError {
    ApiError::new(
        ErrorKind::Upstream,
        format!("the model server sent a malformed response ({detail})"),
    )
}

/// The client's name for an upstream tool name (shortened names are restored).
pub fn client_tool_name<'x>(map: &'x [(String, String)], upstream: &'x str) -> &'x str {
    map.iter()
        .find(|(u, _)| u == upstream)
        .map_or(upstream, |(_, c)| c.as_str())
}

/// Tool arguments that are not one JSON object (both translators).
pub fn malformed_tool_arguments() -> ApiError {
    ApiError::new(
        ErrorKind::Upstream,
        "the model server returned malformed tool arguments",
    )
}

/// Tool arguments still incomplete when generation finished with `finish`.
pub fn incomplete_tool_arguments(finish: &str) -> ApiError {
    if finish == "length" {
        ApiError::invalid(
            "max_tokens",
            "max_tokens was reached in the middle of a tool call, so the call's input is incomplete; retry with a larger max_tokens or ask for a smaller tool input",
        )
    } else {
        malformed_tool_arguments()
    }
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
    let c: ChatCompletion<'_> = serde_json::from_slice(upstream_body)
        .map_err(|e| malformed_response(&json_failure("the completion", &e)))?;
    if c.error.is_some() || c.object.as_deref() == Some("error") {
        return Err(upstream_error(upstream_body, ctx));
    }
    let choice = c
        .choices
        .iter()
        .find(|ch| ch.index == 0)
        .or(c.choices.first())
        .ok_or_else(|| malformed_response("a completion without choices"))?;
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
        usage: UsageOut::from(&usage),
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
