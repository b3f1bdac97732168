//! Incremental Server-Sent Events decoder and the two encoders Quipu writes.
//!
//! Sans-I/O: [`SseDecoder::feed`] takes whatever bytes the socket gave, calls back once per
//! complete event and keeps the rest (a partial line, a partial event) for the next call. It
//! never re-scans bytes it has already consumed and allocates nothing per event: the data of
//! an event is assembled in one reused buffer.
//!
//! Follows the HTML spec's event-stream interpretation
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation>):
//! lines end in CRLF, LF or CR; a line starting with `:` is a comment; `data` lines are joined
//! with `\n`; a blank line dispatches the event; an event with no `data` line is dropped.
//! `id` and `retry` are ignored (no reconnection here). `[DONE]` and `ping` are protocol
//! matters handled one layer up.
//!
//! One size rule bounds memory against a broken or hostile upstream: the data of the event
//! being assembled plus the whole line being assembled (whatever its field — `data`, `event`,
//! a comment, an unknown field) may not exceed the cap, else [`SseError::EventTooLarge`]. It is
//! checked before anything is buffered and again when a line completes, so the same bytes
//! give the same events, and the same error at the same event, however they were split into
//! reads.
//!
//! Lines are split on `\n`/`\r` bytes, which never occur inside a multi-byte UTF-8 sequence, so
//! a code point split across two reads needs no special care here; the data is handed on as
//! bytes and its UTF-8 is checked by the translator that reads it (whole, where it relays the
//! bytes: a JSON parser checks only the strings it does not skip).

use std::fmt;

/// One decoded event. Borrowed from the decoder: valid until the next `feed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The `event:` field, if the event had one.
    pub event: Option<&'a str>,
    /// The `data:` lines joined with `\n`.
    pub data: &'a [u8],
}

/// Why the decoder gave up. The stream cannot be resumed after an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseError {
    /// A single event grew past the configured cap (a broken or hostile upstream).
    EventTooLarge { limit: usize },
    /// The `event:` field was not UTF-8.
    InvalidEventName,
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::EventTooLarge { limit } => {
                write!(f, "an SSE event exceeded {limit} bytes")
            }
            SseError::InvalidEventName => write!(f, "an SSE event name was not UTF-8"),
        }
    }
}

impl std::error::Error for SseError {}

/// Default cap on one event (its data so far plus the line being assembled): 8 MiB.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// Incremental decoder. See the module docs.
#[derive(Debug)]
pub struct SseDecoder {
    /// A line that has started but not ended in the bytes seen so far.
    partial_line: Vec<u8>,
    /// Data of the event being assembled.
    data: Vec<u8>,
    /// Event name of the event being assembled.
    event: Vec<u8>,
    has_data: bool,
    has_event: bool,
    /// The previous chunk ended in `\r`: a `\n` at the start of the next one is part of it.
    after_cr: bool,
    max_event_bytes: usize,
}

impl Default for SseDecoder {
    fn default() -> Self {
        SseDecoder::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseDecoder {
    pub fn new(max_event_bytes: usize) -> Self {
        SseDecoder {
            partial_line: Vec::new(),
            data: Vec::new(),
            event: Vec::new(),
            has_data: false,
            has_event: false,
            after_cr: false,
            max_event_bytes,
        }
    }

    /// Feeds bytes; calls `on_event` for each event completed by them, in order.
    ///
    /// An error returned by `on_event` stops decoding and is returned as is; the decoder's own
    /// errors are converted into the callback's error type with `From<SseError>`.
    pub fn feed<E, F>(&mut self, mut input: &[u8], mut on_event: F) -> Result<(), E>
    where
        F: FnMut(SseEvent<'_>) -> Result<(), E>,
        E: From<SseError>,
    {
        // An empty read says nothing about whether a `\n` follows a held `\r`: keep waiting.
        if self.after_cr && !input.is_empty() {
            self.after_cr = false;
            if input[0] == b'\n' {
                input = &input[1..];
            }
        }
        while !input.is_empty() {
            let Some(end) = memchr::memchr2(b'\n', b'\r', input) else {
                self.check_cap(input.len())?;
                self.partial_line.extend_from_slice(input);
                return Ok(());
            };
            // The same rule as above, for the line this terminator completes: whether a line
            // arrived whole or in pieces does not change whether it fits.
            self.check_cap(end)?;
            let terminator = input[end];
            let rest_start = if terminator == b'\r' {
                match input.get(end + 1) {
                    Some(b'\n') => end + 2,
                    Some(_) => end + 1,
                    None => {
                        self.after_cr = true;
                        end + 1
                    }
                }
            } else {
                end + 1
            };
            if self.partial_line.is_empty() {
                self.process_line(&input[..end], &mut on_event)?;
            } else {
                let mut line = std::mem::take(&mut self.partial_line);
                line.extend_from_slice(&input[..end]);
                let result = self.process_line(&line, &mut on_event);
                line.clear();
                self.partial_line = line;
                result?;
            }
            input = &input[rest_start..];
        }
        Ok(())
    }

    /// Ends the stream. An event whose last `data` line ended but whose blank line never came
    /// is dispatched (servers that close right after `data: [DONE]\n` exist); a line that never
    /// ended is dropped, as the HTML spec's interpretation says (see the module docs).
    pub fn finish<E, F>(&mut self, mut on_event: F) -> Result<(), E>
    where
        F: FnMut(SseEvent<'_>) -> Result<(), E>,
        E: From<SseError>,
    {
        self.partial_line.clear();
        self.dispatch(&mut on_event)
    }

    /// Bytes held for an unfinished line or event (for tests and buffer-bound checks).
    pub fn buffered_len(&self) -> usize {
        self.partial_line.len() + self.data.len()
    }

    /// The one size rule, applied to every byte before it is buffered or used: the event's
    /// data so far plus the whole line being assembled (any field, comments included; `more`
    /// bytes of it not yet buffered) may not exceed the cap. Checked on every path, so a line
    /// fits or not whatever the read boundaries were, and the decoder never holds more than
    /// the cap.
    fn check_cap(&self, more: usize) -> Result<(), SseError> {
        let total = self
            .data
            .len()
            .saturating_add(self.partial_line.len())
            .saturating_add(more);
        if total > self.max_event_bytes {
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        Ok(())
    }

    fn process_line<E, F>(&mut self, line: &[u8], on_event: &mut F) -> Result<(), E>
    where
        F: FnMut(SseEvent<'_>) -> Result<(), E>,
        E: From<SseError>,
    {
        if line.is_empty() {
            return self.dispatch(on_event);
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                let value = value.strip_prefix(b" ").unwrap_or(value);
                (&line[..colon], value)
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                // Within the cap: `check_cap` admitted `data` plus this whole line, which is
                // longer than the `\n` and value appended here.
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
                self.has_event = true;
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch<E, F>(&mut self, on_event: &mut F) -> Result<(), E>
    where
        F: FnMut(SseEvent<'_>) -> Result<(), E>,
        E: From<SseError>,
    {
        let result = if self.has_data {
            let event = if self.has_event {
                Some(std::str::from_utf8(&self.event).map_err(|_| SseError::InvalidEventName)?)
            } else {
                None
            };
            on_event(SseEvent {
                event,
                data: &self.data,
            })
        } else {
            Ok(())
        };
        self.data.clear();
        self.event.clear();
        self.has_data = false;
        self.has_event = false;
        result
    }
}

/// Appends a chat-format frame: `data: <json>\n\n`.
#[inline]
pub fn write_data_frame(out: &mut Vec<u8>, json: &[u8]) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
}

/// The chat format's end-of-stream frame.
pub const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";

/// Appends a messages-format frame: `event: <name>\ndata: <json>\n\n`.
#[inline]
pub fn write_event_frame(out: &mut Vec<u8>, event: &str, json: &[u8]) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Ev(Option<String>, String);

    fn decode_chunks(chunks: &[&[u8]]) -> Vec<Ev> {
        let mut d = SseDecoder::default();
        let mut out = Vec::new();
        for c in chunks {
            d.feed::<SseError, _>(c, |e| {
                out.push(Ev(
                    e.event.map(str::to_owned),
                    String::from_utf8(e.data.to_vec()).unwrap(),
                ));
                Ok(())
            })
            .unwrap();
        }
        d.finish::<SseError, _>(|e| {
            out.push(Ev(
                e.event.map(str::to_owned),
                String::from_utf8(e.data.to_vec()).unwrap(),
            ));
            Ok(())
        })
        .unwrap();
        out
    }

    fn ev(name: Option<&str>, data: &str) -> Ev {
        Ev(name.map(str::to_owned), data.to_owned())
    }

    #[test]
    fn basic_and_named_events() {
        let got = decode_chunks(&[b"data: a\n\nevent: x\ndata: b\n\n"]);
        assert_eq!(got, vec![ev(None, "a"), ev(Some("x"), "b")]);
    }

    #[test]
    fn split_inside_a_field() {
        let got = decode_chunks(&[b"data: Hello,", b"", b" world!\n\n"]);
        assert_eq!(got, vec![ev(None, "Hello, world!")]);
    }

    #[test]
    fn utf8_split_across_chunks() {
        let s = "data: 👍\n\n".as_bytes();
        let got = decode_chunks(&[&s[..7], &s[7..8], &s[8..]]);
        assert_eq!(got, vec![ev(None, "👍")]);
    }

    #[test]
    fn crlf_cr_and_lf_line_endings() {
        let got = decode_chunks(&[b"data: a\r\n\r\ndata: b\r\rdata: c\n\n"]);
        assert_eq!(got, vec![ev(None, "a"), ev(None, "b"), ev(None, "c")]);
    }

    #[test]
    fn crlf_split_between_chunks() {
        let got = decode_chunks(&[b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n"]);
        assert_eq!(got, vec![ev(None, "a"), ev(None, "b")]);
    }

    #[test]
    fn empty_read_between_cr_and_lf() {
        // Found by the sse_decoder fuzz target: an empty read after a chunk ending in `\r`
        // used to forget the `\r`, so the `\n` that followed counted as a blank line.
        let got = decode_chunks(&[b"data: a\r", b"", b"\ndata: b\n\n"]);
        assert_eq!(got, vec![ev(None, "a\nb")]);
    }

    #[test]
    fn multiline_data_comments_and_no_space() {
        let got = decode_chunks(&[b": keepalive\ndata:x\ndata: y\nid: 7\nretry: 10\n\n"]);
        assert_eq!(got, vec![ev(None, "x\ny")]);
    }

    #[test]
    fn event_without_data_is_dropped() {
        let got = decode_chunks(&[b"event: ping\n\ndata: z\n\n"]);
        assert_eq!(got, vec![ev(None, "z")]);
    }

    #[test]
    fn stream_ending_without_blank_line() {
        assert_eq!(
            decode_chunks(&[b"data: [DONE]\n"]),
            vec![ev(None, "[DONE]")]
        );
        assert_eq!(decode_chunks(&[b"data: [DONE]"]), vec![]);
    }

    #[test]
    fn every_split_offset_gives_the_same_events() {
        let stream = "event: a\ndata: {\"t\":\"ñ🦙\"}\n\ndata: 1\r\n\r\n: c\ndata: 2\rdata: 3\r\r"
            .as_bytes();
        let whole = decode_chunks(&[stream]);
        assert_eq!(whole.len(), 3);
        for i in 0..=stream.len() {
            for j in i..=stream.len() {
                let got = decode_chunks(&[&stream[..i], &stream[i..j], &stream[j..]]);
                assert_eq!(got, whole, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn oversized_event_is_an_error_and_buffer_is_bounded() {
        let mut d = SseDecoder::new(16);
        let r = d.feed::<SseError, _>(b"data: 0123456789abcdefghij", |_| Ok(()));
        assert_eq!(r, Err(SseError::EventTooLarge { limit: 16 }));
        let mut d = SseDecoder::new(16);
        let r = d.feed::<SseError, _>(b"data: 0123456789\ndata: 0123456789\n", |_| Ok(()));
        assert!(r.is_err());
    }

    /// Events delivered before the decoder stopped, and how it stopped.
    fn decode_capped(cap: usize, chunks: &[&[u8]]) -> (Vec<Ev>, Result<(), SseError>) {
        let mut d = SseDecoder::new(cap);
        let mut out = Vec::new();
        let mut push = |e: SseEvent<'_>| {
            out.push(Ev(
                e.event.map(str::to_owned),
                String::from_utf8_lossy(e.data).into_owned(),
            ));
            Ok(())
        };
        for c in chunks {
            if let Err(e) = d.feed::<SseError, _>(c, &mut push) {
                return (out, Err(e));
            }
            assert!(d.buffered_len() <= cap, "buffer beyond its cap");
        }
        let r = d.finish::<SseError, _>(&mut push);
        (out, r)
    }

    #[test]
    fn the_cap_applies_to_every_line_whole_or_split() {
        let too_large = Err(SseError::EventTooLarge { limit: 16 });
        let cases: [(&[u8], usize, Result<(), SseError>); 9] = [
            // A data line of exactly the cap fits, one byte more does not.
            (
                b"data: 0123456789

",
                1,
                Ok(()),
            ),
            (
                b"data: 0123456789a

",
                0,
                too_large.clone(),
            ),
            // Non-data lines count too (they used to be checked only when split).
            (
                b": a comment longer than 16
data: x

",
                0,
                too_large.clone(),
            ),
            (
                b"event: a-very-long-name
data: x

",
                0,
                too_large.clone(),
            ),
            (
                b"retry: 12345678901234567
data: x

",
                0,
                too_large.clone(),
            ),
            // The event's data so far plus the next line.
            (
                b"data: 01234567
event: abcdefgh

",
                0,
                too_large.clone(),
            ),
            (
                b"data: x

data: 0123456789

",
                2,
                Ok(()),
            ),
            (
                b"data: x

data: 0123456789ab

",
                1,
                too_large.clone(),
            ),
            // An unterminated tail over the cap, at the end of the stream.
            (
                b"data: y

data: 0123456789abcdef",
                1,
                too_large.clone(),
            ),
        ];
        for (stream, events, result) in cases {
            let label = String::from_utf8_lossy(stream);
            let whole = decode_capped(16, &[stream]);
            assert_eq!(whole.0.len(), events, "{label}");
            assert_eq!(whole.1, result, "{label}");
            for i in 0..=stream.len() {
                let split = decode_capped(16, &[&stream[..i], &stream[i..]]);
                assert_eq!(split, whole, "{label} split@{i}");
            }
            let bytes: Vec<&[u8]> = stream.chunks(1).collect();
            assert_eq!(decode_capped(16, &bytes), whole, "{label} bytewise");
        }
    }

    #[test]
    fn encoders() {
        let mut out = Vec::new();
        write_data_frame(&mut out, b"{}");
        write_event_frame(&mut out, "ping", br#"{"type":"ping"}"#);
        out.extend_from_slice(DONE_FRAME);
        assert_eq!(
            out,
            b"data: {}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\ndata: [DONE]\n\n".to_vec()
        );
    }
}
