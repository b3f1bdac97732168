//! Helpers for tests of the stream translators, shared by the unit tests, the integration
//! tests (`tests/conformance.rs`) and the fuzz targets, so that "replay these upstream bytes
//! the way the proxy would" is written once.
//!
//! Compiled for this crate's own tests and, for other crates, behind the `test-util` feature
//! (a dev-dependency feature: the gateway never enables it).

use crate::billing::{Charging, Prices};
use crate::error::ApiError;
use crate::money::{Pen, Rate};
use crate::sse::SseDecoder;
use crate::translate::{feed_stream, finish_stream, StreamEnd, StreamTranslator};
use crate::usage::Usage;

/// The terms the tests' answers are settled on: `aguila`'s prices in the embedded
/// configuration (S/ 1.00, 0.25 and 4.00 per million input, cached and output tokens), a
/// reservation of S/ 0.01 (a usage above about 2 500 output tokens is capped by it) and an
/// input estimate of 20 tokens (billed when a stream reports no input).
pub fn charging() -> Charging {
    let rate = |r: &str| Rate::parse(r).unwrap_or_default();
    Charging {
        prices: Prices {
            input: rate("1.00"),
            cached: rate("0.25"),
            output: rate("4.00"),
        },
        reserved: Pen::from_centimos(1),
        input_estimate: 20,
    }
}

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
