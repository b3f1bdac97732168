//! The SSE decoder: the events of a byte stream, and whether and where it fails, do not depend
//! on how it was split; the decoder never holds more than its cap.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::sse::{SseDecoder, SseError};
use quipu_fuzz::{pieces, split_input};

const CAP: usize = 4096;

type Events = Vec<(Option<String>, Vec<u8>)>;

/// The events delivered before the decoder stopped, and how it stopped.
fn decode(parts: &[&[u8]]) -> (Events, Result<(), SseError>) {
    let mut d = SseDecoder::new(CAP);
    let mut out = Vec::new();
    let mut push = |e: quipu_core::sse::SseEvent<'_>| {
        out.push((e.event.map(str::to_owned), e.data.to_vec()));
        Ok(())
    };
    for p in parts {
        if let Err(e) = d.feed::<SseError, _>(p, &mut push) {
            return (out, Err(e));
        }
        assert!(d.buffered_len() <= CAP, "buffer beyond its cap");
    }
    let r = d.finish::<SseError, _>(&mut push);
    (out, r)
}

fuzz_target!(|data: &[u8]| {
    let (body, points) = split_input(data);
    let whole = decode(&[body]);
    let split = decode(&pieces(body, &points));
    // One size rule on every path: an over-long line or event fails at the same event whether
    // it arrived whole or in pieces, after the same events.
    assert_eq!(
        whole, split,
        "split at {points:?} changed the events or the error"
    );
});
