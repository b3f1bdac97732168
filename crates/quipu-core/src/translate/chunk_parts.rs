//! What the messages and Responses stream translators do alike with an upstream chunk: which
//! of its parts reach the format's writer and in which order, how output is metered while the
//! upstream has reported no usage, and when the held finish is written.
//!
//! A format implements [`ChunkParts`] (what it writes for its start, reasoning, text, the
//! finish) over its [`StreamFormat`] and its [`CallBlocks`] (tool calls), and its `chunk` is
//! [`walk`]; the rules live here once:
//!
//! - a chunk that is not JSON fails the stream; an upstream error object in one fails it with
//!   that error, in the format's wording ([`upstream_error`]);
//! - the format's start is written before anything else, with the usage of the first chunk
//!   (vLLM's continuous usage stats: the prompt's tokens);
//! - only choice 0 is read, and only until the finish: after it, a chunk's usage is all that
//!   counts (vLLM sends usage in a chunk of its own, with no choices);
//! - reasoning, then text, then tool-call fragments, in the order a delta carries them;
//!   a tool-call fragment the format refuses stops the chunk, and no finish is read from it;
//! - every non-empty fragment counts one output token until the upstream reports usage
//!   ([`Metered`]), so a stream cut before its usage still bills what was sent (the chat
//!   stream, which relays chunks instead of walking them, counts its fragments the same way);
//! - the usage-only chunk after a finish completes the stream, or fails it with the error
//!   held from the finish ([`Core::usage_arrived`]).
//!
//! [`Metered`]: crate::translate::stream_core::Metered

use crate::error::ApiError;
use crate::protocol::upstream::{ChatChunk, ChunkChoice};
use crate::translate::common::finish::upstream_error;
use crate::translate::stream_core::{Core, StreamFormat};
use crate::translate::tool_calls::CallBlocks;
use crate::translate::{json_failure, malformed_stream};
use crate::usage::Usage;

/// What a client format writes for the parts of an upstream chunk. Tool-call fragments go to
/// its [`CallBlocks`] (a walking format shows each call as a block of its own).
pub trait ChunkParts: StreamFormat + CallBlocks {
    /// The stream's first frames, before any part; `usage` is the first chunk's, if it has
    /// one.
    fn start(&mut self, usage: Option<&Usage>, out: &mut Vec<u8>);
    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>);
    fn text(&mut self, text: &str, out: &mut Vec<u8>);
    /// Choice 0's `finish_reason`: what to write once usage is known, or the error the finish
    /// amounts to (held too, so the usage chunk is metered first).
    fn finish(
        &mut self,
        choice: &ChunkChoice<'_>,
        reason: &str,
        out: &mut Vec<u8>,
    ) -> Result<Self::Held, ApiError>;
    /// A chunk carried usage (`chunk.usage`, already reported to the meter).
    fn usage_reported(&mut self, _chunk: &ChatChunk<'_>) {}
}

/// [`StreamFormat::chunk`] of a format that walks chunks (see the module docs).
pub fn walk<P: ChunkParts>(
    parts: &mut P,
    core: &mut Core<P::Held>,
    data: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let chunk: ChatChunk<'_> =
        serde_json::from_slice(data).map_err(|e| malformed_stream(&json_failure("a chunk", &e)))?;
    if chunk.error.is_some() || chunk.object.as_deref() == Some("error") {
        return Err(upstream_error(data, parts.context(), P::FORMAT));
    }
    let chunk_usage = chunk.usage();
    parts.start(chunk_usage.as_ref(), out);
    dispatch(parts, core, &chunk, chunk_usage, out)
}

/// Feeds one parsed chunk, whose usage is `chunk_usage`, to `parts` (see the module docs).
fn dispatch<P: ChunkParts>(
    parts: &mut P,
    core: &mut Core<P::Held>,
    chunk: &ChatChunk<'_>,
    chunk_usage: Option<Usage>,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let choices = chunk.choices.as_deref().unwrap_or_default();
    let mut fragments = 0u64;
    let mut result = Ok(());
    // After the finish, only usage is read: the generation is over.
    let over = core.finished();
    let choice = match over {
        false => choices.iter().find(|c| c.index == 0),
        true => None,
    };
    if let Some(choice) = choice {
        if let Some(d) = &choice.delta {
            if let Some(r) = d.reasoning_text() {
                parts.reasoning(r, out);
                fragments += 1;
            }
            if let Some(t) = d.content.as_deref().filter(|t| !t.is_empty()) {
                parts.text(t, out);
                fragments += 1;
            }
            for tc in d.tool_calls.iter().flatten() {
                let carries = tc
                    .function
                    .as_ref()
                    .and_then(|f| f.arguments.as_deref())
                    .is_some_and(|a| !a.is_empty());
                fragments += u64::from(carries);
                if let Err(e) = parts.call_delta(tc, out) {
                    result = Err(e);
                    break;
                }
            }
        }
        if let (Ok(()), Some(finish)) = (&result, choice.finish_reason.as_deref()) {
            match parts.finish(choice, finish, out) {
                Ok(held) => core.hold(held),
                Err(e) => core.hold_error(e),
            }
        }
    }
    match chunk_usage {
        Some(u) => {
            core.metered.report(u);
            parts.usage_reported(chunk);
        }
        None => core.metered.count(fragments),
    }
    result?;
    if choices.is_empty() && chunk.usage.is_some() {
        return core.usage_arrived(parts, out);
    }
    Ok(())
}
