//! Pure translation between the client formats and the one upstream protocol.
//!
//! Nothing here touches the network, the clock or a `Session`: a translator is a function
//! (requests, non-streaming responses) or a state machine fed upstream SSE payloads one at a
//! time (streams). That is what makes them unit-testable against recorded upstream output,
//! fuzzable, and fast.
//!
//! A client format is one folder behind one contract, [`Format`] (see [`mod@format`]):
//!
//! - [`chat`]: chat-format requests → upstream (validation, defaults, clamping, model rewrite);
//!   upstream responses and streams → chat format (slug splice, usage-chunk filtering).
//! - [`messages`]: messages-format requests → upstream; upstream responses and streams →
//!   messages format (content blocks, event sequence, usage semantics).
//! - [`responses`]: the OpenAI Responses API — requests (input items, tools, a stored
//!   conversation) → upstream; upstream responses and streams → response objects and the API's
//!   numbered event sequence.
//! - [`upstream_body`]: what every upstream request body says alike (model, reasoning switch,
//!   prefill, stream options).
//! - [`upstream_error`]: upstream error bodies → client errors.
//! - [`json_scan`]: an incremental JSON syntax check for streamed tool arguments.
//! - [`common`]: what the formats share on the way in and out (raw JSON, the request
//!   preamble, images, tool names, the finish table); a format folder imports from here,
//!   never from another format.
//! - [`stream_core`]: the one stream lifecycle (metering, the held finish, end and error,
//!   pings) every format's stream translator runs; a format writes only its frames.
//! - [`chunk_parts`]: what the messages and Responses streams do alike with an upstream chunk
//!   (which parts reach the format's writer, in which order, counted how).
//! - [`tool_calls`]: the upstream's streamed tool calls, tracked for the messages and Responses
//!   stream translators (which call a fragment belongs to, held fragments, start order).
//! - [`image_url`]: which image URLs may be forwarded to the upstream (SSRF guard).
//! - [`base64`]: whether inline image data is base64 the upstream decodes.

pub mod base64;
pub mod chat;
pub mod chunk_parts;
pub mod common;
pub mod format;
pub mod image_url;
pub mod json_scan;
pub mod messages;
pub mod responses;
pub mod splice;
pub mod stream_core;
#[cfg(test)]
mod test_support;
pub mod tool_calls;
pub mod upstream_body;
pub mod upstream_error;

pub use format::{Format, Wire};
pub use stream_core::{feed_stream, finish_stream, StreamEnd, StreamTranslator};

use crate::billing::{Charging, PromptSize};
use crate::config::ModelId;
use crate::error::{ApiError, ClientFormat, ErrorKind};

/// The facts of `format` ([`Format::WIRE`]): where a variant meets its folder.
pub fn wire(format: ClientFormat) -> &'static Wire {
    match format {
        ClientFormat::Chat => &<chat::Chat as Format>::WIRE,
        ClientFormat::Messages => &<messages::Messages as Format>::WIRE,
        ClientFormat::Responses => &<responses::Responses as Format>::WIRE,
    }
}

/// Requests above this many tokens of `max_tokens` are clamped to it (spec: default and max).
pub const MAX_OUTPUT_TOKENS: u32 = 8192;
/// Applied when a client sends no `temperature`.
pub const DEFAULT_TEMPERATURE: f64 = 0.6;

/// A client request rewritten for the upstream, with what the gateway needs to route, admit and
/// meter it.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    /// The model the request resolved to.
    pub model: ModelId,
    /// The model name exactly as the client sent it (messages responses echo it).
    pub client_model: String,
    pub stream: bool,
    /// Chat format: the client asked for `stream_options.include_usage`.
    pub client_wants_usage: bool,
    /// After defaulting and clamping.
    pub max_tokens: u32,
    /// The upstream JSON body (model already rewritten to the upstream's name).
    pub body: Vec<u8>,
    /// Bytes of prompt material (messages, system, tools) in `body`: an upper bound on prompt
    /// tokens for admission, since a token covers at least one byte.
    pub prompt_bytes: usize,
    /// Where the upstream `messages` array sits in `body` (from its `[` to its `]`). The router
    /// hashes it block by block for prefix-cache-affinity routing: a conversation's next turn
    /// starts with the same bytes as the previous one.
    pub prompt_range: std::ops::Range<usize>,
    /// Tool names that had to be shortened for the upstream: (upstream name, client name).
    /// Usually empty.
    pub tool_name_map: Vec<(String, String)>,
}

impl UpstreamRequest {
    /// What admission needs to quote the request (see [`crate::billing::quote`]). An image part
    /// is found by its `"image_url"` key in the prompt: the translators write every image that
    /// way, and a text that mentions the word is an escaped string, not a key.
    pub fn prompt_size(&self) -> PromptSize {
        let prompt = self
            .body
            .get(self.prompt_range.clone())
            .unwrap_or(&self.body);
        PromptSize {
            bytes: self.prompt_bytes as u64,
            has_images: memchr::memmem::find(prompt, b"\"image_url\"").is_some(),
            max_tokens: self.max_tokens,
        }
    }
}

/// What a response translator needs to know about the request it answers.
#[derive(Debug, Clone)]
pub struct ResponseContext {
    /// Gateway request id (`x-request-id`); also the base of minted ids (`msg_…`).
    pub request_id: String,
    /// The model name as the client sent it.
    pub client_model: String,
    /// The slug it resolved to.
    pub slug: String,
    /// The upstream's name for the model (never shown to clients).
    pub upstream_model: String,
    /// Shortened tool names to restore in responses: (upstream name, client name).
    pub tool_name_map: Vec<(String, String)>,
    /// The terms the request is settled on: the `usage.cost` an answer writes is
    /// [`Charging::cost`] of the usage it reports, the charge its ledger row will record.
    pub charging: Charging,
}

/// `error` as a client may see it. Translator errors quote no upstream text of their own (see
/// [`json_failure`]); this is the one net, at each translator's boundary, for what they still
/// relay (an upstream error message, a short finish reason): the upstream's model name
/// becomes the slug.
pub fn scrub_error(mut error: ApiError, ctx: &ResponseContext) -> ApiError {
    if error.message.contains(ctx.upstream_model.as_str()) {
        error.message = upstream_error::scrub(&error.message, &ctx.upstream_model, &ctx.slug);
    }
    error
}

/// Why upstream JSON could not be read, without quoting it: serde's own messages quote the
/// rejected value (an upstream model name, or a megabyte of text), which must not reach a
/// client.
pub fn json_failure(what: &str, e: &serde_json::Error) -> String {
    let why = match e.classify() {
        serde_json::error::Category::Syntax => "not JSON",
        serde_json::error::Category::Data => "not the expected shape",
        serde_json::error::Category::Eof => "cut short",
        serde_json::error::Category::Io => "unreadable",
    };
    format!(
        "{what} is {why} at line {}, column {}",
        e.line(),
        e.column()
    )
}

/// The error a client sees when the upstream's stream cannot be read.
pub fn malformed_stream(detail: &str) -> ApiError {
    ApiError::new(
        ErrorKind::Upstream,
        format!("the model server sent a malformed stream ({detail})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::stream_core::StreamFormat;

    /// What a format's types say their variant is.
    fn variants<F: Format>() -> [ClientFormat; 2] {
        [F::FORMAT, <F::Writer as StreamFormat>::FORMAT]
    }

    #[test]
    fn every_variant_is_its_folders_format() {
        for format in ClientFormat::all() {
            let (said, wire_of) = match format {
                ClientFormat::Chat => (variants::<chat::Chat>(), &chat::Chat::WIRE),
                ClientFormat::Messages => {
                    (variants::<messages::Messages>(), &messages::Messages::WIRE)
                }
                ClientFormat::Responses => (
                    variants::<responses::Responses>(),
                    &responses::Responses::WIRE,
                ),
            };
            assert_eq!(said, [format; 2], "{format:?}");
            assert_eq!(wire(format).x_api_key, wire_of.x_api_key, "{format:?}");
            assert_eq!(
                wire(format).version_headers,
                wire_of.version_headers,
                "{format:?}"
            );
        }
    }
}
