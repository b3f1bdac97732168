//! Checks of a messages-format event stream, for tests and fuzz targets: a strict validator of
//! the event sequence (the order the vendor documents for streamed messages,
//! <https://docs.anthropic.com/en/docs/build-with-claude/streaming>; the exact rules are
//! [`validate_event_sequence`]'s) and an accumulator that rebuilds the final
//! `Message` the way the vendor SDKs do (`get_final_message()` / `finalMessage()`).
//!
//! Not used on the request path: both build `serde_json::Value`s freely. They read the exact
//! framing [`super::stream::MessagesStream`] writes (`event: X\ndata: {…}\n\n`, one `data`
//! line), which is stricter than SSE in general.

use serde_json::{Map, Value};

/// One frame: event name and parsed data.
fn frames(bytes: &[u8]) -> Result<Vec<(String, Value)>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("stream is not UTF-8: {e}"))?;
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let body = text
        .strip_suffix("\n\n")
        .ok_or("the stream does not end with a blank line")?;
    let mut out = Vec::new();
    for (n, frame) in body.split("\n\n").enumerate() {
        let mut lines = frame.split('\n');
        let (Some(ev), Some(data), None) = (lines.next(), lines.next(), lines.next()) else {
            return Err(format!(
                "frame {n} is not exactly `event:` + `data:` lines: {frame:?}"
            ));
        };
        let name = ev
            .strip_prefix("event: ")
            .ok_or_else(|| format!("frame {n} does not start with `event: `: {frame:?}"))?;
        let json = data
            .strip_prefix("data: ")
            .ok_or_else(|| format!("frame {n} has no `data: ` line: {frame:?}"))?;
        let value: Value = serde_json::from_str(json)
            .map_err(|e| format!("frame {n} ({name}) data is not JSON: {e}: {json}"))?;
        if value.get("type").and_then(Value::as_str) != Some(name) {
            return Err(format!(
                "frame {n}: data.type {:?} does not match event {name:?}",
                value.get("type")
            ));
        }
        out.push((name.to_owned(), value));
    }
    Ok(out)
}

fn is_count(v: Option<&Value>) -> bool {
    v.is_some_and(Value::is_u64)
}

fn str_field<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

const STOP_REASONS: [&str; 7] = [
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
];

/// Validates a complete messages-format stream: `message_start` first; content blocks with
/// dense indexes from 0, one open at a time, each start matched by a stop; deltas whose type
/// fits their block; one `message_delta` (with integer `usage.output_tokens`) after the last
/// block; `message_stop` last. An `error` frame may end the stream at any point (and may be
/// its only frame). `ping` may appear anywhere after `message_start`. Nothing may follow the
/// end, and every frame's `data.type` must equal its event name.
pub fn validate_event_sequence(bytes: &[u8]) -> Result<(), String> {
    let frames = frames(bytes)?;
    if frames.is_empty() {
        return Err("the stream is empty".into());
    }
    let mut started = false;
    let mut ended = false;
    let mut delta_seen = false;
    let mut open: Option<(u64, String)> = None;
    let mut next_index = 0u64;
    for (n, (name, v)) in frames.iter().enumerate() {
        let at = |msg: &str| format!("frame {n} ({name}): {msg}");
        if ended {
            return Err(at("frame after the end of the stream"));
        }
        if !started && name != "message_start" && name != "error" {
            return Err(at("the stream must begin with message_start"));
        }
        match name.as_str() {
            "message_start" => {
                if started {
                    return Err(at("second message_start"));
                }
                started = true;
                let m = v.get("message").ok_or_else(|| at("no message"))?;
                if !str_field(m, "id").is_some_and(|id| id.starts_with("msg_")) {
                    return Err(at("message.id must start with msg_"));
                }
                if str_field(m, "type") != Some("message")
                    || str_field(m, "role") != Some("assistant")
                    || str_field(m, "model").is_none()
                {
                    return Err(at("message needs type message, role assistant and a model"));
                }
                if m.get("content") != Some(&Value::Array(Vec::new())) {
                    return Err(at("message.content must be []"));
                }
                if m.get("stop_reason") != Some(&Value::Null)
                    || m.get("stop_sequence") != Some(&Value::Null)
                {
                    return Err(at("stop_reason and stop_sequence must be null"));
                }
                let u = m.get("usage").ok_or_else(|| at("no usage"))?;
                for k in [
                    "input_tokens",
                    "output_tokens",
                    "cache_creation_input_tokens",
                    "cache_read_input_tokens",
                ] {
                    if !is_count(u.get(k)) {
                        return Err(at(&format!("usage.{k} must be a non-negative integer")));
                    }
                }
            }
            "ping" => {
                if v.as_object().map(Map::len) != Some(1) {
                    return Err(at("ping carries only its type"));
                }
            }
            "content_block_start" => {
                if delta_seen {
                    return Err(at("block after message_delta"));
                }
                if let Some((i, _)) = &open {
                    return Err(at(&format!("block {i} is still open")));
                }
                let index = v.get("index").and_then(Value::as_u64);
                if index != Some(next_index) {
                    return Err(at(&format!("index {index:?}, expected {next_index}")));
                }
                let b = v
                    .get("content_block")
                    .ok_or_else(|| at("no content_block"))?;
                let kind = str_field(b, "type").unwrap_or_default();
                match kind {
                    "text" if str_field(b, "text") == Some("") => {}
                    "thinking" if str_field(b, "thinking") == Some("") => {}
                    "tool_use" => {
                        if str_field(b, "id").is_none_or(str::is_empty)
                            || str_field(b, "name").is_none()
                        {
                            return Err(at("tool_use needs a non-empty id and a name"));
                        }
                        if b.get("input") != Some(&Value::Object(Map::new())) {
                            return Err(at("tool_use input must start as {}"));
                        }
                    }
                    _ => return Err(at(&format!("bad content_block {b}"))),
                }
                open = Some((next_index, kind.to_owned()));
                next_index += 1;
            }
            "content_block_delta" => {
                let Some((i, kind)) = &open else {
                    return Err(at("delta with no open block"));
                };
                if v.get("index").and_then(Value::as_u64) != Some(*i) {
                    return Err(at(&format!("delta index is not the open block {i}")));
                }
                let d = v.get("delta").ok_or_else(|| at("no delta"))?;
                let ok = match (kind.as_str(), str_field(d, "type").unwrap_or_default()) {
                    ("text", "text_delta") => str_field(d, "text").is_some(),
                    ("thinking", "thinking_delta") => str_field(d, "thinking").is_some(),
                    ("thinking", "signature_delta") => str_field(d, "signature").is_some(),
                    ("tool_use", "input_json_delta") => str_field(d, "partial_json").is_some(),
                    _ => false,
                };
                if !ok {
                    return Err(at(&format!("delta {d} does not fit a {kind} block")));
                }
            }
            "content_block_stop" => {
                let Some((i, _)) = &open else {
                    return Err(at("stop with no open block"));
                };
                if v.get("index").and_then(Value::as_u64) != Some(*i) {
                    return Err(at(&format!("stop index is not the open block {i}")));
                }
                open = None;
            }
            "message_delta" => {
                if delta_seen {
                    return Err(at("second message_delta"));
                }
                if let Some((i, _)) = &open {
                    return Err(at(&format!("block {i} is still open")));
                }
                delta_seen = true;
                let d = v.get("delta").ok_or_else(|| at("no delta"))?;
                let stop = str_field(d, "stop_reason").unwrap_or_default();
                if !STOP_REASONS.contains(&stop) {
                    return Err(at(&format!("bad stop_reason {d}")));
                }
                match d.get("stop_sequence") {
                    Some(Value::Null) => {}
                    Some(Value::String(_)) if stop == "stop_sequence" => {}
                    _ => {
                        return Err(at(
                            "stop_sequence must be null, or a string for stop_sequence",
                        ))
                    }
                }
                let u = v.get("usage").ok_or_else(|| at("no usage"))?;
                if !is_count(u.get("output_tokens")) {
                    return Err(at("usage.output_tokens must be a non-negative integer"));
                }
                for k in [
                    "input_tokens",
                    "cache_creation_input_tokens",
                    "cache_read_input_tokens",
                ] {
                    if u.get(k).is_some_and(|x| !x.is_null() && !x.is_u64()) {
                        return Err(at(&format!("usage.{k} must be a non-negative integer")));
                    }
                }
            }
            "message_stop" => {
                if !delta_seen {
                    return Err(at("message_stop before message_delta"));
                }
                ended = true;
            }
            "error" => {
                let e = v.get("error").ok_or_else(|| at("no error object"))?;
                if str_field(e, "type").is_none() || str_field(e, "message").is_none() {
                    return Err(at("error needs a type and a message"));
                }
                ended = true;
            }
            other => return Err(at(&format!("unknown event {other:?}"))),
        }
    }
    if !ended {
        return Err("the stream ends without message_stop or error".into());
    }
    Ok(())
}

/// Rebuilds the final `Message` from a stream as the vendor SDKs' accumulators do: blocks
/// appended on start, text/thinking/signature deltas concatenated, `partial_json` fragments
/// concatenated and parsed at block stop (none → `{}`), `message_delta` setting the stop
/// fields and overwriting the usage counts it carries. An `error` event is an `Err`.
pub fn accumulate_message(bytes: &[u8]) -> Result<Value, String> {
    let mut message: Option<Value> = None;
    let mut json_bufs: Vec<String> = Vec::new();
    for (name, v) in frames(bytes)? {
        if name == "error" {
            return Err(format!("error event: {v}"));
        }
        if name == "ping" {
            continue;
        }
        if name == "message_start" {
            message = v.get("message").cloned();
            continue;
        }
        let m = message.as_mut().ok_or_else(|| {
            format!("Unexpected event order, got {name} before \"message_start\"")
        })?;
        let index = v.get("index").and_then(Value::as_u64).map(|i| i as usize);
        match name.as_str() {
            "content_block_start" => {
                let block = v.get("content_block").cloned().unwrap_or(Value::Null);
                let content = m
                    .get_mut("content")
                    .and_then(Value::as_array_mut)
                    .ok_or("message has no content array")?;
                if index != Some(content.len()) {
                    return Err(format!("block index {index:?} is not {}", content.len()));
                }
                content.push(block);
                json_bufs.push(String::new());
            }
            "content_block_delta" => {
                let i = index.ok_or("delta without index")?;
                let d = v.get("delta").cloned().unwrap_or(Value::Null);
                let block = m
                    .get_mut("content")
                    .and_then(|c| c.get_mut(i))
                    .ok_or_else(|| format!("delta for missing block {i}"))?;
                let append = |block: &mut Value, key: &str, piece: Option<&str>| {
                    let old = block.get(key).and_then(Value::as_str).unwrap_or_default();
                    let new = format!("{old}{}", piece.unwrap_or_default());
                    block[key] = Value::String(new);
                };
                match str_field(&d, "type") {
                    Some("text_delta") => append(block, "text", str_field(&d, "text")),
                    Some("thinking_delta") => append(block, "thinking", str_field(&d, "thinking")),
                    Some("signature_delta") => {
                        block["signature"] =
                            Value::String(str_field(&d, "signature").unwrap_or_default().into());
                    }
                    Some("input_json_delta") => {
                        if let Some(buf) = json_bufs.get_mut(i) {
                            buf.push_str(str_field(&d, "partial_json").unwrap_or_default());
                        }
                    }
                    other => return Err(format!("unknown delta type {other:?}")),
                }
            }
            "content_block_stop" => {
                let i = index.ok_or("stop without index")?;
                let buf = json_bufs.get(i).cloned().unwrap_or_default();
                if let Some(block) = m.get_mut("content").and_then(|c| c.get_mut(i)) {
                    if block.get("type").and_then(Value::as_str) == Some("tool_use")
                        && !buf.is_empty()
                    {
                        block["input"] = serde_json::from_str(&buf)
                            .map_err(|e| format!("tool input {buf:?} does not parse: {e}"))?;
                    }
                }
            }
            "message_delta" => {
                let d = v.get("delta").cloned().unwrap_or(Value::Null);
                m["stop_reason"] = d.get("stop_reason").cloned().unwrap_or(Value::Null);
                m["stop_sequence"] = d.get("stop_sequence").cloned().unwrap_or(Value::Null);
                if let Some(u) = v.get("usage").and_then(Value::as_object) {
                    for (k, val) in u {
                        if !val.is_null() {
                            m["usage"][k] = val.clone();
                        }
                    }
                }
            }
            "message_stop" => {}
            other => return Err(format!("unknown event {other:?}")),
        }
    }
    message.ok_or_else(|| "the stream has no message_start".into())
}
