//! A validator of Responses API event streams, and the accumulator the SDKs run: used by the
//! unit tests, the conformance harness (`tests/conformance.rs`), the fuzz target and the
//! benchmark, so each checks the same rules.
//!
//! [`validate_event_sequence`] checks, frame by frame: `event: <type>\ndata: <json>\n\n` with
//! `data.type` equal to the event name; `sequence_number` 0, 1, 2, … without a gap;
//! `response.created` then `response.in_progress` first; items added with dense
//! `output_index`es, one open at a time, each delta and `.done` naming the open item (`item_id`,
//! `output_index`, `content_index` 0) and of its kind; every `.done` text equal to the deltas
//! before it; exactly one terminal event last (`response.completed`, `response.incomplete`, or
//! `error` then `response.failed`), whose response has the matching `status`, every finished
//! item as its `output` (equal to the `output_item.done` items), usage unless it failed, and
//! the same id as `response.created`. It returns the final response object.
//!
//! [`accumulate_response`] rebuilds the response from the deltas alone, as an SDK does
//! (`response.created`'s object, items from `output_item.added`, text and arguments appended
//! from the deltas, status and usage from the terminal event), for comparing with the
//! non-streaming translation.

use serde_json::{json, Value};

/// One SSE frame: its event name and its data, parsed.
fn frames(out: &[u8]) -> Result<Vec<(String, Value)>, String> {
    let text = std::str::from_utf8(out).map_err(|e| format!("not UTF-8: {e}"))?;
    let body = text
        .strip_suffix("\n\n")
        .ok_or("the stream does not end with a blank line")?;
    body.split("\n\n")
        .enumerate()
        .map(|(n, frame)| {
            let (event, data) = frame
                .strip_prefix("event: ")
                .and_then(|f| f.split_once("\ndata: "))
                .ok_or_else(|| format!("frame {n} is not `event: …\\ndata: …`: {frame:?}"))?;
            if data.contains('\n') {
                return Err(format!("frame {n} has more than one data line"));
            }
            let v: Value =
                serde_json::from_str(data).map_err(|e| format!("frame {n} is not JSON ({e})"))?;
            if v["type"] != event {
                return Err(format!(
                    "frame {n}: event {event} carries type {}",
                    v["type"]
                ));
            }
            Ok((event.to_owned(), v))
        })
        .collect()
}

/// The item being streamed.
struct OpenItem {
    index: u64,
    id: String,
    kind: String,
    /// Text or arguments from the deltas.
    acc: String,
    part_added: bool,
}

/// Checks a whole stream (see the module docs); returns the final response object.
pub fn validate_event_sequence(out: &[u8]) -> Result<Value, String> {
    let frames = frames(out)?;
    let mut open: Option<OpenItem> = None;
    let mut done_items: Vec<Value> = Vec::new();
    let mut response_id = None;
    let mut terminal: Option<(String, Value)> = None;
    let mut last_error = false;
    for (n, (event, v)) in frames.iter().enumerate() {
        let at = |what: &str| format!("event {n} ({event}): {what}");
        if v["sequence_number"] != json!(n) {
            return Err(at(&format!(
                "sequence_number {} (expected {n})",
                v["sequence_number"]
            )));
        }
        if terminal.is_some() {
            return Err(at("an event after the terminal event"));
        }
        let expect_item = |v: &Value, o: &OpenItem| -> Result<(), String> {
            if v["item_id"] != o.id.as_str() || v["output_index"] != o.index {
                return Err(at(&format!(
                    "names item {} at {}, the open item is {} at {}",
                    v["item_id"], v["output_index"], o.id, o.index
                )));
            }
            Ok(())
        };
        match (n, event.as_str()) {
            (0, "response.created") | (1, "response.in_progress") => {
                let r = &v["response"];
                if r["status"] != "in_progress" || r["output"] != json!([]) || !r["usage"].is_null()
                {
                    return Err(at(
                        "the starting response is not in_progress, empty, without usage",
                    ));
                }
                match &response_id {
                    None => response_id = Some(r["id"].clone()),
                    Some(id) if *id == r["id"] => {}
                    Some(_) => return Err(at("another response id")),
                }
                continue;
            }
            (0 | 1, _) => {
                return Err(at(
                    "the stream must start with response.created, response.in_progress",
                ))
            }
            _ => {}
        }
        last_error = false;
        match event.as_str() {
            "response.output_item.added" => {
                if open.is_some() {
                    return Err(at("an item added while another is open"));
                }
                let item = &v["item"];
                if v["output_index"] != json!(done_items.len()) {
                    return Err(at("output_index is not the next index"));
                }
                if item["status"] != "in_progress" {
                    return Err(at("an added item that is not in_progress"));
                }
                let id = item["id"]
                    .as_str()
                    .ok_or_else(|| at("an item without id"))?;
                open = Some(OpenItem {
                    index: done_items.len() as u64,
                    id: id.to_owned(),
                    kind: item["type"].as_str().unwrap_or_default().to_owned(),
                    acc: String::new(),
                    part_added: false,
                });
            }
            "response.content_part.added" => {
                let o = open.as_mut().ok_or_else(|| at("no open item"))?;
                expect_item(v, o)?;
                let want = match o.kind.as_str() {
                    "message" => "output_text",
                    "reasoning" => "reasoning_text",
                    _ => return Err(at("a content part on a function call")),
                };
                if v["content_index"] != 0 || v["part"]["type"] != want || o.part_added {
                    return Err(at("not the item's one content part"));
                }
                o.part_added = true;
            }
            "response.output_text.delta"
            | "response.reasoning_text.delta"
            | "response.function_call_arguments.delta" => {
                let o = open.as_mut().ok_or_else(|| at("no open item"))?;
                expect_item(v, o)?;
                let kind = match event.as_str() {
                    "response.output_text.delta" => "message",
                    "response.reasoning_text.delta" => "reasoning",
                    _ => "function_call",
                };
                if o.kind != kind
                    || (kind != "function_call" && (!o.part_added || v["content_index"] != 0))
                {
                    return Err(at("a delta of another kind of item, or before its part"));
                }
                o.acc.push_str(
                    v["delta"]
                        .as_str()
                        .ok_or_else(|| at("a delta that is not a string"))?,
                );
            }
            "response.output_text.done" | "response.reasoning_text.done" => {
                let o = open.as_ref().ok_or_else(|| at("no open item"))?;
                expect_item(v, o)?;
                if v["text"] != o.acc.as_str() {
                    return Err(at("the text is not the deltas'"));
                }
            }
            "response.function_call_arguments.done" => {
                let o = open.as_ref().ok_or_else(|| at("no open item"))?;
                expect_item(v, o)?;
                if o.kind != "function_call" || v["arguments"] != o.acc.as_str() {
                    return Err(at("the arguments are not the deltas'"));
                }
            }
            "response.content_part.done" => {
                let o = open.as_ref().ok_or_else(|| at("no open item"))?;
                expect_item(v, o)?;
                if v["part"]["text"] != o.acc.as_str() {
                    return Err(at("the part's text is not the deltas'"));
                }
            }
            "response.output_item.done" => {
                let o = open.take().ok_or_else(|| at("no open item"))?;
                let item = &v["item"];
                if v["output_index"] != o.index
                    || item["id"] != o.id.as_str()
                    || item["type"] != o.kind.as_str()
                {
                    return Err(at("not the open item"));
                }
                if item["status"] == "in_progress" {
                    return Err(at("a finished item still in_progress"));
                }
                let full = match o.kind.as_str() {
                    "function_call" => item["arguments"].clone(),
                    _ => item["content"][0]["text"].clone(),
                };
                if full != o.acc.as_str() {
                    return Err(at(&format!(
                        "the item's text {full} is not the deltas' {:?}",
                        o.acc
                    )));
                }
                done_items.push(item.clone());
            }
            "error" => {
                if !v["message"].is_string() {
                    return Err(at("an error without a message"));
                }
                last_error = true;
                continue;
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                terminal = Some((event.clone(), v["response"].clone()));
            }
            other => return Err(at(&format!("unknown event {other}"))),
        }
        if event == "response.failed"
            && frames
                .get(n.wrapping_sub(1))
                .is_none_or(|(e, _)| e != "error")
        {
            return Err(at("response.failed without an error event before it"));
        }
    }
    if last_error {
        return Err("the stream ends with an error event, without response.failed".into());
    }
    let (event, r) = terminal.ok_or("the stream has no terminal event")?;
    let want = match event.as_str() {
        "response.completed" => "completed",
        "response.incomplete" => "incomplete",
        _ => "failed",
    };
    if r["status"] != want {
        return Err(format!("{event} carries status {}", r["status"]));
    }
    if Some(&r["id"]) != response_id.as_ref() {
        return Err(format!("{event} is for another response"));
    }
    if want == "failed" {
        if !r["error"]["message"].is_string() || !r["error"]["code"].is_string() {
            return Err("a failed response without its error".into());
        }
    } else {
        if open.is_some() {
            return Err(format!("{event} with an item still open"));
        }
        if !r["usage"]["output_tokens"].is_u64() || !r["usage"]["input_tokens"].is_u64() {
            return Err(format!("{event} without usage"));
        }
    }
    if want == "incomplete" && !r["incomplete_details"]["reason"].is_string() {
        return Err("an incomplete response without incomplete_details.reason".into());
    }
    if r["output"] != Value::Array(done_items) {
        return Err(format!("{event}'s output is not the finished items"));
    }
    Ok(r)
}

/// The response an SDK accumulates from the deltas (see the module docs). Assumes a stream
/// [`validate_event_sequence`] accepts.
pub fn accumulate_response(out: &[u8]) -> Result<Value, String> {
    let mut response = Value::Null;
    let mut items: Vec<Value> = Vec::new();
    for (event, v) in frames(out)? {
        match event.as_str() {
            "response.created" => response = v["response"].clone(),
            "response.output_item.added" => items.push(v["item"].clone()),
            "response.content_part.added" => {
                if let Some(item) = items.last_mut() {
                    if let Some(content) = item["content"].as_array_mut() {
                        content.push(v["part"].clone());
                    }
                }
            }
            "response.output_text.delta" | "response.reasoning_text.delta" => {
                if let Some(item) = items.last_mut() {
                    let text = item["content"][0]["text"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    item["content"][0]["text"] =
                        Value::from(text + v["delta"].as_str().unwrap_or_default());
                }
            }
            "response.function_call_arguments.delta" => {
                if let Some(item) = items.last_mut() {
                    let args = item["arguments"].as_str().unwrap_or_default().to_owned();
                    item["arguments"] = Value::from(args + v["delta"].as_str().unwrap_or_default());
                }
            }
            "response.output_item.done" => {
                // The status the item finished with (the rest came from the deltas).
                if let Some(item) = items.last_mut() {
                    item["status"] = v["item"]["status"].clone();
                    if let Some(e) = v["item"].get("encrypted_content") {
                        item["encrypted_content"] = e.clone();
                    }
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                let r = &v["response"];
                for key in ["status", "usage", "error", "incomplete_details"] {
                    response[key] = r[key].clone();
                }
            }
            _ => {}
        }
    }
    if response.is_null() {
        return Err("no response.created".into());
    }
    response["output"] = Value::Array(items);
    Ok(response)
}
