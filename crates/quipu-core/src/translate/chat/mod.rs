//! The chat format (OpenAI chat completions): requests in, responses and streams out.
//!
//! The upstream speaks this format too, so the work is validation and normalisation on the
//! way in ([`request`]) and targeted rewriting on the way out ([`response`]: the
//! non-streaming body and the stream's [`ChatWriter`], run by the stream core). [`Chat`] is
//! the format's [`Format`].

pub mod request;
pub mod response;

#[cfg(test)]
mod tests;

pub use request::chat_to_upstream;
pub use response::{upstream_to_chat, ChatStream, ChatWriter};

use crate::config::{Config, ReasoningField};
use crate::error::{ApiError, ClientFormat};
use crate::translate::format::{Format, Wire};
use crate::translate::stream_core::Stream;
use crate::translate::{ResponseContext, UpstreamRequest};
use crate::usage::Usage;

/// The chat format (see [`Format`]).
pub struct Chat;

/// What the chat format's response translators are given.
#[derive(Debug, Clone)]
pub struct ChatContext {
    pub base: ResponseContext,
    /// The client asked for `stream_options.include_usage`.
    pub client_wants_usage: bool,
    /// Where reasoning text goes (`streaming.chat_reasoning_field`).
    pub reasoning: ReasoningField,
}

impl Format for Chat {
    const FORMAT: ClientFormat = ClientFormat::Chat;
    const WIRE: Wire = Wire {
        x_api_key: false,
        version_headers: &[],
        keepalive: super::format::SSE_COMMENT_KEEPALIVE,
    };
    type Request = UpstreamRequest;
    type Context = ChatContext;
    type Writer = ChatWriter;

    fn to_upstream(body: &[u8], config: &Config, _: &str) -> Result<UpstreamRequest, ApiError> {
        chat_to_upstream(body, config)
    }

    fn respond(upstream_body: &[u8], ctx: &ChatContext) -> Result<(Vec<u8>, Usage), ApiError> {
        upstream_to_chat(upstream_body, &ctx.base, ctx.reasoning)
    }

    fn stream(ctx: ChatContext) -> Stream<ChatWriter> {
        ChatStream::new(ctx.base, ctx.client_wants_usage, ctx.reasoning)
    }
}
