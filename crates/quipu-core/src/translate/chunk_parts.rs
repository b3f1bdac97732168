//! What the messages and Responses stream translators do alike with an upstream chunk: which
//! of its parts reach the format's writer and in which order, how output is metered while the
//! upstream has reported no usage, and the finish held until usage is known.
//!
//! A format implements [`ChunkParts`] (what it writes for reasoning, text, a tool-call
//! fragment, the finish, the completion) and calls [`dispatch`] with each parsed chunk; the
//! rules live here once:
//!
//! - only choice 0 is read, and only until the finish: after it, a chunk's usage is all that
//!   counts (vLLM sends usage in a chunk of its own, with no choices);
//! - reasoning, then text, then tool-call fragments, in the order a delta carries them;
//!   a tool-call fragment the format refuses stops the chunk, and no finish is read from it;
//! - every non-empty fragment counts one output token until the upstream reports usage
//!   ([`Metered::usage`]), so a stream cut before its usage still bills what was sent (the
//!   chat stream, which relays chunks instead of walking them, meters with [`Metered`] too);
//! - the usage-only chunk after a finish completes the stream, or fails it with the error
//!   held from the finish.

use crate::error::ApiError;
use crate::protocol::upstream::{ChatChunk, ChunkChoice, ToolCallDelta};
use crate::usage::Usage;

/// The output metered so far, and an error held from the finish.
#[derive(Debug, Default)]
pub struct Metered {
    /// The last usage the upstream reported.
    reported: Option<Usage>,
    /// Non-empty fragments since that report: the fallback count of output tokens.
    fragments_since_usage: u64,
    /// An error that came with the finish, written once usage is known.
    pub held_error: Option<ApiError>,
}

impl Metered {
    /// The upstream reported `usage`: it replaces the fallback count.
    pub fn report(&mut self, usage: Usage) {
        self.reported = Some(usage);
        self.fragments_since_usage = 0;
    }

    /// `fragments` non-empty fragments were sent without usage.
    pub fn count(&mut self, fragments: u64) {
        self.fragments_since_usage = self.fragments_since_usage.saturating_add(fragments);
    }

    /// The usage reported, plus a token for each fragment sent since.
    pub fn usage(&self) -> Usage {
        let reported = self.reported.unwrap_or_default();
        Usage {
            completion_tokens: reported
                .completion_tokens
                .saturating_add(self.fragments_since_usage),
            ..reported
        }
    }
}

/// What a client format writes for the parts of an upstream chunk.
pub trait ChunkParts {
    fn metered(&mut self) -> &mut Metered;
    /// The finish arrived and is held until usage is known.
    fn finished(&self) -> bool;
    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>);
    fn text(&mut self, text: &str, out: &mut Vec<u8>);
    fn tool_delta(&mut self, delta: &ToolCallDelta<'_>, out: &mut Vec<u8>) -> Result<(), ApiError>;
    /// Choice 0's `finish_reason`: hold the finish (or an error) until usage is known.
    fn finish(&mut self, choice: &ChunkChoice<'_>, reason: &str, out: &mut Vec<u8>);
    /// The held finish, with the usage known.
    fn complete(&mut self, out: &mut Vec<u8>);
    /// A chunk carried usage (`chunk_usage` is it, read).
    fn usage_reported(&mut self, _chunk: &ChatChunk<'_>) {}
}

/// Feeds one parsed chunk, whose usage is `chunk_usage`, to `parts` (see the module docs).
pub fn dispatch<P: ChunkParts>(
    parts: &mut P,
    chunk: &ChatChunk<'_>,
    chunk_usage: Option<Usage>,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let choices = chunk.choices.as_deref().unwrap_or_default();
    let mut fragments = 0u64;
    let mut result = Ok(());
    // After the finish, only usage is read: the generation is over.
    let over = parts.finished() || parts.metered().held_error.is_some();
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
                if let Err(e) = parts.tool_delta(tc, out) {
                    result = Err(e);
                    break;
                }
            }
        }
        if let (Ok(()), Some(finish)) = (&result, choice.finish_reason.as_deref()) {
            parts.finish(choice, finish, out);
        }
    }
    match chunk_usage {
        Some(u) => {
            parts.metered().report(u);
            parts.usage_reported(chunk);
        }
        None => parts.metered().count(fragments),
    }
    result?;
    if choices.is_empty() && chunk.usage.is_some() {
        if let Some(e) = parts.metered().held_error.take() {
            return Err(e);
        }
        if parts.finished() {
            parts.complete(out);
        }
    }
    Ok(())
}
