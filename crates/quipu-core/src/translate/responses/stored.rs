//! Stored conversations (`store: true`): the shape their items are kept in, and listing them.
//!
//! A stored response keeps, besides its object, the whole conversation it answered — the
//! earlier conversation's items, that response's output, this request's input (see
//! [`super::request::Conversation`]) — so that `previous_response_id` rebuilds a conversation
//! from one stored row, and `GET /v1/responses/{id}/input_items` lists it.
//!
//! [`normalize_items`] gives this request's items the API's item shape before they are
//! stored: an `id` (`msg_`, `fc_`, `fco_`, `rs_` + the response's hex + `_in<n>`) when the
//! client sent none, a message's string content as one `input_text` (`output_text` for an
//! assistant) part, `type` and `status`. It runs on the store writer, off the request path;
//! the earlier items were normalized when they were stored.
//!
//! [`list_input_items`] pages through them as the API does: `order` `desc` (the default,
//! newest first) or `asc`, `limit` 1–100 (default 20), `after` / `before` an item id.

use super::request::invalid;
use crate::error::{write_json_str, ApiError};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// Gives the items from `new_from` on their stored shape (see the module docs); `base` is the
/// response's hex id. Runs off the request path (the store writer), so it reads each new item
/// whole; the earlier ones are copied as they are.
pub fn normalize_items(items: &[u8], new_from: usize, base: &str) -> Result<Vec<u8>, String> {
    let list: Vec<&RawValue> = serde_json::from_slice(items)
        .map_err(|e| format!("stored items are not a JSON array: {e}"))?;
    let mut out = Vec::with_capacity(items.len() + list.len().saturating_sub(new_from) * 64);
    out.push(b'[');
    for (i, raw) in list.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if i < new_from {
            out.extend_from_slice(raw.get().as_bytes());
            continue;
        }
        let mut item: Value = serde_json::from_str(raw.get())
            .map_err(|e| format!("stored item {i} is not JSON: {e}"))?;
        if let Value::Object(map) = &mut item {
            normalize(map, base, i - new_from);
        }
        serde_json::to_writer(&mut out, &item).map_err(|e| e.to_string())?;
    }
    out.push(b']');
    Ok(out)
}

/// One new item in the API's shape: `type`, an `id`, a `status`, a message's content as parts.
fn normalize(map: &mut Map<String, Value>, base: &str, n: usize) {
    let kind = match map.get("type").and_then(Value::as_str) {
        Some(t) => t.to_owned(),
        None => {
            map.insert("type".into(), Value::from("message"));
            "message".to_owned()
        }
    };
    let prefix = match kind.as_str() {
        "message" => "msg",
        "function_call" => "fc",
        "function_call_output" => "fco",
        "reasoning" => "rs",
        _ => "item",
    };
    if map
        .get("id")
        .is_none_or(|id| id.as_str().is_none_or(str::is_empty))
    {
        map.insert("id".into(), Value::from(format!("{prefix}_{base}_in{n}")));
    }
    if !map.contains_key("status") {
        map.insert("status".into(), Value::from("completed"));
    }
    if kind == "message" {
        if let Some(Value::String(text)) = map.get("content") {
            let assistant = map.get("role").and_then(Value::as_str) == Some("assistant");
            let mut part = Map::new();
            part.insert(
                "type".into(),
                Value::from(if assistant {
                    "output_text"
                } else {
                    "input_text"
                }),
            );
            part.insert("text".into(), Value::from(text.clone()));
            if assistant {
                part.insert("annotations".into(), Value::Array(Vec::new()));
            }
            map.insert("content".into(), Value::Array(vec![Value::Object(part)]));
        }
    }
}

/// `GET …/input_items` query parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub limit: usize,
    /// Oldest first.
    pub ascending: bool,
    pub after: Option<String>,
    pub before: Option<String>,
}

impl Default for ListQuery {
    fn default() -> Self {
        ListQuery {
            limit: 20,
            ascending: false,
            after: None,
            before: None,
        }
    }
}

/// `%XX` and `+` decoded; `None` for a malformed escape or invalid UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

impl ListQuery {
    /// Reads a query string (without `?`). Unknown parameters (`include`) are ignored.
    pub fn parse(query: &str) -> Result<ListQuery, ApiError> {
        let mut q = ListQuery::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v)
                .ok_or_else(|| invalid(k.to_owned(), "is not a valid query value"))?;
            match k {
                "limit" => {
                    q.limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=100).contains(n))
                        .ok_or_else(|| invalid("limit", "must be an integer from 1 to 100"))?;
                }
                "order" => {
                    q.ascending = match v.as_str() {
                        "asc" => true,
                        "desc" => false,
                        _ => return Err(invalid("order", "must be asc or desc")),
                    }
                }
                "after" => q.after = Some(v),
                "before" => q.before = Some(v),
                _ => {}
            }
        }
        Ok(q)
    }
}

#[derive(Deserialize)]
struct IdOf<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
}

/// A page of a stored conversation's items: `{"object":"list","data":[…],"first_id":…,
/// "last_id":…,"has_more":…}`.
pub fn list_input_items(items: &str, q: &ListQuery) -> Result<Vec<u8>, String> {
    let list: Vec<&RawValue> = serde_json::from_str(items)
        .map_err(|e| format!("stored items are not a JSON array: {e}"))?;
    let ids: Vec<Option<Cow<'_, str>>> = list
        .iter()
        .map(|r| {
            serde_json::from_str::<IdOf<'_>>(r.get())
                .ok()
                .and_then(|i| i.id)
        })
        .collect();
    let mut order: Vec<usize> = (0..list.len()).collect();
    if !q.ascending {
        order.reverse();
    }
    let position = |id: &str| order.iter().position(|&i| ids[i].as_deref() == Some(id));
    let from = match &q.after {
        Some(a) => position(a).map_or(order.len(), |p| p + 1),
        None => 0,
    };
    let to = match &q.before {
        Some(b) => position(b).unwrap_or(order.len()),
        None => order.len(),
    };
    let window: &[usize] = order.get(from..to.max(from)).unwrap_or_default();
    let page = &window[..window.len().min(q.limit)];
    let has_more = window.len() > page.len();
    let mut out = Vec::with_capacity(items.len() + 96);
    out.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
    for (k, &i) in page.iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        out.extend_from_slice(list[i].get().as_bytes());
    }
    out.extend_from_slice(b"],\"first_id\":");
    let id_at = |p: Option<&usize>, out: &mut Vec<u8>| match p.and_then(|&i| ids[i].as_deref()) {
        Some(id) => write_json_str(out, id),
        None => out.extend_from_slice(b"null"),
    };
    id_at(page.first(), &mut out);
    out.extend_from_slice(b",\"last_id\":");
    id_at(page.last(), &mut out);
    out.extend_from_slice(b",\"has_more\":");
    out.extend_from_slice(if has_more { b"true" } else { b"false" });
    out.push(b'}');
    Ok(out)
}

/// `{"id":…,"object":"response","deleted":true}`: what `DELETE /v1/responses/{id}` answers.
pub fn deleted(id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(id.len() + 48);
    out.extend_from_slice(b"{\"id\":");
    write_json_str(&mut out, id);
    out.extend_from_slice(b",\"object\":\"response\",\"deleted\":true}");
    out
}
