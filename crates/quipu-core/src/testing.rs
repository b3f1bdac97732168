//! Helpers for tests of the stream translators, shared by the unit tests, the integration
//! tests (`tests/conformance.rs`) and the fuzz targets, so that "replay these upstream bytes
//! the way the proxy would" is written once.
//!
//! Compiled for this crate's own tests and, for other crates, behind the `test-util` feature
//! (a dev-dependency feature: the gateway never enables it).

use crate::error::ApiError;
use crate::sse::SseDecoder;
use crate::translate::{feed_stream, finish_stream, StreamEnd, StreamTranslator};
use crate::usage::Usage;

/// What a stream translator made of one upstream response.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The bytes the client would have received, in order.
    pub out: Vec<u8>,
    /// [`StreamTranslator::usage`] at the end.
    pub usage: Usage,
    /// [`StreamTranslator::end`] at the end.
    pub end: StreamEnd,
    /// [`StreamTranslator::error`] at the end.
    pub error: Option<ApiError>,
}

/// Feeds the upstream's bytes to `translator` as the proxy does: each read through one
/// [`SseDecoder`] with [`feed_stream`], then [`finish_stream`] for a clean end of stream.
/// `reads` are the pieces the bytes arrive in; cut them anywhere (inside an event, a UTF-8
/// character or a CRLF) and the result must not change.
pub fn replay(translator: &mut dyn StreamTranslator, reads: &[&[u8]]) -> Replay {
    let mut decoder = SseDecoder::default();
    let mut out = Vec::new();
    for read in reads {
        feed_stream(&mut decoder, translator, read, &mut out);
    }
    finish_stream(&mut decoder, translator, &mut out);
    Replay {
        out,
        usage: translator.usage(),
        end: translator.end(),
        error: translator.error().cloned(),
    }
}
