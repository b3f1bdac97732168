//! Stored conversations (`store: true`): the shape their items are kept in, and listing them.
//!
//! A stored response keeps, besides its object, the whole conversation it answered — the
//! earlier conversation's items, that response's output, this request's input (see
//! [`super::request::Conversation`]) — so that `previous_response_id` rebuilds a conversation
//! from one stored row, and `GET /v1/responses/{id}/input_items` lists it.
//!
//! [`push_new_items`] and [`push_text_input`] give this request's items the API's item shape as
//! the request is translated: an `id` (`msg_`, `fc_`, `fco_`, `rs_` + the response's hex +
//! `_in<n>`) when the client sent none, a message's string content as one `input_text`
//! (`output_text` for an assistant) part, `type` and `status`. The earlier items were
//! normalized when they were stored and are copied as they are.
//!
//! [`list_input_items`] pages through them as the API does: `order` `desc` (the default,
//! newest first) or `asc`, `limit` 1–100 (default 20), `after` / `before` an item id.

use super::request::invalid;
use crate::error::{json_inner, write_json_str, ApiError};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// Appends the items of `input`, a JSON array, in their stored shape (see the module docs) to
/// `out`, a JSON array being written; `base` is the response's hex id, and the items are
/// numbered from 0. A new item's fields are read as raw JSON and written back in key order
/// with what is missing added, values copied byte for byte: no tree of values is built (it
/// cost a stored response more than its translation). Items that are not objects are copied.
/// Returns how many items it appended.
pub fn push_new_items(input: &str, base: &str, out: &mut String) -> serde_json::Result<usize> {
    let list: Vec<&RawValue> = serde_json::from_str(input)?;
    for (n, raw) in list.iter().enumerate() {
        separate(out);
        if raw.get().trim_start().starts_with('{') {
            normalize(raw, base, n, out)?;
        } else {
            out.push_str(raw.get());
        }
    }
    Ok(list.len())
}

/// Appends a string input (`text`, the JSON string as sent) as its one stored item: a user
/// message with one `input_text` part, exactly what [`push_new_items`] makes of
/// `{"type":"message","role":"user","content":text}`, written without reading it back.
pub fn push_text_input(text: &RawValue, base: &str, out: &mut String) {
    separate(out);
    for piece in [
        "{\"content\":[{\"text\":",
        text.get(),
        ",\"type\":\"input_text\"}],\"id\":\"msg_",
        base,
        "_in0\",\"role\":\"user\",\"status\":\"completed\",\"type\":\"message\"}",
    ] {
        out.push_str(piece);
    }
}

/// A comma before the next element, unless `out` is an array that was just opened.
fn separate(out: &mut String) {
    if !out.ends_with('[') {
        out.push(',');
    }
}

/// An item's key, borrowed unless it has escapes.
#[derive(Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

/// A JSON string's value, `None` for anything else.
fn as_str<'a>(raw: Option<&&'a RawValue>) -> Option<Cow<'a, str>> {
    raw.filter(|r| r.get().starts_with('"'))
        .and_then(|r| serde_json::from_str::<Key<'a>>(r.get()).ok())
        .map(|k| k.0)
}

/// One new item in the API's shape: `type`, an `id`, a `status`, a message's content as parts.
fn normalize(raw: &RawValue, base: &str, n: usize, out: &mut String) -> serde_json::Result<()> {
    let map: BTreeMap<Key<'_>, &RawValue> = serde_json::from_str(raw.get())?;
    let key = |k: &'static str| Key(Cow::Borrowed(k));
    // The fields as JSON text, in key order, with what is added or replaced.
    let mut fields: Vec<(Cow<'_, str>, Cow<'_, str>)> = Vec::with_capacity(map.len() + 3);
    let set =
        |fields: &mut Vec<(Cow<'_, str>, Cow<'_, str>)>, k: &'static str, v: String| match fields
            .binary_search_by(|(f, _)| f.as_ref().cmp(k))
        {
            Ok(at) => fields[at].1 = Cow::Owned(v),
            Err(at) => fields.insert(at, (Cow::Borrowed(k), Cow::Owned(v))),
        };
    fields.extend(
        map.iter()
            .map(|(k, v)| (k.0.clone(), Cow::Borrowed(v.get()))),
    );
    let kind = match as_str(map.get(&key("type"))) {
        Some(t) => t,
        None => {
            set(&mut fields, "type", "\"message\"".to_owned());
            Cow::Borrowed("message")
        }
    };
    let prefix = match kind.as_ref() {
        "message" => "msg",
        "function_call" => "fc",
        "function_call_output" => "fco",
        "reasoning" => "rs",
        _ => "item",
    };
    if as_str(map.get(&key("id"))).is_none_or(|id| id.is_empty()) {
        let mut id = String::with_capacity(prefix.len() + base.len() + 16);
        for part in [
            "\"",
            prefix,
            "_",
            base,
            "_in",
            itoa::Buffer::new().format(n),
            "\"",
        ] {
            id.push_str(part);
        }
        set(&mut fields, "id", id);
    }
    if !map.contains_key(&key("status")) {
        set(&mut fields, "status", "\"completed\"".to_owned());
    }
    if kind == "message" {
        if let Some(text) = map
            .get(&key("content"))
            .filter(|c| c.get().starts_with('"'))
        {
            let assistant = as_str(map.get(&key("role"))).as_deref() == Some("assistant");
            // Keys in order, as every object here is written.
            let (head, tail) = if assistant {
                (
                    "[{\"annotations\":[],\"text\":",
                    ",\"type\":\"output_text\"}]",
                )
            } else {
                ("[{\"text\":", ",\"type\":\"input_text\"}]")
            };
            let mut part = String::with_capacity(head.len() + text.get().len() + tail.len());
            for piece in [head, text.get(), tail] {
                part.push_str(piece);
            }
            set(&mut fields, "content", part);
        }
    }
    out.push('{');
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        out.push_str(&json_inner(k));
        out.push_str("\":");
        out.push_str(v);
    }
    out.push('}');
    Ok(())
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
