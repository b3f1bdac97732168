//! Shared pieces of the fuzz targets: a byte cursor, a structure-aware generator of upstream
//! (vLLM/SGLang-shaped) chunk sequences with the equivalent non-streaming completion, a JSON
//! check that sees duplicate keys, and the client formats' fuzz bodies, written once
//! ([`formats`]).

pub mod formats;

use serde_json::{json, Value};

/// Reads choices out of the fuzzer's bytes; past the end everything is zero.
pub struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data, pos: 0 }
    }

    pub fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            usize::from(self.byte()) % n
        }
    }

    /// True once in `n` (on average).
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.data.get(self.pos..).unwrap_or_default()
    }
}

/// Text with the characters that break naive translators: multi-byte UTF-8, escapes, quotes.
const PIECES: &[&str] = &[
    "hola",
    " mundo",
    "ñandú",
    " 🦙",
    "\"",
    "\\",
    "\n",
    "日本",
    "{",
    "}",
    " ",
    "a",
    "é",
    "\u{1F600}",
    "</s>",
    "data: x",
    "\r\n",
];

fn text(c: &mut Cursor) -> String {
    let n = 1 + c.below(4);
    (0..n).map(|_| PIECES[c.below(PIECES.len())]).collect()
}

/// A generated upstream stream and what the same answer looks like non-streamed.
pub struct Generated {
    /// SSE bytes as an upstream could send them.
    pub sse: Vec<u8>,
    /// The equivalent `chat.completion` body, when the stream's content is clean: no
    /// mid-stream error object, no unreadable chunk, no wrongly typed field, no tool-call delta
    /// without its `index`, nothing after the finish chunk, a finish chunk. (Its tool
    /// arguments may still be malformed or cut off, its finish reason unknown: both
    /// translations must then fail the same way.)
    pub completion: Option<Value>,
    /// The stream delivers the answer in the order a message holds it: reasoning, then text,
    /// then the tool calls (each call's header after the previous call's). When not, the
    /// streamed message cannot equal the non-streamed one (a messages stream cannot reopen a
    /// block it closed), but what an OpenAI client accumulates per field and per tool-call
    /// index still equals the non-streamed chat answer.
    pub in_order: bool,
    /// The usage-only chunk was sent (else the stream's usage is partial or estimated).
    pub usage_sent: bool,
}

/// One tool call of the generated answer.
struct Call {
    /// The upstream's `index` for it.
    index: usize,
    id: String,
    name: String,
    args: String,
    /// The argument fragments as streamed (concatenated: `args`).
    parts: Vec<String>,
    /// Wild streams: the fragments not streamed yet.
    queue: std::collections::VecDeque<String>,
}

/// The largest char boundary ≤ `i`.
fn floor(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `s` cut into 1 to 3 pieces at char boundaries chosen by the fuzzer.
fn fragments(c: &mut Cursor, s: &str) -> Vec<String> {
    let mut cuts: Vec<usize> = (0..c.below(3))
        .map(|_| floor(s, c.below(s.len() + 1)))
        .collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut prev = 0;
    for cut in cuts.into_iter().chain([s.len()]) {
        if cut > prev {
            out.push(s[prev..cut].to_owned());
            prev = cut;
        }
    }
    out
}

/// Tool arguments as a model writes them, sometimes malformed.
fn arguments(c: &mut Cursor) -> String {
    let mut args = json!({"q": text(c), "n": c.byte()}).to_string();
    match c.below(16) {
        0 => args = args.replacen(':', " ", 1), // malformed: a missing colon
        1 => args.push('}'),                    // malformed: text after the object
        2 => args = "[1,2]".into(),             // malformed: not an object
        3 => args = String::new(),              // a tool without arguments
        4 => args = format!(" {args}\n"),       // whitespace around
        _ => {}
    }
    args
}

/// Whether the kinds of content arrive in message order: reasoning (0), text (1), tools (2).
struct Order {
    last: u8,
    ok: bool,
}

impl Order {
    fn saw(&mut self, kind: u8) {
        self.ok &= kind >= self.last;
        self.last = self.last.max(kind);
    }
}

/// Builds an upstream chunk sequence from the fuzzer's bytes.
///
/// Two out of three streams are what real servers send: reasoning under either field name,
/// with SGLang's `null` twin; text; up to three tool calls, their arguments split anywhere,
/// sometimes in the same chunk as the name, emitted one call after another or interleaved
/// (index 0 and 1 alternating); arguments that are malformed, or cut off by a `length`
/// finish; usage on ordinary chunks (continuous usage); mid-stream error objects; SSE
/// comments, CRLF or CR line endings, a chunk's JSON spread over several `data:` lines; a
/// usage-only chunk with `choices` empty, null or missing; `abort` finishes; a stream without
/// `[DONE]`.
///
/// The rest are *wild*: the same pieces in any order (text before reasoning, reasoning or text
/// between tool-call fragments, the fragments of several calls interleaved at random),
/// tool-call indexes that are sparse (`2, 4, 6`), fragments without their `index`, chunks
/// with wrongly typed fields, finish reasons a translator does not know, the usage chunk
/// before the finish, content after the finish. `completion` and `in_order` say which of
/// these still have a non-streaming equivalent.
pub fn upstream_stream(c: &mut Cursor) -> Generated {
    let model = "Qwen/Qwen3-Upstream";
    let head = |choices: Value| json!({"id": "chatcmpl-f", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": choices});
    let delta = |d: Value| head(json!([{"index": 0, "delta": d, "finish_reason": null}]));
    let header = |call: &Call, first: Option<&str>| {
        delta(
            json!({"tool_calls": [{"index": call.index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": first.unwrap_or("")}}]}),
        )
    };
    let fragment = |index: Option<usize>, part: &str| {
        let mut tc = json!({"function": {"arguments": part}});
        if let Some(k) = index {
            tc["index"] = json!(k);
        }
        delta(json!({"tool_calls": [tc]}))
    };
    let mut frames: Vec<Value> = vec![delta(json!({"role": "assistant", "content": ""}))];
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls: Vec<Call> = Vec::new();
    let mut clean = true;
    let wild = c.one_in(3);
    let mut order = Order { last: 0, ok: true };
    // Servers number calls 0, 1, 2; a wild stream may number them sparsely (still increasing).
    let (base, stride) = if wild {
        (c.below(3), 1 + c.below(3))
    } else {
        (0, 1)
    };
    // Models answer in this order: reasoning, then text, then tool calls. A stream cannot
    // reorder what already went out, so only this order has a non-streaming equivalent.
    let mut phase = 0;
    let steps = c.below(if wild { 16 } else { 12 });
    for _ in 0..steps {
        match c.below(if wild { 10 } else { 8 }) {
            0 | 1 if wild || phase <= 1 => {
                phase = 1;
                order.saw(1);
                let t = text(c);
                content.push_str(&t);
                frames.push(delta(json!({"content": t})));
            }
            2 if wild || phase == 0 => {
                order.saw(0);
                let t = text(c);
                reasoning.push_str(&t);
                let (field, twin) = if c.byte() % 2 == 0 {
                    ("reasoning", "reasoning_content")
                } else {
                    ("reasoning_content", "reasoning")
                };
                let mut d = json!({field: t});
                if c.one_in(2) {
                    d[twin] = Value::Null; // SGLang: the other field, null, on every delta
                }
                frames.push(delta(d));
            }
            3 if calls.len() < 3 => {
                phase = 2;
                order.saw(2);
                let mut call = Call {
                    index: base + stride * calls.len(),
                    id: format!("call_{}", calls.len()),
                    name: format!("tool_{}", c.below(3)),
                    args: arguments(c),
                    parts: Vec::new(),
                    queue: Default::default(),
                };
                if wild {
                    // The header goes out now; the fragments at later steps, or at the end.
                    call.parts = fragments(c, &call.args);
                    call.queue = call.parts.iter().cloned().collect();
                    let first = if c.one_in(3) {
                        call.queue.pop_front()
                    } else {
                        None
                    };
                    frames.push(header(&call, first.as_deref()));
                }
                calls.push(call);
            }
            4 if wild && calls.iter().any(|t| !t.queue.is_empty()) => {
                order.saw(2);
                let waiting: Vec<usize> = (0..calls.len())
                    .filter(|&k| !calls[k].queue.is_empty())
                    .collect();
                let k = waiting[c.below(waiting.len())];
                let part = calls[k].queue.pop_front().unwrap_or_default();
                // Without `index` (a client cannot know which call it continues).
                let index = if c.one_in(6) {
                    None
                } else {
                    Some(calls[k].index)
                };
                clean &= index.is_some();
                frames.push(fragment(index, &part));
            }
            5 => {
                frames.push(json!({"error": {"message": text(c), "type": "InternalServerError", "param": null, "code": 500}}));
                clean = false;
            }
            6 if wild => {
                let t = text(c);
                frames.push(match c.below(8) {
                    0 => delta(json!({"content": c.byte()})),
                    1 => delta(json!({"reasoning": {"text": t}})),
                    2 => delta(json!({"tool_calls": [{"index": "0", "function": {"arguments": "{}"}}]})),
                    3 => delta(json!({"tool_calls": [{"index": base, "function": {"arguments": {"q": t}}}]})),
                    4 => delta(json!({"tool_calls": {"index": base}})),
                    5 => head(json!({"index": 0, "delta": {"content": t}})),
                    6 => head(json!([{"index": 0, "delta": {"content": t}, "finish_reason": 7}])),
                    _ => {
                        let mut f = delta(json!({"content": t}));
                        f["usage"] = json!({"prompt_tokens": "10", "completion_tokens": [1]});
                        f
                    }
                });
                clean = false;
            }
            _ => {}
        }
    }
    let finish = if wild {
        [
            "stop",
            "length",
            "tool_calls",
            "abort",
            "content_filter",
            "error",
            "repetition",
            "function_call",
            "eos_token",
            "Stop",
        ][c.below(10)]
    } else {
        ["stop", "length", "tool_calls", "stop", "length", "abort"][c.below(6)]
    };
    if wild {
        // The fragments not streamed yet, the calls interleaved at random.
        while let Some(k) = {
            let waiting: Vec<usize> = (0..calls.len())
                .filter(|&k| !calls[k].queue.is_empty())
                .collect();
            (!waiting.is_empty()).then(|| waiting[c.below(waiting.len())])
        } {
            let part = calls[k].queue.pop_front().unwrap_or_default();
            let index = if c.one_in(8) {
                None
            } else {
                Some(calls[k].index)
            };
            clean &= index.is_some();
            frames.push(fragment(index, &part));
        }
    } else {
        // Cut off by max_tokens in the middle of the last call's arguments.
        if finish == "length" && c.one_in(3) {
            if let Some(last) = calls.last_mut() {
                let cut = floor(&last.args, c.below(last.args.len() + 1));
                last.args.truncate(cut);
            }
        }
        for call in &mut calls {
            call.parts = fragments(c, &call.args);
        }
        // The tool calls: one after another, or headers first and the fragments interleaved.
        let interleave = calls.len() > 1 && c.one_in(3);
        let mut queues: Vec<std::collections::VecDeque<&String>> = Vec::new();
        for call in &calls {
            let mut q: std::collections::VecDeque<&String> = call.parts.iter().collect();
            // Arguments in the same chunk as the name (vLLM with some parsers, SGLang).
            let first = if c.one_in(3) { q.pop_front() } else { None };
            frames.push(header(call, first.map(String::as_str)));
            if interleave {
                queues.push(q);
            } else {
                frames.extend(q.into_iter().map(|p| fragment(Some(call.index), p)));
            }
        }
        while queues.iter().any(|q| !q.is_empty()) {
            for (k, q) in queues.iter_mut().enumerate() {
                if let Some(p) = q.pop_front() {
                    frames.push(fragment(Some(calls[k].index), p));
                }
            }
        }
    }
    // Continuous usage on some ordinary chunks, counting up.
    let mut completion = 0u64;
    for f in frames.iter_mut().skip(1) {
        if f.get("error").is_none() && f.get("usage").is_none() && c.one_in(4) {
            completion += 1;
            f["usage"] = json!({"prompt_tokens": 10, "completion_tokens": completion, "total_tokens": 10 + completion});
        }
    }
    let stop_reason = if finish == "stop" && c.byte() % 3 == 0 {
        json!("###")
    } else {
        Value::Null
    };
    let finish_frame = head(
        json!([{"index": 0, "delta": {}, "finish_reason": finish, "stop_reason": stop_reason}]),
    );
    let usage = json!({"prompt_tokens": 10 + c.below(50), "completion_tokens": completion + 3, "total_tokens": 0,
                       "prompt_tokens_details": {"cached_tokens": c.below(10)}});
    let usage_sent = c.byte() % 4 != 0;
    let mut usage_frame = None;
    if usage_sent {
        let mut u = json!({"id": "chatcmpl-f", "object": "chat.completion.chunk", "created": 1, "model": model, "usage": usage.clone()});
        match c.below(3) {
            0 => u["choices"] = json!([]),
            1 => u["choices"] = Value::Null,
            _ => {} // choices missing
        }
        usage_frame = Some(u);
    }
    // Wild: the usage chunk before the finish chunk (same usage, same answer), or text after
    // the finish (which a chat client appends and a messages translation ignores).
    if wild && c.one_in(4) {
        frames.extend(usage_frame.take());
    }
    frames.push(finish_frame);
    if wild && c.one_in(6) {
        frames.push(delta(json!({"content": text(c)})));
        clean = false;
    }
    frames.extend(usage_frame);

    // SSE framing: line endings, comments, multi-line data.
    let eol: &[u8] = [&b"\n"[..], b"\r\n", b"\r", b"\n"][c.below(4)];
    let mut sse = Vec::new();
    let line = |sse: &mut Vec<u8>, l: &[u8]| {
        sse.extend_from_slice(l);
        sse.extend_from_slice(eol);
    };
    for f in &frames {
        if c.one_in(6) {
            line(&mut sse, b": keep-alive");
        }
        if c.one_in(4) {
            // The chunk's JSON over several `data:` lines (joined with `\n`, JSON whitespace).
            let pretty = serde_json::to_string_pretty(f).unwrap_or_default();
            for l in pretty.lines() {
                line(&mut sse, format!("data: {l}").as_bytes());
            }
        } else {
            line(&mut sse, format!("data: {f}").as_bytes());
        }
        line(&mut sse, b"");
    }
    if c.byte() % 16 == 0 {
        line(&mut sse, b"data: {not json");
        line(&mut sse, b"");
        clean = false;
    }
    if c.byte() % 8 != 0 {
        line(&mut sse, b"data: [DONE]");
        line(&mut sse, b"");
    }
    let completion_body = clean.then(|| {
        let mut message = json!({"role": "assistant", "content": if content.is_empty() { Value::Null } else { json!(content) }});
        if !reasoning.is_empty() {
            message["reasoning"] = json!(reasoning);
        }
        if !calls.is_empty() {
            message["tool_calls"] = json!(calls.iter().map(|t| json!({"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.args}})).collect::<Vec<_>>());
        }
        json!({"id": "chatcmpl-f", "object": "chat.completion", "created": 1, "model": model,
               "choices": [{"index": 0, "message": message, "finish_reason": finish, "stop_reason": stop_reason}],
               "usage": usage})
    });
    Generated {
        sse,
        completion: completion_body,
        in_order: order.ok,
        usage_sent,
    }
}

/// Split points in `len` from the fuzzer's bytes, as many as it likes: a count byte, then that
/// many (at most 32) piece lengths of 0 to 255 bytes, used in turn until the bytes run out
/// (one length 1: every byte alone; a 0: an empty read). No count byte left: no split.
pub fn splits(c: &mut Cursor, len: usize) -> Vec<usize> {
    let n = c.below(33);
    let gaps: Vec<usize> = (0..n).map(|_| usize::from(c.byte())).collect();
    cut_points(&gaps, len)
}

/// An input that is split-control bytes (a count and piece lengths, as [`splits`] reads them)
/// followed by raw bytes: the raw bytes, and the points where to cut them.
pub fn split_input(data: &[u8]) -> (&[u8], Vec<usize>) {
    let mut c = Cursor::new(data);
    let points = splits(&mut c, data.len().saturating_sub(6));
    let rest = c.rest();
    let points = points.into_iter().map(|p| p.min(rest.len())).collect();
    (rest, points)
}

/// The points where pieces of the lengths `gaps` (cycled) cut `len` bytes.
pub fn cut_points(gaps: &[usize], len: usize) -> Vec<usize> {
    let mut points = Vec::new();
    if gaps.is_empty() {
        return points;
    }
    let mut at = 0;
    'cycle: loop {
        let before = at;
        for &g in gaps {
            if at + g >= len {
                break 'cycle;
            }
            at += g;
            points.push(at);
        }
        if at == before {
            break; // only empty pieces: one round of them is enough
        }
    }
    points
}

/// A raw-mode input: `R`, a flags byte, a count byte `n` (taken mod 33), `n` piece lengths,
/// then the upstream's SSE bytes themselves, cut into pieces of those lengths in turn.
pub struct Raw<'a> {
    pub flags: u8,
    pub points: Vec<usize>,
    pub sse: &'a [u8],
}

/// The first byte of a raw-mode input; any other first byte selects the generator.
pub const RAW_MODE: u8 = b'R';

/// Reads a raw-mode input, or `None` when `data` selects the structured mode.
pub fn raw_input(data: &[u8]) -> Option<Raw<'_>> {
    if data.first() != Some(&RAW_MODE) {
        return None;
    }
    let flags = data.get(1).copied().unwrap_or(0);
    let n = usize::from(data.get(2).copied().unwrap_or(0)) % 33;
    let gaps_end = (3 + n).min(data.len());
    let gaps: Vec<usize> = data
        .get(3..gaps_end)
        .unwrap_or_default()
        .iter()
        .map(|&b| usize::from(b))
        .collect();
    let sse = data.get(gaps_end..).unwrap_or_default();
    Some(Raw {
        flags,
        points: cut_points(&gaps, sse.len()),
        sse,
    })
}

/// The `data` of each event of an SSE byte stream (until a framing error).
pub fn sse_data(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut d = quipu_core::sse::SseDecoder::default();
    let mut out = Vec::new();
    let mut push = |e: quipu_core::sse::SseEvent<'_>| {
        out.push(e.data.to_vec());
        Ok::<(), quipu_core::sse::SseError>(())
    };
    if d.feed(bytes, &mut push).is_ok() {
        let _ = d.finish(&mut push);
    }
    out
}

/// Cuts `bytes` at `points`.
pub fn pieces<'a>(bytes: &'a [u8], points: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut prev = 0;
    for &p in points {
        out.push(&bytes[prev..p]);
        prev = p;
    }
    out.push(&bytes[prev..]);
    out
}

/// Parses JSON like `serde_json::from_str::<Value>`, but fails on an object with a repeated
/// key (which `Value` silently collapses to the last one, as many clients do).
pub fn parse_strict(text: &str) -> Result<Value, String> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    struct Strict;
    impl<'de> DeserializeSeed<'de> for Strict {
        type Value = Value;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(Strict)
        }
    }
    impl<'de> Visitor<'de> for Strict {
        type Value = Value;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(json!(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(json!(v))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(json!(v))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut v = Vec::new();
            while let Some(x) = seq.next_element_seed(Strict)? {
                v.push(x);
            }
            Ok(Value::Array(v))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut m = serde_json::Map::new();
            while let Some(k) = map.next_key::<String>()? {
                let v = map.next_value_seed(Strict)?;
                if m.insert(k.clone(), v).is_some() {
                    return Err(serde::de::Error::custom(format!("duplicate key {k:?}")));
                }
            }
            Ok(Value::Object(m))
        }
    }
    let mut d = serde_json::Deserializer::from_str(text);
    let v = Strict.deserialize(&mut d).map_err(|e| e.to_string())?;
    d.end().map_err(|e| e.to_string())?;
    Ok(v)
}
