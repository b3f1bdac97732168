//! Shared pieces of the fuzz targets: a byte cursor, and a structure-aware generator of
//! upstream (vLLM-shaped) chunk sequences with the equivalent non-streaming completion.

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
    "hola", " mundo", "ñandú", " 🦙", "\"", "\\", "\n", "日本", "{", "}", " ", "a", "é", "\u{1F600}", "</s>", "data: x",
];

fn text(c: &mut Cursor) -> String {
    let n = 1 + c.below(4);
    (0..n).map(|_| PIECES[c.below(PIECES.len())]).collect()
}

/// A generated upstream stream and what the same answer looks like non-streamed.
pub struct Generated {
    /// SSE bytes as vLLM would send them.
    pub sse: Vec<u8>,
    /// The equivalent `chat.completion` body, when the stream is a clean, finished answer.
    pub completion: Option<Value>,
    pub usage_sent: bool,
}

/// Builds a vLLM-like chunk sequence from the fuzzer's bytes.
pub fn upstream_stream(c: &mut Cursor) -> Generated {
    let model = "Qwen/Qwen3-Upstream";
    let head = |choices: Value, usage: Option<Value>| {
        let mut v = json!({"id": "chatcmpl-f", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    };
    let mut frames: Vec<Value> = vec![head(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]), None)];
    let mut content = String::new();
    let mut reasoning = String::new();
    // (id, name, arguments) per tool index
    let mut tools: Vec<(String, String, String)> = Vec::new();
    let mut clean = true;
    let mut completion = 0u64;
    // Models answer in this order: reasoning, then text, then tool calls. A stream cannot
    // reorder what already went out, so only this order has a non-streaming equivalent.
    let mut phase = 0;
    let steps = c.below(12);
    for _ in 0..steps {
        match c.below(8) {
            0 | 1 if phase <= 1 => {
                phase = 1;
                let t = text(c);
                content.push_str(&t);
                frames.push(head(json!([{"index": 0, "delta": {"content": t}, "finish_reason": null}]), None));
            }
            2 if phase == 0 => {
                let t = text(c);
                reasoning.push_str(&t);
                let field = if c.byte() % 2 == 0 { "reasoning" } else { "reasoning_content" };
                frames.push(head(json!([{"index": 0, "delta": {field: t}, "finish_reason": null}]), None));
            }
            3 if tools.len() < 3 => {
                phase = 2;
                let id = format!("call_{}", tools.len());
                let name = format!("tool_{}", c.below(3));
                let k = tools.len();
                tools.push((id.clone(), name.clone(), String::new()));
                frames.push(head(json!([{"index": 0, "delta": {"tool_calls": [{"index": k, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}, "finish_reason": null}]), None));
            }
            4 if !tools.is_empty() => {
                // Arguments are a JSON object, streamed in fragments that may split anywhere,
                // for the latest call (servers finish one call before starting the next).
                let k = tools.len() - 1;
                let full = json!({"q": text(c), "n": c.byte()}).to_string();
                if tools[k].2.is_empty() {
                    let cut = c.below(full.len() + 1);
                    for part in [&full[..floor(&full, cut)], &full[floor(&full, cut)..]] {
                        if !part.is_empty() {
                            frames.push(head(json!([{"index": 0, "delta": {"tool_calls": [{"index": k, "function": {"arguments": part}}]}, "finish_reason": null}]), None));
                        }
                    }
                    tools[k].2 = full;
                }
            }
            5 => {
                frames.push(json!({"error": {"message": text(c), "type": "InternalServerError", "param": null, "code": 500}}));
                clean = false;
            }
            6 => {
                // Usage on a chunk (continuous_usage_stats).
                completion += 1;
                let last = frames.len() - 1;
                frames[last]["usage"] = json!({"prompt_tokens": 10, "completion_tokens": completion, "total_tokens": 10 + completion});
            }
            _ => {}
        }
    }
    let finish = ["stop", "length", "tool_calls", "stop"][c.below(4)];
    let stop_reason = if c.byte() % 3 == 0 { json!("###") } else { Value::Null };
    frames.push(head(json!([{"index": 0, "delta": {}, "finish_reason": finish, "stop_reason": stop_reason}]), None));
    let usage = json!({"prompt_tokens": 10 + c.below(50), "completion_tokens": completion + 3, "total_tokens": 0,
                       "prompt_tokens_details": {"cached_tokens": c.below(10)}});
    let usage_sent = c.byte() % 4 != 0;
    if usage_sent {
        frames.push(head(json!([]), Some(usage.clone())));
    }
    let mut sse = Vec::new();
    for f in &frames {
        sse.extend_from_slice(b"data: ");
        sse.extend_from_slice(f.to_string().as_bytes());
        sse.extend_from_slice(b"\n\n");
    }
    let garbage = c.byte() % 16 == 0;
    if garbage {
        sse.extend_from_slice(b"data: {not json\n\n");
        clean = false;
    }
    sse.extend_from_slice(b"data: [DONE]\n\n");
    let completion_body = (clean && usage_sent).then(|| {
        let mut message = json!({"role": "assistant", "content": if content.is_empty() { Value::Null } else { json!(content) }});
        if !reasoning.is_empty() {
            message["reasoning"] = json!(reasoning);
        }
        if !tools.is_empty() {
            message["tool_calls"] = json!(tools.iter().map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})).collect::<Vec<_>>());
        }
        json!({"id": "chatcmpl-f", "object": "chat.completion", "created": 1, "model": model,
               "choices": [{"index": 0, "message": message, "finish_reason": finish, "stop_reason": stop_reason}],
               "usage": usage})
    });
    Generated { sse, completion: completion_body, usage_sent }
}

/// The largest char boundary ≤ `i`.
fn floor(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Up to three split points in `len`, from the fuzzer's bytes.
pub fn splits(c: &mut Cursor, len: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..3)
        .map(|_| {
            let hi = usize::from(c.byte());
            let lo = usize::from(c.byte());
            if len == 0 {
                0
            } else {
                (hi << 8 | lo) % (len + 1)
            }
        })
        .collect();
    v.sort_unstable();
    v
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
