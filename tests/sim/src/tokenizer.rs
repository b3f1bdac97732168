//! A deterministic stand-in for a model tokenizer and chat template.
//!
//! A token is a maximal run of ASCII alphanumerics, or any other single non-whitespace
//! character; whitespace is free. Token ids are a hash of the token text. The chat template
//! adds 4 tokens per message (role markers), the tools' JSON, 64 tokens per image and 3 for the
//! generation prompt — the same counting for `/tokenize` and for a completion's
//! `prompt_tokens`, as a real server's would be.

use serde_json::Value;

/// FNV-1a, 32 bits: cheap and stable across runs.
pub fn token_id(text: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in text.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The tokens of `text`, each with the whitespace that precedes it (so they concatenate back
/// to the text, minus leading whitespace).
pub fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut start = 0;
    while i < bytes.len() {
        let c = text[i..].chars().next().unwrap_or(' ');
        if c.is_whitespace() {
            i += c.len_utf8();
            continue;
        }
        let end = if c.is_ascii_alphanumeric() {
            let mut j = i;
            while j < bytes.len() && bytes[j].is_ascii_alphanumeric() {
                j += 1;
            }
            j
        } else {
            i + c.len_utf8()
        };
        out.push(&text[start..end]);
        start = end;
        i = end;
    }
    out
}

#[cfg(test)]
fn count(text: &str) -> usize {
    pieces(text).len()
}

fn push_text(ids: &mut Vec<u32>, text: &str) {
    ids.extend(pieces(text).into_iter().map(|p| token_id(p.trim_start())));
}

/// Token ids of a chat request's prompt, template included.
pub fn prompt_ids(messages: &[Value], tools: Option<&Value>) -> Vec<u32> {
    let mut ids = Vec::with_capacity(256);
    if let Some(t) = tools.filter(|t| !t.is_null()) {
        push_text(&mut ids, &t.to_string());
    }
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        ids.extend([
            token_id("<|im_start|>"),
            token_id(role),
            token_id("\n"),
            token_id("<|im_end|>"),
        ]);
        match m.get("content") {
            Some(Value::String(s)) => push_text(&mut ids, s),
            Some(Value::Array(parts)) => {
                for p in parts {
                    match p.get("type").and_then(Value::as_str) {
                        Some("image_url") => {
                            let url = p
                                .pointer("/image_url/url")
                                .and_then(Value::as_str)
                                .unwrap_or("");
                            let seed = token_id(&url[..url.len().min(256)]);
                            ids.extend((0..64u32).map(|k| seed.wrapping_add(k)));
                        }
                        _ => {
                            if let Some(t) = p.get("text").and_then(Value::as_str) {
                                push_text(&mut ids, t);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        for key in ["tool_calls", "reasoning", "reasoning_content"] {
            if let Some(v) = m.get(key).filter(|v| !v.is_null()) {
                push_text(&mut ids, &v.to_string());
            }
        }
        if let Some(id) = m.get("tool_call_id").and_then(Value::as_str) {
            push_text(&mut ids, id);
        }
    }
    ids.extend([
        token_id("<|im_start|>"),
        token_id("assistant"),
        token_id("\n"),
    ]);
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pieces_concatenate_back() {
        let t = "Hola, ¿cómo estás? ñandú 🦙 x1y2";
        assert_eq!(pieces(t).concat(), t);
        assert_eq!(pieces("a b"), vec!["a", " b"]);
        assert_eq!(count("hello, world!"), 4);
        assert_eq!(count("   "), 0);
    }

    #[test]
    fn template_counts() {
        let m = vec![json!({"role":"user","content":"hola mundo"})];
        assert_eq!(prompt_ids(&m, None).len(), 4 + 2 + 3);
        let m = vec![
            json!({"role":"user","content":[{"type":"text","text":"mira"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}),
        ];
        assert_eq!(prompt_ids(&m, None).len(), 4 + 1 + 64 + 3);
    }
}
