//! The OpenAI Responses API (`POST /v1/responses`): requests in, response objects and event
//! streams out, over the same upstream protocol as the other formats.
//!
//! - [`request`]: a create request → the upstream chat-completions body, plus what the
//!   response echoes (the request's parameters), the tool names to restore, and the
//!   conversation to store. Input items become upstream messages: `developer`/`system` →
//!   `system`, `function_call` → an assistant `tool_calls` entry, `function_call_output` → a
//!   `tool` message, `reasoning` → the assistant message's `reasoning` (or dropped); function
//!   `namespace`s are flattened (`ns__name`) and hosted tools dropped.
//! - [`object`]: the response object and its output items, as bytes (shared by both paths).
//! - [`response`]: a non-streaming upstream completion → a response object.
//! - [`stream`]: the incremental state machine turning upstream chunks into the API's event
//!   sequence (`response.created` … `response.completed`), every event numbered, run by the
//!   stream core.
//!
//! [`Responses`] is the format's [`Format`].
//! - [`stored`]: stored conversations — ids for new input items, listing them page by page.
//! - [`conformance`]: an event-sequence validator and accumulator, for tests, fuzzing and
//!   benchmarks.
//!
//! Usage semantics (the Responses API's, like the chat format's): `input_tokens` is the whole
//! prompt, cached tokens included (`input_tokens_details.cached_tokens`); `output_tokens` the
//! completion, of which `output_tokens_details.reasoning_tokens` were reasoning — as the
//! upstream reports it (`completion_tokens_details.reasoning_tokens`), else the reasoning's
//! share of the output's bytes; `total_tokens` their sum.
//!
//! Ids are derived from the gateway's request id (`req_<hex>`): the response is `resp_<hex>`,
//! its output items `rs_<hex>_<n>`, `msg_<hex>_<n>`, `fc_<hex>_<n>` (`n` the output index),
//! a call the upstream sent without an id gets `call_<hex>_<n>`.
//!
//! Vendor reference: <https://platform.openai.com/docs/api-reference/responses>.

pub mod conformance;
pub mod object;
pub mod request;
pub mod response;
pub mod stored;
pub mod stream;

#[cfg(test)]
mod tests;

pub use conformance::{accumulate_response, validate_event_sequence};
pub use request::{
    parse_request, responses_to_upstream, responses_to_upstream_body, Conversation, Parsed, Prior,
    ResponsesTurn,
};
pub use response::upstream_to_responses;
pub use stream::{ResponsesStream, ResponsesWriter};

use super::ResponseContext;
use crate::config::Config;
use crate::error::{ApiError, ClientFormat};
use crate::translate::format::{Format, Wire};
use crate::translate::stream_core::Stream;
use crate::translate::UpstreamRequest;
use crate::usage::Usage;

/// The Responses API (see [`Format`]). Its stored-response routes and the conversation a
/// request continues are the proxy's I/O around [`parse_request`] and
/// [`responses_to_upstream`].
pub struct Responses;

impl Format for Responses {
    const FORMAT: ClientFormat = ClientFormat::Responses;
    const WIRE: Wire = Wire {
        x_api_key: false,
        version_headers: &[],
        keepalive: super::format::SSE_COMMENT_KEEPALIVE,
    };
    type Request = ResponsesTurn;
    type Context = ResponsesContext;
    type Writer = ResponsesWriter;

    /// A request that continues no stored conversation; its stored items are named after the
    /// response's id (`resp_<hex of request_id>`).
    fn to_upstream(
        body: &[u8],
        config: &Config,
        request_id: &str,
    ) -> Result<ResponsesTurn, ApiError> {
        responses_to_upstream_body(body, config, id_base(request_id))
    }

    fn respond(upstream_body: &[u8], ctx: &ResponsesContext) -> Result<(Vec<u8>, Usage), ApiError> {
        upstream_to_responses(upstream_body, ctx)
    }

    fn stream(ctx: ResponsesContext) -> Stream<ResponsesWriter> {
        ResponsesStream::new(ctx)
    }
}

impl AsRef<UpstreamRequest> for ResponsesTurn {
    fn as_ref(&self) -> &UpstreamRequest {
        &self.upstream
    }
}

/// What a Responses translator knows beyond [`ResponseContext`].
#[derive(Debug, Clone)]
pub struct ResponsesContext {
    /// Request id, model names (`tool_name_map` is unused: see `tools`).
    pub base: ResponseContext,
    /// Unix seconds of the request's arrival (the proxy's clock; the core has none).
    pub created_at: u64,
    /// The request's parameters as the response object echoes them: JSON members, each
    /// starting with `,` (see [`request`]).
    pub echo: Vec<u8>,
    /// Function tools by their upstream name (see [`ToolName`]).
    pub tools: Vec<ToolName>,
    /// `include` asked for `reasoning.encrypted_content`: reasoning items carry their text
    /// there too (see [`REASONING_PREFIX`]).
    pub encrypted_reasoning: bool,
    /// The response will be stored: the stream keeps the finished object
    /// ([`crate::translate::StreamTranslator::take_object`]).
    pub keep_object: bool,
}

/// A function tool as the upstream knows it and as the client does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolName {
    /// The name the upstream sees: the client's, `namespace__name` for a function of a
    /// namespace, shortened when over 64 bytes.
    pub upstream: String,
    /// The function's name as the client declared it.
    pub name: String,
    /// The namespace it was declared in.
    pub namespace: Option<String>,
}

impl ResponsesContext {
    /// The hex part of the request id (`req_<hex>` → `<hex>`), the base of every minted id.
    pub fn id_base(&self) -> &str {
        id_base(&self.base.request_id)
    }

    /// `resp_<hex>`.
    pub fn response_id(&self) -> String {
        response_id(&self.base.request_id)
    }

    /// The client's name and namespace of an upstream function name.
    pub fn client_tool<'a>(&'a self, upstream: &'a str) -> (&'a str, Option<&'a str>) {
        self.tools
            .iter()
            .find(|t| t.upstream == upstream)
            .map_or((upstream, None), |t| {
                (t.name.as_str(), t.namespace.as_deref())
            })
    }
}

/// The hex part of a request id (`req_<hex>` → `<hex>`; another id is used whole).
pub fn id_base(request_id: &str) -> &str {
    request_id.strip_prefix("req_").unwrap_or(request_id)
}

/// The id of the response answering `request_id`: `resp_<hex>`.
pub fn response_id(request_id: &str) -> String {
    format!("resp_{}", id_base(request_id))
}

/// What a reasoning item's `encrypted_content` starts with when the gateway wrote it. The
/// model server's reasoning is plain text, so there is nothing to encrypt: with
/// `include: ["reasoning.encrypted_content"]` the text is put there after this prefix, so a
/// client that echoes reasoning items back without their `content` (the Codex CLI does) still
/// hands the reasoning back, and it is restored for the upstream. An `encrypted_content`
/// without the prefix (another provider's) is dropped.
pub const REASONING_PREFIX: &str = "quipu-reasoning-v1:";

/// Separator of a namespace and a function in flattened upstream tool names.
pub const NAMESPACE_SEPARATOR: &str = "__";
