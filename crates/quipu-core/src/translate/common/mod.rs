//! What the client formats share, each piece written once: a format folder imports from here,
//! never from another format's folder.
//!
//! - [`rawjson`]: helpers over raw JSON text (string literals read without decoding,
//!   compacting, nesting depth).
//! - [`request`]: the create request's top level (UTF-8, one object, serde's complaint as a
//!   client message), `model`, booleans, bounded numbers, token counts.
//! - [`images`]: images in a prompt (the model's vision, data and fetched URLs).
//! - [`tool_names`]: tool names as the upstream allows them (shortened stably past 64 bytes).
//! - [`finish`]: how a generation ended (the finish-reason table, upstream error objects in a
//!   `200`, malformed or cut-off tool arguments), for the formats that walk the answer.
//!
//! What the stream translators share is the stream core ([`super::stream_core`]) and the
//! chunk walk ([`super::chunk_parts`]); tool calls streamed as blocks are
//! [`super::tool_calls`].

pub mod finish;
pub mod images;
pub mod rawjson;
pub mod request;
pub mod tool_names;
