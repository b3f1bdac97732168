//! Messages-format (Anthropic) translation: client requests → the upstream request, upstream
//! responses and streams → messages-format responses and event streams.
//!
//! - [`request`]: `POST /v1/messages` bodies → upstream chat-completions bodies.
//! - [`prompt`]: `system` / `messages` / `tools` → upstream `messages` / `tools` (shared with
//!   count-tokens).
//! - [`response`]: a non-streaming upstream completion → a `Message` object.
//! - [`stream`]: the incremental state machine turning upstream chunks into
//!   `message_start … message_stop` events, run by the stream core.
//! - [`count_tokens`]: `/v1/messages/count_tokens` ⇄ the upstream's `/tokenize`.
//! - [`conformance`]: an event-sequence validator and an SDK-style accumulator, for tests and
//!   fuzz targets.
//!
//! [`Messages`] is the format's [`Format`]. What it shares with the other formats (raw JSON
//! helpers, the request preamble, the finish table, tool-name shortening) is in [`super::common`].
//!
//! Usage semantics (docs/design.md): `input_tokens = prompt − cached`, `cache_read_input_tokens =
//! cached`, `cache_creation_input_tokens = 0`, `output_tokens = completion`.

pub mod conformance;
pub mod count_tokens;
pub mod prompt;
pub mod request;
pub mod response;
pub mod stream;

#[cfg(test)]
mod tests;

pub use conformance::{accumulate_message, validate_event_sequence};
pub use count_tokens::count_tokens_to_upstream;
pub use request::messages_to_upstream;
pub use response::upstream_to_message;
pub use stream::{MessagesStream, MessagesWriter};

use crate::config::Config;
use crate::error::{ApiError, ClientFormat};
use crate::translate::format::{Format, Wire};
use crate::translate::stream_core::Stream;
use crate::translate::{ResponseContext, UpstreamRequest};
use crate::usage::Usage;

/// The messages format (see [`Format`]). Its `count_tokens` endpoint is its own
/// ([`count_tokens`]).
pub struct Messages;

impl Format for Messages {
    const FORMAT: ClientFormat = ClientFormat::Messages;
    const WIRE: Wire = Wire {
        x_api_key: true,
        version_headers: &["compat-version", "anthropic-version"],
        keepalive: b"event: ping\ndata: {\"type\": \"ping\"}\n\n",
    };
    type Request = UpstreamRequest;
    type Context = ResponseContext;
    type Writer = MessagesWriter;

    fn to_upstream(body: &[u8], config: &Config, _: &str) -> Result<UpstreamRequest, ApiError> {
        messages_to_upstream(body, config)
    }

    fn respond(upstream_body: &[u8], ctx: &ResponseContext) -> Result<(Vec<u8>, Usage), ApiError> {
        upstream_to_message(upstream_body, ctx)
    }

    fn stream(ctx: ResponseContext) -> Stream<MessagesWriter> {
        MessagesStream::new(ctx)
    }
}
