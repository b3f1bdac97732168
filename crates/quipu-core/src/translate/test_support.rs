//! What the format folders' unit tests share: reading an `event: …` stream back, and the
//! recorded upstream streams of `tests/fixtures/streams/` (`fixture!`).

use serde_json::Value;

/// The frames of an `event: <name>\ndata: <json>` stream: (name, data).
pub(crate) fn events(bytes: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(bytes).unwrap();
    text.split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (ev, data) = f.split_once('\n').unwrap();
            (
                ev.strip_prefix("event: ").unwrap().to_owned(),
                serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
            )
        })
        .collect()
}

/// The event names of such a stream.
pub(crate) fn names(bytes: &[u8]) -> Vec<String> {
    events(bytes).into_iter().map(|(n, _)| n).collect()
}

/// A recorded upstream stream, by name.
macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/streams/",
            $name,
            ".sse"
        ))
    };
}
pub(crate) use fixture;
