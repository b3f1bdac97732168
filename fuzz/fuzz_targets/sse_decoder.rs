//! The SSE decoder: the events of a byte stream do not depend on how it was split, and the
//! decoder never holds more than its cap.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quipu_core::sse::{SseDecoder, SseError};
use quipu_fuzz::{pieces, splits, Cursor};

fn decode(parts: &[&[u8]]) -> Result<Vec<(Option<String>, Vec<u8>)>, SseError> {
    let mut d = SseDecoder::new(4096);
    let mut out = Vec::new();
    for p in parts {
        d.feed::<SseError, _>(p, |e| {
            out.push((e.event.map(str::to_owned), e.data.to_vec()));
            Ok(())
        })?;
        assert!(d.buffered_len() <= 4096 + 1, "buffer beyond its cap");
    }
    d.finish::<SseError, _>(|e| {
        out.push((e.event.map(str::to_owned), e.data.to_vec()));
        Ok(())
    })?;
    Ok(out)
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let points = splits(&mut c, data.len().saturating_sub(6));
    let body = c.rest();
    let points: Vec<usize> = points.into_iter().map(|p| p.min(body.len())).collect();
    let whole = decode(&[body]);
    let split = decode(&pieces(body, &points));
    match (whole, split) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "split at {points:?} changed the events"),
        // An over-long event is an error either way (where exactly it trips may differ).
        (Err(_), Err(_)) => {}
        (a, b) => panic!("whole {a:?} vs split {b:?} at {points:?}"),
    }
});
