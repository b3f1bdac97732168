//! A non-streaming upstream completion → a Responses API response object.
//!
//! Output items in the order the stream would produce them for a well-ordered answer:
//! `reasoning` (from `reasoning` or `reasoning_content`), the assistant `message` (if there is
//! text), one `function_call` per tool call. The object is [`super::object`]'s, the same the
//! stream's `response.completed` carries.
//!
//! Judged as the messages format judges a completion (the shared [`stop_reason`] table and the same
//! [`ObjectScanner`] the stream runs over each fragment), so both paths agree: malformed
//! tool arguments are a 502; `abort`, `error` or an unknown finish reason is a 502; `length`
//! is an `incomplete` response (`max_output_tokens`; a call cut off inside its arguments is an
//! `incomplete` item, its arguments as far as they came), `content_filter` an `incomplete`
//! one too; arguments still incomplete with any other finish are malformed.
//!
//! Arguments are written without leading whitespace (what the stream forwards: it holds back
//! fragments until the JSON starts), and as `{}` when there are none.

use super::object::{
    reasoning_tokens, write_call_item, write_message_item, write_object, write_reasoning_item,
    IncompleteReason, ItemStatus, Status, Totals,
};
use super::ResponsesContext;
use crate::error::{ApiError, ClientFormat};
use crate::translate::common::finish::{
    answer, incomplete_tool_arguments, malformed_tool_arguments, read_completion, stop_reason,
    StopReason,
};
use crate::translate::json_scan::{ObjectScanner, Scan, JSON_WS};
use crate::translate::scrub_error;
use crate::usage::Usage;

/// A response's status from the messages format's stop reason.
pub(super) fn status_of(stop: StopReason) -> Status {
    match stop {
        StopReason::MaxTokens => Status::Incomplete(IncompleteReason::MaxOutputTokens),
        StopReason::Refusal => Status::Incomplete(IncompleteReason::ContentFilter),
        StopReason::EndTurn | StopReason::StopSequence | StopReason::ToolUse => Status::Completed,
    }
}

/// Arguments as the stream forwards them: leading whitespace dropped, and trailing whitespace
/// too once the object is complete (`scan`: [`ObjectScanner::check`] of them; in incomplete
/// arguments it may be inside a string); `{}` for none.
pub(super) fn shown_arguments(arguments: &str, scan: Scan) -> &str {
    let a = arguments.trim_start_matches(JSON_WS);
    let a = match scan {
        Scan::Complete => a.trim_end_matches(JSON_WS),
        Scan::Empty | Scan::Partial | Scan::Invalid => a,
    };
    if a.is_empty() {
        "{}"
    } else {
        a
    }
}

/// Translates a non-streaming upstream response; returns the response object and the usage
/// to bill. An error object, an unreadable body or a failed generation is an [`ApiError`].
pub fn upstream_to_responses(
    upstream_body: &[u8],
    ctx: &ResponsesContext,
) -> Result<(Vec<u8>, Usage), ApiError> {
    completion_to_response(upstream_body, ctx).map_err(|e| scrub_error(e, &ctx.base))
}

fn completion_to_response(
    upstream_body: &[u8],
    ctx: &ResponsesContext,
) -> Result<(Vec<u8>, Usage), ApiError> {
    let c = read_completion(upstream_body, &ctx.base, ClientFormat::Responses)?;
    let choice = answer(&c)?;
    let msg = &choice.message;
    let calls = msg.tool_calls.as_deref().unwrap_or_default();
    let args: Vec<&str> = calls
        .iter()
        .map(|c| c.function.arguments.as_deref().unwrap_or_default())
        .collect();
    let scans: Vec<Scan> = args.iter().map(|a| ObjectScanner::check(a)).collect();
    if scans.contains(&Scan::Invalid) {
        return Err(malformed_tool_arguments());
    }
    let finish = choice.finish_reason.as_deref();
    let stop = stop_reason(finish, choice.matched_stop_string(), !calls.is_empty())?;
    let status = status_of(stop);
    if scans.contains(&Scan::Partial) && stop != StopReason::MaxTokens {
        return Err(incomplete_tool_arguments(finish.unwrap_or_default()));
    }
    let reasoning = msg.reasoning_text();
    let text = msg.content.as_deref().filter(|t| !t.is_empty());

    let reasoning_bytes = reasoning.map_or(0, str::len);
    let output_bytes = reasoning_bytes
        + text.map_or(0, str::len)
        + args
            .iter()
            .map(|a| a.trim_start_matches(JSON_WS).len())
            .sum::<usize>();
    let usage = c.usage().unwrap_or(Usage {
        // No usage reported: estimate output at 4 bytes a token rather than bill nothing.
        completion_tokens: (output_bytes as u64).div_ceil(4),
        ..Usage::default()
    });
    let reported = c.usage.as_ref().and_then(|u| u.reasoning_tokens());
    let totals = Totals {
        usage,
        reasoning_tokens: reasoning_tokens(
            usage.completion_tokens,
            reported,
            reasoning_bytes,
            output_bytes,
        ),
        cost: ctx.base.charging.cost(usage),
    };

    let count = u32::from(reasoning.is_some()) + u32::from(text.is_some()) + calls.len() as u32;
    let last_incomplete = matches!(status, Status::Incomplete(_));
    let item_status = |index: u32, cut: bool| {
        if cut || (last_incomplete && index + 1 == count) {
            ItemStatus::Incomplete
        } else {
            ItemStatus::Completed
        }
    };
    let mut output = Vec::with_capacity(upstream_body.len() + 128);
    let mut index = 0u32;
    if let Some(r) = reasoning {
        write_reasoning_item(&mut output, ctx, index, Some(r), item_status(index, false));
        index += 1;
    }
    if let Some(t) = text {
        if !output.is_empty() {
            output.push(b',');
        }
        write_message_item(&mut output, ctx, index, Some(t), item_status(index, false));
        index += 1;
    }
    for (k, call) in calls.iter().enumerate() {
        if !output.is_empty() {
            output.push(b',');
        }
        let name = call.function.name.as_deref().unwrap_or_default();
        let id = call.id.as_deref().filter(|id| !id.is_empty());
        write_call_item(
            &mut output,
            ctx,
            index,
            id,
            name,
            shown_arguments(args[k], scans[k]),
            item_status(index, scans[k] == Scan::Partial),
        );
        index += 1;
    }
    let mut out = Vec::with_capacity(output.len() + ctx.echo.len() + 512);
    write_object(&mut out, ctx, status, None, &output, Some(&totals));
    Ok((out, usage))
}
