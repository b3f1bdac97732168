//! HTTP/1.1 for the upstream client, without I/O: the request it sends ([`request`]), the
//! response head, and a body decoder that hands back ranges of the caller's read buffer (no
//! copy) for `Content-Length`, chunked and close-delimited bodies (RFC 9112 §6).
//!
//! Quipu reads upstream responses through its own small buffer instead of pingora's HTTP/1
//! client, whose session keeps a 4 KiB head buffer and a 64 KiB body buffer per response, plus a
//! header map Quipu never looks at: with 10,000 streams open that was a quarter of the gateway's
//! memory. What Quipu needs of a head is four facts (status, `Retry-After`, framing,
//! keep-alive), which this module extracts in one pass over `httparse`'s output.

use std::ops::Range;

/// Headers an upstream response may carry (vLLM sends 4–6; llama.cpp ~8).
const MAX_HEADERS: usize = 64;
/// Longest chunk-size or trailer line accepted.
const MAX_LINE: usize = 4096;

/// What goes into an upstream request (always a `POST` of JSON).
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: Method,
    /// The request target, e.g. `/v1/chat/completions`.
    pub path: &'a str,
    /// The `Host` header.
    pub authority: &'a str,
    pub body: &'a [u8],
    /// Sent as `x-request-id`.
    pub request_id: &'a str,
    /// Sent as `Authorization: Bearer`.
    pub api_key: Option<&'a str>,
}

/// The methods Quipu sends upstream: `POST` with a JSON body (completions, tokenizers), `GET`
/// without one (what a server is: `/v1/models`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

/// Request bodies up to this size are copied behind the head and sent in the same write: a
/// 16 KiB copy costs less than a second system call.
pub const INLINE_BODY: usize = 16 * 1024;

impl Request<'_> {
    /// Whether [`request`] puts the body in the returned bytes (else the caller sends it).
    pub fn body_inline(&self) -> bool {
        self.body.len() <= INLINE_BODY
    }
}

/// The bytes of the request head, followed by the body when [`Request::body_inline`]. Header
/// names are lowercase (upstreams read them case-insensitively). A value with a control
/// character is refused: a CR or LF would split the request.
pub fn request(r: &Request<'_>) -> Result<Vec<u8>, String> {
    let fields = [
        ("request path", r.path),
        ("host", r.authority),
        ("x-request-id", r.request_id),
        ("authorization", r.api_key.unwrap_or_default()),
    ];
    for (name, value) in fields {
        let bad_path = name == "request path" && (value.is_empty() || value.contains(' '));
        if bad_path
            || !value
                .bytes()
                .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
        {
            return Err(format!("invalid {name} for an upstream request: {value:?}"));
        }
    }
    let inline = r.body_inline();
    let body_room = if inline { r.body.len() } else { 0 };
    let mut w = Vec::with_capacity(192 + r.path.len() + r.request_id.len() + body_room);
    w.extend_from_slice(match r.method {
        Method::Get => b"GET ",
        Method::Post => b"POST ",
    });
    w.extend_from_slice(r.path.as_bytes());
    w.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    w.extend_from_slice(r.authority.as_bytes());
    match r.method {
        Method::Get => {}
        Method::Post => {
            w.extend_from_slice(b"\r\ncontent-type: application/json\r\ncontent-length: ");
            w.extend_from_slice(itoa::Buffer::new().format(r.body.len()).as_bytes());
        }
    }
    w.extend_from_slice(b"\r\nx-request-id: ");
    w.extend_from_slice(r.request_id.as_bytes());
    if let Some(key) = r.api_key {
        w.extend_from_slice(b"\r\nauthorization: Bearer ");
        w.extend_from_slice(key.as_bytes());
    }
    w.extend_from_slice(b"\r\n\r\n");
    if inline {
        w.extend_from_slice(r.body);
    }
    Ok(w)
}

/// What Quipu needs of a response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    /// `Retry-After` in whole seconds, when it is a number.
    pub retry_after: Option<u64>,
    pub framing: Framing,
    /// Whether the connection may carry another request once this body is read.
    pub keep_alive: bool,
}

/// How the body of a response ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    /// Read until the upstream closes the connection.
    UntilClose,
}

/// Parses a response head at the start of `buf`: `Ok(None)` while it is incomplete, otherwise
/// the head and its length in bytes. A 1xx head is returned like any other: the caller skips
/// it and parses again (see [`Head::is_informational`]).
pub fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("invalid response head: {e}")),
    };
    let status = resp.code.unwrap_or(0);
    let http11 = resp.version == Some(1);
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding = false;
    let mut close = false;
    let mut keep_alive_token = false;
    let mut retry_after = None;
    for h in resp.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let n = parse_length(h.value)?;
            if length.is_some_and(|l| l != n) {
                return Err("conflicting Content-Length headers".into());
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = true;
            // Only the final coding decides whether the body is chunked.
            chunked = last_token(h.value).is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive_token |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case("retry-after") {
            retry_after = parse_retry_after(h.value);
        }
    }
    let bodiless = (100..200).contains(&status) || status == 204 || status == 304;
    let framing = if bodiless {
        Framing::Length(0)
    } else if transfer_encoding {
        // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length; a final coding other than
        // chunked is read until the connection closes.
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else {
        match length {
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    };
    // A message framed both ways may have been smuggled: never reuse its connection.
    let ambiguous = transfer_encoding && length.is_some();
    let keep_alive = !close
        && !ambiguous
        && framing != Framing::UntilClose
        && (http11 || (keep_alive_token && !transfer_encoding));
    let head = Head {
        status,
        retry_after,
        framing,
        keep_alive,
    };
    Ok(Some((head, len)))
}

impl Head {
    /// A 1xx interim response (`100 Continue`, `103 Early Hints`): the real one follows.
    /// `101 Switching Protocols` is not: Quipu never asks for an upgrade.
    pub fn is_informational(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }
}

fn parse_length(v: &[u8]) -> Result<u64, String> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return Err(format!(
            "invalid Content-Length {:?}",
            String::from_utf8_lossy(v)
        ));
    }
    Ok(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

fn last_token(v: &[u8]) -> Option<&[u8]> {
    v.rsplit(|&b| b == b',')
        .next()
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// `Retry-After: <seconds>` (fractions rounded up); an HTTP date is ignored.
fn parse_retry_after(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v)
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(|v| v.ceil() as u64)
}

/// What one decoding step produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Body bytes: this range of the input.
    Data(Range<usize>),
    /// The input ran out before the next body byte: read more.
    More,
    /// The body is complete.
    End,
}

/// Decodes a response body from successive views of a read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Bytes left of a `Content-Length` body.
    Length(u64),
    ChunkSize,
    /// Bytes left of the current chunk.
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    Trailer,
    UntilClose,
    Done,
}

impl Body {
    pub fn new(framing: Framing) -> Body {
        let state = match framing {
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::UntilClose => State::UntilClose,
        };
        Body { state }
    }

    /// Whether the whole body has been decoded.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes from `input`, the buffered bytes not yet consumed: returns how many of them this
    /// step consumed and what they yield. Chunk framing is consumed without being yielded, so a
    /// step may consume bytes and still ask for more.
    pub fn step(&mut self, input: &[u8]) -> Result<(usize, Step), String> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.state {
                State::Done => return Ok((used, Step::End)),
                State::Length(left) | State::ChunkData(left) => {
                    if rest.is_empty() {
                        return Ok((used, Step::More));
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(rest.len());
                    let left = left - n as u64;
                    self.state = match self.state {
                        State::Length(_) if left == 0 => State::Done,
                        State::Length(_) => State::Length(left),
                        _ if left == 0 => State::ChunkEnd,
                        _ => State::ChunkData(left),
                    };
                    return Ok((used + n, Step::Data(used..used + n)));
                }
                State::UntilClose => {
                    if rest.is_empty() {
                        return Ok((used, Step::More));
                    }
                    return Ok((input.len(), Step::Data(used..input.len())));
                }
                State::ChunkEnd => match rest {
                    [b'\r', b'\n', ..] => {
                        used += 2;
                        self.state = State::ChunkSize;
                    }
                    [b'\n', ..] => {
                        used += 1;
                        self.state = State::ChunkSize;
                    }
                    [] | [b'\r'] => return Ok((used, Step::More)),
                    _ => return Err("chunk data not followed by CRLF".into()),
                },
                State::ChunkSize | State::Trailer => {
                    let Some(line) = take_line(rest)? else {
                        return Ok((used, Step::More));
                    };
                    used += line.len;
                    self.state = match self.state {
                        State::ChunkSize => match chunk_size(line.text)? {
                            0 => State::Trailer,
                            n => State::ChunkData(n),
                        },
                        // Trailer fields are skipped; an empty line ends the body.
                        _ if line.text.is_empty() => State::Done,
                        _ => State::Trailer,
                    };
                }
            }
        }
    }

    /// The upstream closed the connection: the end of a close-delimited body, an error for
    /// any other body that is not complete.
    pub fn at_eof(&mut self) -> Result<(), String> {
        match self.state {
            State::UntilClose | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err("the upstream closed the connection before the body ended".into()),
        }
    }
}

struct Line<'a> {
    /// Without its line ending.
    text: &'a [u8],
    /// Including its line ending.
    len: usize,
}

fn take_line(input: &[u8]) -> Result<Option<Line<'_>>, String> {
    match memchr::memchr(b'\n', input) {
        // The same limit whether the line arrived whole or in pieces.
        Some(i) if i > MAX_LINE => Err("chunk framing line too long".into()),
        Some(i) => {
            let text = &input[..i];
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            Ok(Some(Line { text, len: i + 1 }))
        }
        None if input.len() > MAX_LINE => Err("chunk framing line too long".into()),
        None => Ok(None),
    }
}

fn chunk_size(line: &[u8]) -> Result<u64, String> {
    // Chunk extensions (`;name=value`) are allowed and ignored.
    let digits = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let invalid = || format!("invalid chunk size {:?}", String::from_utf8_lossy(line));
    if digits.is_empty() || digits.len() > 15 {
        return Err(invalid());
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let v = (d as char).to_digit(16).ok_or_else(invalid)?;
        Ok(n * 16 + u64::from(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(body: &'a [u8], request_id: &'a str, api_key: Option<&'a str>) -> Request<'a> {
        Request {
            method: Method::Post,
            path: "/v1/chat/completions",
            authority: "10.0.0.7:8000",
            body,
            request_id,
            api_key,
        }
    }

    #[test]
    fn a_request_is_one_head_and_a_small_body() {
        let wire = request(&req(b"{}", "req_1", Some("sk-up"))).unwrap();
        assert_eq!(
            wire,
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 10.0.0.7:8000\r\n\
              content-type: application/json\r\ncontent-length: 2\r\nx-request-id: req_1\r\n\
              authorization: Bearer sk-up\r\n\r\n{}"
        );
        let wire = request(&req(b"{}", "req_1", None)).unwrap();
        assert!(wire.ends_with(b"x-request-id: req_1\r\n\r\n{}"));
    }

    #[test]
    fn a_get_has_no_body_headers() {
        let mut r = req(b"", "req_2", Some("sk-up"));
        r.method = Method::Get;
        r.path = "/v1/models";
        assert_eq!(
            request(&r).unwrap(),
            b"GET /v1/models HTTP/1.1\r\nhost: 10.0.0.7:8000\r\nx-request-id: req_2\r\n\
              authorization: Bearer sk-up\r\n\r\n"
        );
    }

    #[test]
    fn a_large_body_is_left_to_the_caller() {
        let body = vec![b'x'; INLINE_BODY + 1];
        let r = req(&body, "req_1", None);
        assert!(!r.body_inline());
        let wire = request(&r).unwrap();
        assert!(wire.ends_with(b"content-length: 16385\r\nx-request-id: req_1\r\n\r\n"));
        assert!(req(&body[..INLINE_BODY], "req_1", None).body_inline());
    }

    #[test]
    fn a_value_that_would_split_the_request_is_refused() {
        for id in ["a\r\nx-evil: 1", "a\nb", "a\0b", "a\x7fb"] {
            assert!(request(&req(b"{}", id, None)).is_err(), "{id:?}");
        }
        assert!(request(&req(b"{}", "ok", Some("k\r\n"))).is_err());
        let mut r = req(b"{}", "ok", None);
        r.path = "/v1/chat completions";
        assert!(request(&r).is_err());
        // Tabs and non-ASCII bytes are allowed in field values, as in `http::HeaderValue`.
        assert!(request(&req(b"{}", "a\tb", Some("clé"))).is_ok());
    }

    fn head(text: &str) -> Head {
        let (h, n) = parse_head(text.as_bytes()).unwrap().unwrap();
        assert_eq!(n, text.len());
        h
    }

    #[test]
    fn a_head_gives_status_framing_and_keep_alive() {
        let h =
            head("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n");
        assert_eq!(h.status, 200);
        assert_eq!(h.framing, Framing::Length(12));
        assert!(h.keep_alive);
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked);
        assert!(h.keep_alive);
        let h = head("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n");
        assert!(!h.keep_alive);
    }

    #[test]
    fn a_head_without_length_is_read_until_close() {
        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(h.framing, Framing::UntilClose);
        assert!(!h.keep_alive);
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n");
        assert_eq!(h.framing, Framing::UntilClose);
    }

    #[test]
    fn http_1_0_keeps_alive_only_when_asked() {
        assert!(!head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive);
        assert!(
            head("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n")
                .keep_alive
        );
    }

    #[test]
    fn transfer_encoding_wins_over_length_and_the_connection_is_not_reused() {
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked);
        assert!(!h.keep_alive);
    }

    #[test]
    fn bad_lengths_are_errors() {
        for bad in ["abc", "-1", "1 2", "", "99999999999999999999"] {
            let text = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n");
            assert!(parse_head(text.as_bytes()).is_err(), "{bad:?}");
        }
        let dup = "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert!(parse_head(dup.as_bytes()).is_err());
        let same = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(head(same).framing, Framing::Length(2));
    }

    #[test]
    fn partial_and_invalid_heads() {
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le").unwrap(), None);
        assert_eq!(parse_head(b"").unwrap(), None);
        assert!(parse_head(b"SMTP ready\r\n\r\n").is_err());
    }

    #[test]
    fn status_codes_without_a_body_and_interim_ones() {
        assert_eq!(
            head("HTTP/1.1 204 No Content\r\n\r\n").framing,
            Framing::Length(0)
        );
        let h = head("HTTP/1.1 100 Continue\r\n\r\n");
        assert!(h.is_informational());
        assert!(!head("HTTP/1.1 101 Switching Protocols\r\n\r\n").is_informational());
    }

    #[test]
    fn retry_after_in_seconds() {
        let h = head("HTTP/1.1 429 Too Many\r\nRetry-After: 2.5\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(h.retry_after, Some(3));
        let h = head("HTTP/1.1 503 X\r\nRetry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\n\r\n");
        assert_eq!(h.retry_after, None);
        let h = head("HTTP/1.1 503 X\r\nRetry-After: -1\r\n\r\n");
        assert_eq!(h.retry_after, None);
    }

    /// Feeds `wire` to a decoder in pieces of `piece` bytes, as reads would deliver it,
    /// keeping unconsumed bytes like the client's buffer does; returns the body.
    fn decode(framing: Framing, wire: &[u8], piece: usize) -> Result<Vec<u8>, String> {
        let mut body = Body::new(framing);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        let mut fed = 0;
        loop {
            let (used, step) = body.step(&buf)?;
            match step {
                Step::Data(r) => out.extend_from_slice(&buf[r]),
                Step::End => return Ok(out),
                Step::More if fed == wire.len() => {
                    body.at_eof()?;
                    return Ok(out);
                }
                Step::More => {
                    let end = (fed + piece).min(wire.len());
                    buf.drain(..used);
                    buf.extend_from_slice(&wire[fed..end]);
                    fed = end;
                    continue;
                }
            }
            buf.drain(..used);
        }
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_sizes() {
        let wire = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\nx-trailer: 1\r\n\r\n";
        for piece in 1..=wire.len() {
            assert_eq!(
                decode(Framing::Chunked, wire, piece).unwrap(),
                b"hello world!",
                "{piece}"
            );
        }
    }

    #[test]
    fn chunked_framing_errors() {
        assert!(decode(Framing::Chunked, b"zz\r\nhello\r\n0\r\n\r\n", 64).is_err());
        assert!(decode(Framing::Chunked, b"5\r\nhelloXX0\r\n\r\n", 64).is_err());
        // Cut short: the connection closed mid-body.
        assert!(decode(Framing::Chunked, b"5\r\nhel", 64).is_err());
        // An over-long line fails whether it arrives whole or in pieces.
        let mut long = vec![b'1'; MAX_LINE + 1];
        assert!(decode(Framing::Chunked, &long, MAX_LINE + 1).is_err());
        long.extend_from_slice(b"\r\n");
        assert!(decode(Framing::Chunked, &long, long.len()).is_err());
        assert!(decode(Framing::Chunked, b"10000000000000000\r\n", 64).is_err());
    }

    #[test]
    fn the_body_ends_where_its_framing_says() {
        // Bytes after the body stay unconsumed: the caller sees them and does not reuse.
        let mut body = Body::new(Framing::Length(3));
        assert_eq!(body.step(b"abcdef").unwrap(), (3, Step::Data(0..3)));
        assert_eq!(body.step(b"def").unwrap(), (0, Step::End));
        assert!(body.is_done());
        let mut body = Body::new(Framing::Chunked);
        assert_eq!(
            body.step(b"1\r\na\r\n0\r\n\r\nNEXT").unwrap(),
            (4, Step::Data(3..4))
        );
        assert_eq!(body.step(b"\r\n0\r\n\r\nNEXT").unwrap(), (7, Step::End));
        assert_eq!(
            decode(Framing::Length(5), b"abc", 2),
            Err("the upstream closed the connection before the body ended".into())
        );
        assert_eq!(
            decode(Framing::UntilClose, b"abcdef", 4).unwrap(),
            b"abcdef"
        );
        assert!(Body::new(Framing::Length(0)).is_done());
    }
}
