//! Responses API create requests → the upstream request body.
//!
//! Two steps, so that the proxy can read the stored conversation in between: [`parse_request`]
//! reads the top level (and `previous_response_id`), [`responses_to_upstream`] validates the
//! rest and writes the upstream body, given the earlier conversation ([`Prior`]) when the
//! request continues one.
//!
//! Rules (docs/design.md's, as for the other formats): `max_output_tokens` defaults to 8192 and
//! is clamped to it; `temperature` defaults to 0.6 (0–2), `top_p` in (0, 1]; usage is always
//! requested on streams. Accepted as the API defines them and echoed in the response:
//! `metadata` (at most 16 string pairs, keys ≤ 64 and values ≤ 512 characters), `user`,
//! `truncation` (`auto` or `disabled`; nothing is truncated either way), `include` (the API's
//! values; `reasoning.encrypted_content` puts reasoning text in reasoning items' `encrypted_content`),
//! `store` (default true), `parallel_tool_calls`, `text.verbosity`, `reasoning.summary`.
//! `conversation` and `prompt` (server-side threads and templates) are a 400; every other
//! field is ignored.
//!
//! Upstream body, in this key order: `model`, `messages` (see [`input`]), `tools` (see
//! [`tools`]), `max_tokens`, `temperature`, `top_p`, `response_format` (`text.format`),
//! `tool_choice`, `parallel_tool_calls`, `user`, the model's reasoning switch and
//! `reasoning_effort` (`reasoning.effort`, mapped as the chat format's is), `stream`,
//! `stream_options`. Equal requests give equal bytes, and a conversation continued with
//! `previous_response_id` starts with the same bytes as its earlier turns (prefix-affinity
//! routing and the upstream's prefix cache both rely on it).

mod input;
mod options;
mod tools;

use super::{stored, ToolName};
use crate::config::Config;
use crate::error::{ApiError, ErrorKind};
use crate::protocol::responses::{ResponsesItem, ResponsesRequest, StoredResponseObject};
use crate::translate::common::rawjson::{self, is_array, is_string};
use crate::translate::common::request::{
    body_error, bool_field, max_tokens_field, object_text, resolve_model, write_sampling,
};
use crate::translate::upstream_body::{self, Endpoint};
use crate::translate::{UpstreamRequest, MAX_OUTPUT_TOKENS};
use input::Source;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// A request's top level, read; the rest is validated by [`responses_to_upstream`].
pub struct Parsed<'a> {
    req: ResponsesRequest<'a>,
    /// `previous_response_id`: the stored response whose conversation this one continues.
    pub previous_response_id: Option<Cow<'a, str>>,
}

/// The earlier conversation a request continues (`previous_response_id`), as stored.
#[derive(Debug, Clone, Copy)]
pub struct Prior<'p> {
    /// The stored response's input items: a JSON array (its own earlier conversation
    /// included).
    pub items: &'p str,
    /// The stored response object; its `output` items continue the conversation.
    pub response: &'p str,
}

/// The conversation to store with a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// A JSON array, as it is stored: the earlier conversation's items, its response's output
    /// items, then this request's input items (a string input as one user message) in their
    /// stored shape, with ids (see [`super::stored`]).
    pub items: String,
    /// Items before this index were stored before; the rest are this request's.
    pub new_from: usize,
}

/// A translated create request.
#[derive(Debug, Clone)]
pub struct ResponsesTurn {
    pub upstream: UpstreamRequest,
    /// The response object's echo of the parameters (see [`super::ResponsesContext::echo`]).
    pub echo: Vec<u8>,
    /// Function tools by upstream name.
    pub tools: Vec<ToolName>,
    /// `include` has `reasoning.encrypted_content`.
    pub encrypted_reasoning: bool,
    /// `store` (default true).
    pub store: bool,
    /// What to store with the response; `Some` exactly when `store`.
    pub conversation: Option<Conversation>,
}

/// A 400 whose message starts with the offending field's path.
pub(super) use crate::translate::common::request::invalid;

/// Reads the body's top level, which must be a JSON object.
pub fn parse_request(body: &[u8]) -> Result<Parsed<'_>, ApiError> {
    let text = object_text(body)?;
    let req: ResponsesRequest<'_> =
        serde_json::from_str(text).map_err(|e| body_error(&e, "Responses"))?;
    let previous_response_id = match req.previous_response_id {
        None => None,
        Some(raw) => {
            let id = rawjson::decode(raw)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| invalid("previous_response_id", "must be a response id"))?;
            Some(id)
        }
    };
    Ok(Parsed {
        req,
        previous_response_id,
    })
}

/// Parses and translates a request that continues no stored conversation, as the response
/// `resp_<id_base>` (for tests, fuzzing and benchmarks; the proxy uses [`parse_request`] and
/// [`responses_to_upstream`]).
pub fn responses_to_upstream_body(
    body: &[u8],
    config: &Config,
    id_base: &str,
) -> Result<ResponsesTurn, ApiError> {
    responses_to_upstream(parse_request(body)?, None, config, id_base)
}

/// Validates a parsed request and writes its upstream form. `prior` is the stored
/// conversation its `previous_response_id` names (the caller looked it up, and checked that it
/// belongs to the caller's tenant); `id_base` is the hex of the response's id, which the
/// stored conversation's new items are named after.
pub fn responses_to_upstream(
    parsed: Parsed<'_>,
    prior: Option<Prior<'_>>,
    config: &Config,
    id_base: &str,
) -> Result<ResponsesTurn, ApiError> {
    let req = &parsed.req;
    let (model_name, model) = resolve_model(req.model, config)?;
    for (field, raw, instead) in [
        (
            "conversation",
            req.conversation,
            "send the earlier response's id as previous_response_id, or the whole conversation as input",
        ),
        (
            "prompt",
            req.prompt,
            "send the prompt's text as instructions and input",
        ),
    ] {
        if raw.is_some() {
            return Err(invalid(
                field,
                format!("is not supported by this gateway; {instead}"),
            ));
        }
    }
    let stream = bool_field(req.stream, "stream")?.unwrap_or(false);
    let store = bool_field(req.store, "store")?.unwrap_or(true);
    let max_tokens = match req.max_output_tokens {
        Some(raw) => max_tokens_field(raw, "max_output_tokens")?,
        None => MAX_OUTPUT_TOKENS,
    };
    let encrypted_reasoning = options::include(req.include)?;

    // The conversation: the stored one first, then this request's input.
    let stored = match prior {
        Some(p) => Some(read_prior(p)?),
        None => None,
    };
    let input = req.input.ok_or_else(|| invalid("input", "is required"))?;
    let input_items: Option<Vec<ResponsesItem<'_>>> = if is_string(input) {
        None
    } else if is_array(input) {
        Some(parse_items(input, "input")?)
    } else {
        return Err(invalid(
            "input",
            "must be a string or an array of input items",
        ));
    };
    if let Some(i) = req.instructions {
        if !is_string(i) {
            return Err(invalid("instructions", "must be a string"));
        }
    }

    let declared = tools::declare(req.tools)?;
    let choice = tools::choice(req.tool_choice, &declared)?;

    let mut out = Vec::with_capacity(input.get().len() + 512);
    upstream_body::open(&mut out, model);
    out.extend_from_slice(b",\"messages\":");
    let mut sources: Vec<Source<'_, '_>> = Vec::with_capacity(3);
    if let Some(s) = &stored {
        sources.push(Source::stored(&s.items));
        sources.push(Source::stored(&s.output));
    }
    match &input_items {
        Some(items) => sources.push(Source::input(items)),
        None => sources.push(Source::text(input)),
    }
    let messages_range = input::write_conversation(
        req.instructions,
        &sources,
        &input::Writing {
            model,
            config,
            client_model: &model_name,
        },
        &mut out,
    )?;
    let tools_start = out.len();
    tools::write_tools(&declared, &choice, &mut out);
    let prompt_bytes = messages_range.len() + (out.len() - tools_start);

    write_sampling(&mut out, max_tokens, req.temperature, 2.0, req.top_p)?;
    options::write_text(req.text, &mut out)?;
    tools::write_choice(&choice, &declared, &mut out);
    if let Some(raw) = req.parallel_tool_calls {
        let on = bool_field(Some(raw), "parallel_tool_calls")?;
        if declared.any_written(&choice) {
            out.extend_from_slice(b",\"parallel_tool_calls\":");
            out.extend_from_slice(if on == Some(false) { b"false" } else { b"true" });
        }
    }
    if let Some(raw) = req.user {
        if !is_string(raw) {
            return Err(invalid("user", "must be a string"));
        }
        out.extend_from_slice(b",\"user\":");
        out.extend_from_slice(raw.get().as_bytes());
    }
    options::write_reasoning(req.reasoning, model, &mut out)?;
    upstream_body::close(&mut out, model, Endpoint::ChatCompletions { stream }, false);

    let echo = options::echo(req, max_tokens, store)?;
    let conversation = match store {
        true => Some(conversation(
            stored.as_ref(),
            input,
            input_items.is_some(),
            id_base,
        )?),
        false => None,
    };
    Ok(ResponsesTurn {
        upstream: UpstreamRequest {
            model: model.id,
            client_model: model_name.into_owned(),
            stream,
            client_wants_usage: false,
            max_tokens,
            body: out,
            prompt_bytes,
            prompt_range: messages_range,
            tool_name_map: Vec::new(),
        },
        echo,
        tools: declared.names(),
        encrypted_reasoning,
        store,
        conversation,
    })
}

/// A JSON array of items, each an object; errors name the first bad one.
pub fn parse_items<'a>(raw: &'a RawValue, param: &str) -> Result<Vec<ResponsesItem<'a>>, ApiError> {
    if let Ok(v) = serde_json::from_str::<Vec<ResponsesItem<'a>>>(raw.get()) {
        return Ok(v);
    }
    let items: Vec<&'a RawValue> = serde_json::from_str(raw.get())
        .map_err(|e| invalid(param, format!("must be an array of items: {e}")))?;
    for (i, item) in items.iter().enumerate() {
        if let Err(e) = serde_json::from_str::<ResponsesItem<'_>>(item.get()) {
            return Err(invalid(format!("{param}[{i}]"), e.to_string()));
        }
    }
    Err(invalid(param, "must be an array of items"))
}

/// The stored conversation: its input items and its response's output items, parsed and as
/// the JSON arrays they were read from.
struct Stored<'p> {
    items: Vec<ResponsesItem<'p>>,
    items_raw: &'p str,
    output: Vec<ResponsesItem<'p>>,
    output_raw: &'p str,
}

fn read_prior(p: Prior<'_>) -> Result<Stored<'_>, ApiError> {
    let unreadable = || {
        ApiError::new(
            ErrorKind::Internal,
            "the stored conversation of previous_response_id could not be read",
        )
    };
    let items_raw: &RawValue = serde_json::from_str(p.items).map_err(|_| unreadable())?;
    let items = parse_items(items_raw, "previous_response_id").map_err(|_| unreadable())?;
    let object: StoredResponseObject<'_> =
        serde_json::from_str(p.response).map_err(|_| unreadable())?;
    let (output, output_raw) = match object.output {
        Some(o) => (
            parse_items(o, "previous_response_id").map_err(|_| unreadable())?,
            o.get(),
        ),
        None => (Vec::new(), "[]"),
    };
    Ok(Stored {
        items,
        items_raw: items_raw.get(),
        output,
        output_raw,
    })
}

/// The array inside `[…]`, trimmed (empty for `[]`).
fn array_inner(raw: &str) -> &str {
    let t = raw.trim();
    t.strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or("")
        .trim()
}

/// The conversation to store: earlier items and their output (spliced as stored), then this
/// input in its stored shape (see [`super::stored`]).
fn conversation(
    stored: Option<&Stored<'_>>,
    input: &RawValue,
    is_list: bool,
    id_base: &str,
) -> Result<Conversation, ApiError> {
    let earlier = stored.map_or(0, |s| s.items_raw.len() + s.output_raw.len());
    let mut items = String::with_capacity(earlier + input.get().len() * 5 / 4 + 160);
    items.push('[');
    let mut new_from = 0;
    if let Some(s) = stored {
        new_from = s.items.len() + s.output.len();
        for part in [array_inner(s.items_raw), array_inner(s.output_raw)] {
            if !part.is_empty() {
                if items.len() > 1 {
                    items.push(',');
                }
                items.push_str(part);
            }
        }
    }
    if is_list {
        stored::push_new_items(input.get(), id_base, &mut items)
            .map_err(|e| invalid("input", format!("must be an array of items: {e}")))?;
    } else {
        stored::push_text_input(input, id_base, &mut items);
    }
    items.push(']');
    Ok(Conversation { items, new_from })
}
