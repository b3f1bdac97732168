//! The chat format (OpenAI chat completions): requests in, responses and streams out.
//!
//! The upstream speaks this format too, so the work is validation and normalisation on the
//! way in ([`request`]) and targeted rewriting on the way out ([`response`]).

pub mod request;
pub mod response;

#[cfg(test)]
mod tests;

pub use request::chat_to_upstream;
pub use response::{upstream_to_chat, ChatStream};
