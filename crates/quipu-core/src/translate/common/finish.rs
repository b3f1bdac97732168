//! How a generation ended, judged once for every format that walks the upstream's answer
//! (the messages format and the Responses API; the chat format relays the upstream's own
//! verdict): the finish-reason table ([`stop_reason`]), upstream error objects received with a
//! `200`, and tool arguments that were malformed or cut off. The streaming and non-streaming
//! translators of a format both call these, so a reply fails or succeeds the same way either
//! way.

use crate::error::{ApiError, ClientFormat, ErrorKind};
use crate::protocol::upstream::{ChatCompletion, CompletionChoice};
use crate::translate::common::rawjson::is_object;
use crate::translate::upstream_error::{map_upstream_error, UpstreamFailure};
use crate::translate::{json_failure, ResponseContext};
use serde::Deserialize;
use serde_json::value::RawValue;

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
/// in a 200 body or mid-stream, as the client's error in `format` (its context-overflow
/// wording). The status is the object's `code` when it is an HTTP status, else 500.
pub fn upstream_error(body: &[u8], ctx: &ResponseContext, format: ClientFormat) -> ApiError {
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

/// A non-streaming upstream body read as a completion: an unreadable body or an upstream
/// error object (in `format`'s wording) is the client's error.
pub fn read_completion<'b>(
    upstream_body: &'b [u8],
    ctx: &ResponseContext,
    format: ClientFormat,
) -> Result<ChatCompletion<'b>, ApiError> {
    let c: ChatCompletion<'_> = serde_json::from_slice(upstream_body)
        .map_err(|e| malformed_response(&json_failure("the completion", &e)))?;
    if c.error.is_some() || c.object.as_deref() == Some("error") {
        return Err(upstream_error(upstream_body, ctx, format));
    }
    Ok(c)
}

/// The choice a completion answers with: index 0, else the first; none is an error.
pub fn answer<'c, 'a>(c: &'c ChatCompletion<'a>) -> Result<&'c CompletionChoice<'a>, ApiError> {
    c.choices
        .iter()
        .find(|ch| ch.index == 0)
        .or(c.choices.first())
        .ok_or_else(|| malformed_response("a completion without choices"))
}

/// A response the gateway cannot read.
pub fn malformed_response(detail: &str) -> ApiError {
    ApiError::new(
        ErrorKind::Upstream,
        format!("the model server sent a malformed response ({detail})"),
    )
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
